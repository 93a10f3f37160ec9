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

from .. import reference
from ..conftest import TINY

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


def test_warmup_runs_the_first_batch_once_with_states_carried(nlpl_zip, padding_vector):
    """warmup=True: the first batch once, thrown away (simple_elmo 0.9.2's warmup loop ends in
    `break`), then the returned pass, in one stateful run (row r of a batch continues row r of
    the previous batch); each call starts from zeros."""
    model = ElmoModel()
    model.load(str(nlpl_zip), max_batch_size=2)
    stateful = ElmoEmbedder(TINY / "options.json", TINY / "lm_weights.hdf5")  # bilm-tf's carrying
    batches = [TEXTS[0:2], TEXTS[2:4], TEXTS[4:5]]
    stateful.embed_batch(batches[0])  # the warm-up: the first batch only
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
    with pytest.raises(FileNotFoundError, match=r"^this model ships no softmax.hdf5"):
        model.load(str(nlpl_zip), full=True)
    with pytest.raises(
        ValueError, match=r"get_elmo_substitutes needs the language model: load the model with full=True"
    ):
        model.get_elmo_substitutes(["a"] * 40)
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


# -- get_elmo_substitutes: the language model, as simple_elmo 0.9.2 runs it -----------------------
RAW = [
    "The cat sat on the mat .",
    "A dog barked",
    "the cat",
    "Ein Hund bellte laut",
    "",
    "the mat sat .",
    "dog",
]


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory) -> Path:
    """The tiny biLM with a vocabulary (<S> </S> <UNK> and some of the words: others are
    outside it) and a random softmax: what load(full=True) reads."""
    from elmokit.lm.softmax import Softmax
    from elmokit.model.weights import save_softmax

    folder = tmp_path_factory.mktemp("simple-elmo-lm")
    shutil.copy(TINY / "options.json", folder / "options.json")
    shutil.copy(TINY / "lm_weights.hdf5", folder / "model.hdf5")
    words = ["<S>", "</S>", "<UNK>", "the", "cat", ".", "sat", "on", "mat", "A", "dog", "Hund", "laut"]
    (folder / "vocab.txt").write_text("".join(w + "\n" for w in words), encoding="utf-8")
    generator = torch.Generator().manual_seed(3)
    softmax = Softmax(len(words), 16)
    with torch.no_grad():
        softmax.weight.normal_(0.0, 1.0, generator=generator)
        softmax.bias.normal_(0.0, 1.0, generator=generator)
    save_softmax(softmax, folder / "softmax.hdf5")
    return folder


def _simple_elmo_substitutes(folder: Path, data: list[str], batch_size: int, topn: int, nodelimiters: bool):
    """simple_elmo 0.9.2's get_elmo_substitutes, transliterated: pack_encoded (lm_encode and
    bilm-tf's _get_batch with num_steps=1), the LM run from the initial zero state at every step
    (tests/reference.py in float64: char CNN, one LSTM step per layer, then softmax/W, softmax/b),
    argpartition, rounding, and the storage of each row's predictions until its sentence ends."""
    options = json.loads((folder / "options.json").read_text())
    id_to_word = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    word_to_id = {w: i for i, w in enumerate(id_to_word)}
    bos, eos, unk = word_to_id["<S>"], word_to_id["</S>"], word_to_id["<UNK>"]

    def lm_encode(reverse: bool):
        for sentence in data:
            words = sentence.split()[::-1] if reverse else sentence.split()
            ids = [word_to_id.get(w, unk) for w in words]
            ends = ([eos], [bos]) if reverse else ([bos], [eos])
            yield (
                ends[0] + ids + ends[1],
                ["</S>" if reverse else "<S>", *words, "<S>" if reverse else "</S>"],
            )

    def get_batch(generator):
        cur_stream = [None] * batch_size
        while True:
            inputs, targets, chars = [0] * batch_size, [0] * batch_size, [""] * batch_size
            no_more_data = False
            for i in range(batch_size):
                if cur_stream[i] is None or len(cur_stream[i][0]) <= 1:
                    try:
                        cur_stream[i] = list(next(generator))
                    except StopIteration:
                        no_more_data = True
                        continue
                inputs[i], chars[i], targets[i] = (
                    cur_stream[i][0][0],
                    cur_stream[i][1][0],
                    cur_stream[i][0][1],
                )
                cur_stream[i] = [cur_stream[i][0][1:], cur_stream[i][1][1:]]
            if no_more_data:
                break
            yield {"tokens_characters": chars, "next_token_id": targets}

    with h5py.File(folder / "model.hdf5", "r") as f, h5py.File(folder / "softmax.hdf5", "r") as s:
        weight, bias = np.asarray(s["softmax/W"], np.float64), np.asarray(s["softmax/b"], np.float64)

        def scores(tokens: list[str], direction: int) -> np.ndarray:
            rows = []
            for token in tokens:
                x = reference.token_vector(f, options, token)
                rows.append(weight @ reference.run_direction(f, options, direction, [x])[-1][0] + bias)
            return np.stack(rows).astype(np.float32)

        word_predictions, storage = [], [([], []) for _ in range(batch_size)]
        for x, xr in zip(get_batch(lm_encode(False)), get_batch(lm_encode(True))):
            forward_preds, backward_preds = (
                scores(x["tokens_characters"], 0),
                scores(xr["tokens_characters"], 1),
            )
            if nodelimiters:
                forward_preds[:, [0, 1]] = 0
                backward_preds[:, [0, 1]] = 0
            forward_ind = np.argpartition(forward_preds, -topn)[:, -topn:]
            backward_ind = np.argpartition(backward_preds, -topn)[:, -topn:]
            forward_probs = np.round(np.take_along_axis(forward_preds, forward_ind, 1).astype(float), 4)
            backward_probs = np.round(np.take_along_axis(backward_preds, backward_ind, 1).astype(float), 4)
            next_words = [id_to_word[t] for t in x["next_token_id"]]
            next_back_words = [id_to_word[t] for t in xr["next_token_id"]]
            for nr in range(batch_size):
                if next_words[nr] == "</S>" and next_back_words[nr] == "<S>":
                    forward, backward = storage[nr]
                    word_predictions.append(
                        [
                            {"word": a["word"], "forward": a["rest"], "backward": b["rest"]}
                            for a, b in zip(forward, reversed(backward))
                        ]
                    )
                    storage[nr] = ([], [])
                    continue
                for entries, word, ind, probs in (
                    (storage[nr][0], next_words[nr], forward_ind[nr], forward_probs[nr]),
                    (storage[nr][1], next_back_words[nr], backward_ind[nr], backward_probs[nr]),
                ):
                    rest = {
                        "candidates": ind.tolist(),
                        "candidate_words": [id_to_word[i] for i in ind],
                        "logp": probs.tolist(),
                    }
                    entries.append({"word": word, "rest": rest})
    return word_predictions


def _assert_same_substitutes(found: list, expected: list) -> None:
    assert len(found) == len(expected)
    for sentence, reference_sentence in zip(found, expected):
        assert [w["word"] for w in sentence] == [w["word"] for w in reference_sentence]
        for word, reference_word in zip(sentence, reference_sentence):
            for direction in ("forward", "backward"):
                got, want = word[direction], reference_word[direction]
                assert (
                    got["candidates"] == want["candidates"]
                    and got["candidate_words"] == want["candidate_words"]
                )
                np.testing.assert_allclose(got["logp"], want["logp"], atol=1.01e-4)


@pytest.mark.parametrize(("batch_size", "topn", "nodelimiters"), [(2, 3, True), (3, 2, False), (1, 4, True)])
def test_substitutes_are_simple_elmos_one_step_language_model_predictions(
    lm_folder, batch_size, topn, nodelimiters
):
    model = ElmoModel()
    assert model.load(str(lm_folder), max_batch_size=batch_size, full=True) == "The model is now loaded."
    found = model.get_elmo_substitutes(RAW, topn=topn, nodelimiters=nodelimiters)
    expected = _simple_elmo_substitutes(lm_folder, RAW, batch_size, topn, nodelimiters)
    _assert_same_substitutes(found, expected)
    assert set(found[0][0]) == {"word", "forward", "backward"}
    assert set(found[0][0]["forward"]) == {"candidates", "candidate_words", "logp"}
    assert all(len(w["forward"]["candidates"]) == topn for s in found for w in s)
    # a word outside the vocabulary is named <UNK>, as simple_elmo's vocabulary names it
    assert any(w["word"] == "<UNK>" for s in found for w in s)


def test_substitutes_come_in_the_order_sentences_finish_and_need_full(lm_folder):
    model = ElmoModel()
    model.load(str(lm_folder), max_batch_size=2, full=True)
    found = model.get_elmo_substitutes(["the cat sat on the mat .", "the cat", "dog", "A dog barked"])
    # row 1 finishes "the cat" (3 steps) and "dog" (2 steps) before row 0's seven-word sentence
    # (8 steps); then row 0 finds no sentence left, and "A dog barked", still running, is dropped
    assert [[w["word"] for w in s] for s in found] == [
        ["the", "cat"],
        ["dog"],
        ["the", "cat", "sat", "on", "the", "mat", "."],
    ]
    tokens = model.get_elmo_substitutes(
        [["the", "cat"], ["dog"], ["A"]]
    )  # lists of tokens: an elmokit addition
    assert [[w["word"] for w in s] for s in tokens] == [["dog"], ["the", "cat"]]
    vectors = model.get_elmo_vectors([["the", "cat"]], warmup=False)  # the vectors work after full=True too
    plain = ElmoModel()
    plain.load(str(lm_folder))
    np.testing.assert_array_equal(vectors, plain.get_elmo_vectors([["the", "cat"]], warmup=False))
    with pytest.raises(ValueError, match=r"needs at least max_batch_size \(2\) sentences, got 1"):
        model.get_elmo_substitutes(["the cat"])
    with pytest.raises(ValueError, match=r"get_elmo_substitutes needs the language model"):
        plain.get_elmo_substitutes(RAW)


# -- hostile inputs and the edges of compatibility ------------------------------------------------
def test_a_vocabulary_that_expands_to_gigabytes_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import gzip

    import elmokit.compat.simple_elmo as compat

    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(TINY / "options.json", folder / "options.json")
    shutil.copy(TINY / "lm_weights.hdf5", folder / "model.hdf5")
    with gzip.open(folder / "vocab.txt.gz", "wt", encoding="utf-8") as f:
        f.write("<S>\n</S>\n<UNK>\n")
        for _ in range(2000):
            f.write("x" * 4096 + "\n")  # 8 MiB of text in a small file
    monkeypatch.setattr(compat, "MAX_VOCABULARY_CHARS", 1 << 20)  # the bound, made small
    model = ElmoModel()
    assert model.load(str(folder)) == "The model is now loaded."  # limit=100: the first words only
    with pytest.raises(ValueError, match=r"vocab.txt.gz: more than 1 MiB of text once decompressed"):
        model.load(str(folder), limit=None)
    lines = compat._read_vocabulary(folder / "vocab.txt.gz", limit=2)
    assert lines == ["<S>", "</S>"]


def test_a_tensorflow_checkpoint_folder_is_named_with_its_conversion(tmp_path):
    folder = tmp_path / "tf"
    folder.mkdir()
    shutil.copy(TINY / "options.json", folder / "options.json")
    (folder / "vocab.txt").write_text("<S>\n</S>\n<UNK>\n", encoding="utf-8")
    (folder / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-7"\n', encoding="utf-8")
    for name in ("model.ckpt-7.index", "model.ckpt-7.meta", "model.ckpt-7.data-00000-of-00001"):
        (folder / name).write_bytes(b"")
    for full in (True, False):
        with pytest.raises(ValueError, match=r"holds a TensorFlow checkpoint \(model.ckpt-7\).*dump_weights"):
            ElmoModel().load(str(folder), full=full)
    shutil.copy(TINY / "lm_weights.hdf5", folder / "model.hdf5")  # converted: the vectors load
    assert ElmoModel().load(str(folder)) == "The model is now loaded."
    with pytest.raises(ValueError, match="softmax/W and softmax/b"):  # but not the language model
        ElmoModel().load(str(folder), full=True)


def test_batcher_imports_from_simple_elmo_and_gives_bilm_tf_ids(tmp_path):
    from elmokit.compat.allennlp import batch_to_ids

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<S>\n</S>\n<UNK>\nthe\n", encoding="utf-8")
    install_simple_elmo_module()
    try:
        from simple_elmo import Batcher

        ids = Batcher(str(vocab), 50).batch_sentences([["the", "cat"], ["a"]])
    finally:
        uninstall_simple_elmo_module()
    assert ids.shape == (2, 4, 50) and ids.dtype == np.int64
    theirs = batch_to_ids([["the", "cat"], ["a"]]).numpy()  # AllenNLP's: no <S>, </S>
    np.testing.assert_array_equal(ids[0, 1:3], theirs[0])
    np.testing.assert_array_equal(ids[1, 1], theirs[1, 0])
    assert ids[0, 0, :4].tolist() == [259, 257, 260, 261]  # <S>: begin word, begin sentence, end word
    assert ids[0, 3, :4].tolist() == [259, 258, 260, 261] and ids[1, 2, :4].tolist() == [259, 258, 260, 261]
    assert not ids[1, 3].any()  # padding
