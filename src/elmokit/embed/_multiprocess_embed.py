"""The engine of ``Embedder.embed_file`` and ``Embedder.embed_tokens_file`` in several processes:
``processes=N`` (``elmokit embed --nproc N``) starts N worker processes on this machine, and under
torchrun each of torchrun's processes embeds its share. Private: the Embedder is its interface.

The split: the lines are cut into chunks of ``Embedder.chunk_size`` lines (8 x the batch size:
the Embedder forms its length-sorted batches within such a chunk), and chunk c goes to process
c mod the number of processes. So every process forms exactly the batches a single process
would, and the chunks of long and short lines spread evenly over the processes, whatever the
order of the file. Token files go by blocks of ``vectors_file.TOKEN_BLOCK`` tokens the same way.

Each process writes the vectors of its lines, in its order, to a scratch file beside OUTPUT (raw
float32 arrays, then the lines' token counts; ``atomic.scratch_path``, so the scratch file of a
killed process is removed by the next write of OUTPUT). When all are done, process 0 reads the
input's lines again and the scratch files in line order and writes OUTPUT with
``vectors_file.write_vectors``, as one process does: a temporary file, renamed when complete.

The processes talk only through a key-value store (torchrun's rendezvous store, which the
launcher hosts for the workers it starts): counts for the one progress bar, the scratch files'
names, "finished" and "merged" (with the run's summary). There is no process group and no
collective, so a process never waits on another before the merge, a slow process cannot time
out a fast one, and GPUs need no NCCL. A worker that fails makes the launcher stop the others
(SIGTERM: they remove their scratch files), and its one line names it.

Stateful mode carries each batch's LSTM states into the next batch: its vectors depend on the
file's order, so it cannot be split and is refused.

``processes=N`` starts the workers with the launcher of training (``base._processes``,
torch's elastic launcher as ``torchrun --standalone`` runs it): each worker is then one of
torchrun's processes, finds its rank and the store in its environment, and runs the code of
torchrun's. A worker gets the Embedder's recipe (``embedder._EmbedderRecipe``: the runner's
recipe, the model and the batching), from which it builds the same Embedder on its device.
"""

from __future__ import annotations

import json
import math
import os
import signal
import struct
import sys
import time
from array import array as typed_array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from ..base import kernels
from ..base._processes import first_failure, run_processes
from ..base.atomic import (
    Terminated,
    check_output,
    handle_signals,
    remove_leftovers,
    scratch_path,
    terminate_raises,
)
from ..base.devices import Process, process_device, this_process
from ..base.textfiles import count_lines, line_splitter, read_lines
from ..model.bilm import BiLM
from .parquet_file import ParquetLayout, write_parquet
from .vectors_file import (
    TOKEN_BLOCK,
    check_layers,
    output_array,
    read_vocabulary,
    row_shape,
    write_token_vectors,
    write_vectors,
)

__all__ = ["LineEmbedder", "check_splittable", "progress_bar", "run", "share"]

_TRAILER = struct.Struct("<q8s")  # the number of lines of a part, and this mark
_MARK = b"elmokit1"
_POLL_SECONDS = 0.2


class LineEmbedder(Protocol):
    """What the engine needs of an Embedder."""

    bilm: BiLM
    mode: str
    source_files: tuple[Path, ...]  # the model's files: outputs never replace them

    @property
    def chunk_size(self) -> int: ...

    @property
    def dim(self) -> int: ...

    def embed_sentences(self, sentences: Any, pooling: str | None = None) -> Iterator[np.ndarray]: ...

    def encode_token_block(self, tokens: list[str]) -> np.ndarray: ...

    def parquet_layout(self, layers: str = "all", pooling: str | None = None) -> ParquetLayout: ...


@contextmanager
def progress_bar(enabled: bool, total: int | None, desc: str | None = None) -> Iterator[Any]:
    """A tqdm bar of sentences on stderr (a bar that shows nothing when not ``enabled``). Its
    rate is the mean since the start, and its time left is shown only once twice as long has
    passed as the first sentence took (a batch's sentences arrive together, so the first alone
    would say hours for a minute's work). On an error the bar is cleared, so that the error's
    line stands alone."""
    from tqdm import tqdm

    class Bar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.first: float | None = None  # seconds from the start to the first update
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if self.first is None and n and hasattr(self, "start_t"):  # a disabled bar has none
                self.first = self._time() - self.start_t
            return super().update(n)

        @property
        def format_dict(self) -> dict[str, Any]:
            shown = super().format_dict
            early = self.first is None or shown["elapsed"] < 2 * self.first
            if shown["total"] and shown["n"] < shown["total"] and early:
                shown["bar_format"] = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<?{postfix}]"
            return shown

    bar = Bar(
        total=total,
        desc=desc,
        unit="sent",
        disable=not enabled,
        dynamic_ncols=True,
        file=sys.stderr,
        smoothing=0,
    )
    try:
        yield bar
    except BaseException:
        bar.leave = False  # closing clears the bar's line
        raise
    finally:
        bar.close()


def check_splittable(mode: str, input_path: str | os.PathLike) -> int:
    """The input's line count; stateful mode or an input that can be read only once is
    refused (ValueError)."""
    if mode == "stateful":
        raise ValueError(
            "--mode stateful carries LSTM states from each batch into the next, so its vectors "
            "depend on the file's order and it cannot be split between processes; run it in one "
            "process (without torchrun or --nproc), or use warm or zero mode"
        )
    total = count_lines(input_path)
    if total is None:
        what = "standard input" if str(input_path) == "-" else f"{input_path} is a pipe, which"
        raise ValueError(
            f"{what} can be read only once, so it cannot be split between processes; give a file"
        )
    return total


# -- the work shared through the store ------------------------------------------------------------
_jobs = 0  # the jobs this process ran with torchrun's store: each gets its own keys
_torchrun_store: dist.Store | None = None


class _Job:
    """One file's work shared by the processes, through the store: counters, the scratch files'
    names, and the moments "all finished" and "merged"."""

    def __init__(self, store: dist.Store, process: Process) -> None:
        self.store = store
        self.rank, self.size = process.rank, process.world_size

    @classmethod
    def under_torchrun(cls, kind: str, process: Process) -> _Job:
        """A job among torchrun's processes, keyed apart from the earlier jobs of this process."""
        global _jobs, _torchrun_store
        if _torchrun_store is None:  # one client per process (rank 0 may host the store itself)
            _torchrun_store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(minutes=30)))
        _jobs += 1
        prefix = f"elmokit/{process.restart}/{kind}-{_jobs}/"
        return cls(dist.PrefixStore(prefix, _torchrun_store), process)

    def add(self, key: str, amount: int) -> int:
        """Add to a counter of all processes; returns its new value."""
        return int(self.store.add(key, amount))

    def finish(self, part: Path) -> None:
        """This process's part is complete. Its file's name is published, not its path: the
        output's folder may be mounted elsewhere on another machine."""
        self.store.set(f"part/{self.rank}", part.name)
        self.add("finished", 1)

    def parts(self, folder: Path, waiting: Callable[[], None]) -> list[Path]:
        """Process 0: wait until every process finished its part (calling ``waiting`` between
        looks); their scratch files in ``folder``, in rank order."""
        while self.add("finished", 0) < self.size:
            waiting()
            time.sleep(_POLL_SECONDS)
        waiting()
        return [folder / self.store.get(f"part/{rank}").decode() for rank in range(self.size)]

    def merged(self, result: str) -> None:
        """Process 0: OUTPUT is in place; let the others go, and wait until they read ``result``
        (the store may live in this process)."""
        self.store.set("merged", result)
        while self.add("left", 0) < self.size - 1:
            time.sleep(_POLL_SECONDS)

    def wait_for_merge(self) -> str:
        """The other processes: keep the part until process 0 merged it; its ``result``."""
        while not self.store.check(["merged"]):
            time.sleep(_POLL_SECONDS)
        result = self.store.get("merged").decode()
        self.add("left", 1)
        return result


@dataclass(frozen=True)
class EmbedRequest:
    """What ``Embedder.embed_file`` is asked to do, as each process of the run gets it (and a
    sharded run, ``shards.work``): the input, the output and what decides its vectors."""

    input_path: str | os.PathLike
    output_path: str | os.PathLike
    layers: str
    overwrite: bool
    sentence_index: bool
    tokenize: bool
    progress: bool
    pooling: str | None
    format: str = "hdf5"  # "hdf5" or "parquet"


def share(
    kind: str | Callable[..., str],
    embedder: LineEmbedder,
    arguments: dict[str, Any],
    job: _Job | None = None,
) -> dict[str, Any]:
    """This process's share of a file job (``kind`` "embed": ``_embed_share``'s ``arguments``,
    ``{"request": EmbedRequest}``; "tokens": ``_tokens_share``'s; or the job's own function of
    ``(embedder, job, **arguments)``, e.g. ``shards.work``), among torchrun's processes unless
    ``job`` is given. Returns the run's summary (the same in every process)."""
    work = kind if callable(kind) else _embed_share if kind == "embed" else _tokens_share
    return json.loads(work(embedder, job, **arguments))


def _embed_share(embedder: LineEmbedder, job: _Job | None, request: EmbedRequest) -> str:
    """One process's part of the lines, and process 0's merge; the summary as JSON."""
    input_path, layers, pooling = request.input_path, request.layers, request.pooling
    check_layers(layers, pooling)
    total = check_splittable(embedder.mode, input_path)
    output = check_output(request.output_path, request.overwrite, [input_path, *embedder.source_files])
    remove_leftovers(output)  # of this host's killed runs
    if job is None:  # the checks above come before any process talks
        job = _Job.under_torchrun("embed", this_process())
    start = time.perf_counter()
    chunk, size, rank = embedder.chunk_size, job.size, job.rank
    split = line_splitter(request.tokenize, warn=rank == 0)

    def token_lists() -> Iterator[list[str]]:
        for i, text in enumerate(read_lines(input_path)):
            if (i // chunk) % size == rank:
                yield split(text)

    bar_context = progress_bar(request.progress and rank == 0, total)
    with scratch_path(output, f"part{rank}-") as part, bar_context as bar:

        def show(lines: int, tokens: int) -> None:
            bar.update(lines - bar.n)
            bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.0f}")

        lengths = typed_array("q")
        tokens = 0
        with open(part, "wb") as out:
            for array in embedder.embed_sentences(token_lists()):
                vectors = np.ascontiguousarray(output_array(array, layers, pooling), dtype=np.float32)
                out.write(vectors.data)
                lengths.append(array.shape[1])
                tokens += array.shape[1]
                if len(lengths) % chunk == 0:
                    show(job.add("lines", chunk), job.add("tokens", tokens))
                    tokens = 0
            show(job.add("lines", len(lengths) % chunk), job.add("tokens", tokens))
            out.write(lengths.tobytes())
            out.write(_TRAILER.pack(len(lengths), _MARK))
        job.finish(part)
        if rank != 0:
            return job.wait_for_merge()
        parts = job.parts(output.parent, lambda: show(job.add("lines", 0), job.add("tokens", 0)))
        bar.close()
        embedded = time.perf_counter()
        lines, n_tokens, empty = _merge_lines(embedder, request, output, parts)
        end = time.perf_counter()
        summary: dict[str, Any] = {
            "sentences": lines,
            "tokens": n_tokens,
            "empty": empty,
            "seconds": end - start,
        }
        summary |= {"output": str(output), "processes": size, "merge_seconds": end - embedded}
        result = json.dumps(summary)
        job.merged(result)
        return result


class _Part:
    """A process's part read back in its order: the float32 arrays of its lines, one by one."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "rb", buffering=1 << 20)  # noqa: SIM115 (closed by close())
        end = self.file.seek(0, os.SEEK_END)
        if end < _TRAILER.size:
            raise RuntimeError(f"the part {path} is incomplete")
        self.file.seek(end - _TRAILER.size)
        count, mark = _TRAILER.unpack(self.file.read(_TRAILER.size))
        if mark != _MARK or count < 0 or 8 * count > end - _TRAILER.size:
            raise RuntimeError(f"the part {path} is incomplete")
        self.file.seek(end - _TRAILER.size - 8 * count)
        self.lengths = np.frombuffer(self.file.read(8 * count), dtype=np.int64)
        self.file.seek(0)
        self.next = 0

    def read(self, shape: Callable[[int], tuple[int, ...]]) -> tuple[np.ndarray, int]:
        """The next line's array (of ``shape(n_tokens)``) and its token count."""
        if self.next == len(self.lengths):
            raise RuntimeError("read past the last line of a part")
        n = int(self.lengths[self.next])
        self.next += 1
        dims = shape(n)
        data = self.file.read(4 * math.prod(dims))
        return np.frombuffer(data, dtype=np.float32).reshape(dims), n

    def close(self) -> None:
        self.file.close()


def _merge_lines(
    embedder: LineEmbedder, request: EmbedRequest, output: Path, paths: list[Path]
) -> tuple[int, int, int]:
    """Process 0: write OUTPUT (HDF5 or Parquet) from the parts, line by line in the input's
    order, as one process writes it. Returns (lines, tokens, empty lines)."""
    input_path, layers, pooling = request.input_path, request.layers, request.pooling
    chunk, size = embedder.chunk_size, len(paths)
    num_layers, dim = embedder.bilm.num_layers, embedder.dim
    pooled = row_shape(num_layers, dim, layers, pooling)

    def shape(n: int) -> tuple[int, ...]:
        if pooled is not None:
            return pooled
        return (num_layers, n, dim) if layers == "all" else (n, dim)

    parts = [_Part(path) for path in paths]
    counts = [0, 0, 0]
    parquet = request.format == "parquet"
    split = line_splitter(request.tokenize, warn=False)
    total = sum(len(part.lengths) for part in parts)

    def rows(bar: Any) -> Iterator[tuple[Any, np.ndarray]]:
        for i, text in enumerate(read_lines(input_path)):
            part = parts[(i // chunk) % size]
            if part.next == len(part.lengths):
                raise ValueError(f"{input_path} changed while it was embedded: it has more lines than before")
            array, n = part.read(shape)
            yield (split(text) if parquet else text), array
            counts[0] += 1
            counts[1] += n
            counts[2] += n == 0
            bar.update(1)
        if counts[0] != total:
            raise ValueError(f"{input_path} changed while it was embedded: it has fewer lines than before")

    try:
        with progress_bar(request.progress, total, "merge") as bar:
            if parquet:
                write_parquet(output, request.overwrite, rows(bar), embedder.parquet_layout(layers, pooling))
            else:
                write_vectors(output, request.overwrite, rows(bar), pooled, request.sentence_index)
    finally:
        for part in parts:
            part.close()
    return counts[0], counts[1], counts[2]


def _tokens_share(
    embedder: LineEmbedder,
    job: _Job | None,
    vocab_path: str | os.PathLike,
    output_path: str | os.PathLike,
    overwrite: bool,
) -> str:
    """One process's blocks of token vectors (block b by process b mod the number of
    processes), and process 0's merge; the summary ({"tokens": n}) as JSON."""
    output = check_output(output_path, overwrite, [vocab_path, *embedder.source_files])
    tokens = read_vocabulary(vocab_path)
    remove_leftovers(output)
    if job is None:
        job = _Job.under_torchrun("tokens", this_process())
    blocks = range(0, len(tokens), TOKEN_BLOCK)
    result = json.dumps({"tokens": len(tokens)})
    with scratch_path(output, f"part{job.rank}-") as part:
        with open(part, "wb") as out:
            for first in blocks[job.rank :: job.size]:
                block = embedder.encode_token_block(tokens[first : first + TOKEN_BLOCK])
                out.write(np.ascontiguousarray(block, dtype=np.float32).data)
        job.finish(part)
        if job.rank != 0:
            return job.wait_for_merge()
        files = [open(path, "rb") for path in job.parts(output.parent, lambda: None)]  # noqa: SIM115
        dim = embedder.bilm.token_encoder.output_dim
        try:

            def ordered() -> Iterator[np.ndarray]:
                for b, first in enumerate(blocks):
                    rows = min(TOKEN_BLOCK, len(tokens) - first)
                    data = files[b % job.size].read(4 * rows * dim)
                    yield np.frombuffer(data, dtype=np.float32).reshape(rows, dim)

            write_token_vectors(output, overwrite, ordered(), (len(tokens), dim))
        finally:
            for file in files:
                file.close()
        job.merged(result)
    return result


# -- worker processes started here ----------------------------------------------------------------
class _BuildsEmbedder(Protocol):
    """What a worker builds its Embedder from (``embedder._EmbedderRecipe``): it pickles."""

    @property
    def device(self) -> torch.device: ...

    def build(self, device: torch.device) -> LineEmbedder: ...


@dataclass(frozen=True)
class _Start:
    """What each worker needs: the recipe of its Embedder and the starting process's settings."""

    kind: str | Callable[..., str]
    embedder: _BuildsEmbedder
    device: str  # "cuda": each worker on cuda:LOCAL_RANK; else this device for all
    arguments: dict[str, Any]
    kernels_on: tuple[str, ...]
    threads: int


class _Failed(Exception):
    """A worker's failure as one line: what the starting process says of it."""


_INTERRUPTED = "interrupted by signal "  # a _Failed of a worker that a signal interrupted


def run(
    kind: str | Callable[..., str],
    processes: int,
    embedder: _BuildsEmbedder,
    arguments: dict[str, Any],
    what: Sequence[str],
) -> dict[str, Any]:
    """Start ``processes`` workers on this machine that share the file job ``kind`` (see
    ``share``) as torchrun's processes do, through the launcher of training
    (``base._processes.run_processes``), each with the Embedder ``embedder.build(device)`` (on a
    GPU: cuda:RANK, one GPU a worker), and wait for them. Returns the summary. A worker that
    fails stops the others (SIGTERM: they remove their scratch files) and raises
    ChildProcessError naming it and its cause; ``what`` = (command, output) words it. A worker
    interrupted by a signal (Ctrl-C reaches every worker) raises it here as KeyboardInterrupt."""
    device = embedder.device
    if device.type == "cuda" and processes > torch.cuda.device_count():
        raise ValueError(
            f"{processes} processes on the GPU need {processes} GPUs; this machine has "
            f"{torch.cuda.device_count()}: pass fewer processes or the device cpu"
        )
    # CPU workers share the cores, and none uses more threads than this process
    threads = max(1, min(torch.get_num_threads(), (os.cpu_count() or 1) // processes))
    on = tuple(name for name in kernels.NAMES if kernels.enabled(name))
    start = _Start(kind, embedder, "cuda" if device.type == "cuda" else str(device), arguments, on, threads)
    command, output = what
    try:
        results = run_processes(_worker, (start,), processes, share_cores=False)
    except ChildFailedError as err:
        rank, code, message = first_failure(err)
        failed = f"{_Failed.__name__}: "
        line = message[len(failed) :] if message.startswith(failed) else None
        if line is not None and line.startswith(_INTERRUPTED):
            if int(line[len(_INTERRUPTED) :]) == signal.SIGTERM:
                raise Terminated("terminated by SIGTERM") from None
            raise KeyboardInterrupt from None
        if line is not None:
            why = ": " + line
        else:
            why = f" (killed by {signal.Signals(-code).name})" if code < 0 else f" (exit status {code})"
        raise ChildProcessError(f"{command} process {rank} failed{why}; {output} was not written") from None
    return results[0]


def _worker(start: _Start) -> dict[str, Any] | None:
    """One worker, one of the launcher's processes: its share of the job, found as torchrun's
    processes find theirs; rank 0 returns the summary. A failure is raised as one line
    (``_Failed``), which the launcher records for the starting process."""
    process = this_process()
    try:
        # a worker is a process of ours: SIGTERM from the launcher raises, so its scratch files
        # are removed
        with handle_signals(), terminate_raises():
            kernels.set_enabled(False)
            if start.kernels_on:
                kernels.set_enabled(True, *start.kernels_on)
            if start.device == "cuda":
                device = process_device("cuda", process=process)
            else:
                device = torch.device(start.device)
                torch.set_num_threads(start.threads)
            result = share(start.kind, start.embedder.build(device), start.arguments)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (atomic.Terminated)
        raise _Failed(f"{_INTERRUPTED}{int(getattr(err, 'signum', signal.SIGINT))}") from None
    except Exception as err:  # noqa: BLE001 (any failure: its one line goes to the starting process)
        text = str(err).strip()
        raise _Failed(text.splitlines()[0] if text else type(err).__name__) from None
    return result if process.rank == 0 else None
