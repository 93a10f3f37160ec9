"""TF-Hub ELMo modules: the checkpoint reader, module folders as models, ``elmokit convert`` and
``elmokit.compat.tfhub``, against what TensorFlow 2.15 wrote and computed
(tests/fixtures/tfhub, see its SOURCE.md)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from elmokit import BiLM, Embedder
from elmokit.compat.tfhub import Module
from elmokit.hub import resolve_model
from elmokit.hub.resolve import is_tfhub_folder
from elmokit.model.tf_checkpoint import Checkpoint, CheckpointError
from elmokit.model.tfhub import TfHubError, read_tfhub

from ..conftest import FIXTURES

HERE = FIXTURES / "tfhub"
MODULES = {"module": "checkpoint.npz", "module-lstmcell": "checkpoint-lstmcell.npz"}
OUTPUTS = ("word_emb", "lstm_outputs1", "lstm_outputs2", "elmo", "default")
ATOL = 1e-5


@pytest.fixture(scope="module")
def reference() -> np.lib.npyio.NpzFile:
    return np.load(HERE / "outputs.npz")


def _copy(tmp_path: Path, name: str = "module") -> Path:
    target = tmp_path / name
    shutil.copytree(HERE / name, target)
    return target


# -- the checkpoint reader ---------------------------------------------------------------------
@pytest.mark.parametrize("folder", MODULES)
def test_reader_gives_what_tensorflow_read(folder):
    checkpoint = Checkpoint(HERE / folder / "variables" / "variables")
    expected = np.load(HERE / MODULES[folder])
    names = [str(n) for n in expected["names"]]
    assert sorted(checkpoint.entries) == sorted(names)
    for i, name in enumerate(names):
        value, want = checkpoint.read(name), expected[f"v{i}"]
        assert value.dtype == want.dtype and value.shape == want.shape, name
        assert np.array_equal(value, want), name
    assert checkpoint.num_shards == (2 if folder == "module" else 1)


def test_reader_refuses_damaged_files(tmp_path):
    folder = _copy(tmp_path)
    index = folder / "variables" / "variables.index"
    data = index.read_bytes()
    index.write_bytes(data[:-1])
    with pytest.raises(CheckpointError, match="no table magic number"):
        Checkpoint(folder / "variables" / "variables")
    index.write_bytes(data)
    checkpoint = Checkpoint(folder / "variables" / "variables")
    entry = checkpoint.entries["bilm/char_embed"]
    shard = checkpoint.shard_file(entry.shard)
    with open(shard, "r+b") as f:
        f.truncate(entry.offset + 10)
    with pytest.raises(CheckpointError, match=r"'bilm/char_embed': bytes .* lie past the end"):
        Checkpoint(folder / "variables" / "variables").read("bilm/char_embed")
    index.write_bytes(b"\0" * 10)
    with pytest.raises(CheckpointError, match="shorter than a table's footer"):
        Checkpoint(folder / "variables" / "variables")


# -- a module folder is a model ------------------------------------------------------------------
@pytest.mark.parametrize("folder", MODULES)
def test_module_folder_loads_as_the_model_it_was_made_from(folder):
    assert is_tfhub_folder(HERE / folder)
    source = resolve_model(HERE / folder)
    assert source.kind == "tfhub" and source.folder == HERE / folder
    with pytest.raises(ValueError, match="is a TF-Hub module .* `elmokit convert`"):
        source.files()
    bilm, original = BiLM.from_pretrained(HERE / folder), BiLM.from_pretrained("elmo-tiny-reference")
    assert bilm.options == original.options
    mine, theirs = bilm.state_dict(), original.state_dict()
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key
    module = read_tfhub(HERE / folder)
    assert module.aggregation_weights is not None
    np.testing.assert_allclose(module.aggregation_weights, [0.4, -0.7, 1.2], rtol=1e-6)
    assert module.aggregation_scaling == pytest.approx(1.7)


def test_embedder_takes_a_module_folder():
    sentences = [["the", "cat", "sat"], ["dogs"]]
    got = Embedder(str(HERE / "module"), mode="zero").embed_sentences(sentences)
    want = Embedder("elmo-tiny-reference", mode="zero").embed_sentences(sentences)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    ("old", "new", "missing"),
    [
        (b"char_embed", b"char_embex", "'bilm/char_embed' (the character embedding)"),
        (b"W_cnn_0", b"W_cnX_0", "'bilm/CNN/W_cnn_0' (the first char CNN filter)"),
    ],
)
def test_a_folder_that_is_not_elmo_is_refused_naming_the_variable(tmp_path, old, new, missing):
    folder = _copy(tmp_path)
    index = folder / "variables" / "variables.index"
    data = index.read_bytes()
    assert data.count(old) == 1
    index.write_bytes(data.replace(old, new))
    with pytest.raises(
        TfHubError, match=re.escape(f"not a TF-Hub ELMo module: its checkpoint has no variable {missing}")
    ):
        BiLM.from_pretrained(folder)


def test_the_layer_mix_is_required_by_the_compat_module_only(tmp_path):
    folder = _copy(tmp_path)
    index = folder / "variables" / "variables.index"
    data = index.read_bytes()
    assert data.count(b"weights") == 1  # the key "aggregation/weights", its prefix shared with the one before
    index.write_bytes(data.replace(b"weights", b"weightz"))
    BiLM.from_pretrained(folder)  # the biLM needs no mix
    with pytest.raises(TfHubError, match="no variable 'aggregation/weights'"):
        Module(folder)


def test_model_option_takes_a_module_folder(tmp_path, capsys):
    import h5py

    text = tmp_path / "in.txt"
    text.write_text("the cat sat\ndogs bark\n", encoding="utf-8")
    for model, out in ((HERE / "module-lstmcell", "a.hdf5"), ("elmo-tiny-reference", "b.hdf5")):
        code, _, err = _cli(capsys, "embed", "--model", model, "--mode", "zero", "--quiet", text, tmp_path / out)
        assert code == 0, err
    with h5py.File(tmp_path / "a.hdf5") as a, h5py.File(tmp_path / "b.hdf5") as b:
        assert sorted(a) == sorted(b)
        for key in ("0", "1"):
            np.testing.assert_array_equal(a[key][...], b[key][...])


# -- elmokit convert ---------------------------------------------------------------------------
def _cli(capsys, *args: object) -> tuple[int, str, str]:
    from elmokit.cli import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as exit:
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("folder", MODULES)
def test_convert_writes_bilm_tf_layout_once(tmp_path, capsys, folder):
    out = tmp_path / "converted"
    code, stdout, _ = _cli(capsys, "convert", HERE / folder, out)
    assert code == 0 and "options.json, weights.hdf5" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["options.json", "weights.hdf5"]
    converted, module = BiLM.from_pretrained(out), BiLM.from_pretrained(HERE / folder)
    assert converted.options == module.options
    for (key, a), b in zip(converted.state_dict().items(), module.state_dict().values()):
        assert torch.equal(a, b), key
    before = (out / "weights.hdf5").read_bytes()
    code, _, err = _cli(capsys, "convert", HERE / folder, out)
    assert code == 2 and err.startswith("elmokit: error:") and "exists" in err and len(err.splitlines()) == 1
    assert (out / "weights.hdf5").read_bytes() == before
    assert _cli(capsys, "convert", HERE / folder, out, "--overwrite")[0] == 0


def test_convert_refuses_other_models_and_writing_into_the_module(tmp_path, capsys):
    code, _, err = _cli(capsys, "convert", "elmo-tiny-reference", tmp_path / "x")
    assert code == 2 and "is not a TF-Hub module folder" in err and not (tmp_path / "x").exists()
    module = _copy(tmp_path)
    listing = sorted(p.relative_to(module) for p in module.rglob("*"))
    code, _, err = _cli(capsys, "convert", module, module)
    assert code == 2 and "inside the module folder" in err
    assert sorted(p.relative_to(module) for p in module.rglob("*")) == listing


# -- elmokit.compat.tfhub ----------------------------------------------------------------------
@pytest.mark.parametrize("folder", MODULES)
def test_both_signatures_reproduce_tensorflow_over_two_calls(folder, reference):
    module = Module(str(HERE / folder))
    for k in range(2):
        got = module(list(reference[f"default/{k}/input"]), signature="default", as_dict=True)
        assert set(got) == set(OUTPUTS)
        for name in OUTPUTS:
            want = reference[f"default/{k}/{name}"]
            assert got[name].shape == want.shape and got[name].dtype == np.float32, (k, name)
            np.testing.assert_allclose(got[name], want, rtol=0, atol=ATOL, err_msg=f"default {k} {name}")
    for k in range(2):
        inputs = {
            "tokens": reference[f"tokens/{k}/input_tokens"],
            "sequence_len": reference[f"tokens/{k}/input_sequence_len"],
        }
        got = module(inputs, signature="tokens", as_dict=True)
        for name in OUTPUTS:
            want = reference[f"tokens/{k}/{name}"]
            assert got[name].shape == want.shape, (k, name)
            np.testing.assert_allclose(got[name], want, rtol=0, atol=ATOL, err_msg=f"tokens {k} {name}")


def test_state_padding_and_call_forms(reference):
    module = Module(HERE / "module")
    inputs = {
        "tokens": reference["tokens/0/input_tokens"],
        "sequence_len": reference["tokens/0/input_sequence_len"],
    }
    first = module(inputs, signature="tokens", as_dict=True)
    second = module(inputs, signature="tokens", as_dict=True)
    assert np.abs(first["elmo"] - second["elmo"]).max() > 1e-3  # the carried state changes the second call
    # rows past sequence_len: LSTM outputs zero, word_emb one vector (the all-padding token's)
    lengths = inputs["sequence_len"]
    for row, n in enumerate(lengths):
        assert not first["lstm_outputs1"][row, n:].any() and not first["lstm_outputs2"][row, n:].any()
        if n < len(inputs["tokens"][row]):
            np.testing.assert_array_equal(
                first["word_emb"][row, n:], first["word_emb"][2, 1:2].repeat(6 - n, 0)
            )
    module.reset_states()
    again = module(inputs, signature="tokens", as_dict=False)
    np.testing.assert_array_equal(again, first["default"])
    # a token past sequence_len is ignored, whatever it holds
    changed = inputs["tokens"].copy()
    changed[1, 4] = "something else"
    module.reset_states()
    np.testing.assert_array_equal(
        module({**inputs, "tokens": changed}, signature="tokens")[1], first["default"][1]
    )
    # bytes as TensorFlow gives them
    module.reset_states()
    as_bytes = [s.encode("utf-8") for s in reference["default/0/input"]]
    np.testing.assert_allclose(module(as_bytes)[0], reference["default/0/default"][0], atol=ATOL)


def test_bad_calls_are_refused():
    module = Module(HERE / "module")
    with pytest.raises(ValueError, match="signature must be one of default, tokens"):
        module(["a b"], signature="elmo")
    with pytest.raises(ValueError, match=r"sequence_len must lie in 0..2"):
        module({"tokens": [["a", "b"]], "sequence_len": [3]}, signature="tokens")
    with pytest.raises(ValueError, match="tokens signature takes"):
        module(["a b"], signature="tokens")
    with pytest.raises(TypeError, match="not one string"):
        module("a b")


def test_the_char_cnn_activation_comes_from_the_graph(tmp_path):
    folder = _copy(tmp_path)
    assert read_tfhub(folder).options.char_cnn.activation == "relu"
    graph = folder / "saved_model.pb"
    # the node names straddle the scanner's 1 MiB chunks
    graph.write_bytes(b"\0" * (2**20 - 6) + b"bilm/CNN/Tanh" + b"\0" * 10 + b"bilm/CNN/Tanh_1")
    assert read_tfhub(folder).options.char_cnn.activation == "tanh"
