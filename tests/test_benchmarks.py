"""The benchmarks' own checks of the token cache (nothing here is timed): a round called cold must
start with an empty cache, one called warm with a filled one, and a change that breaks either
stops the benchmark with an AssertionError instead of printing wrong figures."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

import elmokit
from elmokit.model.char_cnn import TokenEncoder

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
WORDS = [f"w{i}x" for i in range(80)]  # more distinct tokens than the cache's cache_min_tokens (64)


@pytest.fixture
def bench(monkeypatch):
    """The benchmarks' modules ``common`` and ``bench_peers``, imported as the scripts import them."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("common"), importlib.import_module("bench_peers")


@pytest.fixture(scope="module")
def bilm() -> elmokit.BiLM:
    return elmokit.BiLM.from_pretrained("elmo-tiny-reference")


def test_the_cold_check_fires_on_a_warm_cache(bench, bilm):
    common, _ = bench
    bilm.token_encoder.clear_cache()
    common.assert_cold(bilm)
    with pytest.raises(AssertionError, match="must start with tokens in the token cache"):
        common.assert_warm(bilm)
    list(elmokit.Embedder(bilm).embed_sentences([WORDS]))
    assert common.token_cache_entries(bilm) >= len(WORDS)
    common.assert_warm(bilm)
    with pytest.raises(
        AssertionError, match=r"a cold round must start with an empty token cache, but it holds \d+"
    ):
        common.assert_cold(bilm)
    common.start_cold(bilm)
    assert common.token_cache_entries(bilm) == 0


def _args(**kw) -> argparse.Namespace:
    defaults = dict(
        batch_size=64, rounds=2, time_budget=0.0, wait_quiet=1.0, wait_timeout=1.0, pause_pid=None
    )
    return argparse.Namespace(**{**defaults, **kw})


def _sides(bench_peers, bilm, case: str) -> list:
    peer_calls: list[int] = []
    peer = bench_peers.Side("peer", lambda sentences: peer_calls.append(len(sentences)))
    return [peer, *bench_peers.elmokit_sides(bilm, case, 64, ("cold", "warm"))]


def test_bench_peers_cold_rounds_start_empty_and_warm_rounds_find_every_token(bench, bilm):
    common, bench_peers = bench
    sentences = [WORDS, WORDS[::-1]]
    result = bench_peers.interleave(
        "batch", _sides(bench_peers, bilm, "batch"), sentences, _args(), common.Pauser(None)
    )
    cold, warm = result["elmokit"]["cold"], result["elmokit"]["warm"]
    assert [r["side"] for r in result["rounds"]] == ["peer", "elmokit cold", "elmokit warm"] * 2
    assert cold["cached_share"] == 0.0  # one call, its tokens all new: nothing came from the cache
    assert warm["cached_share"] == 1.0
    assert len(cold["pair_ratios"]) == len(warm["pair_ratios"]) == 2


def test_bench_peers_stops_when_a_cold_round_is_warm(bench, bilm, monkeypatch):
    """A change that leaves the cache filled between rounds (here: emptying it does nothing)."""
    common, bench_peers = bench
    monkeypatch.setattr(TokenEncoder, "clear_cache", lambda self: None)
    sides = _sides(bench_peers, bilm, "batch")
    with pytest.raises(AssertionError, match="the cold round of elmokit cold must start with an empty"):
        bench_peers.interleave("batch", sides, [WORDS], _args(), common.Pauser(None))


def test_bench_peers_drops_warm_rounds_no_call_can_serve(bench, bilm, capsys):
    common, bench_peers = bench
    short = [WORDS[:10], WORDS[10:20]]  # one sentence a call, too few tokens for the cache
    result = bench_peers.interleave(
        "sentence", _sides(bench_peers, bilm, "sentence"), short, _args(), common.Pauser(None)
    )
    assert set(result["elmokit"]) == {"cold"}
    assert "warm = cold, not timed" in capsys.readouterr().out
