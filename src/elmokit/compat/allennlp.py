"""AllenNLP 0.9's ELMo API on elmokit: the names, signatures, outputs and stateful behaviour of
``allennlp.modules.elmo`` (``Elmo``, ``batch_to_ids``, ``_ElmoBiLm``) and
``allennlp.commands.elmo`` (``ElmoEmbedder``, the ``allennlp elmo`` command), so that switching
is one import::

    from elmokit.compat.allennlp import Elmo, ElmoEmbedder, batch_to_ids

Everything is stateful exactly as AllenNLP's ``_ElmoBiLm``: each batch row's final LSTM states
are that row's initial states in the next call, rows beyond a smaller batch keep theirs, and the
first call starts from zeros (``elmokit.CarriedState``). elmokit's own ``Embedder`` is
deterministic by default instead; use these classes to get AllenNLP's numbers.
``elmo._elmo_lstm._elmo_lstm.stateful = False`` makes every call start from zeros, as in
AllenNLP (other attributes set there are refused). Also: ``ElmoTokenEmbedder``, ``ScalarMix``
(AllenNLP's parameter layout: ``scalar_parameters.0`` ..., ``gamma`` of shape (1,)),
``ELMoCharacterMapper``, ``ELMoTokenCharactersIndexer``, ``add_sentence_boundary_token_ids``.
A state dict saved from AllenNLP 0.9's ``Elmo`` (or a model holding one) loads into ``Elmo``
with ``load_state_dict``: its biLM keys are converted to elmokit's.

Also kept from AllenNLP: masks are int64 tensors (0/1); an empty sentence embeds as
``numpy.zeros((3, 0, 1024))`` (float64, 1024 whatever the model's size); ``embed_file`` refuses
blank lines and writes dataset ``"i"`` per line plus ``"sentence_to_index"``. Different: files
are local paths or URLs (downloaded into elmokit's cache, verified; see elmokit.hub), and every
class also takes any model elmokit resolves (a name, a folder, an NLPL .zip, a URL, ``hf://``) as
``options_file`` with ``weight_file=None``; the output file is written atomically, and errors
are one line.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch
from torch import nn

from ..base.atomic import check_output
from ..base.textfiles import check_input, count_lines, read_lines
from ..embed.runners import evaluating
from ..embed.vectors_file import output_array, write_vectors
from ..hub.file_kinds import sniff
from ..model.bilm import BiLM, BiLMOutput, CarriedState
from ..model.characters import (
    BEGIN_OF_SENTENCE_CHAR,
    BEGIN_OF_WORD_CHAR,
    BOS_TOKEN,
    END_OF_SENTENCE_CHAR,
    END_OF_WORD_CHAR,
    EOS_TOKEN,
    PADDING_CHAR,
    token_to_ids,
)
from ..model.lstm import LstmState
from ..model.scalar_mix import mix_layers
from ..model.weights import _bilm_table, lstm_cell_prefix
from .files import load_bilm

logger = logging.getLogger(__name__)

DEFAULT_OPTIONS_FILE = (
    "https://allennlp.s3.amazonaws.com/models/elmo/2x4096_512_2048cnn_2xhighway/"
    "elmo_2x4096_512_2048cnn_2xhighway_options.json"
)
DEFAULT_WEIGHT_FILE = (
    "https://allennlp.s3.amazonaws.com/models/elmo/2x4096_512_2048cnn_2xhighway/"
    "elmo_2x4096_512_2048cnn_2xhighway_weights.hdf5"
)
DEFAULT_BATCH_SIZE = 64
MAX_CHARACTERS_PER_TOKEN = 50  # AllenNLP's ELMoCharacterMapper.max_word_length

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_OPTIONS_FILE",
    "DEFAULT_WEIGHT_FILE",
    "ConfigurationError",
    "ELMoCharacterMapper",
    "ELMoTokenCharactersIndexer",
    "Elmo",
    "ElmoEmbedder",
    "ElmoTokenEmbedder",
    "ScalarMix",
    "add_sentence_boundary_token_ids",
    "batch_to_ids",
    "elmo_command",
    "empty_embedding",
    "remove_sentence_boundaries",
]

# What the modules ``allennlp.modules.elmo`` and ``allennlp.commands.elmo`` hold when
# ``elmokit.compat.install_allennlp_modules()`` makes them importable.
MODULES_ELMO_NAMES = (
    "Elmo",
    "_ElmoBiLm",
    "batch_to_ids",
    "ConfigurationError",
    "ELMoCharacterMapper",
    "ELMoTokenCharactersIndexer",
    "remove_sentence_boundaries",
    "add_sentence_boundary_token_ids",
)
COMMANDS_ELMO_NAMES = (
    "ElmoEmbedder",
    "DEFAULT_OPTIONS_FILE",
    "DEFAULT_WEIGHT_FILE",
    "DEFAULT_BATCH_SIZE",
    "empty_embedding",
    "elmo_command",
    "batch_to_ids",
    "_ElmoBiLm",
    "remove_sentence_boundaries",
    "ConfigurationError",
)
# The other modules that install_allennlp_modules() provides: only their ELMo-related names.
MODULES_NAMES = ("Elmo", "ScalarMix")  # allennlp.modules
SCALAR_MIX_NAMES = ("ScalarMix",)
TOKEN_EMBEDDERS_NAMES = ("ElmoTokenEmbedder",)
TOKEN_INDEXERS_NAMES = ("ELMoTokenCharactersIndexer",)
ELMO_INDEXER_NAMES = ("ELMoCharacterMapper", "ELMoTokenCharactersIndexer")
NN_UTIL_NAMES = ("remove_sentence_boundaries", "add_sentence_boundary_token_ids")


class ConfigurationError(ValueError):
    """AllenNLP's error for bad input or configuration (a ValueError here)."""


# -- character ids ----------------------------------------------------------------------------
def _token_ids(token: str) -> tuple[int, ...]:
    if token == "":  # AllenNLP encodes an empty token as a word of no bytes
        ids = [PADDING_CHAR] * MAX_CHARACTERS_PER_TOKEN
        ids[:2] = [BEGIN_OF_WORD_CHAR, END_OF_WORD_CHAR]
        return tuple(ids)
    return token_to_ids(token, MAX_CHARACTERS_PER_TOKEN)


def batch_to_ids(batch: Sequence[Sequence[str]]) -> torch.Tensor:
    """Character ids of tokenized sentences: LongTensor (len(batch), longest sentence, 50),
    shifted by +1, all-zero rows past each sentence's end; as AllenNLP's ``batch_to_ids``.

    A sentence is any sequence of str tokens (a str is a sequence of one-character tokens, as in
    AllenNLP: SeqVec passes ``list(protein)``); an empty token is a word without bytes."""
    if isinstance(batch, str) or not isinstance(batch, Sequence):
        raise TypeError("batch must be a list of tokenized sentences, e.g. [['Hello', 'world']]")
    if len(batch) == 0:
        raise ValueError("empty batch: give at least one sentence")
    sentences = [list(sentence) for sentence in batch]
    out = torch.zeros(len(sentences), max(map(len, sentences)), MAX_CHARACTERS_PER_TOKEN, dtype=torch.long)
    for i, sentence in enumerate(sentences):
        for j, token in enumerate(sentence):
            if not isinstance(token, str):
                raise TypeError(f"sentence {i}, token {j} is a {type(token).__name__}, not a str: {token!r}")
        if sentence:
            out[i, : len(sentence)] = torch.tensor([_token_ids(t) for t in sentence]) + 1
    return out


def remove_sentence_boundaries(tensor: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, timesteps, dim) with ``<S>`` ... ``</S>`` and its mask (batch, timesteps) -> (batch,
    timesteps - 2, dim) without them, zero past each sentence, and the int64 mask (batch,
    timesteps - 2); as AllenNLP's ``allennlp.nn.util.remove_sentence_boundaries``."""
    lengths = mask.long().sum(dim=1)
    width = tensor.shape[1] - 2
    keep = torch.arange(width, device=tensor.device).unsqueeze(0) < (lengths - 2).unsqueeze(1)
    inner = tensor[:, 1:-1]
    return torch.where(keep.unsqueeze(-1), inner, inner.new_zeros(())), keep.long()


def add_sentence_boundary_token_ids(
    tensor: torch.Tensor, mask: torch.Tensor, sentence_begin_token: Any, sentence_end_token: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, timesteps) or (batch, timesteps, dim) -> the same with ``sentence_begin_token``
    first and ``sentence_end_token`` after each sentence (timesteps + 2), and the new int64 mask;
    as AllenNLP's ``allennlp.nn.util.add_sentence_boundary_token_ids`` (the mask of 2-D input:
    nonzero ids; of 3-D input: rows with a positive value)."""
    if tensor.dim() not in (2, 3):
        raise ValueError("add_sentence_boundary_token_ids only accepts 2D and 3D input")
    lengths = mask.long().sum(dim=1).tolist()
    shape = list(tensor.shape)
    shape[1] += 2
    out = tensor.new_zeros(*shape)
    out[:, 1:-1] = tensor
    out[:, 0] = sentence_begin_token
    for i, length in enumerate(lengths):
        out[i, length + 1] = sentence_end_token
    if tensor.dim() == 2:
        return out, (out != 0).long()
    return out, ((out > 0).long().sum(dim=-1) > 0).long()


class ELMoCharacterMapper:
    """AllenNLP's ``ELMoCharacterMapper``: a token -> its 50 character ids, shifted by +1.
    ``tokens_to_add``: {token: id} for special tokens, encoded as that one character."""

    max_word_length = MAX_CHARACTERS_PER_TOKEN
    beginning_of_sentence_character = BEGIN_OF_SENTENCE_CHAR
    end_of_sentence_character = END_OF_SENTENCE_CHAR
    beginning_of_word_character = BEGIN_OF_WORD_CHAR
    end_of_word_character = END_OF_WORD_CHAR
    padding_character = PADDING_CHAR
    beginning_of_sentence_characters = list(token_to_ids(BOS_TOKEN, MAX_CHARACTERS_PER_TOKEN))
    end_of_sentence_characters = list(token_to_ids(EOS_TOKEN, MAX_CHARACTERS_PER_TOKEN))
    bos_token = BOS_TOKEN
    eos_token = EOS_TOKEN

    def __init__(self, tokens_to_add: dict[str, int] | None = None) -> None:
        self.tokens_to_add = tokens_to_add or {}

    def convert_word_to_char_ids(self, word: str) -> list[int]:
        """The shifted ids (1..261) of ``word``."""
        if word in self.tokens_to_add:
            ids = [PADDING_CHAR] * MAX_CHARACTERS_PER_TOKEN
            ids[:3] = [BEGIN_OF_WORD_CHAR, self.tokens_to_add[word], END_OF_WORD_CHAR]
        else:
            ids = list(_token_ids(word))
        return [c + 1 for c in ids]

    def __eq__(self, other: object) -> bool:
        if isinstance(self, other.__class__):
            return self.__dict__ == other.__dict__
        return NotImplemented


class ELMoTokenCharactersIndexer:
    """AllenNLP's ``ELMoTokenCharactersIndexer`` (``"elmo_characters"`` in configurations): the
    character ids of tokens (objects with ``.text``, as AllenNLP's ``Token``, or str), padded
    with all-zero rows. Only the indexer; AllenNLP's data pipeline is not provided."""

    def __init__(
        self,
        namespace: str = "elmo_characters",
        tokens_to_add: dict[str, int] | None = None,
        token_min_padding_length: int = 0,
    ) -> None:
        self._namespace = namespace
        self._mapper = ELMoCharacterMapper(tokens_to_add)
        self._token_min_padding_length = token_min_padding_length

    def count_vocab_items(self, token: Any, counter: dict[str, dict[str, int]]) -> None:
        """Nothing to count: characters need no vocabulary."""

    def tokens_to_indices(
        self, tokens: Sequence[Any], vocabulary: Any, index_name: str
    ) -> dict[str, list[list[int]]]:
        """{index_name: one list of 50 ids per token}."""
        texts: list[str] = []
        for token in tokens:
            text = token if isinstance(token, str) else getattr(token, "text", None)
            if text is None:
                raise ConfigurationError("ELMoTokenCharactersIndexer needs a tokenizer that retains text")
            texts.append(text)
        return {index_name: [self._mapper.convert_word_to_char_ids(text) for text in texts]}

    def get_padding_lengths(self, token: list[int]) -> dict[str, int]:
        return {}

    def get_token_min_padding_length(self) -> int:
        return self._token_min_padding_length

    def get_keys(self, index_name: str) -> list[str]:
        return [index_name]

    def as_padded_tensor(
        self,
        tokens: dict[str, list[list[int]]],
        desired_num_tokens: dict[str, int],
        padding_lengths: dict[str, int],
    ) -> dict[str, torch.Tensor]:
        """Each list cut or padded (all-zero rows) to ``desired_num_tokens[key]`` tokens:
        LongTensor (tokens, 50)."""
        out = {}
        for key, rows in tokens.items():
            n = desired_num_tokens[key]
            rows = list(rows[:n]) + [[0] * MAX_CHARACTERS_PER_TOKEN] * max(0, n - len(rows))
            out[key] = torch.tensor(rows, dtype=torch.long).reshape(n, MAX_CHARACTERS_PER_TOKEN)
        return out

    def __eq__(self, other: object) -> bool:
        if isinstance(self, other.__class__):
            return self.__dict__ == other.__dict__
        return NotImplemented


def empty_embedding() -> np.ndarray:
    """What AllenNLP's ElmoEmbedder returns for an empty sentence: zeros (3, 0, 1024), float64."""
    return np.zeros((3, 0, 1024))


def _lazy_groups_of(iterator: Iterator[Any], group_size: int) -> Iterator[list[Any]]:
    return iter(lambda: list(islice(iterator, 0, group_size)), [])


# -- the scalar mix ----------------------------------------------------------------------------
class ScalarMix(nn.Module):
    """AllenNLP's ``ScalarMix``: ``gamma * sum_k softmax(w)_k * tensor_k``, with AllenNLP's
    parameters: ``scalar_parameters`` a ParameterList of ``mixture_size`` tensors of shape (1,),
    ``gamma`` of shape (1,), so state-dict keys are ``scalar_parameters.0`` ... and ``gamma``.
    ``trainable`` applies to both. Also loads the layout of elmokit 0.x's compat mix (one
    ``scalar_parameters`` tensor, a 0-d ``gamma``)."""

    def __init__(
        self,
        mixture_size: int,
        do_layer_norm: bool = False,
        initial_scalar_parameters: Sequence[float] | None = None,
        trainable: bool = True,
    ) -> None:
        super().__init__()
        if initial_scalar_parameters is None:
            initial_scalar_parameters = [0.0] * mixture_size
        elif len(initial_scalar_parameters) != mixture_size:
            raise ConfigurationError(
                f"Length of initial_scalar_parameters {list(initial_scalar_parameters)} differs from "
                f"mixture_size {mixture_size}"
            )
        self.mixture_size = mixture_size
        self.do_layer_norm = do_layer_norm
        self.scalar_parameters = nn.ParameterList(
            nn.Parameter(torch.tensor([float(v)]), requires_grad=trainable) for v in initial_scalar_parameters
        )
        self.gamma = nn.Parameter(torch.tensor([1.0]), requires_grad=trainable)

    def forward(self, tensors: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mixture_size`` tensors of one shape (and the mask, for layer norm) -> their mix."""
        if len(tensors) != self.mixture_size:
            raise ConfigurationError(
                f"{len(tensors)} tensors were passed, but the module was initialized to mix "
                f"{self.mixture_size} tensors."
            )
        return mix_layers(
            tensors, torch.cat(list(self.scalar_parameters)), self.gamma, mask, self.do_layer_norm
        )

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        packed = state_dict.get(prefix + "scalar_parameters")
        if packed is not None and packed.dim() == 1 and len(packed) == self.mixture_size:
            del state_dict[prefix + "scalar_parameters"]
            for k, value in enumerate(packed):
                state_dict[f"{prefix}scalar_parameters.{k}"] = value.reshape(1)
        gamma = state_dict.get(prefix + "gamma")
        if gamma is not None and gamma.dim() == 0:
            state_dict[prefix + "gamma"] = gamma.reshape(1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


# -- the stateful biLM ------------------------------------------------------------------------
class _CarriedLstmStates:
    """What ``_ElmoBiLm._elmo_lstm`` is in AllenNLP, as far as users touch it:
    ``reset_states()``, ``_states``, the carried (h, c) in AllenNLP's layout, h (n_layers,
    batch, 2 * projection_dim) and c (n_layers, batch, 2 * dim), forward then backward, and
    ``stateful``: True (AllenNLP's default) carries each row's states into the next call; False
    (the recipe ``elmo._elmo_lstm._elmo_lstm.stateful = False``) starts every call from zeros and
    leaves the carried states as they are. Setting any other attribute raises AttributeError:
    here it would change nothing (the weights are ``_ElmoBiLm.bilm``'s)."""

    _SETTABLE = ("stateful", "_states", "carried")

    def __init__(self) -> None:
        self.carried = CarriedState()
        self.stateful = True

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._SETTABLE:
            raise AttributeError(
                f"_elmo_lstm._elmo_lstm.{name} cannot be set on elmokit's AllenNLP-compatible ELMo: "
                "only stateful, _states and reset_states() act there (the biLM is _elmo_lstm.bilm)"
            )
        if name == "stateful":
            if not isinstance(value, (bool, int)) or isinstance(value, int) and value not in (0, 1):
                raise TypeError(f"stateful must be True or False, got {value!r}")
            value = bool(value)
        object.__setattr__(self, name, value)

    def reset_states(self) -> None:
        """Forget the carried states: the next call starts from zeros."""
        self.carried.reset()

    @property
    def _states(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        state = self.carried.state
        if state is None:
            return None
        n_layers, _, batch, _ = state.h.shape
        return tuple(t.permute(0, 2, 1, 3).reshape(n_layers, batch, -1) for t in state)  # type: ignore[return-value]

    @_states.setter
    def _states(self, value: Sequence[torch.Tensor] | None) -> None:
        if value is None:
            self.carried.reset()
            return
        h, c = value
        n_layers, batch = h.shape[:2]
        self.carried.state = LstmState(
            *(t.reshape(n_layers, batch, 2, -1).permute(0, 2, 1, 3).contiguous() for t in (h, c))
        )


def _swap_gates(t: torch.Tensor, cell: int, key: str) -> torch.Tensor:
    """AllenNLP's gate order (i, f, j, o) <-> TensorFlow's (i, j, f, o) along dim 0."""
    if t.shape[0] != 4 * cell:
        raise ValueError(
            f"cannot load this AllenNLP checkpoint into ELMo: {key} has shape {tuple(t.shape)}, the "
            f"model's options imply {4 * cell} rows (4 gates of {cell} cells)"
        )
    i, a, b, o = t.split(cell)
    return torch.cat([i, b, a, o])


LINEARITIES = ("input_linearity.weight", "state_linearity.weight")


def _allennlp_datasets(state: dict[str, torch.Tensor], prefix: str, bilm: BiLM) -> dict[str, torch.Tensor]:
    """The biLM of a state dict saved from AllenNLP's ``_ElmoBiLm`` (keys ``prefix +
    "_token_embedder..."`` and ``"_elmo_lstm..."``) in the original weight file's layout
    {dataset name: value}, the inverse of AllenNLP's loading from that file."""
    options = bilm.options
    cnn, lstm = options.char_cnn, options.lstm
    n_filters = sum(n for _, n in cnn.filters)
    tokens, lstms = prefix + "_token_embedder.", prefix + "_elmo_lstm."

    def get(key: str) -> torch.Tensor:
        if key not in state:
            raise KeyError(f"the AllenNLP ELMo state dict has no {key!r}")
        return state[key].detach().to("cpu", torch.float32)

    out = {"char_embed": get(tokens + "_char_embedding_weights")[1:]}
    for k in range(len(cnn.filters)):
        out[f"CNN/W_cnn_{k}"] = get(f"{tokens}char_conv_{k}.weight").permute(2, 1, 0).unsqueeze(0)
        out[f"CNN/b_cnn_{k}"] = get(f"{tokens}char_conv_{k}.bias")
    for k in range(cnn.n_highway):
        # AllenNLP: one Linear of [transform; -carry] (its gate is 1 - bilm-tf's)
        weight, bias = (
            get(f"{tokens}_highways._layers.{k}.weight"),
            get(f"{tokens}_highways._layers.{k}.bias"),
        )
        out[f"CNN_high_{k}/W_transform"], out[f"CNN_high_{k}/W_carry"] = (
            weight[:n_filters].t(),
            -weight[n_filters:].t(),
        )
        out[f"CNN_high_{k}/b_transform"], out[f"CNN_high_{k}/b_carry"] = bias[:n_filters], -bias[n_filters:]
    if tokens + "_projection.weight" in state:
        out["CNN_proj/W_proj"] = get(tokens + "_projection.weight").t()
        out["CNN_proj/b_proj"] = get(tokens + "_projection.bias")
    for k in range(lstm.n_layers):
        for d, direction in enumerate(("forward", "backward")):
            layer = f"{lstms}{direction}_layer_{k}."
            cell = lstm_cell_prefix(d, k, lstm.n_layers)
            kernel = torch.cat(
                [_swap_gates(get(layer + name), lstm.dim, layer + name) for name in LINEARITIES], dim=1
            )
            bias_key = layer + "state_linearity.bias"
            bias = _swap_gates(get(bias_key), lstm.dim, bias_key).clone()
            bias[2 * lstm.dim : 3 * lstm.dim] -= 1.0  # AllenNLP folds TensorFlow's forget bias in
            out[f"{cell}/W_0"], out[f"{cell}/B"] = kernel.t(), bias
            out[f"{cell}/W_P_0"] = get(layer + "state_projection.weight").t()
    return out


def _load_allennlp_bilm(state: dict[str, torch.Tensor], prefix: str, bilm: BiLM) -> dict[str, torch.Tensor]:
    """elmokit's ``bilm`` parameters {name: value} from an AllenNLP ``_ElmoBiLm`` state dict,
    through the original file layout (elmokit's table of it, checked shape by shape)."""
    try:
        datasets = _allennlp_datasets(state, prefix, bilm)
    except KeyError as err:
        raise ValueError(f"cannot load this AllenNLP checkpoint into ELMo: {err.args[0]}") from None
    params = {name: p.detach().clone() for name, p in bilm.named_parameters()}
    for entry in _bilm_table(bilm.options):
        tensors = [params[name] for name in entry.params]
        if entry.direction is not None:
            tensors = [t[entry.direction] for t in tensors]
        expected = tuple(entry.transform.to_file(tensors).shape)
        value = datasets.get(entry.name)
        if value is None or tuple(value.shape) != expected:
            found = "nothing" if value is None else f"shape {tuple(value.shape)}"
            raise ValueError(
                f"cannot load this AllenNLP checkpoint into ELMo: {entry.name} of its biLM is {found}, "
                f"the model's options imply {expected}"
            )
        with torch.no_grad():
            for tensor, part in zip(tensors, entry.transform.from_file(value, tensors)):
                tensor.copy_(part)
    return params


class _ElmoBiLm(nn.Module):
    """The pretrained biLM, stateful as AllenNLP's ``_ElmoBiLm``.

    ``forward(inputs, word_inputs=None)``: char ids (batch, timesteps, 50) -> dict
    ``activations``: num_layers tensors (batch, timesteps + 2, 2 * projection_dim) with <S> and
    </S>, layer 0 the token vectors duplicated; ``mask``: int64 (batch, timesteps + 2).
    ``vocab_to_cache``: words whose token vectors are computed once; then ``word_inputs``
    (batch, timesteps) of indices into it (0 = padding) are used instead of the characters.
    ``bilm=`` wraps an elmokit ``BiLM`` instead of loading files (it is never changed).
    """

    _bos_embedding: torch.Tensor  # buffers (projection_dim,) of the cached vocabulary's <S>, </S>
    _eos_embedding: torch.Tensor

    def __init__(
        self,
        options_file: str | os.PathLike | None,
        weight_file: str | os.PathLike | None,
        requires_grad: bool = False,
        vocab_to_cache: list[str] | None = None,
        *,
        bilm: BiLM | None = None,
    ) -> None:
        super().__init__()
        if bilm is None:
            bilm = load_bilm(options_file, weight_file).requires_grad_(requires_grad)
        elif options_file is not None or weight_file is not None:
            raise ConfigurationError("give options_file and weight_file, or bilm=, not both")
        self.bilm = bilm
        self._requires_grad = requires_grad
        self._elmo_lstm = _CarriedLstmStates()
        self.num_layers = bilm.num_layers
        self._word_embedding: nn.Parameter | None = None
        if vocab_to_cache:
            if requires_grad:
                logger.warning(
                    "You are fine tuning ELMo and caching char CNN word vectors; tokens not in the "
                    "cache are computed from their characters"
                )
            self.create_cached_cnn_embeddings(vocab_to_cache)

    def get_output_dim(self) -> int:
        """2 * projection_dim."""
        return self.bilm.output_dim

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        """Also load what AllenNLP 0.9's ``_ElmoBiLm`` saved (``_token_embedder.*``,
        ``_elmo_lstm.*``, ``_word_embedding.weight``), converted to elmokit's biLM."""
        theirs = [
            k for k in state_dict if k.startswith((prefix + "_token_embedder.", prefix + "_elmo_lstm."))
        ]
        if theirs:
            for name, value in _load_allennlp_bilm(state_dict, prefix, self.bilm).items():
                state_dict[f"{prefix}bilm.{name}"] = value
            for key in theirs:
                del state_dict[key]
        word_embedding = state_dict.pop(prefix + "_word_embedding.weight", None)
        if word_embedding is not None:
            state_dict[prefix + "_word_embedding"] = word_embedding
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def create_cached_cnn_embeddings(self, tokens: list[str]) -> None:
        """Compute the token vectors of ``tokens`` (and of <S>, </S>) once; word id i is
        ``tokens[i]``, and id 0 is padding (its vector is zeros), as in AllenNLP."""
        bilm = self.bilm
        words = ["<S>", "</S>", *tokens]
        with torch.no_grad():
            ids = torch.cat([batch_to_ids([words[i : i + 1024]])[0] for i in range(0, len(words), 1024)])
            vectors = bilm.token_encoder.encode_unique(ids.to(next(bilm.parameters()).device))
        embedding = vectors[2:].clone()
        embedding[0] = 0.0
        self.register_buffer("_bos_embedding", vectors[0].clone(), persistent=False)
        self.register_buffer("_eos_embedding", vectors[1].clone(), persistent=False)
        self._word_embedding = nn.Parameter(embedding, requires_grad=self._requires_grad)

    def forward(
        self, inputs: torch.Tensor, word_inputs: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        out = self.run(inputs, word_inputs, keep_sentence_boundaries=True)
        return {"activations": list(out.layers.unbind(0)), "mask": out.mask.long()}

    def run(
        self,
        inputs: torch.Tensor,
        word_inputs: torch.Tensor | None = None,
        keep_sentence_boundaries: bool = True,
    ) -> BiLMOutput:
        """One call: layers (num_layers, batch, timesteps (+ 2), dim), the mask and the state
        reached, which becomes the carried state (with ``_elmo_lstm.stateful`` False: from zeros,
        nothing carried)."""
        bilm = self.bilm
        if inputs.dim() != 3:
            raise ValueError(
                f"inputs must be char ids (batch, timesteps, 50), got shape {tuple(inputs.shape)}"
            )
        batch = inputs.shape[0]
        lstm, like = self._elmo_lstm, bilm.lstm.lstm_layers[0].weight_hidden
        if lstm.stateful:
            initial = lstm.carried.initial(bilm, batch, like)
        else:  # AllenNLP's stateless encoder: zeros, and the carried states left untouched
            initial = bilm.zero_state(batch, like)
        with evaluating(bilm):
            cached = self._cached_tokens(word_inputs)
            if cached is not None:
                tokens, lengths = cached
                out = bilm.contextualize(tokens, lengths, initial, keep_sentence_boundaries)
            else:
                out = bilm(inputs, initial, keep_sentence_boundaries=keep_sentence_boundaries)
        if lstm.stateful:
            lstm.carried.update(out.state)
        return out

    def _cached_tokens(self, word_inputs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Token vectors (batch, timesteps + 2, projection_dim) with <S> and </S> and the lengths
        (batch,) from cached word ids; None when there is no cache or an id is not in it (then
        the characters are used, as AllenNLP backs off)."""
        table = self._word_embedding
        if table is None or word_inputs is None:
            return None
        if word_inputs.numel() and (int(word_inputs.min()) < 0 or int(word_inputs.max()) >= len(table)):
            return None
        batch, steps = word_inputs.shape
        lengths = (word_inputs > 0).sum(dim=1)
        tokens = table.new_zeros(batch, steps + 2, table.shape[1])
        tokens = torch.cat([tokens[:, :1], table[word_inputs], tokens[:, -1:]], dim=1)
        rows = torch.arange(batch, device=tokens.device)
        tokens = tokens.index_put((rows, torch.zeros_like(rows)), self._bos_embedding.expand(batch, -1))
        tokens = tokens.index_put(
            (rows, lengths.to(tokens.device) + 1), self._eos_embedding.expand(batch, -1)
        )
        # AllenNLP's mask here: positions whose vector has a positive value
        mask = (tokens > 0).any(dim=-1)
        return tokens, mask.sum(dim=1)


class Elmo(nn.Module):
    """AllenNLP 0.9's ``Elmo``: ``num_output_representations`` scalar mixes of the biLM layers
    with dropout, stateful as AllenNLP's (the signature is AllenNLP's: the fourth positional
    argument is ``requires_grad``).

    ``forward(inputs, word_inputs=None)``: char ids (batch, timesteps, 50) or (batch, d1, ...,
    timesteps, 50) -> ``{'elmo_representations': [num_output_representations tensors (batch,
    ..., timesteps, 2 * projection_dim)], 'mask': int64 (batch, ..., timesteps)}``. The mixes see
    ``<S>`` and ``</S>`` (layer norm statistics include them, as AllenNLP's), which are then removed
    unless ``keep_sentence_boundaries``. ``module``: an elmokit ``BiLM`` or a module returning
    AllenNLP's dict, used instead of the files (then ``requires_grad`` is ignored).

    The model: AllenNLP's ``options_file`` and ``weight_file`` (paths or URLs), or any spec
    elmokit resolves given as ``options_file`` with ``weight_file=None``: a shipped or known
    model's name (``Elmo("elmo-news-512", None, 1)``), a model folder, an NLPL .zip, an http(s)
    URL of one, ``hf://owner/name[@revision]``.
    """

    def __init__(
        self,
        options_file: str | os.PathLike | None,
        weight_file: str | os.PathLike | None,
        num_output_representations: int,
        requires_grad: bool = False,
        do_layer_norm: bool = False,
        dropout: float = 0.5,
        vocab_to_cache: list[str] | None = None,
        keep_sentence_boundaries: bool = False,
        scalar_mix_parameters: list[float] | None = None,
        module: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if module is not None:
            if options_file is not None or weight_file is not None:
                raise ConfigurationError("Don't provide options_file or weight_file with module")
            # any other module stands in for _ElmoBiLm (AllenNLP's `module=`): it has its interface
            self._elmo_lstm = (
                _ElmoBiLm(None, None, bilm=module) if isinstance(module, BiLM) else cast(_ElmoBiLm, module)
            )
        else:
            self._elmo_lstm = _ElmoBiLm(
                options_file, weight_file, requires_grad=requires_grad, vocab_to_cache=vocab_to_cache
            )
        self._has_cached_vocab = vocab_to_cache is not None
        self._keep_sentence_boundaries = keep_sentence_boundaries
        self._dropout = nn.Dropout(p=dropout)
        self._scalar_mixes: list[ScalarMix] = []
        trainable = scalar_mix_parameters is None
        for k in range(num_output_representations):
            scalar_mix = ScalarMix(
                self._elmo_lstm.num_layers,
                do_layer_norm=do_layer_norm,
                initial_scalar_parameters=scalar_mix_parameters,
                trainable=trainable,
            )
            self.add_module(f"scalar_mix_{k}", scalar_mix)
            self._scalar_mixes.append(scalar_mix)

    def get_output_dim(self) -> int:
        """2 * projection_dim."""
        return self._elmo_lstm.get_output_dim()

    def forward(
        self, inputs: torch.Tensor, word_inputs: torch.Tensor | None = None
    ) -> dict[str, list[torch.Tensor] | torch.Tensor]:
        original_shape = inputs.size()
        if len(original_shape) > 3:
            timesteps, num_characters = original_shape[-2:]
            reshaped_inputs = inputs.reshape(-1, timesteps, num_characters)
        else:
            reshaped_inputs = inputs
        reshaped_word_inputs = None
        if word_inputs is not None:
            if not self._has_cached_vocab:
                logger.warning("Word inputs were passed to ELMo but it does not have a cached vocab.")
            elif word_inputs.dim() > 2:
                reshaped_word_inputs = word_inputs.reshape(-1, word_inputs.shape[-1])
            else:
                reshaped_word_inputs = word_inputs

        bilm_output = self._elmo_lstm(reshaped_inputs, reshaped_word_inputs)
        layer_activations = bilm_output["activations"]
        mask_with_bos_eos = bilm_output["mask"]

        representations = []
        processed_mask = mask_with_bos_eos
        for scalar_mix in self._scalar_mixes:
            representation = scalar_mix(layer_activations, mask_with_bos_eos)
            if not self._keep_sentence_boundaries:
                representation, processed_mask = remove_sentence_boundaries(representation, mask_with_bos_eos)
            representations.append(self._dropout(representation))

        if word_inputs is not None and word_inputs.dim() > 2 and self._has_cached_vocab:
            shape = tuple(word_inputs.shape)
        elif len(original_shape) > 3:
            shape = tuple(original_shape[:-1])
        else:
            return {"elmo_representations": representations, "mask": processed_mask}
        if self._keep_sentence_boundaries:
            shape = (*shape[:-1], shape[-1] + 2)
        return {
            "elmo_representations": [r.view(*shape, -1) for r in representations],
            "mask": processed_mask.view(shape),
        }


class ElmoTokenEmbedder(nn.Module):
    """AllenNLP's ``ElmoTokenEmbedder`` (``"elmo_token_embedder"``): one ``Elmo`` mix, optionally
    projected to ``projection_dim`` by a Linear layer; ``forward(inputs, word_inputs=None)`` ->
    (batch, ..., timesteps, output_dim). The ``Elmo`` is ``_elmo``, the projection
    ``_projection``, as in AllenNLP's state dicts. The model: AllenNLP's (options_file,
    weight_file), or any elmokit spec as ``options_file`` alone (see ``Elmo``)."""

    def __init__(
        self,
        options_file: str | os.PathLike,
        weight_file: str | os.PathLike | None = None,
        do_layer_norm: bool = False,
        dropout: float = 0.5,
        requires_grad: bool = False,
        projection_dim: int | None = None,
        vocab_to_cache: list[str] | None = None,
        scalar_mix_parameters: list[float] | None = None,
    ) -> None:
        super().__init__()
        self._elmo = Elmo(
            options_file,
            weight_file,
            1,
            do_layer_norm=do_layer_norm,
            dropout=dropout,
            requires_grad=requires_grad,
            vocab_to_cache=vocab_to_cache,
            scalar_mix_parameters=scalar_mix_parameters,
        )
        self._projection: nn.Linear | None = None
        if projection_dim:
            self._projection = nn.Linear(self._elmo.get_output_dim(), projection_dim)
            self.output_dim = projection_dim
        else:
            self.output_dim = self._elmo.get_output_dim()

    def get_output_dim(self) -> int:
        return self.output_dim

    def forward(self, inputs: torch.Tensor, word_inputs: torch.Tensor | None = None) -> torch.Tensor:
        representation = self._elmo(inputs, word_inputs)["elmo_representations"][0]
        if self._projection is not None:
            representation = self._projection(representation)  # on the last dimension, any rank
        return representation


# -- embedding sentences and files ------------------------------------------------------------
class ElmoEmbedder:
    """AllenNLP 0.9's ``ElmoEmbedder``: arrays (3, n_tokens, 2 * projection_dim) per sentence,
    stateful from call to call as AllenNLP's (the states of batch row r carry into row r of the
    next batch). ``options_file`` and ``weight_file``: paths or URLs (AllenNLP's published model
    by default), or any elmokit spec as ``options_file`` alone (``ElmoEmbedder("elmo-news-512")``,
    a folder, an NLPL .zip, a URL of one, ``hf://owner/name``); an options file given alone is
    paired with AllenNLP's default weights, as AllenNLP does. ``cuda_device`` -1 = CPU.

    Long sentences (SeqVec's proteins of thousands of residues) run through the LSTMs in windows
    of 512 steps with the states carried across, which gives the unsplit result with bounded
    memory; the character CNN runs once per distinct token.
    """

    def __init__(
        self,
        options_file: str | os.PathLike = DEFAULT_OPTIONS_FILE,
        weight_file: str | os.PathLike | None = None,
        cuda_device: int = -1,
    ) -> None:
        if weight_file is None and _is_options_file(options_file):
            weight_file = DEFAULT_WEIGHT_FILE  # AllenNLP's default, beside the options file given
        self.elmo_bilm = _ElmoBiLm(options_file, weight_file)
        if cuda_device >= 0:
            if not torch.cuda.is_available():
                raise ValueError(
                    f"cuda_device={cuda_device} was given but CUDA is not available; use -1 for the CPU"
                )
            self.elmo_bilm = self.elmo_bilm.cuda(device=cuda_device)
        self.cuda_device = cuda_device

    def batch_to_embeddings(self, batch: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(activations (batch, num_layers, timesteps, dim), mask int64 (batch, timesteps))."""
        character_ids = batch_to_ids(batch)
        if self.cuda_device >= 0:
            character_ids = character_ids.cuda(device=self.cuda_device)
        with torch.no_grad():
            out = self.elmo_bilm.run(character_ids, keep_sentence_boundaries=False)
        return out.layers.transpose(0, 1), out.mask.long()

    def embed_sentence(self, sentence: Sequence[str]) -> np.ndarray:
        """(3, n_tokens, dim) float32 for one tokenized sentence (stateful)."""
        return self.embed_batch([sentence])[0]

    def embed_batch(self, batch: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """One array (3, n_tokens, dim) per sentence; an empty sentence gives
        ``empty_embedding()``. A batch of empty sentences only does not touch the states."""
        if len(batch) > 0 and all(len(sentence) == 0 for sentence in batch):
            return [empty_embedding() for _ in batch]
        embeddings, mask = self.batch_to_embeddings(batch)
        arrays = embeddings.detach().cpu().numpy()
        lengths = mask.sum(dim=1).tolist()
        return [arrays[i, :, :n, :] if n else empty_embedding() for i, n in enumerate(lengths)]

    def embed_sentences(
        self, sentences: Iterable[Sequence[str]], batch_size: int = DEFAULT_BATCH_SIZE
    ) -> Iterator[np.ndarray]:
        """Arrays (3, n_tokens, dim) for any iterable of sentences, in batches of
        ``batch_size`` in the given order."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        for batch in _lazy_groups_of(iter(sentences), batch_size):
            yield from self.embed_batch(batch)

    def embed_file(
        self,
        input_file: IO[str] | str | os.PathLike,
        output_file_path: str | os.PathLike,
        output_format: str = "all",
        batch_size: int = DEFAULT_BATCH_SIZE,
        forget_sentences: bool = False,
        use_sentence_keys: bool = False,
    ) -> None:
        """Embed a file of whitespace-tokenized sentences (an open text file, a path, or "-" for
        stdin) into HDF5 as ``allennlp elmo`` does: dataset ``"i"`` (or the sentence itself with
        ``use_sentence_keys``) holds line i's float32 vectors, (3, n_tokens, dim) for ``all``,
        (n_tokens, dim) for ``top`` and ``average``; ``"sentence_to_index"`` holds
        ``json.dumps({sentence: "i"})`` unless ``forget_sentences`` or ``use_sentence_keys``.
        Blank lines are an error. The file appears only when complete (written beside it, then
        renamed); an existing regular file is replaced, as AllenNLP does, but never the input
        file or a file of the model (under any name), a symbolic link, a device or a pipe
        (``atomic.check_output``)."""
        if output_format not in ("all", "top", "average"):
            raise ValueError(f"output_format must be all, top or average, got {output_format!r}")
        # AllenNLP replaces an existing file; never the input itself, a link, a device or a pipe
        # nor a file of the model (its weights, its options)
        inputs: list[str | os.PathLike] = [*_input_names(input_file), *self.elmo_bilm.bilm.source_files]
        output = check_output(output_file_path, overwrite=True, inputs=inputs)
        sentences = _read_sentences(input_file)
        blank = [i for i, line in enumerate(sentences) if line == ""]
        if blank:
            shown = ", ".join(map(str, blank[:10])) + (
                f", ... ({len(blank)} in all)" if len(blank) > 10 else ""
            )
            raise ConfigurationError(
                f"Your input file contains empty lines at indexes [{shown}]. Please remove them."
            )
        if use_sentence_keys:
            logger.warning(
                "Using sentences as keys can fail if sentences contain forward slashes or colons. "
                "Use with caution."
            )
        split = (sentence.split() for sentence in sentences)
        from tqdm import tqdm

        seen: set[str] = set()

        def rows() -> Iterator[tuple[str, np.ndarray]]:
            embedded = self.embed_sentences(split, batch_size)
            for i, embeddings in enumerate(
                tqdm(embedded, total=len(sentences), file=sys.stderr, disable=None)
            ):
                if use_sentence_keys:
                    if sentences[i] in seen:
                        raise ConfigurationError(
                            f"Key already exists in {output}. To encode duplicate sentences, do not pass "
                            "the --use-sentence-keys flag."
                        )
                    seen.add(sentences[i])
                yield sentences[i], output_array(embeddings, output_format, None)

        def key(i: int, sentence: str) -> str:
            return sentence if use_sentence_keys else str(i)

        index = not forget_sentences and not use_sentence_keys
        try:
            write_vectors(output, True, rows(), None, index, flavour="allennlp", key=key)
        except ConfigurationError:
            raise
        except ValueError as err:  # a key HDF5 refuses
            if not str(err).startswith("line "):
                raise
            raise ConfigurationError(str(err)) from None


def _is_options_file(spec: str | os.PathLike | None) -> bool:
    """Whether ``spec`` names an options file (a local JSON file, a URL ending in .json) rather
    than a whole model."""
    if spec is None:
        return False
    text = os.fspath(spec)
    text = os.fsdecode(text) if isinstance(text, bytes) else text
    if "://" in text:
        return text.lower().split("?", 1)[0].endswith(".json")
    path = Path(text).expanduser()
    return path.is_file() and sniff(path) == "json"


def _input_names(input_file: IO[str] | str | os.PathLike) -> list[str]:
    """The input's path, if it has one (an open file's name), for the output check."""
    name = getattr(input_file, "name", None) if hasattr(input_file, "read") else input_file
    return [os.fspath(name)] if isinstance(name, (str, os.PathLike)) else []


def _read_sentences(input_file: IO[str] | str | os.PathLike) -> list[str]:
    """The stripped lines of an open text file, a UTF-8 file at a path, or stdin ("-"), read
    by ``textfiles.read_lines`` (the package's one rule for lines, byte-order marks, UTF-8)."""
    if hasattr(input_file, "read"):
        return [line.strip() for line in input_file]  # type: ignore[union-attr]
    count_lines(input_file)  # a missing input or a folder is named
    return [line.strip() for line in read_lines(input_file)]


# -- the command ------------------------------------------------------------------------------
def add_elmo_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``elmokit elmo``: ``allennlp elmo``'s arguments and output."""
    p = subparsers.add_parser(
        "elmo", help="allennlp elmo's command: stateful vectors of a file, in its HDF5 layout"
    )
    add_elmo_arguments(p)
    return p


def add_elmo_arguments(p: argparse.ArgumentParser) -> None:
    """``elmokit elmo``'s description and arguments on its parser ``p`` (sets ``func``)."""
    p.description = (
        "Create word vectors using ELMo, as `allennlp elmo` (AllenNLP 0.9) does: the same "
        "arguments, the same HDF5 layout and the same numbers (states carried from batch to batch). "
        "A repeated line keeps only its last line number in sentence_to_index, as in AllenNLP."
    )
    p.add_argument("input_file", help="one whitespace-tokenized sentence per line; - for stdin")
    p.add_argument(
        "output_file",
        help="HDF5 file to write (a regular file is replaced if it exists, as AllenNLP does; never "
        "the input, a link, a device or a pipe)",
    )
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--all", action="store_true", help="Output all three ELMo vectors.")
    group.add_argument("--top", action="store_true", help="Output the top ELMo vector.")
    group.add_argument("--average", action="store_true", help="Output the average of the ELMo vectors.")
    p.add_argument("--vocab-path", help="accepted for compatibility; unused (as in AllenNLP 0.9)")
    p.add_argument(
        "--options-file",
        default=DEFAULT_OPTIONS_FILE,
        help="The path to the ELMo options file; or, without --weight-file, a whole model: a name, a "
        "folder, an NLPL .zip, a URL or hf://owner/name.",
    )
    p.add_argument(
        "--weight-file",
        default=None,
        help="The path to the ELMo weight file (AllenNLP's default beside an options file).",
    )
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="The batch size to use.")
    p.add_argument("--file-friendly-logging", action="store_true", help="accepted for compatibility")
    p.add_argument("--cuda-device", type=int, default=-1, help="The cuda_device to run on (-1: CPU).")
    p.add_argument(
        "--forget-sentences",
        action="store_true",
        help='do not write the "sentence_to_index" dataset (JSON {sentence: line number})',
    )
    p.add_argument(
        "--use-sentence-keys",
        action="store_true",
        help="use each sentence itself as its HDF5 key instead of its line number",
    )
    p.set_defaults(func=elmo_command)


def elmo_command(args: argparse.Namespace) -> int:
    """Run ``elmokit elmo`` (``allennlp elmo``) with parsed arguments."""
    output_format = "all" if args.all else "top" if args.top else "average"
    check_input(args.input_file)  # before the model is read (or downloaded)
    try:
        embedder = ElmoEmbedder(args.options_file, args.weight_file, args.cuda_device)
        with torch.no_grad():
            embedder.embed_file(
                args.input_file,
                args.output_file,
                output_format,
                args.batch_size,
                args.forget_sentences,
                args.use_sentence_keys,
            )
    except (FileNotFoundError, FileExistsError):
        raise
    except OSError as err:  # e.g. a folder without write permission: one line, as every error
        raise ValueError(str(err)) from None
    return 0
