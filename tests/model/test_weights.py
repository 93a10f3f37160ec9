"""Original weight-file layout: round trips, other option sets, and clear errors."""

from __future__ import annotations

import copy
import json

import h5py
import numpy as np
import pytest
import torch

from elmokit import BiLM, OptionsError, WeightFileError, batch_to_ids

from ..reference import reference_layers


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
    from elmokit.lm.softmax import Softmax
    from elmokit.model.weights import load_softmax, save_softmax

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

    import elmokit.model.weights

    tree = ast.parse(Path(elmokit.model.weights.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported.isdisjoint({"bilm", "elmo", "embed.embedder", "char_cnn", "lm.softmax"}), imported


def _copy_weights(source, target, change=None) -> None:
    """A copy of a weight file, datasets only; ``change(f)`` then edits the copy."""
    with h5py.File(source, "r") as src, h5py.File(target, "w") as dst:
        for name in _datasets(source):
            dst.create_dataset(name, data=src[name][...])
        if change is not None:
            change(dst)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 1e39])
def test_non_finite_weights_are_refused_naming_the_dataset(tiny_files, tmp_path, value):
    def change(f):  # float64 data, so that 1e39 (too large for float32) can be stored
        data = f["CNN_high_0/W_carry"][...].astype(np.float64)
        data.flat[3] = value
        del f["CNN_high_0/W_carry"]
        f.create_dataset("CNN_high_0/W_carry", data=data)

    _copy_weights(tiny_files[1], tmp_path / "w.hdf5", change)
    with pytest.raises(
        WeightFileError,
        match=r"w\.hdf5: dataset 'CNN_high_0/W_carry' holds 1 non-finite values \(NaN or infinity, or too large for float32\)$",
    ):
        BiLM.load(tiny_files[0], tmp_path / "w.hdf5")


def _with_start_state(h=None, c=None):
    def change(f):
        if h is not None:
            f.create_dataset("start_state/h", data=h)
        if c is not None:
            f.create_dataset("start_state/c", data=c)

    return change


def test_start_state_must_be_whole_finite_and_of_its_shape(tiny_files, tmp_path):
    h, c = np.zeros((2, 2, 16), np.float32), np.zeros((2, 2, 64), np.float32)
    _copy_weights(tiny_files[1], tmp_path / "ok.hdf5", _with_start_state(h + 0.5, c))
    assert torch.equal(
        BiLM.load(tiny_files[0], tmp_path / "ok.hdf5").start_state.h, torch.full((2, 2, 16), 0.5)
    )
    _copy_weights(tiny_files[1], tmp_path / "h.hdf5", _with_start_state(h=h))
    with pytest.raises(
        WeightFileError,
        match=r"has dataset 'start_state/h' but not 'start_state/c'; a start state needs both",
    ):
        BiLM.load(tiny_files[0], tmp_path / "h.hdf5")
    _copy_weights(tiny_files[1], tmp_path / "c.hdf5", _with_start_state(c=c))
    with pytest.raises(WeightFileError, match=r"has dataset 'start_state/c' but not 'start_state/h'"):
        BiLM.load(tiny_files[0], tmp_path / "c.hdf5")
    nan_c = c.copy()
    nan_c[1, 0, 5] = np.nan
    _copy_weights(tiny_files[1], tmp_path / "nan.hdf5", _with_start_state(h, nan_c))
    with pytest.raises(WeightFileError, match=r"dataset 'start_state/c' holds 1 non-finite values"):
        BiLM.load(tiny_files[0], tmp_path / "nan.hdf5")
    _copy_weights(tiny_files[1], tmp_path / "str.hdf5", _with_start_state(np.array([b"x"]), c))
    with pytest.raises(WeightFileError, match=r"dataset 'start_state/h' holds \|S1 values, not numbers"):
        BiLM.load(tiny_files[0], tmp_path / "str.hdf5")


def _option(section, field, value):
    def change(o):
        target = o["char_cnn"]["embedding"] if section == "embedding" else o[section]
        target[field] = value

    return change


@pytest.mark.parametrize(
    "section, field, value, message",
    [
        ("char_cnn", "n_highway", -1, r"char_cnn\.n_highway must be an integer of at least 0, got -1$"),
        (
            "lstm",
            "cell_clip",
            -3,
            r"lstm\.cell_clip must be a positive number \(or absent for no clipping\), got -3$",
        ),
        ("lstm", "proj_clip", 0, r"lstm\.proj_clip must be a positive number .*, got 0$"),
        ("lstm", "proj_clip", "3", r'lstm\.proj_clip must be a positive number .*, got "3"$'),
        (
            "lstm",
            "use_skip_connections",
            "false",
            r'lstm\.use_skip_connections must be true or false, got "false"$',
        ),
        ("lstm", "use_skip_connections", 1, r"lstm\.use_skip_connections must be true or false, got 1$"),
        ("lstm", "dim", None, r"lstm\.dim must be an integer of at least 1, got null$"),
        ("lstm", "projection_dim", 0, r"lstm\.projection_dim must be an integer of at least 1, got 0$"),
        ("lstm", "n_layers", 1.5, r"lstm\.n_layers must be an integer of at least 1, got 1\.5$"),
        ("lstm", "n_layers", True, r"lstm\.n_layers must be an integer of at least 1, got true$"),
        ("embedding", "dim", None, r"char_cnn\.embedding\.dim must be an integer of at least 1, got null$"),
        (
            "char_cnn",
            "n_characters",
            260,
            r"char_cnn\.n_characters must be an integer of at least 262 .*, got 260$",
        ),
        (
            "char_cnn",
            "max_characters_per_token",
            None,
            r"char_cnn\.max_characters_per_token must be an integer of at least 3 .*, got null$",
        ),
        (
            "char_cnn",
            "filters",
            [[1, None]],
            r"char_cnn\.filters must be a non-empty list of \[width, n_filters\] pairs of positive integers, got \[\[1, null\]\]$",
        ),
        ("char_cnn", "activation", None, r"char_cnn\.activation must be relu or tanh, got null$"),
    ],
)
def test_options_fields_are_checked_for_type_and_range(
    tiny_options, tiny_files, tmp_path, section, field, value, message
):
    options = copy.deepcopy(tiny_options)
    _option(section, field, value)(options)
    (tmp_path / "o.json").write_text(json.dumps(options))
    with pytest.raises(OptionsError, match=r"o\.json: " + message):
        BiLM.load(tmp_path / "o.json", tiny_files[1])


def test_integral_floats_and_absent_clips_are_accepted(tiny_options):
    options = copy.deepcopy(tiny_options)
    options["lstm"].update(dim=64.0, cell_clip=None)
    del options["lstm"]["proj_clip"]
    model = BiLM(options)
    assert (
        model.options.lstm.dim == 64
        and model.options.lstm.cell_clip is None
        and model.options.lstm.proj_clip is None
    )


SECRET = b"\x00\x00\x80\x3f" * 16  # what a hostile file would pull in: 16 float32 ones


def _unsafe_variants(tmp_path):
    """Weight files that read other files (or link elsewhere), by kind."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(SECRET)
    other = tmp_path / "other.hdf5"
    with h5py.File(other, "w") as f:
        f.create_dataset("b", data=np.ones(64, np.float32))

    def external_link(f):
        del f["CNN/b_cnn_4"]
        f["CNN/b_cnn_4"] = h5py.ExternalLink(str(other), "/b")

    def external_storage(f):
        del f["CNN/b_cnn_4"]
        f.create_dataset(
            "CNN/b_cnn_4", shape=(64,), dtype="<f4", external=[(str(secret), 0, len(SECRET) * 4)]
        )

    def virtual(f):
        del f["CNN/b_cnn_4"]
        layout = h5py.VirtualLayout(shape=(64,), dtype="<f4")
        layout[:] = h5py.VirtualSource(str(other), "b", shape=(64,))
        f.create_virtual_dataset("CNN/b_cnn_4", layout)

    def soft(f):
        f["extra"] = h5py.SoftLink("/CNN/b_cnn_4")

    return {
        "external link": (
            external_link,
            r"'/CNN/b_cnn_4' is an external link to .*other\.hdf5:/b; elmokit does not read other files",
        ),
        "external storage": (
            external_storage,
            r"dataset '/CNN/b_cnn_4' keeps its data in other files \(.*secret\.bin\); elmokit does not read external storage",
        ),
        "virtual dataset": (
            virtual,
            r"dataset '/CNN/b_cnn_4' is a virtual dataset \(its data lives in other files\)",
        ),
        "soft link": (
            soft,
            r"'/extra' is a soft link to /CNN/b_cnn_4; elmokit reads only objects stored under their own names",
        ),
    }


@pytest.mark.parametrize("kind", ["external link", "external storage", "virtual dataset", "soft link"])
def test_weight_files_that_read_other_files_are_refused(tiny_files, tmp_path, kind):
    from elmokit.model.weights import UnsafeHDF5Error

    change, message = _unsafe_variants(tmp_path)[kind]
    _copy_weights(tiny_files[1], tmp_path / "w.hdf5", change)
    with pytest.raises(UnsafeHDF5Error, match=message):
        BiLM.load(tiny_files[0], tmp_path / "w.hdf5")


def test_softmax_file_that_reads_another_file_is_refused(tmp_path):
    from elmokit.lm.softmax import Softmax
    from elmokit.model.weights import UnsafeHDF5Error, load_softmax

    (tmp_path / "secret.bin").write_bytes(b"\x00" * 16)
    with h5py.File(tmp_path / "softmax.hdf5", "w") as f:
        f.create_dataset("softmax/W", data=np.zeros((2, 2), np.float32))
        f.create_dataset(
            "softmax/b", shape=(2,), dtype="<f4", external=[(str(tmp_path / "secret.bin"), 0, 8)]
        )
    with pytest.raises(
        UnsafeHDF5Error, match=r"softmax\.hdf5: dataset '/softmax/b' keeps its data in other files"
    ):
        load_softmax(Softmax(2, 2), tmp_path / "softmax.hdf5")


def test_damaged_weight_file_is_a_named_error(tiny_files, tmp_path):
    """Flipped bytes inside the file's structure (here the signature of a B-tree node) give a
    WeightFileError naming the file, not an HDF5 traceback."""
    data = bytearray(tiny_files[1].read_bytes())
    at = data.index(b"TREE", 1000)
    data[at] ^= 0xFF
    (tmp_path / "w.hdf5").write_bytes(bytes(data))
    with pytest.raises(WeightFileError, match=r"w\.hdf5: damaged HDF5 file, it cannot be read \("):
        BiLM.load(tiny_files[0], tmp_path / "w.hdf5")


def test_task_layer_cache_that_reads_another_file_is_refused(tmp_path):
    """The downstream tasks' layer cache is an HDF5 file elmokit reads back (memory-mapped):
    external storage there is refused too, while a damaged cache is only a miss (rewritten)."""
    from elmokit.model.weights import UnsafeHDF5Error
    from elmokit.tasks.cache import _open

    (tmp_path / "secret.bin").write_bytes(b"\x00" * 48)
    with h5py.File(tmp_path / "cache.hdf5", "w") as f:
        f.attrs["key"] = "k"
        f.create_dataset("offsets", data=np.array([0, 1]))
        f.create_dataset(
            "layers", shape=(1, 3, 4), dtype="<f4", external=[(str(tmp_path / "secret.bin"), 0, 48)]
        )
    with pytest.raises(
        UnsafeHDF5Error, match=r"cache\.hdf5: dataset '/layers' keeps its data in other files"
    ):
        _open(tmp_path / "cache.hdf5", "k", 1)
    (tmp_path / "damaged.hdf5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x00" * 100)
    assert _open(tmp_path / "damaged.hdf5", "k", 1) is None


def test_training_options_with_261_characters_load_as_262(tmp_path, tiny_files):
    """bilm-tf's training options say n_characters 261; its README has users change that to 262
    for prediction. A model published with either gives the same vectors."""
    options_file, weight_file = tiny_files
    options = json.loads(options_file.read_text())
    assert options["char_cnn"]["n_characters"] == 262
    options["char_cnn"]["n_characters"] = 261
    (tmp_path / "options.json").write_text(json.dumps(options))
    ids = batch_to_ids([["The", "cat", "sat", "."]])
    with torch.no_grad():
        want = BiLM.load(options_file, weight_file)(ids).layers
        got = BiLM.load(tmp_path / "options.json", weight_file)(ids).layers
    assert torch.equal(want, got)
