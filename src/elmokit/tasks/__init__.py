"""Downstream tasks: see how much ELMo adds to a baseline (NER, POS tagging, sentiment).

``run_task(TaskConfig(...))`` trains a BiLSTM-CRF tagger (NER on CoNLL-2003, POS on CoNLL-U) or a
BiLSTM classifier (sentiment on SST) with optional word embeddings, a char CNN and ELMo, and writes
metrics.json and the model; ``elmokit task`` is its command line (``add_task_parser``). With a frozen
biLM (the default) its layers are computed once per data set (``LayerCache``) and only the scalar
mix and the task model are trained.
"""

from .train import TaskConfig, TrainedTask, run_task

__all__ = ["TaskConfig", "TrainedTask", "run_task"]
