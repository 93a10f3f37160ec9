"""The Parquet files of ELMo vectors, written in one place: ``elmokit embed INPUT OUT.parquet``,
``Embedder.embed_file(..., format="parquet")`` (one process or several) and the Ray Data
integration (``elmokit.integrations.ray``) build their columns here.

One row per sentence (line), in line order:

- ``index`` int64: the line number, counted from 0 (the HDF5 file's dataset name);
- ``tokens`` list<string>: the line's tokens;
- one column of vectors per chosen layer: ``layer_0`` ... ``layer_{L-1}`` for ``layers="all"``
  (layer 0 is the character CNN's token vectors), ``top`` or ``average`` otherwise. Without
  pooling a cell is list<fixed_size_list<float32, dim>> (one vector per token; an empty line
  holds an empty list); with ``pooling`` "mean" or "max" fixed_size_list<float32, dim> (NaN for
  an empty line, as in the HDF5 file).

The file's key/value metadata (``elmokit.model``, ``elmokit.layers``, ``elmokit.pooling``,
``elmokit.mode``, ``elmokit.dim``, ``elmokit.num_layers``, ``elmokit.version``) says what made
it. Rows are written in row groups of at most ``ROW_GROUP_SENTENCES`` sentences and about
``ROW_GROUP_BYTES`` bytes of vectors, so memory stays bounded on inputs of any length.

pyarrow is an optional dependency (``pip install 'elmokit[parquet]'``): this module imports it
only when a file is written or a table built.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._version import __version__
from ..base.atomic import atomic_path, raise_if_signalled
from .vectors_file import check_layers

if TYPE_CHECKING:
    import pyarrow as pa

__all__: list[str] = []

FORMATS = ("hdf5", "parquet")
EXTRA_HINT = "pip install 'elmokit[parquet]'"
ROW_GROUP_SENTENCES = 4096  # at most this many sentences a row group
ROW_GROUP_BYTES = 32 << 20  # and about this many bytes of vectors
_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".hdf5": "hdf5", ".h5": "hdf5", ".hdf": "hdf5"}


def output_format(path: str | os.PathLike, format: str | None = None) -> str:
    """The format of an output: ``format`` ("hdf5" or "parquet") when given, else from the
    suffix (.parquet or .pq: parquet; anything else: hdf5). A suffix of the other format is a
    ValueError (``out.parquet`` with format "hdf5")."""
    by_suffix = _SUFFIXES.get(Path(path).suffix.lower())
    if format is None:
        return by_suffix or "hdf5"
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if by_suffix is not None and by_suffix != format:
        raise ValueError(
            f"the output {path} has the suffix of {by_suffix} but the format {format} was asked "
            f"for; name it with a .{'parquet' if format == 'parquet' else 'hdf5'} suffix or leave "
            "out --format"
        )
    return format


def require_pyarrow(what: str = "Parquet output") -> Any:
    """pyarrow, or a one-line ImportError naming the extra."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ImportError(f"{what} needs the package pyarrow: {EXTRA_HINT}") from None
    return pyarrow


@dataclass(frozen=True)
class ParquetLayout:
    """The columns of a file of ``num_layers`` model layers of width ``dim`` under a choice of
    ``layers`` ("all", "top", "average") and ``pooling`` (None, "mean", "max"), and its metadata
    (``model``: the model's name; ``mode``: the Embedder's)."""

    num_layers: int
    dim: int
    layers: str = "all"
    pooling: str | None = None
    model: str = ""
    mode: str = "warm"

    def __post_init__(self) -> None:
        check_layers(self.layers, self.pooling)

    @property
    def vector_columns(self) -> list[str]:
        """The names of the columns of vectors, in order."""
        if self.layers == "all":
            return [f"layer_{k}" for k in range(self.num_layers)]
        return [self.layers]

    @property
    def columns(self) -> list[str]:
        return ["index", "tokens", *self.vector_columns]

    def metadata(self) -> dict[str, str]:
        """The file's key/value metadata."""
        return {
            "elmokit.model": self.model,
            "elmokit.layers": self.layers,
            "elmokit.pooling": self.pooling or "none",
            "elmokit.mode": self.mode,
            "elmokit.dim": str(self.dim),
            "elmokit.num_layers": str(self.num_layers),
            "elmokit.version": __version__,
        }

    def vector_type(self) -> pa.DataType:
        pa = require_pyarrow()
        vector = pa.list_(pa.field("element", pa.float32(), nullable=False), self.dim)
        return vector if self.pooling is not None else pa.list_(pa.field("element", vector, nullable=False))

    def schema(self, index: bool = True) -> pa.Schema:
        """The Arrow schema (with the metadata); without the ``index`` column when not ``index``."""
        pa = require_pyarrow()
        fields = [pa.field("index", pa.int64(), nullable=False)] if index else []
        strings = pa.list_(pa.field("element", pa.string(), nullable=False))
        fields.append(pa.field("tokens", strings, nullable=False))
        fields += [pa.field(name, self.vector_type(), nullable=False) for name in self.vector_columns]
        return pa.schema(fields, metadata=self.metadata())

    def row_bytes(self, array: np.ndarray) -> int:
        """The bytes of vectors a row holds: what bounds a row group."""
        return int(array.nbytes)

    def split(self, array: np.ndarray) -> list[np.ndarray]:
        """A line's output array (``vectors_file.output_array``: (num_layers, n_tokens, dim) or
        (n_tokens, dim), pooled (num_layers, dim) or (dim,)) as one array per vector column."""
        if self.layers == "all":
            if array.ndim != (2 if self.pooling else 3) or array.shape[0] != self.num_layers:
                raise ValueError(f"an array of shape {array.shape} for {self.num_layers} layers")
            return list(array)
        return [array]

    def table(
        self,
        tokens: Sequence[Sequence[str]],
        arrays: Sequence[np.ndarray],
        first_index: int | None = 0,
    ) -> pa.Table:
        """The rows of ``tokens`` and their output ``arrays`` (see ``split``) as a table of
        ``schema()``, indexed from ``first_index`` (None: no ``index`` column)."""
        pa = require_pyarrow()
        if len(tokens) != len(arrays):
            raise ValueError(f"{len(tokens)} token lists for {len(arrays)} arrays")
        width = len(self.vector_columns)
        per_column = list(zip(*(self.split(a) for a in arrays))) if arrays else [()] * width
        columns: list[Any] = []
        if first_index is not None:
            columns.append(pa.array(np.arange(first_index, first_index + len(tokens), dtype=np.int64)))
        columns.append(pa.array([list(t) for t in tokens], type=pa.list_(pa.string())))
        vector = pa.list_(pa.float32(), self.dim)
        for parts in per_column:
            if self.pooling is not None:
                flat = np.ascontiguousarray(np.stack(parts) if parts else np.zeros((0, self.dim)), np.float32)
                columns.append(pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), self.dim))
                continue
            lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
            offsets = np.zeros(len(parts) + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            pieces = [np.asarray(p, np.float32).reshape(-1) for p in parts]
            flat = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
            vectors = pa.FixedSizeListArray.from_arrays(pa.array(flat, type=pa.float32()), self.dim)
            columns.append(pa.ListArray.from_arrays(pa.array(offsets), vectors, type=pa.list_(vector)))
        return pa.Table.from_arrays(columns, schema=self.schema(index=first_index is not None))


def write_parquet(
    output: Path,
    overwrite: bool,
    rows: Iterable[tuple[Sequence[str], np.ndarray]],
    layout: ParquetLayout,
    first_index: int = 0,
    row_group_sentences: int = ROW_GROUP_SENTENCES,
    row_group_bytes: int = ROW_GROUP_BYTES,
) -> int:
    """Write the Parquet file atomically from its lines' (tokens, output array) in line order
    (the arrays as ``vectors_file.output_array`` gives them), line i as ``index``
    ``first_index + i``; returns the number of rows. The file is written under a temporary name
    beside ``output`` and renamed when complete: on an error, a full disk or an interruption
    nothing is left. Row groups hold at most ``row_group_sentences`` lines and about
    ``row_group_bytes`` bytes of vectors, so memory stays bounded."""
    if row_group_sentences < 1 or row_group_bytes < 1:
        raise ValueError("row groups hold at least one sentence and one byte")

    def tables() -> Iterator[pa.Table]:
        tokens: list[Sequence[str]] = []
        arrays: list[np.ndarray] = []
        size = written = 0
        for row_tokens, array in rows:
            tokens.append(row_tokens)
            arrays.append(array)
            size += layout.row_bytes(array)
            if len(tokens) >= row_group_sentences or size >= row_group_bytes:
                yield layout.table(tokens, arrays, first_index + written)
                written += len(tokens)
                tokens, arrays, size = [], [], 0
        if tokens or written == 0:
            yield layout.table(tokens, arrays, first_index + written)

    return _write_tables(output, overwrite, layout.schema(), tables())


def write_parquet_tables(
    output: Path,
    overwrite: bool,
    tables: Iterable[pa.Table],
    layout: ParquetLayout,
    first_index: int = 0,
    row_group_sentences: int = ROW_GROUP_SENTENCES,
    row_group_bytes: int = ROW_GROUP_BYTES,
) -> int:
    """``write_parquet`` of rows that come as tables of ``layout.table(..., first_index=None)``
    (no ``index`` column; e.g. from Ray's workers), in line order: the index is numbered here,
    and the tables are gathered into row groups of the same bounds (a larger table is one row
    group). Returns the number of rows."""
    arrow = require_pyarrow()
    schema = layout.schema()

    def grouped() -> Iterator[pa.Table]:
        pending: list[pa.Table] = []
        rows = size = written = 0
        for table in tables:
            if table.num_rows == 0:
                continue
            pending.append(table.select(schema.names[1:]))
            rows += table.num_rows
            size += table.nbytes
            if rows >= row_group_sentences or size >= row_group_bytes:
                yield _indexed(arrow, arrow.concat_tables(pending), first_index + written, schema)
                written += rows
                pending, rows, size = [], 0, 0
        if pending or written == 0:
            part = arrow.concat_tables(pending) if pending else schema.empty_table().drop_columns(["index"])
            yield _indexed(arrow, part, first_index + written, schema)

    return _write_tables(output, overwrite, schema, grouped())


def _indexed(arrow: Any, table: pa.Table, first: int, schema: pa.Schema) -> pa.Table:
    index = arrow.array(np.arange(first, first + table.num_rows, dtype=np.int64))
    columns = [index, *(table.column(name).combine_chunks() for name in schema.names[1:])]
    return arrow.Table.from_arrays(columns, schema=schema)


def _write_tables(output: Path, overwrite: bool, schema: pa.Schema, tables: Iterable[pa.Table]) -> int:
    """Write each table as one row group of a new Parquet file, atomically; the rows written."""
    require_pyarrow()
    import pyarrow.parquet as pq

    written = 0
    with atomic_path(output, overwrite) as tmp, open(tmp, "wb", buffering=1 << 20) as raw:
        # through a Python file, so a full disk raises its OSError (atomic_path reports it)
        writer = pq.ParquetWriter(
            raw,
            schema,
            compression="snappy",
            use_dictionary=["tokens"],  # floats gain nothing from dictionaries or statistics
            write_statistics=["index"],
        )
        try:
            for table in tables:
                raise_if_signalled()
                writer.write_table(table, row_group_size=max(1, table.num_rows))
                written += table.num_rows
        except BaseException:
            try:  # the file is removed: only the first error counts
                writer.close()
            except Exception:  # noqa: BLE001, S110
                pass
            raise
        writer.close()  # the footer: a full disk here is reported as one line too
    return written


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The ``elmokit.*`` key/value metadata of a Parquet file written here."""
    require_pyarrow()
    import pyarrow.parquet as pq

    metadata = pq.read_schema(path).metadata or {}
    return {
        key.decode(): value.decode() for key, value in metadata.items() if key.decode().startswith("elmokit.")
    }
