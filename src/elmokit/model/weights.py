"""The original file layout (bilm-tf's, as AllenNLP reads it): the one place that reads and writes it.

A model folder holds ``options.json`` (its fields are options.py's), the biLM weights in HDF5
and, for a trained language model, ``softmax.hdf5``. Each HDF5 dataset is one row of a table:
its bilm-tf name, the parameter(s) it holds (by the building blocks' state-dict names, such as
``token_encoder.char_cnn.convolutions.0.weight`` or ``lstm.layers.0.weight_input``) and the
transform between the two layouts. Loading and saving both read the same table. Matrices in the
file are TensorFlow's [in, out]; the char embedding has no row for id 0 (padding); an LSTM
kernel ``W_0`` is [input; h] stacked.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import h5py
import numpy as np
import torch
from torch import nn

from ..base.atomic import atomic_path, write_json
from ..base.bounds import MAX_HDF5_OBJECTS
from .lstm import LstmState
from .options import BiLMOptions

__all__ = ["WeightFileError"]

SOFTMAX_FILE = "softmax.hdf5"

# elmokit's extra datasets (ignored by bilm-tf and AllenNLP, which read datasets by name): the
# canonical start state of stateless "warm" mode, h (n_layers, 2, projection_dim), c (n_layers, 2, dim).
START_STATE_DATASETS = ("start_state/h", "start_state/c")


class WeightFileError(ValueError):
    """A weight file that does not match the model described by options.json, or that cannot be
    read (damaged, not HDF5, non-finite values)."""


class UnsafeHDF5Error(WeightFileError):
    """An HDF5 file that would make its reader open other files (external links, external
    storage, virtual datasets) or that holds links elmokit does not follow (soft links)."""


@dataclass(frozen=True)
class _Transform:
    """Between the model's tensors of one dataset and the dataset's value in the file."""

    to_file: Callable[[list[torch.Tensor]], torch.Tensor]
    from_file: Callable[[torch.Tensor, list[torch.Tensor]], list[torch.Tensor]]  # (value, model's)


_SAME = _Transform(lambda ts: ts[0], lambda v, ts: [v])
_TRANSPOSE = _Transform(lambda ts: ts[0].t(), lambda v, ts: [v.t()])
# torch Conv1d (out, in, width) <-> TF conv2d (1, width, in, out)
_CONV = _Transform(lambda ts: ts[0].permute(2, 1, 0).unsqueeze(0), lambda v, ts: [v[0].permute(2, 1, 0)])
# the file has no row for char id 0 (no token), whose embedding stays as it is (zero)
_NO_PADDING_ROW = _Transform(lambda ts: ts[0][1:], lambda v, ts: [torch.cat([ts[0][:1], v])])
# W_0 is [input; h] stacked: (input_dim + projection_dim, 4 * dim)
_STACKED = _Transform(lambda ts: torch.cat(ts), lambda v, ts: list(v.split([t.shape[0] for t in ts])))


@dataclass(frozen=True)
class _Dataset:
    """One dataset of a file: its name, the parameter(s) it holds and how."""

    name: str
    params: tuple[str, ...]
    transform: _Transform = _SAME
    direction: int | None = None  # the direction's slice of (2, ...) LSTM parameters


def lstm_cell_prefix(direction: int, layer: int, n_layers: int) -> str:
    """bilm-tf's variable scope of one LSTM cell (a single layer is not in a MultiRNNCell)."""
    if n_layers == 1:
        return f"RNN_{direction}/RNN/LSTMCell"
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def _bilm_table(options: BiLMOptions) -> list[_Dataset]:
    """The datasets of a biLM weight file, in bilm-tf's order, for the model ``options`` describe."""
    cnn, lstm = options.char_cnn, options.lstm
    table = [_Dataset("char_embed", ("token_encoder.char_cnn.embedding.weight",), _NO_PADDING_ROW)]
    for k in range(len(cnn.filters)):
        conv = f"token_encoder.char_cnn.convolutions.{k}"
        table += [
            _Dataset(f"CNN/W_cnn_{k}", (f"{conv}.weight",), _CONV),
            _Dataset(f"CNN/b_cnn_{k}", (f"{conv}.bias",)),
        ]
    for k in range(cnn.n_highway):
        for gate in ("carry", "transform"):
            linear = f"token_encoder.highway.{gate}.{k}"
            table += [
                _Dataset(f"CNN_high_{k}/W_{gate}", (f"{linear}.weight",), _TRANSPOSE),
                _Dataset(f"CNN_high_{k}/b_{gate}", (f"{linear}.bias",)),
            ]
    if cnn.n_filters != lstm.projection_dim:
        table += [
            _Dataset("CNN_proj/W_proj", ("token_encoder.projection.weight",), _TRANSPOSE),
            _Dataset("CNN_proj/b_proj", ("token_encoder.projection.bias",)),
        ]
    for k in range(lstm.n_layers):
        layer = f"lstm.layers.{k}"
        for d in range(2):
            cell = lstm_cell_prefix(d, k, lstm.n_layers)
            kernel = (f"{layer}.weight_input", f"{layer}.weight_hidden")
            table += [
                _Dataset(f"{cell}/W_0", kernel, _STACKED, d),
                _Dataset(f"{cell}/B", (f"{layer}.bias",), direction=d),
            ]
            if lstm.has_projection:
                table.append(_Dataset(f"{cell}/W_P_0", (f"{layer}.weight_projection",), direction=d))
    return table


_SOFTMAX_TABLE = [_Dataset("softmax/W", ("weight",)), _Dataset("softmax/b", ("bias",))]


class _Parameterized(Protocol):
    """A module whose parameters a table reads or writes (any ``nn.Module``)."""

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]: ...


class _WeightedBiLM(_Parameterized, Protocol):
    """What the original layout reads and writes of a ``BiLM`` (bilm.py imports this module, so
    it names the model by what it uses)."""

    @property
    def options(self) -> BiLMOptions: ...

    @property
    def start_state(self) -> LstmState | None: ...

    def set_start_state(self, state: LstmState | None) -> None: ...


def _parameters(module: _Parameterized, table: Sequence[_Dataset]) -> dict[str, torch.Tensor]:
    """The module's parameters by name, checked against the table in both directions."""
    params: dict[str, torch.Tensor] = dict(module.named_parameters())
    named = {name for entry in table for name in entry.params}
    if named - params.keys() or params.keys() - named:
        raise WeightFileError(
            f"the model's parameters do not match the original layout: missing "
            f"{sorted(named - params.keys())}, without a dataset {sorted(params.keys() - named)}"
        )
    return params


def _model_tensors(params: Mapping[str, torch.Tensor], entry: _Dataset) -> list[torch.Tensor]:
    tensors = [params[name] for name in entry.params]
    return tensors if entry.direction is None else [t[entry.direction] for t in tensors]


def open_hdf5(path: str | Path, what: str = "weight file") -> h5py.File:
    """Open an HDF5 file for reading: every HDF5 file elmokit reads is opened here.

    A weight file is data from anywhere, so it must not make its reader open other files: an
    external link, a dataset with external storage (raw data in other files) or a virtual
    dataset (a view of other files' datasets) raises ``UnsafeHDF5Error`` naming it, before any
    data is read; so does a soft link (bilm-tf and elmokit write none). A file of more than
    ``bounds.MAX_HDF5_OBJECTS`` groups and datasets is refused before they are all visited (the
    largest model within the ceilings has under 2,000). A file that is not HDF5 or is damaged
    raises ``WeightFileError`` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        handle = h5py.File(path, "r")
    except OSError as err:
        raise WeightFileError(f"{path}: not a readable HDF5 file ({err})") from None
    try:
        with _damage_reported(path):
            _refuse_other_files(handle, path)
    except BaseException:
        handle.close()
        raise
    return handle


class _CheckedFile(io.FileIO):
    """The file under an HDF5 file being written (h5py's fileobj driver): each write is whole
    or fails, and the first failure is kept. It reaches libhdf5 once, as the exception of the
    h5py call that wrote, unless the file is being closed; later writes are dropped (the file is
    lost anyway), since libhdf5 can crash closing a file after failed writes."""

    failure: OSError | None = None
    closing = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self.failure is not None:
            return len(view)
        done = 0
        try:
            while done < len(view):
                written = super().write(view[done:])
                if not written:  # nothing taken: the disk is full
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += written
        except OSError as err:
            self.failure = err
            if self.closing:
                return len(view)
            raise
        return done

    def truncate(self, size: int | None = None) -> int:
        if self.failure is not None:
            return self.tell() if size is None else size
        try:
            return super().truncate(size)
        except OSError as err:
            self.failure = err
            if self.closing:
                return self.tell() if size is None else size
            raise


@contextmanager
def create_hdf5(path: str | Path, mode: str = "w", **options: Any) -> Iterator[h5py.File]:
    """An HDF5 file open for writing (``mode`` "w": a new file, "r+": a change to one), closed
    when the block ends: every HDF5 file elmokit writes is written here. It is written through
    a Python file, so a write that fails (a full disk, the file size limit) raises its OSError,
    once, as ``atomic.atomic_path`` reports it: libhdf5's own writer reported it only from
    finalizers, as pages of messages, and could crash when the file was closed."""
    if mode not in ("w", "r+"):
        raise ValueError(f"mode must be 'w' or 'r+', got {mode!r}")
    raw = _CheckedFile(path, "w+" if mode == "w" else "r+")
    try:
        handle = h5py.File(raw, mode, **options)
    except BaseException:
        raw.close()
        raise
    try:
        try:
            yield handle
        finally:
            raw.closing = True
            try:
                handle.close()
            except Exception:
                if raw.failure is None:
                    raise
        if raw.failure is not None:  # found while closing (a chunk cache written out)
            raise raw.failure
    except BaseException as err:
        if raw.failure is not None and raw.failure is not err and not isinstance(err, KeyboardInterrupt):
            raise raw.failure from None
        raise
    finally:
        raw.close()


def _refuse_other_files(root: h5py.Group, path: Path) -> None:
    """Check every link and dataset under ``root`` (each group once: hard links may loop), at
    most ``MAX_HDF5_OBJECTS`` of them (a group's size is read before its links are)."""
    seen, pending, visited = {root.id}, [root], 0
    while pending:
        group = pending.pop()
        visited += len(group)
        if visited > MAX_HDF5_OBJECTS:
            raise WeightFileError(
                f"{path}: holds more than {MAX_HDF5_OBJECTS:,} groups and datasets; a weight file "
                "holds one dataset per weight (under 2,000 for the largest model elmokit builds)"
            )
        for name in group:
            item = _checked_item(group, name, path)
            if isinstance(item, h5py.Group) and item.id not in seen:
                seen.add(item.id)
                pending.append(item)


def _checked_item(group: h5py.Group, name: str, path: Path) -> h5py.Group | h5py.Dataset:
    """The object ``name`` of ``group``, refused if it is or makes its reader open another file."""
    where = f"{group.name.rstrip('/')}/{name}"
    link = group.get(name, getlink=True)
    if isinstance(link, h5py.ExternalLink):
        raise UnsafeHDF5Error(
            f"{path}: {where!r} is an external link to {link.filename}:{link.path}; elmokit "
            "does not read other files through a weight file"
        )
    if isinstance(link, h5py.SoftLink):
        raise UnsafeHDF5Error(
            f"{path}: {where!r} is a soft link to {link.path}; elmokit reads only objects "
            "stored under their own names"
        )
    if not isinstance(link, h5py.HardLink):
        raise UnsafeHDF5Error(f"{path}: {where!r} is a link of a kind elmokit does not follow")
    item = group[name]
    if isinstance(item, h5py.Dataset):
        if item.is_virtual:
            raise UnsafeHDF5Error(
                f"{path}: dataset {where!r} is a virtual dataset (its data lives in other "
                "files); elmokit does not read it"
            )
        if item.external:
            files = ", ".join(sorted({str(f) for f, _, _ in item.external}))
            raise UnsafeHDF5Error(
                f"{path}: dataset {where!r} keeps its data in other files ({files}); elmokit "
                "does not read external storage"
            )
    return item


@contextmanager
def _damage_reported(path: Path) -> Iterator[None]:
    """Errors from HDF5 while reading ``path`` become a WeightFileError naming the file."""
    try:
        yield
    except WeightFileError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError, TypeError) as err:
        raise WeightFileError(f"{path}: damaged HDF5 file, it cannot be read ({err})") from None


def _checked_dataset(
    handle: h5py.File, path: Path, name: str, expected: tuple[int, ...], implied_by: str
) -> h5py.Dataset:
    """Dataset ``name``, checked without reading it: present, a dataset of numbers, of shape
    ``expected``."""
    if name not in handle:
        raise WeightFileError(
            f"{path}: missing dataset {name!r} (shape {expected} expected from {implied_by})"
        )
    dataset = handle[name]
    if not isinstance(dataset, h5py.Dataset):
        raise WeightFileError(f"{path}: {name!r} is a group, not a dataset")
    if dataset.dtype.kind not in "fiu":
        raise WeightFileError(f"{path}: dataset {name!r} holds {dataset.dtype} values, not numbers")
    found = tuple(dataset.shape)
    if found != expected:
        raise WeightFileError(f"{path}: dataset {name!r} has shape {found} but {implied_by} imply {expected}")
    return dataset


def _read_array(
    handle: h5py.File, path: Path, name: str, expected: tuple[int, ...], implied_by: str
) -> np.ndarray:
    """Dataset ``name`` as float32 numpy, checked: present, a dataset of numbers, of shape
    ``expected``, every value finite."""
    dataset = _checked_dataset(handle, path, name, expected, implied_by)
    with np.errstate(over="ignore"):  # a float64 too large for float32 becomes inf: refused below
        value = np.asarray(dataset[...], dtype=np.float32)
    finite = np.isfinite(value)
    if not finite.all():
        raise WeightFileError(
            f"{path}: dataset {name!r} holds {int(finite.size - finite.sum()):,} non-finite values "
            "(NaN or infinity, or too large for float32)"
        )
    return value


def _read(
    handle: h5py.File, path: Path, module: _Parameterized, table: Sequence[_Dataset], implied_by: str
) -> None:
    """Copy every dataset of ``table`` into ``module``, checking names, shapes and values."""
    params = _parameters(module, table)
    with torch.no_grad(), _damage_reported(path):
        for entry in table:
            tensors = _model_tensors(params, entry)
            expected = tuple(entry.transform.to_file(tensors).shape)
            value = torch.from_numpy(_read_array(handle, path, entry.name, expected, implied_by))
            for tensor, part in zip(tensors, entry.transform.from_file(value, tensors)):
                tensor.copy_(part)


def _write(handle: h5py.File, module: _Parameterized, table: Sequence[_Dataset]) -> None:
    """Write every dataset of ``table`` from ``module`` (float32)."""
    params = _parameters(module, table)
    for entry in table:
        value = entry.transform.to_file([t.detach() for t in _model_tensors(params, entry)])
        handle.create_dataset(entry.name, data=value.to("cpu", torch.float32).contiguous().numpy())


def _read_start_state(options: BiLMOptions, handle: h5py.File, path: Path) -> LstmState | None:
    """The start state (both datasets, checked), or None when the file has neither."""
    present = [name in handle for name in START_STATE_DATASETS]
    if not any(present):
        return None
    if not all(present):
        have, lack = START_STATE_DATASETS if present[0] else START_STATE_DATASETS[::-1]
        raise WeightFileError(
            f"{path}: has dataset {have!r} but not {lack!r}; a start state needs both (elmokit "
            "start-state writes them)"
        )
    lstm = options.lstm
    expected = [(lstm.n_layers, 2, lstm.projection_dim), (lstm.n_layers, 2, lstm.dim)]
    with _damage_reported(path):
        values = [
            torch.from_numpy(_read_array(handle, path, name, shape, "the options"))
            for name, shape in zip(START_STATE_DATASETS, expected)
        ]
    return LstmState(*values)


def char_cnn_file_shapes(options: BiLMOptions) -> dict[str, tuple[int, ...]]:
    """The shapes of the char CNN's datasets (``char_embed``, ``CNN/W_cnn_k``, ``CNN/b_cnn_k``)
    that ``options`` imply, computed without building the model: the datasets whose size a
    wrong ``embedding.dim``, ``n_characters`` or filter list multiplies."""
    cnn = options.char_cnn
    shapes: dict[str, tuple[int, ...]] = {"char_embed": (cnn.n_characters - 1, cnn.embedding_dim)}
    for k, (width, count) in enumerate(cnn.filters):
        shapes[f"CNN/W_cnn_{k}"] = (1, width, cnn.embedding_dim, count)
        shapes[f"CNN/b_cnn_{k}"] = (count,)
    return shapes


def check_weight_shapes(options: BiLMOptions, weight_file: str | Path) -> None:
    """Refuse a weight file whose char CNN datasets do not have the shapes ``options`` imply,
    reading only the file's metadata: called before the model is built, so a mismatched size
    field is refused before its memory is allocated."""
    path = Path(weight_file)
    with open_hdf5(path) as handle, _damage_reported(path):
        for name, expected in char_cnn_file_shapes(options).items():
            _checked_dataset(handle, path, name, expected, "the options")


def load_weights(bilm: _WeightedBiLM, weight_file: str | Path) -> None:
    """Copy an original-format HDF5 file into a ``BiLM`` (its weights and ``start_state``),
    checking every dataset against ``bilm.options``."""
    path = Path(weight_file)
    with open_hdf5(path) as handle:
        _read(handle, path, bilm, _bilm_table(bilm.options), "the options")
        bilm.set_start_state(_read_start_state(bilm.options, handle, path))


def load_weight_arrays(bilm: _WeightedBiLM, arrays: Mapping[str, np.ndarray], source: str) -> None:
    """Copy arrays named as the datasets of a weight file (another format's tensors, renamed by
    its reader, e.g. ``elmokit.model.tfhub``) into a ``BiLM``, each checked as a dataset is: present,
    of the shape ``bilm.options`` imply, finite. ``source`` names where they come from."""
    table = _bilm_table(bilm.options)
    params = _parameters(bilm, table)
    with torch.no_grad():
        for entry in table:
            tensors = _model_tensors(params, entry)
            expected = tuple(entry.transform.to_file(tensors).shape)
            if entry.name not in arrays:
                raise WeightFileError(f"{source}: missing {entry.name!r} (shape {expected} expected)")
            value = np.asarray(arrays[entry.name], dtype=np.float32)
            if tuple(value.shape) != expected:
                raise WeightFileError(
                    f"{source}: {entry.name!r} has shape {tuple(value.shape)}, the options imply {expected}"
                )
            if not np.isfinite(value).all():
                raise WeightFileError(f"{source}: {entry.name!r} holds non-finite values")
            for tensor, part in zip(tensors, entry.transform.from_file(torch.from_numpy(value), tensors)):
                tensor.copy_(part)


def save_weights(bilm: _WeightedBiLM, weight_file: str | Path) -> None:
    """Write a ``BiLM``'s weights in the original layout (float32, bilm-tf dataset names), and
    its ``start_state`` when it has one."""
    with atomic_path(weight_file) as tmp, create_hdf5(tmp) as handle:
        _write(handle, bilm, _bilm_table(bilm.options))
        if bilm.start_state is not None:
            for name, value in zip(START_STATE_DATASETS, bilm.start_state):
                handle.create_dataset(name, data=value.detach().to("cpu", torch.float32).numpy())


def save_options(options: BiLMOptions, path: str | Path, extra: Mapping[str, Any] | None = None) -> None:
    """Write options.json: the options in the original's field names, then ``extra`` fields
    (bilm-tf's training options such as ``n_tokens_vocab``)."""
    write_json(path, {**options.to_dict(), **(extra or {})})


def save_softmax(softmax: nn.Module, path: str | Path) -> None:
    """The softmax in its own HDF5 file: softmax/W (vocab, dim), softmax/b (vocab,)."""
    with atomic_path(path) as tmp, create_hdf5(tmp) as handle:
        _write(handle, softmax, _SOFTMAX_TABLE)


def load_softmax(softmax: nn.Module, path: str | Path) -> None:
    """Copy softmax.hdf5 into a ``Softmax`` whose vocabulary size it must match."""
    path = Path(path)
    with open_hdf5(path, "softmax file") as handle:
        _read(handle, path, softmax, _SOFTMAX_TABLE, "the vocabulary and dimension")


def has_start_state(weight_file: str | Path) -> bool:
    """Whether a weight file holds a start state (both datasets)."""
    with open_hdf5(weight_file) as handle:
        return all(name in handle for name in START_STATE_DATASETS)


def write_start_state(source: str | Path, target: str | Path, state: LstmState) -> None:
    """Write ``target`` as a copy of the weight file ``source`` (byte for byte, so nothing else
    in it changes) whose start state is ``state`` (h (n_layers, 2, projection_dim), c
    (n_layers, 2, dim)); ``target`` may be ``source``. Atomic: ``target`` is whole or unchanged."""
    source, target = Path(source), Path(target)
    open_hdf5(source).close()  # refuse a file that reads other files before copying it
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
        with create_hdf5(tmp, "r+") as handle:
            for name, value in zip(START_STATE_DATASETS, state):
                if name in handle:
                    del handle[name]
                handle.create_dataset(name, data=value.detach().to("cpu", torch.float32).numpy())
