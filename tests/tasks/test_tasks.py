"""Downstream tasks: readers, conlleval scoring, the CRF, the layer cache, and end-to-end runs."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import shutil

import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("safetensors", reason="the tasks extra")  # and so test_task_elmo_sites.py
pytest.importorskip("seqeval", reason="the tasks extra")
from safetensors.torch import load_file

from elmokit import BiLM, Embedder
from elmokit.base.task_data import (
    bioes_to_iob1,
    from_bioes,
    iob1_to_bioes,
    read_conll2003,
    read_conllu,
    read_sst,
    spans,
    tag_scheme,
)
from elmokit.cli import main as elmokit_main
from elmokit.hub import model_files
from elmokit.hub.shipped import TINY_REFERENCE
from elmokit.tasks import TaskConfig, TrainedTask, run_task
from elmokit.tasks.cache import LayerCache
from elmokit.tasks.cli import main as task_main
from elmokit.tasks.crf import ConditionalRandomField, bioes_constraints
from elmokit.tasks.models import ModelConfig
from elmokit.tasks.train import entity_scores

CONLL = """-DOCSTART- -X- O O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O

Smith NNP I-NP I-PER
Jones NNP I-NP B-PER
met VBD I-VP O
in IN I-PP O
New NNP I-NP I-LOC
York NNP I-NP I-LOC
-DOCSTART- -X- -X- O

the DT I-NP O
Atlanta NNP I-NP B-MISC
Games NNPS I-NP I-MISC
"""

CONLLU = """# sent_id = 1
# text = I don't know.
1	I	I	PRON	PRP	_	3	nsubj	_	_
2-3	don't	_	_	_	_	_	_	_	_
2	do	do	AUX	VBP	_	4	aux	_	_
3	n't	not	PART	RB	_	4	advmod	_	_
4	know	know	VERB	VB	_	0	root	_	_
4.1	knows	know	VERB	VBZ	_	_	_	4:conj	_
5	.	.	PUNCT	.	_	4	punct	_	_

# sent_id = 2
1	Hi	hi	INTJ	UH	_	0	root	_	_
"""

SST = """(3 (2 It) (4 (2 's) (4 (3 great) (2 (2 -LRB-) (2 (2 writer\\/director) (2 -RRB-))))))
(1 (2 Not) (1 good))
(2 (2 Just) (2 there))
(0 (0 Awful) (2 .))
(4 (4 Superb) (2 !))
(3 (2 (2 like) (2 8\u00a01\\/2)) (3 fun))
"""


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


# -- readers ----------------------------------------------------------------------------------
def test_conll2003_reader_keeps_iob1_and_skips_docstart(tmp_path):
    sentences = read_conll2003(write(tmp_path / "a.conll", CONLL))
    assert [s.tokens for s in sentences] == [
        ["EU", "rejects", "German", "call"],
        ["Smith", "Jones", "met", "in", "New", "York"],
        ["the", "Atlanta", "Games"],
    ]
    assert sentences[1].tags == ["I-PER", "B-PER", "O", "O", "I-LOC", "I-LOC"]
    # B- between two adjacent entities of one type: two one-token PER chunks
    assert spans(sentences[1].tags) == [("PER", 0, 0), ("PER", 1, 1), ("LOC", 4, 5)]
    assert iob1_to_bioes(sentences[1].tags) == ["S-PER", "S-PER", "O", "O", "B-LOC", "E-LOC"]
    assert bioes_to_iob1(iob1_to_bioes(sentences[1].tags)) == sentences[1].tags
    # the original's quirk: B- after O is just the start of a chunk
    assert spans(sentences[2].tags) == [("MISC", 1, 2)]
    assert bioes_to_iob1(iob1_to_bioes(sentences[2].tags)) == ["O", "I-MISC", "I-MISC"]


def test_readers_drop_a_byte_order_mark(tmp_path):
    plain = read_conll2003(write(tmp_path / "a.conll", CONLL))
    path = tmp_path / "bom.conll"
    path.write_bytes(b"\xef\xbb\xbf" + CONLL.encode("utf-8"))
    assert read_conll2003(path) == plain


def test_readers_name_a_file_of_the_wrong_format(tmp_path):
    conllu, sst = write(tmp_path / "a.conllu", CONLLU), write(tmp_path / "a.txt", SST)
    with pytest.raises(ValueError, match=r"a.conllu: line 1: .*looks like CoNLL-U"):
        read_conll2003(conllu)
    with pytest.raises(ValueError, match=r"a.txt: line 1: .*looks like SST trees"):
        read_conll2003(sst)
    with pytest.raises(ValueError, match=r"pos.conll: line 1: 'NNP' is not an NER tag"):
        read_conll2003(write(tmp_path / "pos.conll", "EU NNP\nrejects VBZ\n"))
    with pytest.raises(ValueError, match=r"a.txt: line 1: expected 10 tab-separated .*SST"):
        read_conllu(sst)
    with pytest.raises(ValueError, match=r"b.conllu: line 2: empty FORM"):
        read_conllu(write(tmp_path / "b.conllu", "1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n2\t\t_\tX\t_\t_\t1\tdep\t_\t_\n"))
    with pytest.raises(ValueError, match=r"line 2: more than one tree"):
        read_sst(write(tmp_path / "two.txt", "(1 (2 Not) (1 good))\n(2 (2 a) (2 b)) (3 (3 c) (2 d))\n"))
    # tokens "(" and "#" in a real CoNLL-2003 file are words, not another format
    ok = read_conll2003(write(tmp_path / "ok.conll", "( ( O O\n# # O O\nEU NNP B-NP B-ORG\n"))
    assert ok[0].tokens == ["(", "#", "EU"]


def test_tag_scheme_detection_and_conversion_from_bioes():
    iob1 = [["I-PER", "B-PER", "O", "I-LOC", "I-LOC"]]
    iob2 = [["B-PER", "B-PER", "O", "B-LOC", "I-LOC"]]
    bioes = [["S-PER", "S-PER", "O", "B-LOC", "E-LOC"]]
    assert [tag_scheme(t) for t in (iob1, iob2, bioes)] == ["IOB1", "IOB2", "BIOES"]
    assert tag_scheme([["O", "O"]]) == "IOB1"
    for scheme, tags in zip(("IOB1", "IOB2", "BIOES"), (iob1, iob2, bioes)):
        assert from_bioes(bioes[0], scheme) == tags[0]


def test_spans_read_tags_like_seqeval_default_mode():
    from seqeval.metrics.sequence_labeling import get_entities

    rng = random.Random(0)
    iob = ["O", "I-PER", "B-PER", "I-LOC", "B-LOC"]
    bioes = iob + ["E-PER", "S-PER", "E-LOC", "S-LOC"]
    for tags in (iob, bioes):
        for _ in range(300):
            seq = [rng.choice(tags) for _ in range(rng.randint(1, 8))]
            assert spans(seq) == get_entities(seq), seq
            assert spans(iob1_to_bioes(seq)) == spans(seq)
            assert spans(bioes_to_iob1(seq)) == spans(seq)


def test_conllu_reader_skips_multiword_ranges_and_empty_nodes(tmp_path):
    sentences = read_conllu(write(tmp_path / "a.conllu", CONLLU))
    assert [s.tokens for s in sentences] == [["I", "do", "n't", "know", "."], ["Hi"]]
    assert [s.tags for s in sentences] == [["PRON", "AUX", "PART", "VERB", "PUNCT"], ["INTJ"]]
    assert read_conllu(tmp_path / "a.conllu", column=4)[0].tags == ["PRP", "VBP", "RB", "VB", "."]


def test_sst_reader_root_label_and_binary_variant(tmp_path):
    path = write(tmp_path / "sst.txt", SST)
    fine = read_sst(path)
    assert [s.label for s in fine] == ["3", "1", "2", "0", "4", "3"]
    assert fine[0].tokens == ["It", "'s", "great", "(", "writer/director", ")"]
    assert fine[1].tokens == ["Not", "good"]
    assert fine[5].tokens == ["like", "8\u00a01/2", "fun"]  # a no-break space is part of the word
    binary = read_sst(path, binary=True)
    assert [(s.tokens[0], s.label) for s in binary] == [
        ("It", "positive"),
        ("Not", "negative"),
        ("Awful", "negative"),
        ("Superb", "positive"),
        ("like", "positive"),
    ]


# -- conlleval scoring ------------------------------------------------------------------------
def test_entity_f1_on_hand_made_iob1_case():
    gold = [
        ["I-ORG", "O", "I-PER", "O", "O", "I-LOC"],
        ["I-PER", "B-PER", "O", "I-LOC", "I-LOC"],
        ["O", "I-MISC", "I-MISC"],
    ]
    predicted = [
        ["I-ORG", "O", "I-PER", "O", "O", "I-ORG"],  # ORG, PER right; ORG for LOC wrong
        ["I-PER", "I-PER", "O", "I-LOC", "I-LOC"],  # one PER over two gold PERs wrong; LOC right
        ["O", "B-MISC", "I-MISC"],  # B after O starts the chunk: right
    ]
    # gold chunks 3 + 3 + 1 = 7, predicted 3 + 2 + 1 = 6, correct 2 + 1 + 1 = 4
    scores = entity_scores(gold, predicted)
    assert scores["precision"] == pytest.approx(100 * 4 / 6)
    assert scores["recall"] == pytest.approx(100 * 4 / 7)
    assert scores["f1"] == pytest.approx(100 * 2 * 4 / (7 + 6))  # 61.538...
    # a chunk never continues over a sentence end (conlleval puts a boundary between sentences)
    split = entity_scores([["I-PER"], ["I-PER"]], [["I-PER"], ["I-PER"]])
    assert split["f1"] == 100.0
    assert entity_scores([["O"]], [["I-LOC"]]) == {"f1": 0.0, "precision": 0.0, "recall": 0.0}


# -- CRF --------------------------------------------------------------------------------------
def brute_force(crf, emissions, length):
    transitions, start, end = (t.detach() for t in crf._scores())
    k = emissions.shape[-1]
    scores = {}
    for seq in itertools.product(range(k), repeat=length):
        s = start[seq[0]] + end[seq[-1]] + sum(emissions[t, y] for t, y in enumerate(seq))
        s = s + sum(transitions[a, b] for a, b in zip(seq, seq[1:]))
        scores[seq] = float(s)
    return scores


@pytest.mark.parametrize("constrained", [False, True])
def test_crf_log_likelihood_and_viterbi_match_brute_force(constrained):
    torch.manual_seed(0)
    tags = ["B-PER", "E-PER", "I-PER", "O", "S-PER"]
    crf = ConditionalRandomField(5, bioes_constraints(tags) if constrained else None)
    with torch.no_grad():
        crf.transitions.normal_()
        crf.start_transitions.normal_()
        crf.end_transitions.normal_()
    lengths = [4, 2, 1]
    emissions = torch.randn(3, 4, 5)
    mask = torch.arange(4).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    gold = torch.randint(0, 5, (3, 4))
    if constrained:
        gold = torch.tensor([[0, 2, 1, 3], [4, 3, 0, 0], [3, 0, 0, 0]])
    log_lik = crf(emissions, gold, mask).detach()
    best = crf.viterbi_decode(emissions, mask)
    for b, n in enumerate(lengths):
        scores = brute_force(crf, emissions[b], n)
        log_z = torch.logsumexp(torch.tensor(list(scores.values()), dtype=torch.float64), 0)
        expected = scores[tuple(gold[b, :n].tolist())] - float(log_z)
        assert float(log_lik[b]) == pytest.approx(expected, abs=1e-4)
        assert tuple(best[b]) == max(scores, key=scores.get)
        if constrained:
            allowed, allowed_start, allowed_end = bioes_constraints(tags)
            assert allowed_start[best[b][0]] and allowed_end[best[b][-1]]
            assert all(allowed[i, j] for i, j in zip(best[b], best[b][1:]))
    # probabilities of all sequences of length 2 sum to 1
    all_seqs = torch.tensor(list(itertools.product(range(5), repeat=2)))
    em = emissions[:1, :2].expand(len(all_seqs), 2, 5)
    assert float(crf(em, all_seqs).detach().exp().sum()) == pytest.approx(1.0, abs=1e-4)


def test_bioes_constraints():
    tags = ["B-LOC", "E-LOC", "I-LOC", "O", "S-LOC", "B-PER", "E-PER"]
    allowed, start, end = bioes_constraints(tags)
    i = {t: n for n, t in enumerate(tags)}
    assert allowed[i["B-LOC"], i["I-LOC"]] and allowed[i["B-LOC"], i["E-LOC"]]
    assert not allowed[i["B-LOC"], i["E-PER"]] and not allowed[i["B-LOC"], i["O"]]
    assert allowed[i["E-LOC"], i["B-PER"]] and allowed[i["O"], i["S-LOC"]]
    assert not allowed[i["O"], i["I-LOC"]] and not allowed[i["S-LOC"], i["E-LOC"]]
    assert start[i["B-LOC"]] and not start[i["I-LOC"]] and not start[i["E-LOC"]]
    assert end[i["E-LOC"]] and end[i["O"]] and not end[i["B-LOC"]]


# -- layer cache ------------------------------------------------------------------------------
def test_layer_cache_equals_embedder_and_is_reused(tmp_path, monkeypatch):
    sentences = [["The", "cat", "sat", "."], ["Hello"], ["A", "longer", "sentence", "with", "words", "."]]
    first = LayerCache(TINY_REFERENCE, tmp_path, batch_size=2).layers(sentences, name="toy")
    assert first.created and first.path.is_file() and len(first) == 3
    direct = list(Embedder(TINY_REFERENCE, batch_size=1, mode="warm").embed_sentences(sentences))
    for i, expected in enumerate(direct):
        assert first[i].shape == expected.shape == (3, len(sentences[i]), 32)
        np.testing.assert_allclose(first[i], expected, rtol=1e-5, atol=1e-6)

    def no_embedder(self):
        raise AssertionError("the second run must not run the biLM")

    monkeypatch.setattr(LayerCache, "embedder", property(no_embedder))
    second = LayerCache(TINY_REFERENCE, tmp_path).layers(sentences, name="toy")
    assert not second.created and second.path == first.path
    np.testing.assert_array_equal(second.data, first.data)
    assert isinstance(second.data, np.memmap)  # mapped, not read into memory
    other = LayerCache(TINY_REFERENCE, tmp_path)
    assert other.path_for(sentences[:2], "toy") != first.path  # other data, other key


def test_layer_cache_key_follows_the_model_files_contents(tmp_path):
    sentences = [["a", "b"]]
    key = LayerCache(TINY_REFERENCE, tmp_path).key(sentences)
    moved = copy_model(tmp_path / "moved")
    assert LayerCache(moved, tmp_path).key(sentences) == key  # same bytes elsewhere: same key
    assert LayerCache(copy_model(tmp_path / "changed", change=True), tmp_path).key(sentences) != key
    assert LayerCache(TINY_REFERENCE, tmp_path).key([["a", "c"]]) != key
    assert LayerCache(TINY_REFERENCE, tmp_path).key([["a b"]]) != key  # token boundaries count
    # a file at the right name whose stored key differs (stale or foreign) is computed again
    cache = LayerCache(TINY_REFERENCE, tmp_path)
    path = cache.layers(sentences).path
    with h5py.File(path, "r+") as f:
        f.attrs["key"] = "something else"
    again = cache.layers(sentences)
    assert again.created and again.path == path and again[0].shape == (3, 2, 32)


def copy_model(folder, change=False):
    """A copy of the tiny model's files; ``change``: with one weight altered."""
    options, weights = model_files(TINY_REFERENCE)
    folder.mkdir()
    shutil.copy(options, folder / "options.json")
    shutil.copy(weights, folder / "weights.hdf5")
    if change:
        with h5py.File(folder / "weights.hdf5", "r+") as f:
            names = []
            f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
            name = next(n for n in names if f[n].dtype.kind == "f" and f[n].size > 1)
            f[name][(0,) * f[name].ndim] += 1.0
    return folder


# -- end to end -------------------------------------------------------------------------------
PEOPLE = ["Smith", "Jones", "Brown", "Taylor", "Wilson", "Davies", "Evans", "Thomas"]
PLACES = ["Paris", "London", "Berlin", "Madrid", "Rome", "Vienna", "Oslo", "Prague"]
OTHER = ["the", "met", "in", "and", "went", "to", "said", "on", "a", "visit", "today", "."]


def toy_ner(rng, n):
    """Sentences whose entity tags follow from the words: people PER, places LOC; two adjacent
    people are two entities (IOB1 B- on the second)."""
    out = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(rng.randint(3, 9)):
            r = rng.random()
            if r < 0.25:
                tokens.append(rng.choice(PEOPLE))
                tags.append("B-PER" if tags and tags[-1].endswith("PER") else "I-PER")
            elif r < 0.45:
                tokens.append(rng.choice(PLACES))
                tags.append("I-LOC")
            else:
                tokens.append(rng.choice(OTHER))
                tags.append("O")
        out.append((tokens, tags))
    return out


def write_conll(path, sentences):
    lines = ["-DOCSTART- -X- O O", ""]
    for tokens, tags in sentences:
        lines += [f"{t} NN I-NP {g}" for t, g in zip(tokens, tags)] + [""]
    return write(path, "\n".join(lines))


def write_conllu(path, sentences):
    lines = []
    for tokens, tags in sentences:
        lines += [f"{i}\t{t}\t{t}\t{g}\t_\t_\t0\t_\t_\t_" for i, (t, g) in enumerate(zip(tokens, tags), 1)]
        lines.append("")
    return write(path, "\n".join(lines))


def write_sst(path, rng, n):
    lines = []
    for _ in range(n):
        label = rng.choice("01234")
        word = {"0": "awful", "1": "bad", "2": "okay", "3": "good", "4": "superb"}[label]
        lines.append(f"({label} (2 it) ({label} (2 was) ({label} {word})))")
    return write(path, "\n".join(lines) + "\n")


EXPECTED_KEYS = {
    "task",
    "metric",
    "dev",
    "test",
    "epochs",
    "seed",
    "train_fraction",
    "elmo",
    "cpu_seconds",
    "wall_seconds",
    "best_epoch",
    "train_sentences",
}


def test_ner_end_to_end_with_tiny_elmo_and_reload(tmp_path):
    rng = random.Random(1)
    files = {s: write_conll(tmp_path / f"{s}.txt", toy_ner(rng, 12)) for s in ("train", "dev", "test")}
    out = tmp_path / "out"
    argv = ["task", "ner", "--train", files["train"], "--dev", files["dev"], "--test", files["test"]]
    argv += ["--elmo", TINY_REFERENCE, "--epochs", "2", "--hidden", "16", "--seed", "3"]
    argv += ["--train-fraction", "0.5", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--quiet"]
    assert elmokit_main(argv) == 0  # the `elmokit task` subcommand
    metrics = json.loads((out / "metrics.json").read_text())
    assert EXPECTED_KEYS <= metrics.keys()
    assert metrics["task"] == "ner" and metrics["metric"] == "f1" and metrics["elmo"] == TINY_REFERENCE
    assert metrics["train_fraction"] == 0.5 and metrics["train_sentences"] == 6 and metrics["seed"] == 3
    assert 0 <= metrics["test"] <= 100 and metrics["cpu_seconds"] > 0 and metrics["epochs"] == 2
    assert {p.name for p in out.iterdir()} == {
        "metrics.json",
        "model.safetensors",
        "model.json",
        "dev.predictions.txt",
        "test.predictions.txt",
    }
    assert len(list((tmp_path / "cache").glob("*.h5"))) == 3
    # the written predictions are conlleval input and give the reported score
    blocks = (out / "test.predictions.txt").read_text().strip().split("\n\n")
    rows = [[line.split() for line in block.splitlines()] for block in blocks]
    gold, predicted = [[r[1] for r in s] for s in rows], [[r[2] for r in s] for s in rows]
    assert entity_scores(gold, predicted)["f1"] == pytest.approx(metrics["test"])
    # the reloaded model predicts what the trained one did
    trained = TrainedTask.load(out)
    assert trained.predict([[r[0] for r in s] for s in rows]) == predicted
    with pytest.raises(ValueError, match="SHA-256"):
        TrainedTask.load(out, elmo=copy_model(tmp_path / "other", change=True))
    saved = json.loads((out / "model.json").read_text())
    del saved["elmo"]["weights_sha256"]
    (out / "model.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="does not record the SHA-256"):
        TrainedTask.load(out)


def test_ner_predictions_are_written_in_the_scheme_of_the_input(tmp_path):
    rng = random.Random(4)
    iob2 = [(t, from_bioes(iob1_to_bioes(g), "IOB2")) for t, g in toy_ner(rng, 24)]
    files = {s: write_conll(tmp_path / f"{s}.txt", iob2) for s in ("train", "dev", "test")}
    out = tmp_path / "out"
    argv = ["task", "ner", "--train", files["train"], "--dev", files["dev"], "--test", files["test"]]
    argv += ["--no-elmo", "--epochs", "8", "--hidden", "16", "--out", str(out), "--quiet"]
    assert elmokit_main(argv) == 0
    assert json.loads((out / "model.json").read_text())["config"]["tag_scheme"] == "IOB2"
    rows = [line.split() for line in (out / "test.predictions.txt").read_text().splitlines() if line]
    predicted = [r[2] for r in rows]
    assert any(tag.startswith("B-") for tag in predicted)  # chunks start with B-, as in IOB2
    assert all(not (p == "O" and t.startswith("I-")) for p, t in zip(["O", *predicted], predicted))


def test_pos_end_to_end_and_training_rounds(tmp_path):
    rng = random.Random(2)
    pos = [(t, ["PROPN" if w in PEOPLE + PLACES else "X" for w in t]) for t, _ in toy_ner(rng, 12)]
    pos_file = write_conllu(tmp_path / "pos.conllu", pos)
    out = tmp_path / "pos"
    argv = ["pos", "--train", pos_file, "--dev", pos_file, "--test", pos_file, "--no-elmo", "--hidden", "16"]
    # 12 sentences in batches of 4: 3 updates per epoch, so a round of >= 5 updates is 2 epochs
    argv += ["--batch-size", "4", "--round-updates", "5", "--rounds", "3", "--patience", "9"]
    assert task_main([*argv, "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert EXPECTED_KEYS <= metrics.keys() and metrics["metric"] == "accuracy" and metrics["elmo"] is None
    assert metrics["epochs_per_round"] == 2 and metrics["rounds"] == 3 and metrics["epochs"] == 6
    assert [h["epoch"] for h in metrics["history"]] == [2, 4, 6] and metrics["updates"] == 18
    best = max(metrics["history"], key=lambda h: h["dev_accuracy"])  # first of the best is kept
    assert metrics["best_epoch"] == best["epoch"] and metrics["dev"] == pytest.approx(best["dev_accuracy"])
    gold = [t for _, tags in pos for t in tags]
    predicted = [line.split()[2] for line in (out / "test.predictions.txt").read_text().splitlines() if line]
    assert metrics["test"] == pytest.approx(100 * sum(g == p for g, p in zip(gold, predicted)) / len(gold))


def test_sentiment_classifier_learns_and_reads_binary(tmp_path):
    rng = random.Random(3)
    files = {
        s: write_sst(tmp_path / f"{s}.txt", rng, n) for s, n in (("train", 60), ("dev", 20), ("test", 30))
    }
    out = tmp_path / "sst"
    argv = ["sentiment", "--train", files["train"], "--dev", files["dev"], "--test", files["test"]]
    argv += [
        "--no-elmo",
        "--hidden",
        "16",
        "--lr",
        "0.01",
        "--dropout",
        "0.1",
        "--rounds",
        "4",
        "--round-updates",
        "20",
    ]
    assert task_main([*argv, "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["labels"] == ["0", "1", "2", "3", "4"] and metrics["test"] > 90.0, metrics["history"]

    out = tmp_path / "sst2"
    argv = [
        "sentiment",
        "--train",
        files["train"],
        "--dev",
        files["dev"],
        "--test",
        files["test"],
        "--binary",
    ]
    argv += ["--elmo", TINY_REFERENCE, "--epochs", "2", "--hidden", "16", "--cache-dir", str(tmp_path / "c")]
    assert task_main([*argv, "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert EXPECTED_KEYS <= metrics.keys() and metrics["task"] == "sentiment" and metrics["binary"]
    assert metrics["labels"] == ["negative", "positive"]
    n_binary = sum(line[1] != "2" for line in open(files["test"]))
    assert len((out / "test.predictions.txt").read_text().splitlines()) == n_binary


def test_fine_tune_elmo_trains_the_bilm(tmp_path):
    rng = random.Random(4)
    files = {s: write_conll(tmp_path / f"{s}.txt", toy_ner(rng, 6)) for s in ("train", "dev", "test")}
    config = TaskConfig(
        "ner",
        files["train"],
        files["dev"],
        files["test"],
        str(tmp_path / "out"),
        elmo=TINY_REFERENCE,
        fine_tune_elmo=True,
        epochs=1,
        model=ModelConfig(hidden=8),
        progress=False,
    )
    metrics = run_task(config)
    assert metrics["fine_tune_elmo"] and metrics["epochs"] == 1
    prefix = "features.elmo.bilm."
    state = load_file(tmp_path / "out" / "model.safetensors")
    tuned = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    pretrained = BiLM.load(*model_files(TINY_REFERENCE)).state_dict()
    assert tuned.keys() == pretrained.keys()
    assert any(not torch.equal(v, pretrained[k]) for k, v in tuned.items())  # the biLM was trained
    reloaded = TrainedTask.load(tmp_path / "out").model.features.elmo.bilm.state_dict()
    assert all(torch.equal(v, reloaded[k]) for k, v in tuned.items())
    # --elmo-lr 0: the biLM's own learning rate; at 0 it keeps its pretrained weights
    config = dataclasses.replace(config, out=str(tmp_path / "lr0"), elmo_lr=0.0, model=ModelConfig(hidden=8))
    assert run_task(config)["fine_tune_elmo"]
    state = load_file(tmp_path / "lr0" / "model.safetensors")
    assert all(torch.equal(state[prefix + k], v) for k, v in pretrained.items())


def test_tagger_learns_a_trivial_task(tmp_path):
    rng = random.Random(0)
    files = {
        s: write_conll(tmp_path / f"{s}.txt", toy_ner(rng, n))
        for s, n in (("train", 100), ("dev", 20), ("test", 40))
    }
    config = TaskConfig(
        "ner",
        files["train"],
        files["dev"],
        files["test"],
        str(tmp_path / "out"),
        elmo=None,
        epochs=6,
        patience=6,
        lr=0.02,
        batch_size=10,
        word_dropout=0.0,
        model=ModelConfig(hidden=16, word_dim=16, char_filters=8, dropout=0.1),
        progress=False,
    )
    metrics = run_task(config)
    assert metrics["test"] > 95.0, metrics["history"]
    assert math.isfinite(metrics["history"][-1]["train_loss"])
