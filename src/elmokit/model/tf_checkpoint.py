"""A reader of TensorFlow's checkpoint format (tensor bundles), as TF-Hub modules and SavedModels
keep their variables: ``variables/variables.index`` and ``variables.data-NNNNN-of-MMMMM``.

A reader and not TensorFlow: the format is small and stable (an SSTable of BundleEntryProto
records naming each tensor's dtype, shape, shard, offset and size; the shards hold the raw
little-endian bytes), while TensorFlow is a large dependency whose TF-Hub API no longer loads
on TensorFlow 2.16+ or Keras 3. Reading the bytes directly keeps a module's weights usable with
nothing but numpy, and nothing in the file is executed.

``Checkpoint(prefix)`` reads the index (names, dtypes, shapes: ``entries``); ``read(name)``
reads one tensor as a numpy array. Everything is bounded before it is allocated: the index's
size and number of entries, each tensor's byte count against its shape and dtype, and against
the size of its shard. Anything else (compressed blocks, sliced or big-endian tensors, string
tensors, an unknown dtype) is refused with one line naming the file. Checksums are not
verified.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__: list[str] = []

MAX_INDEX_BYTES = 64 * 2**20
MAX_ENTRIES = 100_000
MAX_TENSOR_BYTES = 64 * 2**30
_MAGIC = 0xDB4775248B80FB57  # LevelDB's table magic number, as TensorFlow's tables use it
_FOOTER = 48
# TensorFlow's DataType enum -> numpy (the numeric ones a model's variables use)
_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"),
    2: np.dtype("<f8"),
    3: np.dtype("<i4"),
    4: np.dtype("u1"),
    5: np.dtype("<i2"),
    6: np.dtype("i1"),
    9: np.dtype("<i8"),
    10: np.dtype("?"),
    19: np.dtype("<f2"),
}
_DTYPE_NAMES = {7: "string", 8: "complex64", 14: "bfloat16", 18: "complex128", 20: "resource", 21: "variant"}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read (damaged, truncated, or using what the reader refuses)."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the bundle: where its bytes are and what they hold. ``dtype`` is None for a
    dtype the reader does not read (``dtype_name`` says which)."""

    name: str
    dtype: np.dtype | None
    dtype_name: str
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    sliced: bool = False


def is_checkpoint(prefix: str | Path) -> bool:
    """Whether ``prefix.index`` exists (a checkpoint's prefix, e.g. ``variables/variables``)."""
    return Path(f"{prefix}.index").is_file()


class Checkpoint:
    """The tensors of the checkpoint at ``prefix`` (``prefix.index`` and its data shards)."""

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        self.index_file = Path(f"{self.prefix}.index")
        if not self.index_file.is_file():
            raise FileNotFoundError(f"checkpoint index not found: {self.index_file}")
        size = self.index_file.stat().st_size
        if size > MAX_INDEX_BYTES:
            raise CheckpointError(
                f"{self.index_file}: {size:,} bytes, more than the {MAX_INDEX_BYTES:,} an index of "
                f"at most {MAX_ENTRIES:,} tensors needs"
            )
        self._data = self.index_file.read_bytes()
        self.num_shards = 1
        self.entries: dict[str, TensorEntry] = {}
        for key, value in self._table():
            if key == b"":
                self._header(value)
                continue
            name = self._name(key)
            self.entries[name] = self._entry(name, value)
        self._shard_sizes: dict[int, int] = {}

    # -- the table --------------------------------------------------------------------------
    def _fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.index_file}: not a readable TensorFlow checkpoint index ({what})")

    def _table(self) -> list[tuple[bytes, bytes]]:
        data = self._data
        if len(data) < _FOOTER:
            raise self._fail("shorter than a table's footer")
        footer = data[-_FOOTER:]
        if struct.unpack("<Q", footer[-8:])[0] != _MAGIC:
            raise self._fail("no table magic number at its end")
        pos = 0
        _meta_offset, pos = self._varint(footer, pos)
        _meta_size, pos = self._varint(footer, pos)
        index_offset, pos = self._varint(footer, pos)
        index_size, pos = self._varint(footer, pos)
        entries: list[tuple[bytes, bytes]] = []
        for _key, handle in self._block(index_offset, index_size):
            offset, at = self._varint(handle, 0)
            size, _ = self._varint(handle, at)
            entries += self._block(offset, size)
            if len(entries) > MAX_ENTRIES + 1:
                raise self._fail(f"more than {MAX_ENTRIES:,} tensors")
        return entries

    def _block(self, offset: int, size: int) -> list[tuple[bytes, bytes]]:
        """The (key, value) records of the block at ``offset`` (``size`` bytes + 5 of trailer)."""
        data = self._data
        if offset < 0 or size < 4 or offset + size + 5 > len(data):
            raise self._fail(f"a block at {offset} of {size} bytes lies outside the file")
        if data[offset + size] != 0:
            raise self._fail(
                f"a block compressed with method {data[offset + size]}; only uncompressed ones are read"
            )
        block = data[offset : offset + size]
        n_restarts = struct.unpack("<I", block[-4:])[0]
        end = size - 4 - 4 * n_restarts
        if end < 0:
            raise self._fail("a block's restart array is larger than the block")
        records, pos, key = [], 0, b""
        while pos < end:
            shared, pos = self._varint(block, pos)
            unshared, pos = self._varint(block, pos)
            length, pos = self._varint(block, pos)
            if shared > len(key) or pos + unshared + length > end:
                raise self._fail("a record runs past its block")
            key = key[:shared] + block[pos : pos + unshared]
            pos += unshared
            records.append((key, block[pos : pos + length]))
            pos += length
        return records

    def _varint(self, data: bytes, pos: int) -> tuple[int, int]:
        value, shift = 0, 0
        while True:
            if pos >= len(data) or shift > 63:
                raise self._fail("a truncated number")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, pos
            shift += 7

    def _fields(self, message: bytes) -> list[tuple[int, int | bytes]]:
        """The (field number, value) pairs of a protobuf message: varints as int, fixed32/64 as
        int, length-delimited as bytes."""
        fields: list[tuple[int, int | bytes]] = []
        pos = 0
        while pos < len(message):
            tag, pos = self._varint(message, pos)
            number, wire = tag >> 3, tag & 7
            value: int | bytes
            if wire == 0:
                value, pos = self._varint(message, pos)
            elif wire == 1:
                if pos + 8 > len(message):
                    raise self._fail("a truncated record")
                value, pos = struct.unpack("<Q", message[pos : pos + 8])[0], pos + 8
            elif wire == 5:
                if pos + 4 > len(message):
                    raise self._fail("a truncated record")
                value, pos = struct.unpack("<I", message[pos : pos + 4])[0], pos + 4
            elif wire == 2:
                length, pos = self._varint(message, pos)
                if pos + length > len(message):
                    raise self._fail("a truncated record")
                value, pos = message[pos : pos + length], pos + length
            else:
                raise self._fail(f"a record field of wire type {wire}")
            fields.append((number, value))
        return fields

    def _header(self, value: bytes) -> None:
        for number, field in self._fields(value):
            if number == 1 and isinstance(field, int):
                self.num_shards = field
            elif number == 2 and field == 1:
                raise CheckpointError(
                    f"{self.index_file}: a big-endian checkpoint; only little-endian ones are read"
                )
        if not 1 <= self.num_shards <= 10_000:
            raise self._fail(f"{self.num_shards} data shards")

    def _name(self, key: bytes) -> str:
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail(f"a tensor name that is not UTF-8 ({key[:40]!r})") from None

    def _entry(self, name: str, value: bytes) -> TensorEntry:
        dtype_id, shard, offset, size, sliced = 0, 0, 0, 0, False
        shape: tuple[int, ...] = ()
        for number, field in self._fields(value):
            if number == 1 and isinstance(field, int):
                dtype_id = field
            elif number == 2 and isinstance(field, bytes):
                shape = self._shape(name, field)
            elif number == 3 and isinstance(field, int):
                shard = field
            elif number == 4 and isinstance(field, int):
                offset = field
            elif number == 5 and isinstance(field, int):
                size = field
            elif number == 7:
                sliced = True
        dtype = _DTYPES.get(dtype_id)
        dtype_name = str(dtype) if dtype is not None else _DTYPE_NAMES.get(dtype_id, f"dtype {dtype_id}")
        return TensorEntry(name, dtype, dtype_name, shape, shard, offset, size, sliced)

    def _shape(self, name: str, message: bytes) -> tuple[int, ...]:
        dims: list[int] = []
        for number, field in self._fields(message):
            if number == 3 and field:
                raise self._fail(f"tensor {name!r} of unknown rank")
            if number == 2 and isinstance(field, bytes):
                size = next((v for n, v in self._fields(field) if n == 1 and isinstance(v, int)), 0)
                if size >= 2**63:
                    raise self._fail(f"tensor {name!r} has a dimension of unknown size")
                dims.append(size)
        return tuple(dims)

    # -- the tensors ------------------------------------------------------------------------
    def shard_file(self, shard: int) -> Path:
        return Path(f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}")

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a numpy array of its dtype and shape, bounded and checked first."""
        entry = self.entries.get(name)
        if entry is None:
            raise KeyError(f"{self.index_file}: no tensor {name!r}")
        where = f"{self.index_file}: tensor {name!r}"
        if entry.sliced:
            raise CheckpointError(f"{where} is saved in slices, which elmokit does not read")
        if entry.dtype is None:
            raise CheckpointError(f"{where} holds {entry.dtype_name} values, not numbers")
        count = 1
        for dim in entry.shape:
            count *= dim
        expected = count * entry.dtype.itemsize
        if expected > MAX_TENSOR_BYTES:
            raise CheckpointError(f"{where} of shape {entry.shape} would take {expected:,} bytes")
        if entry.size != expected:
            raise CheckpointError(
                f"{where} of shape {entry.shape} and dtype {entry.dtype_name} needs {expected:,} bytes, "
                f"the index says {entry.size:,}"
            )
        if not 0 <= entry.shard < self.num_shards:
            raise CheckpointError(f"{where} is in shard {entry.shard} of {self.num_shards}")
        path = self.shard_file(entry.shard)
        if entry.shard not in self._shard_sizes:
            if not path.is_file():
                raise FileNotFoundError(f"checkpoint data file not found: {path}")
            self._shard_sizes[entry.shard] = path.stat().st_size
        if entry.offset < 0 or entry.offset + entry.size > self._shard_sizes[entry.shard]:
            raise CheckpointError(
                f"{where}: bytes {entry.offset:,}..{entry.offset + entry.size:,} lie past the end of "
                f"{path} ({self._shard_sizes[entry.shard]:,} bytes)"
            )
        with open(path, "rb") as handle:
            handle.seek(entry.offset)
            raw = handle.read(entry.size)
        if len(raw) != entry.size:
            raise CheckpointError(f"{where}: {path} was cut short while reading")
        return (
            np.frombuffer(raw, dtype=entry.dtype).reshape(entry.shape).astype(entry.dtype.newbyteorder("="))
        )
