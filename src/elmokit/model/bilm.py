"""The bidirectional language model: token encoder, forward and backward LSTM stacks, layers.

State is explicit: ``bilm(char_ids, state)`` starts each row's LSTMs from ``state`` (None = the
model's start state, or zeros for a model without one; ``"zero"`` = zeros) and returns, beside
the layers, the state each row reached at its last position, which can be the next call's
``state``. ``StatefulBiLM`` (what ``BiLM.from_pretrained(..., stateful=True)`` gives) is the one
place that carries states from call to call, as bilm-tf and AllenNLP do.

``BiLM.from_pretrained(spec)`` is the way to get a pretrained model: any spec of
``elmokit.hub.resolve_model`` (a name, a folder, an archive, a URL, ``hf://``); ``BiLM.load``
reads an options file and a weight file.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..base.bounds import check_model_size
from ..base.kernels import needs_autograd
from ..hub import resolve_model
from .char_cnn import TokenEncoder
from .characters import lengths_from_ids, pad_batch
from .inputs import InputScheme
from .lstm import BiLstm, LstmState, Packing
from .manylangs import read_manylangs
from .options import BiLMOptions
from .tfhub import read_tfhub
from .weights import check_weight_shapes, load_weight_arrays, load_weights, save_options, save_weights

__all__ = ["BiLM", "BiLMOutput", "CarriedState", "StatefulBiLM"]

# Longer inputs run through the LSTMs in windows of this many steps (exact; bounds memory).
DEFAULT_WINDOW = 512

StateArg = LstmState | str | None


@dataclass
class BiLMOutput:
    """layers: (num_layers + 1, batch, timesteps, 2 * projection_dim); mask: (batch, timesteps);
    state: each row's LSTM state after its last position (h (n_layers, 2, batch, projection_dim),
    c (n_layers, 2, batch, dim)), usable as the next call's ``state``."""

    layers: torch.Tensor
    mask: torch.Tensor
    state: LstmState


class BiLM(nn.Module):
    """ELMo's biLM. ``BiLM(options)`` builds one with fresh weights; ``BiLM.load`` reads the
    original files.

    Calling it on char ids (batch, timesteps, max_chars) from ``batch_to_ids`` adds ``<S>`` and ``</S>``
    itself and returns a ``BiLMOutput``. Every call starts from the ``state`` it is given (by
    default the model's start state), so the same sentence gets the same vectors in any batch.
    ``start_state`` is the canonical start state read with the weights (h (n_layers, 2,
    projection_dim), c (n_layers, 2, dim)), or None for zeros; ``set_start_state`` changes it. It
    is held in two buffers, so it moves with ``.to()`` and lives in ``state_dict``
    ("start_state_h", "start_state_c", only when there is one); a state dict without them (of a
    model without a start state, or saved before it was a buffer) leaves the start state as it is.

    The model's inputs come from its own ``batch_to_ids`` (sentences) and ``token_ids`` (tokens),
    as its input scheme ``inputs`` says: bilm-tf's byte ids by default, a variant's own
    (``elmokit.model.manylangs``), which also names its own ``boundary_tokens``.
    """

    def __init__(self, options: dict[str, Any] | BiLMOptions, inputs: InputScheme | None = None) -> None:
        super().__init__()
        if not isinstance(options, BiLMOptions):
            options = BiLMOptions.from_dict(options)
        check_model_size(options, "options")  # nothing is allocated for a model that cannot fit
        self.options = options
        self.inputs = InputScheme(options.char_cnn.max_characters_per_token) if inputs is None else inputs
        self.token_encoder = TokenEncoder(
            options.char_cnn,
            options.lstm.projection_dim,
            padding_id=self.inputs.padding_id,
            word_embedding=self.inputs.word_embedding,
            always_project=self.inputs.always_project,
        )
        self.lstm = BiLstm(options.lstm.projection_dim, options.lstm)
        self.start_state_h: torch.Tensor | None
        self.start_state_c: torch.Tensor | None
        self.register_buffer("start_state_h", None)
        self.register_buffer("start_state_c", None)
        self._boundary_ids: torch.Tensor  # (2, input_width): the ids of <S> and </S>
        self.register_buffer("_boundary_ids", self.token_ids(self.boundary_tokens), persistent=False)
        # the files the model was read from (``load``, ``from_pretrained``): outputs never replace them
        self.source_files: tuple[Path, ...] = ()

    # -- inputs --------------------------------------------------------------------------------
    @property
    def boundary_tokens(self) -> tuple[str, str]:
        """The tokens that wrap every sentence (bilm-tf: ``<S>`` and ``</S>``)."""
        return self.inputs.boundary_tokens

    def token_ids(self, tokens: Sequence[str]) -> torch.Tensor:
        """This model's input ids of each token: LongTensor (n_tokens, input_width), 0 never
        used by a token (bilm-tf: the shifted byte ids of ``tokens_to_ids``)."""
        return self.inputs.token_ids(tokens)

    def batch_to_ids(self, sentences: Sequence[Sequence[str]]) -> torch.Tensor:
        """Tokenized sentences -> this model's inputs: LongTensor (batch, timesteps, input_width),
        rows past a sentence's end all 0; what ``forward`` takes (bilm-tf: ``elmokit.batch_to_ids``)."""
        return pad_batch(sentences, self.token_ids, self.token_encoder.input_width)

    @classmethod
    def load(cls, options_file: str | Path, weight_file: str | Path, stateful: bool = False) -> BiLM:
        """Read options.json and an original-format HDF5 weight file (the low-level form of
        ``from_pretrained``); the model is in eval mode. ``stateful=True`` gives a
        ``StatefulBiLM`` (states carried between calls)."""
        model_cls = StatefulBiLM if stateful else cls
        options = BiLMOptions.from_file(options_file)
        check_weight_shapes(options, weight_file)  # before the model's memory is allocated
        bilm = model_cls(options)
        load_weights(bilm, weight_file)
        bilm.source_files = (Path(options_file), Path(weight_file))
        return bilm.eval()

    @classmethod
    def from_pretrained(
        cls,
        spec: str | os.PathLike | None = None,
        *,
        stateful: bool = False,
        progress: bool | None = None,
    ) -> BiLM:
        """A pretrained biLM in eval mode, from a model given in any form
        ``elmokit.hub.resolve_model`` takes (None: the default shipped model): a shipped or
        known model's name, a folder of bilm-tf, AllenNLP or ELMoForManyLangs layout, a TF-Hub
        module folder, an NLPL .zip, an http(s) URL, ``hf://owner/name[@revision]``. ``stateful=True`` gives a
        ``StatefulBiLM``, which carries states between calls as bilm-tf and AllenNLP do."""
        source = resolve_model(spec, progress=progress)
        if source.kind == "tfhub":
            assert source.folder is not None  # a TF-Hub module is a folder
            return cls.from_tfhub(source.folder, stateful=stateful)
        if source.kind != "manylangs":
            bilm = BiLM.load(*source.files(), stateful=stateful)
        else:
            assert source.folder is not None  # an ELMoForManyLangs model is a folder
            model = read_manylangs(source.folder)
            bilm = (StatefulBiLM if stateful else BiLM)(model.options, model.inputs)
            bilm.load_state_dict(model.tensors)
        bilm.source_files = source.input_files()  # its archive too, and the vocabulary, softmax
        return bilm.eval()

    @classmethod
    def from_tfhub(cls, folder: str | Path, *, stateful: bool = False) -> BiLM:
        """The biLM of a TF-Hub module folder (``elmokit.model.tfhub``), in eval mode, no start
        state (bilm-tf's graph starts from zeros)."""
        module = read_tfhub(folder)
        bilm = (StatefulBiLM if stateful else BiLM)(module.options)
        load_weight_arrays(bilm, module.arrays, f"{module.folder} (TF-Hub module)")
        return bilm.eval()

    def save(self, options_file: str | Path, weight_file: str | Path) -> None:
        """Write options.json and the weights in the original layout."""
        if self.inputs.not_writable is not None:
            raise ValueError(self.inputs.not_writable)
        save_options(self.options, options_file)
        save_weights(self, weight_file)

    @property
    def output_dim(self) -> int:
        return self.options.output_dim

    @property
    def stateful(self) -> bool:
        """Whether calls carry states into the next call (``StatefulBiLM``)."""
        return False

    @property
    def num_layers(self) -> int:
        """Layers for downstream use: the token layer plus one per LSTM layer."""
        return self.options.num_layers

    def encode_tokens(self, tokens: list[str]) -> torch.Tensor:
        """Context-independent token vectors from the char CNN: (n_tokens, projection_dim)."""
        if isinstance(tokens, str):
            raise TypeError("encode_tokens takes a list of tokens, not a str")
        if len(tokens) == 0:
            raise ValueError("encode_tokens needs at least one token")
        ids = self.token_ids(tokens)
        return self.token_encoder.encode_unique(ids.to(self._boundary_ids.device))

    # -- states --------------------------------------------------------------------------------
    @property
    def start_state(self) -> LstmState | None:
        """The canonical start state (h (n_layers, 2, projection_dim), c (n_layers, 2, dim)), or
        None (every call starts from zeros by default)."""
        if self.start_state_h is None or self.start_state_c is None:
            return None
        return LstmState(self.start_state_h, self.start_state_c)

    def set_start_state(self, state: LstmState | None) -> None:
        """Make ``state`` the start state (None: none), checked against the options; it is
        copied onto the device of the model's weights (its dtype kept)."""
        if state is None:
            self.start_state_h = self.start_state_c = None
            return
        lstm = self.options.lstm
        expected = ((lstm.n_layers, 2, lstm.projection_dim), (lstm.n_layers, 2, lstm.dim))
        h, c = state
        if tuple(h.shape) != expected[0] or tuple(c.shape) != expected[1]:
            raise ValueError(
                f"a start state of shapes h {tuple(h.shape)}, c {tuple(c.shape)} for a model of "
                f"h {expected[0]}, c {expected[1]}"
            )
        weight = next(self.parameters())
        self.start_state_h = h.detach().to(weight.device).clone()
        self.start_state_c = c.detach().to(weight.device).clone()

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """A state dict's start state replaces the model's; one without leaves it as it is."""
        keys = (prefix + "start_state_h", prefix + "start_state_c")
        present = [key in state_dict for key in keys]
        if all(present):
            try:
                self.set_start_state(LstmState(state_dict[keys[0]], state_dict[keys[1]]))
            except ValueError as err:
                error_msgs.append(str(err))
        elif any(present):
            error_msgs.append(f"a start state needs both {keys[0]} and {keys[1]}")
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if not any(present):
            missing_keys[:] = [key for key in missing_keys if key not in keys]

    def zero_state(self, batch: int, like: torch.Tensor | None = None) -> LstmState:
        """All-zero states for ``batch`` rows (on ``like``'s device and dtype)."""
        zero = self.lstm.zero_state(batch, self._boundary_ids.device)
        if like is None:
            return zero
        return LstmState(zero.h.to(like.device, like.dtype), zero.c.to(like.device, like.dtype))

    def initial_state(self, batch: int, like: torch.Tensor | None = None) -> LstmState:
        """The state a call starts from by default: ``start_state`` for every row, or zeros."""
        zero = self.zero_state(batch, like)
        if self.start_state is None:
            return zero
        h, c = (t.to(zero.h.device, zero.h.dtype).unsqueeze(2) for t in self.start_state)
        return LstmState(h.expand_as(zero.h).contiguous(), c.expand_as(zero.c).contiguous())

    def _resolve_state(self, state: StateArg, batch: int, like: torch.Tensor) -> LstmState:
        if state is None:
            return self.initial_state(batch, like)
        if isinstance(state, str):
            if state != "zero":
                raise ValueError(f"state must be an LstmState, None or 'zero', got {state!r}")
            return self.zero_state(batch, like)
        opt = self.options.lstm
        expected = ((opt.n_layers, 2, batch, opt.projection_dim), (opt.n_layers, 2, batch, opt.dim))
        if (tuple(state.h.shape), tuple(state.c.shape)) != expected:
            raise ValueError(
                f"state must have h {expected[0]} and c {expected[1]} for a batch of {batch}, got "
                f"h {tuple(state.h.shape)} and c {tuple(state.c.shape)}"
            )
        return LstmState(state.h.to(like.device, like.dtype), state.c.to(like.device, like.dtype))

    # -- forward -------------------------------------------------------------------------------
    def forward(
        self,
        char_ids: torch.Tensor,
        state: StateArg = None,
        keep_sentence_boundaries: bool = False,
        window: int | None = DEFAULT_WINDOW,
    ) -> BiLMOutput:
        """char_ids (batch, timesteps, max_chars) -> layers (num_layers + 1, batch, timesteps',
        2 * projection_dim), timesteps' = timesteps (+ 2 with the boundaries kept), the mask and
        the final state. ``state``: None (start state), "zero", or an LstmState for the batch."""
        if isinstance(state, bool):  # the old forward(char_ids, keep_sentence_boundaries)
            warnings.warn(
                "pass keep_sentence_boundaries by keyword; the second argument is now state",
                DeprecationWarning,
                stacklevel=2,
            )
            state, keep_sentence_boundaries = None, state
        self._check_input(char_ids)
        ids, lengths = self.add_sentence_boundaries(char_ids)
        return self.contextualize(self.token_encoder(ids), lengths, state, keep_sentence_boundaries, window)

    def contextualize(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        state: StateArg = None,
        keep_sentence_boundaries: bool = False,
        window: int | None = DEFAULT_WINDOW,
    ) -> BiLMOutput:
        """Run the LSTMs over token vectors that already include ``<S>`` and ``</S>``.

        tokens: (batch, steps, projection_dim) from the token encoder; lengths: (batch,) counting
        the boundaries. The LSTMs run on the real positions only (packed): each window of
        ``window`` steps gathers its tokens straight into the layout of both directions (the
        backward one reversed) and the outputs are scattered into the result; the state carries
        across windows, so windowing changes nothing but memory. With autograd the scatter is
        out of place; without, in place.
        """
        batch, steps, dim = tokens.shape
        device = tokens.device
        grad = needs_autograd(self.lstm, tokens)
        lengths_cpu = lengths.cpu().clamp(0, steps)
        lengths_dev = lengths_cpu.to(device)
        state = self._resolve_state(state, batch, tokens)
        first = 0 if keep_sentence_boundaries else 1  # drop <S> and </S> unless kept
        width = max(steps - 2 * first, 0)
        n_layers = self.options.lstm.n_layers
        layers = tokens.new_zeros(n_layers + 1, batch * width * 2, dim)
        flat = tokens.reshape(batch * steps, dim)
        window = window or steps
        for start in range(0, steps, window):
            span = min(window, steps - start)
            packing = Packing.from_lengths(lengths_cpu - start, span, device)
            if packing.size == 0:
                break
            rows, t = packing.rows, packing.times + start
            n = lengths_dev[rows]
            forward = flat.index_select(0, rows * steps + t)
            inputs = torch.stack([forward, flat.index_select(0, rows * steps + (n - 1 - t))])
            dropout = (batch * span, rows * span + packing.times) if self.training else None
            packed, state = self.lstm.run_packed(inputs, packing, state, dropout)
            # Result rows: (row * width + position) * 2 + direction.
            target_f = (rows * width + t - first) * 2
            target_b = (rows * width + (n - 1 - t) - first) * 2 + 1
            if first:
                real = ((t >= first) & (t < n - first)).nonzero(as_tuple=True)[0]
                target_f, target_b, forward = target_f[real], target_b[real], forward[real]
                packed = packed.index_select(2, real)
            token_rows, lstm_rows = torch.cat([target_f, target_f + 1]), torch.cat([target_f, target_b])
            if grad:
                token_layer = layers[0].index_copy(0, token_rows, forward.repeat(2, 1))
                lstm_layers = layers[1:].index_copy(1, lstm_rows, packed.flatten(1, 2))
                layers = torch.cat([token_layer.unsqueeze(0), lstm_layers])
            else:
                layers[0].index_copy_(0, token_rows, forward.repeat(2, 1))
                layers[1:].index_copy_(1, lstm_rows, packed.flatten(1, 2))
        mask = torch.arange(steps, device=device).unsqueeze(0) < lengths_dev.unsqueeze(1)
        if first:
            mask = mask[:, 2:]
        return BiLMOutput(layers.view(n_layers + 1, batch, width, 2 * dim), mask, state)

    def _check_input(self, char_ids: torch.Tensor) -> None:
        width = self.token_encoder.input_width
        if char_ids.dim() != 3 or char_ids.shape[-1] != width:
            raise ValueError(
                f"char_ids must have shape (batch, timesteps, {width}), got "
                f"{tuple(char_ids.shape)}; make them with {self.inputs.ids_from}"
            )
        if char_ids.shape[0] == 0:
            raise ValueError("empty batch: char_ids has no sentences")
        if char_ids.dtype.is_floating_point or char_ids.dtype.is_complex or char_ids.dtype == torch.bool:
            raise ValueError(
                f"char_ids must hold integer ids (batch_to_ids gives int64), got {char_ids.dtype}"
            )
        if char_ids.numel() == 0:
            return
        limits = self.token_encoder.id_limits  # (width,): each column's ids lie in 0 .. limit - 1
        # A row of all-zero ids is padding: it may only follow a sentence's last token. Between
        # tokens it would shift the tokens after it (lengths count the real tokens).
        real = (char_ids > 0).any(dim=-1)  # (batch, timesteps)
        gap = ~real[:, :-1] & real[:, 1:]
        out_of_range = (char_ids < 0) | (char_ids >= limits)
        if not bool(out_of_range.any() | gap.any()):  # one device sync when the input is good
            return
        if bool(out_of_range.any()):
            where = tuple(int(i) for i in out_of_range.nonzero()[0])
            what = "char_ids" if where[-1] < self.options.char_cnn.max_characters_per_token else "word ids"
            raise ValueError(
                f"{what} must lie in 0..{int(limits[where[-1]]) - 1} (shifted ids from batch_to_ids), "
                f"found {int(char_ids[where])}"
            )
        row, position = (int(i) for i in gap.nonzero()[0])
        first_padding = int((~real[row, : position + 1]).nonzero()[0])
        raise ValueError(
            f"char_ids row {row} has an all-zero (padding) token at position {first_padding} "
            f"before a real token at position {position + 1}; padding may only follow a "
            "sentence's last token (batch_to_ids writes it so)"
        )

    def add_sentence_boundaries(self, char_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch, timesteps, c) -> ids (batch, timesteps + 2, c) with ``<S> .. </S>``, lengths + 2.

        Rows are filled from the left; a row of length n gets ``<S>`` at 0 and ``</S>`` at n + 1."""
        batch, steps, chars = char_ids.shape
        lengths = lengths_from_ids(char_ids)
        ids = char_ids.new_zeros(batch, steps + 2, chars)
        ids[:, 1:-1] = char_ids
        ids[:, 0] = self._boundary_ids[0]
        ids[torch.arange(batch, device=ids.device), lengths + 1] = self._boundary_ids[1]
        return ids, lengths + 2


class CarriedState:
    """bilm-tf's stateful semantics, the one place they live: each batch row's final state is
    that row's initial state in the next call; when a call has fewer rows than an earlier one,
    the rows beyond it keep their states; rows never seen start from zeros.

    ``initial(bilm, batch, like)`` gives the state to pass to a call; ``update(out.state)``
    records its result; ``reset()`` forgets everything."""

    def __init__(self) -> None:
        self.state: LstmState | None = None

    def reset(self) -> None:
        self.state = None

    def initial(self, bilm: BiLM, batch: int, like: torch.Tensor | None = None) -> LstmState:
        zero = bilm.zero_state(batch, like)
        if self.state is None:
            return zero
        rows = min(batch, self.state.h.shape[2])
        h = torch.cat([self.state.h[:, :, :rows].to(zero.h), zero.h[:, :, rows:]], dim=2)
        c = torch.cat([self.state.c[:, :, :rows].to(zero.c), zero.c[:, :, rows:]], dim=2)
        return LstmState(h, c)

    def update(self, final: LstmState) -> None:
        final = final.detach()
        batch = final.h.shape[2]
        old = self.state
        if old is not None and old.h.shape[2] > batch:
            final = LstmState(
                torch.cat([final.h, old.h[:, :, batch:].to(final.h)], dim=2),
                torch.cat([final.c, old.c[:, :, batch:].to(final.c)], dim=2),
            )
        self.state = final


class StatefulBiLM(BiLM):
    """A BiLM that carries each batch row's final LSTM states into the next call (``CarriedState``),
    starting from zeros, exactly as bilm-tf and AllenNLP do; ``reset_states()`` starts again.
    Passing ``state`` explicitly bypasses (and does not update) the carried states."""

    def __init__(self, options: dict[str, Any] | BiLMOptions, inputs: InputScheme | None = None) -> None:
        super().__init__(options, inputs)
        self.carried = CarriedState()

    @property
    def stateful(self) -> bool:
        return True

    def reset_states(self) -> None:
        """Forget the carried LSTM states (the next call starts from zeros)."""
        self.carried.reset()

    def forward(
        self,
        char_ids: torch.Tensor,
        state: StateArg = None,
        keep_sentence_boundaries: bool = False,
        window: int | None = DEFAULT_WINDOW,
    ) -> BiLMOutput:
        if isinstance(state, bool):
            return super().forward(char_ids, state)
        if state is not None:
            return super().forward(char_ids, state, keep_sentence_boundaries, window)
        initial = self.carried.initial(self, char_ids.shape[0], next(self.parameters()))
        out = super().forward(char_ids, initial, keep_sentence_boundaries, window)
        self.carried.update(out.state)
        return out
