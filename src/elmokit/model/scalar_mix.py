"""The task-specific weighting of biLM layers: gamma * sum_j softmax(s)_j * h_j."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["ScalarMix"]


class ScalarMix(nn.Module):
    """Mix ``num_layers`` tensors of the same shape with softmax-normalised scalar weights.

    ``do_layer_norm`` normalises each layer first as the original does: one mean and one variance
    over all unmasked elements of the whole batch tensor (not per token), so a layer's
    normalisation depends on the other sentences in the batch.
    ``trainable`` controls the scalar weights s; ``gamma_trainable`` controls gamma (trainable
    by default, even when s is fixed).
    """

    def __init__(
        self,
        num_layers: int,
        do_layer_norm: bool = False,
        initial_scalar_parameters: Sequence[float] | None = None,
        trainable: bool = True,
        gamma_trainable: bool = True,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        if initial_scalar_parameters is None:
            initial_scalar_parameters = [0.0] * num_layers
        if len(initial_scalar_parameters) != num_layers:
            raise ValueError(
                f"initial_scalar_parameters has {len(initial_scalar_parameters)} values for "
                f"{num_layers} layers"
            )
        self.num_layers = num_layers
        self.do_layer_norm = do_layer_norm
        self.scalar_parameters = nn.Parameter(
            torch.tensor([float(v) for v in initial_scalar_parameters]), requires_grad=trainable
        )
        self.gamma = nn.Parameter(torch.tensor(1.0), requires_grad=gamma_trainable)

    def l2_penalty(self) -> torch.Tensor:
        """sum_j s_j^2 (unscaled): add ``coef * mix.l2_penalty()`` to a loss to regularise s."""
        return (self.scalar_parameters**2).sum()

    def forward(
        self, layers: Sequence[torch.Tensor] | torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """layers: num_layers tensors (batch, timesteps, dim) or one (num_layers, batch,
        timesteps, dim); mask (batch, timesteps), needed for layer norm. -> (batch, timesteps, dim)."""
        if len(layers) != self.num_layers:
            raise ValueError(f"got {len(layers)} layers, this ScalarMix mixes {self.num_layers}")
        return mix_layers(layers, self.scalar_parameters, self.gamma, mask, self.do_layer_norm)


def mix_layers(
    layers: Sequence[torch.Tensor] | torch.Tensor,
    scalar_parameters: torch.Tensor,
    gamma: torch.Tensor,
    mask: torch.Tensor | None = None,
    do_layer_norm: bool = False,
) -> torch.Tensor:
    """gamma * sum_j softmax(s)_j * h_j (each h_j layer-normalised first with ``do_layer_norm``,
    which needs the mask): the one computation of every scalar mix (elmokit's and the
    AllenNLP-compatible one, whose parameters are laid out differently)."""
    weights = torch.softmax(scalar_parameters, dim=0)
    if do_layer_norm:
        if mask is None:
            raise ValueError("do_layer_norm=True needs the mask")
        layers = [_masked_layer_norm(layer, mask) for layer in layers]
    mixed = sum(w * layer for w, layer in zip(weights, layers))
    return gamma * mixed


def _masked_layer_norm(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) with one mean/variance over all unmasked elements of x;
    zeros when every position is masked (there is nothing to normalize)."""
    if not bool(mask.any()):
        return torch.zeros_like(x)
    m = mask.unsqueeze(-1).to(x.dtype)
    count = m.sum() * x.shape[-1]
    mean = (x * m).sum() / count
    variance = (((x - mean) * m) ** 2).sum() / count
    return (x - mean) / torch.sqrt(variance + eps)
