"""Where the compatibility layers find model files: one function from a path or URL to a file."""

from __future__ import annotations

import os
from pathlib import Path

URL_SCHEMES = ("http://", "https://", "s3://")


def resolve_model_file(path_or_url: str | os.PathLike, what: str = "model file") -> Path:
    """The local file for ``path_or_url`` (an options.json or an HDF5 weight file).

    A local path must name an existing file. URLs (http, https, s3), as AllenNLP and flair pass
    them for the published models, are refused with a one-line error until elmokit can download
    models; this is the one place that will resolve them."""
    if path_or_url is None:
        raise ValueError(f"no {what} given: pass a local path")
    text = os.fspath(path_or_url)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if text.lower().startswith(URL_SCHEMES):
        raise ValueError(
            f"downloading models is not available yet ({what} {text}): download the file "
            "yourself and pass its local path"
        )
    path = Path(text).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{what} not found: {path}")
    if not path.is_file():
        raise ValueError(f"{what} is not a file: {path}")
    return path
