"""Embedding one file in several processes (``torchrun ... -m elmokit.cli embed``): each process
takes a share of the lines, and the first one merges the shares into the one output.

The split: the lines are cut into chunks of ``Embedder.chunk_size`` lines (8 x the batch size:
the Embedder forms its length-sorted batches within such a chunk), and chunk c goes to process
c mod WORLD_SIZE. So every process forms exactly the batches a single process would, and the
chunks of long and short lines spread evenly over the processes, whatever the order of the file.

Each process writes the vectors of its lines, in its order, to a scratch file beside OUTPUT (raw
float32 arrays, then the lines' token counts; ``atomic.scratch_path``, so the scratch file of a
killed process is removed by the next write of OUTPUT). When all are done, process 0 reads the
input's lines again and the scratch files in line order and writes OUTPUT through the code of
``Embedder.embed_file`` itself (``embed._write_vectors``): a temporary file, renamed when complete.

The processes talk only through the rendezvous's key-value store (the TCPStore that torchrun
starts): counts for the one progress bar, the scratch files' names, "finished", "merged". There
is no process group and no collective, so a process never waits on another before the merge, a
slow process cannot time out a fast one, and GPUs need no NCCL. A process that fails makes the
launcher stop the others (SIGTERM: they remove their scratch files and temporary output).

Stateful mode carries each batch's LSTM states into the next batch: its vectors depend on the
file's order, so it cannot be split and is refused. ``elmokit tokens`` is shared the same way
(blocks of ``embed.TOKEN_BLOCK`` tokens). ``--nproc N`` (``run_command``) starts the processes
itself, through ``_processes.run_processes`` (torch's elastic launcher, as torchrun).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import struct
import sys
import time
from array import array as typed_array
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch.distributed as dist

from .atomic import check_output, remove_leftovers, scratch_path
from .embed import (
    TOKEN_BLOCK,
    Embedder,
    EmbedSummary,
    _check_layers,
    _output_array,
    _progress,
    _tokenizer,
    _vocabulary_tokens,
    _write_token_vectors,
    _write_vectors,
)
from .textfiles import count_lines, read_lines

__all__ = ["embed_file", "embed_tokens_file", "run_command", "world_size"]

_TRAILER = struct.Struct("<q8s")  # the number of lines of a part, and this mark
_MARK = b"elmokit1"
_POLL_SECONDS = 0.2
_jobs = 0  # the commands this process ran in the group: each gets its own keys in the store
_store: dist.Store | None = None


def world_size() -> int:
    """The number of processes that share the work (WORLD_SIZE; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class _Job:
    """One command's work shared by the processes, through the rendezvous store: counters,
    the scratch files' names, and the moments "all finished" and "merged"."""

    def __init__(self, kind: str) -> None:
        global _jobs, _store
        if _store is None:  # one client per process (rank 0 may host the store itself)
            _store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(minutes=30)))
        _jobs += 1
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.store = dist.PrefixStore(f"elmokit/{attempt}/{kind}-{_jobs}/", _store)
        self.rank, self.size = _rank(), world_size()

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


def check_embed_file(
    mode: str,
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    overwrite: bool,
    layers: str = "all",
    pooling: str | None = None,
) -> tuple[int, Path]:
    """The checks of ``embed_file`` before any work (all raise ValueError or OSError): the
    input's line count and the output's path."""
    _check_layers(layers, pooling)
    total = _check_splittable(mode, input_path)
    output = check_output(output_path, overwrite, [input_path])
    return total, output


def _check_splittable(mode: str, input_path: str | os.PathLike) -> int:
    """The input's line count; stateful mode or an input that can be read only once is
    refused."""
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


def embed_file(
    embedder: Embedder,
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    layers: str = "all",
    overwrite: bool = False,
    sentence_index: bool = True,
    tokenize: bool = False,
    progress: bool = True,
    pooling: str | None = None,
) -> EmbedSummary:
    """``embedder.embed_file`` shared by the WORLD_SIZE processes of torchrun (in one process:
    ``embedder.embed_file`` itself). Every process calls it with the same arguments (its Embedder
    on its own device: ``devices.process_device``); each embeds its share of the lines (see the
    module's docstring), and process 0 merges the shares into OUTPUT, whose datasets equal a
    single process's (to float rounding; bit for bit where the token cache is off, see README).
    Process 0 shows the progress bar: the lines all processes finished, counted after each chunk.
    Returns the whole run's summary in every process. Stateful mode and an input that can be
    read only once (stdin, a pipe) are refused (ValueError)."""
    if world_size() == 1:
        return embedder.embed_file(
            input_path, output_path, layers, overwrite, sentence_index, tokenize, progress, pooling
        )
    total, output = check_embed_file(embedder.mode, input_path, output_path, overwrite, layers, pooling)
    remove_leftovers(output)  # of this host's killed runs
    job = _Job("embed")
    start = time.perf_counter()
    chunk, size, rank = embedder.chunk_size, job.size, job.rank
    split = _tokenizer(tokenize)

    def token_lists() -> Iterator[list[str]]:
        for i, text in enumerate(read_lines(input_path)):
            if (i // chunk) % size == rank:
                yield split(text)

    with scratch_path(output, f"part{rank}-") as part, _progress(progress and rank == 0, total) as bar:

        def show(lines: int, tokens: int) -> None:
            bar.update(lines - bar.n)
            bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.0f}")

        lengths = typed_array("q")
        tokens = 0
        with open(part, "wb") as out:
            for array in embedder.embed_sentences(token_lists()):
                vectors = np.ascontiguousarray(_output_array(array, layers, pooling), dtype=np.float32)
                out.write(vectors.reshape(-1).view(np.uint8))
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
            result = job.wait_for_merge()
        else:
            parts = job.parts(output.parent, lambda: show(job.add("lines", 0), job.add("tokens", 0)))
            bar.close()
            embedded = time.perf_counter()
            lines, n_tokens, empty = _merge_lines(
                embedder, input_path, output, overwrite, parts, layers, pooling, sentence_index, progress
            )
            end = time.perf_counter()
            summary = EmbedSummary(lines, n_tokens, empty, end - start, str(output), size, end - embedded)
            result = json.dumps(dataclasses.asdict(summary))
            job.merged(result)
    return EmbedSummary(**json.loads(result))


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
    embedder: Embedder,
    input_path: str | os.PathLike,
    output: Path,
    overwrite: bool,
    paths: list[Path],
    layers: str,
    pooling: str | None,
    sentence_index: bool,
    progress: bool,
) -> tuple[int, int, int]:
    """Process 0: write OUTPUT from the parts, line by line in the input's order, as
    ``Embedder.embed_file`` writes it. Returns (lines, tokens, empty lines)."""
    chunk, size = embedder.chunk_size, len(paths)
    row_shape = embedder._row_shape(layers, pooling)
    num_layers, dim = embedder.bilm.num_layers, embedder.dim

    def shape(n: int) -> tuple[int, ...]:
        if row_shape is not None:
            return row_shape
        return (num_layers, n, dim) if layers == "all" else (n, dim)

    parts = [_Part(path) for path in paths]
    counts = [0, 0, 0]
    total = sum(len(part.lengths) for part in parts)

    def rows(bar) -> Iterator[tuple[str, np.ndarray]]:
        for i, text in enumerate(read_lines(input_path)):
            part = parts[(i // chunk) % size]
            if part.next == len(part.lengths):
                raise ValueError(f"{input_path} changed while it was embedded: it has more lines than before")
            array, n = part.read(shape)
            yield text, array
            counts[0] += 1
            counts[1] += n
            counts[2] += n == 0
            bar.update(1)
        if counts[0] != total:
            raise ValueError(f"{input_path} changed while it was embedded: it has fewer lines than before")

    try:
        with _progress(progress, total, "merge") as bar:
            _write_vectors(output, overwrite, rows(bar), row_shape, sentence_index)
    finally:
        for part in parts:
            part.close()
    return counts[0], counts[1], counts[2]


def embed_tokens_file(
    embedder: Embedder, vocab_path: str | os.PathLike, output_path: str | os.PathLike, overwrite: bool = False
) -> int:
    """``embedder.embed_tokens_file`` shared by the processes of torchrun: block b of
    ``embed.TOKEN_BLOCK`` tokens is computed by process b mod WORLD_SIZE, exactly as one process
    computes it, and process 0 writes the blocks in order. Returns the number of tokens."""
    if world_size() == 1:
        return embedder.embed_tokens_file(vocab_path, output_path, overwrite)
    output = check_output(output_path, overwrite, [vocab_path])
    tokens = _vocabulary_tokens(vocab_path)
    remove_leftovers(output)
    job = _Job("tokens")
    blocks = range(0, len(tokens), TOKEN_BLOCK)
    with scratch_path(output, f"part{job.rank}-") as part:
        with open(part, "wb") as out:
            for first in blocks[job.rank :: job.size]:
                block = embedder.encode_token_block(tokens[first : first + TOKEN_BLOCK])
                out.write(block.reshape(-1).view(np.uint8))
        job.finish(part)
        if job.rank != 0:
            job.wait_for_merge()
            return len(tokens)
        files = [open(path, "rb") for path in job.parts(output.parent, lambda: None)]  # noqa: SIM115
        dim = embedder.bilm.token_encoder.output_dim
        try:

            def ordered() -> Iterator[np.ndarray]:
                for b, first in enumerate(blocks):
                    rows = min(TOKEN_BLOCK, len(tokens) - first)
                    data = files[b % job.size].read(4 * rows * dim)
                    yield np.frombuffer(data, dtype=np.float32).reshape(rows, dim)

            _write_token_vectors(output, overwrite, ordered(), (len(tokens), dim))
        finally:
            for file in files:
                file.close()
        job.merged("")
    return len(tokens)


def run_command(args: argparse.Namespace) -> int:
    """``elmokit embed|tokens --nproc N``: run the command in N new processes on this machine,
    started through torch's elastic launcher as ``torchrun --standalone --nproc-per-node N``
    would (``_processes.run_processes``; each on ``cuda:LOCAL_RANK`` when it uses CUDA). Returns the
    exit status; a process that fails stops the others and raises ChildProcessError naming it
    (its own error is the line above)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from ._processes import run_processes

    if world_size() > 1:
        raise ValueError("under torchrun, leave out --nproc: torchrun starts the processes")
    if args.command == "embed":  # what every process would refuse, refused once
        check_embed_file(args.mode, args.input, args.output, args.overwrite, args.layers, args.pooling)
    else:
        check_output(args.output, args.overwrite, [args.vocab])
        _vocabulary_tokens(args.vocab)
    each = argparse.Namespace(**{**vars(args), "nproc": 1})
    try:
        return run_processes(_command_process, (each,), args.nproc)[0]
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        code = failure.exitcode
        why = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        message = f"{args.command} process {rank} failed ({why}); {args.output} was not written"
        raise ChildProcessError(message) from None


def _command_process(args: argparse.Namespace) -> int:
    """One process of ``run_command``: the command as the command line runs it; a failure
    ends the process with its exit status, so that the launcher stops the others."""
    from .cli import run

    code = run(args)
    if code != 0:
        sys.exit(code)
    return code
