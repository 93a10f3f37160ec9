"""Original weight-file layout: round trips, other option sets, and clear errors."""

from __future__ import annotations

import copy
import json

import h5py
import numpy as np
import pytest
import torch

from elmokit import BiLM, OptionsError, WeightFileError, batch_to_ids

from .reference import reference_layers


def _datasets(path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda n, o: out.__setitem__(n, (o.shape, o.dtype)) if isinstance(o, h5py.Dataset) else None
        )
    return out


def test_save_writes_the_original_names_shapes_and_dtypes(tiny_files, tmp_path):
    model = BiLM.load(*tiny_files)
    model.save(tmp_path / "options.json", tmp_path / "weights.hdf5")
    assert _datasets(tmp_path / "weights.hdf5") == _datasets(tiny_files[1])
    with h5py.File(tiny_files[1], "r") as a, h5py.File(tmp_path / "weights.hdf5", "r") as b:
        for name in _datasets(tiny_files[1]):
            np.testing.assert_array_equal(a[name][...], b[name][...])


def test_save_load_round_trip_is_exact(tiny_options, tmp_path, tiny_sentences):
    torch.manual_seed(1)
    model = BiLM(tiny_options).eval()
    model.save(tmp_path / "o.json", tmp_path / "w.hdf5")
    loaded = BiLM.load(tmp_path / "o.json", tmp_path / "w.hdf5")
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    ids = batch_to_ids([s.split() for s in tiny_sentences[0][:3]])
    with torch.no_grad():
        assert torch.equal(model(ids).layers, loaded(ids).layers)


VARIANTS = {
    "tanh_no_highway_no_skip": lambda o: (
        o["char_cnn"].update(activation="tanh", n_highway=0),
        o["lstm"].update(use_skip_connections=False),
    ),
    "no_clips_three_layers": lambda o: (
        o["lstm"].pop("cell_clip"),
        o["lstm"].pop("proj_clip"),
        o["lstm"].update(n_layers=3),
    ),
    "one_layer_short_tokens": lambda o: (
        o["lstm"].update(n_layers=1),
        o["char_cnn"].update(max_characters_per_token=12),
    ),
    "no_lstm_projection": lambda o: o["lstm"].update(dim=16),
    "no_cnn_projection": lambda o: o["char_cnn"].update(filters=[[1, 6], [3, 10]]),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_option_variants_match_reference_and_round_trip(variant, tiny_options, tmp_path):
    options = copy.deepcopy(tiny_options)
    VARIANTS[variant](options)
    torch.manual_seed(2)
    model = BiLM(options).eval()
    with torch.no_grad():  # larger biases so that clips, gates and skips all matter
        for layer in model.lstm.layers:
            layer.bias.normal_(0, 1.0)
    model.save(tmp_path / "o.json", tmp_path / "w.hdf5")
    saved = json.loads((tmp_path / "o.json").read_text())
    assert saved["lstm"].get("cell_clip") == options["lstm"].get("cell_clip")
    sentence = "The quick brown fox jumped over the extraordinarily-long-hyphenated dog .".split()
    with torch.no_grad():
        got = BiLM.load(tmp_path / "o.json", tmp_path / "w.hdf5")(
            batch_to_ids([sentence], max_chars=model.options.char_cnn.max_characters_per_token)
        )
    ref = reference_layers(str(tmp_path / "w.hdf5"), options, sentence)
    np.testing.assert_allclose(got.layers[:, 0].double().numpy(), ref, atol=1e-5)


def test_missing_dataset_is_named(tiny_files, tmp_path):
    broken = tmp_path / "w.hdf5"
    with h5py.File(tiny_files[1], "r") as src, h5py.File(broken, "w") as dst:
        for name in _datasets(tiny_files[1]):
            if name != "CNN_high_1/W_carry":
                dst.create_dataset(name, data=src[name][...])
    with pytest.raises(WeightFileError, match=r"missing dataset 'CNN_high_1/W_carry'"):
        BiLM.load(tiny_files[0], broken)


def test_shape_disagreement_names_both_shapes(tiny_files, tiny_options, tmp_path):
    options = copy.deepcopy(tiny_options)
    options["lstm"]["dim"] = 32
    (tmp_path / "o.json").write_text(json.dumps(options))
    with pytest.raises(
        WeightFileError,
        match=r"RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0.*\(32, 256\).*\(32, 128\)",
    ):
        BiLM.load(tmp_path / "o.json", tiny_files[1])


def test_options_missing_field_is_named(tiny_options, tiny_files, tmp_path):
    options = copy.deepcopy(tiny_options)
    del options["lstm"]["projection_dim"]
    (tmp_path / "o.json").write_text(json.dumps(options))
    with pytest.raises(OptionsError, match=r"missing required field 'lstm.projection_dim'"):
        BiLM.load(tmp_path / "o.json", tiny_files[1])
    with pytest.raises(OptionsError, match=r"missing required field 'char_cnn'"):
        BiLM({"lstm": tiny_options["lstm"]})


def test_nonexistent_paths(tiny_files, tmp_path):
    with pytest.raises(FileNotFoundError, match="options file not found: .*nope.json"):
        BiLM.load(tmp_path / "nope.json", tiny_files[1])
    with pytest.raises(FileNotFoundError, match="weight file not found: .*nope.hdf5"):
        BiLM.load(tiny_files[0], tmp_path / "nope.hdf5")


def test_not_an_hdf5_file(tiny_files, tmp_path):
    (tmp_path / "w.hdf5").write_text("hello")
    with pytest.raises(WeightFileError, match="not a readable HDF5 file"):
        BiLM.load(tiny_files[0], tmp_path / "w.hdf5")


def test_softmax_file_round_trip_and_vocabulary_mismatch(tmp_path):
    from elmokit.softmax import Softmax
    from elmokit.weights import load_softmax, save_softmax

    torch.manual_seed(3)
    saved, loaded = Softmax(10, 4), Softmax(10, 4)
    save_softmax(saved, tmp_path / "softmax.hdf5")
    load_softmax(loaded, tmp_path / "softmax.hdf5")
    assert torch.equal(saved.weight, loaded.weight) and torch.equal(saved.bias, loaded.bias)
    with pytest.raises(WeightFileError, match=r"'softmax/W' has shape \(10, 4\) .* imply \(12, 4\)"):
        load_softmax(Softmax(12, 4), tmp_path / "softmax.hdf5")


def test_the_layout_module_knows_no_model_class():
    """weights.py works on parameter names, so it imports neither bilm.py nor anything above it."""
    import ast
    from pathlib import Path

    import elmokit.weights

    tree = ast.parse(Path(elmokit.weights.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported.isdisjoint({"bilm", "elmo", "embed", "char_cnn", "softmax"}), imported
