"""The model description of the original options.json, read and checked in one place."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base import bounds
from .characters import MAX_CHARACTERS_PER_TOKEN

__all__ = ["BiLMOptions", "OptionsError"]


class OptionsError(ValueError):
    """options.json is missing a field or holds a value the model cannot use."""


@dataclass(frozen=True)
class CharCNNOptions:
    """Character CNN token encoder: embedding, filters [[width, n_filters], ...], highway layers."""

    embedding_dim: int
    filters: tuple[tuple[int, int], ...]
    n_highway: int
    activation: str = "relu"
    n_characters: int = 262
    max_characters_per_token: int = MAX_CHARACTERS_PER_TOKEN

    @property
    def n_filters(self) -> int:
        return sum(n for _, n in self.filters)


@dataclass(frozen=True)
class LstmOptions:
    """Forward and backward LSTM stacks with a projection (and optional clips and skips).

    The cells are projected when ``projection_dim < dim`` (bilm-tf), or always with
    ``always_project`` (ELMoForManyLangs: a projection matrix whatever the sizes)."""

    dim: int
    projection_dim: int
    n_layers: int
    cell_clip: float | None = None
    proj_clip: float | None = None
    use_skip_connections: bool = False
    always_project: bool = False

    @property
    def has_projection(self) -> bool:
        return self.always_project or self.projection_dim < self.dim


@dataclass(frozen=True)
class BiLMOptions:
    """Everything options.json says about the biLM's shape."""

    lstm: LstmOptions
    char_cnn: CharCNNOptions

    @property
    def output_dim(self) -> int:
        """Size of one biLM layer: [forward; backward]."""
        return 2 * self.lstm.projection_dim

    @property
    def num_layers(self) -> int:
        """Number of layers for downstream use: the token layer plus the LSTM layers."""
        return self.lstm.n_layers + 1

    @classmethod
    def from_dict(cls, options: dict[str, Any], source: str = "options") -> BiLMOptions:
        """Check and read an options dict as bilm-tf writes it: every field's type and range is
        checked (sizes against ``elmokit.base.bounds``' ceilings), and an error names the field and
        the value found; then the whole model must fit in this machine's memory
        (``bounds.check_model_size``), all before anything is built."""
        if not isinstance(options, dict):
            raise OptionsError(f"{source}: expected a JSON object, got {type(options).__name__}")
        lstm = _section(options, "lstm", source)
        cnn = _section(options, "char_cnn", source)
        embedding = _section(cnn, "embedding", f"{source}: char_cnn")
        filters = _filters(_field(cnn, "filters", source, "char_cnn"), source, "char_cnn.filters")
        activation = cnn.get("activation", "relu")
        if activation not in ("relu", "tanh"):
            raise OptionsError(
                f"{source}: char_cnn.activation must be relu or tanh, got {_shown(activation)}"
            )
        char_cnn = CharCNNOptions(
            embedding_dim=_integer(
                _field(embedding, "dim", source, "char_cnn.embedding"),
                source,
                "char_cnn.embedding.dim",
                high=bounds.MAX_DIM,
            ),
            filters=filters,
            n_highway=_integer(
                _field(cnn, "n_highway", source, "char_cnn"),
                source,
                "char_cnn.n_highway",
                low=0,
                high=bounds.MAX_HIGHWAY,
            ),
            activation=activation,
            n_characters=_integer(
                _prediction_characters(cnn.get("n_characters", 262)),
                source,
                "char_cnn.n_characters",
                low=262,
                high=bounds.MAX_CHARACTERS,
                why=" (character ids go up to 261 at prediction, after the padding id 0)",
            ),
            max_characters_per_token=_integer(
                cnn.get("max_characters_per_token", MAX_CHARACTERS_PER_TOKEN),
                source,
                "char_cnn.max_characters_per_token",
                low=3,
                high=bounds.MAX_CHARACTERS_PER_TOKEN,
                why=" (begin and end of word and at least one byte)",
            ),
        )
        if max(w for w, _ in filters) > char_cnn.max_characters_per_token:
            raise OptionsError(
                f"{source}: a filter is wider ({max(w for w, _ in filters)}) than "
                f"max_characters_per_token ({char_cnn.max_characters_per_token})"
            )
        skip = lstm.get("use_skip_connections", False)
        if not isinstance(skip, bool):
            raise OptionsError(
                f"{source}: lstm.use_skip_connections must be true or false, got {_shown(skip)}"
            )
        lstm_options = LstmOptions(
            dim=_integer(_field(lstm, "dim", source, "lstm"), source, "lstm.dim", high=bounds.MAX_DIM),
            projection_dim=_integer(
                _field(lstm, "projection_dim", source, "lstm"),
                source,
                "lstm.projection_dim",
                high=bounds.MAX_DIM,
            ),
            n_layers=_integer(
                _field(lstm, "n_layers", source, "lstm"), source, "lstm.n_layers", high=bounds.MAX_LAYERS
            ),
            cell_clip=_clip(lstm.get("cell_clip"), source, "lstm.cell_clip"),
            proj_clip=_clip(lstm.get("proj_clip"), source, "lstm.proj_clip"),
            use_skip_connections=skip,
        )
        if lstm_options.projection_dim > lstm_options.dim:
            raise OptionsError(
                f"{source}: lstm.projection_dim ({lstm_options.projection_dim}) is larger than "
                f"lstm.dim ({lstm_options.dim})"
            )
        if char_cnn.n_filters < lstm_options.projection_dim:
            raise OptionsError(
                f"{source}: the char CNN has {char_cnn.n_filters} filters, fewer than "
                f"lstm.projection_dim ({lstm_options.projection_dim})"
            )
        result = cls(lstm=lstm_options, char_cnn=char_cnn)
        bounds.check_model_size(result, source)
        return result

    @classmethod
    def from_file(cls, path: str | Path) -> BiLMOptions:
        """Read options.json (``read_json``: UTF-8, small, plainly nested)."""
        path = Path(path)
        return cls.from_dict(read_json(path), source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """The options.json content, in the original's field names."""
        lstm: dict[str, Any] = {
            "dim": self.lstm.dim,
            "projection_dim": self.lstm.projection_dim,
            "n_layers": self.lstm.n_layers,
            "use_skip_connections": self.lstm.use_skip_connections,
        }
        if self.lstm.cell_clip is not None:
            lstm["cell_clip"] = self.lstm.cell_clip
        if self.lstm.proj_clip is not None:
            lstm["proj_clip"] = self.lstm.proj_clip
        cnn = self.char_cnn
        return {
            "lstm": lstm,
            "char_cnn": {
                "embedding": {"dim": cnn.embedding_dim},
                "filters": [list(f) for f in cnn.filters],
                "n_highway": cnn.n_highway,
                "n_characters": cnn.n_characters,
                "max_characters_per_token": cnn.max_characters_per_token,
                "activation": cnn.activation,
            },
        }

    def save(self, path: str | Path) -> None:
        """Write options.json (atomically)."""
        from ..base.atomic import write_json

        write_json(path, self.to_dict())


def read_json(path: str | Path, what: str = "options file") -> Any:
    """A JSON options file read with ``bounds.read_json``'s guards; problems are OptionsError."""
    return bounds.read_json(path, OptionsError, what)


def _section(options: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    if name not in options:
        raise OptionsError(f"{source}: missing required field {name!r}")
    if not isinstance(options[name], dict):
        raise OptionsError(f"{source}: field {name!r} must be an object")
    return options[name]


def _field(section: dict[str, Any], name: str, source: str, where: str) -> Any:
    if name not in section:
        raise OptionsError(f"{source}: missing required field '{where}.{name}'")
    return section[name]


def _shown(value: Any) -> str:
    """A value as options.json spells it (null, true, "text", 1.5); a long integer by its size."""
    if isinstance(value, int) and not isinstance(value, bool):
        return bounds.shown_number(value)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        try:
            return repr(value)
        except ValueError:  # an integer too long for Python to print, inside a list
            return f"a {type(value).__name__} holding a very long integer"


def _prediction_characters(value: Any) -> Any:
    """bilm-tf trains with ``n_characters`` 261 (ids 0..260) and predicts with 262 (a padding
    row 0 added before the file's 261 rows); its README tells users to change 261 to 262 in a
    training options file before using it, and published models (NLPL's among them) carry
    either. Both mean the same weights, so 261 is read as 262."""
    return 262 if value == 261 and not isinstance(value, bool) else value


def _integer(value: Any, source: str, name: str, low: int = 1, high: int | None = None, why: str = "") -> int:
    """An integer field of at least ``low`` and at most ``high`` (a ceiling of
    ``elmokit.base.bounds``), an integral float such as 16.0 accepted."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise OptionsError(f"{source}: {name} must be an integer of at least {low}{why}, got {_shown(value)}")
    if high is not None and value > high:
        raise OptionsError(f"{source}: {name} must be at most {high:,}, got {_shown(value)}")
    return value


def _clip(value: Any, source: str, name: str, none: str = "absent") -> float | None:
    """A clip: absent or null (no clipping), or a positive finite number (an integer too large
    for a float is refused too). ``none`` says how the file asks for no clipping."""
    if value is None:
        return None
    number = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
    if not 0 < number < math.inf:
        raise OptionsError(
            f"{source}: {name} must be a positive number (or {none} for no clipping), got {_shown(value)}"
        )
    return number


def _filters(value: Any, source: str, name: str) -> tuple[tuple[int, int], ...]:
    """The filters field ``name`` (bilm-tf's char_cnn.filters, ELMoForManyLangs'
    token_embedder.filters): a non-empty list of [width, n_filters] pairs of positive integers,
    within the ceilings of ``elmokit.base.bounds`` (each count, and all of them together)."""
    if isinstance(value, list) and len(value) > bounds.MAX_FILTER_WIDTHS:
        raise OptionsError(
            f"{source}: {name} must have at most {bounds.MAX_FILTER_WIDTHS} [width, n_filters] pairs, "
            f"got {len(value):,}"
        )
    problem = (
        f"{source}: {name} must be a non-empty list of [width, n_filters] pairs of "
        f"positive integers, got {_shown(value)}"
    )
    if not isinstance(value, list) or not value:
        raise OptionsError(problem)
    filters = []
    for pair in value:
        if not isinstance(pair, list) or len(pair) != 2:
            raise OptionsError(problem)
        try:
            width, count = (_integer(v, source, name) for v in pair)
        except OptionsError:
            raise OptionsError(problem) from None
        _integer(width, source, f"a width in {name}", high=bounds.MAX_CHARACTERS_PER_TOKEN)
        _integer(count, source, f"a filter count in {name}", high=bounds.MAX_DIM)
        filters.append((width, count))
    _integer(sum(n for _, n in filters), source, f"the filter counts of {name} together", high=bounds.MAX_DIM)
    return tuple(filters)


ORIGINAL_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]


def _preset(dim: int, projection_dim: int, n_highway: int, filters=ORIGINAL_FILTERS, char_dim=16):
    return {
        "lstm": {
            "dim": dim,
            "projection_dim": projection_dim,
            "n_layers": 2,
            "cell_clip": 3,
            "proj_clip": 3,
            "use_skip_connections": True,
        },
        "char_cnn": {
            "embedding": {"dim": char_dim},
            "filters": filters,
            "n_highway": n_highway,
            "n_characters": 262,
            "max_characters_per_token": 50,
            "activation": "relu",
        },
    }


# The published shapes of AllenNLP's pretrained models, plus a tiny one for tests and smoke runs.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": _preset(64, 16, 1, filters=[[1, 4], [2, 8], [3, 16], [4, 32], [5, 64]], char_dim=4),
    "small": _preset(1024, 128, 1),
    "medium": _preset(2048, 256, 1),
    "original": _preset(4096, 512, 2),
}


def preset(name: str) -> dict[str, Any]:
    """A copy of a named preset's options dict (tiny, small, medium, original)."""
    if name not in PRESETS:
        raise OptionsError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return json.loads(json.dumps(PRESETS[name]))
