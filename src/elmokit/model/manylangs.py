"""ELMoForManyLangs (HIT-SCIR) models as a variant of elmokit's biLM.

A model folder holds ``config.json`` (the trainer's arguments; its ``config_path`` names the
model config), ``char.dic`` and ``word.dic`` (``token<TAB>id`` lines), and ``token_embedder.pkl``
and ``encoder.pkl``: torch state dicts, read with ``torch.load(weights_only=True)`` only, so a
model file can hold tensors but never run code. The published models' ``config_path`` is
``../configs/<name>.json`` (or a path on the authors' machine), a config that ships inside
ELMoForManyLangs' package: elmokit ships copies (``manylangs_configs/``) and looks where its
``Embedder`` looks: the path from the model folder, the file name in the folder, the copies
(for a model in elmokit's cache, a downloaded or unpacked archive, the path only inside it).

``read_manylangs(folder)`` reads a folder into what ``BiLM`` is built from: options, the input
scheme (``ManyLangsInputs``) and the tensors in elmokit's layout; ``BiLM.from_pretrained(folder)``
builds the model (this module does not import ``BiLM``).

What differs from bilm-tf, and where it goes in elmokit's model:
- characters are code points numbered by ``char.dic``, not UTF-8 bytes; a token longer than
  ``max_characters_per_token - 2`` code points keeps its first ones (its word is looked up
  truncated too). A token is ``[<eow>, chars..., <bow>, <pad>...]``: ELMoForManyLangs swaps its
  begin- and end-of-word ids, and the weights were trained so. Sentences are wrapped in the
  tokens ``<bos>`` and ``<eos>`` (their own char.dic entries between the word markers), and a
  token written ``<bos>`` or ``<eos>`` is one of them. Characters and words missing from the
  dictionaries are ``<oov>``. Ids are shifted by +1 (0 = no token) with a zero row added in
  front of each embedding, as elmokit's inputs are.
- the token encoder (``TokenEncoder`` with ``padding_id``, ``word_embedding``,
  ``always_project``): char CNN (the ``<pad>`` character's embedding takes part in the
  max-pool), highway layers (AllenNLP's gate, which multiplies the input: its rows are negated
  into elmokit's carry gate), an optional word embedding concatenated before the highway output,
  and a projection that is always there.
- the LSTM is AllenNLP's ``LstmCellWithProjection`` (``BiLstm``): gates i, f, g, o (reordered to
  elmokit's i, j, f, o), the bias on the hidden side, no forget bias added at run time (1.0 is
  taken off the stored bias, which elmokit's cell adds back), cell and projection clips (0 = none),
  skip connections from the second layer on, always a projection.
- layers for downstream use: the token vector doubled, [x; x], then [forward; backward] per LSTM
  layer, as elmokit's; ``sents2elmo(..., output_layer)``: -2 all layers, -1 their average, k
  layer k (``elmokit.compat.manylangs.ManyLangsEmbedder``).
- its ``Embedder`` never resets its encoder: batch row r starts from the state row r reached in
  the previous batch, from call to call (AllenNLP's ``_EncoderBase``).
  ``BiLM.from_pretrained(folder, stateful=True)`` gives exactly that (``StatefulBiLM``); elmokit's
  ``Embedder(mode="stateful")`` carries states the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..base import bounds
from ..base.tensorfiles import TensorFileError, load_tensors
from ..hub import cache_dir
from ..hub.archives import UNPACKED
from .inputs import InputScheme
from .lstm import FORGET_BIAS
from .options import (
    BiLMOptions,
    CharCNNOptions,
    LstmOptions,
    OptionsError,
    _clip,
    _filters,
    _integer,
    _shown,
)

__all__: list[str] = []

CONFIGS_DIR = Path(__file__).parent.parent / "manylangs_configs"  # copies of the configs of its package
REQUIRED_FILES = ("config.json", "char.dic", "token_embedder.pkl", "encoder.pkl")  # + word.dic
BOUNDARY_TOKENS = ("<bos>", "<eos>")
CHAR_SPECIALS = ("<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>")
WORD_SPECIALS = ("<oov>", "<pad>")
# Every token of a batch, <bos> and <eos> included, must fit with its word markers.
MIN_CHARACTERS_PER_TOKEN = len("<bos>") + 2


class ManyLangsError(ValueError):
    """An ELMoForManyLangs model file that cannot be used, named with the reason."""


# -- what a folder holds ---------------------------------------------------------------------
def model_config_file(folder: Path) -> Path:
    """The model config that ``config.json``'s ``config_path`` names, where ELMoForManyLangs'
    Embedder finds it: relative to the folder (or absolute), its file name in the folder, or its
    file name among the configs of ELMoForManyLangs' package (copied into elmokit).

    A user's own folder keeps that lookup, so its ``config_path`` may name any file. A model in
    elmokit's cache (a downloaded or unpacked archive) is data from anywhere: there the path is
    followed only while it stays inside the unpacked archive (``_archive_root``)."""
    path = folder / "config.json"
    settings = _read_json(path, "ELMoForManyLangs config.json")
    config_path = settings.get("config_path") if isinstance(settings, dict) else None
    if not isinstance(config_path, str) or not config_path:
        raise ManyLangsError(f'{path}: expected a JSON object with a "config_path" string')
    name = config_path.replace("\\", "/").rsplit("/", 1)[-1]
    root = _archive_root(folder)
    candidates = [folder / config_path, folder / name, CONFIGS_DIR / name]
    if root is not None and not _inside(folder / config_path, root):
        candidates.pop(0)
    for candidate in candidates:
        if name and candidate.is_file():
            return candidate
    shipped = ", ".join(sorted(p.name for p in CONFIGS_DIR.glob("*.json")))
    outside = "" if len(candidates) == 3 else f" (elmokit reads no file outside the archive {root})"
    raise FileNotFoundError(
        f"{path}: its model config {config_path!r} is neither at that path from {folder}{outside}, "
        f"nor in the folder, nor one of ELMoForManyLangs' configs ({shipped})"
    )


def _archive_root(folder: Path) -> Path | None:
    """For a folder in elmokit's cache, the unpacked archive it belongs to (the nearest folder
    named ``unpacked``, where ``elmokit.hub`` unpacks archives; else the folder itself);
    None for a folder outside the cache (a user's own)."""
    cache, here = cache_dir().resolve(), folder.resolve()
    if not here.is_relative_to(cache):
        return None
    for parent in (here, *here.parents):
        if parent == cache:
            break
        if parent.name == UNPACKED:
            return parent
    return here


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path``, its links followed, is inside ``root``."""
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a link loop
        return False


@dataclass(frozen=True)
class ManyLangsConfig:
    """What a model config says: elmokit options (``n_characters`` still without the char
    dictionary: set by the loader), the word embedding's size (0: none)."""

    options: BiLMOptions
    word_dim: int
    source: Path


def read_model_config(path: Path) -> ManyLangsConfig:
    """Check and read a model config (``encoder`` "elmo", ``token_embedder`` "cnn"); errors
    name the field and the value found."""
    config = _read_json(path, "ELMoForManyLangs model config")
    source = str(path)
    if not isinstance(config, dict):
        raise OptionsError(f"{source}: expected a JSON object")
    encoder, embedder = _section(config, "encoder", source), _section(config, "token_embedder", source)
    for section, field, wanted in ((encoder, "encoder", "elmo"), (embedder, "token_embedder", "cnn")):
        name = section.get("name")
        if not isinstance(name, str) or name.lower() != wanted:
            raise OptionsError(
                f"{source}: {field}.name must be {wanted!r} (the only kind elmokit reads, that of the "
                f"published models), got {_shown(name)}"
            )

    def integer(
        section: dict[str, Any], where: str, field: str, high: int, low: int = 1, why: str = ""
    ) -> int:
        if field not in section:
            raise OptionsError(f"{source}: missing required field '{where}.{field}'")
        return _integer(section[field], source, f"{where}.{field}", low=low, high=high, why=why)

    char_dim = integer(
        embedder,
        "token_embedder",
        "char_dim",
        bounds.MAX_DIM,
        why=" (a model without characters is not supported)",
    )
    pairs = _filters(embedder.get("filters"), source, "token_embedder.filters")
    activation = embedder.get("activation")
    if activation not in ("relu", "tanh"):
        raise OptionsError(
            f"{source}: token_embedder.activation must be relu or tanh, got {_shown(activation)}"
        )
    max_chars = integer(
        embedder,
        "token_embedder",
        "max_characters_per_token",
        bounds.MAX_CHARACTERS_PER_TOKEN,
        low=MIN_CHARACTERS_PER_TOKEN,
        why=" (<bos> and its word markers)",
    )
    if max(width for width, _ in pairs) > max_chars:
        raise OptionsError(
            f"{source}: a filter is wider ({max(w for w, _ in pairs)}) than max_characters_per_token "
            f"({max_chars})"
        )
    char_cnn = CharCNNOptions(
        embedding_dim=char_dim,
        filters=tuple(pairs),
        n_highway=integer(embedder, "token_embedder", "n_highway", bounds.MAX_HIGHWAY, low=0),
        activation=activation,
        n_characters=1,  # the char dictionary's size + 1, set when it is read
        max_characters_per_token=max_chars,
    )
    lstm = LstmOptions(
        dim=integer(encoder, "encoder", "dim", bounds.MAX_DIM),
        projection_dim=integer(encoder, "encoder", "projection_dim", bounds.MAX_DIM),
        n_layers=integer(encoder, "encoder", "n_layers", bounds.MAX_LAYERS),
        cell_clip=_no_clip_or(encoder.get("cell_clip"), source, "encoder.cell_clip"),
        proj_clip=_no_clip_or(encoder.get("proj_clip"), source, "encoder.proj_clip"),
        use_skip_connections=True,
        always_project=True,
    )
    word_dim = integer(embedder, "token_embedder", "word_dim", bounds.MAX_DIM, low=0)
    return ManyLangsConfig(BiLMOptions(lstm=lstm, char_cnn=char_cnn), word_dim, path)


def read_dictionary(path: Path) -> dict[str, int]:
    """``token<TAB>id`` lines, read as ELMoForManyLangs reads them: each line stripped of
    surrounding whitespace (Unicode line breaks end lines), a line with one field is the
    ideographic space U+3000 (the token of a whitespace character was stripped away), a later
    line of the same token wins."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ManyLangsError(f"{path}: not UTF-8 text (byte {err.start})") from None
    entries: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.strip().split("\t")
        if len(fields) == 1:
            fields.insert(0, "\u3000")
        if len(fields) != 2:
            raise ManyLangsError(f"{path}: line {number} has {len(fields)} tab-separated fields, expected 2")
        try:
            entries[fields[0]] = int(fields[1])
        except ValueError:
            raise ManyLangsError(f"{path}: line {number}: the id {fields[1]!r} is not an integer") from None
    return entries


# -- token -> ids ----------------------------------------------------------------------------
class ManyLangsInputs(InputScheme):
    """ELMoForManyLangs' input scheme: its char and word dictionaries make a token's input ids
    (n_tokens, max_chars [+ 1 word id]), shifted by +1 (0 = no token); sentences are wrapped in
    <bos> and <eos>; the token encoder pads with <pad>, concatenates the word embedding (when
    ``word_dim`` > 0) and always projects."""

    boundary_tokens = BOUNDARY_TOKENS
    always_project = True
    ids_from = "the model's own batch_to_ids (bilm.batch_to_ids(sentences))"
    not_writable = (
        "an ELMoForManyLangs model cannot be written in bilm-tf's layout (its characters are "
        "numbered by its own char.dic, which options.json cannot say)"
    )

    def __init__(
        self, chars: dict[str, int], words: dict[str, int] | None, max_chars: int, word_dim: int = 0
    ) -> None:
        super().__init__(max_chars)
        self.chars, self.words, self.max_chars = chars, words, max_chars
        # ELMoForManyLangs' create_one_batch: `bow_id, eow_id = char2id['<eow>'], char2id['<bow>']`
        self.begin, self.end = chars["<eow>"], chars["<bow>"]
        self.char_oov, self.char_pad = chars["<oov>"], chars["<pad>"]
        self.width = max_chars + (words is not None)
        self.padding_id = self.char_pad + 1
        self.word_embedding = None if words is None else (_rows(words) + 1, word_dim)

    def token_ids(self, tokens: Sequence[str]) -> torch.Tensor:
        """LongTensor (n_tokens, width): each token's shifted char ids [, word id]."""
        rows = []
        chars, oov, limit = self.chars, self.char_oov, self.max_chars - 2
        for token in tokens:
            if not isinstance(token, str):
                raise TypeError(f"a token must be a str, got {type(token).__name__}: {token!r}")
            token = token[:limit]
            body = [chars[token]] if token in BOUNDARY_TOKENS else [chars.get(c, oov) for c in token]
            row = [self.begin, *body, self.end] + [self.char_pad] * (limit - len(body))
            if self.words is not None:
                row.append(self.words.get(token, self.words["<oov>"]))
            rows.append(row)
        return torch.tensor(rows, dtype=torch.long).reshape(len(rows), self.width) + 1


# -- the model -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ManyLangsModel:
    """What an ELMoForManyLangs folder holds, ready for ``BiLM(options, inputs)`` and its
    ``load_state_dict(tensors)``: every parameter, in elmokit's layout."""

    options: BiLMOptions
    inputs: ManyLangsInputs
    tensors: dict[str, torch.Tensor]


def read_manylangs(folder: Path) -> ManyLangsModel:
    """Read an ELMoForManyLangs model folder (``BiLM.from_pretrained(folder)`` builds the model
    from it). Errors are one line: a missing file is named, as is a weight, dictionary entry or
    config field that does not fit."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no ELMoForManyLangs model folder {folder}")
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"ELMoForManyLangs model folder {folder} has no {', '.join(missing)}")
    config = read_model_config(model_config_file(folder))
    chars = _dictionary(folder / "char.dic", CHAR_SPECIALS, bounds.MAX_CHARACTERS)
    words = None
    if config.word_dim > 0:
        if not (folder / "word.dic").is_file():
            raise FileNotFoundError(
                f"ELMoForManyLangs model folder {folder} has no word.dic (its config {config.source.name} "
                f"has word_dim {config.word_dim})"
            )
        words = _dictionary(folder / "word.dic", WORD_SPECIALS, bounds.MAX_WORDS)
    cnn = replace(config.options.char_cnn, n_characters=_rows(chars) + 1)
    options = replace(config.options, char_cnn=cnn)
    word_embedding = None if words is None else (_rows(words) + 1, config.word_dim)
    bounds.check_model_size(options, str(config.source), word_embedding)
    token_embedder = _state_dict(folder / "token_embedder.pkl", _token_embedder_shapes(config))
    encoder = _state_dict(folder / "encoder.pkl", _encoder_shapes(config))
    _check_rows(folder / "char.dic", chars, token_embedder["char_emb_layer.embedding.weight"], "char")
    if words is not None:
        _check_rows(folder / "word.dic", words, token_embedder["word_emb_layer.embedding.weight"], "word")
    inputs = ManyLangsInputs(chars, words, cnn.max_characters_per_token, config.word_dim)
    return ManyLangsModel(options, inputs, _elmokit_tensors(options, token_embedder, encoder))


# -- weights ---------------------------------------------------------------------------------
def _token_embedder_shapes(config: ManyLangsConfig) -> dict[str, tuple[int, ...]]:
    """The tensors token_embedder.pkl must hold (ConvTokenEmbedder's names) and their shapes;
    embedding rows are -1 (the dictionary's size, checked with it)."""
    cnn = config.options.char_cnn
    n_filters = cnn.n_filters
    shapes: dict[str, tuple[int, ...]] = {}
    if config.word_dim > 0:
        shapes["word_emb_layer.embedding.weight"] = (-1, config.word_dim)
    shapes["char_emb_layer.embedding.weight"] = (-1, cnn.embedding_dim)
    for k, (width, n) in enumerate(cnn.filters):
        shapes[f"convolutions.{k}.weight"] = (n, cnn.embedding_dim, width)
        shapes[f"convolutions.{k}.bias"] = (n,)
    for k in range(cnn.n_highway):
        shapes[f"highways._layers.{k}.weight"] = (2 * n_filters, n_filters)
        shapes[f"highways._layers.{k}.bias"] = (2 * n_filters,)
    projection_dim = config.options.lstm.projection_dim
    shapes["projection.weight"] = (projection_dim, config.word_dim + n_filters)
    shapes["projection.bias"] = (projection_dim,)
    return shapes


def _encoder_shapes(config: ManyLangsConfig) -> dict[str, tuple[int, ...]]:
    """The tensors encoder.pkl must hold (ElmobiLm's names) and their shapes."""
    lstm = config.options.lstm
    shapes: dict[str, tuple[int, ...]] = {}
    for k in range(lstm.n_layers):
        for direction in ("forward", "backward"):
            cell = f"{direction}_layer_{k}"
            shapes[f"{cell}.input_linearity.weight"] = (4 * lstm.dim, lstm.projection_dim)
            shapes[f"{cell}.state_linearity.weight"] = (4 * lstm.dim, lstm.projection_dim)
            shapes[f"{cell}.state_linearity.bias"] = (4 * lstm.dim,)
            shapes[f"{cell}.state_projection.weight"] = (lstm.projection_dim, lstm.dim)
    return shapes


def _state_dict(path: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """A torch state dict read with ``weights_only=True`` (tensors and plain containers only,
    never code), holding exactly the tensors of ``shapes`` (-1: any size), finite, as float32."""
    try:
        state = load_tensors(path)
    except TensorFileError as err:
        raise ManyLangsError(str(err)) from None
    if not isinstance(state, dict):
        raise ManyLangsError(
            f"{path}: expected a state dict (names -> tensors), found {type(state).__name__}"
        )
    unexpected = [key for key in state if key not in shapes]
    missing = [key for key in shapes if key not in state]
    if missing or unexpected:
        what = f"no {missing[0]!r}" if missing else f"an unexpected entry {unexpected[0]!r}"
        raise ManyLangsError(f"{path}: has {what} for the model its config describes")
    tensors = {}
    for key, shape in shapes.items():
        value = state[key]
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            kind = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
            raise ManyLangsError(f"{path}: {key} is {kind}, not a floating-point tensor")
        if value.dim() != len(shape) or any(want not in (-1, got) for want, got in zip(shape, value.shape)):
            expected = "(" + ", ".join("n" if d == -1 else str(d) for d in shape) + ")"
            raise ManyLangsError(f"{path}: {key} has shape {tuple(value.shape)}, the config gives {expected}")
        if not bool(torch.isfinite(value).all()):
            raise ManyLangsError(f"{path}: {key} holds NaN or infinity")
        tensors[key] = value.float()
    return tensors


def _check_rows(path: Path, entries: dict[str, int], embedding: torch.Tensor, what: str) -> None:
    """The embedding has a row for each entry (ELMoForManyLangs sizes it by the dictionary) and
    every id is one of its rows."""
    rows = embedding.shape[0]
    if rows != _rows(entries):
        raise ManyLangsError(
            f"{path}: {len(entries)} entries (ids up to {_rows(entries) - 1}), but the {what} "
            f"embedding has {rows} rows"
        )


def _elmokit_tensors(
    options: BiLMOptions, embedder: dict[str, torch.Tensor], encoder: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """ELMoForManyLangs' tensors in elmokit's layout: ``BiLM``'s state dict names (see the module
    docstring)."""
    chars = _with_zero_row(embedder["char_emb_layer.embedding.weight"])
    tensors = {"token_encoder.char_cnn.embedding.weight": chars}
    for k in range(len(options.char_cnn.filters)):
        for name in ("weight", "bias"):
            tensors[f"token_encoder.char_cnn.convolutions.{k}.{name}"] = embedder[f"convolutions.{k}.{name}"]
    n = options.char_cnn.n_filters
    for k in range(options.char_cnn.n_highway):
        # AllenNLP: y = g * x + (1 - g) * relu(W[:n] x), g = sigmoid(W[n:] x); elmokit's carry
        # gate multiplies the transform: 1 - sigmoid(z) = sigmoid(-z)
        weight, bias = embedder[f"highways._layers.{k}.weight"], embedder[f"highways._layers.{k}.bias"]
        tensors[f"token_encoder.highway.carry.{k}.weight"] = -weight[n:]
        tensors[f"token_encoder.highway.carry.{k}.bias"] = -bias[n:]
        tensors[f"token_encoder.highway.transform.{k}.weight"] = weight[:n]
        tensors[f"token_encoder.highway.transform.{k}.bias"] = bias[:n]
    if "word_emb_layer.embedding.weight" in embedder:
        words = _with_zero_row(embedder["word_emb_layer.embedding.weight"])
        tensors["token_encoder.word_embedding.weight"] = words
    tensors["token_encoder.projection.weight"] = embedder["projection.weight"]
    tensors["token_encoder.projection.bias"] = embedder["projection.bias"]
    dim = options.lstm.dim
    for k in range(options.lstm.n_layers):
        cells = [f"{direction}_layer_{k}" for direction in ("forward", "backward")]
        biases = []
        for cell in cells:
            bias = _gates(encoder[f"{cell}.state_linearity.bias"])
            bias[2 * dim : 3 * dim] -= FORGET_BIAS  # elmokit's cell adds it back
            biases.append(bias)
        layer = f"lstm.layers.{k}"
        tensors[f"{layer}.weight_input"] = torch.stack(
            [_gates(encoder[f"{cell}.input_linearity.weight"]).T for cell in cells]
        )
        tensors[f"{layer}.weight_hidden"] = torch.stack(
            [_gates(encoder[f"{cell}.state_linearity.weight"]).T for cell in cells]
        )
        tensors[f"{layer}.bias"] = torch.stack(biases)
        tensors[f"{layer}.weight_projection"] = torch.stack(
            [encoder[f"{cell}.state_projection.weight"].T for cell in cells]
        )
    return tensors


def _gates(tensor: torch.Tensor) -> torch.Tensor:
    """AllenNLP's gate blocks (i, f, g, o) along dim 0 -> elmokit's (i, j = g, f, o)."""
    i, f, g, o = tensor.chunk(4, dim=0)
    return torch.cat([i, g, f, o])


def _with_zero_row(embedding: torch.Tensor) -> torch.Tensor:
    return torch.cat([embedding.new_zeros(1, embedding.shape[1]), embedding])


# -- helpers ---------------------------------------------------------------------------------
def _read_json(path: Path, what: str) -> Any:
    """A config, read with the guards of ``bounds.read_json``."""
    return bounds.read_json(path, ManyLangsError, what)


def _section(config: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    if not isinstance(config.get(name), dict):
        raise OptionsError(f"{source}: missing required object {name!r}")
    return config[name]


def _no_clip_or(value: Any, source: str, name: str) -> float | None:
    """A clip as ELMoForManyLangs reads it: absent, null, false or 0 = no clipping."""
    if value is None or value is False or value == 0:
        return None
    return _clip(value, source, name, none="0")


def _dictionary(path: Path, specials: tuple[str, ...], high: int) -> dict[str, int]:
    """A dictionary with its special entries, every id from 0 to below ``high``."""
    entries = read_dictionary(path)
    absent = [token for token in specials if token not in entries]
    if absent:
        raise ManyLangsError(f"{path}: has no entry for {', '.join(absent)}")
    negative = next((token for token, i in entries.items() if i < 0), None)
    if negative is not None:
        raise ManyLangsError(f"{path}: {negative!r} has a negative id ({entries[negative]})")
    largest = max(entries.values())
    if largest >= high:
        token = next(token for token, i in entries.items() if i == largest)
        raise ManyLangsError(
            f"{path}: the id of {token!r} ({bounds.shown_number(largest)}) is not below {high:,}"
        )
    return entries


def _rows(entries: dict[str, int]) -> int:
    """The embedding rows a dictionary needs: ELMoForManyLangs makes one per entry, and every id
    must be one of them."""
    return max(len(entries), max(entries.values(), default=-1) + 1)
