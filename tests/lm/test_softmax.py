"""Tests for the softmax output layer and the TensorFlow-compatible sampled softmax."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from elmokit.lm import softmax as softmax_module
from elmokit.lm.softmax import (
    LogUniformSampler,
    Softmax,
    full_softmax_loss,
    log_uniform_probabilities,
    sampled_softmax_loss,
)


def np_log_uniform(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """Independent reference: (log(k + 2) - log(k + 1)) / log(V + 1)."""
    ids = np.asarray(ids, dtype=np.float64)
    return (np.log(ids + 2.0) - np.log(ids + 1.0)) / np.log(vocab_size + 1.0)


def np_log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


# ----------------------------------------------------------------------------- the distribution


def test_probabilities_sum_to_one() -> None:
    for vocab_size in (1, 10, 1000, 793471):
        p = log_uniform_probabilities(torch.arange(vocab_size), vocab_size)
        assert p.dtype == torch.float64
        assert float(p.sum()) == pytest.approx(1.0, abs=1e-12)
        assert bool((p[1:] < p[:-1]).all())  # strictly decreasing with the id


def test_probabilities_match_hand_computed_values() -> None:
    # numbers from a separate numpy computation of (log(k+2) - log(k+1)) / log(V+1)
    p10 = log_uniform_probabilities(torch.tensor([0, 3, 9]), 10)
    np.testing.assert_allclose(
        p10.numpy(), [0.2890648263178878, 0.09305808883546392, 0.03974743221087253], rtol=1e-14
    )
    big = log_uniform_probabilities(torch.tensor([0, 1, 999, 793470]), 793471)
    np.testing.assert_allclose(
        big.numpy(),
        [
            5.1026084063665864e-02,
            2.9848345735889920e-02,
            7.3578295415379123e-05,
            9.2775957843451585e-08,
        ],
        rtol=1e-10,  # numpy log((k+2)/(k+1)) loses digits for large k; log1p does not
    )
    # and the formula itself for a spread of ids
    ids = np.array([0, 1, 2, 17, 499, 999])
    np.testing.assert_allclose(
        LogUniformSampler(1000).probability(torch.from_numpy(ids)).numpy(),
        np_log_uniform(ids, 1000),
        rtol=1e-13,
    )


def test_expected_counts_match_formula() -> None:
    vocab_size = 1000
    sampler = LogUniformSampler(vocab_size)
    ids = np.array([0, 1, 5, 50, 999])
    p = np_log_uniform(ids, vocab_size)
    for num_tries in (7, 64, 5000):
        got = sampler.expected_count(torch.from_numpy(ids), num_tries, num_sampled=5)
        assert got.dtype == torch.float32
        np.testing.assert_allclose(got.numpy(), 1.0 - (1.0 - p) ** num_tries, rtol=2e-6)
    # TensorFlow's shortcut: when nothing was rejected (num_tries == num_sampled), p * num_sampled
    got = sampler.expected_count(torch.from_numpy(ids), 5, num_sampled=5)
    np.testing.assert_allclose(got.numpy(), 5.0 * p, rtol=2e-6)
    assert float(got[0]) == pytest.approx(5.0 * math.log(2.0) / math.log(1001.0), rel=1e-6)


def test_sample_is_unique_in_range_and_consistent() -> None:
    vocab_size, num_sampled = 1000, 50
    sampler = LogUniformSampler(vocab_size)
    for seed in range(5):
        generator = torch.Generator().manual_seed(seed)
        ids, expected, num_tries = sampler.sample(num_sampled, generator)
        assert ids.dtype == torch.int64 and ids.shape == (num_sampled,)
        assert torch.unique(ids).numel() == num_sampled
        assert int(ids.min()) >= 0 and int(ids.max()) < vocab_size
        assert isinstance(num_tries, int) and num_tries >= num_sampled
        p = np_log_uniform(ids.numpy(), vocab_size)
        np.testing.assert_allclose(expected.numpy(), 1.0 - (1.0 - p) ** num_tries, rtol=2e-6)


def test_sample_equals_sequential_rejection_sampling() -> None:
    """The vectorised sampler must give what TensorFlow's draw-until-unique loop gives."""
    vocab_size, num_sampled = 5000, 300
    sampler = LogUniformSampler(vocab_size)
    for seed in (0, 1, 2):
        ids, _, num_tries = sampler.sample(num_sampled, torch.Generator().manual_seed(seed))
        # replay the same uniforms (the CPU generator's stream is prefix-consistent) in a loop
        u = torch.rand(100_000, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).numpy()
        draws = (np.floor(np.exp(u * np.log(vocab_size + 1.0))) - 1).astype(np.int64) % vocab_size
        seen: list[int] = []
        seen_set: set[int] = set()
        tries = 0
        for value in draws:
            tries += 1
            if int(value) not in seen_set:
                seen_set.add(int(value))
                seen.append(int(value))
                if len(seen) == num_sampled:
                    break
        assert ids.tolist() == seen
        assert num_tries == tries
        assert num_tries > num_sampled  # frequent ids repeat, so some draws were rejected


def test_draws_follow_the_distribution() -> None:
    vocab_size, n = 20, 200_000
    sampler = LogUniformSampler(vocab_size)
    draws = sampler.draw(n, torch.Generator().manual_seed(1234))
    counts = np.bincount(draws.numpy(), minlength=vocab_size)
    expected = n * np_log_uniform(np.arange(vocab_size), vocab_size)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 19 degrees of freedom: mean 19, sd ~6.2; 60 is p ~ 1e-6
    assert chi2 < 60.0
    # a uniform sampler would be far off
    uniform = np.full(vocab_size, n / vocab_size)
    assert float(((uniform - expected) ** 2 / expected).sum()) > 1000.0


def test_unique_sample_inclusion_rate_is_close_to_expected_count() -> None:
    # for a large sample the approximation 1 - (1 - p)^num_tries is good for the rarer ids
    vocab_size, num_sampled, rounds = 200, 20, 1500
    sampler = LogUniformSampler(vocab_size)
    generator = torch.Generator().manual_seed(7)
    hits = np.zeros(vocab_size)
    expected = np.zeros(vocab_size)
    p = np_log_uniform(np.arange(vocab_size), vocab_size)
    for _ in range(rounds):
        ids, _, num_tries = sampler.sample(num_sampled, generator)
        hits[ids.numpy()] += 1
        expected += 1.0 - (1.0 - p) ** num_tries
    # id 0 is almost always in the sample, mid-range ids within a few percent
    assert hits[0] / rounds > 0.9
    np.testing.assert_allclose(hits[10:60].sum(), expected[10:60].sum(), rtol=0.05)


def test_sampler_errors() -> None:
    sampler = LogUniformSampler(10)
    with pytest.raises(ValueError, match="num_sampled"):
        sampler.sample(0)
    with pytest.raises(ValueError, match="11 distinct ids .* 10"):
        sampler.sample(11)
    with pytest.raises(ValueError, match="vocab_size"):
        LogUniformSampler(0)
    ids, _, _ = sampler.sample(10, torch.Generator().manual_seed(0))  # the whole vocabulary
    assert sorted(ids.tolist()) == list(range(10))


# ----------------------------------------------------------------------------- the losses


def _tiny_problem() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "hidden": rng.normal(size=(4, 3)),
        "weight": rng.normal(size=(10, 3)),
        "bias": rng.normal(size=10) * 0.5,
        "targets": np.array([2, 5, 0, 7]),
        "sampled": np.array([5, 1, 8]),  # 5 is an accidental hit for row 1
        "true_q": np.array([0.3, 0.5, 0.9, 0.2]),
        "sampled_q": np.array([0.6, 0.7, 0.1]),
    }


def _np_sampled_loss(d: dict[str, np.ndarray], remove_hits: bool = True) -> np.ndarray:
    losses = []
    for i, target in enumerate(d["targets"]):
        h = d["hidden"][i]
        logits = [h @ d["weight"][target] + d["bias"][target] - np.log(d["true_q"][i])]
        for j, s in enumerate(d["sampled"]):
            if remove_hits and s == target:
                continue
            logits.append(h @ d["weight"][s] + d["bias"][s] - np.log(d["sampled_q"][j]))
        logits = np.array(logits)
        losses.append(np.log(np.exp(logits).sum()) - logits[0])
    return np.array(losses)


def _as_torch(d: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in d.items()}


def test_sampled_loss_by_hand() -> None:
    d = _tiny_problem()
    t = _as_torch(d)
    got = sampled_softmax_loss(
        t["hidden"], t["targets"], t["weight"], t["bias"], t["sampled"], t["true_q"], t["sampled_q"]
    )
    want = _np_sampled_loss(d)
    assert got.shape == (4,)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    # the accidental hit and the log-Q correction both matter for these numbers
    assert abs(float(got[1]) - _np_sampled_loss(d, remove_hits=False)[1]) > 1e-3
    no_q = dict(d, true_q=np.ones(4), sampled_q=np.ones(3))
    assert np.abs(_np_sampled_loss(no_q) - want).max() > 1e-2
    # rows without a hit are unchanged by hit removal
    np.testing.assert_allclose(
        got.numpy()[[0, 2, 3]], _np_sampled_loss(d, remove_hits=False)[[0, 2, 3]], rtol=1e-12
    )


def test_module_uses_injected_samples() -> None:
    d = _tiny_problem()
    t = _as_torch(d)
    layer = Softmax(10, 3).double()
    with torch.no_grad():
        layer.weight.copy_(t["weight"])
        layer.bias.copy_(t["bias"])
    got = layer.sampled_loss(
        t["hidden"], t["targets"], 3, sampled_values=(t["sampled"], t["true_q"], t["sampled_q"])
    )
    np.testing.assert_allclose(got.detach().numpy(), _np_sampled_loss(d), rtol=1e-12)


def test_module_sampled_loss_end_to_end() -> None:
    """Sampler + loss wired together: true expected counts use the same num_tries."""
    vocab_size, dim, num_sampled = 300, 4, 40
    layer = Softmax(vocab_size, dim).double()
    rng = np.random.default_rng(3)
    hidden = rng.normal(size=(6, dim))
    targets = np.array([0, 1, 2, 150, 299, 3])
    got = layer.sampled_loss(
        torch.from_numpy(hidden),
        torch.from_numpy(targets),
        num_sampled,
        generator=torch.Generator().manual_seed(11),
    )
    ids, _, num_tries = LogUniformSampler(vocab_size).sample(num_sampled, torch.Generator().manual_seed(11))
    ids = ids.numpy()
    assert num_tries > num_sampled
    w = layer.weight.detach().numpy()
    b = layer.bias.detach().numpy()
    d = {
        "hidden": hidden,
        "weight": w,
        "bias": b,
        "targets": targets,
        "sampled": ids,
        "true_q": 1.0 - (1.0 - np_log_uniform(targets, vocab_size)) ** num_tries,
        "sampled_q": 1.0 - (1.0 - np_log_uniform(ids, vocab_size)) ** num_tries,
    }
    assert np.isin(targets, ids).any()  # frequent targets are accidental hits here
    np.testing.assert_allclose(got.detach().numpy(), _np_sampled_loss(d), rtol=1e-5)


def test_full_loss_matches_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    hidden, weight, bias = rng.normal(size=(5, 4)), rng.normal(size=(7, 4)), rng.normal(size=7)
    targets = np.array([0, 6, 3, 3, 1])
    want = -np_log_softmax(hidden @ weight.T + bias)[np.arange(5), targets]
    layer = Softmax(7, 4).double()
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight))
        layer.bias.copy_(torch.from_numpy(bias))
    got = layer.full_loss(torch.from_numpy(hidden), torch.from_numpy(targets))
    assert got.shape == (5,)
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-12)
    # row chunking for large vocabularies gives the same numbers
    monkeypatch.setattr(softmax_module, "_MAX_FULL_LOGITS", 14)
    chunked = full_softmax_loss(torch.from_numpy(hidden), torch.from_numpy(targets), layer.weight, layer.bias)
    np.testing.assert_allclose(chunked.detach().numpy(), want, rtol=1e-12)


def test_sampled_falls_back_to_full_when_vocab_is_small() -> None:
    layer = Softmax(10, 3)
    hidden = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([1, 2, 3, 9])
    full = layer.full_loss(hidden, targets)
    for num_sampled in (10, 50):
        torch.testing.assert_close(layer.sampled_loss(hidden, targets, num_sampled), full)
    # and a genuinely sampled loss differs from it (it underestimates the full loss)
    sampled = layer.sampled_loss(hidden, targets, 3, torch.Generator().manual_seed(0))
    assert not torch.allclose(sampled, full)


def test_forward_switches_on_training_mode() -> None:
    layer = Softmax(50, 3)
    hidden = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([1, 2, 3, 49])
    layer.eval()
    torch.testing.assert_close(layer(hidden, targets, 5), layer.full_loss(hidden, targets))
    layer.train()
    torch.testing.assert_close(
        layer(hidden, targets, 5, torch.Generator().manual_seed(4)),
        layer.sampled_loss(hidden, targets, 5, torch.Generator().manual_seed(4)),
    )
    assert not torch.allclose(layer(hidden, targets, 5), layer.full_loss(hidden, targets))


def test_gradcheck_sampled_loss() -> None:
    t = _as_torch(_tiny_problem())
    hidden = t["hidden"].clone().requires_grad_(True)
    weight = t["weight"].clone().requires_grad_(True)
    bias = t["bias"].clone().requires_grad_(True)

    def fn(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return sampled_softmax_loss(h, t["targets"], w, b, t["sampled"], t["true_q"], t["sampled_q"])

    assert torch.autograd.gradcheck(fn, (hidden, weight, bias))
    # ids that are neither a target nor sampled get no gradient
    fn(hidden, weight, bias).sum().backward()
    untouched = [3, 4, 6, 9]
    assert float(weight.grad[untouched].abs().sum()) == 0.0
    assert float(bias.grad[untouched].abs().sum()) == 0.0
    assert float(weight.grad[[0, 1, 2, 5, 7, 8]].abs().sum(dim=1).min()) > 0.0


def test_sparse_gradient_equals_dense() -> None:
    hidden = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([0, 1, 2, 3, 40, 99])
    grads = []
    for sparse in (False, True):
        torch.manual_seed(0)
        layer = Softmax(100, 5, sparse_grad=sparse)
        layer.sampled_loss(hidden, targets, 20, torch.Generator().manual_seed(5)).sum().backward()
        assert layer.weight.grad.is_sparse == sparse
        grads.append((layer.weight.grad.to_dense(), layer.bias.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])
    assert float(grads[0][0].abs().sum()) > 0.0


def test_reproducible_with_same_seed() -> None:
    sampler = LogUniformSampler(10_000)
    a = sampler.sample(500, torch.Generator().manual_seed(42))
    b = LogUniformSampler(10_000).sample(500, torch.Generator().manual_seed(42))
    c = sampler.sample(500, torch.Generator().manual_seed(43))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2]
    assert not torch.equal(a[0], c[0])

    layer = Softmax(10_000, 8)
    hidden = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 10_000, (16,), generator=torch.Generator().manual_seed(1))
    first = layer.sampled_loss(hidden, targets, 500, torch.Generator().manual_seed(9))
    second = layer.sampled_loss(hidden, targets, 500, torch.Generator().manual_seed(9))
    other = layer.sampled_loss(hidden, targets, 500, torch.Generator().manual_seed(10))
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_initialisation() -> None:
    torch.manual_seed(0)
    layer = Softmax(4000, 64).requires_grad_(False)
    assert layer.weight.shape == (4000, 64) and layer.bias.shape == (4000,)
    assert float(layer.weight.std()) == pytest.approx(1.0 / 8.0, rel=0.02)
    assert abs(float(layer.weight.mean())) < 0.005
    assert float(layer.bias.abs().max()) == 0.0


def test_errors_name_the_bad_id() -> None:
    layer = Softmax(10, 3)
    hidden = torch.zeros(3, 3)
    for bad in (12, -1):
        targets = torch.tensor([1, bad, 2])
        with pytest.raises(ValueError, match=rf"target id {bad} .*size 10"):
            layer.full_loss(hidden, targets)
        with pytest.raises(ValueError, match=rf"target id {bad} .*size 10"):
            layer.sampled_loss(hidden, targets, 4, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="num_sampled must be >= 1"):
        layer.sampled_loss(hidden, torch.tensor([1, 2, 3]), 0)
    with pytest.raises(ValueError, match="3 rows .* 2 entries"):
        layer.full_loss(hidden, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"shape \(N, 3\)"):
        layer.full_loss(torch.zeros(3, 4), torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="integer"):
        layer.full_loss(hidden, torch.tensor([1.0, 2.0, 3.0]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device_follows_inputs() -> None:
    layer = Softmax(1000, 8).cuda()
    hidden = torch.randn(5, 8, device="cuda")
    targets = torch.tensor([0, 1, 2, 500, 999], device="cuda")
    loss = layer.sampled_loss(hidden, targets, 50, torch.Generator().manual_seed(0))
    assert loss.device.type == "cuda" and loss.shape == (5,)
    cpu = layer.cpu().sampled_loss(hidden.cpu(), targets.cpu(), 50, torch.Generator().manual_seed(0))
    torch.testing.assert_close(loss.cpu(), cpu, rtol=1e-4, atol=1e-5)
