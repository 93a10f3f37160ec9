"""Hand-written fast variants ("kernels") of computations that have a plain PyTorch form elsewhere,
and the one switch that turns them off.

The kernels, by name (``enabled(name)``):

- ``char_cnn_matmul``: a narrow convolution's max over positions as one matmul of the unfolded
  windows (``max_over_windows``; on a GPU in float32 at every width, to keep cuDNN's TF32 out);
  plain form: ``conv1d``.
- ``sampled_softmax``: the sampled softmax's log partition in one (N, S) buffer with a
  hand-written backward pass, accidental hits found by binary search (``sampled_log_partition``);
  plain form: ``cross_entropy`` over the concatenated logits.
- ``token_cache``: token encodings kept across calls, in the model's one cache
  (``TokenEncoder``, used by the Embedder, ``Elmo`` and every other ``BiLM`` caller; see
  ``token_cache``); plain form: every call encodes its tokens.
- ``lstm_inplace``: without autograd, an LSTM layer's steps written into buffers made once per
  call (``lstm_layer_inplace``, whose cell ``lstm_cell_`` the int8 form's steps share); plain
  form: ``BiLstmLayer._step`` out of place, step by step.
- ``lstm_scripted``: the int8 LSTM's steps of each direction (``int8.direction_steps``) compiled
  by TorchScript (``int8.scripted``); plain form: the same function run by Python.
- ``pinned_copy``: the Embedder's vectors copied from a GPU through a page-locked buffer
  (``Embedder._to_host``); plain form: ``.cpu()``.
- ``hdf5_free_lists``: libhdf5 hands the blocks it frees back to malloc while vector files are
  written (``elmokit.base._hdf5_tuning``), so a long ``embed`` keeps a flat peak memory; plain form:
  HDF5's own free lists. Changes no number, only memory.

Each gives the values and gradients of its plain form up to float rounding
(tests/test_fast_paths.py, tests/test_training_kernels.py; on a GPU tests/test_cuda.py), and
each was kept because it is at least 5% faster somewhere (benchmarks/results/kernels.md;
variants that were not, such as a hand-written LSTM backward pass, were removed). The switch: ``enabled()``,
``set_enabled(flag, *names)`` and ``with disabled(*names):``. The environment variable
``ELMOKIT_KERNELS`` sets it at import (``parse``): ``0`` (all off), ``1`` (all on, the default), a
comma list of the names to turn on, or of names prefixed with ``-`` to turn off.

Also here, for every module to import without importing each other: ``needs_autograd``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["disabled", "set_enabled"]

NAMES = (
    "char_cnn_matmul",
    "sampled_softmax",
    "token_cache",
    "lstm_inplace",
    "lstm_scripted",
    "pinned_copy",
    "hdf5_free_lists",
)
ENVIRONMENT_VARIABLE = "ELMOKIT_KERNELS"


# ----------------------------------------------------------------------------------------------
# The switch


def parse(text: str) -> frozenset[str]:
    """The kernels an ``ELMOKIT_KERNELS`` value turns on (see the module docstring)."""
    value = text.strip().lower()
    if value in ("", "1", "on", "true", "yes", "all"):
        return frozenset(NAMES)
    if value in ("0", "off", "false", "no", "none"):
        return frozenset()
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = sorted({name.lstrip("-") for name in names} - set(NAMES))
    if unknown:
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE}={text!r}: unknown kernel {', '.join(unknown)} "
            f"(known: {', '.join(NAMES)}; or 0, 1)"
        )
    on = {name for name in names if not name.startswith("-")} or set(NAMES)
    return frozenset(on - {name[1:] for name in names if name.startswith("-")})


_on: frozenset[str] = parse(os.environ.get(ENVIRONMENT_VARIABLE, "1"))


def _check(names: tuple[str, ...]) -> None:
    unknown = [name for name in names if name not in NAMES]
    if unknown:
        raise ValueError(f"unknown kernel {', '.join(unknown)} (known: {', '.join(NAMES)})")


def enabled(name: str | None = None) -> bool:
    """Whether the kernel ``name`` is on; without a name, whether all of them are."""
    if name is None:
        return len(_on) == len(NAMES)
    _check((name,))
    return name in _on


def set_enabled(flag: bool, *names: str) -> None:
    """Turn the kernels named (all of them if none is named) on or off."""
    global _on
    _check(names)
    chosen = set(names or NAMES)
    _on = frozenset(_on | chosen if flag else _on - chosen)


@contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Within the block the kernels named (all if none is) are off; the setting before comes back
    after it."""
    global _on
    before = _on
    set_enabled(False, *names)
    try:
        yield
    finally:
        _on = before


# ----------------------------------------------------------------------------------------------
# Which path applies


def needs_autograd(module: nn.Module, *tensors: torch.Tensor) -> bool:
    """Whether autograd may record (a tensor or a parameter of ``module`` requires grad) or
    autocast is on: then results are computed afresh with out-of-place ops (no in-place writes,
    which autocast would bypass, and no cache)."""
    if torch.is_autocast_enabled(tensors[0].device.type):
        return True
    return torch.is_grad_enabled() and (
        any(t.requires_grad for t in tensors) or any(p.requires_grad for p in module.parameters())
    )


# ----------------------------------------------------------------------------------------------
# Char CNN

# Inputs up to this many character positions are convolved as a matmul (see max_over_windows).
MATMUL_MAX_WIDTH = 20


def max_over_windows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """One convolution and its max over positions: x (n, char_dim, width), weight (n_filters,
    char_dim, filter_width), bias (n_filters,) -> (n, n_filters).

    Plain form: ``conv1d(x, weight, bias)`` and its max (``_max``). Kernel ``char_cnn_matmul``: up to
    ``MATMUL_MAX_WIDTH`` characters (the short length buckets, most tokens) one matmul of the
    unfolded windows (n * positions, char_dim * filter_width) with the weight; over wider inputs
    ``conv1d`` is faster on a CPU. On a GPU in float32 the kernel takes the matmul at every width:
    cuDNN runs float32 convolutions in TF32 by default (10-bit mantissas, errors near 1e-3), a
    float32 matmul keeps full precision unless the caller lowers
    ``torch.set_float32_matmul_precision``."""
    exact_gpu = x.is_cuda and x.dtype == torch.float32
    if (x.shape[-1] > MATMUL_MAX_WIDTH and not exact_gpu) or "char_cnn_matmul" not in _on:
        out, dim = F.conv1d(x, weight, bias), -1
    else:
        n, char_dim, _ = x.shape
        n_filters, _, filter_width = weight.shape
        windows = x.unfold(2, filter_width, 1).permute(0, 2, 1, 3).reshape(-1, char_dim * filter_width)
        out, dim = torch.addmm(bias, windows, weight.view(n_filters, -1).t()).view(n, -1, n_filters), 1
    return _max(out, dim=dim)


def _max(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The max over the positions. With autograd, ``max`` with its index: its backward pass puts
    the gradient at one position (a scatter), where ``amax``'s splits it among tied positions
    (a comparison over all of them, 5% of a training step of the small preset). Tied windows
    are windows of padding characters only, identical, so either gives the same gradients to
    the filters and the embedding up to rounding (TensorFlow's gradient of reduce_max splits)."""
    return x.max(dim=dim).values if x.requires_grad else x.amax(dim=dim)


# ----------------------------------------------------------------------------------------------
# Sampled softmax


def sampled_log_partition(
    hidden: torch.Tensor,
    sampled_w: torch.Tensor,
    sampled_bias: torch.Tensor,
    true_logits: torch.Tensor,
    targets: torch.Tensor,
    sampled_ids: torch.Tensor,
) -> torch.Tensor:
    """Kernel ``sampled_softmax``: log(exp(true_logit) + sum_s exp(h.w_s + bias_s)) per row, the
    sampled ids equal to the row's target (accidental hits) left out.

    hidden (N, D), sampled_w (S, D), sampled_bias (S,) (log Q already subtracted), true_logits
    (N,), targets (N,), sampled_ids (S,) distinct -> (N,). The plain form is the log-sum-exp of
    ``cross_entropy`` over the concatenated [true, sampled] logits with the hits masked."""
    rows, columns = _accidental_hits(targets, sampled_ids)
    return SampledLogPartition.apply(hidden, sampled_w, sampled_bias, true_logits, rows, columns)


def _accidental_hits(targets: torch.Tensor, sampled_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) where ``sampled_ids[column] == targets[row]``; sampled ids are distinct,
    so each row has at most one hit. The same entries as ``targets[:, None] == sampled_ids``,
    found by a binary search instead of an (N, S) comparison."""
    if sampled_ids.numel() == 0:
        empty = targets.new_zeros(0)
        return empty, empty
    ordered, order = torch.sort(sampled_ids)
    position = torch.searchsorted(ordered, targets).clamp_(max=len(ordered) - 1)
    rows = (ordered[position] == targets).nonzero(as_tuple=True)[0]
    return rows, order[position[rows]]


class SampledLogPartition(torch.autograd.Function):
    """The autograd node of ``sampled_log_partition``: hidden (N, D), sampled_w (S, D),
    sampled_bias (S,), true_logits (N,), hits as (rows, columns) -> (N,).

    One (N, S) buffer holds the logits, then their exponentials (shifted by the row maximum),
    which the backward pass reads.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        sampled_w: torch.Tensor,
        sampled_bias: torch.Tensor,
        true_logits: torch.Tensor,
        hit_rows: torch.Tensor,
        hit_columns: torch.Tensor,
    ) -> torch.Tensor:
        logits = torch.addmm(sampled_bias.unsqueeze(0), hidden, sampled_w.t())
        # TensorFlow adds -FLT_MAX to accidental hits; their exponential is 0 either way
        logits[hit_rows, hit_columns] = torch.finfo(logits.dtype).min
        top = torch.maximum(logits.amax(dim=1), true_logits)
        exp = logits.sub_(top.unsqueeze(1)).exp_()
        exp_true = torch.exp(true_logits - top)
        total = exp.sum(dim=1).add_(exp_true)
        ctx.save_for_backward(hidden, sampled_w, exp, exp_true, total)
        return top + torch.log(total)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor):
        hidden, sampled_w, exp, exp_true, total = ctx.saved_tensors
        # d/d logits = exp * scale (row-wise; 0 at the hits): the scale is applied to the
        # smaller factors so that the (N, S) buffer is only read
        scale = grad / total
        needs = ctx.needs_input_grad
        return (
            (exp @ sampled_w).mul_(scale.unsqueeze(1)) if needs[0] else None,
            exp.t() @ (hidden * scale.unsqueeze(1)) if needs[1] else None,
            exp.t() @ scale if needs[2] else None,
            exp_true * scale if needs[3] else None,
            None,
            None,
        )


# ----------------------------------------------------------------------------------------------
# LSTM recurrence without autograd


def lstm_layer_inplace(
    inputs: torch.Tensor,
    packing: Any,
    h0: torch.Tensor,
    c0: torch.Tensor,
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    forget_bias: float,
    clips: tuple[float | None, float | None],
    group_rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel ``lstm_inplace``: ``BiLstmLayer.forward`` without autograd, the same operations in
    the same order (so the same floats) as ``BiLstmLayer._step``, written into buffers.

    inputs (2, n_packed, input_dim), packing (``lstm.Packing``), h0 (2, batch, proj), c0 (2,
    batch, dim), weights = (weight_input, bias (2, 1, 4 * dim), weight_hidden, weight_projection
    or None), clips = (cell_clip, proj_clip) -> packed outputs (2, n_packed, proj), final h and c
    of each sorted row. Per step: the gates go to one scratch buffer and are activated in place;
    the cell is updated in place in one (2, batch, dim) buffer (a row that has ended keeps its
    last cell, which is then its final cell); h goes to a contiguous block of its own (a matmul
    into a strided slice of the output does not take the threaded batched path), and the blocks
    are concatenated into the output at the end. Views are made again only when the number of
    rows drops. The input side of the gates of each group of steps goes to one buffer too (at the
    original shape a group's is 8 MB, which a fresh allocation would fault in page by page)."""
    w_input, bias, w_hidden, w_proj = weights
    cell_clip, proj_clip = clips
    sizes, offsets = packing.batch_sizes, packing.offsets
    dim, proj = w_hidden.shape[-1] // 4, h0.shape[-1]
    # step t's h: a contiguous block of its own, blocks in step order
    running = [n for n in sizes if n > 0]
    h_blocks = inputs.new_empty(2 * packing.size * proj).split([2 * n * proj for n in running])
    c = c0.clone()
    widest = sizes[0] if sizes else 0
    gate_buffer = inputs.new_empty(2 * widest * 4 * dim)
    forget = inputs.new_full((dim,), forget_bias)
    h_prev, n_prev = h0, None
    outputs = []
    projected_buffer = inputs.new_empty(0)  # the input side of a group's gates, reused
    for start, end in packing.groups(group_rows):
        rows = offsets[end] - offsets[start]
        if projected_buffer.numel() < 2 * rows * 4 * dim:
            projected_buffer = inputs.new_empty(2 * rows * 4 * dim)
        projected = projected_buffer[: 2 * rows * 4 * dim].view(2, rows, 4 * dim)
        torch.baddbmm(bias, inputs[:, offsets[start] : offsets[end]], w_input, out=projected)
        for t, step_input in enumerate(projected.split(sizes[start:end], dim=1), start):
            n = sizes[t]
            if n != n_prev:  # rows only end (sizes do not increase): views for the n left
                gates = gate_buffer[: 2 * n * 4 * dim].view(2, n, 4 * dim)
                i, j, f, o = gates.chunk(4, dim=-1)
                fo, c_t, h_prev, n_prev = gates[..., 2 * dim :], c[:, :n], h_prev[:, :n], n
            torch.baddbmm(step_input, h_prev, w_hidden, out=gates)
            f.add_(forget)
            fo.sigmoid_()
            tanh_c = lstm_cell_(i.sigmoid_(), f, j, c_t, cell_clip)
            h_t = h_blocks[t].view(2, n, proj)
            if w_proj is not None:
                torch.bmm(o.mul_(tanh_c), w_proj, out=h_t)
            else:
                torch.mul(tanh_c, o, out=h_t)
            if proj_clip is not None:
                h_t.clamp_(-proj_clip, proj_clip)
            outputs.append(h_t)
            h_prev = h_t
    out = torch.cat(outputs, dim=1) if outputs else inputs.new_zeros(2, 0, proj)
    return out, packing.final_outputs(out, h0), c


def lstm_cell_(
    i: torch.Tensor, f: torch.Tensor, j: torch.Tensor, c: torch.Tensor, cell_clip: float | None
) -> torch.Tensor:
    """The cell of one LSTM step, in place: the one written for the kernel ``lstm_inplace`` and
    the int8 form's steps (``model.int8.direction_steps``, which TorchScript compiles with it).

    i, f: the input and forget gates after their sigmoid (the forget bias added before it); j:
    the candidate before its tanh; c: the cell, all of one shape (..., dim). c becomes
    ``c * f + i * tanh(j)`` (one addcmul), clipped to ``cell_clip``; returns tanh(c), written
    over j (the caller multiplies it by the output gate). The plain form, ``BiLstmLayer._step``,
    computes the same floats out of place, as autograd needs (tests/test_fast_paths.py)."""
    c.mul_(f).addcmul_(i, j.tanh_())
    if cell_clip is not None:
        c.clamp_(-cell_clip, cell_clip)
    return torch.tanh(c, out=j)
