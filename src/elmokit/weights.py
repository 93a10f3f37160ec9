"""The original weight-file layout (bilm-tf's HDF5, as AllenNLP reads it): the one place that knows it.

Each dataset is described once by a ``_Dataset`` entry (name, file shape, how to read it from the
model and how to write it into the model); loading and saving both walk the same list.
Matrices in the file are TensorFlow's [in, out]; the char embedding has no row for id 0 (padding).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import h5py
import numpy as np
import torch

if TYPE_CHECKING:
    from .bilm import BiLM


class WeightFileError(ValueError):
    """A weight file that does not match the model described by options.json."""


@dataclass(frozen=True)
class _Dataset:
    name: str
    get: Callable[[], torch.Tensor]  # the model's value, in the file's layout
    set: Callable[[torch.Tensor], None]  # write a file-layout tensor into the model


def _param_view(
    param: torch.Tensor,
    to_file: Callable[[torch.Tensor], torch.Tensor],
    from_file: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], None]]:
    def get() -> torch.Tensor:
        return to_file(param.detach())

    def set_(value: torch.Tensor) -> None:
        with torch.no_grad():
            param.copy_(from_file(value))

    return get, set_


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _transpose(t: torch.Tensor) -> torch.Tensor:
    return t.t()


def _entry(name: str, param: torch.Tensor, to_file=_same, from_file=_same) -> _Dataset:
    get, set_ = _param_view(param, to_file, from_file)
    return _Dataset(name, get, set_)


def lstm_cell_prefix(direction: int, layer: int, n_layers: int) -> str:
    """bilm-tf's variable scope of one LSTM cell (a single layer is not in a MultiRNNCell)."""
    if n_layers == 1:
        return f"RNN_{direction}/RNN/LSTMCell"
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def _datasets(bilm: BiLM) -> Iterator[_Dataset]:
    encoder = bilm.token_encoder
    cnn = encoder.char_cnn
    yield _entry("char_embed", cnn.embedding.weight[1:])
    for k, conv in enumerate(cnn.convolutions):
        # torch Conv1d (out, in, width) <-> TF conv2d (1, width, in, out)
        yield _entry(
            f"CNN/W_cnn_{k}",
            conv.weight,
            lambda w: w.permute(2, 1, 0).unsqueeze(0),
            lambda w: w[0].permute(2, 1, 0),
        )
        yield _entry(f"CNN/b_cnn_{k}", conv.bias)
    for k, (carry, transform) in enumerate(zip(encoder.highway.carry, encoder.highway.transform)):
        yield _entry(f"CNN_high_{k}/W_carry", carry.weight, _transpose, _transpose)
        yield _entry(f"CNN_high_{k}/b_carry", carry.bias)
        yield _entry(f"CNN_high_{k}/W_transform", transform.weight, _transpose, _transpose)
        yield _entry(f"CNN_high_{k}/b_transform", transform.bias)
    if encoder.projection is not None:
        yield _entry("CNN_proj/W_proj", encoder.projection.weight, _transpose, _transpose)
        yield _entry("CNN_proj/b_proj", encoder.projection.bias)
    n_layers = len(bilm.lstm.layers)
    for k, layer in enumerate(bilm.lstm.layers):
        for d in range(2):
            prefix = lstm_cell_prefix(d, k, n_layers)
            yield _lstm_kernel(f"{prefix}/W_0", layer, d)
            yield _entry(f"{prefix}/B", layer.bias[d])
            if layer.weight_projection is not None:
                yield _entry(f"{prefix}/W_P_0", layer.weight_projection[d])


def _lstm_kernel(name: str, layer: torch.nn.Module, d: int) -> _Dataset:
    """W_0 is [input; h] stacked: (input_dim + projection_dim, 4 * dim)."""
    n_in = layer.weight_input.shape[1]

    def get() -> torch.Tensor:
        return torch.cat([layer.weight_input[d].detach(), layer.weight_hidden[d].detach()], dim=0)

    def set_(value: torch.Tensor) -> None:
        with torch.no_grad():
            layer.weight_input[d].copy_(value[:n_in])
            layer.weight_hidden[d].copy_(value[n_in:])

    return _Dataset(name, get, set_)


# elmokit's extra datasets (ignored by bilm-tf and AllenNLP, which read datasets by name): the
# canonical start state of stateless "warm" mode, h (n_layers, 2, projection_dim), c (n_layers, 2, dim).
START_STATE_DATASETS = ("start_state/h", "start_state/c")


def _read_start_state(bilm: BiLM, handle: h5py.File, path: Path):
    from .lstm import LstmState

    if not all(name in handle for name in START_STATE_DATASETS):
        return None
    lstm = bilm.options.lstm
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


def load_weights(bilm: BiLM, weight_file: str | Path) -> None:
    """Copy the weights of an original-format HDF5 file into ``bilm``, checking every dataset."""
    path = Path(weight_file)
    if not path.is_file():
        raise FileNotFoundError(f"weight file not found: {path}")
    try:
        handle = h5py.File(path, "r")
    except OSError as err:
        raise WeightFileError(f"{path}: not a readable HDF5 file ({err})") from None
    with handle:
        for entry in _datasets(bilm):
            expected = tuple(entry.get().shape)
            if entry.name not in handle:
                raise WeightFileError(
                    f"{path}: missing dataset {entry.name!r} (shape {expected} expected from the options)"
                )
            found = handle[entry.name].shape
            if tuple(found) != expected:
                raise WeightFileError(
                    f"{path}: dataset {entry.name!r} has shape {tuple(found)} but the options "
                    f"imply {expected}"
                )
            entry.set(torch.from_numpy(np.asarray(handle[entry.name][...], dtype=np.float32)))
        bilm.start_state = _read_start_state(bilm, handle, path)


def save_weights(bilm: BiLM, weight_file: str | Path) -> None:
    """Write ``bilm``'s weights in the original layout (float32, bilm-tf dataset names)."""
    path = Path(weight_file)
    tmp = path.with_name(path.name + ".tmp")
    with h5py.File(tmp, "w") as handle:
        for entry in _datasets(bilm):
            value = entry.get().to("cpu", torch.float32).contiguous().numpy()
            handle.create_dataset(entry.name, data=value)
        if bilm.start_state is not None:
            for name, value in zip(START_STATE_DATASETS, bilm.start_state):
                handle.create_dataset(name, data=value.detach().to("cpu", torch.float32).numpy())
    tmp.replace(path)


def dataset_names(bilm: BiLM) -> list[str]:
    """Names of all datasets the original layout holds for this model."""
    return [entry.name for entry in _datasets(bilm)]
