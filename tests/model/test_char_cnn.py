"""The char CNN's length-bucketed convolution equals convolving all positions."""

from __future__ import annotations

import copy

import numpy as np
import torch

from elmokit.model.char_cnn import CharCNN
from elmokit.model.characters import tokens_to_ids
from elmokit.model.options import BiLMOptions, preset


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


def test_gradients_keep_the_parameters_strides():
    """DDP's gradient buckets need gradients in their parameters' strides (the width-1 filter's
    did not always have them)."""
    cnn = CharCNN(BiLMOptions.from_dict(preset("tiny")).char_cnn)
    params = list(cnn.parameters())
    for tokens in (["abc", "de"], ["x" * 30]):  # a short and a long length bucket
        grads = torch.autograd.grad(cnn(tokens_to_ids(tokens)).sum(), params)
        assert [g.stride() for g in grads] == [p.stride() for p in params]


def _sentences(n: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(list("abcdefghij"), size=rng.integers(1, 12))) for _ in range(60)]
    return [list(rng.choice(words, size=rng.integers(1, 9))) for _ in range(n)]


def test_token_cache_across_calls_keeps_results_and_its_bound():
    from elmokit import BiLM, batch_to_ids

    torch.manual_seed(0)
    model = BiLM(preset("tiny")).eval()
    encoder = model.token_encoder
    encoder.cache_min_tokens = 1  # the cache serves these small batches too
    batches = [batch_to_ids(_sentences(4, seed)) for seed in range(12)]
    encoder.cache_size = 0
    with torch.no_grad():
        expected = [model(ids).layers for ids in batches]
    for size in (7, 1000):  # 7 < distinct tokens of one batch: evicts within and across calls
        encoder.cache_size = size
        with torch.no_grad():
            got = [model(ids).layers for ids in batches]
        hits, misses = encoder.cache_stats
        assert hits > 0 and misses > 0
        assert len(encoder._cache) <= size and encoder._cache.rows <= size
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_token_cache_is_bypassed_by_autograd_and_works_across_modes_and_dtypes():
    from elmokit import BiLM, batch_to_ids

    torch.manual_seed(0)
    model = BiLM(preset("tiny")).eval()
    model.token_encoder.cache_min_tokens = 1
    ids, other = batch_to_ids(_sentences(3, 0)), batch_to_ids(_sentences(3, 1))
    fresh = BiLM(preset("tiny")).eval()
    fresh.load_state_dict(model.state_dict())
    fresh.token_encoder.cache_size = 0
    with torch.no_grad():
        model(ids)
    stats = model.token_encoder.cache_stats
    model.train()
    model(ids).layers.sum().backward()  # autograd: computed afresh, the cache is not used
    assert model.token_encoder.cache_stats == stats
    assert model.token_encoder.highway.carry[0].weight.grad is not None
    model.eval()
    with torch.inference_mode():  # encodings kept under inference_mode serve no_grad calls
        model(ids)
    with torch.no_grad():
        torch.testing.assert_close(model(other).layers, fresh(other).layers, atol=1e-6, rtol=0)
        torch.testing.assert_close(model(ids).layers, fresh(ids).layers, atol=1e-6, rtol=0)
    assert model.token_encoder.cache_stats[0] > stats[0]
    model.to(torch.bfloat16)
    with torch.no_grad():
        model(ids)
    assert model.token_encoder._cache._store.dtype == torch.bfloat16
    assert model.token_encoder.cache_stats[0] == 0  # emptied: new weights (their dtype)
