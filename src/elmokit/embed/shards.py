"""Resumable, sharded embedding runs: ``Embedder.embed_file(INPUT, OUT_DIR, shard_sentences=N)``
and ``elmokit embed INPUT OUT_DIR --shard-sentences N``.

OUT_DIR holds part files of N lines each (``part-00000.hdf5``, ...), each the file ``elmokit
embed`` writes for those lines alone (its datasets and ``sentence_to_index`` number the part's
lines from 0), and ``manifest.json``: the model's files (name, size, SHA-256), the options that
decide the vectors (layers, pooling, mode, dtype, backend, tokenize, sentence index), the input
(name, size, SHA-256, lines), the part size and format, and each part's name, first line, line
count and, once it is complete, its size and SHA-256.

A part is written to a temporary file and renamed when complete (``atomic.atomic_path``); the
manifest is rewritten atomically before a part is begun (the part claimed, its SHA-256 null)
and after it is in place, so every file of the folder that the run made is named in the
manifest. A run started again with the same arguments checks the manifest against the model,
options and input (one changed is refused, naming it), keeps the parts whose SHA-256 matches
and embeds the rest. Each part is embedded on its own (its own chunks and batches, the token
cache emptied before it), so a part's bytes depend only on its lines: a resumed run, or one
shared by several processes, ends with the folder an uninterrupted run writes.

Several processes (``processes=N``, torchrun) split the parts, not the lines: the parts still
to do, in order, go to the processes in turn; each rewrites the manifest under a lock of the
folder (``flock``). ``read_shards`` reads a complete folder back, line by line.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import logging
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..base.atomic import check_output, remove_leftovers, write_json
from ..base.devices import this_process
from ..base.digests import file_digest
from ..base.jsonfiles import read_json
from ..base.textfiles import count_lines, line_splitter, read_lines
from ..model.weights import open_hdf5
from ._multiprocess_embed import EmbedRequest, LineEmbedder, _Job, progress_bar
from .parquet_file import require_pyarrow, write_parquet
from .vectors_file import POOLED_DATASET, check_layers, output_array, row_shape, write_vectors

__all__ = ["read_manifest", "read_shards"]

MANIFEST = "manifest.json"
FORMAT = "elmokit-shards"  # the manifest's "format"
VERSION = 1
# what decides the vectors, in the manifest's "options": a change is refused (the option's name)
OPTIONS = {
    "layers": "layers",
    "pooling": "pooling",
    "mode": "mode",
    "dtype": "dtype",
    "backend": "backend",
    "tokenize": "tokenize",
    "sentence_index": "sentence_index (--no-sentence-index)",
}
_log = logging.getLogger(__name__)


# -- the part files, one entry per format -------------------------------------------------------
Row = tuple[str, list[str], np.ndarray]  # a line's text, its tokens, its output array


@dataclass(frozen=True)
class PartFormat:
    """How a part file of one format is written and read: ``write(embedder, request, path,
    rows, first_line)`` writes the rows of the part's lines atomically with the writer of a
    whole output; ``read(path, lines, layers, pooling)`` yields the lines' float32 arrays in
    order."""

    suffix: str
    write: Callable[[LineEmbedder, EmbedRequest, Path, Iterable[Row], int], None]
    read: Callable[[Path, int, str, str | None], Iterator[np.ndarray]]


def _write_hdf5(
    embedder: LineEmbedder, request: EmbedRequest, path: Path, rows: Iterable[Row], first_line: int
) -> None:
    shape = row_shape(embedder.bilm.num_layers, embedder.dim, request.layers, request.pooling)
    write_vectors(path, True, ((text, array) for text, _, array in rows), shape, request.sentence_index)


def _read_hdf5(path: Path, lines: int, layers: str, pooling: str | None) -> Iterator[np.ndarray]:
    with open_hdf5(path, "part file") as f:
        if pooling is not None:
            matrix = f[POOLED_DATASET]
            for i in range(lines):
                yield matrix[i]
        else:
            for i in range(lines):
                yield f[str(i)][...]


def _write_parquet(
    embedder: LineEmbedder, request: EmbedRequest, path: Path, rows: Iterable[Row], first_line: int
) -> None:
    """A Parquet part: its "index" column holds the lines' numbers in the whole input."""
    layout = embedder.parquet_layout(request.layers, request.pooling)
    write_parquet(path, True, ((tokens, array) for _, tokens, array in rows), layout, first_index=first_line)


def _read_parquet(path: Path, lines: int, layers: str, pooling: str | None) -> Iterator[np.ndarray]:
    require_pyarrow("reading Parquet parts")
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as part:
        names = [name for name in part.schema_arrow.names if name not in ("index", "tokens")]
        dim = int((part.schema_arrow.metadata or {})[b"elmokit.dim"])
        for batch in part.iter_batches(columns=names):
            columns = [batch.column(name).to_pylist() for name in names]
            for values in zip(*columns, strict=True):
                arrays = [np.asarray(value, dtype=np.float32) for value in values]
                if pooling is None:  # (n_tokens, dim), also for a line without tokens
                    arrays = [a.reshape(len(a), dim) for a in arrays]
                yield np.stack(arrays) if layers == "all" else arrays[0]


PART_FORMATS: dict[str, PartFormat] = {
    "hdf5": PartFormat(".hdf5", _write_hdf5, _read_hdf5),
    "parquet": PartFormat(".parquet", _write_parquet, _read_parquet),
}


def part_name(index: int, total: int, suffix: str) -> str:
    """``part-00003.hdf5``: five digits, more when there are more parts."""
    width = max(5, len(str(max(total - 1, 0))))
    return f"part-{index:0{width}d}{suffix}"


# -- identities ---------------------------------------------------------------------------------
def model_identity(embedder: LineEmbedder) -> dict[str, Any]:
    """The model's files (name, size, SHA-256); a model built in memory: its tensors' SHA-256."""
    if embedder.source_files:
        files = [
            {"name": path.name, "size": path.stat().st_size, "sha256": file_digest(path)}
            for path in embedder.source_files
        ]
        return {"files": files}
    digest = hashlib.sha256()
    for name, tensor in [*embedder.bilm.named_parameters(), *embedder.bilm.named_buffers()]:
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return {"tensors_sha256": digest.hexdigest()}


def _describe_model(model: dict[str, Any]) -> str:
    if "files" in model:
        files = model["files"]
        return ", ".join(f"{f['name']} ({f['size']:,} bytes, sha256 {f['sha256'][:12]})" for f in files)
    return f"a model in memory (tensors sha256 {model['tensors_sha256'][:12]})"


# -- the manifest -------------------------------------------------------------------------------
def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a sharded output folder; a ValueError when it is not one."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{folder} holds no {MANIFEST}: it is not a sharded output")
    manifest = read_json(path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f'{path} is not an elmokit manifest (no "format": "{FORMAT}")')
    if manifest.get("version") != VERSION:
        raise ValueError(f"{path} is of version {manifest.get('version')!r}; this elmokit reads {VERSION}")
    return manifest


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """The folder locked (``flock`` on it) against the other processes of the run."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _update_part(folder: Path, entry: dict[str, Any]) -> None:
    """Put ``entry`` (a part's) into the manifest, its parts in line order, atomically."""
    with _locked(folder):
        manifest = read_manifest(folder)
        parts = {part["name"]: part for part in manifest["parts"]}
        parts[entry["name"]] = entry
        manifest["parts"] = sorted(parts.values(), key=lambda part: part["first_line"])
        write_json(folder / MANIFEST, manifest)


# -- before the work: the plan ----------------------------------------------------------------------
def prepare(
    embedder: LineEmbedder, request: EmbedRequest, shard_sentences: int, identity: dict[str, Any]
) -> dict[str, Any]:
    """Check everything, write the manifest of the run (the parts that verify kept), and return
    the plan: the line count, the parts still to do and how many were kept. ValueError or
    OSError, in one line, for anything refused: a changed model, option or input names it.
    ``identity``: the Embedder's mode, dtype and backend, as the manifest records them."""
    total = _check_request(embedder, request, shard_sentences)
    folder = _output_folder(request.output_path)
    inputs = [request.input_path, *embedder.source_files]
    manifest_path = check_output(folder / MANIFEST, True, inputs)
    header = _header(embedder, request, shard_sentences, identity, total)
    old = _earlier_run(folder, request.overwrite)
    claimed: set[str] = set()  # names the old manifest gave to parts: files the tool made
    if old is not None:
        _refuse_changes(folder, old, header)
        claimed = {part["name"] for part in old["parts"]}
    n_parts, suffix = header["total_parts"], PART_FORMATS[request.format].suffix
    names = [part_name(i, n_parts, suffix) for i in range(n_parts)]
    kept = [] if old is None else _verified_parts(folder, old)
    done = {part["name"] for part in kept}
    pending = [i for i, name in enumerate(names) if name not in done]
    for i in pending:
        _clear_part(folder / names[i], inputs, request.overwrite, claimed)
    write_json(manifest_path, {**header, "parts": kept})
    if kept:
        lines = sum(part["lines"] for part in kept)
        _log.info(
            "%s: %d of %d parts (%s lines) are done already and verified; they are skipped",
            folder,
            len(kept),
            n_parts,
            f"{lines:,}",
        )
    return {"lines": total, "pending": pending, "skipped": len(kept), "names": names}


def _check_request(embedder: LineEmbedder, request: EmbedRequest, shard_sentences: int) -> int:
    """The input's line count, once the options of a sharded run are checked (ValueError)."""
    check_layers(request.layers, request.pooling)
    if isinstance(shard_sentences, bool) or not isinstance(shard_sentences, int) or shard_sentences < 1:
        raise ValueError(f"shard_sentences must be a whole number of at least 1, got {shard_sentences!r}")
    if request.format not in PART_FORMATS:
        raise ValueError(f"format must be one of {', '.join(PART_FORMATS)}, got {request.format!r}")
    if embedder.mode == "stateful":
        raise ValueError(
            "--mode stateful carries LSTM states from each batch into the next, so a part's vectors "
            "depend on the parts before it and a run cannot resume from its parts; use warm or zero "
            "mode, or leave out --shard-sentences"
        )
    total = count_lines(request.input_path)
    if total is None:
        input_path = request.input_path
        what = "standard input" if str(input_path) == "-" else f"{input_path} is a pipe, which"
        raise ValueError(f"{what} can be read only once, so a sharded run cannot resume from it; give a file")
    return total


def _output_folder(output_path: str | os.PathLike) -> Path:
    """The output folder, made when its parent exists; a file there is refused."""
    folder = Path(output_path)
    if os.path.lexists(folder) and not folder.is_dir():
        raise NotADirectoryError(f"output {folder} is a file; with --shard-sentences the output is a folder")
    if not folder.exists():
        if not folder.parent.is_dir():
            raise FileNotFoundError(f"output folder does not exist: {folder.parent}")
        folder.mkdir()
    return folder


def _header(
    embedder: LineEmbedder,
    request: EmbedRequest,
    shard_sentences: int,
    identity: dict[str, Any],
    total: int,
) -> dict[str, Any]:
    """The manifest without its parts: what decides the vectors, the input, the parts' layout."""
    input_path = request.input_path
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": model_identity(embedder),
        "options": {
            "layers": request.layers,
            "pooling": request.pooling,
            "mode": identity["mode"],
            "dtype": identity["dtype"],
            "backend": identity["backend"],
            "tokenize": request.tokenize,
            "sentence_index": request.sentence_index,
        },
        "input": {
            "name": Path(input_path).name,
            "size": os.path.getsize(input_path),
            "sha256": file_digest(input_path),
            "lines": total,
        },
        "part_format": request.format,
        "part_sentences": shard_sentences,
        "total_parts": -(-total // shard_sentences),
    }


def _earlier_run(folder: Path, overwrite: bool) -> dict[str, Any] | None:
    """The manifest of the run that wrote into ``folder`` before, None when there is none (or,
    with ``overwrite``, once that run's files are deleted). Another file of its name is refused
    unless ``overwrite``."""
    if not os.path.lexists(folder / MANIFEST):
        return None
    try:
        old = read_manifest(folder)
    except ValueError:
        if not overwrite:
            raise ValueError(
                f"{folder / MANIFEST} exists and is not the manifest of a sharded run; move it away, or "
                "pass --overwrite (overwrite=True) to replace it"
            ) from None
        return None
    if overwrite:
        _remove_run(folder, old)
        return None
    return old


def _verified_parts(folder: Path, old: dict[str, Any]) -> list[dict[str, Any]]:
    """The complete parts of the earlier run whose files match their SHA-256 (the others are
    embedded again; a missing or changed one is logged)."""
    kept: list[dict[str, Any]] = []
    for part in old["parts"]:
        path = folder / part["name"]
        if part.get("sha256") is None:
            continue  # begun, never finished: embedded again
        if path.is_file() and not path.is_symlink() and file_digest(path) == part["sha256"]:
            kept.append(part)
        else:
            why = "is missing" if not os.path.lexists(path) else "does not match its sha256 in the manifest"
            _log.warning("%s %s: it is embedded again", path, why)
    return kept


def _clear_part(path: Path, inputs: list[Any], overwrite: bool, claimed: set[str]) -> None:
    """Make room for a part still to do: never an input, a link or a folder; a file of its name
    that the manifest did not claim is refused unless ``overwrite``; a killed run's temporary
    files are removed."""
    check_output(path, True, inputs)
    if os.path.lexists(path) and not overwrite and path.name not in claimed:
        raise FileExistsError(
            f"{path} exists and the manifest does not name it, so elmokit did not write it; move "
            "it away, or pass --overwrite (overwrite=True) to replace it"
        )
    remove_leftovers(path)


def _remove_run(folder: Path, manifest: dict[str, Any]) -> None:
    """--overwrite: delete the parts the manifest names (and their leftovers), then the manifest."""
    for part in manifest.get("parts", []):
        name = str(part.get("name", ""))
        if "/" in name or not name.startswith("part-"):
            continue  # never a file outside the folder, nor one the tool does not name
        path = folder / name
        remove_leftovers(path)
        if path.is_file() and not path.is_symlink():
            path.unlink()
    (folder / MANIFEST).unlink()


def _refuse_changes(folder: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """A ValueError naming the first thing that differs between the run in ``folder`` and this one."""
    after = "; run the same command to resume it, or pass --overwrite (overwrite=True) to start over"
    if old.get("model") != new["model"]:
        raise ValueError(
            f"{folder} holds parts of another model: {_describe_model(old['model'])}, not "
            f"{_describe_model(new['model'])}{after}"
        )
    for key, name in OPTIONS.items():
        was, now = old.get("options", {}).get(key), new["options"][key]
        if was != now:
            raise ValueError(f"{folder} holds parts embedded with {name} {was!r}, not {now!r}{after}")
    for key, name in (("part_format", "part format"), ("part_sentences", "shard_sentences")):
        if old.get(key) != new[key]:
            raise ValueError(f"{folder} holds parts of {name} {old.get(key)!r}, not {new[key]!r}{after}")
    was_input, input_now = old.get("input", {}), new["input"]
    if was_input != input_now:
        differs = [
            f"{key} {was_input.get(key)!r} -> {input_now[key]!r}"
            for key in ("name", "size", "lines", "sha256")
            if was_input.get(key) != input_now[key]
        ]
        raise ValueError(f"{folder} holds parts of another input ({', '.join(differs)}){after}")


# -- the work -------------------------------------------------------------------------------------
def work(
    embedder: LineEmbedder,
    job: _Job | None,
    request: EmbedRequest,
    shard_sentences: int,
    identity: dict[str, Any],
    plan: dict[str, Any] | None = None,
) -> str:
    """This process's parts of a sharded run (all of them in one process); the summary as JSON.
    Without a ``plan`` (one process, or torchrun's process 0) the run is prepared here; under
    torchrun process 0 passes the plan (or its error) to the others through the store."""
    if job is None and this_process().distributed:
        job = _Job.under_torchrun("shards", this_process())
    rank, size = (0, 1) if job is None else (job.rank, job.size)
    if plan is None:
        plan = _shared_plan(embedder, job, request, shard_sentences, identity)
    start = time.perf_counter()
    folder = Path(request.output_path)
    names, total, pending = plan["names"], plan["lines"], plan["pending"]
    split = line_splitter(request.tokenize, warn=rank == 0)
    counters = _Counters(job)

    def lines_of(first: int) -> int:
        return min(shard_sentences, total - first)

    todo = sum(lines_of(i * shard_sentences) for i in pending)
    bar_context = progress_bar(request.progress and rank == 0, todo) if rank == 0 else nullcontext(None)
    with bar_context as bar:
        progress = _PartsProgress(bar, plan, start)
        progress.resuming(folder)
        progress.show(0, 0, 0)
        source = iter(read_lines(request.input_path))
        consumed = 0  # lines read from the input so far
        for index in pending[rank::size]:
            first = index * shard_sentences
            count = lines_of(first)
            for _ in itertools.islice(source, first - consumed):  # to the part's first line
                pass
            lines = _part_lines(source, count, request.input_path)
            tokens, empty = _embed_part(embedder, request, folder, names[index], first, count, lines, split)
            consumed = first + count
            counters.add("sentences", count)
            counters.add("empty", empty)
            progress.show(
                counters.add("lines", count), counters.add("tokens", tokens), counters.add("parts", 1)
            )
        if job is not None:
            job.add("finished", 1)
            if rank != 0:
                return job.wait_for_merge()
            while job.add("finished", 0) < size:
                progress.show(*counters.progress())
                time.sleep(0.2)
            progress.show(*counters.progress())
    summary = {
        "sentences": counters.add("sentences"),
        "tokens": counters.add("tokens"),
        "empty": counters.add("empty"),
        "seconds": time.perf_counter() - start,
        "output": str(folder),
        "processes": size,
        "parts": len(names),
        "skipped_parts": plan["skipped"],
    }
    result = json.dumps(summary)
    if job is not None:
        job.merged(result)
    return result


def _shared_plan(
    embedder: LineEmbedder,
    job: _Job | None,
    request: EmbedRequest,
    shard_sentences: int,
    identity: dict[str, Any],
) -> dict[str, Any]:
    """The run's plan: ``prepare``d by process 0 (or the one process), which passes it, or its
    error, to torchrun's other processes through the store; they raise that error."""
    if job is not None and job.rank != 0:
        plan = json.loads(job.store.get("plan").decode())
        if "error" in plan:
            raise ValueError(plan["error"])
        return plan
    try:
        plan = prepare(embedder, request, shard_sentences, identity)
    except Exception as err:
        if job is not None:
            job.store.set("plan", json.dumps({"error": str(err)}))
        raise
    if job is not None:
        job.store.set("plan", json.dumps(plan))
    return plan


class _Counters:
    """The run's counts (sentences, tokens, empty lines, parts, lines): this process's, or with
    a job every process's, kept in the store."""

    def __init__(self, job: _Job | None) -> None:
        self.job = job
        self.counts: Counter[str] = Counter()

    def add(self, key: str, amount: int = 0) -> int:
        """Add ``amount`` to a count; returns its new value."""
        if self.job is None:
            self.counts[key] += amount
            return self.counts[key]
        return self.job.add(key, amount)

    def progress(self) -> tuple[int, int, int]:
        """(lines, tokens, parts) done so far."""
        return self.add("lines"), self.add("tokens"), self.add("parts")


@dataclass(frozen=True)
class _PartsProgress:
    """What the progress bar of process 0 shows (``bar`` None: the other processes, which show
    nothing): the lines done, the parts done of all, the tokens a second since ``start``."""

    bar: Any
    plan: dict[str, Any]
    start: float

    def resuming(self, folder: Path) -> None:
        """Say, above the bar, how many parts an earlier run finished."""
        skipped, parts = self.plan["skipped"], len(self.plan["names"])
        if self.bar is not None and skipped:
            self.bar.write(f"resuming {folder}: {skipped} of {parts} parts done, skipped", file=sys.stderr)

    def show(self, lines: int, tokens: int, parts: int) -> None:
        if self.bar is None:
            return
        self.bar.update(lines - self.bar.n)
        rate = tokens / max(time.perf_counter() - self.start, 1e-9)
        skipped = self.plan["skipped"]
        shown = f", {skipped} skipped" if skipped else ""
        self.bar.set_postfix_str(
            f"parts {skipped + parts}/{len(self.plan['names'])}{shown}, tok/s={rate:.0f}"
        )


def _embed_part(
    embedder: LineEmbedder,
    request: EmbedRequest,
    folder: Path,
    name: str,
    first: int,
    count: int,
    lines: Iterable[str],
    split: Callable[[str], list[str]],
) -> tuple[int, int]:
    """One part of ``count`` lines from line ``first``: claimed in the manifest, embedded on its
    own into its file, then recorded with its size and SHA-256. Returns (tokens, empty lines)."""
    entry = {"name": name, "first_line": first, "lines": count, "sha256": None}
    _update_part(folder, entry)  # claimed: a file of this name is the tool's from now on
    # each part on its own: its encodings are computed within it, whatever ran before
    embedder.bilm.token_encoder.clear_cache()
    path = folder / name
    tokens, empty = _write_part(embedder, request, path, lines, first, split)
    entry |= {"size": path.stat().st_size, "sha256": file_digest(path)}
    _update_part(folder, entry)
    return tokens, empty


def _part_lines(source: Iterator[str], count: int, input_path: str | os.PathLike) -> Iterator[str]:
    """The next ``count`` lines of the input."""
    for _ in range(count):
        text = next(source, None)
        if text is None:
            raise ValueError(f"{input_path} changed while it was embedded: it has fewer lines than before")
        yield text


def _write_part(
    embedder: LineEmbedder,
    request: EmbedRequest,
    path: Path,
    lines: Iterable[str],
    first_line: int,
    split: Callable[[str], list[str]],
) -> tuple[int, int]:
    """Embed a part's lines into its file (atomically); returns (tokens, empty lines)."""
    layers, pooling = request.layers, request.pooling
    texts: deque[tuple[str, list[str]]] = deque()  # lines read but not yet written, in order
    stats = [0, 0]

    def token_lists() -> Iterator[list[str]]:
        for text in lines:
            tokens = split(text)
            texts.append((text, tokens))
            yield tokens

    def rows() -> Iterator[Row]:
        for array in embedder.embed_sentences(token_lists()):
            text, tokens = texts.popleft()
            yield text, tokens, output_array(array, layers, pooling)
            stats[0] += array.shape[1]
            stats[1] += array.shape[1] == 0

    PART_FORMATS[request.format].write(embedder, request, path, rows(), first_line)
    return stats[0], stats[1]


# -- reading ----------------------------------------------------------------------------------------
def read_shards(folder: str | os.PathLike, verify: bool = True) -> Iterator[np.ndarray]:
    """The float32 arrays of a complete sharded output's lines, in the input's order across its
    parts: each the array a single output holds for the line ((3, n_tokens, dim), (n_tokens,
    dim), or with pooling its row). ``verify``: each part's SHA-256 is checked against the
    manifest before it is read. A folder whose run is not finished is a ValueError."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    parts = [part for part in manifest["parts"] if part.get("sha256") is not None]
    if len(parts) != manifest["total_parts"]:
        raise ValueError(
            f"{folder} holds {len(parts)} of {manifest['total_parts']} parts: the run is not "
            "finished; run its command again to finish it"
        )
    fmt = PART_FORMATS[manifest["part_format"]]
    layers, pooling = manifest["options"]["layers"], manifest["options"]["pooling"]
    for part in parts:
        path = folder / part["name"]
        if verify and file_digest(path) != part["sha256"]:
            raise ValueError(f"{path} does not match its sha256 in the manifest")
        yield from fmt.read(path, part["lines"], layers, pooling)
