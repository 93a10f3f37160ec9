"""elmokit: ELMo (deep contextualized word representations) in PyTorch."""

from .bilm import BiLM, BiLMOutput, CarriedState, StatefulBiLM
from .characters import batch_to_ids
from .download import DownloadError
from .elmo import Elmo, ElmoOutput
from .embed import Embedder
from .options import BiLMOptions, OptionsError
from .scalar_mix import ScalarMix
from .scoring import (
    SentenceScore,
    Substitutes,
    load_scoring_model,
    score_sentences,
    substitutes,
    word_distributions,
)
from .sources import ModelSource, load_bilm, resolve_model
from .weights import WeightFileError

__version__ = "0.1.0"

__all__ = [
    "BiLM",
    "BiLMOptions",
    "BiLMOutput",
    "CarriedState",
    "DownloadError",
    "Elmo",
    "ElmoOutput",
    "Embedder",
    "ModelSource",
    "OptionsError",
    "ScalarMix",
    "SentenceScore",
    "StatefulBiLM",
    "Substitutes",
    "WeightFileError",
    "batch_to_ids",
    "load_bilm",
    "load_scoring_model",
    "resolve_model",
    "score_sentences",
    "substitutes",
    "word_distributions",
]
