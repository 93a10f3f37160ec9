"""Where the compatibility layers find model files: one function from a path or URL to a file."""

from __future__ import annotations

import os
from pathlib import Path

from ..hub import resolve_file

__all__ = ["resolve_model_file"]


def resolve_model_file(path_or_url: str | os.PathLike | None, what: str = "model file") -> Path:
    """The local file for ``path_or_url`` (an options.json or an HDF5 weight file).

    A local path must name an existing file. A URL (http, https, s3), as AllenNLP and flair pass
    them for the published models, is downloaded into elmokit's cache on first use (checked to
    be JSON or HDF5; ``ELMOKIT_OFFLINE=1`` allows only what is cached): see elmokit.hub.transport."""
    if path_or_url is None:
        raise ValueError(f"no {what} given: pass a local path or a URL")
    return resolve_file(path_or_url, what)
