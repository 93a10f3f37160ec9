"""elmokit.compat.simple_elmo against simple_elmo 0.9.2's algorithm.

simple_elmo needs TensorFlow 1-style graphs, which cannot run here, so the expected numbers are
built in this file from its code (elmo_helpers.py, elmo.py, model.py, data.py of the 0.9.2
wheel, read line by line) applied to bilm-tf's biLM: ``tests/reference.py`` (a float64
reimplementation of bilm-tf, one sentence from zero states) where states start from zeros, and
elmokit's AllenNLP-compatible stateful biLM (tested exact to bilm-tf's stateful outputs) where
simple_elmo's warm-up carries them."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmokit.compat import (
    SimpleElmoConflictError,
    install_simple_elmo_module,
    uninstall_simple_elmo_module,
)
from elmokit.compat.allennlp import ElmoEmbedder
from elmokit.compat.simple_elmo import ElmoModel

from . import reference
from .conftest import TINY

TEXTS = [
    ["The", "cat", "sat", "on", "the", "mat", "."],
    ["A", "dog", "barked"],
    ["Ein", "Hund", "bellte", "laut"],
    ["naïve", "café"],
    ["Hi"],
]
PAD = "\0padding"  # stands for an all-padding token (char ids all 0) in the reference


@pytest.fixture(scope="module")
def nlpl_zip(tmp_path_factory) -> Path:
    """The tiny model as NLPL publishes models: a zip of model.hdf5, options.json, vocab.txt."""
    path = tmp_path_factory.mktemp("nlpl") / "209.zip"
    vocab = "<S>\n</S>\n<UNK>\nthe\ncat\n"
    with zipfile.ZipFile(path, "w") as archive:
        archive.write(TINY / "lm_weights.hdf5", "model.hdf5")
        archive.write(TINY / "options.json", "options.json")
        archive.writestr("vocab.txt", vocab)
    return path


@pytest.fixture(scope="module")
def expected_layers() -> list[np.ndarray]:
    """bilm-tf's layers (3, n, 32) of each text from zero states, float64 (tests/reference.py)."""
    options = json.loads((TINY / "options.json").read_text())
    return [reference.reference_layers(str(TINY / "lm_weights.hdf5"), options, text) for text in TEXTS]


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def padding_vector(monkeypatch_module) -> np.ndarray:
    """bilm-tf's token layer at a padding position: its char CNN of all-zero ids (the char
    embedding's row 0 is zeros), duplicated for both directions."""
    options = json.loads((TINY / "options.json").read_text())
    original = reference.char_ids
    monkeypatch_module.setattr(
        reference, "char_ids", lambda t, m: np.zeros(m, dtype=np.int64) if t == PAD else original(t, m)
    )
    with h5py.File(TINY / "lm_weights.hdf5", "r") as f:
        vector = reference.token_vector(f, options, PAD)
    return np.concatenate([vector, vector])


def _padded(layers: list[np.ndarray], padding: np.ndarray, width: int) -> np.ndarray:
    """simple_elmo's (batch, 3, width, 32): each text's layers, then bilm-tf's padding vectors."""
    out = np.zeros((len(layers), 3, width, 32))
    for i, layer in enumerate(layers):
        n = layer.shape[1]
        out[i, :, :n] = layer
        out[i, 0, n:] = padding
    return out


def _weighted(all_layers: np.ndarray, layers: str) -> np.ndarray:
    return {"all": all_layers, "top": all_layers[:, -1], "average": all_layers.mean(axis=1)}[layers]


def _simple_elmo_average(batch: np.ndarray, layers: str) -> np.ndarray:
    """get_elmo_vector_average's arithmetic on one batch's weighted_op, as simple_elmo writes it."""
    if layers == "all":
        batch = batch.reshape(batch.shape[0], batch.shape[2], 3, 32)
    out = []
    for sentence in batch:
        mean = sentence.sum(axis=0) / sentence.shape[0]
        out.append(mean / np.linalg.norm(mean))
    return np.stack(out)


@pytest.mark.parametrize("layers", ["average", "top", "all"])
def test_vectors_and_averages_match_bilm_tf_from_zero_states(
    nlpl_zip, expected_layers, padding_vector, layers
):
    model = ElmoModel()
    assert model.load(str(nlpl_zip), max_batch_size=8) == "The model is now loaded."
    assert (model.vector_size, model.n_layers, model.batch_size, model.max_chars) == (32, 3, 8, 50)
    batch = _weighted(_padded(expected_layers, padding_vector, 7), layers)  # one batch of 5
    vectors = model.get_elmo_vectors(TEXTS, warmup=False, layers=layers)
    assert vectors.dtype == np.float64
    assert vectors.shape == ((5, 3, 7, 32) if layers == "all" else (5, 7, 32))
    np.testing.assert_allclose(vectors, batch, atol=2e-5)
    average = model.get_elmo_vector_average(TEXTS, warmup=False, layers=layers)
    assert average.dtype == np.float64 and average.shape == ((5, 3, 32) if layers == "all" else (5, 32))
    np.testing.assert_allclose(average, _simple_elmo_average(batch, layers), atol=2e-5)
    norms = np.linalg.norm(average.reshape(5, -1), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-6)  # simple_elmo's unit length


def test_padding_positions_hold_bilm_tfs_padding_vectors_and_enter_the_average(nlpl_zip, padding_vector):
    """A short text in a batch with a longer one: its rows past its end are not zeros (the token
    layer's padding vector / 3), and its average includes them, as simple_elmo's does."""
    model = ElmoModel()
    model.load(str(nlpl_zip), max_batch_size=8)
    vectors = model.get_elmo_vectors([TEXTS[4], TEXTS[0]], warmup=False)
    np.testing.assert_allclose(vectors[0, 1:], np.tile(padding_vector / 3, (6, 1)), atol=2e-6)
    alone = model.get_elmo_vector_average([TEXTS[4]], warmup=False)[0]
    beside = model.get_elmo_vector_average([TEXTS[4], TEXTS[0]], warmup=False)[0]
    assert np.abs(alone - beside).max() > 0.01


def test_warmup_runs_every_batch_once_with_states_carried(nlpl_zip, padding_vector):
    """warmup=True: all batches once, thrown away, then the returned pass, in one stateful run
    (row r of a batch continues row r of the previous batch); each call starts from zeros."""
    model = ElmoModel()
    model.load(str(nlpl_zip), max_batch_size=2)
    stateful = ElmoEmbedder(TINY / "options.json", TINY / "lm_weights.hdf5")  # bilm-tf's carrying
    batches = [TEXTS[0:2], TEXTS[2:4], TEXTS[4:5]]
    for batch in batches:  # the warm-up pass
        stateful.embed_batch(batch)
    expected = np.zeros((5, 7, 32))
    for b, batch in enumerate(batches):
        layers = [array.astype(np.float64) for array in stateful.embed_batch(batch)]
        width = max(len(t) for t in batch)
        expected[2 * b : 2 * b + len(batch), :width] = _weighted(
            _padded(layers, padding_vector, width), "average"
        )
    vectors = model.get_elmo_vectors(TEXTS)  # warmup=True by default
    np.testing.assert_allclose(vectors, expected, atol=2e-5)
    np.testing.assert_array_equal(model.get_elmo_vectors(TEXTS), vectors)  # a new "session": zeros again
    assert np.abs(model.get_elmo_vectors(TEXTS, warmup=False) - vectors).max() > 0.01
    averages = model.get_elmo_vector_average(TEXTS)
    for b, batch in enumerate(batches):
        rows = slice(2 * b, 2 * b + len(batch))
        width = max(len(t) for t in batch)
        np.testing.assert_allclose(
            averages[rows], _simple_elmo_average(expected[rows, :width], "average"), atol=2e-5
        )


def test_vocabulary_words_cached_as_batcher_caches_them(tmp_path, nlpl_zip):
    """bilm-tf's Batcher: with no <S> / </S> among the first ``limit`` vocabulary words, the last
    cached word is read as a sentence boundary (simple_elmo's quirk, kept)."""
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(TINY / "options.json", folder / "options.json")
    shutil.copy(TINY / "lm_weights.hdf5", folder / "model.hdf5")
    (folder / "vocab.txt").write_text("<UNK>\ncat\ndog\n<S>\n</S>\n", encoding="utf-8")
    quirky, plain = ElmoModel(), ElmoModel()
    quirky.load(str(folder), limit=2)
    plain.load(str(nlpl_zip))
    as_boundary = quirky.get_elmo_vectors([["cat"]], warmup=False)
    np.testing.assert_array_equal(as_boundary, plain.get_elmo_vectors([["</S>"]], warmup=False))
    assert np.abs(as_boundary - plain.get_elmo_vectors([["cat"]], warmup=False)).max() > 0.01
    quirky.load(str(folder), limit=None)  # all words cached: <S> and </S> found, "cat" is a word
    np.testing.assert_array_equal(
        quirky.get_elmo_vectors([["cat"]], warmup=False), plain.get_elmo_vectors([["cat"]], warmup=False)
    )


def test_errors_are_one_line(tmp_path, nlpl_zip):
    model = ElmoModel()
    with pytest.raises(ValueError, match=r"no model loaded: call load\(directory\) first"):
        model.get_elmo_vectors([["a"]])
    with pytest.raises(FileNotFoundError, match="nothing.zip"):
        model.load(str(tmp_path / "nothing.zip"))
    model.load(str(nlpl_zip))
    with pytest.raises(ValueError, match="layers must be one of average, top, all, got 'middle'"):
        model.get_elmo_vectors([["a"]], layers="middle")
    with pytest.raises(ValueError, match="session= takes a TensorFlow session"):
        model.get_elmo_vector_average([["a"]], session=object())
    with pytest.raises(ValueError, match=r"load\(full=True\) reads TensorFlow checkpoints"):
        model.load(str(nlpl_zip), full=True)
    with pytest.raises(NotImplementedError, match="get_elmo_substitutes needs simple_elmo's TensorFlow"):
        model.get_elmo_substitutes([["a"]])
    options = json.loads((TINY / "options.json").read_text())
    options["char_cnn"]["n_characters"] = 261
    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "options.json").write_text(json.dumps(options))
    shutil.copy(TINY / "lm_weights.hdf5", folder / "model.hdf5")
    with pytest.raises(ValueError, match="invalid number of characters: 261; set n_characters to 262"):
        model.load(str(folder))


# -- import simple_elmo, unchanged ---------------------------------------------------------------
def test_simple_elmo_code_runs_unchanged(nlpl_zip):
    """simple_elmo's README example, as users write it, after one opt-in call."""
    install_simple_elmo_module()
    try:
        import simple_elmo.elmo_helpers
        from simple_elmo import ElmoModel as FromSimpleElmo

        assert FromSimpleElmo is ElmoModel and simple_elmo.elmo_helpers.ElmoModel is ElmoModel
        assert sys.modules["simple_elmo"].__spec__.origin is None, "no simple_elmo file on disk"
        model = FromSimpleElmo()
        model.load(str(nlpl_zip))
        sentences = [["this", "is", "a", "test"], ["one", "more"]]
        elmo_vectors = model.get_elmo_vectors(sentences, layers="average")
        sentence_vectors = model.get_elmo_vector_average(sentences)
        assert elmo_vectors.shape == (2, 4, 32) and sentence_vectors.shape == (2, 32)
        with pytest.raises(ModuleNotFoundError, match=r"No module named 'simple_elmo.model'"):
            importlib.import_module("simple_elmo.model")
        install_simple_elmo_module()  # a second call changes nothing
        assert sum(getattr(f, "root", None) == "simple_elmo" for f in sys.meta_path) == 1
    finally:
        uninstall_simple_elmo_module()
    assert not any(n == "simple_elmo" or n.startswith("simple_elmo.") for n in sys.modules)
    assert importlib.util.find_spec("simple_elmo") is None


def test_a_real_simple_elmo_is_never_shadowed(tmp_path, monkeypatch):
    (tmp_path / "simple_elmo").mkdir()
    (tmp_path / "simple_elmo" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SimpleElmoConflictError, match=r"a real simple_elmo is importable \(.*simple_elmo"):
        install_simple_elmo_module()
    assert not any(getattr(f, "root", None) == "simple_elmo" for f in sys.meta_path)


def test_model_on_the_gpu_gives_the_cpu_numbers(nlpl_zip):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cpu, gpu = ElmoModel(), ElmoModel()
    cpu.load(str(nlpl_zip))
    gpu.load(str(nlpl_zip), device="cuda")
    np.testing.assert_allclose(gpu.get_elmo_vectors(TEXTS), cpu.get_elmo_vectors(TEXTS), atol=1e-4)
