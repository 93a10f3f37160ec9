"""Turn sentences and files into ELMo vectors: deterministic by default, streaming, bounded memory.

Modes: "warm" (default) starts every sentence from the model's canonical start state (zeros when
the model has none), "zero" from zero states, "stateful" carries each batch row's states into the
next batch as bilm-tf and AllenNLP do (file order is kept, since order defines the states).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..base import kernels
from ..base.atomic import check_output
from ..base.devices import this_process
from ..base.textfiles import count_lines, line_splitter, read_lines
from ..model.bilm import BiLM, CarriedState
from ..model.characters import EXPECTED_SENTENCES, check_token_lists
from ..model.lstm import LstmState
from . import _multiprocess_embed as engine
from . import shards
from .parquet_file import ParquetLayout, output_format, require_pyarrow, write_parquet
from .runners import Recipe, Runner, make_runner
from .vectors_file import (
    TOKEN_BLOCK,
    check_layers,
    check_pooling,
    output_array,
    pool,
    read_vocabulary,
    row_shape,
    write_token_vectors,
    write_vectors,
)

__all__ = ["Embedder"]

MODES = ("warm", "zero", "stateful")


def _device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


@dataclass
class EmbedSummary:
    """What an embed_file run did."""

    sentences: int
    tokens: int
    empty: int
    seconds: float
    output: str
    processes: int = 1  # the processes that shared the work (``processes=N`` or torchrun)
    merge_seconds: float = 0.0  # of them, the seconds process 0 took to merge their parts
    parts: int = 0  # a sharded run (``shard_sentences``): the output's parts
    skipped_parts: int = 0  # of them, those done by an earlier run and verified, not embedded again

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)


class Embedder:
    """ELMo vectors for tokenized sentences: arrays (3, n_tokens, 2 * projection_dim).

    model: a BiLM, or a model in any form ``elmokit.resolve_model`` takes (a shipped or known
    model's name, a model folder, a .zip archive, a URL), or None for the default shipped model.
    ``batch_size`` sentences per batch, optionally also capped at
    ``max_tokens_per_batch`` tokens (padding included). ``dtype`` "bfloat16" (or "bf16", or
    ``torch.bfloat16``) runs the model in bfloat16: 1.8-2.1x as fast at batch 64 on CPUs with
    AVX-512 bf16 (slower at batch 1), vectors at a cosine of 0.9999 to float32 (docs/benchmarks/inference.md);
    float32 is the default; "int8" (opt-in, approximate, CPU only: docs/export.md) runs the
    model's big matmuls with int8 weights (``elmokit.model.int8``), or with ``backend`` "onnxruntime"
    the exported graph with int8 matmuls. A BiLM passed in is never changed:
    when it is on another device or dtype the Embedder runs a copy, and it runs in eval mode only
    for the duration of a batch. Each batch runs the model's own forward, so its token encodings
    come through the model's one token cache (``bilm.token_encoder.cache_size``, the kernel
    ``token_cache``) and its vectors equal ``bilm(bilm.batch_to_ids(batch))``'s bit for bit.
    ``mode`` None (default) is "warm", which starts from zeros for a model without a start state;
    asking for "warm" explicitly of such a model gives a UserWarning. ``device`` None is cuda
    when there is a GPU, else the model's device; a device this machine lacks is a ValueError.
    ``backend`` "onnxruntime" (the ``onnx`` extra) runs each batch through an ONNX export of the
    model (``onnx_file``, made by ``elmokit export-onnx`` from the same weights, or the model
    exported in memory when None) on the CPU in float32, with the same modes, batching and outputs
    (docs/export.md: within 1e-5 of the torch backend).

    The model, ``device``, ``dtype``, ``backend`` and ``onnx_file`` make the Embedder's runner
    (``elmokit.embed.runners.make_runner``), which runs each batch; ``runner`` (keyword only)
    gives one made beforehand instead of them.

    ``embed_file`` and ``embed_tokens_file`` also run in several processes: ``processes=N``
    starts N workers on this machine (each on its own GPU, cuda:0 to cuda:N-1, when the Embedder
    runs on CUDA), and under torchrun each of torchrun's processes embeds its share.
    """

    def __init__(
        self,
        model: BiLM | str | os.PathLike | None = None,
        batch_size: int = 64,
        device: str | torch.device | None = None,
        mode: str | None = None,
        max_tokens_per_batch: int | None = None,
        dtype: str | torch.dtype = torch.float32,
        backend: str = "torch",
        onnx_file: str | os.PathLike | None = None,
        *,
        runner: Runner | None = None,
    ) -> None:
        asked_warm = mode == "warm"
        mode = "warm" if mode is None else mode
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if runner is None:  # the model, device, dtype and backend: the runner's (elmokit.embed.runners)
            runner = make_runner(model, device, dtype, backend, onnx_file)
        elif (
            model is not None
            or device is not None
            or onnx_file is not None
            or backend != "torch"
            or (dtype is not torch.float32)
        ):
            raise ValueError(
                "a runner holds the model, device, dtype and backend: give them to make_runner, "
                "not to the Embedder"
            )
        self.runner = runner
        self.bilm = runner.bilm
        # the files of the model (and its ONNX file): inputs that no output of embed_file replaces
        self.source_files: tuple[Path, ...] = runner.source_files
        # what a Parquet file's metadata calls the model: the name or path it was given as
        self.model_name = runner.model_name
        self.mode, self.batch_size = mode, batch_size
        self.max_tokens_per_batch = max_tokens_per_batch
        self.carried = CarriedState() if mode == "stateful" else None
        self._pinned: torch.Tensor | None = None  # page-locked staging buffer (_to_host)
        if asked_warm and self.bilm.start_state is None:
            warnings.warn(
                "the model has no start state, so warm mode starts every sentence from zero states "
                "(the same as mode 'zero'); estimate one with: elmokit start-state MODEL --text "
                "FILES --out DIR",
                UserWarning,
                stacklevel=2,
            )

    @property
    def dim(self) -> int:
        return self.bilm.output_dim

    # -- batches -------------------------------------------------------------------------------
    @torch.inference_mode()
    def embed_batch(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """One float32 array (num_layers, n_tokens, dim) per sentence, in the given order; an empty
        sentence gives an empty (num_layers, 0, dim) array, as AllenNLP's ``embed_batch`` does (it
        takes no batch row: in stateful mode the carried states belong to the other sentences)."""
        _check_sentences(sentences)
        full = [i for i, sentence in enumerate(sentences) if len(sentence) > 0]
        if len(full) == len(sentences):
            return self._embed_full(sentences)
        arrays = [self._empty() for _ in sentences]
        if full:
            for i, array in zip(full, self._embed_full([sentences[i] for i in full])):
                arrays[i] = array
        return arrays

    def _empty(self) -> np.ndarray:
        """The array of a sentence without tokens: float32 (num_layers, 0, dim)."""
        return np.zeros((self.bilm.num_layers, 0, self.dim), dtype=np.float32)

    def _embed_full(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """``embed_batch`` of sentences that all have tokens."""
        ids = self.bilm.batch_to_ids(sentences)
        # warm: the runner's start state (onnxruntime's is held in its file)
        state = None if self.mode == "warm" else self._initial_state(len(sentences), self.runner.like)
        out = self.runner(ids, state)
        if self.carried is not None:
            self.carried.update(out.state)
        self._check_finite(out.layers)
        return self._to_host(out.layers, [len(s) for s in sentences])

    def _check_finite(self, layers: torch.Tensor | np.ndarray) -> None:
        """Refuse a batch whose vectors are not all finite (one cheap check per batch): finite
        but huge weights (a row near 3e38) overflow float32, and inf or NaN would be written
        as vectors. The ValueError names the model file and the first layer that is not finite."""
        values = torch.as_tensor(layers)
        if bool(torch.isfinite(values).all()):
            return
        first = next(i for i in range(values.shape[0]) if not bool(torch.isfinite(values[i]).all()))
        what = "the token vectors of the character CNN" if first == 0 else f"biLSTM layer {first}"
        files = self.source_files
        model = "the model"
        if len(files) > 1 and files[1].suffix == ".hdf5":
            model = f"the model {files[1]}"
        elif files:
            model = f"the model {files[0].parent}"
        raise ValueError(
            f"{model} gives vectors that are not finite (inf or NaN) from layer {first} ({what}) on; "
            "its weights are finite but too large for float32 arithmetic"
        )

    def _to_host(self, layers: torch.Tensor, lengths: list[int]) -> list[np.ndarray]:
        """(num_layers, batch, steps, dim) -> per sentence a float32 array (num_layers, length, dim).

        Plain form: ``.cpu().numpy()`` and a view per sentence. Kernel ``pinned_copy``, from a
        GPU: through a page-locked buffer kept for the next batch (it grows to the largest batch),
        then each sentence copied out of it: on an H100 the copy to pageable memory took half
        of a batch's device time (docs/benchmarks/gpu.md)."""
        layers = layers.float()
        if layers.device.type != "cuda" or not kernels.enabled("pinned_copy"):
            host = layers.cpu().numpy()
            return [host[:, row, :n] for row, n in enumerate(lengths)]
        size = layers.numel()
        if self._pinned is None or self._pinned.numel() < size:
            self._pinned = torch.empty(size, dtype=torch.float32, pin_memory=True)
        staged = self._pinned[:size].view(layers.shape)
        staged.copy_(layers, non_blocking=True)
        torch.cuda.current_stream(layers.device).synchronize()
        host = staged.numpy()
        return [host[:, row, :n].copy() for row, n in enumerate(lengths)]

    def _initial_state(self, batch: int, like: torch.Tensor) -> LstmState:
        """Where each sentence of a batch starts: the start state (warm), zeros, or the states
        carried from the previous batch (stateful)."""
        if self.carried is not None:
            return self.carried.initial(self.bilm, batch, like)
        if self.mode == "zero":
            return self.bilm.zero_state(batch, like)
        return self.bilm.initial_state(batch, like)

    def reset_states(self) -> None:
        """Stateful mode: forget the carried states (the next batch starts from zeros)."""
        if self.carried is not None:
            self.carried.reset()

    def embed_sentence(self, tokens: Sequence[str], pooling: str | None = None) -> np.ndarray:
        """(num_layers, n_tokens, dim) for one tokenized sentence; (num_layers, dim) with
        ``pooling`` (see ``embed_sentences``)."""
        if isinstance(tokens, str) or not isinstance(tokens, Sequence):
            raise TypeError(
                "embed_sentence takes one tokenized sentence, a list of str tokens such as "
                f"['Hello', 'world']; got {type(tokens).__name__}"
                + ("; split it first, e.g. text.split()" if isinstance(tokens, str) else "")
            )
        return next(self.embed_sentences([tokens], pooling=pooling))

    @property
    def chunk_size(self) -> int:
        """The sentences ``embed_sentences`` takes at a time: it batches within such a chunk."""
        return self.batch_size if self.mode == "stateful" else 8 * self.batch_size

    def embed_sentences(
        self, sentences: Iterable[Sequence[str]], pooling: str | None = None
    ) -> Iterator[np.ndarray]:
        """Stream arrays (num_layers, n_tokens, dim) in input order, any number of sentences.

        Warm and zero mode batch sentences of similar length together (within chunks of
        ``chunk_size`` = ``8 * batch_size`` sentences, so memory stays bounded); stateful mode
        keeps the order. ``pooling`` "mean" or "max": one vector per layer and sentence instead,
        (num_layers, dim), the mean or the elementwise max over the sentence's own tokens (padding
        never counts); a sentence without tokens gives NaN (there is nothing to pool).
        """
        if pooling is not None:
            check_pooling(pooling)
        chunk_size = self.chunk_size
        chunk: list[Sequence[str]] = []
        if isinstance(sentences, str) or not isinstance(sentences, Iterable):
            raise TypeError(f"{EXPECTED_SENTENCES}; got {type(sentences).__name__}")
        for number, sentence in enumerate(sentences):
            if isinstance(sentence, str):
                raise TypeError(
                    f"sentence {number} is a str, not a list of tokens; split it first, e.g. text.split()"
                )
            if not isinstance(sentence, Sequence):
                raise TypeError(
                    f"sentence {number} is {type(sentence).__name__}, not a list of tokens; "
                    + EXPECTED_SENTENCES
                )
            chunk.append(sentence)
            if len(chunk) == chunk_size:
                yield from self._pooled(self._embed_chunk(chunk), pooling)
                chunk = []
        if chunk:
            yield from self._pooled(self._embed_chunk(chunk), pooling)

    @staticmethod
    def _pooled(arrays: Iterator[np.ndarray], pooling: str | None) -> Iterator[np.ndarray]:
        return arrays if pooling is None else (pool(array, pooling) for array in arrays)

    def _embed_chunk(self, chunk: list[Sequence[str]]) -> Iterator[np.ndarray]:
        empty = self._empty()
        order = [i for i, s in enumerate(chunk) if len(s) > 0]
        if self.mode != "stateful":
            order.sort(key=lambda i: len(chunk[i]))
        results: dict[int, np.ndarray] = {}
        for batch in self._batches(order, chunk):
            for i, array in zip(batch, self.embed_batch([chunk[i] for i in batch])):
                results[i] = array
        for i in range(len(chunk)):
            yield results.pop(i, empty)

    def _batches(self, order: list[int], chunk: list[Sequence[str]]) -> Iterator[list[int]]:
        batch: list[int] = []
        longest = 0
        for i in order:
            n = len(chunk[i]) + 2
            too_many = (
                self.max_tokens_per_batch is not None
                and batch
                and (max(longest, n) * (len(batch) + 1) > self.max_tokens_per_batch)
            )
            if len(batch) == self.batch_size or too_many:
                yield batch
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, n)
        if batch:
            yield batch

    # -- files ---------------------------------------------------------------------------------
    def embed_file(
        self,
        input_path: str | os.PathLike,
        output_path: str | os.PathLike,
        layers: str = "all",
        overwrite: bool = False,
        sentence_index: bool = True,
        tokenize: bool = False,
        progress: bool = True,
        pooling: str | None = None,
        processes: int = 1,
        shard_sentences: int | None = None,
        format: str | None = None,
    ) -> EmbedSummary:
        """Embed a file of sentences (one per line, ``-`` = stdin) into HDF5 laid out like
        ``allennlp elmo`` (``elmokit.embed.vectors_file``): dataset "i" for line i, (3, n_tokens, dim)
        for ``all`` or (n_tokens, dim) for ``top``/``average``, and "sentence_to_index" (JSON)
        unless disabled; an empty line gets an empty dataset.

        ``pooling`` "mean" or "max": one vector per line instead, the mean or elementwise max
        over its tokens of what ``layers`` gives, stored as row i of one dataset "embedding",
        (n_lines, 3, dim) for ``all`` or (n_lines, dim) for ``top``/``average`` (an empty line's
        row is NaN); "sentence_to_index" maps each sentence to its row.

        ``processes`` N > 1 shares the lines between N new processes on this machine; under
        torchrun every process calls this with the same arguments and embeds its share (leave
        ``processes`` at 1 there). Either way the file equals one process's (bit for bit with the
        kernel ``token_cache`` off; to float rounding with it on, as a token's vector comes from
        the batch where its process first met it); stateful mode and an input that can be read
        only once (stdin, a pipe) are refused (ValueError). The summary is the whole run's.

        The output is written to a temporary file beside it and renamed when complete; on an
        error or an interruption nothing is left. Memory does not grow with the file beyond
        bounded caches (token encodings, HDF5's metadata) and 8 bytes a line (the sentence
        index's hashes): the index's JSON is built in a temporary file and copied
        into the output in blocks, as one fixed-length UTF-8 string (read it with
        ``json.loads(f["sentence_to_index"][0])``, as allennlp's files).

        ``shard_sentences`` N: a resumable run; ``output_path`` is a folder of part files of N
        lines each plus ``manifest.json`` (``elmokit.embed.shards``): the same call after a
        crash skips the parts that are complete and verified, and ends with the folder an
        uninterrupted run writes; a changed model, option or input is refused (ValueError).
        ``overwrite`` deletes the parts and the manifest of the earlier run and starts over.
        With ``processes`` or torchrun the processes split the parts. Read the folder with
        ``elmokit.embed.shards.read_shards``. The summary counts what this run embedded.

        ``format`` "parquet" (or None with an output named .parquet) writes Parquet instead
        (``elmokit.embed.parquet_file``, the ``parquet`` extra): one row per line with its
        ``index``, its ``tokens`` and a column of vectors per chosen layer, the same vectors as
        the HDF5 file's; ``sentence_index`` does not apply to it.
        """
        check_layers(layers, pooling)
        format = output_format(output_path, format)
        if format == "parquet":
            require_pyarrow()
        request = engine.EmbedRequest(
            input_path=input_path,
            output_path=output_path,
            layers=layers,
            overwrite=overwrite,
            sentence_index=sentence_index,
            tokenize=tokenize,
            progress=progress,
            pooling=pooling,
            format=format,
        )
        if shard_sentences is not None:
            return self._embed_shards(request, shard_sentences, processes)
        if self._shared(processes):
            if processes > 1:  # what every process would refuse, refused once
                engine.check_splittable(self.mode, input_path)
                check_output(output_path, overwrite, [input_path, *self.source_files])
            return EmbedSummary(**self._run_shared("embed", processes, {"request": request}, output_path))
        return self._embed_here(request)

    def _embed_here(self, request: engine.EmbedRequest) -> EmbedSummary:
        """``embed_file`` in this process alone: the lines streamed through ``embed_sentences``
        into the output's writer, one progress bar of sentences."""
        layers, pooling = request.layers, request.pooling
        output = check_output(
            request.output_path, request.overwrite, [request.input_path, *self.source_files]
        )
        total = count_lines(request.input_path)
        lines = read_lines(request.input_path)
        split = line_splitter(request.tokenize)
        start = time.perf_counter()
        stats = {"sentences": 0, "tokens": 0, "empty": 0}
        texts: deque[Any] = deque()  # lines (Parquet: their tokens) read but not yet written, in order
        parquet = request.format == "parquet"

        def token_lists() -> Iterator[list[str]]:
            for text in lines:
                tokens = split(text)
                texts.append(tokens if parquet else text)
                yield tokens

        def rows(bar: Any) -> Iterator[tuple[Any, np.ndarray]]:
            for array in self.embed_sentences(token_lists()):
                yield texts.popleft(), output_array(array, layers, pooling)
                n = array.shape[1]
                stats["sentences"] += 1
                stats["tokens"] += n
                stats["empty"] += n == 0
                bar.update(1)
                bar.set_postfix(tok_s=f"{stats['tokens'] / (time.perf_counter() - start):.0f}")

        with engine.progress_bar(request.progress, total) as bar:
            if parquet:
                write_parquet(output, request.overwrite, rows(bar), self.parquet_layout(layers, pooling))
            else:
                shape = row_shape(self.bilm.num_layers, self.dim, layers, pooling)
                write_vectors(output, request.overwrite, rows(bar), shape, request.sentence_index)
        return EmbedSummary(**stats, seconds=time.perf_counter() - start, output=str(output))

    def _embed_shards(
        self, request: engine.EmbedRequest, shard_sentences: int, processes: int
    ) -> EmbedSummary:
        """``embed_file`` with ``shard_sentences``: prepared here (or by torchrun's process 0),
        then the parts embedded by this process or shared by ``processes`` workers."""
        recipe = self.runner.recipe
        identity = {"mode": self.mode, "dtype": recipe.dtype, "backend": recipe.backend}
        # the request's "format": the parts'
        arguments: dict[str, Any] = {
            "request": request,
            "shard_sentences": shard_sentences,
            "identity": identity,
        }
        shared = self._shared(processes)
        if shared and processes == 1:  # torchrun: process 0 prepares and tells the others
            return EmbedSummary(**engine.share(shards.work, self, arguments))
        arguments["plan"] = shards.prepare(self, request, shard_sentences, identity)
        if not shared:
            return EmbedSummary(**json.loads(shards.work(self, None, **arguments)))
        what = ("embed", os.fspath(request.output_path))
        return EmbedSummary(**engine.run(shards.work, processes, self._recipe(), arguments, what))

    def parquet_layout(self, layers: str = "all", pooling: str | None = None) -> ParquetLayout:
        """The columns and metadata of this Embedder's Parquet files (``elmokit.embed.parquet_file``)."""
        return ParquetLayout(self.bilm.num_layers, self.dim, layers, pooling, self.model_name, self.mode)

    def embed_tokens_file(
        self,
        vocab_path: str | os.PathLike,
        output_path: str | os.PathLike,
        overwrite: bool = False,
        processes: int = 1,
    ) -> int:
        """Context-independent vectors of every line of a vocabulary file: HDF5 dataset
        "embedding" (n_lines, projection_dim), as bilm-tf's dump_token_embeddings. Returns the
        number of tokens. ``processes``: as ``embed_file``'s (blocks of ``TOKEN_BLOCK`` tokens
        go to the processes in turn; the file equals one process's bit for bit)."""
        arguments = {"vocab_path": vocab_path, "output_path": output_path, "overwrite": overwrite}
        if self._shared(processes):
            if processes > 1:
                check_output(output_path, overwrite, [vocab_path, *self.source_files])
                read_vocabulary(vocab_path)
            return int(self._run_shared("tokens", processes, arguments, output_path)["tokens"])
        output = check_output(output_path, overwrite, [vocab_path, *self.source_files])
        tokens = read_vocabulary(vocab_path)
        blocks = (
            self.encode_token_block(tokens[i : i + TOKEN_BLOCK]) for i in range(0, len(tokens), TOKEN_BLOCK)
        )
        write_token_vectors(output, overwrite, blocks, (len(tokens), self.bilm.token_encoder.output_dim))
        return len(tokens)

    @staticmethod
    def _shared(processes: int) -> bool:
        """Whether a file job is shared between processes (``processes`` > 1 or torchrun)."""
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"processes must be a whole number of at least 1, got {processes!r}")
        if this_process().distributed:
            if processes > 1:
                raise ValueError(
                    "under torchrun, leave out --nproc (processes): torchrun starts the processes"
                )
            return True
        return processes > 1

    def _run_shared(
        self, kind: str, processes: int, arguments: dict[str, Any], output_path: str | os.PathLike
    ) -> dict[str, Any]:
        """A file job shared by ``processes`` new workers, or by torchrun's processes (1)."""
        if processes == 1:
            return engine.share(kind, self, arguments)
        return engine.run(kind, processes, self._recipe(), arguments, (kind, os.fspath(output_path)))

    def _recipe(self) -> _EmbedderRecipe:
        """What a worker process builds the same Embedder from (``embed_file`` with processes=N)."""
        return _EmbedderRecipe(
            self.runner.recipe, self.bilm, self.batch_size, self.mode, self.max_tokens_per_batch
        )

    @torch.inference_mode()
    def encode_token_block(self, tokens: list[str]) -> np.ndarray:
        """float32 (n_tokens, projection_dim): one block of ``embed_tokens_file``."""
        block = self.bilm.encode_tokens(tokens).float().cpu().numpy()
        self._check_finite(block[None])  # layer 0
        return block


@dataclass(frozen=True)
class _EmbedderRecipe:
    """An Embedder as a worker process rebuilds it (``embed_file`` with processes=N): the
    runner's recipe, the model it runs (``runner.bilm``: the int8 form already quantized) and
    the batching settings."""

    runner: Recipe
    bilm: BiLM
    batch_size: int
    mode: str
    max_tokens_per_batch: int | None

    @property
    def device(self) -> torch.device:
        """The device of the Embedder that started the workers (cuda: each worker takes its GPU)."""
        return _device(self.bilm)

    def build(self, device: torch.device) -> Embedder:
        """The Embedder on ``device``."""
        with warnings.catch_warnings():  # said once, by the Embedder that started the workers
            warnings.simplefilter("ignore", UserWarning)
            runner = self.runner.build(self.bilm, device)
            return Embedder(
                batch_size=self.batch_size,
                mode=self.mode,
                max_tokens_per_batch=self.max_tokens_per_batch,
                runner=runner,
            )


def _check_sentences(sentences: Sequence[Sequence[str]]) -> None:
    check_token_lists(sentences)
    if len(sentences) == 0:
        raise ValueError("empty sentence list: give at least one sentence")
    for i, sentence in enumerate(sentences):
        for token in sentence:
            if token == "":
                raise ValueError(f"sentence {i} has an empty token")
