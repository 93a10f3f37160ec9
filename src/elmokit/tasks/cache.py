"""All biLM layers of a data set, computed once and kept on disk.

With a frozen biLM the layers of a sentence never change, so a task model only needs them once:
``LayerCache(model, cache_dir).layers(sentences)`` runs ``Embedder`` in warm mode (every sentence
starts from the model's canonical state, so a sentence's vectors do not depend on the others or on
the batching) over the sentences and stores the result in one HDF5 file; the next call with the
same model and the same sentences reads that file instead. The task model then applies its own
``ScalarMix`` to the stored layers, so only the mix and the task model are trained.

A cache file is named and checked by a SHA-256 key over the cache format, the elmokit version,
the embedding mode, the *contents* of options.json and of the weight file, and the data set's
token lists. Moving a model folder keeps its cache; changing one byte of the weights or the data
makes a new one. Files are written to a temporary name and renamed, so parallel runs and
interrupted runs never see half a file. Reading maps the file into memory (no copy, and parallel
runs on the same data share the pages).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .. import hub
from .._version import __version__
from ..base.atomic import atomic_path
from ..base.digests import file_digest
from ..embed.embedder import Embedder
from ..model.int8 import FORM as INT8_FORM
from ..model.weights import UnsafeHDF5Error, WeightFileError, create_hdf5, open_hdf5

FORMAT = "elmokit-task-layers-v2"
MODE = "warm"
_WRITE_BLOCK_TOKENS = 65536

__all__: list[str] = []


def default_cache_dir() -> Path:
    """``task-layers`` in elmokit's one cache folder (``elmokit.hub.cache_dir()``: $ELMOKIT_CACHE,
    else the platform's user cache folder)."""
    return hub.cache_dir() / "task-layers"


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes (remembered per path, size and mtime within the process)."""
    path = Path(path).resolve()
    stat = path.stat()
    memo = (str(path), stat.st_size, stat.st_mtime_ns)
    if memo not in _DIGESTS:
        _DIGESTS[memo] = file_digest(path)
    return _DIGESTS[memo]


def sentences_digest(sentences: Sequence[Sequence[str]]) -> str:
    """SHA-256 of token lists (JSON per sentence, so token boundaries count)."""
    h = hashlib.sha256()
    for tokens in sentences:
        h.update(json.dumps(list(tokens), ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


class CachedLayers:
    """The layers of every sentence of a data set.

    ``data`` (total_tokens, num_layers, dim) float32, usually a read-only memory map of the cache
    file; sentence i is ``data[offsets[i]:offsets[i + 1]]``. ``cached[i]`` gives it as
    (num_layers, n_tokens, dim), the layout ``Embedder.embed_sentences`` returns. ``created``
    tells whether this call computed the layers (False: read from an earlier run's file)."""

    def __init__(
        self, data: np.ndarray, offsets: np.ndarray, path: Path | None, created: bool, seconds: float
    ) -> None:
        self.data, self.offsets = data, offsets
        self.path, self.created, self.seconds = path, created, seconds

    @classmethod
    def from_arrays(cls, arrays: Sequence[np.ndarray]) -> CachedLayers:
        """In-memory layers from (num_layers, n_tokens, dim) arrays, one per sentence."""
        offsets = np.cumsum([0] + [a.shape[1] for a in arrays]).astype(np.int64)
        data = np.concatenate([a.transpose(1, 0, 2) for a in arrays]).astype(np.float32, copy=False)
        return cls(data, offsets, None, True, 0.0)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_layers(self) -> int:
        return int(self.data.shape[1])

    @property
    def dim(self) -> int:
        return int(self.data.shape[2])

    def token_major(self, i: int) -> np.ndarray:
        """Sentence i as (n_tokens, num_layers, dim) (a view, no copy)."""
        return self.data[self.offsets[i] : self.offsets[i + 1]]

    def __getitem__(self, i: int) -> np.ndarray:
        return self.token_major(i).transpose(1, 0, 2)


class LayerCache:
    """Compute-once store of biLM layers for data sets.

    model: a shipped model name or a model folder (options.json + weights.hdf5). ``dtype``
    "int8" stores the layers of the int8 form (``Embedder(dtype="int8")``), under their own key.
    """

    def __init__(
        self,
        model: str | Path,
        cache_dir: str | os.PathLike | None = None,
        batch_size: int = 64,
        max_tokens_per_batch: int | None = 4096,
        device: str | None = None,
        progress: bool = False,
        dtype: str = "float32",
    ) -> None:
        options, weights = hub.model_files(model)
        self.model = str(model)
        self.options_file, self.weights_file = options.resolve(), weights.resolve()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.batch_size, self.max_tokens_per_batch = batch_size, max_tokens_per_batch
        self.device, self.progress = device, progress
        if dtype not in ("float32", "int8"):
            raise ValueError(f"the layer cache's dtype must be float32 or int8, got {dtype!r}")
        self.dtype = dtype
        self._embedder: Embedder | None = None

    def model_identity(self) -> dict[str, str | int]:
        """What the layers depend on besides the data (the dtype only when it is not float32,
        so float32 caches keep the keys they had; for int8, the revision of the int8 form)."""
        identity: dict[str, str | int] = {
            "format": FORMAT,
            "elmokit": __version__,
            "mode": MODE,
            "options_sha256": file_sha256(self.options_file),
            "weights_sha256": file_sha256(self.weights_file),
        }
        if self.dtype != "float32":
            identity["dtype"] = self.dtype
        if self.dtype == "int8":
            identity["int8_form"] = INT8_FORM
        return identity

    def key(self, sentences: Sequence[Sequence[str]]) -> str:
        ident = {**self.model_identity(), "data_sha256": sentences_digest(sentences)}
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()

    def path_for(self, sentences: Sequence[Sequence[str]], name: str = "data") -> Path:
        return self._path(name, self.key(sentences))

    def _path(self, name: str, key: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60].lstrip(".") or "data"
        return self.cache_dir / f"{safe}-{key[:32]}.h5"

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = Embedder(
                self.model,
                batch_size=self.batch_size,
                device=self.device,
                mode=MODE,
                max_tokens_per_batch=self.max_tokens_per_batch,
                dtype=self.dtype,
            )
        return self._embedder

    def layers(self, sentences: Sequence[Sequence[str]], name: str = "data") -> CachedLayers:
        """The layers of ``sentences`` (non-empty token lists), from the cache or computed now.
        ``name`` only makes the file name readable; the key decides."""
        if len(sentences) == 0:
            raise ValueError("no sentences to embed")
        start = time.perf_counter()
        key = self.key(sentences)
        path = self._path(name, key)
        created = False
        found = _open(path, key, len(sentences)) if path.is_file() else None
        if found is None:
            self._write(sentences, path, key)
            found, created = _open(path, key, len(sentences)), True
            if found is None:
                raise RuntimeError(f"could not read back the layer cache {path}")
        data, offsets = found
        return CachedLayers(data, offsets, path, created, time.perf_counter() - start)

    def _write(self, sentences: Sequence[Sequence[str]], path: Path, key: str) -> None:
        lengths = np.array([len(s) for s in sentences], dtype=np.int64)
        if (lengths == 0).any():
            raise ValueError(f"sentence {int(np.argmax(lengths == 0))} is empty")
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        embedder = self.embedder
        num_layers, dim = embedder.bilm.num_layers, embedder.dim
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            with create_hdf5(tmp) as out:
                # contiguous (no chunks, no compression), so that readers can map it into memory
                layers = out.create_dataset("layers", shape=(int(offsets[-1]), num_layers, dim), dtype="<f4")
                out.create_dataset("offsets", data=offsets)
                out.attrs["key"] = key
                out.attrs["identity"] = json.dumps(self.model_identity())
                out.attrs["model"] = self.model
                buffer: list[np.ndarray] = []
                buffered = first = 0
                arrays = _progress(embedder.embed_sentences(sentences), len(sentences), self.progress)
                for i, array in enumerate(arrays):
                    if array.shape[1] != lengths[i]:
                        raise RuntimeError(f"sentence {i}: the embedder returned {array.shape[1]} tokens")
                    buffer.append(array.transpose(1, 0, 2))
                    buffered += array.shape[1]
                    if buffered >= _WRITE_BLOCK_TOKENS or i == len(sentences) - 1:
                        block = np.concatenate(buffer)
                        layers[first : first + len(block)] = block
                        first += len(block)
                        buffer, buffered = [], 0
                if first != offsets[-1]:
                    raise RuntimeError("the embedder returned fewer sentences than it was given")


def _open(path: Path, key: str, n_sentences: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(layers, offsets) of a cache file if it holds ``key``; layers memory-mapped when possible.
    A file that reads other files (``open_hdf5``) is an error; an unreadable one is a miss."""
    try:
        with open_hdf5(path, "layer cache") as f:
            if f.attrs.get("key") != key or len(f["offsets"]) != n_sentences + 1:
                return None
            offsets = f["offsets"][...]
            dataset = f["layers"]
            shape, dtype = dataset.shape, dataset.dtype
            offset = dataset.id.get_offset() if dataset.chunks is None else None
            if offset is None or dataset.size == 0:
                return dataset[...], offsets
    except UnsafeHDF5Error:
        raise
    except (OSError, KeyError, WeightFileError):
        return None
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape), offsets


def _progress(iterable, total: int, enabled: bool):
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(
        iterable,
        total=total,
        unit="sent",
        desc="biLM layers",
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.5 if sys.stderr.isatty() else 30.0,  # few lines in a log file
    )
