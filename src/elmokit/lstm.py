"""The forward and backward LSTM stacks with projection, clips and skip connections.

Both directions are computed together: every tensor has a leading direction axis of size 2
(0 = forward, 1 = backward), and each direction's input is already in its own reading order
(the backward input is the sentence reversed). State is explicit:
``(inputs, lengths, state) -> (outputs, state)``.

The cell is TensorFlow's LSTMCell as the original uses it: gates in the order i, j (candidate),
f, o; 1.0 added to the forget gate at run time; the cell clipped before tanh(c); the projected
output clipped after the projection.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .options import LstmOptions

FORGET_BIAS = 1.0


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
        self,
        inputs: torch.Tensor,
        batch_sizes: list[int],
        h0: torch.Tensor,
        c0: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the recurrence over time.

        inputs: (2, batch, timesteps, input_dim), rows sorted by length (longest first);
        batch_sizes[t]: number of rows still running at step t; h0 (2, batch, projection_dim),
        c0 (2, batch, dim). Returns outputs (2, batch, timesteps, projection_dim), zero where a
        row has ended, and the final h and c (each row's state after its last step).
        """
        _, batch, steps, input_dim = inputs.shape
        # The input side of all timesteps in one matmul per direction.
        projected = torch.baddbmm(
            self.bias.unsqueeze(1), inputs.reshape(2, batch * steps, input_dim), self.weight_input
        ).view(2, batch, steps, 4 * self.dim)
        # One view per step: the backward pass then stacks the step gradients once instead of
        # adding each into a zero-filled tensor of the full size.
        per_step = projected.unbind(2)
        h, c = h0, c0
        outputs = []
        for t in range(steps):
            n = batch_sizes[t]
            if n == 0:
                break
            x_t = per_step[t] if n == batch else per_step[t][:, :n]
            h_t, c_t = self._step(x_t, h[:, :n], c[:, :n])
            if n < batch:
                h = torch.cat([h_t, h[:, n:]], dim=1)
                c = torch.cat([c_t, c[:, n:]], dim=1)
            else:
                h, c = h_t, c_t
            outputs.append(h_t if n == batch else F.pad(h_t, (0, 0, 0, batch - n)))
        if not outputs:
            return inputs.new_zeros(2, batch, steps, self.output_dim), h, c
        out = torch.stack(outputs, dim=2)
        if out.shape[2] < steps:
            out = F.pad(out, (0, 0, 0, steps - out.shape[2]))
        return out, h, c

    def _step(
        self, projected: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One timestep for n rows: projected (2, n, 4 * dim), h (2, n, proj), c (2, n, dim)."""
        gates = torch.baddbmm(projected, h, self.weight_hidden)
        i, j, f, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f + FORGET_BIAS) * c + torch.sigmoid(i) * torch.tanh(j)
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
        batch, steps = inputs.shape[1], inputs.shape[2]
        if state is None:
            state = self.zero_state(batch, inputs.device)
        lengths_cpu = lengths.cpu()
        sorted_rows = bool((lengths_cpu[:-1] >= lengths_cpu[1:]).all())
        order = None
        if not sorted_rows:
            order = torch.argsort(lengths_cpu, descending=True, stable=True)
            lengths_cpu = lengths_cpu[order]
            order = order.to(inputs.device)
            inputs, state = inputs[:, order], state.select(order)
        batch_sizes = (lengths_cpu.unsqueeze(0) > torch.arange(steps).unsqueeze(1)).sum(1).tolist()

        layer_outputs, final_h, final_c = [], [], []
        x = inputs
        for k, layer in enumerate(self.layers):
            if self.training and self.dropout > 0:
                x = F.dropout(x, self.dropout, training=True)
            out, h, c = layer(x, batch_sizes, state.h[k], state.c[k])
            if k > 0 and self.options.use_skip_connections:
                out = out + x
            layer_outputs.append(out)
            final_h.append(h)
            final_c.append(c)
            x = out
        mask = (torch.arange(steps) < lengths_cpu.unsqueeze(1)).to(inputs.device, inputs.dtype)
        outputs = torch.stack(layer_outputs) * mask[:, :, None]
        final = LstmState(torch.stack(final_h), torch.stack(final_c))
        if order is not None:
            inverse = torch.argsort(order)
            outputs, final = outputs[:, :, inverse], final.select(inverse)
        return outputs, final
