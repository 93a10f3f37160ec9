"""Embedding text with a biLM: the ``Embedder`` (``embedder``) and what it runs each batch
through (``runners``: torch, int8, onnxruntime), the HDF5 vectors files (``vectors_file``),
several processes sharing one file (``_multiprocess_embed``), the ONNX graph and its onnxruntime
backend (``onnx_export``) and word senses (``senses``).

``from elmokit.embed import Embedder`` imports the ``embedder`` module (and torch) on first use,
so that importing ``elmokit.embed.vectors_file`` alone stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .embedder import Embedder

__all__ = ["Embedder"]


def __getattr__(name: str) -> Any:
    """A name of ``embedder``, imported on first use (PEP 562)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".embedder", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
