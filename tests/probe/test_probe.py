"""elmokit probe: the per-layer linear probe (elmokit.probe) and its command line."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from elmokit.base.task_data import TaggedSentence
from elmokit.cli import main
from elmokit.embed.embedder import Embedder
from elmokit.probe import first_senses, read_gold_keys, read_tagged, read_wsd_xml, run_probe, run_wsd
from elmokit.probe.tagging import ProbeSettings, _scores, _Split, _train_probe
from elmokit.probe.wsd import Instance, gold_key_path

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


# -- elmokit probe wsd -------------------------------------------------------------------------

A, B, DOG = "bank%1:14:00::", "bank%1:17:01::", "dog%1:05:00::"
INDEX_SENSE = f"""{A} 08420278 1 20
{B} 09213565 2 10
dog%2:38:00:: 02005948 1 0
dog%1:18:01:: 10114209 3 0
{DOG} 02084071 1 42
"""


def _sentence_xml(sid: str, words: list[tuple[str, str | None]]) -> str:
    """words: (text, lemma) pairs; a lemma makes an <instance> (id sid.tN, part of speech NOUN)."""
    tokens = []
    for n, (text, lemma) in enumerate(words):
        if lemma is None:
            tokens.append(f'<wf lemma="{text.lower()}" pos="X">{text}</wf>')
        else:
            tokens.append(f'<instance id="{sid}.t{n}" lemma="{lemma}" pos="NOUN">{text}</instance>')
    return f'<sentence id="{sid}">{"".join(tokens)}</sentence>'


def _wsd_files(tmp_path) -> dict[str, str]:
    train = [
        _sentence_xml("d0.s0", [("I", None), ("took", None), ("money", "bank"), ("out", None)]),
        _sentence_xml("d0.s1", [("the", None), ("money", "bank"), ("is", None), ("safe", None)]),
        _sentence_xml("d0.s2", [("we", None), ("sat", None), ("by", None), ("river", "bank")]),
        _sentence_xml("d0.s3", [("the", None), ("river", "bank"), ("flows", None)]),
    ]
    test = [
        _sentence_xml("t0.s0", [("my", None), ("money", "bank"), ("and", None), ("river", "bank")]),
        _sentence_xml("t0.s1", [("a", None), ("dog", "dog"), ("and", None), ("a", None), ("cat", "cat")]),
    ]
    files = {
        "train": (
            "semcor.data.xml",
            "<corpus lang='en'><text id='d0'>" + "".join(train) + "</text></corpus>",
        ),
        "train_key": ("semcor.gold.key.txt", f"d0.s0.t2 {A}\nd0.s1.t1 {A}\nd0.s2.t3 {B}\nd0.s3.t1 {B}\n"),
        "test": ("eval.data.xml", "<corpus lang='en'><text id='t0'>" + "".join(test) + "</text></corpus>"),
        "test_key": (
            "eval.gold.key.txt",
            f"t0.s0.t1 {A}\nt0.s0.t3 {B}\nt0.s1.t1 {DOG}\nt0.s1.t4 cat%1:05:00::\n",
        ),
        "index": ("index.sense", INDEX_SENSE),
    }
    for name, text in files.values():
        (tmp_path / name).write_text(text)
    return {key: str(tmp_path / name) for key, (name, _) in files.items()}


def test_the_unified_xml_is_read_with_multiword_instances(tmp_path):
    path = tmp_path / "x.data.xml"
    path.write_text(
        '<?xml version="1.0" encoding="UTF-8" ?>\n<corpus lang="en" source="x"><text id="d1">'
        '<sentence id="d1.s0"><wf lemma="he" pos="PRON">He</wf>'
        '<instance id="d1.s0.t1" lemma="live" pos="VERB">lives</instance><wf lemma="in" pos="ADP">in</wf>'
        '<instance id="d1.s0.t3" lemma="new_york" pos="NOUN">New York</instance></sentence></text></corpus>'
    )
    [sentence] = read_wsd_xml(path)
    assert sentence.tokens == ["He", "lives", "in", "New", "York"]
    assert sentence.instances == [
        Instance("d1.s0.t1", "live", "VERB", 1, 2),
        Instance("d1.s0.t3", "new_york", "NOUN", 3, 5),
    ]
    assert gold_key_path(path) == tmp_path / "x.gold.key.txt"
    (tmp_path / "bad.data.xml").write_text("<corpus><sentence>")
    with pytest.raises(ValueError, match=r"bad.data.xml: not XML"):
        read_wsd_xml(tmp_path / "bad.data.xml")


def test_first_senses_come_from_index_sense_by_lemma_and_part_of_speech(tmp_path):
    (tmp_path / "index.sense").write_text(INDEX_SENSE)
    first = first_senses(tmp_path / "index.sense")
    assert first == {("bank", "1"): A, ("dog", "2"): "dog%2:38:00::", ("dog", "1"): DOG}


def test_wsd_takes_the_nearest_training_sense_and_falls_back_to_the_first_sense(tmp_path, embedder):
    f = _wsd_files(tmp_path)
    train, test = read_wsd_xml(f["train"]), read_wsd_xml(f["test"])
    result = run_wsd(
        embedder,
        train,
        read_gold_keys(f["train_key"]),
        test,
        read_gold_keys(f["test_key"]),
        first_senses(f["index"]),
    )
    # layer 0 is context-free: "money" is exactly sense A's centroid, "river" sense B's; dog falls
    # back to its first noun sense; cat has no sense anywhere and stays unanswered
    assert result["layers"]["0"] == {
        "precision": 100.0,
        "recall": 75.0,
        "f1": pytest.approx(600 / 7),
        "answered": 3,
    }
    assert result["first_sense_answers"] == 1 and result["unanswered"] == 1 and result["test_instances"] == 4
    # the first-sense baseline says A for both banks
    assert (
        result["first-sense"]["precision"] == pytest.approx(200 / 3)
        and result["first-sense"]["recall"] == 50.0
    )
    assert list(result["layers"]) == ["0", "1", "2", "average"]

    # 1-NN by cosine, recomputed by hand for the contextual layers
    vectors = {}
    for sentence, array in zip(train + test, embedder.embed_sentences([s.tokens for s in train + test])):
        for instance in sentence.instances:
            vectors[instance.id] = array[:, instance.start]
    keys = read_gold_keys(f["train_key"])
    for layer in (1, 2):
        centroid = {
            sense: np.mean([vectors[i][layer] for i, ks in keys.items() if sense in ks], axis=0)
            for sense in (A, B)
        }
        cos = {s: c @ vectors["t0.s0.t3"][layer] / np.linalg.norm(c) for s, c in centroid.items()}
        cos_a = {s: c @ vectors["t0.s0.t1"][layer] / np.linalg.norm(c) for s, c in centroid.items()}
        right = (max(cos_a, key=cos_a.get) == A) + (max(cos, key=cos.get) == B) + 1  # + dog
        assert result["layers"][str(layer)]["precision"] == pytest.approx(100 * right / 3)


def test_probe_wsd_command_prints_the_table_and_writes_json(tmp_path, capsys):
    f = _wsd_files(tmp_path)
    out = tmp_path / "wsd.json"
    argv = ["probe", "wsd", "--model", MODEL, "--train", f["train"], "--test", f["test"]]
    argv += ["--index-sense", f["index"], "--layers", "0,2", "--json", str(out)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:4]] == ["layer", "0", "2", "first-sense"]
    record = json.loads(out.read_text())
    assert record["data"]["train_key"] == f["train_key"] and record["layers"]["0"]["answered"] == 3
    assert record["command"].startswith(f"elmokit probe wsd --model {MODEL} --train {f['train']}")
    assert main(argv) == 2
    assert _error(capsys).endswith("exists; pass overwrite=True (--overwrite) to replace it")
    (tmp_path / "semcor.gold.key.txt").write_text("d0.s0.t2\n")
    assert main([*argv, "--overwrite"]) == 2
    assert _error(capsys) == (
        f"elmokit: error: {f['train_key']}: line 1: expected 'INSTANCE_ID SENSE_KEY ...', got 'd0.s0.t2'"
    )


def test_the_plot_draws_a_run_and_saved_records(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    label = lambda token, rng: "N" if token in ("the", "cat") else "V"  # noqa: E731
    train = _write_conll(tmp_path / "train.txt", _sentences(12, 3, label))
    test = _write_conll(tmp_path / "test.txt", _sentences(6, 4, label))
    argv = ["probe", "--model", MODEL, "--train", train, "--test", test, "--column", "1", "--seeds", "2"]
    argv += ["--layers", "0,1,mix", "--json", str(tmp_path / "a.json"), "--plot", str(tmp_path / "a.png")]
    assert main(argv) == 0
    capsys.readouterr()
    one = matplotlib.image.imread(tmp_path / "a.png")
    # two saved records side by side: a figure twice as wide as one panel's
    out = tmp_path / "both.png"
    assert main(["probe", "plot", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    two = matplotlib.image.imread(out)
    assert two.shape[0] == one.shape[0] and two.shape[1] == 2 * one.shape[1]
    # the output rule, and records that are not the probe's
    assert main(["probe", "plot", str(tmp_path / "a.json"), "--out", str(out)]) == 2
    assert _error(capsys).endswith("exists; pass overwrite=True (--overwrite) to replace it")
    (tmp_path / "other.json").write_text('{"model": "x"}')
    assert main(["probe", "plot", str(tmp_path / "other.json"), "--out", str(tmp_path / "c.png")]) == 2
    assert "is not a record written by elmokit probe --json" in _error(capsys)
    assert main(["probe", "plot", train, "--out", str(tmp_path / "c.png")]) == 2
    assert "is not JSON" in _error(capsys)
    assert main(["probe", "plot", str(tmp_path / "a.json"), "--titles", "x,y", "--out", str(tmp_path / "c.png")]) == 2
    assert _error(capsys) == "elmokit: error: 2 titles for 1 probe records"
    assert not (tmp_path / "c.png").exists()


def _xor_split(n: int, seed: int) -> _Split:
    """Two features per token, one "layer"; the label is whether their signs differ (XOR)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 2, generator=g) * 2 - 1
    y = ((x[:, 0, 0] > 0) != (x[:, 0, 1] > 0)).long().numpy()
    return _Split(x, y, [1] * n)


def _xor_accuracy(hidden: int) -> float:
    train, test = _xor_split(2000, 0), _xor_split(500, 1)
    stats = (torch.zeros(2, 2), torch.ones(2, 2))
    settings = ProbeSettings(epochs=40, batch_size=64, lr=0.01, hidden=hidden)
    probe = _train_probe("0", 0, train, stats, 2, settings, None, None)
    with torch.no_grad():
        predicted = probe(test.x).argmax(-1).numpy()
    return float((predicted == test.y).mean())


def test_an_mlp_probe_learns_what_a_linear_one_cannot():
    assert _xor_accuracy(hidden=0) < 0.7  # no line separates XOR
    assert _xor_accuracy(hidden=32) > 0.95


def test_hidden_units_reach_the_record_and_a_negative_count_is_refused(tmp_path, capsys):
    chunk = lambda token, rng: "B-NP" if token in ("the", "cat") else "O"  # noqa: E731
    train = _write_conll(tmp_path / "train.txt", _sentences(12, 7, chunk))
    test = _write_conll(tmp_path / "test.txt", _sentences(6, 8, chunk))
    out = tmp_path / "mlp.json"
    argv = ["probe", "--model", MODEL, "--train", train, "--test", test, "--column", "2"]
    assert main([*argv, "--seeds", "1", "--layers", "1", "--hidden", "8", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["settings"]["hidden"] == 8 and record["settings"]["classifier"].startswith("MLP")
    assert record["command"].endswith("--layers 1 --hidden 8")
    with pytest.raises(SystemExit):
        main([*argv, "--hidden", "-1"])
    assert "--hidden" in capsys.readouterr().err
    with pytest.raises(ValueError, match="hidden must be 0"):
        ProbeSettings(hidden=-2)
