"""elmokit probe: the per-layer linear probe (elmokit.probe) and its command line."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from elmokit.cli import main
from elmokit.embed import Embedder
from elmokit.probe import ProbeSettings, read_tagged, run_probe
from elmokit.probe.tagging import _scores
from elmokit.tasks.readers import TaggedSentence

MODEL = "elmo-tiny-reference"
WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "home"]
FAST = ProbeSettings(epochs=30, batch_size=32, lr=0.05)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(MODEL, batch_size=16)


def _sentences(n: int, seed: int, label) -> list[TaggedSentence]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        tokens = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
        out.append(TaggedSentence(tokens, [label(t, rng) for t in tokens]))
    return out


def _write_conll(path, sentences: list[TaggedSentence]) -> str:
    blocks = ["\n".join(f"{t} X {tag}" for t, tag in zip(s.tokens, s.tags)) for s in sentences]
    path.write_text("-DOCSTART- -X- O\n\n" + "\n\n".join(blocks) + "\n")
    return str(path)


def test_a_labelling_by_token_identity_is_learned_perfectly_from_the_token_layer(embedder):
    identity = lambda token, rng: token.upper()  # noqa: E731
    train, test = _sentences(40, 1, identity), _sentences(20, 2, identity)
    result = run_probe(embedder, train, test, seeds=[0], settings=FAST)
    assert result.metric == "accuracy"
    assert list(result.layers) == ["0", "1", "2", "average", "mix"]
    assert result.layers["0"].test[0]["accuracy"] == 100.0  # the char CNN tells the words apart
    assert result.layers["mix"].test[0]["accuracy"] == 100.0  # and the mix finds layer 0
    weights = result.layers["mix"].mix_weights[0]
    assert len(weights) == 3 and sum(weights) == pytest.approx(1.0)


def test_shuffled_labels_give_chance(embedder):
    coin = lambda token, rng: rng.choice(["A", "B"])  # noqa: E731
    train, test = _sentences(40, 3, coin), _sentences(60, 4, coin)
    result = run_probe(embedder, train, test, layers=["0", "2"], seeds=[0], settings=FAST)
    tags = [t for s in test for t in s.tags]
    majority = 100.0 * max(tags.count("A"), tags.count("B")) / len(tags)
    for scores in result.layers.values():
        assert 35.0 < scores.test[0]["accuracy"] < majority + 8.0


def test_the_same_seed_gives_the_same_number_and_another_seed_another(embedder):
    coin = lambda token, rng: rng.choice(["A", "B", "C"])  # noqa: E731
    train, test = _sentences(20, 5, coin), _sentences(20, 6, coin)
    settings = ProbeSettings(epochs=2)
    first = run_probe(embedder, train, test, layers=["1"], seeds=[0, 1], settings=settings)
    again = run_probe(embedder, train, test, layers=["1"], seeds=[0], settings=settings)
    assert first.layers["1"].test[0] == again.layers["1"].test[0]
    assert first.layers["1"].test[0] != first.layers["1"].test[1]


def test_span_labels_are_scored_by_span_f1():
    labels = ["B-NP", "I-NP", "O"]
    gold = np.array([0, 1, 2, 0, 2])  # chunks NP 0-1 and NP 3
    found = np.array([0, 2, 2, 0, 2])  # NP 0 (wrong) and NP 3 (right)
    scores = _scores(found, gold, labels, [5], spans_too=True)
    assert scores["accuracy"] == 80.0
    assert scores["precision"] == 50.0 and scores["recall"] == 50.0 and scores["f1"] == 50.0


def test_the_command_prints_a_table_and_writes_the_json_record(tmp_path, capsys):
    chunk = lambda token, rng: "B-NP" if token in ("the", "cat") else "O"  # noqa: E731
    train = _write_conll(tmp_path / "train.txt", _sentences(12, 7, chunk))
    test = _write_conll(tmp_path / "test.txt", _sentences(6, 8, chunk))
    out = tmp_path / "probe.json"
    argv = ["probe", "--model", MODEL, "--train", train, "--test", test, "--column", "2"]
    argv += ["--seeds", "2", "--layers", "0,2,average", "--json", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["layer", "test", "f1"]
    assert [line.split()[0] for line in table[1:4]] == ["0", "2", "average"]
    record = json.loads(out.read_text())
    assert record["model"] == MODEL and record["metric"] == "f1" and record["seeds"] == [0, 1]
    assert record["data"] == {"train": train, "dev": None, "test": test}
    assert list(record["layers"]) == ["0", "2", "average"]
    f1 = record["layers"]["2"]["test"]["f1"]
    assert len(f1["per_seed"]) == 2 and f1["mean"] == pytest.approx(sum(f1["per_seed"]) / 2)
    assert record["command"].startswith(f"elmokit probe --model {MODEL} --train {train} --test {test}")
    assert record["sizes"]["train"]["sentences"] == 12

    # the output rule: an existing file is kept unless --overwrite
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().endswith("exists; pass overwrite=True (--overwrite) to replace it")
    assert main([*argv, "--overwrite", "--max-sentences", "3"]) == 0
    assert json.loads(out.read_text())["sizes"]["train"]["sentences"] == 3


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_bad_input_is_one_line(tmp_path, capsys):
    data = _write_conll(tmp_path / "d.txt", _sentences(3, 9, lambda t, rng: "A"))
    base = ["probe", "--model", MODEL, "--test", data]
    assert main([*base, "--train", str(tmp_path / "missing.txt"), "--column", "1"]) == 2
    assert "missing.txt" in _error(capsys)
    assert main([*base, "--train", data, "--column", "5"]) == 2
    assert (
        _error(capsys)
        == f"elmokit: error: {data}: column 5 is out of range: its lines have 3 columns (0 to 2)"
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("-DOCSTART- -X- O\n\n\n")
    assert main([*base, "--train", str(empty), "--column", "1"]) == 2
    assert _error(capsys) == f"elmokit: error: {empty}: no sentences"
    assert main([*base, "--train", data, "--column", "1", "--layers", "0,3"]) == 2
    assert "layer '3' is not one of 0 to 2" in _error(capsys)
    assert main(["probe", "--model", MODEL, "--train", data, "--column", "1"]) == 2
    assert (
        _error(capsys)
        == "elmokit: error: probe needs --train, --test and --column (or: elmokit probe wsd ...)"
    )


def test_features_that_would_not_fit_are_refused_before_any_work(embedder):
    data = _sentences(5, 10, lambda t, rng: "A")
    with pytest.raises(ValueError, match=r"^the features of \d+ tokens x 3 layers x 32 values need .* GiB"):
        run_probe(embedder, data, data, max_feature_bytes=1000)


def test_conllu_columns_are_read(tmp_path):
    path = tmp_path / "a.conllu"
    path.write_text(
        "# text = Dogs run\n1\tDogs\tdog\tNOUN\tNNS\t_\t2\tnsubj\t_\t_\n2\trun\trun\tVERB\tVBP\t_\t0\troot\t_\t_\n\n"
    )
    assert read_tagged(path, "conllu", 3) == [TaggedSentence(["Dogs", "run"], ["NOUN", "VERB"])]
    assert read_tagged(path, "conllu", 7)[0].tags == ["nsubj", "root"]
    with pytest.raises(ValueError, match="column 10 is out of range: its lines have 10 columns"):
        read_tagged(path, "conllu", 10)
