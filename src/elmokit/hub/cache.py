"""The one cache folder of elmokit, and whether the network may be used.

Everything elmokit downloads or derives lives under ``cache_dir()``: ``downloads/`` (one entry
per URL, see ``elmokit.hub.entries``), ``archives/`` (local .zip archives, unpacked), ``hf/``
(Hugging Face Hub snapshots) and ``task-layers/`` (``elmokit.tasks``' cached biLM layers).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]

ENV_CACHE = "ELMOKIT_CACHE"
ENV_OFFLINE = "ELMOKIT_OFFLINE"


def cache_dir() -> Path:
    """The cache folder: ``$ELMOKIT_CACHE``, else the platform's user cache folder for elmokit
    (``~/.cache/elmokit`` on Linux, ``~/Library/Caches/elmokit`` on macOS,
    ``%LOCALAPPDATA%\\elmokit\\Cache`` on Windows)."""
    given = os.environ.get(ENV_CACHE, "").strip()
    if given:
        return Path(given).expanduser()
    from platformdirs import user_cache_dir  # only when no folder is given: not needed otherwise

    return Path(user_cache_dir("elmokit", appauthor=False))


_OFFLINE = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False}
_OFFLINE.update({"off": False, "": False})


def offline() -> bool:
    """Whether ``ELMOKIT_OFFLINE`` forbids the network (1, true, yes or on; 0, false, no, off or
    unset allow it); any other value is a ValueError, never read as online."""
    value = os.environ.get(ENV_OFFLINE, "")
    found = _OFFLINE.get(value.strip().lower())
    if found is None:
        raise ValueError(
            f"{ENV_OFFLINE}={value!r} is neither 1, true, yes, on (offline) nor 0, false, no, off "
            "(online): set one of them"
        )
    return found
