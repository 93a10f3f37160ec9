"""elmokit: ELMo (deep contextualized word representations) in PyTorch."""

from ._version import __version__ as __version__
from .bilm import BiLM, BiLMOutput, CarriedState, StatefulBiLM
from .characters import batch_to_ids
from .elmo import Elmo, ElmoOutput
from .embed import Embedder
from .hub import DEFAULT_MODEL, DownloadError, ModelSource, resolve_model
from .language_model import LanguageModel
from .options import BiLMOptions, OptionsError
from .scalar_mix import ScalarMix
from .scoring import (
    SentenceScore,
    Substitutes,
    score_sentences,
    substitutes,
    word_distributions,
)
from .weights import WeightFileError

__all__ = [
    "DEFAULT_MODEL",
    "BiLM",
    "BiLMOptions",
    "BiLMOutput",
    "CarriedState",
    "DownloadError",
    "Elmo",
    "ElmoOutput",
    "Embedder",
    "LanguageModel",
    "ModelSource",
    "OptionsError",
    "ScalarMix",
    "SentenceScore",
    "StatefulBiLM",
    "Substitutes",
    "WeightFileError",
    "batch_to_ids",
    "resolve_model",
    "score_sentences",
    "substitutes",
    "word_distributions",
]
