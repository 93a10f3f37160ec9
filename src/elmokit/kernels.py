"""Hand-written fast variants ("kernels") of computations that have a plain PyTorch form elsewhere,
and the one switch that turns them off.

The kernels, by name (``enabled(name)``):

- ``char_cnn_matmul``: a narrow convolution's max over positions as one matmul of the unfolded
  windows (``max_over_windows``); plain form: ``conv1d``.
- ``sampled_softmax``: the sampled softmax's log partition in one (N, S) buffer with a
  hand-written backward pass, accidental hits found by binary search (``sampled_log_partition``);
  plain form: ``cross_entropy`` over the concatenated logits.
- ``token_cache``: token encodings kept across calls (``TokenEncoder``, the Embedder's
  ``TokenCache``; see ``token_cache``); plain form: every call encodes its tokens.

Each gives the values and gradients of its plain form up to float rounding
(tests/test_fast_paths.py, tests/test_training_kernels.py), and each was kept because it is at
least 5% faster somewhere (benchmarks/results/kernels.md; variants that were not, such as
hand-written LSTM steps and backward passes, were removed). The switch: ``enabled()``,
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

__all__ = ["NAMES", "disabled", "enabled", "needs_autograd", "parse", "set_enabled"]

NAMES = ("char_cnn_matmul", "sampled_softmax", "token_cache")
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

    Plain form: ``conv1d(x, weight, bias).amax(-1)``. Kernel ``char_cnn_matmul``: up to
    ``MATMUL_MAX_WIDTH`` characters (the short length buckets, most tokens) one matmul of the
    unfolded windows (n * positions, char_dim * filter_width) with the weight; over wider inputs
    ``conv1d`` is faster."""
    if x.shape[-1] > MATMUL_MAX_WIDTH or "char_cnn_matmul" not in _on:
        return F.conv1d(x, weight, bias).amax(dim=-1)
    n, char_dim, _ = x.shape
    n_filters, _, filter_width = weight.shape
    windows = x.unfold(2, filter_width, 1).permute(0, 2, 1, 3).reshape(-1, char_dim * filter_width)
    out = torch.addmm(bias, windows, weight.view(n_filters, -1).t()).view(n, -1, n_filters)
    return out.amax(dim=1)


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
    def forward(  # type: ignore[override]
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
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
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
