"""elmokit.compat.allennlp against AllenNLP 0.9: the assertions of AllenNLP's own ELMo tests
(tests/modules/elmo_test.py, tests/commands/elmo_test.py) on the same fixture, and the numbers
AllenNLP 0.9.0's own code computed for a fixed sequence of calls (tests/fixtures/allennlp-0.9)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmokit import BiLM
from elmokit.cli import main as cli_main
from elmokit.compat import (
    AllenNLPConflictError,
    install_allennlp_modules,
    resolve_model_file,
    uninstall_allennlp_modules,
)
from elmokit.compat.allennlp import (
    DEFAULT_OPTIONS_FILE,
    ConfigurationError,
    Elmo,
    ElmoEmbedder,
    ElmoTokenEmbedder,
    _ElmoBiLm,
    batch_to_ids,
    remove_sentence_boundaries,
)
from elmokit.hub.entries import OfflineError, entry_dir

from ..conftest import FIXTURES, TINY

REFERENCE = FIXTURES / "allennlp-0.9"
ROOT = Path(__file__).resolve().parents[2]
TWO = [["The", "sentence", "."], ["ELMo", "helps", "disambiguate", "ELMo", "from", "Elmo", "."]]


@pytest.fixture(scope="module")
def reference() -> tuple[dict, dict[str, np.ndarray]]:
    meta = json.loads((REFERENCE / "reference.json").read_text(encoding="utf-8"))
    with np.load(REFERENCE / "reference.npz") as arrays:
        return meta, {k: arrays[k] for k in arrays.files}


def _expected_top_layers() -> list[list[np.ndarray]]:
    """lm_embeddings_k.hdf5: list k, sentence i -> (n, 32) forward ++ backward."""
    out = []
    for k in range(3):
        with h5py.File(TINY / f"lm_embeddings_{k}.hdf5", "r") as f:
            out.append([np.concatenate([f[str(i)][0], f[str(i)][1]], -1) for i in range(10)])
    return out


def _close(actual, expected, atol=1e-5, rtol=0.0) -> None:
    actual = actual.detach().numpy() if torch.is_tensor(actual) else np.asarray(actual)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=rtol)


# -- AllenNLP's tests/modules/elmo_test.py --------------------------------------------------
def test_elmo_bilm_reproduces_bilm_tf_through_10_stateful_batches(tiny_files, tiny_sentences):
    bilm = _ElmoBiLm(*tiny_files)
    expected = _expected_top_layers()
    for i in range(10):
        batch = [tiny_sentences[k][i].split() for k in range(3)]
        out = bilm(batch_to_ids(batch))
        assert len(out["activations"]) == 3 and out["mask"].dtype == torch.long
        top, mask = remove_sentence_boundaries(out["activations"][2], out["mask"])
        lengths = mask.numpy().sum(axis=1)
        assert lengths.tolist() == [len(s) for s in batch]
        for k in range(3):
            np.testing.assert_allclose(top[k, : lengths[k]].numpy(), expected[k][i], atol=1e-6)


def test_embedder_reproduces_bilm_tf_in_linear_order(tiny_files, tiny_sentences):
    expected = _expected_top_layers()
    sentences = [tiny_sentences[k][i].split() for i in range(10) for k in range(3)]
    wanted = [expected[k][i] for i in range(10) for k in range(3)]
    embeddings = list(ElmoEmbedder(*tiny_files).embed_sentences(sentences, 3))
    assert len(embeddings) == 30
    for array, top in zip(embeddings, wanted):
        assert array.dtype == np.float32
        np.testing.assert_array_almost_equal(array[2], top)


def test_elmo_shapes_and_mask(tiny_files):
    elmo = Elmo(*tiny_files, 2, dropout=0.0)
    output = elmo(batch_to_ids(TWO))
    assert set(output) == {"elmo_representations", "mask"}
    assert [list(r.shape) for r in output["elmo_representations"]] == [[2, 7, 32], [2, 7, 32]]
    assert output["mask"].dtype == torch.long and output["mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0], [1] * 7]
    assert not output["elmo_representations"][0][0, 3:].any(), "padding positions are zero"
    assert elmo.get_output_dim() == 32

    kept = Elmo(*tiny_files, 2, dropout=0.0, keep_sentence_boundaries=True)(batch_to_ids(TWO))
    assert [list(r.shape) for r in kept["elmo_representations"]] == [[2, 9, 32], [2, 9, 32]]
    assert list(kept["mask"].shape) == [2, 9] and kept["mask"].sum(1).tolist() == [5, 9]


def test_elmo_4d_input_equals_3d_calls_from_reset_states(tiny_files):
    sentences = [TWO, [["1", "2"], list("1234567")], [["1", "2", "3", "4", "50", "60", "70"], ["The"]]]
    elmo = Elmo(*tiny_files, 2, dropout=0.0)
    ids = [batch_to_ids(batch) for batch in sentences]
    embeddings_4d = elmo(torch.cat([i.unsqueeze(1) for i in ids], dim=1))  # (2, 3, 7, 50)
    assert list(embeddings_4d["mask"].shape) == [2, 3, 7]
    for k, char_ids in enumerate(ids):
        elmo._elmo_lstm._elmo_lstm.reset_states()  # the attribute path AllenNLP's test uses
        embeddings_3d = elmo(char_ids)
        np.testing.assert_array_almost_equal(
            embeddings_4d["elmo_representations"][0][:, k].detach().numpy(),
            embeddings_3d["elmo_representations"][0].detach().numpy(),
        )


def test_elmo_with_module_and_with_an_elmokit_bilm(tiny_files):
    module = _ElmoBiLm(*tiny_files)
    first = Elmo(None, None, 2, dropout=0.0, module=module)(batch_to_ids(TWO))
    assert [list(r.shape) for r in first["elmo_representations"]] == [[2, 7, 32], [2, 7, 32]]

    bilm = BiLM.load(*tiny_files)
    before = {k: v.clone() for k, v in bilm.state_dict().items()}
    elmo = Elmo(None, None, 2, dropout=0.0, module=bilm)
    again = elmo(batch_to_ids(TWO))  # a fresh wrapper starts from zeros, like `module`'s first call
    for a, b in zip(first["elmo_representations"], again["elmo_representations"]):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), atol=1e-6)
    second = elmo(batch_to_ids(TWO))  # the wrapper carries states, the BiLM stays stateless
    assert not torch.allclose(second["elmo_representations"][0], again["elmo_representations"][0], atol=1e-4)
    assert all(torch.equal(v, bilm.state_dict()[k]) for k, v in before.items())
    with pytest.raises(ConfigurationError, match="Don't provide options_file or weight_file with module"):
        Elmo(*tiny_files, 1, module=bilm)


def _words(sentences: list[list[str]]) -> tuple[list[str], torch.Tensor]:
    """A vocabulary as AllenNLP's Vocabulary.from_instances makes it (padding 0, unknown 1) and
    the padded word ids of the sentences."""
    vocab = ["@@PADDING@@", "@@UNKNOWN@@"]
    for word in (w for s in sentences for w in s):
        if word not in vocab:
            vocab.append(word)
    width = max(map(len, sentences))
    return vocab, torch.tensor([[vocab.index(w) for w in s] + [0] * (width - len(s)) for s in sentences])


def test_cached_vocabulary_gives_the_character_results(tiny_files):
    sentences = [["This", "is", "a", "sentence"], ["Here", "'s", "one"], ["Another", "one"]]
    vocab, word_ids = _words(sentences)
    no_cache = _ElmoBiLm(*tiny_files)(batch_to_ids(sentences), batch_to_ids(sentences))
    cached = _ElmoBiLm(*tiny_files, vocab_to_cache=vocab)(batch_to_ids(sentences), word_ids)
    np.testing.assert_array_equal(no_cache["mask"].numpy(), cached["mask"].numpy())
    for a, b in zip(cached["activations"], no_cache["activations"]):
        np.testing.assert_array_almost_equal(a.numpy(), b.numpy(), decimal=6)


def test_words_outside_the_cache_back_off_to_characters(tiny_files):
    vocab, in_vocab = _words([["here", "is"], ["a", "vocab"]])
    oov = [["This", "is", "OOV"], ["so", "is", "this"]]
    cached = _ElmoBiLm(*tiny_files, vocab_to_cache=vocab)
    cached(batch_to_ids([["here", "is"], ["a", "vocab"]]), in_vocab)
    backed_off = cached(batch_to_ids(oov), torch.tensor([[2, 3, 40], [9, 3, 8]]))
    plain = _ElmoBiLm(*tiny_files)
    plain(batch_to_ids([["here", "is"], ["a", "vocab"]]))
    expected = plain(batch_to_ids(oov))
    for a, b in zip(backed_off["activations"], expected["activations"]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)


def test_higher_dimensional_word_input_with_cache(tiny_files):
    sentences = [["This", "is", "a", "sentence"], ["Here", "'s", "one"], ["Another", "one"]]
    vocab, word_ids = _words(sentences)
    char_ids = batch_to_ids(sentences)
    individual = Elmo(*tiny_files, 1, vocab_to_cache=vocab).eval()(char_ids, word_ids)
    expanded = Elmo(*tiny_files, 1, vocab_to_cache=vocab).eval()(
        torch.stack([char_ids] * 4, dim=1), torch.stack([word_ids] * 4, dim=1)
    )
    assert list(expanded["mask"].shape) == [3, 4, 4]
    for split in expanded["elmo_representations"][0].unbind(1):
        np.testing.assert_array_almost_equal(
            split.detach().numpy(), individual["elmo_representations"][0].detach().numpy()
        )


@pytest.mark.parametrize("requires_grad", [True, False])
def test_requires_grad(tiny_files, requires_grad):
    elmo = Elmo(*tiny_files, 1, requires_grad)  # positional, as AllenNLP's signature has it
    char_ids = torch.from_numpy(np.random.default_rng(0).integers(0, 262, (3, 4, 50)))
    elmo(char_ids)["elmo_representations"][0].sum().backward()
    grads = [p.grad for p in elmo._elmo_lstm.parameters()]
    assert len(grads) == 29
    if requires_grad:
        assert all(g is not None for g in grads)
    else:
        assert all(g is None for g in grads)
        assert all(p.grad is not None for p in elmo.scalar_mix_0.scalar_parameters)


def test_scalar_mix_parameters_are_fixed(tiny_files):
    elmo = Elmo(*tiny_files, 1, dropout=0.0, scalar_mix_parameters=[-9e10, 1.0, -9e10])
    mix = elmo.scalar_mix_0
    assert not any(p.requires_grad for p in mix.scalar_parameters) and not mix.gamma.requires_grad
    out = elmo(batch_to_ids(TWO))["elmo_representations"][0]
    bilm_output = _ElmoBiLm(*tiny_files)(batch_to_ids(TWO))  # softmax([-9e10, 1, -9e10]) = layer 1 only
    layer_1, _ = remove_sentence_boundaries(bilm_output["activations"][1], bilm_output["mask"])
    np.testing.assert_allclose(out.detach().numpy(), layer_1.numpy(), atol=1e-6)


def test_empty_sentences_as_allennlp(tiny_files):
    embedder = ElmoEmbedder(*tiny_files)
    empty = embedder.embed_sentence([])
    assert empty.shape == (3, 0, 1024) and empty.dtype == np.float64  # AllenNLP's, whatever the size
    assert embedder.elmo_bilm._elmo_lstm._states is None, "an empty sentence alone runs nothing"
    arrays = list(embedder.embed_sentences(["This is a test".split(), []]))
    assert [a.shape for a in arrays] == [(3, 4, 32), (3, 0, 1024)]
    h, c = embedder.elmo_bilm._elmo_lstm._states
    assert h.shape == (2, 2, 32) and c.shape == (2, 2, 128)
    assert embedder.embed_batch([[], []])[1].shape == (3, 0, 1024)
    assert torch.equal(embedder.elmo_bilm._elmo_lstm._states[0], h), "empty batches keep the states"


def test_carried_states_round_trip_through_allennlps_layout(tiny_files):
    a, b = ElmoEmbedder(*tiny_files), ElmoEmbedder(*tiny_files)
    a.embed_batch(TWO)
    b.elmo_bilm._elmo_lstm._states = tuple(t.clone() for t in a.elmo_bilm._elmo_lstm._states)
    np.testing.assert_array_equal(a.embed_sentence(["again"]), b.embed_sentence(["again"]))
    b.elmo_bilm._elmo_lstm._states = None
    np.testing.assert_array_equal(
        b.embed_sentence(["again"]), ElmoEmbedder(*tiny_files).embed_sentence(["again"])
    )


def test_batch_to_ids_as_allennlp():
    ids = batch_to_ids([["a", ""], []])
    assert ids.shape == (2, 2, 50)
    assert ids[0, 0, :4].tolist() == [259, 98, 260, 261] and ids[0, 1, :3].tolist() == [259, 260, 261]
    assert not ids[1].any()
    assert batch_to_ids(["ab"]).tolist() == batch_to_ids([["a", "b"]]).tolist()  # a str: its characters
    with pytest.raises(ValueError, match="empty batch"):
        batch_to_ids([])


# -- the numbers AllenNLP 0.9.0's own code computed ------------------------------------------
def test_embedder_sequence_matches_allennlp(tiny_files, reference):
    meta, arrays = reference
    embedder = ElmoEmbedder(*tiny_files)
    for k, batch in enumerate(meta["embedder_batches"]):
        for i, array in enumerate(embedder.embed_batch(batch)):
            expected = arrays[f"embedder/{k}/{i}"]
            assert array.dtype == expected.dtype
            _close(array, expected)
    h, c = embedder.elmo_bilm._elmo_lstm._states
    _close(h, arrays["embedder/states_h"])
    _close(c, arrays["embedder/states_c"])


@pytest.mark.parametrize("name", ["dropout_layer_norm", "dropout", "fixed_mix", "boundaries_layer_norm"])
def test_elmo_calls_match_allennlp_with_dropout_and_layer_norm(tiny_files, reference, name):
    meta, arrays = reference
    elmo = Elmo(*tiny_files, 2, **meta["elmo_configs"][name])
    assert elmo.training
    for k, batch in enumerate(meta["elmo_batches"]):
        torch.manual_seed(k)  # the same dropout masks as AllenNLP's run drew
        out = elmo(batch_to_ids(batch))
        np.testing.assert_array_equal(out["mask"].numpy(), arrays[f"elmo/{name}/{k}/mask"])
        for r, representation in enumerate(out["elmo_representations"]):
            _close(representation, arrays[f"elmo/{name}/{k}/{r}"])


def test_4d_and_cached_vocabulary_match_allennlp(tiny_files, reference):
    meta, arrays = reference
    flat = [sentence for group in meta["four_d"] for sentence in group]
    ids = batch_to_ids(flat).view(len(meta["four_d"]), len(meta["four_d"][0]), -1, 50)
    out = Elmo(*tiny_files, 1, dropout=0.0)(ids)
    _close(out["elmo_representations"][0], arrays["four_d/rep"])
    np.testing.assert_array_equal(out["mask"].numpy(), arrays["four_d/mask"])

    vocab, sentences = meta["vocab"], meta["word_sentences"]
    words = torch.tensor([[vocab.index(w) for w in s] + [0] * (4 - len(s)) for s in sentences])
    elmo = Elmo(*tiny_files, 1, dropout=0.0, vocab_to_cache=vocab)
    for k, word_ids in enumerate([words, torch.tensor([[2, 3, 99, 0], [6, 7, 8, 0], [9, 8, 0, 0]])]):
        out = elmo(batch_to_ids(sentences), word_ids)
        _close(out["elmo_representations"][0], arrays[f"cached/{k}/rep"])
        np.testing.assert_array_equal(out["mask"].numpy(), arrays[f"cached/{k}/mask"])


def test_gradients_match_allennlp(tiny_files, tiny_sentences, reference):
    meta, arrays = reference
    batch = meta["elmo_batches"][0]
    elmo = Elmo(*tiny_files, 1, True, dropout=0.0, do_layer_norm=True)
    representation = elmo(batch_to_ids(batch))["elmo_representations"][0]
    torch.manual_seed(0)
    (representation * torch.randn(representation.shape)).sum().backward()
    mix, bilm = elmo.scalar_mix_0, elmo._elmo_lstm.bilm
    pairs = [  # gradients are sums over every output element: 1e-5 absolute and relative
        (torch.cat([p.grad for p in mix.scalar_parameters]), "scalar_parameters"),  # as AllenNLP's test
        (mix.gamma.grad, "gamma"),
        (bilm.token_encoder.projection.weight.grad, "projection_weight"),
        (bilm.token_encoder.projection.bias.grad, "projection_bias"),
        (bilm.token_encoder.char_cnn.convolutions[2].weight.grad, "conv_2_weight"),
        (bilm.lstm.layers[0].weight_projection.grad[0].t(), "forward_projection_0"),
        (bilm.lstm.layers[1].weight_projection.grad[1].t(), "backward_projection_1"),
    ]
    for grad, name in pairs:
        _close(grad, arrays[f"grad/{name}"], atol=1e-5, rtol=1e-5)


def test_long_sequence_matches_allennlp_call_after_call(tiny_files, reference):
    meta, arrays = reference
    embedder = ElmoEmbedder(*tiny_files)
    for k in range(2):  # the second call starts from the state the first one reached
        array = embedder.embed_sentence(list(meta["protein"]))
        assert array.shape == (3, 1500, 32)
        _close(array[:, meta["protein_positions"]], arrays[f"protein/{k}"])


@pytest.mark.parametrize("run", ["all", "top", "average", "forget", "keys"])
def test_embed_file_writes_what_allennlp_writes(tiny_files, reference, tmp_path, run):
    meta, arrays = reference
    spec = meta["file_runs"][run]
    source = tmp_path / "sentences.txt"
    source.write_text("\n".join(spec["lines"]) + "\n", encoding="utf-8")
    output = tmp_path / "out.hdf5"
    with open(source, encoding="utf-8") as handle:  # AllenNLP takes an open file
        ElmoEmbedder(*tiny_files).embed_file(handle, output, **spec["kwargs"])
    with h5py.File(output, "r") as f:
        names: list[str] = []
        f.visit(lambda n: names.append(n) if isinstance(f[n], h5py.Dataset) else None)
        assert sorted(names) == spec["datasets"]
        for name in names:
            if name == "sentence_to_index":
                assert f[name].shape == (1,) and h5py.check_string_dtype(f[name].dtype) is not None
                assert f[name][0].decode() == spec["sentence_to_index"]
            else:
                assert str(f[name].dtype) == spec["dtypes"][name]
                _close(f[name][...], arrays[f"file/{run}/{name}"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.hdf5", "sentences.txt"], (
        "no temporary file left"
    )


# -- AllenNLP's tests/commands/elmo_test.py, through `elmokit elmo` --------------------------
SENTENCES = [
    "Michael went to the store to buy some eggs .",
    "Joel rolled down the street on his skateboard .",
    "test / this is a first sentence",
    "Take a look , then , at Tuesday 's elections in New York City , New Jersey and Virginia :",
]


def _elmo_command(tmp_path: Path, lines: list[str], *flags: str, files=None) -> tuple[int, Path]:
    source, output = tmp_path / "sentences.txt", tmp_path / "output.hdf5"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    options, weights = files or (TINY / "options.json", TINY / "lm_weights.hdf5")
    code = cli_main(
        [
            "elmo",
            str(source),
            str(output),
            *flags,
            "--options-file",
            str(options),
            "--weight-file",
            str(weights),
        ]
    )
    return code, output


@pytest.mark.parametrize("flag", ["--all", "--top", "--average"])
def test_command_single_sentence(tmp_path, tiny_files, flag):
    code, output = _elmo_command(tmp_path, SENTENCES[:1], flag)
    assert code == 0
    expected = ElmoEmbedder(*tiny_files).embed_sentence(SENTENCES[0].split())
    expected = {"--all": expected, "--top": expected[2], "--average": expected.sum(0) / 3}[flag]
    with h5py.File(output, "r") as f:
        assert set(f.keys()) == {"0", "sentence_to_index"}
        np.testing.assert_allclose(f["0"][...], expected, rtol=1e-4)
        assert json.loads(f["sentence_to_index"][0]) == {SENTENCES[0]: "0"}


def test_command_batches_keys_and_forget(tmp_path):
    code, output = _elmo_command(tmp_path, SENTENCES, "--all", "--batch-size", "3")
    assert code == 0
    with h5py.File(output, "r") as f:
        assert set(f.keys()) == {"0", "1", "2", "3", "sentence_to_index"}
        assert [f[str(i)].shape for i in range(4)] == [(3, len(s.split()), 32) for s in SENTENCES]
        assert json.loads(f["sentence_to_index"][0]) == {s: str(i) for i, s in enumerate(SENTENCES)}
    code, output = _elmo_command(tmp_path, SENTENCES[:2], "--all", "--use-sentence-keys")
    with h5py.File(output, "r") as f:
        assert code == 0 and set(f.keys()) == set(SENTENCES[:2])
        assert all(f[s].shape == (3, len(s.split()), 32) for s in SENTENCES[:2])
    code, output = _elmo_command(tmp_path, SENTENCES, "--all", "--forget-sentences")
    with h5py.File(output, "r") as f:
        assert code == 0 and set(f.keys()) == {"0", "1", "2", "3"}
    code, output = _elmo_command(tmp_path, SENTENCES[:1] * 2, "--all")
    with h5py.File(output, "r") as f:
        assert code == 0 and set(f.keys()) == {"0", "1", "sentence_to_index"}
        assert json.loads(f["sentence_to_index"][0]) == {SENTENCES[0]: "1"}


def test_command_errors_are_one_line_and_leave_no_file(tmp_path, capsys):
    code, output = _elmo_command(tmp_path, ["A", "", "", "B"], "--all")
    err = capsys.readouterr().err
    assert code == 2 and not output.exists()
    assert (
        err.strip()
        == "elmokit: error: Your input file contains empty lines at indexes [1, 2]. Please remove them."
    )
    with pytest.raises(ConfigurationError, match="empty lines"):
        ElmoEmbedder(*(TINY / "options.json", TINY / "lm_weights.hdf5")).embed_file(
            str(tmp_path / "sentences.txt"), tmp_path / "x.hdf5"
        )

    output.write_bytes(b"old")
    code, _ = _elmo_command(tmp_path, ["same", "same"], "--all", "--use-sentence-keys")
    warning, error = capsys.readouterr().err.splitlines()  # AllenNLP's warning, then the error
    assert warning == (
        "elmokit: warning: Using sentences as keys can fail if sentences contain forward slashes or "
        "colons. Use with caution."
    )
    assert code == 2 and error.startswith("elmokit: error: ") and "Key already exists" in error
    assert output.read_bytes() == b"old", "a failed run leaves the old file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["output.hdf5", "sentences.txt"]

    source = tmp_path / "sentences.txt"
    assert cli_main(["elmo", str(source), str(output), "--all"]) == 2  # AllenNLP's default: a URL
    err = capsys.readouterr().err.strip()  # the tests run with ELMOKIT_OFFLINE=1 (conftest.py)
    assert err == (
        f"elmokit: error: {DEFAULT_OPTIONS_FILE} is not in the download cache and ELMOKIT_OFFLINE=1 "
        f"forbids downloading it: unset ELMOKIT_OFFLINE to download it, or run `elmokit download "
        f"{DEFAULT_OPTIONS_FILE}` on a machine with a network and copy the cache folder "
        f"{entry_dir(DEFAULT_OPTIONS_FILE)} to the same place here"
    )
    assert (
        cli_main(
            [
                "elmo",
                str(tmp_path / "missing.txt"),
                str(output),
                "--top",
                "--options-file",
                str(TINY / "options.json"),
                "--weight-file",
                str(TINY / "lm_weights.hdf5"),
            ]
        )
        == 2
    )
    assert "input file not found" in capsys.readouterr().err


def test_resolve_model_file(tmp_path):
    missing = rf"^{re.escape(DEFAULT_OPTIONS_FILE)} is not in the download cache"
    with pytest.raises(OfflineError, match=missing):
        resolve_model_file(DEFAULT_OPTIONS_FILE, "options file")  # ELMOKIT_OFFLINE=1 (conftest.py)
    with pytest.raises(FileNotFoundError, match="weight file not found"):
        resolve_model_file(tmp_path / "nope.hdf5", "weight file")
    with pytest.raises(ValueError, match="not a file"):
        resolve_model_file(tmp_path)
    assert resolve_model_file(str(TINY / "options.json")) == TINY / "options.json"
    with pytest.raises(OfflineError, match="ELMOKIT_OFFLINE=1 forbids downloading it"):
        ElmoEmbedder()  # AllenNLP's default model is a URL


# -- the allennlp modules, for code that cannot change its imports ---------------------------
@pytest.fixture()
def allennlp_modules():
    install_allennlp_modules()
    try:
        yield
    finally:
        uninstall_allennlp_modules()


def test_allennlp_module_paths_resolve_to_elmokit(allennlp_modules, tiny_files):
    import allennlp.commands.elmo
    import allennlp.modules.elmo
    from allennlp.commands.elmo import DEFAULT_OPTIONS_FILE as default_options
    from allennlp.modules.elmo import Elmo as ElmoFromModules
    from allennlp.modules.elmo import batch_to_ids as batch_to_ids_from_modules

    assert allennlp.commands.elmo.ElmoEmbedder is ElmoEmbedder
    assert ElmoFromModules is Elmo and batch_to_ids_from_modules is batch_to_ids
    assert default_options == DEFAULT_OPTIONS_FILE
    assert sys.modules["allennlp"].__spec__.origin is None, "no allennlp file on disk"
    assert not any((Path(p) / "allennlp").exists() for p in sys.path if p and Path(p).is_dir())
    embedder = allennlp.commands.elmo.ElmoEmbedder(*tiny_files)
    assert embedder.embed_sentence(["hello"]).shape == (3, 1, 32)
    with pytest.raises(ModuleNotFoundError, match=r"No module named 'allennlp.data.fields'"):
        importlib.import_module("allennlp.data.fields")
    install_allennlp_modules()  # a second call changes nothing
    assert sum(getattr(f, "root", None) == "allennlp" for f in sys.meta_path) == 1


def test_uninstall_removes_the_modules(tiny_files):
    install_allennlp_modules()
    import allennlp.commands.elmo  # noqa: F401

    uninstall_allennlp_modules()
    assert not any(n == "allennlp" or n.startswith("allennlp.") for n in sys.modules)
    assert importlib.util.find_spec("allennlp") is None


def test_a_real_allennlp_is_never_shadowed(tmp_path, monkeypatch):
    (tmp_path / "allennlp").mkdir()
    (tmp_path / "allennlp" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        AllenNLPConflictError, match=r"a real allennlp is importable \(.*allennlp.__init__.py\)"
    ):
        install_allennlp_modules()
    assert not any(getattr(f, "root", None) == "allennlp" for f in sys.meta_path)


# -- AllenNLP users' habits ---------------------------------------------------------------------
CHECKPOINT = REFERENCE / "checkpoint.pt"


@pytest.fixture(scope="module")
def checkpoint() -> tuple[dict, dict[str, np.ndarray], dict]:
    """State dicts saved by AllenNLP 0.9's own Elmo / ElmoTokenEmbedder after a fine-tuning step,
    and what those modules then computed (tests/fixtures/allennlp-0.9/make_checkpoint.py)."""
    meta = json.loads((REFERENCE / "checkpoint.json").read_text(encoding="utf-8"))
    with np.load(REFERENCE / "checkpoint.npz") as arrays:
        numbers = {k: arrays[k] for k in arrays.files}
    return meta, numbers, torch.load(CHECKPOINT, weights_only=True)


def test_stateful_false_makes_elmo_stateless(tiny_files, tiny_sentences):
    """The recipe of allenai/allennlp#2398: the same input twice gives the same output, from
    zero states; the carried states are kept for when stateful is set back to True."""
    ids = batch_to_ids([s.split() for s in tiny_sentences[0][:3]])
    elmo = Elmo(*tiny_files, 1, dropout=0.0)
    fresh = Elmo(*tiny_files, 1, dropout=0.0)
    first = elmo(ids)["elmo_representations"][0]
    elmo._elmo_lstm._elmo_lstm.stateful = False
    again = [elmo(ids)["elmo_representations"][0] for _ in range(2)]
    assert torch.equal(again[0], again[1])
    torch.testing.assert_close(again[0], first, atol=0, rtol=0)  # both from zeros
    elmo._elmo_lstm._elmo_lstm.stateful = True
    fresh(ids)
    torch.testing.assert_close(
        elmo(ids)["elmo_representations"][0], fresh(ids)["elmo_representations"][0], atol=0, rtol=0
    )
    embedder = ElmoEmbedder(*tiny_files)
    embedder.elmo_bilm._elmo_lstm.stateful = False
    sentence = tiny_sentences[1][0].split()
    np.testing.assert_array_equal(embedder.embed_sentence(sentence), embedder.embed_sentence(sentence))


def test_other_attributes_of_the_lstm_are_refused(tiny_files):
    elmo = Elmo(*tiny_files, 1, dropout=0.0)
    with pytest.raises(
        AttributeError, match=r"_elmo_lstm\._elmo_lstm\.requires_grad cannot be set.*only stateful"
    ):
        elmo._elmo_lstm._elmo_lstm.requires_grad = True
    with pytest.raises(TypeError, match="stateful must be True or False, got 'no'"):
        elmo._elmo_lstm._elmo_lstm.stateful = "no"
    elmo._elmo_lstm._elmo_lstm.stateful = 0  # AllenNLP tests it for truth
    assert elmo._elmo_lstm._elmo_lstm.stateful is False


def test_the_elmo_names_import_as_code_in_the_wild_writes_them(allennlp_modules, tiny_files):
    import allennlp.modules
    from allennlp.data.token_indexers import ELMoTokenCharactersIndexer as indexer_from_package
    from allennlp.data.token_indexers.elmo_indexer import ELMoCharacterMapper, ELMoTokenCharactersIndexer
    from allennlp.modules import Elmo as ElmoFromModules
    from allennlp.modules.scalar_mix import ScalarMix
    from allennlp.modules.token_embedders import ElmoTokenEmbedder as embedder_from_package
    from allennlp.modules.token_embedders.elmo_token_embedder import ElmoTokenEmbedder
    from allennlp.nn.util import add_sentence_boundary_token_ids
    from allennlp.nn.util import remove_sentence_boundaries as remove

    from elmokit.compat import allennlp as compat

    assert ElmoFromModules is allennlp.modules.Elmo is Elmo
    assert ElmoTokenEmbedder is embedder_from_package is compat.ElmoTokenEmbedder
    assert ELMoTokenCharactersIndexer is indexer_from_package is compat.ELMoTokenCharactersIndexer
    assert ELMoCharacterMapper is compat.ELMoCharacterMapper and ScalarMix is compat.ScalarMix
    assert remove is remove_sentence_boundaries
    assert add_sentence_boundary_token_ids is compat.add_sentence_boundary_token_ids
    # eznlp's way: Elmo from allennlp.modules, made stateless
    elmo = allennlp.modules.Elmo(*map(str, tiny_files), num_output_representations=1, dropout=0.0)
    elmo._elmo_lstm._elmo_lstm.stateful = False
    ids = batch_to_ids(TWO)
    assert torch.equal(elmo(ids)["elmo_representations"][0], elmo(ids)["elmo_representations"][0])
    # nothing else of allennlp
    with pytest.raises(ImportError, match="get_text_field_mask"):
        exec("from allennlp.nn.util import get_text_field_mask", {})
    with pytest.raises(ModuleNotFoundError, match=r"No module named 'allennlp.modules.seq2seq_encoders'"):
        importlib.import_module("allennlp.modules.seq2seq_encoders")


def test_character_mapper_indexer_and_boundaries_compute_allennlps_numbers(checkpoint):
    from elmokit.compat.allennlp import (
        ELMoCharacterMapper,
        ELMoTokenCharactersIndexer,
        add_sentence_boundary_token_ids,
    )

    meta, arrays, _ = checkpoint
    words = meta["mapper_words"]

    class Token:  # AllenNLP's Token, as far as the indexer reads it
        def __init__(self, text: str) -> None:
            self.text = text

    np.testing.assert_array_equal(
        [ELMoCharacterMapper().convert_word_to_char_ids(w) for w in words], arrays["mapper/plain"]
    )
    added = ELMoCharacterMapper({"<pad>": 1, "@@UNKNOWN@@": 2})
    np.testing.assert_array_equal([added.convert_word_to_char_ids(w) for w in words], arrays["mapper/added"])
    indexer = ELMoTokenCharactersIndexer(tokens_to_add={"<pad>": 1})
    indices = indexer.tokens_to_indices([Token(w) for w in words], None, "elmo")
    np.testing.assert_array_equal(indices["elmo"], arrays["indexer"])
    padded = indexer.as_padded_tensor(indices, {"elmo": len(words) + 2}, {})["elmo"]
    assert padded.shape == (len(words) + 2, 50) and not padded[len(words) :].any()
    word_ids, vectors = (
        torch.from_numpy(arrays["boundaries/input_2d"]),
        torch.from_numpy(arrays["boundaries/input_3d"]),
    )
    added_2d, mask_2d = add_sentence_boundary_token_ids(word_ids, word_ids > 0, 1, 2)
    np.testing.assert_array_equal(added_2d.numpy(), arrays["boundaries/2d/added"])
    np.testing.assert_array_equal(mask_2d.numpy(), arrays["boundaries/2d/mask"])
    begin, end = torch.full((6,), 0.5), torch.full((6,), 0.25)
    added_3d, mask_3d = add_sentence_boundary_token_ids(vectors, word_ids > 0, begin, end)
    np.testing.assert_array_equal(added_3d.numpy(), arrays["boundaries/3d/added"])
    np.testing.assert_array_equal(mask_3d.numpy(), arrays["boundaries/3d/mask"])
    removed, removed_mask = remove_sentence_boundaries(added_3d, mask_3d)
    np.testing.assert_array_equal(removed.numpy(), arrays["boundaries/3d/removed"])
    np.testing.assert_array_equal(removed_mask.numpy(), arrays["boundaries/3d/removed_mask"])


def test_scalar_mix_has_allennlps_parameter_layout(tiny_files):
    elmo = Elmo(*tiny_files, 2, dropout=0.0)
    mix = elmo.scalar_mix_1
    assert isinstance(mix.scalar_parameters, torch.nn.ParameterList) and len(mix.scalar_parameters) == 3
    assert all(p.shape == (1,) for p in mix.scalar_parameters) and mix.gamma.shape == (1,)
    assert torch.cat([p for p in mix.scalar_parameters]).shape == (3,)  # AllenNLP users' code
    keys = {k for k in elmo.state_dict() if k.startswith("scalar_mix_")}
    assert keys == {
        f"scalar_mix_{m}.{n}"
        for m in (0, 1)
        for n in ("gamma", *(f"scalar_parameters.{i}" for i in range(3)))
    }


def test_a_checkpoint_saved_from_allennlps_elmo_loads(tiny_files, checkpoint):
    meta, arrays, states = checkpoint
    ids = batch_to_ids(meta["sentences"])
    elmo = Elmo(*tiny_files, 2, requires_grad=True, dropout=0.0, do_layer_norm=True)
    assert set(states["elmo"]) - set(elmo.state_dict()), "the checkpoint uses AllenNLP's own keys"
    result = elmo.load_state_dict(states["elmo"])
    assert not result.missing_keys and not result.unexpected_keys
    elmo.eval()
    with torch.no_grad():
        for k in range(2):  # two stateful calls
            out = elmo(ids)["elmo_representations"]
            for r in range(2):
                _close(out[r], arrays[f"elmo/{k}/{r}"], atol=1e-5, rtol=1e-5)
    # a task model holding AllenNLP's Elmo as a submodule: the keys carry its prefix
    model = torch.nn.ModuleDict({"elmo": Elmo(*tiny_files, 2, dropout=0.0, do_layer_norm=True)})
    model.load_state_dict({f"elmo.{k}": v for k, v in states["elmo"].items()})
    with torch.no_grad():
        _close(model["elmo"](ids)["elmo_representations"][1], arrays["elmo/0/1"], atol=1e-5, rtol=1e-5)
    embedder = ElmoTokenEmbedder(*tiny_files, dropout=0.0, projection_dim=5)
    embedder.load_state_dict(states["token_embedder"])
    with torch.no_grad():
        _close(embedder.eval()(ids), arrays["token_embedder/0"], atol=1e-5, rtol=1e-5)


def test_checkpoints_of_the_old_compat_layout_and_of_another_model(tiny_files, checkpoint, tmp_path):
    _, _, states = checkpoint
    elmo = Elmo(*tiny_files, 1, dropout=0.0)
    old = dict(elmo.state_dict())  # elmokit's earlier compat layout: one tensor of 3, a 0-d gamma
    for k in range(3):
        del old[f"scalar_mix_0.scalar_parameters.{k}"]
    old["scalar_mix_0.scalar_parameters"], old["scalar_mix_0.gamma"] = (
        torch.tensor([1.0, 2.0, 3.0]),
        torch.tensor(0.5),
    )
    elmo.load_state_dict(old)
    assert torch.cat(list(elmo.scalar_mix_0.scalar_parameters)).tolist() == [1.0, 2.0, 3.0]
    assert elmo.scalar_mix_0.gamma.tolist() == [0.5]
    options = json.loads(tiny_files[0].read_text())
    options["lstm"]["dim"] = 32  # another model: its checkpoint cannot be this one's
    (tmp_path / "options.json").write_text(json.dumps(options))
    bilm = BiLM(options)
    bilm.save(tmp_path / "options.json", tmp_path / "weights.hdf5")
    other = Elmo(tmp_path / "options.json", tmp_path / "weights.hdf5", 2, dropout=0.0)
    with pytest.raises(
        ValueError,
        match=r"^cannot load this AllenNLP checkpoint into ELMo: _elmo_lstm._elmo_lstm.forward_layer_0"
        r".input_linearity.weight has shape \(256, 16\), the model's options imply 128 rows",
    ):
        other.load_state_dict(states["elmo"])
    partial = {k: v for k, v in states["elmo"].items() if "char_conv_3" not in k}
    with pytest.raises(ValueError, match=r"has no '_elmo_lstm._token_embedder.char_conv_3.weight'"):
        elmo.load_state_dict(partial)


def test_allennlps_cached_vocabulary_key_loads(tiny_files):
    """AllenNLP saves the vocab_to_cache table as ``_elmo_lstm._word_embedding.weight``."""
    vocab = ["@@PADDING@@", "@@UNKNOWN@@", "This", "is"]
    elmo = Elmo(*tiny_files, 1, dropout=0.0, vocab_to_cache=vocab)
    state = dict(elmo.state_dict())
    table = state.pop("_elmo_lstm._word_embedding") + 1.0
    state["_elmo_lstm._word_embedding.weight"] = table
    elmo.load_state_dict(state)
    assert torch.equal(elmo._elmo_lstm._word_embedding, table)
