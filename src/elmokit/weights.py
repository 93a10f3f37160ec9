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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch import nn

from .atomic import atomic_path, write_json
from .lstm import LstmState
from .options import BiLMOptions

SOFTMAX_FILE = "softmax.hdf5"

# elmokit's extra datasets (ignored by bilm-tf and AllenNLP, which read datasets by name): the
# canonical start state of stateless "warm" mode, h (n_layers, 2, projection_dim), c (n_layers, 2, dim).
START_STATE_DATASETS = ("start_state/h", "start_state/c")


class WeightFileError(ValueError):
    """A weight file that does not match the model described by options.json."""


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


def _parameters(module: nn.Module, table: Sequence[_Dataset]) -> dict[str, torch.Tensor]:
    """The module's parameters by name, checked against the table in both directions."""
    params = dict(module.named_parameters())
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


def _open(path: Path) -> h5py.File:
    if not path.is_file():
        raise FileNotFoundError(f"weight file not found: {path}")
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise WeightFileError(f"{path}: not a readable HDF5 file ({err})") from None


def _read(
    handle: h5py.File, path: Path, module: nn.Module, table: Sequence[_Dataset], implied_by: str
) -> None:
    """Copy every dataset of ``table`` into ``module``, checking names and shapes."""
    params = _parameters(module, table)
    with torch.no_grad():
        for entry in table:
            tensors = _model_tensors(params, entry)
            expected = tuple(entry.transform.to_file(tensors).shape)
            if entry.name not in handle:
                raise WeightFileError(
                    f"{path}: missing dataset {entry.name!r} (shape {expected} expected from {implied_by})"
                )
            found = tuple(handle[entry.name].shape)
            if found != expected:
                raise WeightFileError(
                    f"{path}: dataset {entry.name!r} has shape {found} but {implied_by} imply {expected}"
                )
            value = torch.from_numpy(np.asarray(handle[entry.name][...], dtype=np.float32))
            for tensor, part in zip(tensors, entry.transform.from_file(value, tensors)):
                tensor.copy_(part)


def _write(handle: h5py.File, module: nn.Module, table: Sequence[_Dataset]) -> None:
    """Write every dataset of ``table`` from ``module`` (float32)."""
    params = _parameters(module, table)
    for entry in table:
        value = entry.transform.to_file([t.detach() for t in _model_tensors(params, entry)])
        handle.create_dataset(entry.name, data=value.to("cpu", torch.float32).contiguous().numpy())


def _read_start_state(options: BiLMOptions, handle: h5py.File, path: Path) -> LstmState | None:
    if not all(name in handle for name in START_STATE_DATASETS):
        return None
    lstm = options.lstm
    expected = [(lstm.n_layers, 2, lstm.projection_dim), (lstm.n_layers, 2, lstm.dim)]
    values = []
    for name, shape in zip(START_STATE_DATASETS, expected):
        if tuple(handle[name].shape) != shape:
            raise WeightFileError(
                f"{path}: dataset {name!r} has shape {tuple(handle[name].shape)} but the options "
                f"imply {shape}"
            )
        values.append(torch.from_numpy(np.asarray(handle[name][...], dtype=np.float32)))
    return LstmState(*values)


def load_weights(bilm: nn.Module, weight_file: str | Path) -> None:
    """Copy an original-format HDF5 file into a ``BiLM`` (its weights and ``start_state``),
    checking every dataset against ``bilm.options``."""
    path = Path(weight_file)
    with _open(path) as handle:
        _read(handle, path, bilm, _bilm_table(bilm.options), "the options")
        bilm.start_state = _read_start_state(bilm.options, handle, path)


def save_weights(bilm: nn.Module, weight_file: str | Path) -> None:
    """Write a ``BiLM``'s weights in the original layout (float32, bilm-tf dataset names), and
    its ``start_state`` when it has one."""
    with atomic_path(weight_file) as tmp, h5py.File(tmp, "w") as handle:
        _write(handle, bilm, _bilm_table(bilm.options))
        if bilm.start_state is not None:
            for name, value in zip(START_STATE_DATASETS, bilm.start_state):
                handle.create_dataset(name, data=value.detach().to("cpu", torch.float32).numpy())


def dataset_names(bilm: nn.Module) -> list[str]:
    """Names of all datasets the original layout holds for a ``BiLM`` (without the start state)."""
    return [entry.name for entry in _bilm_table(bilm.options)]


def save_options(options: BiLMOptions, path: str | Path, extra: Mapping[str, Any] | None = None) -> None:
    """Write options.json: the options in the original's field names, then ``extra`` fields
    (bilm-tf's training options such as ``n_tokens_vocab``)."""
    write_json(path, {**options.to_dict(), **(extra or {})})


def save_softmax(softmax: nn.Module, path: str | Path) -> None:
    """The softmax in its own HDF5 file: softmax/W (vocab, dim), softmax/b (vocab,)."""
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as handle:
        _write(handle, softmax, _SOFTMAX_TABLE)


def load_softmax(softmax: nn.Module, path: str | Path) -> None:
    """Copy softmax.hdf5 into a ``Softmax`` whose vocabulary size it must match."""
    path = Path(path)
    with _open(path) as handle:
        _read(handle, path, softmax, _SOFTMAX_TABLE, "the vocabulary and dimension")
