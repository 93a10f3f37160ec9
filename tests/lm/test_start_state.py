"""`elmokit start-state`, `evaluate` and `export` at their edges: where they write, what they show
while they work, and what they warn about."""

from __future__ import annotations

import hashlib
import json
import math
import re
import resource
import shutil
import warnings

import h5py
import numpy as np
import pytest
import torch

from elmokit import BiLM
from elmokit.cli import main
from elmokit.embed.embedder import Embedder
from elmokit.hub.shipped import MODELS_DIR, PACKAGE_DIR, TINY_REFERENCE
from elmokit.lm.language_model import LanguageModel
from elmokit.lm.start_state import estimate_start_state, sentence_losses
from elmokit.lm.vocabulary import Vocabulary
from elmokit.model.weights import has_start_state, save_options, save_softmax, save_weights
from elmokit.training.data import read_sentences
from elmokit.training.evaluate import _positions, compare_start_modes, evaluate_perplexity

from ..conftest import TINY

SHIPPED = MODELS_DIR / TINY_REFERENCE


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def text_file(tmp_path) -> str:
    path = tmp_path / "text.txt"
    lines = ["the bank raised its rates again .", "they sat on the bank of the river ."]
    path.write_text("\n".join(lines * 40) + "\n", encoding="utf-8")
    return str(path)


def _lm_folder(folder, tokens: list[str], seed: int = 0):
    """An exported language model (options.json, weights.hdf5, softmax.hdf5, vocab.txt) of the
    tiny reference shape with random weights and vocabulary ``tokens``."""
    torch.manual_seed(seed)
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", *tokens])
    options = json.loads((TINY / "options.json").read_text())
    model = LanguageModel(options, len(vocab), dropout=0.0)
    folder.mkdir()
    save_options(model.bilm.options, folder / "options.json")
    save_weights(model.bilm, folder / "weights.hdf5")
    save_softmax(model.softmax, folder / "softmax.hdf5")
    vocab.save(folder / "vocab.txt")
    return folder


def test_start_state_write_refuses_the_installed_package(text_file, capsys):
    before = _sha256(SHIPPED / "weights.hdf5")
    for model in (TINY_REFERENCE, str(SHIPPED)):
        assert main(["start-state", model, "--text", text_file, "--rows", "4", "--write", "--quiet"]) == 2
        assert capsys.readouterr().err.strip() == (
            f"elmokit: error: model folder {SHIPPED} is inside the installed elmokit package "
            f"({PACKAGE_DIR}), which elmokit does not change; give a folder of your own"
        )
    assert main(["start-state", TINY_REFERENCE, "--text", text_file, "--out", str(SHIPPED / "copy")]) == 2
    assert "is inside the installed elmokit package" in capsys.readouterr().err
    assert _sha256(SHIPPED / "weights.hdf5") == before
    assert not (SHIPPED / "copy").exists()


def test_start_state_out_writes_a_copy_of_the_model_with_its_start_state(text_file, tmp_path, capsys):
    out = tmp_path / "with-start"
    before = _sha256(SHIPPED / "weights.hdf5")
    argv = ["start-state", TINY_REFERENCE, "--text", text_file, "--rows", "4", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    assert f"wrote {out}: a copy of {SHIPPED}" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in SHIPPED.iterdir())
    assert (out / "options.json").read_bytes() == (SHIPPED / "options.json").read_bytes()
    sentences = [line.split() for line in open(text_file, encoding="utf-8")]
    with torch.no_grad():
        expected = estimate_start_state(
            BiLM.load(SHIPPED / "options.json", SHIPPED / "weights.hdf5"), sentences, rows=4
        )
    copy = BiLM.load(out / "options.json", out / "weights.hdf5")
    assert torch.equal(copy.start_state.h, expected.h) and torch.equal(copy.start_state.c, expected.c)
    assert _sha256(SHIPPED / "weights.hdf5") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt", "with-start"]  # no partial folder left
    assert main(argv) == 2  # never over a folder that has files
    assert (
        capsys.readouterr().err.strip()
        == f"elmokit: error: {out} exists and is not an empty folder; give a new folder"
    )


def test_start_state_write_in_a_folder_of_ones_own_keeps_everything_else(text_file, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(SHIPPED, model)
    with h5py.File(model / "weights.hdf5", "a") as f:
        f.create_dataset("notes/extra", data=np.arange(3))
    names_before = set()
    with h5py.File(model / "weights.hdf5") as f:
        f.visit(names_before.add)
    assert main(["start-state", str(model), "--text", text_file, "--rows", "4", "--write", "--quiet"]) == 0
    names_after = set()
    with h5py.File(model / "weights.hdf5") as f, h5py.File(SHIPPED / "weights.hdf5") as shipped:
        f.visit(names_after.add)
        for name in names_before - {"notes", "notes/extra"}:
            if isinstance(f[name], h5py.Dataset):
                np.testing.assert_array_equal(f[name][...], shipped[name][...])
        np.testing.assert_array_equal(f["notes/extra"][...], np.arange(3))
    assert names_after == names_before | {"start_state", "start_state/h", "start_state/c"}
    assert BiLM.load(model / "options.json", model / "weights.hdf5").start_state is not None


def test_start_state_shows_its_progress(text_file, capsys):
    assert main(["start-state", TINY_REFERENCE, "--text", text_file, "--rows", "4"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"start state: 100%\|.*\| 80/80 ", err), err


def test_evaluate_accepts_checkpoint_and_shows_a_total(tmp_path, capsys):
    words = [f"w{i}" for i in range(40)]
    folder = _lm_folder(tmp_path / "lm", words)
    rng = np.random.default_rng(0)
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("\n".join(" ".join(rng.choice(words, 6)) for _ in range(60)) + "\n")
    for checkpoint in ("latest", "best"):
        argv = ["evaluate", str(folder), "--heldout", str(heldout), "--batch-size", "4"]
        assert main([*argv, "--checkpoint", checkpoint]) == 0
        captured = capsys.readouterr()
        assert "perplexity forward" in captured.out
        assert re.search(r"100%\|.*\| (\d+)/\1 ", captured.err), captured.err
    tokens = evaluate_perplexity(*_load(folder), str(heldout), batch_size=4).tokens
    estimate = _positions(str(heldout))
    assert estimate == 60 * 7 and tokens <= estimate <= tokens + 4 * 20  # at most one dropped batch


def test_read_sentences_splits_the_non_empty_lines_of_a_glob_up_to_a_limit(tmp_path):
    (tmp_path / "a.txt").write_text("one two\n\n  \nthree  four five\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("six\nseven eight\n", encoding="utf-8")
    pattern = str(tmp_path / "*.txt")
    assert read_sentences(pattern) == [["one", "two"], ["three", "four", "five"], ["six"], ["seven", "eight"]]
    assert read_sentences(pattern, 3) == [["one", "two"], ["three", "four", "five"], ["six"]]
    with pytest.raises(FileNotFoundError, match="no files match"):
        read_sentences(str(tmp_path / "*.none"))


def test_compare_start_modes_scores_the_stream_and_each_sentence_from_both_starts(tmp_path):
    """What `elmokit start-state --heldout` prints: the stream as evaluate's, and each sentence
    alone from zero states and from the start state, as sentence_losses' mean losses."""
    words = [f"w{i}" for i in range(40)]
    model, _ = _load(_lm_folder(tmp_path / "lm", words))
    rng = np.random.default_rng(1)
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("\n".join(" ".join(rng.choice(words, 5)) for _ in range(30)) + "\n")
    sentences = read_sentences(str(heldout))
    start = estimate_start_state(model.bilm, sentences, rows=4)
    modes = compare_start_modes(model, str(heldout), start, batch_size=4)
    assert modes.stream == evaluate_perplexity(model, model.vocab, str(heldout), batch_size=4)
    for alone, state in ((modes.zero, None), (modes.warm, start)):
        forward, backward, n = sentence_losses(model, model.vocab, sentences, state)
        expected = (math.exp(forward), math.exp(backward), math.exp(0.5 * (forward + backward)))
        assert (alone.forward, alone.backward, alone.average) == pytest.approx(expected, rel=1e-12)
        assert alone.tokens == n == 30 * 6  # 5 words and a boundary per sentence, each direction
    assert abs(modes.warm.average - modes.zero.average) > 1e-3  # the start state changes the figures


def _load(folder):
    from elmokit import LanguageModel

    model = LanguageModel.from_pretrained(folder, device="cpu")
    return model, model.vocab


def test_evaluate_reuses_its_logits_buffer(tmp_path):
    """The full softmax over a 20,000-token vocabulary computes (512, 20000) logits per chunk;
    a fresh buffer per chunk cost a page fault per 4 KB of it (20M minor faults on the shipped
    model's held-out sets). Now one scratch buffer serves every chunk."""
    words = [f"w{i}" for i in range(19997)]
    model, vocab = _load(_lm_folder(tmp_path / "lm", words))
    rng = np.random.default_rng(0)
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("\n".join(" ".join(rng.choice(words[:500], 20)) for _ in range(400)) + "\n")
    evaluate_perplexity(model, vocab, str(heldout), batch_size=64)  # warm up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    result = evaluate_perplexity(model, vocab, str(heldout), batch_size=64)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    chunk_pages = 512 * len(vocab) * 4 // 4096  # one (512, V) float32 buffer
    chunks = 2 * -(-result.tokens // 512)  # both directions
    assert chunks >= 20
    assert faults < 4 * chunk_pages, (faults, chunk_pages, chunks)  # was about 2 * chunks * chunk_pages


def test_export_notes_a_missing_start_state_and_warm_mode_warns(tmp_path, capsys):
    folder = _lm_folder(tmp_path / "lm", ["a", "b"])
    assert main(["export", str(folder), str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err.strip() == (
        f"elmokit: note: {tmp_path / 'out'} has no start state, so warm mode (the default) starts every "
        f"sentence from zero states; add one with: elmokit start-state {tmp_path / 'out'} --text FILES --write"
    )
    assert not has_start_state(tmp_path / "out" / "weights.hdf5")
    with pytest.warns(
        UserWarning, match=r"the model has no start state, so warm mode starts every sentence from zero"
    ):
        Embedder(TINY_REFERENCE, mode="warm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Embedder(TINY_REFERENCE)  # the default: no warning (documented: zeros without a start state)
        Embedder(TINY_REFERENCE, mode="zero")


def test_cli_warns_in_one_line_when_warm_mode_has_no_start_state(text_file, tmp_path, capsys):
    argv = ["embed", text_file, str(tmp_path / "e.hdf5"), "--model", TINY_REFERENCE, "--quiet"]
    assert main(argv) == 0
    assert capsys.readouterr().err.splitlines() == [
        "elmokit: warning: the model has no start state, so warm mode starts every sentence from zero "
        "states (the same as mode 'zero'); estimate one with: elmokit start-state MODEL --text FILES --out DIR"
    ]
    assert main([*argv[:2], str(tmp_path / "z.hdf5"), *argv[3:], "--mode", "zero"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["tokens", text_file, str(tmp_path / "t.hdf5"), "--model", TINY_REFERENCE]) == 0
    assert "warning" not in capsys.readouterr().err  # token vectors do not use the LSTM states
