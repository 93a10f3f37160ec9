"""The HDF5 files of ELMo vectors, written in one place: ``elmokit embed`` and
``Embedder.embed_file`` (one process or several), ``elmokit tokens``, and the AllenNLP-compatible
``ElmoEmbedder.embed_file`` / ``elmokit elmo``.

The sentence file (``write_vectors``), laid out as ``allennlp elmo`` lays it out: dataset "i"
(float32) for line i, (num_layers, n_tokens, dim) for layers "all" or (n_tokens, dim) for "top"
and "average"; with pooling one dataset "embedding" (n_lines, ...) whose row i is line i; and
"sentence_to_index", one string holding ``json.dumps({sentence: str(line)})``. The token file
(``write_token_vectors``): one dataset "embedding" (n_tokens, projection_dim), as bilm-tf's
dump_token_embeddings.

Two flavours of the sentence file hold the same datasets: "elmokit" (HDF5 1.8's group format,
the index a fixed-length UTF-8 string built in a temporary file, so memory stays bounded on
files of any length) and "allennlp" (h5py's default format and a variable-length index string:
the bytes AllenNLP's command writes).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from array import array as typed_array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

import h5py
import numpy as np

from ..base import _hdf5_tuning
from ..base.atomic import atomic_path, raise_if_signalled
from ..base.textfiles import count_lines, read_lines
from ..model.weights import create_hdf5

__all__: list[str] = []

LAYERS = ("all", "top", "average")
POOLINGS = ("mean", "max")
FLAVOURS = ("elmokit", "allennlp")
POOLED_DATASET = "embedding"  # with pooling: one row per line; the token file's one dataset
TOKEN_BLOCK = 4096  # token vectors are computed and written this many tokens at a time


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
        self._folder = None if folder is None else os.fsdecode(folder)
        self._keys = tempfile.TemporaryFile(dir=self._folder)  # one JSON string per line
        self._json: BinaryIO | None = None
        self._hashes = typed_array("q")
        self.repeated = 0  # lines that repeat an earlier line, once ``json_file`` has run

    def __enter__(self) -> SentenceIndex:
        return self

    def __exit__(self, *exc: object) -> None:
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
        self.repeated = len(later)
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


# -- what a line stores -------------------------------------------------------------------------
def check_layers(layers: str, pooling: str | None) -> None:
    """A ValueError unless ``layers`` is one of LAYERS and ``pooling`` None or one of POOLINGS."""
    if layers not in LAYERS:
        raise ValueError(f"layers must be one of {', '.join(LAYERS)}, got {layers!r}")
    if pooling is not None:
        check_pooling(pooling)


def check_pooling(pooling: str) -> None:
    """A ValueError unless ``pooling`` is one of POOLINGS."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)} (or None), got {pooling!r}")


def pool(array: np.ndarray, pooling: str) -> np.ndarray:
    """The mean or elementwise max over the tokens (axis -2) of (..., n_tokens, dim): (..., dim)
    float32 (the mean summed in float64); NaN when there are no tokens (nothing to pool)."""
    if array.shape[-2] == 0:
        return np.full(array.shape[:-2] + array.shape[-1:], np.nan, dtype=np.float32)
    if pooling == "mean":
        return array.mean(axis=-2, dtype=np.float64).astype(np.float32)
    return array.max(axis=-2)


def select_layers(array: np.ndarray, layers: str) -> np.ndarray:
    """The chosen layers of (num_layers, n_tokens, dim): all of it, the top layer, or their mean."""
    if layers == "top":
        return array[-1]
    if layers == "average":
        return array.mean(axis=0)
    return array


def output_array(array: np.ndarray, layers: str, pooling: str | None) -> np.ndarray:
    """What the file stores for a line: the chosen layers of its (num_layers, n_tokens, dim)
    array, pooled over the tokens when ``pooling`` is given."""
    selected = select_layers(array, layers)
    return selected if pooling is None else pool(selected, pooling)


def row_shape(num_layers: int, dim: int, layers: str, pooling: str | None) -> tuple[int, ...] | None:
    """The shape of a line's row of the pooled dataset; None without pooling (one dataset a line)."""
    if pooling is None:
        return None
    return (num_layers, dim) if layers == "all" else (dim,)


def read_vocabulary(vocab_path: str | os.PathLike) -> list[str]:
    """The stripped lines of a vocabulary file (the token file's rows); an empty line or file is
    a ValueError."""
    count_lines(vocab_path)  # a missing input or a folder is named
    tokens = [line.strip() for line in read_lines(vocab_path)]
    for number, token in enumerate(tokens, start=1):
        if not token:
            raise ValueError(f"{vocab_path}: line {number} is empty")
    if not tokens:
        raise ValueError(f"{vocab_path} holds no tokens")
    return tokens


# -- writing ------------------------------------------------------------------------------------
def write_token_vectors(
    output: Path, overwrite: bool, blocks: Iterable[np.ndarray], shape: tuple[int, int]
) -> None:
    """Write the token file atomically: the blocks of rows, in order, as the dataset "embedding"
    of ``shape`` (n_tokens, dim)."""
    with atomic_path(output, overwrite) as tmp, create_hdf5(tmp) as out:
        dataset = out.create_dataset(POOLED_DATASET, shape=shape, dtype=np.float32)
        first = 0
        for block in blocks:
            raise_if_signalled()
            dataset[first : first + len(block)] = block
            first += len(block)
        if first != shape[0]:
            raise RuntimeError(f"{first} token vectors were computed for {shape[0]} tokens")


def write_vectors(
    output: Path,
    overwrite: bool,
    rows: Iterable[tuple[str, np.ndarray]],
    row_shape: tuple[int, ...] | None = None,
    sentence_index: bool = True,
    flavour: str = "elmokit",
    key: Callable[[int, str], str] | None = None,
) -> None:
    """Write the sentence file atomically from its lines' (text, array) in line order: dataset
    "i" for line i (or ``key(i, text)``), or with a ``row_shape`` (pooled vectors) row i of the
    dataset "embedding" (n_lines, *row_shape); the stripped texts in "sentence_to_index" unless
    disabled. ``flavour``: see the module's docstring. A name HDF5 refuses is a ValueError."""
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {', '.join(FLAVOURS)}, got {flavour!r}")
    _hdf5_tuning.apply()
    # "elmokit": HDF5 1.8's group format, whose link index stays flat in memory (the 1.6 format
    # kept every name of the group in one cached heap: +75 MB at 600,000 datasets)
    libver = ("v108", "v108") if flavour == "elmokit" else None
    with atomic_path(output, overwrite) as tmp_name, SentenceIndex(output.parent) as index:
        with create_hdf5(tmp_name, libver=libver) as out:
            matrix = None if row_shape is None else _Rows(out, POOLED_DATASET, row_shape)
            for i, (text, array) in enumerate(rows):
                raise_if_signalled()  # a signal whose exception Python dropped stops the write too
                if matrix is not None:
                    matrix.append(array)
                else:
                    name = str(i) if key is None else key(i, text)
                    try:
                        out.create_dataset(name, data=np.asarray(array, dtype=np.float32))
                    except (ValueError, KeyError) as err:
                        raise ValueError(f"line {i}: cannot use {name!r} as an HDF5 key ({err})") from None
                if sentence_index:
                    index.add(text.strip())
            if matrix is not None:
                matrix.flush()
            if sentence_index and flavour == "allennlp":
                json_file, size = index.json_file()
                strings = out.create_dataset("sentence_to_index", (1,), dtype=h5py.string_dtype())
                strings[0] = json_file.read().decode("ascii")
            elif sentence_index:
                json_file, size = index.json_file()
                offset = _reserve_string(out, "sentence_to_index", size)
        if sentence_index and flavour == "elmokit":  # the HDF5 file is closed: its layout is final
            _copy_into(tmp_name, offset, json_file)
        if sentence_index and index.repeated:  # what a reader of sentence_to_index needs (-v)
            logging.getLogger(__name__).info(
                "%s; sentence_to_index maps each to its last line number (as allennlp elmo's "
                "files do); the vectors of every line are written",
                "1 line repeats an earlier line"
                if index.repeated == 1
                else f"{index.repeated:,} lines repeat an earlier line",
            )


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


def _copy_into(path: str | os.PathLike, offset: int, source: BinaryIO) -> None:
    """Write the rest of ``source`` into the file at ``path`` from byte ``offset`` on, in blocks."""
    with open(path, "r+b") as target:
        target.seek(offset)
        shutil.copyfileobj(source, target, 1 << 20)


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
