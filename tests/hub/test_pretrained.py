"""The shipped models: files, size, start state, the default, and what the news model's vectors do."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from elmokit import BiLM, Embedder
from elmokit.embed.senses import nearest_contexts, read_contexts
from elmokit.hub import DEFAULT_MODEL, model_files
from elmokit.hub.shipped import MODELS_DIR, available_models

NEWS = "elmo-news-512"
CONFIG = Path(__file__).parents[2] / "configs" / "news-512.json"


def test_news_model_is_the_default_and_ships_its_files():
    assert DEFAULT_MODEL == NEWS and set(available_models()) == {NEWS, "elmo-tiny-reference"}
    folder = MODELS_DIR / NEWS
    for name in ("options.json", "weights.hdf5", "vocab.txt", "softmax.hdf5", "training.json", "README.md"):
        assert (folder / name).is_file(), name
    assert sum(p.stat().st_size for p in folder.iterdir()) < 40 * 2**20
    options = json.loads((folder / "options.json").read_text())
    expected = json.loads(CONFIG.read_text())
    assert options["lstm"] == expected["lstm"] and options["char_cnn"] == expected["char_cnn"]
    vocab = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert vocab[:3] == ["<S>", "</S>", "<UNK>"] and options["n_tokens_vocab"] == len([v for v in vocab if v])


def test_model_card_states_the_training_run():
    folder = MODELS_DIR / NEWS
    history = json.loads((folder / "training.json").read_text())
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert f"{history['steps']:,}" in card and f"{history['tokens']:,}" in card
    assert history["config"]["state_reset"] == 0.01
    assert "/work/" not in json.dumps(history) and not Path(history["config"]["train"]).is_absolute()


def test_news_model_evaluates_by_name(tmp_path):
    """`elmokit evaluate elmo-news-512` finds the shipped softmax, and gives the folder's figures."""
    from elmokit.cli import main

    text = tmp_path / "heldout.txt"
    text.write_text("The company said profits rose 5 pct in 1986 .\nOil prices fell on Monday .\n")
    figures = []
    for model in (NEWS, str(MODELS_DIR / NEWS)):
        out = tmp_path / f"figures-{len(figures)}.json"
        assert (
            main(
                [
                    "evaluate",
                    model,
                    "--heldout",
                    str(text),
                    "--batch-size",
                    "2",
                    "--quiet",
                    "--json",
                    str(out),
                ]
            )
            == 0
        )
        figures.append(json.loads(out.read_text()))
    assert figures[0] == figures[1] and 0 < figures[0]["tokens"] <= 18  # 16 tokens + 2 </S>
    assert 1.0 < figures[0]["average"] < 1000.0


def test_news_model_has_a_start_state_that_warm_mode_uses():
    options, weights = model_files(NEWS)
    with h5py.File(weights, "r") as f:
        assert f["start_state/h"].shape == (2, 2, 128) and f["start_state/c"].shape == (2, 2, 512)
    bilm = BiLM.load(options, weights)
    assert bilm.start_state is not None and float(bilm.start_state.c.abs().sum()) > 0
    sentence = "The bank raised its rates .".split()
    warm = Embedder(mode="warm").embed_sentence(sentence)
    zero = Embedder(mode="zero").embed_sentence(sentence)
    np.testing.assert_array_equal(warm[0], zero[0])  # layer 0 does not depend on the state
    assert not np.allclose(warm[1:], zero[1:], atol=1e-3)


def test_news_model_separates_the_senses_of_bank():
    """In both LSTM layers the river query ranks the 3 river contexts higher than the money query
    does, and the money query's nearest contexts are money contexts."""
    money = "She went to the bank to withdraw money .".split()
    river = "They had a picnic on the bank of the river .".split()
    queries = [(money, "money"), (money, "river"), (river, "river")]  # (tokens, sense to rank)
    as_money, money_river_ranks, river_river_ranks = nearest_contexts(
        Embedder(), "bank", queries, read_contexts(), k=5
    )
    for layer in (1, 2):
        assert np.mean(river_river_ranks[layer].same_sense_ranks) < np.mean(
            money_river_ranks[layer].same_sense_ranks
        )
        assert as_money[layer].same_sense_at_k == 1.0


def test_demo_shows_what_the_language_model_predicts_for_bank(capsys):
    """The demo ends with the shipped model's substitutes for "bank" in both queries:
    institutions in the money sentence, places and directions in the river sentence."""
    from elmokit.cli import main

    assert main(["demo", "-k", "1"]) == 0
    out = capsys.readouterr().out
    tail = out[out.index("What the language model predicts in place of 'bank'") :].splitlines()
    money = tail[tail.index("  She went to the bank to withdraw money .") + 1]
    river = tail[tail.index("  They had a picnic on the bank of the river .") + 1]
    words = {line: [item.rsplit(" ", 1)[0] for item in line.strip().split(", ")] for line in (money, river)}
    institutions, places = {"government", "company"}, {"side", "north", "south"}
    assert institutions <= set(words[money]) and places <= set(words[river])
    assert not set(words[money]) & places and not set(words[river]) & institutions
