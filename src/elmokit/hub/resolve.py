"""From what a user gives as a model to the local files: the one resolver behind every place
that accepts a model (``BiLM.from_pretrained``, ``LanguageModel.from_pretrained``, ``Elmo``,
``Embedder``, the compat classes, every ``--model``).

A model can be given as
- a shipped model's name (``elmo-news-512``) or a known model's name (``elmokit models``: it is
  downloaded into the cache on first use);
- a model folder: ``options.json`` and one weight file (``weights.hdf5``, ``model.hdf5`` or
  ``lm_weights.hdf5``, as publishers name them; else AllenNLP's ``*_options.json`` +
  ``*_weights.hdf5``), an ELMoForManyLangs folder, or a TF-Hub module folder (``saved_model.pb``
  + ``variables/``, as unpacked from tfhub.dev's or Kaggle's .tar.gz; ``elmokit.model.tfhub``
  reads it);
- a ``.zip`` archive (NLPL's layout) or a tar archive (``.tar.gz``, ``.tar.bz2``, ...: CLARIN.SI's,
  ELMoForManyLangs' simplified Chinese), checked and unpacked safely into the cache, keyed by its
  content;
- an http(s) URL of such an archive (downloaded into the cache, keyed by the URL);
- a Hugging Face Hub repository, ``hf://owner/name[@revision]`` (``elmokit.hub.hf``: a snapshot
  in the cache, then read as a model folder);
- an options file and a weight file, each a path or a URL, as AllenNLP takes them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..base.digests import file_digest
from . import hf
from .archives import UNPACKED, ArchiveError, is_tar, unpack_archive
from .cache import ENV_CACHE, cache_dir
from .entries import again_hint, is_url
from .file_kinds import Expected, sniff
from .registry import KnownModel, find
from .shipped import DEFAULT_MODEL, MODELS_DIR, available_models
from .transport import fetch

__all__ = ["ModelSource", "download_model", "model_files", "resolve_model"]

log = logging.getLogger(__name__)

WEIGHT_NAMES = ("weights.hdf5", "model.hdf5", "lm_weights.hdf5")
OPTIONS_NAME = "options.json"
EXTRA_NAMES = {"vocab": ("vocab.txt", "vocab.txt.gz"), "softmax": ("softmax.hdf5",)}
MANYLANGS_FILES = ("char.dic", "word.dic", "token_embedder.pkl", "encoder.pkl")  # + config.json
TFHUB_GRAPHS = ("saved_model.pb", "tfhub_module.pb")  # + variables/variables.index
_IGNORED = ("__MACOSX",)
_MAX_DEPTH = 3  # an archive or folder may hold the model a few single folders down


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are. ``kind``: "bilm" (options.json + HDF5 weights),
    "manylangs" (an ELMoForManyLangs folder: ``folder`` set, no options/weight file) or "tfhub"
    (a TF-Hub module folder: ``folder`` set, no options/weight file).
    ``origin``: how it was given: "shipped", "registry", "folder", "archive", "url", "hf" or
    "files".
    ``extras``: other files of the model found beside the weights ("vocab", "softmax").
    ``archive``: the .zip the model was unpacked from, if it came from one."""

    spec: str
    origin: str
    kind: str
    folder: Path | None
    options_file: Path | None = None
    weight_file: Path | None = None
    extras: Mapping[str, Path] = field(default_factory=dict)
    name: str | None = None
    archive: Path | None = None

    def input_files(self) -> tuple[Path, ...]:
        """Every file this model is read from: options, weights, vocabulary and softmax, the
        archive it was unpacked from, an ELMoForManyLangs folder's files. A command's output
        is never one of them (``atomic.check_output``'s inputs), even with ``--overwrite``."""
        found = [self.options_file, self.weight_file, *self.extras.values(), self.archive]
        if self.kind == "manylangs" and self.folder is not None:
            try:
                found += sorted(p for p in self.folder.iterdir() if p.is_file())
            except OSError:
                pass
        return tuple(dict.fromkeys(p for p in found if p is not None))

    def files(self) -> tuple[Path, Path]:
        """(options file, weight file); a ValueError for an ELMoForManyLangs model."""
        if self.options_file is None or self.weight_file is None:
            if self.kind == "tfhub":
                raise ValueError(
                    f"{self.spec} is a TF-Hub module (no options.json + weights): load it with "
                    "elmokit.BiLM.from_pretrained or give it as --model, or write it in bilm-tf's layout "
                    "with `elmokit convert`"
                )
            raise ValueError(
                f"{self.spec} is an ELMoForManyLangs model (no options.json + weights): load it with "
                "elmokit.BiLM.from_pretrained or give it as --model"
            )
        return self.options_file, self.weight_file


def resolve_model(
    spec: str | os.PathLike | None = None,
    weight_file: str | os.PathLike | None = None,
    *,
    progress: bool | None = None,
    softmax: bool = False,
) -> ModelSource:
    """The local files of a model given in any of the forms above (None: ``DEFAULT_MODEL``;
    ``weight_file`` given: ``spec`` is the options file). Downloads what is not cached unless
    ELMOKIT_OFFLINE=1; errors are one line (FileNotFoundError, ValueError, DownloadError,
    ImportError for ``hf://`` without huggingface_hub). ``softmax``: a known model's published
    softmax and vocabulary (``KnownModel.lm_files``) are fetched too, as ``extras``; a folder's
    or an archive's are found beside the weights either way."""
    if spec is None:
        if weight_file is not None:
            raise ValueError("a weight file needs its options file")
        spec = DEFAULT_MODEL
    if weight_file is not None:
        return ModelSource(
            spec=f"{_text(spec)} + {_text(weight_file)}",
            origin="files",
            kind="bilm",
            folder=None,
            options_file=resolve_file(spec, "options file", progress=progress),
            weight_file=resolve_file(weight_file, "weight file", progress=progress),
        )
    text = _text(spec)
    if hf.is_hf_spec(text):
        return _from_folder(hf.snapshot(text), text, "hf")
    if is_url(text):
        return _from_url(text, progress)
    path = Path(text).expanduser()
    if path.is_dir():
        return _from_folder(path, text, "folder")
    if path.is_file():
        return _from_local_file(path, text)
    if text in available_models():
        return _from_folder(MODELS_DIR / text, text, "shipped", name=text)
    known = find(text)
    if known is not None:
        return _from_registry(known, text, progress, softmax)
    raise FileNotFoundError(
        f"no model folder, archive or known model {text!r}; shipped models: "
        f"{', '.join(available_models())}; `elmokit models` lists the models elmokit can download"
    )


def model_files(spec: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """(options file, weight file) of a model given in any form ``resolve_model`` takes; a
    ValueError for an ELMoForManyLangs model, which has neither."""
    return resolve_model(spec).files()


def resolve_file(path_or_url: str | os.PathLike, what: str, *, progress: bool | None = None) -> Path:
    """One model file (``what``: "options file" or "weight file"): a local path that must be an
    existing file, or a URL, downloaded into the cache (checked to be JSON or HDF5)."""
    text = _text(path_or_url)
    if is_url(text):
        kind = {"options file": "json", "weight file": "hdf5"}.get(what)
        return fetch(text, Expected(kind=kind), progress=progress)
    path = Path(text).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{what} not found: {path}")
    if not path.is_file():
        raise ValueError(f"{what} is not a file: {path}")
    return path


def download_model(
    spec: str, *, force: bool = False, progress: bool | None = None
) -> tuple[list[str], ModelSource | None]:
    """Download a known model (by name), a URL or an ``hf://`` repository into the cache
    (``force``: even if cached). Returns lines saying where each file went, and the model's
    files (None for a single file, or a shipped model) for the caller to check: the hub does
    not read models."""
    if spec in available_models():
        return [f"{spec} is shipped with elmokit ({MODELS_DIR / spec}); nothing to download"], None
    if hf.is_hf_spec(spec):
        source = _from_folder(hf.snapshot(spec, force=force), spec, "hf")
        return [f"{spec} -> {source.folder}"], source
    known = None if is_url(spec) else find(spec)
    if known is None and not is_url(spec):
        raise ValueError(
            f"{spec!r} is neither a known model, a URL nor hf://owner/name; `elmokit models` lists "
            "the known models"
        )
    # a URL's file must be of the kind its name says (a .zip a readable archive; a name without
    # a suffix one of zip, HDF5, JSON): fetch checks it before it is cached
    # (a known model's published softmax and vocabulary too, so that scoring works offline)
    files = (*known.files, *known.lm_files) if known else ()
    urls = [(f.url, f.expected) for f in files] if known else [(spec, Expected())]
    name = known.name if known else None
    paths = [fetch(u, e, force=force, progress=progress, name=name) for u, e in urls]
    if known is None and sniff(paths[0]) != "zip" and not is_tar(paths[0]):
        return [f"{spec} -> {paths[0]}"], None
    source = resolve_model(spec, progress=progress, softmax=True)  # unpacks an archive
    name = name or spec
    if source.folder is not None:
        lines = [f"{name} -> {source.folder}"]
    else:
        lines = [f"{name} options -> {source.options_file}", f"{name} weights -> {source.weight_file}"]
    if known and known.lm_files:
        lines += [f"{name} {key} -> {path}" for key, path in source.extras.items()]
    return lines, source


# -- the forms -------------------------------------------------------------------------------
def _text(value: str | os.PathLike) -> str:
    text = os.fspath(value)
    return os.fsdecode(text) if isinstance(text, bytes) else text


def _from_url(url: str, progress: bool | None) -> ModelSource:
    suffix = url.lower().split("?", 1)[0].rsplit("/", 1)[-1]
    if suffix.endswith(".json"):
        raise ValueError(f"{url} is an options file: give its weight file too (--options and --weights)")
    if suffix.endswith((".hdf5", ".h5")):
        raise ValueError(f"{url} is a weight file: give its options file too (--options and --weights)")
    path = fetch(url, progress=progress)
    found = sniff(path)
    if found != "zip" and not is_tar(path):
        kinds: dict[str | None, str] = {"json": "an options file", "hdf5": "an HDF5 weight file"}
        what = kinds.get(found, "not a model archive")
        raise ValueError(f"{url} is {what}; give a .zip or tar model archive, or --options and --weights")
    return _from_archive(path, url, "url", path.parent / UNPACKED, again=again_hint(url))


def _from_local_file(path: Path, text: str) -> ModelSource:
    if sniff(path) == "zip" or is_tar(path):
        target = cache_dir() / "archives" / file_digest(path)[:32] / UNPACKED
        return _from_archive(path, text, "archive", target)
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"PK\x03\x04":  # a zip's first member, but no readable end (central directory)
        raise ArchiveError(
            f"{path} is a .zip archive cut short or damaged (its end, the central directory, is "
            "missing or unreadable): copy or download it again"
        )
    raise ValueError(
        f"{path} is a file, not a model folder or .zip archive; an options file needs its weight "
        "file too (--options and --weights)"
    )


def _from_archive(
    archive: Path, spec: str, origin: str, target: Path, name: str | None = None, again: str | None = None
) -> ModelSource:
    """The model in ``archive``, unpacked into ``target``; ``again``: what to run to download a
    cached archive again, added to the error of one that turns out damaged."""
    try:
        folder = unpack_archive(archive, target)
    except PermissionError as err:
        raise PermissionError(f"{err}; set {ENV_CACHE} to a writable folder") from None
    except ArchiveError as err:
        if again is None:
            raise
        raise ArchiveError(f"{err}; it is in the download cache: {again}") from None
    source = _from_folder(folder, spec, origin, name=name, what="archive")
    return dataclasses.replace(source, archive=archive)


def _from_registry(known: KnownModel, spec: str, progress: bool | None, softmax: bool) -> ModelSource:
    if known.lemmatized:
        _warn_lemmatized(known.name)
    archive = known.archive
    if archive is not None:
        path = fetch(archive.url, archive.expected, progress=progress, name=known.name)
        return _from_archive(
            path,
            spec,
            "registry",
            path.parent / UNPACKED,
            name=known.name,
            again=again_hint(archive.url, known.name),
        )
    options, weights = (known.file(role) for role in ("options", "weights"))
    return ModelSource(
        spec=spec,
        origin="registry",
        kind="bilm",
        folder=None,
        options_file=fetch(options.url, options.expected, progress=progress, name=known.name),
        weight_file=fetch(weights.url, weights.expected, progress=progress, name=known.name),
        extras={
            f.role: fetch(f.url, f.expected, progress=progress, name=known.name)
            for f in (known.lm_files if softmax else ())
        },
        name=known.name,
    )


_WARNED: set[str] = set()


def _warn_lemmatized(name: str) -> None:
    """Say once per process that a model was trained on lemmas."""
    if name not in _WARNED:
        _WARNED.add(name)
        log.warning(
            "%s was trained on lemmatized text: give it lemmas (from a lemmatizer such as UDPipe or "
            "Stanza), not raw words, or its vectors are poor",
            name,
        )


def is_manylangs_folder(folder: Path) -> bool:
    """Whether ``folder`` is an ELMoForManyLangs model folder: a ``config.json`` (and no bilm-tf
    ``options.json``) beside at least one of its model files; ``elmokit.model.manylangs`` names any
    file that is missing when it reads the folder."""
    folder = Path(folder)
    if not folder.is_dir() or not (folder / "config.json").is_file() or (folder / "options.json").exists():
        return False
    return any((folder / name).is_file() for name in MANYLANGS_FILES)


def is_tfhub_folder(folder: Path) -> bool:
    """Whether ``folder`` is a TF-Hub module (or TF1 SavedModel) folder: ``saved_model.pb`` or
    ``tfhub_module.pb`` beside ``variables/variables.index``; ``elmokit.model.tfhub`` names any
    variable an ELMo module lacks when it reads the folder."""
    folder = Path(folder)
    if not folder.is_dir() or not (folder / "variables" / "variables.index").is_file():
        return False
    return any((folder / name).is_file() for name in TFHUB_GRAPHS)


def _from_folder(
    folder: Path, spec: str, origin: str, name: str | None = None, what: str = "model folder"
) -> ModelSource:
    top = folder
    for _ in range(_MAX_DEPTH):
        if is_manylangs_folder(folder):
            return ModelSource(spec=spec, origin=origin, kind="manylangs", folder=folder, name=name)
        if is_tfhub_folder(folder):
            return ModelSource(spec=spec, origin=origin, kind="tfhub", folder=folder, name=name)
        entries = _listing(folder)
        if any(p.is_file() for p in entries):
            break
        # a zip of a folder (SeqVec's uniref50_v2/, ELMoForManyLangs' en.model/): its one
        # subfolder, or the one subfolder that holds a model (beside e.g. configs/)
        subfolders = [p for p in entries if p.is_dir()]
        if len(subfolders) > 1:
            subfolders = [p for p in subfolders if _holds_model(p)]
        if len(subfolders) != 1:
            break
        folder = subfolders[0]
    names = {p.name for p in _listing(folder) if p.is_file()}
    place = f"{what} {top}" + (f" ({folder.relative_to(top)})" if folder != top else "")
    weights = [n for n in WEIGHT_NAMES if n in names]
    if not weights:
        weights = sorted(n for n in names if n.endswith(".hdf5") and "weights" in n)
    if len(weights) > 1:
        raise ValueError(
            f"{place} has several weight files ({', '.join(weights)}): keep one, or give --options "
            "and --weights"
        )
    options = OPTIONS_NAME if OPTIONS_NAME in names else None
    if options is None:
        candidates = sorted(n for n in names if n.endswith(".json") and "options" in n)
        options = candidates[0] if len(candidates) == 1 else None
    if options is None:
        raise FileNotFoundError(f"{place} has no options.json ({_holds(folder)})")
    if not weights:
        raise FileNotFoundError(
            f"{place} has no weights.hdf5, model.hdf5 or lm_weights.hdf5 ({_holds(folder)})"
        )
    extras = {
        key: folder / found
        for key, candidates in EXTRA_NAMES.items()
        for found in [next((n for n in candidates if n in names), None)]
        if found is not None
    }
    return ModelSource(
        spec=spec,
        origin=origin,
        kind="bilm",
        folder=folder,
        options_file=folder / options,
        weight_file=folder / weights[0],
        extras=extras,
        name=name,
    )


def _holds_model(folder: Path) -> bool:
    if is_manylangs_folder(folder) or is_tfhub_folder(folder):
        return True
    names = {p.name for p in _listing(folder)}
    return OPTIONS_NAME in names and any(n in names for n in WEIGHT_NAMES)


def _listing(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and p.name not in _IGNORED)
    except OSError as err:
        raise OSError(f"cannot read the model folder {folder}: {err.strerror or err}") from None


def _holds(folder: Path, shown: int = 8) -> str:
    names = [p.name + ("/" if p.is_dir() else "") for p in _listing(folder)]
    if not names:
        return "it is empty"
    more = f", ... ({len(names)} in all)" if len(names) > shown else ""
    return f"it holds: {', '.join(names[:shown])}{more}"
