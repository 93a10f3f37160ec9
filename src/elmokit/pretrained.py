"""Models shipped inside the package (options.json + weights.hdf5 per folder)."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent  # the installed package
MODELS_DIR = Path(__file__).parent / "models"
TINY_REFERENCE = "elmo-tiny-reference"  # the original's test model: checks only
NEWS_MODEL = "elmo-news-512"  # trained by elmokit on English news, see its README.md
DEFAULT_MODEL = NEWS_MODEL  # used when no model is given


def available_models() -> list[str]:
    """Names of the models shipped with elmokit."""
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "options.json").is_file())


def model_files(name_or_dir: str | Path) -> tuple[Path, Path]:
    """(options.json, weights.hdf5) of a shipped model name or a model folder."""
    folder = Path(name_or_dir)
    if not folder.is_dir() and (MODELS_DIR / str(name_or_dir)).is_dir():
        folder = MODELS_DIR / str(name_or_dir)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"no model folder {name_or_dir!r}; shipped models: {', '.join(available_models())}"
        )
    options, weights = folder / "options.json", folder / "weights.hdf5"
    for path in (options, weights):
        if not path.is_file():
            raise FileNotFoundError(f"model folder {folder} has no {path.name}")
    return options, weights


def refuse_package_path(path: str | Path, what: str = "output") -> Path:
    """``path`` (resolved), unless it is inside the installed package (its shipped models
    among others), which elmokit never writes: a ValueError then says so."""
    resolved = Path(path).resolve()
    if resolved == PACKAGE_DIR or PACKAGE_DIR in resolved.parents:
        raise ValueError(
            f"{what} {path} is inside the installed elmokit package ({PACKAGE_DIR}), which elmokit "
            "does not change; give a folder of your own"
        )
    return resolved
