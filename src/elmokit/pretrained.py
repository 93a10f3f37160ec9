"""Models shipped inside the package (options.json + weights.hdf5 per folder); ``model_files``
finds the files of any model a user gives (see elmokit.sources)."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent  # the installed package
MODELS_DIR = Path(__file__).parent / "models"
TINY_REFERENCE = "elmo-tiny-reference"  # the original's test model: checks only
NEWS_MODEL = "elmo-news-512"  # trained by elmokit on English news and Wikipedia, see its README.md
DEFAULT_MODEL = NEWS_MODEL  # used when no model is given


def available_models() -> list[str]:
    """Names of the models shipped with elmokit."""
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "options.json").is_file())


def model_files(name_or_dir: str | Path) -> tuple[Path, Path]:
    """(options file, weight file) of a model given in any form ``elmokit.resolve_model`` takes:
    a shipped or known model's name, a model folder, a .zip archive or its URL."""
    from .sources import resolve_model

    return resolve_model(name_or_dir).files()


def refuse_package_path(path: str | Path, what: str = "output") -> Path:
    """``path`` (resolved), unless it is inside the installed package (its shipped models
    among others) or elmokit's download cache, which elmokit never writes into otherwise: a
    ValueError then says so."""
    from .download import cache_dir

    resolved = Path(path).resolve()
    if resolved == PACKAGE_DIR or PACKAGE_DIR in resolved.parents:
        raise ValueError(
            f"{what} {path} is inside the installed elmokit package ({PACKAGE_DIR}), which elmokit "
            "does not change; give a folder of your own"
        )
    for cache in (cache_dir().resolve() / "downloads", cache_dir().resolve() / "archives"):
        if resolved == cache or cache in resolved.parents:
            raise ValueError(
                f"{what} {path} is inside elmokit's download cache ({cache.parent}), which holds "
                "models as their publishers made them; give a folder of your own"
            )
    return resolved
