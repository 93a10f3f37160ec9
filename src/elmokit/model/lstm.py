"""The forward and backward LSTM stacks with projection, clips and skip connections.

Both directions are computed together: every tensor has a leading direction axis of size 2
(0 = forward, 1 = backward), and each direction's input is already in its own reading order
(the backward input is the sentence reversed). State is explicit:
``(inputs, lengths, state) -> (outputs, state)``.

The cell is TensorFlow's LSTMCell as the original uses it: gates in the order i, j (candidate),
f, o; 1.0 added to the forget gate at run time; the cell clipped before tanh(c); the projected
output clipped after the projection.

Inside, the layers work on *packed* sequences: the real positions only, time-major, rows sorted
by length (longest first), so that step t holds rows ``0 .. batch_sizes[t] - 1`` in one
contiguous block. Padding is never computed, and a row's hidden state at step t is also its
output at step t, so the recurrence reads the previous step's block of the output.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..base import kernels
from ..base.kernels import needs_autograd
from .options import LstmOptions

__all__: list[str] = []

FORGET_BIAS = 1.0

# The input side of the gates is computed for groups of timesteps holding at most this many
# elements (2 directions x packed rows x 4 * dim), which bounds memory for long or large batches.
INPUT_CHUNK_ELEMENTS = 1 << 21


class LstmState(NamedTuple):
    """LSTM states of both directions for every layer.

    h: (n_layers, 2, batch, projection_dim); c: (n_layers, 2, batch, dim).
    """

    h: torch.Tensor
    c: torch.Tensor

    def select(self, rows: torch.Tensor) -> LstmState:
        """The states of the given batch rows."""
        return LstmState(self.h[:, :, rows], self.c[:, :, rows])

    def detach(self) -> LstmState:
        return LstmState(self.h.detach(), self.c.detach())


class Packing(NamedTuple):
    """The real positions of a batch in the packed layout: time-major, rows sorted by length
    (longest first), so that step t is one block of ``batch_sizes[t]`` packed rows.

    batch_sizes[t]: rows still running at step t; offsets[t]: the first packed row of step t
    (offsets[-1] = number of packed rows); rows, times (n_packed,): the original batch row and
    the step of each packed row; order: sorted rank -> original row (None if the rows are
    already sorted); last (batch,): the packed row of each sorted row's last step (-1 for a row
    of length 0).
    """

    batch_sizes: list[int]
    offsets: list[int]
    rows: torch.Tensor
    times: torch.Tensor
    order: torch.Tensor | None
    last: torch.Tensor

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor, steps: int, device: torch.device | None = None) -> Packing:
        """lengths (batch,) of rows over ``steps`` timesteps (clamped to 0 .. steps)."""
        lengths = lengths.cpu().clamp(0, steps)
        order = None
        if not bool((lengths[:-1] >= lengths[1:]).all()):
            order = torch.argsort(lengths, descending=True, stable=True)
            lengths = lengths[order]
        running = torch.arange(steps).unsqueeze(1) < lengths.unsqueeze(0)  # (steps, batch)
        batch_sizes = running.sum(1)
        offsets = torch.zeros(steps + 1, dtype=torch.long)
        torch.cumsum(batch_sizes, 0, out=offsets[1:])
        times, rank = running.nonzero(as_tuple=True)  # time-major, ranks ascending
        rows = rank if order is None else order[rank]
        last = torch.where(lengths > 0, offsets[(lengths - 1).clamp(min=0)] + torch.arange(len(lengths)), -1)
        return cls(
            batch_sizes.tolist(),
            offsets.tolist(),
            rows.to(device),
            times.to(device),
            None if order is None else order.to(device),
            last,
        )

    @property
    def size(self) -> int:
        """Number of packed rows (real positions)."""
        return self.offsets[-1] if self.offsets else 0

    def final_outputs(self, outputs: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        """Each sorted row's output at its last step: packed outputs (2, n_packed, proj) ->
        (2, batch, proj); a row of length 0 keeps its row of h0 (2, batch, proj)."""
        final = h0.clone()
        ran = (self.last >= 0).nonzero(as_tuple=True)[0]
        if len(ran):
            final[:, ran.to(h0.device)] = outputs[:, self.last[ran].to(outputs.device)]
        return final

    def groups(self, max_rows: int) -> Iterator[tuple[int, int]]:
        """(first step, end step) of consecutive groups of the running steps, each of at most
        ``max_rows`` packed rows (or one step, if that step alone has more)."""
        sizes, offsets = self.batch_sizes, self.offsets
        start = 0
        while start < len(sizes) and sizes[start] > 0:
            end = start + 1
            while end < len(sizes) and sizes[end] > 0 and offsets[end + 1] - offsets[start] <= max_rows:
                end += 1
            yield start, end
            start = end


class BiLstmLayer(nn.Module):
    """One LSTM layer for both directions, with its own weights per direction.

    Parameters (TensorFlow layout, [in, out]): weight_input (2, input_dim, 4 * dim),
    weight_hidden (2, projection_dim, 4 * dim), bias (2, 4 * dim) and, when projecting,
    weight_projection (2, dim, projection_dim).
    """

    def __init__(self, input_dim: int, options: LstmOptions) -> None:
        super().__init__()
        dim, out_dim = options.dim, options.projection_dim
        self.dim, self.output_dim = dim, out_dim
        self.cell_clip, self.proj_clip = options.cell_clip, options.proj_clip
        self.weight_input = nn.Parameter(torch.empty(2, input_dim, 4 * dim))
        self.weight_hidden = nn.Parameter(torch.empty(2, out_dim, 4 * dim))
        self.bias = nn.Parameter(torch.zeros(2, 4 * dim))
        self.weight_projection = (
            nn.Parameter(torch.empty(2, dim, out_dim)) if options.has_projection else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot-uniform kernels as TensorFlow's default, on the [input; h] matrix; zero bias."""
        fan_in = self.weight_input.shape[1] + self.weight_hidden.shape[1]
        bound = (6.0 / (fan_in + 4 * self.dim)) ** 0.5
        nn.init.uniform_(self.weight_input, -bound, bound)
        nn.init.uniform_(self.weight_hidden, -bound, bound)
        nn.init.zeros_(self.bias)
        if self.weight_projection is not None:
            bound = (6.0 / (self.dim + self.output_dim)) ** 0.5
            nn.init.uniform_(self.weight_projection, -bound, bound)

    def forward(
        self, inputs: torch.Tensor, packing: Packing, h0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the recurrence over time on packed inputs.

        inputs: (2, n_packed, input_dim) (see ``Packing``); h0 (2, batch, projection_dim) and
        c0 (2, batch, dim) in sorted row order. Returns the packed outputs (2, n_packed,
        projection_dim) and the final h and c of each (sorted) row, taken after its last step
        (rows of length 0 keep h0, c0).

        Each step's h and c are new tensors; the next step reads their first rows. The input
        side of the gates is computed for groups of steps: all at once with autograd (the
        backward pass keeps every step's gates anyway), else groups of at most
        ``INPUT_CHUNK_ELEMENTS`` values, which bounds memory for long or large batches. Without
        autograd the kernel ``lstm_inplace`` runs the same steps in buffers (same values).
        """
        sizes, offsets = packing.batch_sizes, packing.offsets
        grad = needs_autograd(self, inputs, h0, c0)
        group_rows = packing.size if grad else max(INPUT_CHUNK_ELEMENTS // (8 * self.dim), 1)
        if not grad and kernels.enabled("lstm_inplace"):
            weights = (self.weight_input, self.bias.unsqueeze(1), self.weight_hidden, self.weight_projection)
            clips = (self.cell_clip, self.proj_clip)
            return kernels.lstm_layer_inplace(
                inputs, packing, h0, c0, weights, FORGET_BIAS, clips, group_rows
            )
        bias = self.bias.unsqueeze(1)
        h, c = h0, c0
        outputs, ended_h, ended_c = [], [], []
        for start, end in packing.groups(group_rows):
            projected = torch.baddbmm(bias, inputs[:, offsets[start] : offsets[end]], self.weight_input)
            # One view per step from one split: its backward concatenates the step gradients
            # once, where slicing would add each into a zero-filled tensor of the full size.
            per_step = projected.split(sizes[start:end], dim=1)
            for t in range(start, end):
                n = sizes[t]
                h, c = self._step(per_step[t - start], h[:, :n], c[:, :n])
                outputs.append(h)
                n_next = sizes[t + 1] if t + 1 < len(sizes) else 0
                if n_next < n:  # rows n_next .. n - 1 end here
                    ended_h.append(h[:, n_next:])
                    ended_c.append(c[:, n_next:])
        n_running = sizes[0] if sizes else 0
        final_h = torch.cat([*reversed(ended_h), h0[:, n_running:]], dim=1)
        final_c = torch.cat([*reversed(ended_c), c0[:, n_running:]], dim=1)
        if not outputs:
            return inputs.new_zeros(2, 0, self.output_dim), final_h, final_c
        return torch.cat(outputs, dim=1), final_h, final_c

    def _step(
        self, projected: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The LSTM cell, one timestep for n rows: projected (2, n, 4 * dim) (the input side of
        the gates), h (2, n, proj), c (2, n, dim) -> the new h and c.

        Out of place, where the kernel ``lstm_inplace`` and the int8 form share the cell written
        in place (``base.kernels.lstm_cell_``): autograd cannot go through writes into the gates
        and the cell. The same floats as it (tests/test_fast_paths.py)."""
        gates = torch.baddbmm(projected, h, self.weight_hidden)
        i, j, f, o = gates.chunk(4, dim=-1)
        # c * f + i * j as one addcmul: the rounding of every elmokit release so far
        c = torch.addcmul(c * torch.sigmoid(f + FORGET_BIAS), torch.sigmoid(i), torch.tanh(j))
        if self.cell_clip is not None:
            c = c.clamp(-self.cell_clip, self.cell_clip)
        h = torch.sigmoid(o) * torch.tanh(c)
        if self.weight_projection is not None:
            h = torch.bmm(h, self.weight_projection)
        if self.proj_clip is not None:
            h = h.clamp(-self.proj_clip, self.proj_clip)
        return h, c


class BiLstm(nn.Module):
    """``n_layers`` forward and backward LSTM layers; a layer from the second on adds its input
    to its output when ``use_skip_connections`` (after clipping, so outputs can exceed the clip).

    ``dropout`` (training only) drops each layer's input, as the original's DropoutWrapper.
    """

    def __init__(self, input_dim: int, options: LstmOptions, dropout: float = 0.0) -> None:
        super().__init__()
        self.options = options
        self.dropout = dropout
        dims = [input_dim] + [options.projection_dim] * (options.n_layers - 1)
        self.layers = nn.ModuleList(BiLstmLayer(d, options) for d in dims)

    @property
    def lstm_layers(self) -> Sequence[BiLstmLayer]:
        """The layers, first to last (``self.layers``, typed as what it holds)."""
        return cast("Sequence[BiLstmLayer]", self.layers)

    def zero_state(self, batch: int, device: torch.device | None = None) -> LstmState:
        """All-zero states for ``batch`` rows."""
        n, opt = self.options.n_layers, self.options
        return LstmState(
            torch.zeros(n, 2, batch, opt.projection_dim, device=device),
            torch.zeros(n, 2, batch, opt.dim, device=device),
        )

    def forward(
        self, inputs: torch.Tensor, lengths: torch.Tensor, state: LstmState | None = None
    ) -> tuple[torch.Tensor, LstmState]:
        """inputs (2, batch, timesteps, input_dim), each direction in its reading order and
        left-aligned; lengths (batch,). Returns outputs (n_layers, 2, batch, timesteps,
        projection_dim), zero past each row's length, and the final state of each row (taken at
        its last real step; rows of length 0 keep their initial state)."""
        _, batch, steps, input_dim = inputs.shape
        packing = Packing.from_lengths(lengths, steps, inputs.device)
        index = packing.rows * steps + packing.times
        x = inputs.reshape(2, batch * steps, input_dim).index_select(1, index)
        dropout_layout = (batch * steps, index) if self.training and self.dropout > 0 else None
        packed, final = self.run_packed(x, packing, state, dropout_layout)
        shape = (len(self.layers), 2, batch * steps, self.options.projection_dim)
        if packed.requires_grad:
            outputs = packed.new_zeros(shape).index_copy(2, index, packed)
        else:
            outputs = packed.new_zeros(shape).index_copy_(2, index, packed)
        return outputs.view(*shape[:2], batch, steps, shape[-1]), final

    def run_packed(
        self,
        inputs: torch.Tensor,
        packing: Packing,
        state: LstmState | None = None,
        dropout_layout: tuple[int, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, LstmState]:
        """The layers on packed inputs (2, n_packed, input_dim) -> packed outputs (n_layers, 2,
        n_packed, projection_dim) and the final state (rows in their original order).

        ``dropout_layout`` = (batch * timesteps, flat index of each packed row) draws the
        dropout masks on the padded (2, batch, timesteps, dim) layout (training)."""
        batch = len(packing.last)
        if state is None:
            state = self.zero_state(batch, inputs.device)
            state = LstmState(state.h.to(inputs.dtype), state.c.to(inputs.dtype))
        if packing.order is not None:
            state = state.select(packing.order)
        x = inputs
        outputs, final_h, final_c = [], [], []
        for k, layer in enumerate(self.layers):
            if dropout_layout is not None:
                size, index = dropout_layout
                noise = F.dropout(x.new_ones(2, size, x.shape[-1]), self.dropout, True)
                x = x * noise.index_select(1, index)
            out, h, c = layer(x, packing, state.h[k], state.c[k])
            if k > 0 and self.options.use_skip_connections:
                out = out + x
            outputs.append(out)
            final_h.append(h)
            final_c.append(c)
            x = out
        packed = torch.stack(outputs)
        final = LstmState(torch.stack(final_h), torch.stack(final_c))
        if packing.order is not None:
            final = final.select(torch.argsort(packing.order))
        return packed, final
