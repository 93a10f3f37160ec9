"""The token caches: the LRU map, and caches of encodings that stay true to the weights however
they change (optimizers fused or not, loops writing ``p.data``, ``load_state_dict``, ``.to``),
down to a training run whose logged held-out perplexity equals a fresh evaluation."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from elmokit import BiLM, Embedder, batch_to_ids
from elmokit.base import kernels
from elmokit.model.options import preset
from elmokit.model.token_cache import EncodingCache, LruCache

WORDS = "the a of to in and stocks rose fell shares bank river money said year market oil".split()


def test_lru_cache_drops_the_least_recently_used():
    cache: LruCache[str, int] = LruCache(2)
    assert cache.put("a", 1) is None and cache.put("b", 2) is None
    assert cache.get("a") == 1  # "b" is now the oldest
    assert cache.put("c", 3) == 2
    assert "b" not in cache and cache.get("b") is None and len(cache) == 2
    assert (cache.hits, cache.misses) == (1, 1)
    assert cache.pop_oldest() == 1 and list(cache._entries) == ["c"]
    cache.clear()
    assert len(cache) == 0 and (cache.hits, cache.misses) == (0, 0)


def test_encoding_cache_keeps_its_bound_and_its_results():
    cache: EncodingCache[int] = EncodingCache(5, min_keys=2)
    weight = torch.randn(4)
    calls = []

    def lookup(keys: list[int]) -> torch.Tensor:
        def encode(positions: list[int]) -> torch.Tensor:
            calls.append([keys[p] for p in positions])
            return torch.stack([weight * keys[p] for p in positions])

        return cache.lookup(keys, [weight], encode)

    for keys in ([1, 2, 3], [3, 4, 1], [9, 8, 7, 6, 5, 4, 3], [5, 4]):
        torch.testing.assert_close(lookup(keys), torch.stack([weight * k for k in keys]))
        assert len(cache) <= 5 and cache.rows <= 5
    assert calls == [[1, 2, 3], [4], [9, 8, 7, 6, 5], [4]]  # 5 new keys dropped 4 and 3
    hits = cache.hits
    torch.testing.assert_close(lookup([5]), weight[None] * 5)  # fewer than min_keys: computed
    assert calls[-1] == [5] and cache.hits == hits
    weight[0] += 1.0  # in place, as an optimizer: the kept encodings are dropped
    torch.testing.assert_close(lookup([5, 4]), torch.stack([weight * 5, weight * 4]))
    assert calls[-1] == [5, 4] and cache.hits == 0


def _loss(model: BiLM, ids: torch.Tensor) -> torch.Tensor:
    return (model.token_encoder(ids) ** 2).sum()


def _optimizer_step(optimizer: Callable[..., torch.optim.Optimizer], **options) -> Callable:
    def change(model: BiLM, ids: torch.Tensor, other: BiLM) -> None:
        step = optimizer(model.parameters(), **options)
        model.zero_grad()
        _loss(model, ids).backward()
        step.step()

    return change


def _data_loop(model: BiLM, ids: torch.Tensor, other: BiLM) -> None:
    model.zero_grad()
    _loss(model, ids).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.data.add_(p.grad, alpha=-0.1)


def _data_assignment(model: BiLM, ids: torch.Tensor, other: BiLM) -> None:
    for p in model.token_encoder.parameters():
        p.data = p.data * 1.01 + 0.001


def _load_state_dict(model: BiLM, ids: torch.Tensor, other: BiLM) -> None:
    model.load_state_dict(other.state_dict())


def _to_float64(model: BiLM, ids: torch.Tensor, other: BiLM) -> None:
    model.to(torch.float64)


CHANGES = {
    "fused Adagrad": _optimizer_step(torch.optim.Adagrad, lr=0.2, fused=True),
    "foreach Adagrad": _optimizer_step(torch.optim.Adagrad, lr=0.2, foreach=True),
    "plain SGD": _optimizer_step(torch.optim.SGD, lr=0.1, foreach=False),
    "Adam": _optimizer_step(torch.optim.Adam, lr=0.01),
    "p.data.add_ loop": _data_loop,
    "load_state_dict": _load_state_dict,
    ".data assignment": _data_assignment,
    ".to(torch.float64)": _to_float64,
}


def _models() -> tuple[BiLM, BiLM, torch.Tensor]:
    torch.manual_seed(0)
    model, other = BiLM(preset("tiny")).eval(), BiLM(preset("tiny")).eval()
    model.token_encoder.cache_min_tokens = 1  # the cache serves these few tokens too
    rng = np.random.default_rng(0)
    ids = batch_to_ids([list(rng.choice(WORDS, size=6)) for _ in range(4)])
    return model, other, ids


@pytest.mark.parametrize("change", CHANGES)
def test_token_encoder_cache_follows_the_weights(change):
    model, other, ids = _models()
    encoder = model.token_encoder
    with torch.no_grad():
        before = encoder(ids)
        assert torch.equal(encoder(ids), before) and encoder.cache_stats[0] > 0  # served by the cache
    CHANGES[change](model, ids, other)
    with torch.no_grad():
        after = encoder(ids)
        with kernels.disabled("token_cache"):
            fresh = encoder(ids)
    assert torch.equal(after, fresh)
    assert after.dtype != before.dtype or not torch.allclose(after, before)
    with torch.no_grad():
        assert torch.equal(encoder(ids), fresh)  # and the cache serves the new encodings


@pytest.mark.parametrize("change", CHANGES)
def test_embedder_uses_the_models_token_cache_which_follows_the_weights(change):
    model, other, ids = _models()
    embedder = Embedder(model, device="cpu")
    sentences = [[*WORDS[:6], "unseen"], ["the", "bank", "the"]]
    before = embedder.embed_batch(sentences)
    hits = model.token_encoder.cache_stats[0]
    for again, first in zip(embedder.embed_batch(sentences), before):
        assert np.array_equal(again, first)
    assert model.token_encoder.cache_stats[0] > hits  # served by the model's one cache
    CHANGES[change](model, ids, other)
    after = embedder.embed_batch(sentences)
    with kernels.disabled("token_cache"):
        fresh = embedder.embed_batch(sentences)
    for a, f in zip(after, fresh):
        assert np.array_equal(a, f)
    assert not np.array_equal(after[0], before[0])  # the new weights (or dtype) took effect


def test_cache_is_used_while_weights_stay_and_nan_weights_do_not_empty_it():
    model, _, ids = _models()
    encoder = model.token_encoder
    with torch.no_grad():
        encoder.highway.carry[0].bias[0] = float("nan")  # bit-equal copies: still the same weights
        encoder(ids)
        encoder(ids)
    hits, misses = encoder.cache_stats
    assert hits == misses > 0


def _write_corpus(path: Path, n_sentences: int, seed: int) -> None:
    """Sentences of 80 words (Zipf): enough distinct tokens a call for the token cache to work."""
    rng = np.random.default_rng(seed)
    words = WORDS + [w + "s" for w in WORDS] + [f"w{i}" for i in range(80 - 2 * len(WORDS))]
    p = 1.0 / np.arange(1, len(words) + 1)
    lines = [" ".join(rng.choice(words, size=rng.integers(3, 12), p=p / p.sum())) for _ in range(n_sentences)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _cli(*args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "elmokit.cli", *args], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]


def test_logged_heldout_perplexity_equals_a_fresh_evaluation(tmp_path):
    """A CPU training run (fused Adagrad) that evaluates held-out text at every checkpoint: the
    perplexity it logs at the last one equals ``elmokit evaluate`` of that checkpoint in a new
    process (the token cache, filled by the earlier evaluations, must not serve old encodings)."""
    from elmokit.lm.vocabulary import Vocabulary
    from elmokit.training.data import count_tokens

    _write_corpus(tmp_path / "train" / "a.txt", 200, seed=0)
    _write_corpus(tmp_path / "heldout" / "a.txt", 300, seed=1)
    Vocabulary.build(count_tokens(str(tmp_path / "train" / "*.txt"))).save(tmp_path / "vocab.txt")
    save_dir = tmp_path / "run"
    _cli(
        "train", "--train", str(tmp_path / "train" / "*.txt"), "--vocab", str(tmp_path / "vocab.txt"),
        "--heldout", str(tmp_path / "heldout" / "*.txt"), "--save-dir", str(save_dir), "--config", "tiny",
        "--max-steps", "3", "--batch-size", "4", "--unroll-steps", "5", "--n-negative-samples", "8",
        "--checkpoint-minutes", "0", "--device", "cpu",
    )  # fmt: skip
    with (save_dir / "heldout.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 3 and len({row["average"] for row in rows}) >= 2  # the model changed
    _cli(
        "evaluate", str(save_dir), "--heldout", str(tmp_path / "heldout" / "*.txt"),
        "--json", str(tmp_path / "evaluate.json"), "--quiet",
    )  # fmt: skip
    fresh = json.loads((tmp_path / "evaluate.json").read_text())
    for name in ("forward", "backward", "average"):
        assert float(rows[-1][name]) == pytest.approx(fresh[name], rel=1e-4, abs=1e-3), name
