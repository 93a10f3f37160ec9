"""elmokit: ELMo (deep contextualized word representations) in PyTorch.

The names below are imported on first use (``elmokit.BiLM`` imports torch then), so that
``import elmokit`` and the command line's ``--help`` stay fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__

if TYPE_CHECKING:
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

_HOMES = {
    "BiLM": "bilm",
    "BiLMOutput": "bilm",
    "CarriedState": "bilm",
    "StatefulBiLM": "bilm",
    "batch_to_ids": "characters",
    "Elmo": "elmo",
    "ElmoOutput": "elmo",
    "Embedder": "embed",
    "DEFAULT_MODEL": "hub",
    "DownloadError": "hub",
    "ModelSource": "hub",
    "resolve_model": "hub",
    "LanguageModel": "language_model",
    "BiLMOptions": "options",
    "OptionsError": "options",
    "ScalarMix": "scalar_mix",
    "SentenceScore": "scoring",
    "Substitutes": "scoring",
    "score_sentences": "scoring",
    "substitutes": "scoring",
    "word_distributions": "scoring",
    "WeightFileError": "weights",
}

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


def __getattr__(name: str) -> Any:
    """A root name, imported from its module on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'elmokit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
