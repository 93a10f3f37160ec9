"""The models shipped inside the package (options.json + weights.hdf5 per folder), their
names, and the one default model."""

from __future__ import annotations

from pathlib import Path

from .cache import cache_dir

__all__ = ["DEFAULT_MODEL"]

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the installed package
MODELS_DIR = Path(__file__).parent.parent / "models"
TINY_REFERENCE = "elmo-tiny-reference"  # the original's test model: checks only
NEWS_MODEL = "elmo-news-512"  # trained by elmokit on English news and Wikipedia, see its README.md
DEFAULT_MODEL = NEWS_MODEL  # used wherever no model is given: the one default


def available_models() -> list[str]:
    """Names of the models shipped with elmokit."""
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "options.json").is_file())


def refuse_package_path(path: str | Path, what: str = "output") -> Path:
    """``path`` (resolved), unless it is inside the installed package (its shipped models
    among others) or elmokit's download cache, which elmokit never writes into otherwise: a
    ValueError then says so."""
    resolved = Path(path).resolve()
    if resolved == PACKAGE_DIR or PACKAGE_DIR in resolved.parents:
        raise ValueError(
            f"{what} {path} is inside the installed elmokit package ({PACKAGE_DIR}), which elmokit "
            "does not change; give a folder of your own"
        )
    cache = cache_dir().resolve()
    for folder in (cache / "downloads", cache / "archives", cache / "hf"):
        if resolved == folder or folder in resolved.parents:
            raise ValueError(
                f"{what} {path} is inside elmokit's download cache ({cache}), which holds "
                "models as their publishers made them; give a folder of your own"
            )
    return resolved
