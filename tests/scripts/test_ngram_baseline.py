"""Tests for scripts/ngram_baseline.py: the Kneser-Ney estimate and the biLM's scoring protocol."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from elmokit.lm.vocabulary import Vocabulary
from elmokit.training.data import heldout_batches

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ngram_baseline.py"
_spec = importlib.util.spec_from_file_location("ngram_baseline", _SCRIPT)
NB = importlib.util.module_from_spec(_spec)
sys.modules["ngram_baseline"] = NB
_spec.loader.exec_module(NB)

TRAIN = [
    "the cat sat on the mat",
    "the dog sat on the log",
    "a cat saw a dog",
    "the cat ate",
    "a dog ate the cat",
    "the zebra sat",  # zebra is out of the vocabulary
    "on the mat the cat sat",
]
WORDS = ["the", "cat", "sat", "on", "mat", "dog", "log", "a", "saw", "ate", "never"]  # never: unseen
VOCAB = Vocabulary(["<S>", "</S>", "<UNK>", *WORDS])
DISCOUNTS = [[0.5, 1.0, 1.5], [0.6, 0.9, 1.2], [0.7, 1.1, 1.3], [0.8, 1.2, 1.4]]


def sentences(lines):
    return [line.split() for line in lines]


def model(order, reverse=False, discounts=DISCOUNTS):
    enc = NB.encode(sentences(TRAIN), VOCAB, reverse=reverse)
    start = VOCAB.token_to_id("</S>" if reverse else "<S>")
    return NB.KneserNeyModel(enc, order, len(VOCAB), start, discounts[:order])


@pytest.mark.parametrize("order", [1, 2, 3, 4])
@pytest.mark.parametrize("reverse", [False, True])
def test_distributions_sum_to_one_over_the_vocabulary(order, reverse):
    m = model(order, reverse)
    ids = VOCAB.token_to_id
    start = m.start
    contexts = [
        [start],
        [start, ids("the")],
        [start, ids("the"), ids("cat")],
        [start, ids("a"), ids("dog"), ids("ate")],
        [start, ids("never"), ids("never")],  # unseen word as context
        [start, ids("<UNK>")],
        [start, ids("mat"), ids("log"), ids("saw")],  # unseen contexts of every order
    ]
    for context in contexts:
        p = m.prob_distribution(context)
        assert p.sum() == pytest.approx(1.0, abs=1e-12), context
        assert p[start] == 0.0
        assert (np.delete(p, start) > 0).all()


def reference_kn(train_lines, order, reverse, discounts):
    """Interpolated modified Kneser-Ney written straight from the formulas, with dicts."""
    vocab_words = [w for w in VOCAB._tokens]
    start_tok, end_tok = ("</S>", "<S>") if reverse else ("<S>", "</S>")
    targets = [w for w in vocab_words if w != start_tok]
    sents = []
    for tokens in sentences(train_lines):
        tokens = [t if t in VOCAB._index else "<UNK>" for t in tokens]
        if reverse:
            tokens = tokens[::-1]
        sents.append((start_tok, *tokens, end_tok))
    raw = Counter(s[i : i + k] for s in sents for k in range(1, order + 1) for i in range(len(s) - k + 1))
    left = defaultdict(set)
    for g in raw:
        if len(g) > 1:
            left[g[1:]].add(g[0])

    def adjusted(g):
        if len(g) == order or g[0] == start_tok:
            return raw[g]
        return len(left[g])

    def discount(k, c):
        return 0.0 if c == 0 else discounts[k - 1][min(c, 3) - 1]

    def prob(word, context):
        k = len(context) + 1
        if k == 1:
            counts = {w: (adjusted((w,)) if w != start_tok else 0) for w in targets}
            total = sum(counts.values())
            mass = sum(discount(1, c) for c in counts.values())
            return (counts[word] - discount(1, counts[word])) / total + mass / total / len(targets)
        children = {g[-1]: adjusted(g) for g in raw if len(g) == k and g[:-1] == context}
        lower = prob(word, context[1:])
        if not children:
            return lower
        total = sum(children.values())
        mass = sum(discount(k, c) for c in children.values())
        c = children.get(word, 0)
        return (c - discount(k, c)) / total + mass / total * lower

    return prob, start_tok, end_tok


@pytest.mark.parametrize("order", [1, 2, 3, 4])
@pytest.mark.parametrize("reverse", [False, True])
def test_matches_a_direct_transcription_of_the_formulas(order, reverse):
    heldout = ["the cat sat on the log", "a zebra ate the dog", "never the mat", "cat"]
    m = model(order, reverse)
    prob, start_tok, end_tok = reference_kn(TRAIN, order, reverse, DISCOUNTS)
    enc = NB.encode(sentences(heldout), VOCAB, reverse=reverse)
    logp = m.log_probs(enc)
    tokens = [VOCAB._tokens[i] for i in enc.ids]
    for s, e in zip(enc.starts, enc.ends):
        for t in range(s + 1, e):
            context = tuple(tokens[max(s, t - order + 1) : t])
            assert math.exp(logp[t]) == pytest.approx(prob(tokens[t], context), rel=1e-12)


def test_unigram_perplexity_by_hand(tmp_path):
    # Order 1 on "a a b": counts a=2, b=1, </S>=1 (total 4); discounts D1=0.5 D2=1 D3+=1.5 leave
    # 2/4 of the mass for the uniform distribution over the 4 targets {</S>, <UNK>, a, b}:
    # p(a) = 1/4 + 1/8, p(b) = p(</S>) = 1/8 + 1/8, p(<UNK>) = 1/8.
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "a", "b"])
    enc = NB.encode([["a", "a", "b"]], vocab)
    m = NB.KneserNeyModel(enc, 1, len(vocab), vocab.token_to_id("<S>"), [[0.5, 1.0, 1.5]])
    assert m.prob_distribution([0]).tolist() == pytest.approx([0, 0.25, 0.125, 0.375, 0.25])
    # Held-out "a b zzz": forward predicts a, b, <UNK>, </S>.
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("a b zzz\n")
    result = NB.evaluate((m, m), vocab, "h", [str(heldout)], streams=0)
    assert result.forward == pytest.approx((0.375 * 0.25 * 0.125 * 0.25) ** (-1 / 4))
    assert result.predictions == 4 and result.oov_rate == pytest.approx(1 / 3)


def test_modified_kneser_ney_discounts_from_counts_of_counts():
    adjusted = np.array([1] * 10 + [2] * 5 + [3] * 3 + [4] * 2 + [9])
    y = 10 / (10 + 2 * 5)
    expected = (1 - 2 * y * 5 / 10, 2 - 3 * y * 3 / 5, 3 - 4 * y * 2 / 3)
    assert NB.modified_kn_discounts(adjusted) == pytest.approx(expected)
    with pytest.raises(ValueError, match="counts-of-counts"):
        NB.modified_kn_discounts(np.array([1, 1, 2, 3]))
    # Text counted three times: many 3s, few 2s, so D2 = 2 - 3 y n3 / n2 is negative.
    tripled = np.array([1] * 10 + [2] + [3] * 20 + [4] + [6] * 5)
    with pytest.raises(ValueError, match=r"D1, D2, D3\+ = 0\.833, -48\.000, .*n1\.\.n4 = \[10, 1, 20, 1\]"):
        NB.modified_kn_discounts(tripled)


def test_a_corpus_counted_three_times_is_refused_in_one_line(tmp_path, capsys):
    train = tmp_path / "train"
    train.mkdir()
    for copy in range(3):
        (train / f"{copy}.txt").write_text("\n".join(TRAIN) + "\n")
    VOCAB.save(tmp_path / "vocab.txt")
    (tmp_path / "valid.txt").write_text("the cat sat\n")
    args = ["--train", str(train / "*.txt"), "--vocab", str(tmp_path / "vocab.txt"), "--order", "3"]
    assert NB.main([*args, str(tmp_path / "valid.txt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ngram_baseline: error: cannot estimate modified Kneser-Ney discounts")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("streams", [1, 3, 4, 7])
def test_counted_predictions_are_those_of_the_bilm_evaluation(tmp_path, streams):
    # Every token is distinct, so each target id names one prediction of one sentence.
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, size=23)
    words, lines, n = [], [], 0
    for length in lengths:
        line = [f"w{n + i}" for i in range(length)]
        n += length
        words += line
        lines.append(" ".join(line))
    path = tmp_path / "heldout.txt"
    path.write_text("\n".join(lines[:10]) + "\n\n" + "\n".join(lines[10:]) + "\n")
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", *words])

    expected = {True: [], False: []}
    for batch in heldout_batches(str(path), vocab, batch_size=streams, unroll_steps=1):
        expected[False] += batch["next_token_id"].ravel().tolist()
        expected[True] += batch["next_token_id_reverse"].ravel().tolist()

    counted = NB.counted_predictions(lengths.tolist(), streams)
    sents = list(NB.read_sentences([str(path)]))
    for reverse in (False, True):
        enc = NB.encode(sents, vocab, reverse=reverse)
        got = enc.ids[NB.counted_mask(enc, counted)].tolist()
        assert sorted(got) == sorted(expected[reverse])
    assert counted.sum() == len(expected[False])
    assert NB.counted_predictions(lengths.tolist(), 0).sum() == lengths.sum() + len(lengths)


def test_command_line_writes_table_and_json(tmp_path, capsys):
    train = tmp_path / "train"
    train.mkdir()
    (train / "a.txt").write_text("\n".join(TRAIN[:4]) + "\n")
    (train / "b.txt").write_text("\n".join(TRAIN[4:]) + "\n")
    vocab = tmp_path / "vocab.txt"
    VOCAB.save(vocab)
    heldout = tmp_path / "valid.txt"
    heldout.write_text("the cat sat\nthe dog ate\n")
    out = tmp_path / "baseline.json"
    args = ["--train", str(train / "*.txt"), "--vocab", str(vocab), "--order", "2", "--discounts", "0.7"]
    assert NB.main([*args, "--streams", "0", str(heldout), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "valid" in printed and "forward" in printed
    data = json.loads(out.read_text())
    (r,) = data["results"]
    assert r["name"] == "valid" and r["predictions"] == 8 and r["sentences"] == 2
    assert r["average"] == pytest.approx(math.sqrt(r["forward"] * r["backward"]))
    assert data["order"] == 2 and data["train_tokens"] == sum(len(s.split()) for s in TRAIN)
