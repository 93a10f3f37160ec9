"""Sense neighbours: the shipped contexts file and the per-layer rankings."""

from __future__ import annotations

import numpy as np
import pytest

from elmokit import Embedder
from elmokit.embed.senses import BANK_CONTEXTS, Context, nearest_contexts, read_contexts


def test_shipped_contexts_hold_the_word_and_a_sense():
    contexts = read_contexts()
    assert len(contexts) == 207
    assert all("bank" in c.tokens for c in contexts)
    senses = {s: sum(c.sense == s for c in contexts) for s in ("money", "river", "other")}
    assert senses == {"money": 200, "river": 3, "other": 4}
    assert BANK_CONTEXTS.is_file()


def test_bad_contexts_line_is_named(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_text("money\tsrc\tthe bank .\nriver only-two-fields\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"c.tsv:2: expected sense<TAB>source<TAB>"):
        read_contexts(path)


def test_rankings_per_layer():
    embedder = Embedder("elmo-tiny-reference")
    contexts = [
        Context("money", "t", "the bank raised rates .".split()),
        Context("river", "t", "fish swam near the bank of the river .".split()),
        Context("money", "t", "a bank loan".split()),
    ]
    queries = [("she paid the bank .".split(), "money"), ("the river bank".split(), "river")]
    results = nearest_contexts(embedder, "bank", queries, contexts, k=2)
    assert [[r.layer for r in rankings] for rankings in results] == [[0, 1, 2], [0, 1, 2]]
    money, river = results
    assert money[0].distinct_scores == 1  # layer 0 is context-free
    assert money[0].neighbours[0].score == pytest.approx(1.0, abs=1e-5)
    for ranking in money[1:] + river[1:]:
        scores = [n.score for n in ranking.neighbours]
        assert scores == sorted(scores, reverse=True) and ranking.distinct_scores == 3
    # the ranks and the top-k share agree with the neighbours shown
    for ranking, sense in zip(river[1:], ["river", "river"]):
        top = [n.context.sense == sense for n in ranking.neighbours]
        assert ranking.same_sense_at_k == np.mean(top)
        assert len(ranking.same_sense_ranks) == 1 and (ranking.same_sense_ranks[0] <= 2) == any(top)


def test_word_missing_from_a_sentence_is_named():
    embedder = Embedder("elmo-tiny-reference")
    with pytest.raises(ValueError, match="'bank' is not a token of: a river"):
        nearest_contexts(embedder, "bank", [("a river".split(), "river")], [], k=1)
