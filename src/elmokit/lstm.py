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

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .options import LstmOptions

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


def needs_autograd(module: nn.Module, *tensors: torch.Tensor) -> bool:
    """Whether to run out-of-place (autograd, or autocast, which in-place ops would bypass)."""
    if torch.is_autocast_enabled(tensors[0].device.type):
        return True
    return torch.is_grad_enabled() and (
        any(t.requires_grad for t in tensors) or any(p.requires_grad for p in module.parameters())
    )


def full_precision(tensor: torch.Tensor) -> bool:
    """Whether the hand-written training kernels (``_LayerRecurrence``, the char CNN's
    ``_PooledConvolutions``) apply: float32 or float64 and no autocast."""
    return tensor.dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled(
        tensor.device.type
    )


def _use_fused_recurrence(inputs: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, packing: Packing) -> bool:
    """Whether the training recurrence can run as one autograd node (``_LayerRecurrence``):
    full-precision tensors of one dtype, at least one real position."""
    return packing.size > 0 and full_precision(inputs) and h0.dtype == c0.dtype == inputs.dtype


def _final_states(initial: torch.Tensor, packed: torch.Tensor, packing: Packing) -> torch.Tensor:
    """Each sorted row's state after its last step, taken from the packed per-step states
    (2, n_packed, d); rows of length 0 keep ``initial`` (2, batch, d)."""
    final = initial.clone()
    ran = (packing.last >= 0).nonzero(as_tuple=True)[0]
    if len(ran):
        final[:, ran.to(final.device)] = packed[:, packing.last[ran].to(packed.device)]
    return final


class _LayerRecurrence(torch.autograd.Function):
    """One BiLstmLayer over packed inputs as a single autograd node, for training.

    The forward pass is the arithmetic of ``BiLstmLayer._step`` written into preallocated
    buffers (it keeps the activated gates, the cells, tanh of the cells and the clip masks);
    the backward pass runs the recurrence backwards by hand and computes the weight gradients
    once for all timesteps (one matmul over all packed rows instead of one per step), so the
    per-step work is two small matmuls and a few elementwise ops, with no autograd bookkeeping.
    Values and gradients equal those of ``BiLstmLayer._recur_autograd`` (still used under
    autocast and for reduced precision) up to float rounding; the weight gradients' sums run
    in another order.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        inputs: torch.Tensor,
        h0: torch.Tensor,
        c0: torch.Tensor,
        w_input: torch.Tensor,
        bias: torch.Tensor,
        w_hidden: torch.Tensor,
        w_proj: torch.Tensor | None,
        packing: Packing,
        cell_clip: float | None,
        proj_clip: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sizes, offsets = packing.batch_sizes, packing.offsets
        steps = sum(1 for n in sizes if n > 0)  # sizes do not increase
        dim = w_hidden.shape[-1] // 4
        out_dim = h0.shape[-1]
        # input side of every step at once; the buffer then holds the activated gates
        acts = torch.baddbmm(bias.unsqueeze(1), inputs, w_input)
        cells = inputs.new_empty(2, packing.size, dim)
        tanh_cells = torch.empty_like(cells)
        hidden = torch.empty_like(cells) if w_proj is not None else None  # o * tanh(c)
        out = inputs.new_empty(2, packing.size, out_dim)
        cell_mask = None if cell_clip is None else torch.empty_like(cells, dtype=torch.bool)
        out_mask = None if proj_clip is None else torch.empty_like(out, dtype=torch.bool)
        h_prev, c_prev = h0, c0
        for t in range(steps):
            n, a, b = sizes[t], offsets[t], offsets[t + 1]
            gates = acts[:, a:b]
            gates.baddbmm_(h_prev[:, :n], w_hidden)
            i, j, f, o = gates.chunk(4, dim=-1)
            f.add_(FORGET_BIAS)
            gates[..., 2 * dim :].sigmoid_()  # f and o
            i.sigmoid_()
            j.tanh_()
            c = cells[:, a:b]
            torch.mul(f, c_prev[:, :n], out=c).add_(i * j)
            if cell_clip is not None:
                torch.le(c.abs(), cell_clip, out=cell_mask[:, a:b])
                c.clamp_(-cell_clip, cell_clip)
            tc = torch.tanh(c, out=tanh_cells[:, a:b])
            h = out[:, a:b]
            if w_proj is not None:
                torch.bmm(torch.mul(o, tc, out=hidden[:, a:b]), w_proj, out=h)
            else:
                torch.mul(o, tc, out=h)
            if proj_clip is not None:
                torch.le(h.abs(), proj_clip, out=out_mask[:, a:b])
                h.clamp_(-proj_clip, proj_clip)
            h_prev, c_prev = h, c
        final_h, final_c = _final_states(h0, out, packing), _final_states(c0, cells, packing)
        ctx.packing, ctx.steps = packing, steps
        ctx.save_for_backward(
            inputs, h0, c0, w_input, w_hidden, w_proj, acts, cells, tanh_cells, hidden, out,
            cell_mask, out_mask,
        )
        return out, final_h, final_c

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, d_out: torch.Tensor, d_final_h: torch.Tensor, d_final_c: torch.Tensor):  # type: ignore[override]
        (
            inputs, h0, c0, w_input, w_hidden, w_proj, acts, cells, tanh_cells, hidden, out,
            cell_mask, out_mask,
        ) = ctx.saved_tensors
        packing, steps = ctx.packing, ctx.steps
        sizes, offsets = packing.batch_sizes, packing.offsets
        d_acts = torch.empty_like(acts)  # gradient of the gates before activation
        d_out_clipped = torch.empty_like(out) if w_proj is not None else None
        w_hidden_t = w_hidden.transpose(1, 2)
        w_proj_t = w_proj.transpose(1, 2) if w_proj is not None else None
        dh_next = dc_next = None  # gradients flowing into step t from step t + 1
        for t in range(steps - 1, -1, -1):
            n, a, b = sizes[t], offsets[t], offsets[t + 1]
            n_next = sizes[t + 1] if t + 1 < steps else 0
            dh = d_out[:, a:b].clone()
            dh[:, n_next:] += d_final_h[:, n_next:n]  # rows whose last step is t
            if dh_next is not None:
                dh[:, :n_next] += dh_next
            if out_mask is not None:
                dh.mul_(out_mask[:, a:b])
            i, j, f, o = acts[:, a:b].chunk(4, dim=-1)
            tc = tanh_cells[:, a:b]
            if w_proj is not None:
                d_out_clipped[:, a:b] = dh
                dm = torch.bmm(dh, w_proj_t)
            else:
                dm = dh
            # m = o * tanh(c)
            dc = dm * o
            dc.mul_(1.0 - tc * tc)
            dc[:, n_next:] += d_final_c[:, n_next:n]
            if dc_next is not None:
                dc[:, :n_next] += dc_next
            if cell_mask is not None:
                dc.mul_(cell_mask[:, a:b])
            c_prev = cells[:, offsets[t - 1] : offsets[t - 1] + n] if t > 0 else c0[:, :n]
            gi, gj, gf, go = d_acts[:, a:b].chunk(4, dim=-1)
            # c = f * c_prev + i * j; the gates' derivatives through sigmoid and tanh
            torch.mul(dc, j, out=gi).mul_(i * (1.0 - i))
            torch.mul(dc, i, out=gj).mul_(1.0 - j * j)
            torch.mul(dc, c_prev, out=gf).mul_(f * (1.0 - f))
            torch.mul(dm, tc, out=go).mul_(o * (1.0 - o))
            dc_next = dc.mul_(f)
            dh_next = torch.bmm(d_acts[:, a:b], w_hidden_t)
        # the first step's recurrence reads h0, c0 (rows 0 .. sizes[0] - 1); rows of length 0
        # pass their initial state through
        n0 = sizes[0]
        d_h0 = d_final_h.clone()
        d_c0 = d_final_c.clone()
        d_h0[:, :n0] = dh_next
        d_c0[:, :n0] = dc_next
        needs = ctx.needs_input_grad
        d_inputs = d_w_input = d_bias = d_w_hidden = d_w_proj = None
        if needs[0]:
            d_inputs = torch.bmm(d_acts, w_input.transpose(1, 2))
        if needs[3]:
            d_w_input = torch.bmm(inputs.transpose(1, 2), d_acts)
        if needs[4]:
            d_bias = d_acts.sum(dim=1)
        if needs[5]:
            # the h each step's recurrence read: h0 for step 0, else the previous step's outputs
            previous = [h0[:, :n0]] + [
                out[:, offsets[t - 1] : offsets[t - 1] + sizes[t]] for t in range(1, steps)
            ]
            d_w_hidden = torch.bmm(torch.cat(previous, dim=1).transpose(1, 2), d_acts)
        if w_proj is not None and needs[6]:
            d_w_proj = torch.bmm(hidden.transpose(1, 2), d_out_clipped)
        return (
            d_inputs, d_h0 if needs[1] else None, d_c0 if needs[2] else None, d_w_input, d_bias,
            d_w_hidden, d_w_proj, None, None, None,
        )


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
        packing: Packing,
        h0: torch.Tensor,
        c0: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the recurrence over time on packed inputs.

        inputs: (2, n_packed, input_dim) (see ``Packing``); h0 (2, batch, projection_dim) and
        c0 (2, batch, dim) in sorted row order. Returns the packed outputs (2, n_packed,
        projection_dim) and the final h and c of each (sorted) row, taken after its last step
        (rows of length 0 keep h0, c0). When no gradient is needed the outputs are written into
        ``out`` if given.
        """
        if needs_autograd(self, inputs, h0, c0):
            if _use_fused_recurrence(inputs, h0, c0, packing):
                return _LayerRecurrence.apply(
                    inputs, h0, c0, self.weight_input, self.bias, self.weight_hidden,
                    self.weight_projection, packing, self.cell_clip, self.proj_clip,
                )
            return self._recur_autograd(inputs, packing, h0, c0)
        return self._recur_inplace(inputs, packing, h0, c0, out)

    def _input_chunks(self, inputs: torch.Tensor, packing: Packing, inplace: bool = False):
        """(first step, end step, input-side gates (2, rows, 4 * dim)) for groups of steps.

        In place, the groups hold at most INPUT_CHUNK_ELEMENTS values and are all written into
        one buffer (the caller must be done with a group before asking for the next). Out of
        place (autograd) all steps form one group: the backward pass keeps every step's gates
        anyway, so smaller groups would not bound memory."""
        limit = max(INPUT_CHUNK_ELEMENTS // (8 * self.dim), 1) if inplace else packing.size
        sizes, offsets = packing.batch_sizes, packing.offsets
        steps = len(sizes)
        bias = self.bias.unsqueeze(1)
        buffer = None
        start = 0
        while start < steps and sizes[start] > 0:
            end = start + 1
            while end < steps and sizes[end] > 0 and offsets[end + 1] - offsets[start] <= limit:
                end += 1
            rows = inputs[:, offsets[start] : offsets[end]]
            if not inplace:
                yield start, end, torch.baddbmm(bias, rows, self.weight_input)
            else:
                if buffer is None:
                    size = min(max(limit, rows.shape[1]), offsets[-1] - offsets[start])
                    buffer = inputs.new_empty(2, size, 4 * self.dim)
                if buffer.shape[1] < rows.shape[1]:  # one step larger than the limit
                    buffer = inputs.new_empty(2, rows.shape[1], 4 * self.dim)
                projected = buffer[:, : rows.shape[1]]
                projected.copy_(bias.expand_as(projected)).baddbmm_(rows, self.weight_input)
                yield start, end, projected
            start = end

    def _recur_autograd(
        self, inputs: torch.Tensor, packing: Packing, h0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Out-of-place steps (for back-propagation under autocast or in reduced precision;
        otherwise ``_LayerRecurrence`` runs): each step's h and c are new tensors, the next
        step reads their first rows; no full-size copy per step."""
        sizes = packing.batch_sizes
        h, c = h0, c0
        outputs, ended_h, ended_c = [], [], []
        for start, end, projected in self._input_chunks(inputs, packing):
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

    @torch.no_grad()
    def _recur_inplace(
        self,
        inputs: torch.Tensor,
        packing: Packing,
        h0: torch.Tensor,
        c0: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The same arithmetic as ``_step``, in place and without allocation per step.

        Each step's gates and h go to contiguous scratch buffers, then h is copied into the
        output: a matmul into a strided slice of a larger tensor does not take the threaded
        batched path (at batch 1 it ran at half speed on 2 cores). The views of the buffers are
        made once per row count."""
        sizes, offsets = packing.batch_sizes, packing.offsets
        dim, proj = self.dim, self.output_dim
        if out is None:
            out = inputs.new_empty(2, packing.size, proj)
        c = c0.clone()
        w_hidden, w_proj = self.weight_hidden, self.weight_projection
        widest = sizes[0] if sizes else 0
        gate_buffer = inputs.new_empty(2 * widest * 4 * dim)
        h_buffers = (inputs.new_empty(2 * widest * proj), inputs.new_empty(2 * widest * proj))
        views: dict[int, tuple[torch.Tensor, ...]] = {}

        def step_views(n: int) -> tuple[torch.Tensor, ...]:
            """gates, i, j, f, (f, o), o, c, h (even steps), h (odd steps) for n rows."""
            gates = gate_buffer[: 2 * n * 4 * dim].view(2, n, 4 * dim)
            h = [b[: 2 * n * proj].view(2, n, proj) for b in h_buffers]
            gate_views = [gates[..., a * dim : b * dim] for a, b in ((0, 1), (1, 2), (2, 3), (2, 4), (3, 4))]
            return (gates, *gate_views, c[:, :n], *h)

        h_prev = h0.contiguous()
        for start, end, projected in self._input_chunks(inputs, packing, inplace=True):
            base = offsets[start]
            for t in range(start, end):
                n = sizes[t]
                if n not in views:
                    views[n] = step_views(n)
                gates, i, j, f, f_and_o, o, c_t, h_even, h_odd = views[n]
                step_inputs = projected[:, offsets[t] - base : offsets[t + 1] - base]
                torch.baddbmm(step_inputs, h_prev[:, :n], w_hidden, out=gates)
                f.add_(FORGET_BIAS)
                f_and_o.sigmoid_()
                i.sigmoid_()
                j.tanh_()
                c_t.mul_(f).addcmul_(i, j)
                if self.cell_clip is not None:
                    c_t.clamp_(-self.cell_clip, self.cell_clip)
                h_t = h_odd if t % 2 else h_even
                if w_proj is not None:
                    torch.tanh(c_t, out=j).mul_(o)
                    torch.bmm(j, w_proj, out=h_t)
                else:
                    torch.tanh(c_t, out=h_t).mul_(o)
                if self.proj_clip is not None:
                    h_t.clamp_(-self.proj_clip, self.proj_clip)
                out[:, offsets[t] : offsets[t + 1]].copy_(h_t)
                h_prev = h_t
        return out, _final_states(h0, out, packing), c


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
        grad = needs_autograd(self, inputs, state.h, state.c)
        buffer = None
        if not grad:
            n_layers, proj = len(self.layers), self.options.projection_dim
            buffer = inputs.new_empty(n_layers, 2, packing.size, proj)
        x = inputs
        outputs, final_h, final_c = [], [], []
        for k, layer in enumerate(self.layers):
            if dropout_layout is not None:
                size, index = dropout_layout
                noise = F.dropout(x.new_ones(2, size, x.shape[-1]), self.dropout, True)
                x = x * noise.index_select(1, index)
            out, h, c = layer(x, packing, state.h[k], state.c[k], None if grad else buffer[k])
            if k > 0 and self.options.use_skip_connections:
                out = out + x if grad else out.add_(x)
            outputs.append(out)
            final_h.append(h)
            final_c.append(c)
            x = out
        packed = torch.stack(outputs) if grad else buffer
        final = LstmState(torch.stack(final_h), torch.stack(final_c))
        if packing.order is not None:
            final = final.select(torch.argsort(packing.order))
        return packed, final
