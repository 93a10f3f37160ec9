"""A TF-Hub ELMo module folder (google/elmo/1-3 and modules built the same way from bilm-tf's
graph, as unpacked from tfhub.dev's or Kaggle's .tar.gz) read into a biLM, without TensorFlow.

The module's checkpoint (``variables/variables.index`` + ``.data-*``, read by
``elmokit.model.tf_checkpoint``) holds bilm-tf's graph variables under ``bilm/``
(``bilm/char_embed``, ``bilm/CNN/W_cnn_0``, ``bilm/CNN_high_0/W_carry``, ``bilm/CNN_proj/W_proj``,
``bilm/RNN_0/RNN/MultiRNNCell/Cell0/...``) and the module's layer mix, ``aggregation/weights``
(3,) and ``aggregation/scaling`` (). Its LSTM variables are named as the TF 1.x that built the
module named them: ``LSTMCell/W_0``, ``B``, ``W_P_0`` (TF 1.0-1.1) or ``rnn/lstm_cell/kernel``,
``bias``, ``projection/kernel`` (later); both are read.

The options come from the variables' shapes: filters, char embedding size, highway layers,
projection and LSTM sizes, layers. What the variables do not hold is read from the graph where
its node names tell it (the char CNN's activation: ``bilm/CNN/Relu`` or ``bilm/CNN/Tanh``), else
it is bilm-tf's, as every published ELMo has it: 50 characters a token, skip connections
between the LSTM layers, cell and projection clips of 3. The char ids are bilm-tf's (the
module's graph converts strings as bilm-tf's ``Batcher`` does).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .options import BiLMOptions
from .tf_checkpoint import Checkpoint
from .weights import lstm_cell_prefix

__all__: list[str] = []

SCOPE = "bilm/"
AGGREGATION = ("aggregation/weights", "aggregation/scaling")
# what the variables do not hold: bilm-tf's values, those of every published ELMo
MAX_CHARACTERS = 50
CLIP = 3.0
_LSTM_NAMES = {  # the layout's name -> the two TF 1.x namings of one cell's variable
    "W_0": ("LSTMCell/W_0", "rnn/lstm_cell/kernel"),
    "B": ("LSTMCell/B", "rnn/lstm_cell/bias"),
    "W_P_0": ("LSTMCell/W_P_0", "rnn/lstm_cell/projection/kernel"),
}


class TfHubError(ValueError):
    """A folder that is not a TF-Hub ELMo module, or whose variables disagree with each other."""


@dataclass(frozen=True)
class TfHubModel:
    """What a module folder holds: the biLM's options, its tensors by the original layout's
    dataset names (``elmokit.model.weights``: the char embedding without its padding row, as a
    weight file has it), and the module's layer mix (``weights`` (3,) before the softmax,
    ``scaling``), None when the module has none."""

    folder: Path
    options: BiLMOptions
    arrays: Mapping[str, np.ndarray]
    aggregation_weights: np.ndarray | None
    aggregation_scaling: float | None


def read_tfhub(folder: str | Path, require_aggregation: bool = False) -> TfHubModel:
    """Read a TF-Hub module folder; a one-line ``TfHubError`` names the first variable an ELMo
    module must have that it lacks (``require_aggregation``: also the layer mix)."""
    folder = Path(folder)
    variables = _Variables(folder)
    arrays: dict[str, np.ndarray] = {}
    char_cnn = _read_char_cnn(variables, arrays)
    lstm = _read_lstms(variables, arrays)
    n_filters = sum(count for _, count in char_cnn["filters"])
    if n_filters != lstm["projection_dim"]:
        for part, what in (("W_proj", "the char CNN's projection"), ("b_proj", "its bias")):
            arrays[f"CNN_proj/{part}"] = variables.need(f"{SCOPE}CNN_proj/{part}", what)
    char_cnn |= {"max_characters_per_token": MAX_CHARACTERS, "activation": _activation(folder)}
    options = {"lstm": lstm, "char_cnn": char_cnn}
    parsed = BiLMOptions.from_dict(options, f"{folder} (options from the variables' shapes)")
    weights: np.ndarray | None = None
    scaling: float | None = None
    if require_aggregation or all(name in variables.names for name in AGGREGATION):
        weights, scaling = _read_aggregation(variables, parsed.num_layers)
    return TfHubModel(folder, parsed, arrays, weights, scaling)


class _Variables:
    """A module folder's checkpoint, read variable by variable with the checks every variable gets."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.checkpoint = Checkpoint(folder / "variables" / "variables")
        self.names = set(self.checkpoint.entries)
        self.lacking = f"{folder}: not a TF-Hub ELMo module"  # a message's start: a variable missing

    def need(self, name: str, what: str) -> np.ndarray:
        """The variable ``name`` (``what`` it is, for the message when it is missing) as float32."""
        if name not in self.names:
            raise TfHubError(f"{self.lacking}: its checkpoint has no variable {name!r} ({what})")
        value = self.checkpoint.read(name)
        if value.dtype.kind != "f":
            raise TfHubError(f"{self.folder}: variable {name!r} holds {value.dtype} values, not floats")
        value = value.astype(np.float32)
        if not np.isfinite(value).all():
            raise TfHubError(f"{self.folder}: variable {name!r} holds non-finite values")
        return value

    def shape(self, value: np.ndarray, name: str, rank: int) -> tuple[int, ...]:
        """The shape of the variable ``name``, which must be of ``rank`` dimensions."""
        if value.ndim != rank:
            raise TfHubError(f"{self.folder}: variable {name!r} has shape {value.shape}, not of rank {rank}")
        return tuple(value.shape)


def _read_char_cnn(variables: _Variables, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The char embedding, CNN filters and highway layers into ``arrays``; their options."""
    names = variables.names
    char_embed = variables.need(SCOPE + "char_embed", "the character embedding")
    n_characters, embed_dim = variables.shape(char_embed, SCOPE + "char_embed", 2)
    arrays["char_embed"] = char_embed[1:]  # the graph's row 0 is the padding id's (zero)
    filters: list[list[int]] = []
    while f"{SCOPE}CNN/W_cnn_{len(filters)}" in names or not filters:
        k = len(filters)
        name = f"{SCOPE}CNN/W_cnn_{k}"
        kernel = variables.need(name, "the first char CNN filter")
        one, width, depth, count = variables.shape(kernel, name, 4)
        if one != 1 or depth != embed_dim:
            raise TfHubError(
                f"{variables.folder}: variable {name!r} has shape {kernel.shape}, "
                f"not (1, width, {embed_dim}, n)"
            )
        arrays[f"CNN/W_cnn_{k}"] = kernel
        arrays[f"CNN/b_cnn_{k}"] = variables.need(f"{SCOPE}CNN/b_cnn_{k}", f"the bias of filter {k}")
        filters.append([width, count])
    n_highway = 0
    while f"{SCOPE}CNN_high_{n_highway}/W_carry" in names:
        for part in ("W_carry", "b_carry", "W_transform", "b_transform"):
            key = f"CNN_high_{n_highway}/{part}"
            arrays[key] = variables.need(SCOPE + key, f"highway layer {n_highway}")
        n_highway += 1
    return {
        "embedding": {"dim": embed_dim},
        "filters": filters,
        "n_highway": n_highway,
        "n_characters": n_characters,
    }


def _read_lstms(variables: _Variables, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Both directions' LSTM layers into ``arrays`` (by the layout's names); their options."""
    names = variables.names
    n_layers = 0
    while _lstm_name(names, 0, n_layers, "W_0") is not None:
        n_layers += 1
    if n_layers == 0:
        raise TfHubError(
            f"{variables.lacking}: its checkpoint has no variable "
            f"{SCOPE}RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0 "
            "(or .../rnn/lstm_cell/kernel), the first LSTM's kernel"
        )
    projection_dim = dim = 0
    for k in range(n_layers):
        for d in range(2):
            cell = lstm_cell_prefix(d, k, n_layers)
            for part, (old, _new) in _LSTM_NAMES.items():
                found = _lstm_name(names, d, k, part)
                if found is None:
                    if part == "W_P_0":
                        continue  # an LSTM without a projection
                    raise TfHubError(
                        f"{variables.lacking}: its checkpoint has no variable "
                        f"{SCOPE}RNN_{d}/RNN/MultiRNNCell/Cell{k}/{old} (nor its lstm_cell name)"
                    )
                arrays[f"{cell}/{part}"] = variables.need(found, f"LSTM layer {k}")
            dim = variables.shape(arrays[f"{cell}/B"], f"{cell}/B", 1)[0] // 4
            if f"{cell}/W_P_0" in arrays:
                projection_dim = variables.shape(arrays[f"{cell}/W_P_0"], f"{cell}/W_P_0", 2)[1]
            else:
                projection_dim = dim
    return {
        "cell_clip": CLIP,
        "use_skip_connections": True,
        "n_layers": n_layers,
        "proj_clip": CLIP,
        "projection_dim": projection_dim,
        "dim": dim,
    }


def _read_aggregation(variables: _Variables, num_layers: int) -> tuple[np.ndarray, float]:
    """The module's layer mix: its weights (``num_layers``,) before the softmax, and its scale."""
    weights = variables.need(AGGREGATION[0], "the module's layer weights")
    if weights.shape != (num_layers,):
        raise TfHubError(
            f"{variables.folder}: variable {AGGREGATION[0]!r} has shape {weights.shape}, not "
            f"({num_layers},) for a biLM of {num_layers} layers"
        )
    value = variables.need(AGGREGATION[1], "the module's scale of the layer mix")
    if value.size != 1:
        raise TfHubError(f"{variables.folder}: variable {AGGREGATION[1]!r} has shape {value.shape}, not ()")
    return weights, float(value.reshape(()))


def _lstm_name(names: set[str], direction: int, layer: int, part: str) -> str | None:
    """The checkpoint's name of one LSTM variable, in either naming, or None."""
    root = f"{SCOPE}RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/"
    return next((root + n for n in _LSTM_NAMES[part] if root + n in names), None)


_ACTIVATION = re.compile(rb"bilm/CNN/(Relu|Tanh)")
_CHUNK, _OVERLAP = 2**20, 16


def _activation(folder: Path) -> str:
    """The char CNN's activation, from the graph's node names (relu, bilm-tf's usual, when the
    graph names neither). The graph file is scanned in chunks: it may hold every weight as a
    constant."""
    for name in ("saved_model.pb", "tfhub_module.pb"):
        path = folder / name
        if not path.is_file():
            continue
        found: set[bytes] = set()
        tail = b""
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(_CHUNK), b""):
                window = tail + chunk
                found |= {m.group(1) for m in _ACTIVATION.finditer(window)}
                tail = window[-_OVERLAP:]
        if found == {b"Tanh"}:
            return "tanh"
        if found:
            return "relu"
    return "relu"
