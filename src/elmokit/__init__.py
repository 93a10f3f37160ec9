"""elmokit: ELMo (deep contextualized word representations) in PyTorch.

The names below are imported on first use (``elmokit.BiLM`` imports torch then), so that
``import elmokit`` and the command line's ``--help`` stay fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__

if TYPE_CHECKING:
    from .embed.embedder import Embedder
    from .hub import DEFAULT_MODEL, DownloadError, ModelSource, resolve_model
    from .lm.language_model import LanguageModel
    from .lm.scoring import (
        SentenceScore,
        Substitutes,
        score_sentences,
        substitutes,
        word_distributions,
    )
    from .model.bilm import BiLM, BiLMOutput, CarriedState, StatefulBiLM
    from .model.characters import batch_to_ids
    from .model.elmo import Elmo, ElmoOutput
    from .model.options import BiLMOptions, OptionsError
    from .model.scalar_mix import ScalarMix
    from .model.weights import WeightFileError

_HOMES = {
    "BiLM": "model.bilm",
    "BiLMOutput": "model.bilm",
    "CarriedState": "model.bilm",
    "StatefulBiLM": "model.bilm",
    "batch_to_ids": "model.characters",
    "Elmo": "model.elmo",
    "ElmoOutput": "model.elmo",
    "Embedder": "embed.embedder",
    "DEFAULT_MODEL": "hub",
    "DownloadError": "hub",
    "ModelSource": "hub",
    "resolve_model": "hub",
    "LanguageModel": "lm.language_model",
    "BiLMOptions": "model.options",
    "OptionsError": "model.options",
    "ScalarMix": "model.scalar_mix",
    "SentenceScore": "lm.scoring",
    "Substitutes": "lm.scoring",
    "score_sentences": "lm.scoring",
    "substitutes": "lm.scoring",
    "word_distributions": "lm.scoring",
    "WeightFileError": "model.weights",
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
