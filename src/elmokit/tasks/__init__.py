"""Downstream tasks: see how much ELMo adds to a baseline (NER, POS tagging, sentiment).

``run_task(TaskConfig(...))`` trains a BiLSTM-CRF tagger (NER on CoNLL-2003, POS on CoNLL-U) or a
BiLSTM classifier (sentiment on SST) with optional word embeddings, a char CNN and ELMo, and writes
metrics.json and the model; ``elmokit task`` is its command line (``add_task_parser``). With a frozen
biLM (the default) its layers are computed once per data set (``LayerCache``) and only the scalar
mix and the task model are trained.
"""

from ..base.task_data import (
    LabeledSentence,
    TaggedSentence,
    bioes_to_iob1,
    iob1_to_bioes,
    read_conll2003,
    read_conllu,
    read_sst,
    spans,
)
from .cache import CachedLayers, LayerCache
from .crf import ConditionalRandomField, bioes_constraints
from .models import Batch, Classifier, ModelConfig, Tagger
from .train import TASKS, TaskConfig, TrainedTask, cache_layers, entity_scores, run_task

__all__ = [
    "TASKS",
    "Batch",
    "CachedLayers",
    "Classifier",
    "ConditionalRandomField",
    "LabeledSentence",
    "LayerCache",
    "ModelConfig",
    "TaggedSentence",
    "Tagger",
    "TaskConfig",
    "TrainedTask",
    "bioes_constraints",
    "bioes_to_iob1",
    "cache_layers",
    "entity_scores",
    "iob1_to_bioes",
    "read_conll2003",
    "read_conllu",
    "read_sst",
    "run_task",
    "spans",
]
