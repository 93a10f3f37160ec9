"""elmokit: ELMo (deep contextualized word representations) in PyTorch."""

from .bilm import BiLM, BiLMOutput, CarriedState, StatefulBiLM
from .characters import batch_to_ids
from .elmo import Elmo, ElmoOutput
from .embed import Embedder
from .options import BiLMOptions, OptionsError
from .scalar_mix import ScalarMix
from .weights import WeightFileError

__version__ = "0.1.0"

__all__ = [
    "BiLM",
    "BiLMOptions",
    "BiLMOutput",
    "CarriedState",
    "Elmo",
    "ElmoOutput",
    "Embedder",
    "OptionsError",
    "ScalarMix",
    "StatefulBiLM",
    "WeightFileError",
    "batch_to_ids",
]
