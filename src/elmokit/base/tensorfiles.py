"""Reading torch files (checkpoints, ELMoForManyLangs state dicts) without running their code.

``torch.load`` is only ever called with ``weights_only=True``: tensors and plain containers are
unpickled, any other global is refused. Its errors are long and, for a refused global, advise
rerunning with ``weights_only=False``; elmokit never does that, so they become one line that names
the file and the cause.
"""

from __future__ import annotations

import os
import pickle
import re
from typing import Any

import torch

__all__: list[str] = []


class TensorFileError(ValueError):
    """A torch file that cannot be read safely: damaged, truncated, or holding code."""


def _refused_global(message: str) -> str | None:
    """The global that torch's weights-only unpickler refused, as named in its message."""
    found = re.search(r"GLOBAL ([\w.]+)", message)
    return found.group(1) if found else None


def load_tensors(path: str | os.PathLike, map_location: torch.device | str = "cpu") -> Any:
    """Read a torch file with ``weights_only=True``; raise ``TensorFileError`` in one line that
    names ``path`` when it holds anything but tensors and plain containers or cannot be read."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        refused = _refused_global(str(err))
        if refused:
            raise TensorFileError(
                f"{path}: refused to load: it names the Python global {refused}, which could run "
                "code; elmokit never runs code from a model file"
            ) from None
        raise TensorFileError(f"{path}: not a torch file of tensors (damaged, or another format)") from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise
        raise TensorFileError(
            f"{path}: cannot read this torch file: it is truncated or damaged ({_first_line(err)})"
        ) from None


def _first_line(err: BaseException, width: int = 120) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text if len(text) <= width else text[: width - 3] + "..."
