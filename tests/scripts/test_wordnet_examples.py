"""scripts/wordnet_examples_wsd.py: WordNet's usage examples as a WSD set in the unified format."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("sacremoses", reason="the corpus extra: the script tokenizes WordNet's examples")
from elmokit.probe.wsd import first_senses, read_gold_keys, read_wsd_xml, run_wsd

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "wordnet_examples_wsd.py"

# A WordNet 3.0 dict folder in miniature: the licence header, then synset lines
# (offset lex_filenum ss_type w_cnt word lex_id ... p_cnt ... | gloss; "example"; "example").
HEADER = "  1 This software and database is being provided to you, the LICENSEE, by Princeton\n"
DATA = {
    "noun": [
        "00000001 06 n 02 bank 0 depository_financial_institution 0 000 | a financial institution; "
        '"he cashed a check at the bank"; "the banks raised their rates"  \n',
        '00000002 17 n 01 bank 1 000 | sloping land beside water; "they sat on the bank of the river"  \n',
        '00000003 06 n 01 mouse 0 000 | a small rodent; "the mice ran away"; "no example word here"  \n',
        '00000004 06 n 01 teapot 0 000 | a pot for tea; "she filled the teapot"  \n',
        '00000005 06 n 01 mouse 1 000 | a hand-operated pointer; "click the mouse twice"  \n',
    ],
    "verb": ['00000006 30 v 01 run 0 000 | move fast; "she is running home"  \n'],
    "adj": [],
    "adv": [],
}
INDEX_SENSE = """bank%1:14:00:: 00000001 1 20
bank%1:17:01:: 00000002 2 10
depository_financial_institution%1:14:00:: 00000001 1 0
mouse%1:05:00:: 00000003 1 5
mouse%1:06:00:: 00000005 2 3
run%2:38:00:: 00000006 1 30
teapot%1:06:00:: 00000004 1 0
"""


@pytest.fixture
def script(monkeypatch):
    spec = importlib.util.spec_from_file_location("wordnet_examples_wsd", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def wordnet(tmp_path):
    folder = tmp_path / "dict"
    folder.mkdir()
    for pos, lines in DATA.items():
        (folder / f"data.{pos}").write_text(HEADER + "".join(lines), encoding="utf-8")
    (folder / "index.sense").write_text(INDEX_SENSE, encoding="utf-8")
    (folder / "noun.exc").write_text("mice mouse\n", encoding="utf-8")
    return folder


def test_examples_find_inflected_polysemous_lemmas_with_their_sense_keys(script, wordnet):
    found = {
        (" ".join(e.tokens), e.tokens[e.index], e.lemma, e.pos, e.key)
        for e in script.examples(wordnet, wordnet)
    }
    assert found == {
        ("he cashed a check at the bank", "bank", "bank", "NOUN", "bank%1:14:00::"),
        ("the banks raised their rates", "banks", "bank", "NOUN", "bank%1:14:00::"),  # detachment rule
        ("they sat on the bank of the river", "bank", "bank", "NOUN", "bank%1:17:01::"),
        ("the mice ran away", "mice", "mouse", "NOUN", "mouse%1:05:00::"),  # the exception list
        ("click the mouse twice", "mouse", "mouse", "NOUN", "mouse%1:06:00::"),
    }  # teapot and run have one sense each; "no example word here" shows no lemma


def test_writes_a_split_that_the_wsd_probe_reads(script, wordnet, tmp_path, capsys):
    out = tmp_path / "out"
    assert script.main([str(wordnet), str(out), "--seed", "3", "--test-fraction", "0.5"]) == 0
    assert "training and" in capsys.readouterr().out
    sentences, keys = [], {}
    for name in ("train", "test"):
        part = read_wsd_xml(out / f"{name}.data.xml")
        part_keys = read_gold_keys(out / f"{name}.gold.key.txt")
        assert part and {i.id for s in part for i in s.instances} == set(part_keys)
        sentences += part
        keys.update(part_keys)
    assert len(sentences) == 5
    # split per sense: only bank's first sense has two examples, so one of them is the test set,
    # and bank has two senses in training; every other example is a training example
    test_keys = read_gold_keys(out / "test.gold.key.txt")
    assert list(test_keys.values()) == [["bank%1:14:00::"]]
    by_text = {" ".join(s.tokens): keys[s.instances[0].id] for s in sentences}
    assert by_text["the mice ran away"] == ["mouse%1:05:00::"]
    tokens = {" ".join(s.tokens): s.tokens[s.instances[0].start] for s in sentences}
    assert tokens["the banks raised their rates"] == "banks"
    # the same seed draws the same split; the files are never replaced
    assert script.main([str(wordnet), str(out), "--seed", "3"]) == 2
    assert "exists: choose a new OUT folder" in capsys.readouterr().err
    again = tmp_path / "again"
    assert script.main([str(wordnet), str(again), "--seed", "3"]) == 0
    for name in script.OUT_FILES:
        assert (again / name).read_bytes() == (out / name).read_bytes()


def test_the_probe_runs_on_the_written_split(script, wordnet, tmp_path):
    out = tmp_path / "out"
    examples = script.examples(wordnet, wordnet)
    script.write_split(examples, out.mkdir() or out, "train")
    script.write_split(examples, out, "test")
    result = run_wsd(
        "elmo-tiny-reference",
        read_wsd_xml(out / "train.data.xml"),
        read_gold_keys(out / "train.gold.key.txt"),
        read_wsd_xml(out / "test.data.xml"),
        read_gold_keys(out / "test.gold.key.txt"),
        first_senses(wordnet / "index.sense"),
        ["1"],
    )
    assert result["test_instances"] == 5 and result["first_sense_answers"] == 0
    assert result["first-sense"]["f1"] == pytest.approx(300 / 5)  # bank x2 and the mice: sense 1


def test_a_folder_without_wordnet_is_one_line(script, tmp_path, capsys):
    assert script.main([str(tmp_path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("wordnet_examples_wsd: error: ") and "no index.sense" in err and err.count("\n") == 1
    )


def test_a_test_word_needs_two_senses_of_its_lemma_in_training(script):
    def ex(text, key, lemma="bank"):
        tokens = text.split()
        return script.Example(tokens, 0, lemma, "NOUN", key)

    found = [
        ex("bank one", "bank%1"),
        ex("bank two", "bank%1"),
        ex("bank three", "bank%1"),
        ex("bank river", "bank%2"),
        ex("lone a", "lone%1", "lone"),  # two examples of a lemma's only sense: not a choice
        ex("lone b", "lone%1", "lone"),
    ]
    split = script.split_by_sense(found, seed=7, test_fraction=0.5)
    assert [e.key for e in split["test"]] == ["bank%1"]  # int(3 * 0.5) = 1 of bank%1's three
    assert sorted(e.key for e in split["train"]) == ["bank%1", "bank%1", "bank%2", "lone%1"]
    assert split == script.split_by_sense(found, seed=7, test_fraction=0.5)
