"""Highway layers as the original writes them.

The original's naming is inverted with respect to Srivastava et al.: the "carry" gate multiplies the
transformed input. y = g * relu(x W_t + b_t) + (1 - g) * x, with g = sigmoid(x W_c + b_c).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
from torch import nn

__all__: list[str] = []


class Highway(nn.Module):
    """A stack of ``n_layers`` highway layers of width ``dim``: (..., dim) -> (..., dim)."""

    def __init__(self, dim: int, n_layers: int) -> None:
        super().__init__()
        self.carry = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_layers))
        self.transform = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_layers))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The original's initialisation: normal(0, sqrt(1/dim)) weights, carry bias -2."""
        pairs = cast("Iterable[tuple[nn.Linear, nn.Linear]]", zip(self.carry, self.transform))
        for carry, transform in pairs:
            std = (1.0 / carry.in_features) ** 0.5
            nn.init.normal_(carry.weight, std=std)
            nn.init.normal_(transform.weight, std=std)
            nn.init.constant_(carry.bias, -2.0)
            nn.init.zeros_(transform.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for carry, transform in zip(self.carry, self.transform):
            gate = torch.sigmoid(carry(x))
            x = gate * torch.relu(transform(x)) + (1.0 - gate) * x
        return x
