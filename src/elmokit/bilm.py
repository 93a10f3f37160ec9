"""The bidirectional language model: token encoder, forward and backward LSTM stacks, layers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .char_cnn import TokenEncoder
from .characters import BOS_TOKEN, EOS_TOKEN, lengths_from_ids, tokens_to_ids
from .lstm import BiLstm, LstmState, Packing, needs_autograd
from .options import BiLMOptions
from .weights import load_weights, save_weights

# Longer inputs run through the LSTMs in windows of this many steps (exact; bounds memory).
DEFAULT_WINDOW = 512


@dataclass
class BiLMOutput:
    """layers: (num_layers + 1, batch, timesteps, 2 * projection_dim); mask: (batch, timesteps)."""

    layers: torch.Tensor
    mask: torch.Tensor


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor, time_dim: int = 1) -> torch.Tensor:
    """Reverse each row's first ``lengths[b]`` steps, leaving padding at the end.

    x: (batch, timesteps, ...) with the time axis at ``time_dim`` and the batch axis just before it.
    """
    steps = x.shape[time_dim]
    t = torch.arange(steps, device=x.device).unsqueeze(0)
    n = lengths.to(x.device).unsqueeze(1)
    index = torch.where(t < n, n - 1 - t, t)  # (batch, timesteps)
    shape = [1] * x.dim()
    shape[time_dim - 1], shape[time_dim] = index.shape
    index = index.view(shape).expand_as(x)
    return torch.gather(x, time_dim, index)


class BiLM(nn.Module):
    """ELMo's biLM. ``BiLM(options)`` builds one with fresh weights; ``BiLM.load`` reads the
    original files.

    Calling it on char ids (batch, timesteps, max_chars) from ``batch_to_ids`` adds <S> and </S>
    itself and returns a ``BiLMOutput``. In stateless mode (default) every sentence starts from
    the same initial state; in stateful mode each batch row's final states become that row's
    initial states in the next call, as the original does.
    """

    def __init__(self, options: dict[str, Any] | BiLMOptions, stateful: bool = False) -> None:
        super().__init__()
        if not isinstance(options, BiLMOptions):
            options = BiLMOptions.from_dict(options)
        self.options = options
        self.stateful = stateful
        self.token_encoder = TokenEncoder(options.char_cnn, options.lstm.projection_dim)
        self.lstm = BiLstm(options.lstm.projection_dim, options.lstm)
        self._carried: LstmState | None = None
        # The canonical start state of stateless mode: h (n_layers, 2, projection_dim) and
        # c (n_layers, 2, dim), or None for zeros. Stored with the weights (see weights.py).
        self.start_state: LstmState | None = None
        self.use_start_state = True
        self.window: int | None = DEFAULT_WINDOW
        boundary = tokens_to_ids([BOS_TOKEN, EOS_TOKEN], options.char_cnn.max_characters_per_token)
        self.register_buffer("_boundary_ids", boundary, persistent=False)

    @classmethod
    def load(cls, options_file: str | Path, weight_file: str | Path, stateful: bool = False) -> BiLM:
        """Read options.json and an original-format HDF5 weight file; the model is in eval mode."""
        bilm = cls(BiLMOptions.from_file(options_file), stateful=stateful)
        load_weights(bilm, weight_file)
        return bilm.eval()

    def save(self, options_file: str | Path, weight_file: str | Path) -> None:
        """Write options.json and the weights in the original layout."""
        self.options.save(options_file)
        save_weights(self, weight_file)

    @property
    def output_dim(self) -> int:
        return self.options.output_dim

    @property
    def num_layers(self) -> int:
        """Layers for downstream use: the token layer plus one per LSTM layer."""
        return self.options.num_layers

    def reset_states(self) -> None:
        """Forget the carried LSTM states (stateful mode starts again from zeros)."""
        self._carried = None

    def encode_tokens(self, tokens: list[str]) -> torch.Tensor:
        """Context-independent token vectors from the char CNN: (n_tokens, projection_dim)."""
        if len(tokens) == 0:
            raise ValueError("encode_tokens needs at least one token")
        ids = tokens_to_ids(tokens, self.options.char_cnn.max_characters_per_token)
        return self.token_encoder.encode_unique(ids.to(self._boundary_ids.device))

    def forward(self, char_ids: torch.Tensor, keep_sentence_boundaries: bool = False) -> BiLMOutput:
        """char_ids (batch, timesteps, max_chars) -> layers (num_layers + 1, batch, timesteps',
        2 * projection_dim), timesteps' = timesteps (+ 2 with the boundaries kept)."""
        self._check_input(char_ids)
        ids, lengths = self.add_sentence_boundaries(char_ids)
        return self.contextualize(self.token_encoder(ids), lengths, keep_sentence_boundaries)

    def contextualize(
        self, tokens: torch.Tensor, lengths: torch.Tensor, keep_sentence_boundaries: bool = False
    ) -> BiLMOutput:
        """Run the LSTMs over token vectors that already include <S> and </S>.

        tokens: (batch, steps, projection_dim) from the token encoder; lengths: (batch,) counting
        the boundaries. Sequences longer than ``window`` steps are processed in windows that carry
        the LSTM states across (identical results, bounded memory).
        """
        if not needs_autograd(self.lstm, tokens):
            return self._contextualize_packed(tokens, lengths, keep_sentence_boundaries)
        inputs = torch.stack([tokens, reverse_padded(tokens, lengths)])
        outputs, final = self._run_lstm(inputs, lengths, self._initial_state(tokens.shape[0], tokens))
        if self.stateful:
            self._carry(final)
        backward = reverse_padded(outputs[:, 1], lengths, time_dim=2)
        lstm_layers = torch.cat([outputs[:, 0], backward], dim=-1)
        steps = tokens.shape[1]
        mask = torch.arange(steps, device=tokens.device).unsqueeze(0) < lengths.unsqueeze(1).to(tokens.device)
        token_layer = torch.cat([tokens, tokens], dim=-1) * mask.unsqueeze(-1).to(tokens.dtype)
        layers = torch.cat([token_layer.unsqueeze(0), lstm_layers], dim=0)
        if keep_sentence_boundaries:
            return BiLMOutput(layers, mask)
        inner_mask = mask[:, 2:]  # position t holds token t + 1; the last two are never real
        inner = layers[:, :, 1:-1] * inner_mask.unsqueeze(-1).to(layers.dtype).unsqueeze(0)
        return BiLMOutput(inner, inner_mask)

    @torch.no_grad()
    def _contextualize_packed(
        self, tokens: torch.Tensor, lengths: torch.Tensor, keep_sentence_boundaries: bool
    ) -> BiLMOutput:
        """``contextualize`` without autograd, on the real positions only: each window's tokens
        are gathered straight into the packed layout of both directions (the backward one
        reversed), and the LSTM outputs are scattered straight into the result."""
        batch, steps, dim = tokens.shape
        device = tokens.device
        lengths_cpu = lengths.cpu().clamp(0, steps)
        lengths_dev = lengths_cpu.to(device)
        first = 0 if keep_sentence_boundaries else 1  # drop <S> and </S> unless kept
        width = max(steps - 2 * first, 0)
        n_layers = self.options.lstm.n_layers
        layers = tokens.new_zeros(n_layers + 1, batch * width * 2, dim)
        flat = tokens.reshape(batch * steps, dim)
        state = self._initial_state(batch, tokens)
        window = self.window or steps
        for start in range(0, steps, window):
            packing = Packing.from_lengths(lengths_cpu - start, min(window, steps - start), device)
            if packing.size == 0:
                break
            rows, t = packing.rows, packing.times + start
            n = lengths_dev[rows]
            forward = flat.index_select(0, rows * steps + t)
            inputs = torch.stack([forward, flat.index_select(0, rows * steps + (n - 1 - t))])
            packed, state = self.lstm.run_packed(inputs, packing, state)
            # Result rows: (row * width + position) * 2 + direction.
            target_f = (rows * width + t - first) * 2
            target_b = (rows * width + (n - 1 - t) - first) * 2 + 1
            if first:
                real = ((t >= first) & (t < n - first)).nonzero(as_tuple=True)[0]
                target_f, target_b, forward = target_f[real], target_b[real], forward[real]
                packed = packed.index_select(2, real)
            layers[0].index_copy_(0, torch.cat([target_f, target_f + 1]), forward.repeat(2, 1))
            layers[1:].index_copy_(1, torch.cat([target_f, target_b]), packed.flatten(1, 2))
        if self.stateful:
            self._carry(state)
        mask = torch.arange(steps, device=device).unsqueeze(0) < lengths_dev.unsqueeze(1)
        if first:
            mask = mask[:, 2:]
        return BiLMOutput(layers.view(n_layers + 1, batch, width, 2 * dim), mask)

    def _run_lstm(
        self, inputs: torch.Tensor, lengths: torch.Tensor, state: LstmState
    ) -> tuple[torch.Tensor, LstmState]:
        """inputs (2, batch, steps, dim) -> (n_layers, 2, batch, steps, proj), in time windows."""
        steps = inputs.shape[2]
        if self.window is None or steps <= self.window:
            return self.lstm(inputs, lengths, state)
        pieces = []
        for start in range(0, steps, self.window):
            chunk = inputs[:, :, start : start + self.window]
            chunk_lengths = (lengths - start).clamp(0, chunk.shape[2])
            out, state = self.lstm(chunk, chunk_lengths, state)
            pieces.append(out)
        return torch.cat(pieces, dim=3), state

    def _check_input(self, char_ids: torch.Tensor) -> None:
        max_chars = self.options.char_cnn.max_characters_per_token
        if char_ids.dim() != 3 or char_ids.shape[-1] != max_chars:
            raise ValueError(
                f"char_ids must have shape (batch, timesteps, {max_chars}), got "
                f"{tuple(char_ids.shape)}; make them with elmokit.batch_to_ids"
            )
        if char_ids.shape[0] == 0:
            raise ValueError("empty batch: char_ids has no sentences")

    def add_sentence_boundaries(self, char_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch, timesteps, c) -> ids (batch, timesteps + 2, c) with <S> .. </S>, lengths + 2.

        Rows are filled from the left; a row of length n gets <S> at 0 and </S> at n + 1."""
        batch, steps, chars = char_ids.shape
        lengths = lengths_from_ids(char_ids)
        ids = char_ids.new_zeros(batch, steps + 2, chars)
        ids[:, 1:-1] = char_ids
        ids[:, 0] = self._boundary_ids[0]
        ids[torch.arange(batch, device=ids.device), lengths + 1] = self._boundary_ids[1]
        return ids, lengths + 2

    def _initial_state(self, batch: int, like: torch.Tensor) -> LstmState:
        zero = self.lstm.zero_state(batch, like.device)
        zero = LstmState(zero.h.to(like.dtype), zero.c.to(like.dtype))
        if not self.stateful:
            if self.start_state is None or not self.use_start_state:
                return zero
            h, c = (t.to(like.device, like.dtype).unsqueeze(2) for t in self.start_state)
            return LstmState(h.expand_as(zero.h).contiguous(), c.expand_as(zero.c).contiguous())
        if self._carried is None:
            return zero
        carried = self._carried
        rows = min(batch, carried.h.shape[2])
        h = torch.cat([carried.h[:, :, :rows], zero.h[:, :, rows:]], dim=2)
        c = torch.cat([carried.c[:, :, :rows], zero.c[:, :, rows:]], dim=2)
        return LstmState(h, c)

    def _carry(self, final: LstmState) -> None:
        """Store each row's final state; rows beyond this batch keep their previous state."""
        final = final.detach()
        batch = final.h.shape[2]
        old = self._carried
        if old is not None and old.h.shape[2] > batch:
            final = LstmState(
                torch.cat([final.h, old.h[:, :, batch:]], dim=2),
                torch.cat([final.c, old.c[:, :, batch:]], dim=2),
            )
        self._carried = final
