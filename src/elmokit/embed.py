"""Turn sentences and files into ELMo vectors: deterministic by default, streaming, bounded memory.

Modes: "warm" (default) starts every sentence from the model's canonical start state (zeros when
the model has none), "zero" from zero states, "stateful" carries each batch row's states into the
next batch as bilm-tf and AllenNLP do (file order is kept, since order defines the states).
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from array import array as typed_array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import h5py
import numpy as np
import torch

from . import kernels
from .atomic import atomic_path, check_output, raise_if_signalled
from .bilm import BiLM, CarriedState
from .characters import check_token_lists
from .devices import resolve_device
from .lstm import LstmState
from .textfiles import count_lines, read_lines
from .token_cache import EncodingCache

MODES = ("warm", "zero", "stateful")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
LAYERS = ("all", "top", "average")
POOLINGS = ("mean", "max")
POOLED_DATASET = "embedding"  # embed_file with pooling: one row per line
TOKEN_BLOCK = 4096  # embed_tokens_file encodes this many tokens at a time


class TokenCache:
    """Context-independent token vectors of the last ``size`` distinct tokens (LRU), computed once
    per distinct token; ``size = 0`` (or the kernel ``token_cache`` off) computes every call's.

    A token's vector depends on nothing but the token and the token encoder's weights, and each
    lookup first compares the weights with those that computed the kept vectors
    (``token_cache.EncodingCache``), so the cache never changes a result.
    """

    def __init__(self, bilm: BiLM, size: int = 100_000) -> None:
        self.bilm, self.size = bilm, size
        self._cache: EncodingCache[str] = EncodingCache(size)

    @property
    def hits(self) -> int:
        """Distinct tokens found from earlier batches (since the cache was last emptied)."""
        return self._cache.hits

    @property
    def misses(self) -> int:
        """Distinct tokens computed through the cache (since it was last emptied)."""
        return self._cache.misses

    @torch.inference_mode()
    def lookup(self, tokens: Sequence[str]) -> list[torch.Tensor]:
        """One (projection_dim,) vector per token."""
        distinct = list(dict.fromkeys(tokens))
        encoder = self.bilm.token_encoder

        def encode(positions: list[int]) -> torch.Tensor:
            # the encodings are this cache; the ids of the tokens it misses are computed afresh
            ids = self.bilm.token_ids([distinct[i] for i in positions], cache=False)
            return encoder.encode_unique(ids.to(_device(self.bilm)))

        if self.size > 0 and kernels.enabled("token_cache"):
            if self._cache.capacity != self.size:
                self._cache = EncodingCache(self.size)
            vectors = self._cache.lookup(distinct, encoder.parameters(), encode)
        else:
            vectors = encode(list(range(len(distinct))))
        rows = dict(zip(distinct, vectors.unbind(0)))
        return [rows[t] for t in tokens]


class SentenceIndex:
    """The "sentence_to_index" JSON of ``allennlp elmo``, ``json.dumps({sentence: str(line)})``,
    built with little memory: the sentences go to a temporary file as they come, and only their
    hashes (8 bytes a sentence) stay in memory; the JSON itself is written to a second temporary
    file. A repeated sentence keeps its first position and takes its last line number, as a dict
    does; lines of equal hashes are compared by their text, so the result is exactly the dict's
    JSON (ASCII, since ``json.dumps`` escapes every non-ASCII character).

    ``add`` the sentences in line order, then ``json_file()`` gives the JSON's file and size.
    The temporary files have no name (removed by the system even if the process is killed)."""

    def __init__(self, folder: str | os.PathLike | None = None) -> None:
        self._folder = folder
        self._keys = tempfile.TemporaryFile(dir=folder)  # one JSON string per line
        self._json: BinaryIO | None = None
        self._hashes = typed_array("q")

    def __enter__(self) -> SentenceIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._keys.close()
        if self._json is not None:
            self._json.close()

    def __len__(self) -> int:
        return len(self._hashes)

    def add(self, sentence: str) -> None:
        self._hashes.append(hash(sentence))
        self._keys.write(json.dumps(sentence).encode("ascii") + b"\n")

    def _repeats(self) -> tuple[set[int], dict[int, int]]:
        """The lines whose sentence came before (left out of the JSON), and for each first
        line of a repeated sentence the last line it was on."""
        hashes = np.frombuffer(self._hashes, dtype=np.int64)
        ordered = np.sort(hashes)
        shared = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])  # hashes of 2 or more lines
        del ordered
        candidates = set(np.flatnonzero(np.isin(hashes, shared)).tolist())
        lines: dict[bytes, list[int]] = {}
        if candidates:
            self._keys.seek(0)
            for i, key in enumerate(self._keys):
                if i in candidates:
                    lines.setdefault(key, []).append(i)
        later = {i for same in lines.values() for i in same[1:]}
        last = {same[0]: same[-1] for same in lines.values() if len(same) > 1}
        return later, last

    def json_file(self) -> tuple[BinaryIO, int]:
        """A temporary file holding the JSON (read from its start), and its size in bytes."""
        self._keys.flush()
        later, last = self._repeats()
        if self._json is not None:
            self._json.close()
        out = self._json = tempfile.TemporaryFile(dir=self._folder)
        out.write(b"{")
        separator = b""
        self._keys.seek(0)
        for i, key in enumerate(self._keys):
            if i not in later:
                out.write(b'%s%s: "%d"' % (separator, key[:-1], last.get(i, i)))
                separator = b", "
        out.write(b"}")
        size = out.tell()
        out.seek(0)
        return out, size

    def to_json(self) -> bytes:
        """The JSON's bytes, all in memory (for small indexes; files use ``json_file``)."""
        return self.json_file()[0].read()


def _reserve_string(out: h5py.File, name: str, size: int) -> int:
    """Create dataset ``name`` of shape (1,) holding one fixed-length UTF-8 string of ``size``
    bytes, its storage allocated now in the file (contiguous, never filled); returns the
    storage's byte offset in the file, where the string's bytes are to be written."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    dataset = out.create_dataset(name, shape=(1,), dtype=h5py.string_dtype("utf-8", size), dcpl=dcpl)
    offset = dataset.id.get_offset()
    if offset is None:
        raise RuntimeError(f"HDF5 did not allocate the storage of dataset {name!r}")
    return offset


def _limit_hdf5_free_lists() -> None:
    """Make HDF5 hand the blocks it frees back to malloc (``H5set_free_list_limits`` of 0)
    instead of keeping them on its own free lists. Kept blocks of the many sizes an embedding
    run writes pinned the heap between torch's per-batch buffers: the peak RSS of ``embed``
    grew by about 250 bytes per line. h5py does not wrap the call, so it is made through
    ctypes on the HDF5 library h5py loaded, found in the process's memory map (Linux; elsewhere,
    or if the library is not found, nothing changes). Process-wide and harmless to repeat."""
    import ctypes

    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "/libhdf5" in line and "libhdf5_hl" not in line}
    except OSError:
        return
    for path in paths:
        try:
            function = ctypes.CDLL(path).H5set_free_list_limits
        except (OSError, AttributeError):
            continue
        function.argtypes, function.restype = [ctypes.c_int] * 6, ctypes.c_int
        function(0, 0, 0, 0, 0, 0)


def _copy_into(path: str | os.PathLike, offset: int, source: BinaryIO) -> None:
    """Write the rest of ``source`` into the file at ``path`` from byte ``offset`` on, in blocks."""
    with open(path, "r+b") as target:
        target.seek(offset)
        shutil.copyfileobj(source, target, 1 << 20)


def _device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


@contextmanager
def _evaluating(module: torch.nn.Module) -> Iterator[None]:
    """Run ``module`` in eval mode (no dropout) and give it back in the mode it had."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


@dataclass
class EmbedSummary:
    """What an embed_file run did."""

    sentences: int
    tokens: int
    empty: int
    seconds: float
    output: str
    processes: int = 1  # torchrun's processes that shared the work (elmokit.distributed)
    merge_seconds: float = 0.0  # of them, the seconds process 0 took to merge their parts

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
    AVX-512 bf16 (slower at batch 1), vectors at a cosine of 0.9999 to float32 (README, "Speed");
    float32 is the default; "int8" (with ``backend`` "onnxruntime") runs the exported graph
    with int8 matmuls (opt-in, approximate: docs/export.md). A BiLM passed in is never changed:
    when it is on another device or dtype the Embedder runs a copy, and it runs in eval mode only
    for the duration of a batch.
    ``mode`` None (default) is "warm", which starts from zeros for a model without a start state;
    asking for "warm" explicitly of such a model gives a UserWarning. ``device`` None is cuda
    when there is a GPU, else the model's device; a device this machine lacks is a ValueError.
    ``backend`` "onnxruntime" (the ``onnx`` extra) runs each batch through an ONNX export of the
    model (``onnx_file``, made by ``elmokit export-onnx`` from the same weights, or the model
    exported in memory when None) on the CPU in float32, with the same modes, batching and outputs
    (docs/export.md: within 1e-5 of the torch backend).
    """

    def __init__(
        self,
        model: BiLM | str | os.PathLike | None = None,
        batch_size: int = 64,
        device: str | torch.device | None = None,
        mode: str | None = None,
        max_tokens_per_batch: int | None = None,
        token_cache_size: int = 100_000,
        dtype: str | torch.dtype = torch.float32,
        backend: str = "torch",
        onnx_file: str | os.PathLike | None = None,
    ) -> None:
        asked_warm = mode == "warm"
        int8 = dtype == "int8"  # onnxruntime's int8 graph (backend onnxruntime); the model stays float32
        dtype = torch.float32 if int8 else dtype
        mode = "warm" if mode is None else mode
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if isinstance(dtype, str):
            if dtype not in DTYPES:
                raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
            dtype = DTYPES[dtype]
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if isinstance(model, BiLM):
            bilm = model
        else:
            bilm = BiLM.from_pretrained(model)  # any form: name, folder, .zip, URL, hf://; None: the default
        if device is None:
            device = "cuda" if torch.cuda.is_available() and backend == "torch" else _device(bilm)
        device = resolve_device(device)
        weight = next(bilm.parameters())
        if weight.device != device or weight.dtype != dtype:
            # a model handed in is never changed: run a copy on the requested device and dtype
            bilm = (copy.deepcopy(bilm) if bilm is model else bilm).to(device=device, dtype=dtype)
        if bilm is not model:
            bilm.eval()
        self.bilm = bilm
        self.mode, self.batch_size = mode, batch_size
        self.max_tokens_per_batch = max_tokens_per_batch
        self.carried = CarriedState() if mode == "stateful" else None
        self.cache = TokenCache(self.bilm, token_cache_size)
        self._pinned: torch.Tensor | None = None  # page-locked staging buffer (_to_host)
        # backend "onnxruntime": batches run through an exported file (elmokit.onnx_export)
        self.onnx = None
        if backend != "torch" or int8 or onnx_file is not None:
            self.onnx = _onnx_backend(backend, bilm, onnx_file, dtype, int8)
        if asked_warm and bilm.start_state is None:
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
        """One float32 array (num_layers, n_tokens, dim) per sentence, in the given order."""
        _check_sentences(sentences)
        if self.onnx is not None:  # the start state (warm) is the one held in the file
            ids = self.bilm.batch_to_ids(sentences)
            zeros = torch.zeros(0)
            out = self.onnx(ids, None if self.mode == "warm" else self._initial_state(len(sentences), zeros))
            if self.carried is not None:
                self.carried.update(out.state)
            return self._to_host(out.layers, [len(s) for s in sentences])
        lengths = torch.tensor([len(s) + 2 for s in sentences])
        steps = int(lengths.max())
        bos, eos = self.bilm.boundary_tokens
        sequences = [[bos, *s, eos] for s in sentences]
        flat = [t for seq in sequences for t in seq]
        vectors = self.cache.lookup(flat)
        proj = self.bilm.options.lstm.projection_dim
        tokens = vectors[0].new_zeros(len(sentences), steps, proj)
        offset = 0
        for row, seq in enumerate(sequences):
            tokens[row, : len(seq)] = torch.stack(vectors[offset : offset + len(seq)])
            offset += len(seq)
        with _evaluating(self.bilm):
            out = self.bilm.contextualize(tokens, lengths, self._initial_state(len(sentences), tokens))
        if self.carried is not None:
            self.carried.update(out.state)
        return self._to_host(out.layers, [len(s) for s in sentences])

    def _to_host(self, layers: torch.Tensor, lengths: list[int]) -> list[np.ndarray]:
        """(num_layers, batch, steps, dim) -> per sentence a float32 array (num_layers, length, dim).

        Plain form: ``.cpu().numpy()`` and a view per sentence. Kernel ``pinned_copy``, from a
        GPU: through a page-locked buffer kept for the next batch (it grows to the largest batch),
        then each sentence copied out of it: on an H100 the copy to pageable memory took half
        of a batch's device time (README "On a GPU")."""
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
            _check_pooling(pooling)
        chunk_size = self.chunk_size
        chunk: list[Sequence[str]] = []
        for sentence in sentences:
            chunk.append(sentence)
            if len(chunk) == chunk_size:
                yield from self._pooled(self._embed_chunk(chunk), pooling)
                chunk = []
        if chunk:
            yield from self._pooled(self._embed_chunk(chunk), pooling)

    @staticmethod
    def _pooled(arrays: Iterator[np.ndarray], pooling: str | None) -> Iterator[np.ndarray]:
        return arrays if pooling is None else (_pool(array, pooling) for array in arrays)

    def _embed_chunk(self, chunk: list[Sequence[str]]) -> Iterator[np.ndarray]:
        empty = np.zeros((self.bilm.num_layers, 0, self.dim), dtype=np.float32)
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
    ) -> EmbedSummary:
        """Embed a file of sentences (one per line, ``-`` = stdin) into HDF5 laid out like
        ``allennlp elmo``: dataset "i" for line i, (3, n_tokens, dim) for ``all`` or
        (n_tokens, dim) for ``top``/``average``, and "sentence_to_index" (JSON) unless disabled.

        ``pooling`` "mean" or "max": one vector per line instead, the mean or elementwise max
        over its tokens of what ``layers`` gives, stored as row i of one dataset "embedding",
        (n_lines, 3, dim) for ``all`` or (n_lines, dim) for ``top``/``average`` (an empty line's
        row is NaN); "sentence_to_index" maps each sentence to its row.

        The output is written to a temporary file beside it and renamed when complete; on an
        error or an interruption nothing is left. Memory does not grow with the file beyond
        bounded caches (token encodings, HDF5's metadata) and 8 bytes a line (the sentence
        index's hashes): the index's JSON is built in a temporary file and copied
        into the output in blocks, as one fixed-length UTF-8 string (read it with
        ``json.loads(f["sentence_to_index"][0])``, as allennlp's files).
        """
        _check_layers(layers, pooling)
        output = check_output(output_path, overwrite, [input_path])
        total = count_lines(input_path)
        lines = read_lines(input_path)
        split = _tokenizer(tokenize)
        start = time.perf_counter()
        stats = {"sentences": 0, "tokens": 0, "empty": 0}
        texts: deque[str] = deque()  # lines read but not yet written, in order

        def token_lists() -> Iterator[list[str]]:
            for text in lines:
                texts.append(text)
                yield split(text)

        def rows(bar) -> Iterator[tuple[str, np.ndarray]]:
            for array in self.embed_sentences(token_lists()):
                yield texts.popleft(), _output_array(array, layers, pooling)
                n = array.shape[1]
                stats["sentences"] += 1
                stats["tokens"] += n
                stats["empty"] += n == 0
                bar.update(1)
                bar.set_postfix(tok_s=f"{stats['tokens'] / (time.perf_counter() - start):.0f}")

        with _progress(progress, total) as bar:
            _write_vectors(output, overwrite, rows(bar), self._row_shape(layers, pooling), sentence_index)
        return EmbedSummary(**stats, seconds=time.perf_counter() - start, output=str(output))

    def _row_shape(self, layers: str, pooling: str | None) -> tuple[int, ...] | None:
        """The shape of a line's vector with ``pooling``; None without (one dataset per line)."""
        if pooling is None:
            return None
        return (self.bilm.num_layers, self.dim) if layers == "all" else (self.dim,)

    def embed_tokens_file(
        self, vocab_path: str | os.PathLike, output_path: str | os.PathLike, overwrite: bool = False
    ) -> int:
        """Context-independent vectors of every line of a vocabulary file: HDF5 dataset
        "embedding" (n_lines, projection_dim), as bilm-tf's dump_token_embeddings."""
        output = check_output(output_path, overwrite, [vocab_path])
        tokens = _vocabulary_tokens(vocab_path)
        blocks = (
            self.encode_token_block(tokens[i : i + TOKEN_BLOCK]) for i in range(0, len(tokens), TOKEN_BLOCK)
        )
        _write_token_vectors(output, overwrite, blocks, (len(tokens), self.bilm.token_encoder.output_dim))
        return len(tokens)

    @torch.inference_mode()
    def encode_token_block(self, tokens: list[str]) -> np.ndarray:
        """float32 (n_tokens, projection_dim): one block of ``embed_tokens_file``."""
        return self.bilm.encode_tokens(tokens).float().cpu().numpy()


def _onnx_backend(
    backend: str, bilm: BiLM, onnx_file: str | os.PathLike | None, dtype: torch.dtype, int8: bool
):
    """The runner of backend "onnxruntime": ``onnx_file`` (checked against ``bilm``'s weights), or
    ``bilm`` exported in memory when None; ``int8``: its int8 graph. CPU only."""
    if backend not in ("torch", "onnxruntime"):
        raise ValueError(f"backend must be torch or onnxruntime, got {backend!r}")
    if backend != "onnxruntime":
        what = "dtype int8" if int8 else f"onnx_file {onnx_file}"
        raise ValueError(f"{what} runs on the onnxruntime backend: pass backend='onnxruntime'")
    if _device(bilm).type != "cpu" or dtype != torch.float32:
        raise ValueError("backend onnxruntime runs on the CPU in float32 or int8: pass device='cpu'")
    from .onnx_export import OnnxBiLM, export_onnx, quantize_int8

    data = export_onnx(bilm, int8=int8) if onnx_file is None else onnx_file
    runner = OnnxBiLM(data, bilm)
    if runner.dtype != ("int8" if int8 else "float32"):
        if not int8:
            raise ValueError(f"{onnx_file} is an {runner.dtype} export: pass dtype='int8' to run it")
        runner = OnnxBiLM(quantize_int8(Path(onnx_file).read_bytes()), bilm)
    return runner


def _vocabulary_tokens(vocab_path: str | os.PathLike) -> list[str]:
    """The stripped lines of a vocabulary file; an empty line or file is a ValueError."""
    count_lines(vocab_path)  # a missing input or a folder is named
    tokens = [line.strip() for line in read_lines(vocab_path)]
    for number, token in enumerate(tokens, start=1):
        if not token:
            raise ValueError(f"{vocab_path}: line {number} is empty")
    if not tokens:
        raise ValueError(f"{vocab_path} holds no tokens")
    return tokens


def _write_token_vectors(
    output: Path, overwrite: bool, blocks: Iterable[np.ndarray], shape: tuple[int, int]
) -> None:
    """Write ``embed_tokens_file``'s HDF5 file atomically: the blocks of rows, in order, as the
    dataset "embedding" of ``shape`` (n_tokens, dim)."""
    with atomic_path(output, overwrite) as tmp, h5py.File(tmp, "w") as out:
        dataset = out.create_dataset("embedding", shape=shape, dtype=np.float32)
        first = 0
        for block in blocks:
            raise_if_signalled()
            dataset[first : first + len(block)] = block
            first += len(block)
        if first != shape[0]:
            raise RuntimeError(f"{first} token vectors were computed for {shape[0]} tokens")


def _write_vectors(
    output: Path,
    overwrite: bool,
    rows: Iterable[tuple[str, np.ndarray]],
    row_shape: tuple[int, ...] | None,
    sentence_index: bool,
) -> None:
    """Write ``embed_file``'s HDF5 file atomically from its lines' (text, array) in line order:
    dataset "i" for line i, or with a ``row_shape`` (pooled vectors) row i of the dataset
    "embedding" (n_lines, *row_shape); the stripped texts in "sentence_to_index" unless
    disabled (a fixed-length UTF-8 string, its JSON built in a temporary file and copied in)."""
    _limit_hdf5_free_lists()
    with atomic_path(output, overwrite) as tmp_name, SentenceIndex(output.parent) as index:
        # HDF5 1.8's group format: its link index stays flat in memory (the 1.6 format kept
        # every name of the group in one cached heap: +75 MB at 600,000 datasets)
        with h5py.File(tmp_name, "w", libver=("v108", "v108")) as out:
            matrix = None if row_shape is None else _Rows(out, POOLED_DATASET, row_shape)
            for i, (text, array) in enumerate(rows):
                raise_if_signalled()  # a signal whose exception Python dropped stops the write too
                if matrix is None:
                    out.create_dataset(str(i), data=array)
                else:
                    matrix.append(array)
                if sentence_index:
                    index.add(text.strip())
            if matrix is not None:
                matrix.flush()
            if sentence_index:
                json_file, size = index.json_file()
                offset = _reserve_string(out, "sentence_to_index", size)
        if sentence_index:  # the HDF5 file is closed: its layout is final
            _copy_into(tmp_name, offset, json_file)


class _Rows:
    """A float32 dataset (n, *row_shape) of an open HDF5 file that grows by rows as they come,
    written in blocks of about 1 MB (its chunks)."""

    def __init__(self, out: h5py.File, name: str, row_shape: tuple[int, ...]) -> None:
        self.block = max(1, (1 << 20) // (4 * math.prod(row_shape)))
        self.dataset = out.create_dataset(
            name,
            shape=(0, *row_shape),
            maxshape=(None, *row_shape),
            chunks=(self.block, *row_shape),
            dtype="<f4",
        )
        self.pending: list[np.ndarray] = []

    def append(self, row: np.ndarray) -> None:
        if row.shape != self.dataset.shape[1:]:
            raise ValueError(f"a row of shape {row.shape} for dataset rows of {self.dataset.shape[1:]}")
        self.pending.append(row)
        if len(self.pending) == self.block:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            first = len(self.dataset)
            self.dataset.resize(first + len(self.pending), axis=0)
            self.dataset[first:] = np.stack(self.pending)
            self.pending = []


def _check_sentences(sentences: Sequence[Sequence[str]]) -> None:
    check_token_lists(sentences)
    if len(sentences) == 0:
        raise ValueError("empty sentence list: give at least one sentence")
    for i, sentence in enumerate(sentences):
        if len(sentence) == 0:
            raise ValueError(f"sentence {i} is empty")
        for token in sentence:
            if token == "":
                raise ValueError(f"sentence {i} has an empty token")


def _check_layers(layers: str, pooling: str | None) -> None:
    if layers not in LAYERS:
        raise ValueError(f"layers must be one of {', '.join(LAYERS)}, got {layers!r}")
    if pooling is not None:
        _check_pooling(pooling)


def _check_pooling(pooling: str) -> None:
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)} (or None), got {pooling!r}")


def _pool(array: np.ndarray, pooling: str) -> np.ndarray:
    """The mean or elementwise max over the tokens (axis -2) of (..., n_tokens, dim): (..., dim)
    float32 (the mean summed in float64); NaN when there are no tokens (nothing to pool)."""
    if array.shape[-2] == 0:
        return np.full(array.shape[:-2] + array.shape[-1:], np.nan, dtype=np.float32)
    if pooling == "mean":
        return array.mean(axis=-2, dtype=np.float64).astype(np.float32)
    return array.max(axis=-2)


def _output_array(array: np.ndarray, layers: str, pooling: str | None) -> np.ndarray:
    """What embed_file stores for a line: the chosen layers of its (num_layers, n_tokens, dim)
    array, pooled over the tokens when ``pooling`` is given."""
    selected = _select_layers(array, layers)
    return selected if pooling is None else _pool(selected, pooling)


def _select_layers(array: np.ndarray, layers: str) -> np.ndarray:
    if layers == "top":
        return array[-1]
    if layers == "average":
        return array.mean(axis=0)
    return array


def _tokenizer(tokenize: bool):
    if not tokenize:
        return str.split
    from .tokenize import tokenize_line

    return tokenize_line


def _progress(enabled: bool, total: int | None, desc: str | None = None):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="sent", disable=not enabled, dynamic_ncols=True, file=sys.stderr)
