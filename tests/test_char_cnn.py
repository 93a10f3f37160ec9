"""The char CNN's length-bucketed convolution equals convolving all positions."""

from __future__ import annotations

import copy

import numpy as np
import torch

from elmokit.char_cnn import CharCNN
from elmokit.characters import tokens_to_ids
from elmokit.options import BiLMOptions, preset


def full_width(cnn: CharCNN, char_ids: torch.Tensor) -> torch.Tensor:
    """The straightforward computation: every one of the max_chars positions."""
    x = cnn.embedding(char_ids).transpose(1, 2)
    return cnn.activation(torch.cat([conv(x).amax(-1) for conv in cnn.convolutions], -1))


def test_bucketed_convolution_equals_full_width():
    torch.manual_seed(0)
    cnn = CharCNN(BiLMOptions.from_dict(preset("small")).char_cnn)
    with torch.no_grad():  # a PAD embedding that wins the max for some filters, and one that loses
        cnn.embedding.weight[261].fill_(0.8)
    rng = np.random.default_rng(0)
    tokens = ["a", "<S>", "</S>", "x" * 6, "é" * 7, "y" * 10, "z" * 18, "w" * 30, "v" * 48, "u" * 70]
    tokens += ["".join(rng.choice(list("abcdefgh"), size=rng.integers(1, 25))) for _ in range(200)]
    ids = torch.cat([tokens_to_ids(tokens), torch.zeros(1, 50, dtype=torch.long)])
    # The reference runs in float64, so the comparison allows float32 rounding only (conv1d
    # itself is off by as much: 1.6e-6 at values near 5).
    with torch.no_grad():
        got = cnn(ids)
        expected = full_width(copy.deepcopy(cnn).double(), ids)
        cnn.embedding.weight[261].fill_(-5.0)
        got2, expected2 = cnn(ids), full_width(copy.deepcopy(cnn).double(), ids)
    torch.testing.assert_close(got.double(), expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got2.double(), expected2, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(got, got2)
