"""Hostile model files and sizes: every size is bounded before anything is allocated, and every
refusal is one line naming the file (or option) and the cause (elmokit.base.bounds)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import h5py
import pytest

from elmokit import BiLM, BiLMOptions, OptionsError
from elmokit.cli import main
from elmokit.model.manylangs import ManyLangsError, model_config_file
from elmokit.model.options import preset
from elmokit.model.weights import open_hdf5

from .conftest import FIXTURES, TINY

MANYLANGS = FIXTURES / "elmoformanylangs"
BIG = "1" + "0" * 400  # a 401-digit integer, written into JSON as it is


def _options_file(tmp_path: Path, change: dict | None = None, text: str | None = None) -> Path:
    """The tiny model's options.json with ``change`` ({"lstm.dim": value}) applied; a value
    "BIG" is written as a 401-digit integer."""
    options = json.loads((TINY / "options.json").read_text())
    for where, value in (change or {}).items():
        section = options
        *path, last = where.split(".")
        for key in path:
            section = section[key]
        section[last] = value
    path = tmp_path / "options.json"
    path.write_text(text if text is not None else json.dumps(options).replace('"BIG"', BIG))
    return path


def _embed(tmp_path: Path, options: Path, capsys, weights: Path = TINY / "lm_weights.hdf5") -> str:
    """Run `elmokit embed --options ... --weights ...`; it must fail with status 2 and one line,
    which is returned (without the "elmokit: error: " prefix)."""
    (tmp_path / "in.txt").write_text("the cat sat\n")
    out = tmp_path / "out.hdf5"
    code = main(
        ["embed", str(tmp_path / "in.txt"), str(out), "--options", str(options)]
        + ["--weights", str(weights), "--device", "cpu", "--quiet"]
    )
    error = capsys.readouterr().err.strip()
    assert code == 2, error
    assert error.startswith("elmokit: error: ") and "\n" not in error and "Traceback" not in error
    assert not out.exists()
    return error.removeprefix("elmokit: error: ")


# -- 4: every size field has a ceiling named in the error ------------------------------------------
@pytest.mark.parametrize(
    "field, value, ceiling",
    [
        ("char_cnn.n_characters", 10**9, "2,000,000"),
        ("char_cnn.max_characters_per_token", 10**9, "1,000"),
        ("lstm.dim", 10**9, "1,000,000"),
        ("lstm.projection_dim", 10**9, "1,000,000"),
        ("char_cnn.embedding.dim", 10**9, "1,000,000"),
        ("lstm.n_layers", 10**6, "100"),
        ("char_cnn.n_highway", 10**7, "100"),
        ("lstm.dim", "BIG", "1,000,000"),  # a C++ TypeError before
    ],
    ids=[
        "n_characters",
        "max_chars",
        "dim",
        "projection_dim",
        "char_dim",
        "n_layers",
        "n_highway",
        "401_digits",
    ],
)
def test_a_size_above_its_ceiling_is_refused_before_building(tmp_path, capsys, field, value, ceiling):
    options = _options_file(tmp_path, {field: value})
    start = time.perf_counter()
    error = _embed(tmp_path, options, capsys)
    assert time.perf_counter() - start < 10  # nothing was built (n_layers 10^6 took 45-80 s)
    shown = "an integer of 401 digits" if value == "BIG" else f"{value:,}"
    assert error == f"{options}: {field} must be at most {ceiling}, got {shown}"


@pytest.mark.parametrize(
    "filters, message",
    [
        ([[1, 10**9]], "a filter count in char_cnn.filters must be at most 1,000,000, got 1,000,000,000"),
        (
            [[1, 600_000], [2, 600_000]],
            "the filter counts of char_cnn.filters together must be at most 1,000,000, got 1,200,000",
        ),
        ([[1, 1]] * 100_000, "char_cnn.filters must have at most 100 [width, n_filters] pairs, got 100,000"),
    ],
    ids=["one_count", "together", "100000_widths"],
)
def test_filters_are_bounded_one_by_one_in_number_and_together(tmp_path, capsys, filters, message):
    options = _options_file(tmp_path, {"char_cnn.filters": filters, "lstm.projection_dim": 1})
    start = time.perf_counter()
    assert _embed(tmp_path, options, capsys) == f"{options}: {message}"
    assert time.perf_counter() - start < 10


def test_a_clip_too_large_for_a_float_is_refused_in_one_line(tmp_path, capsys):
    options = _options_file(tmp_path, {"lstm.cell_clip": "BIG"})  # an OverflowError traceback before
    assert _embed(tmp_path, options, capsys) == (
        f"{options}: lstm.cell_clip must be a positive number (or absent for no clipping), "
        "got an integer of 401 digits"
    )


def test_a_model_larger_than_the_machine_is_refused_before_anything_is_allocated(tmp_path, capsys):
    """Every field within its ceiling, the whole too large for any machine (32 TB of LSTM)."""
    change = {"lstm.dim": 10**6, "lstm.projection_dim": 10**6, "char_cnn.filters": [[1, 10**6]]}
    options = _options_file(tmp_path, change)
    error = _embed(tmp_path, options, capsys)
    assert error.startswith(f"{options}: the model it describes has ")
    assert "parameters and needs at least " in error and "more than this machine's memory" in error
    from elmokit.base.bounds import SizeError

    with pytest.raises(SizeError, match="more than this machine's memory"):
        BiLM(BiLMOptions.from_dict(json.loads(options.read_text())))


def test_a_model_larger_than_the_address_space_limit_is_refused_in_one_line(tmp_path):
    """A 4 GB character embedding under `ulimit -v` of 3 GB (free memory is far larger): the
    process's limit, not the machine's free pages, bounds the model (an allocator traceback before)."""
    import resource
    import subprocess
    import sys

    options = _options_file(tmp_path, {"char_cnn.n_characters": 1_000_000, "char_cnn.embedding.dim": 1000})
    (tmp_path / "in.txt").write_text("the cat sat\n")
    limit = 3 * 10**9

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    command = [sys.executable, "-m", "elmokit", "embed", str(tmp_path / "in.txt"), str(tmp_path / "out.hdf5")]
    command += ["--options", str(options), "--weights", str(TINY / "lm_weights.hdf5"), "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=limited, timeout=120)
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip()
    assert "\n" not in error and error.startswith(f"elmokit: error: {options}: the model it describes has ")
    assert "more than this process's address-space limit set by ulimit -v (2.8 GiB)" in error
    assert not (tmp_path / "out.hdf5").exists()


def test_the_memory_limit_is_the_least_of_the_machine_cgroup_and_address_space(monkeypatch):
    from elmokit.base import bounds

    monkeypatch.setattr(bounds, "_physical_memory_bytes", lambda: 64 << 30)
    monkeypatch.setattr(bounds, "_cgroup_limit", lambda: (8 << 30, 1 << 30))
    monkeypatch.setattr(bounds, "_address_space_limit", lambda: None)
    assert bounds.memory_limit() == (8 << 30, "this process's cgroup memory limit")
    monkeypatch.setattr(bounds, "_address_space_limit", lambda: (4 << 30, 3 << 30))
    assert bounds.memory_limit() == (4 << 30, "this process's address-space limit set by ulimit -v")
    assert bounds.available_memory_bytes() <= 1 << 30  # what the address-space limit leaves


def test_cgroup_files_are_read_for_this_process_and_the_groups_above_it(tmp_path, monkeypatch):
    from elmokit.base import bounds

    real_read = bounds.Path.read_text
    cgroup = "4:memory:/jobs/one\n0::/jobs/one\n"
    monkeypatch.setattr(
        bounds.Path, "read_text", lambda self, *a, **k: cgroup if str(self) == "/proc/self/cgroup" else real_read(self)
    )
    files = [str(f) for f in bounds._cgroup_files("memory.max", "memory.limit_in_bytes")]
    assert files == [
        "/sys/fs/cgroup/memory/jobs/one/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/jobs/one/memory.max",
        "/sys/fs/cgroup/jobs/memory.max",
        "/sys/fs/cgroup/memory.max",
    ]
    (tmp_path / "max").write_text("max\n")
    (tmp_path / "limit").write_text("9223372036854771712\n")  # cgroup v1's "no limit"
    (tmp_path / "set").write_text("2147483648\n")
    assert [bounds._read_number(tmp_path / n) for n in ("max", "limit", "set", "absent")] == [
        None, None, 2 << 30, None
    ]


def test_a_mismatched_embedding_dim_is_refused_before_the_model_is_built(tmp_path, capsys, monkeypatch):
    """embedding.dim 1,000,000 against the tiny model's weights: the weight file's shapes are
    compared before the 1 GB character embedding is allocated (25 s and 1 GB before)."""
    from elmokit.model import bilm

    def not_built(self, *args, **kwargs):
        raise AssertionError("the model was built before its weight file's shapes were checked")

    monkeypatch.setattr(bilm.BiLM, "__init__", not_built)
    options = _options_file(tmp_path, {"char_cnn.embedding.dim": 1_000_000})
    assert _embed(tmp_path, options, capsys) == (
        f"{TINY / 'lm_weights.hdf5'}: dataset 'char_embed' has shape (261, 4) but the options imply "
        "(261, 1000000)"
    )


def test_the_char_cnn_shapes_computed_from_the_options_are_those_of_the_file_written():
    from elmokit.model.weights import char_cnn_file_shapes

    bilm = BiLM.load(TINY / "options.json", TINY / "lm_weights.hdf5")
    with h5py.File(TINY / "lm_weights.hdf5") as handle:
        for name, shape in char_cnn_file_shapes(bilm.options).items():
            assert handle[name].shape == shape, name


def test_the_parameter_count_is_that_of_the_modules_built():
    from elmokit.base.bounds import parameter_count

    for options in (BiLMOptions.from_dict(preset("tiny")), BiLM.load(*_tiny()).options):
        assert parameter_count(options) == sum(p.numel() for p in BiLM(options).parameters())
    for model in ("char-model", "word-model"):
        bilm = BiLM.from_pretrained(MANYLANGS / model)
        word = bilm.token_encoder.word_embedding
        shape = None if word is None else tuple(word.weight.shape)
        assert parameter_count(bilm.options, shape) == sum(p.numel() for p in bilm.parameters())


def _tiny() -> tuple[Path, Path]:
    return TINY / "options.json", TINY / "lm_weights.hdf5"


# -- 4: JSON that would crash the parser -----------------------------------------------------------
def test_deeply_nested_json_is_refused_in_one_line(tmp_path, capsys):
    options = _options_file(tmp_path, text="[" * 100_000 + "]" * 100_000)  # a RecursionError before
    assert _embed(tmp_path, options, capsys) == (
        f"{options}: JSON nested more than 32 deep; model settings nest a few levels"
    )


def test_an_integer_longer_than_python_reads_is_refused_in_one_line(tmp_path, capsys):
    options = _options_file(tmp_path, text='{"lstm": {"dim": ' + "7" * 5000 + "}}")
    assert (
        _embed(tmp_path, options, capsys)
        == f"{options}: holds an integer of 5,000 digits; no field takes one"
    )


# -- 5: messages that name the file and the cause ---------------------------------------------------
def test_options_in_utf16_or_latin1_are_named_with_the_cause(tmp_path, capsys):
    text = (TINY / "options.json").read_text().replace('"relu"', '"relu", "note": "caf\u00e9"')
    options = tmp_path / "options.json"
    options.write_bytes(text.encode("utf-16"))
    assert _embed(tmp_path, options, capsys) == f"{options}: UTF-16 or binary, not JSON in UTF-8"
    options.write_bytes(text.encode("latin-1"))
    error = _embed(tmp_path, options, capsys)
    assert error.startswith(f"{options}: not UTF-8 (byte ") and "0xe9: Latin-1" in error


def test_a_weight_file_given_as_options_is_named(tmp_path, capsys):
    weights = TINY / "lm_weights.hdf5"
    assert _embed(tmp_path, weights, capsys) == f"{weights}: an HDF5 file (a weight file?), not JSON"
    with pytest.raises(OptionsError, match="an HDF5 file"):
        BiLMOptions.from_file(weights)


def test_train_config_files_are_read_with_the_same_guards(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "c.txt").write_text("the cat sat\n")
    (tmp_path / "v.txt").write_text("<S>\n</S>\n<UNK>\nthe\ncat\nsat\n")
    code = main(
        ["train", "--train", str(tmp_path / "c.txt"), "--vocab", str(tmp_path / "v.txt")]
        + ["--save-dir", str(tmp_path / "run"), "--config", str(config), "--max-steps", "1"]
    )
    assert code == 2
    assert (
        capsys.readouterr().err.strip() == f"elmokit: error: {config}: JSON nested more than 32 deep; "
        "model settings nest a few levels"
    )


# -- 4: training batches --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "given, message",
    [
        (
            ["--batch-size", "1000000000"],
            "--batch-size 1,000,000,000 with --unroll-steps 20 and --n-negative-samples 8 needs at least ",
        ),
        (["--unroll-steps", "100000"], "--unroll-steps must be at most 1,000, got 100,000"),
        (
            ["--n-negative-samples", "1000000000"],
            "--batch-size 4 with --unroll-steps 20 and --n-negative-samples 1,000,000,000 needs at least ",
        ),
    ],
    ids=["batch_size", "unroll_steps", "negatives"],
)
def test_a_training_batch_that_cannot_fit_is_refused_before_the_run_starts(tmp_path, capsys, given, message):
    (tmp_path / "c.txt").write_text("the cat sat\nthe dog ran\n")
    (tmp_path / "v.txt").write_text("<S>\n</S>\n<UNK>\nthe\ncat\nsat\ndog\nran\n")
    run = tmp_path / "run"
    args = ["train", "--train", str(tmp_path / "c.txt"), "--vocab", str(tmp_path / "v.txt")]
    args += ["--save-dir", str(run), "--config", "tiny", "--max-steps", "1", "--batch-size", "4"]
    args += ["--n-negative-samples", "8", *given]
    start = time.perf_counter()
    code = main(args)
    error = capsys.readouterr().err.strip()
    assert code == 2, error
    assert time.perf_counter() - start < 10  # a MemoryError after 31 s before, or no first step
    assert error.startswith("elmokit: error: " + message) and "\n" not in error
    assert "lower --batch-size" in error or "unroll" in message
    assert not run.exists()


# -- 5: weight files with many objects --------------------------------------------------------------
def test_a_weight_file_of_many_empty_groups_is_refused_at_once(tmp_path):
    path = tmp_path / "weights.hdf5"
    shutil.copy(TINY / "lm_weights.hdf5", path)
    with h5py.File(path, "a") as handle:
        for k in range(10_000):  # elmokit.base.bounds.MAX_HDF5_OBJECTS
            handle.create_group(f"empty{k}")
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        open_hdf5(path)
    assert time.perf_counter() - start < 0.5
    assert str(err.value) == (
        f"{path}: holds more than 10,000 groups and datasets; a weight file holds one dataset per "
        "weight (under 2,000 for the largest model elmokit builds)"
    )
    with pytest.raises(ValueError, match="more than 10,000 groups"):
        BiLM.load(TINY / "options.json", path)


def test_the_largest_model_within_the_ceilings_has_fewer_objects_than_the_bound(tmp_path):
    """The most layers, highway layers and filter widths the ceilings allow: its weight file
    holds under 2,000 groups and datasets, and opens."""
    options = json.loads((TINY / "options.json").read_text())
    options["char_cnn"].update(filters=[[1, 1]] * 100, n_highway=100)
    options["lstm"].update(n_layers=100, dim=4, projection_dim=1)
    bilm = BiLM(options)
    bilm.save(tmp_path / "options.json", tmp_path / "weights.hdf5")
    names: list[str] = []
    with h5py.File(tmp_path / "weights.hdf5", "r") as handle:
        handle.visit(names.append)
    assert 1500 < len(names) < 2000
    BiLM.load(tmp_path / "options.json", tmp_path / "weights.hdf5")


# -- 5: ELMoForManyLangs' config_path -------------------------------------------------------------
def _manylangs_copy(parent: Path, config_path: str) -> Path:
    folder = parent / "char-model"
    shutil.copytree(MANYLANGS / "char-model", folder, ignore=shutil.ignore_patterns("reference.*"))
    settings = json.loads((folder / "config.json").read_text())
    settings["config_path"] = config_path
    (folder / "config.json").write_text(json.dumps(settings))
    return folder


def test_a_cached_model_reads_no_config_outside_its_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path / "cache"))
    outside = tmp_path / "elsewhere" / "private.json"  # any file on the machine
    outside.parent.mkdir()
    shutil.copy(MANYLANGS / "configs" / "tiny_char.json", outside)
    archive = tmp_path / "cache" / "archives" / "0123" / "unpacked"
    folder = _manylangs_copy(archive, str(outside))
    with pytest.raises(FileNotFoundError) as err:
        BiLM.from_pretrained(folder)
    assert f"elmokit reads no file outside the archive {archive}" in str(err.value)
    assert "\n" not in str(err.value)
    shutil.rmtree(folder)
    folder = _manylangs_copy(archive, "../../../../../elsewhere/private.json")  # a relative way out
    assert (folder / "../../../../../elsewhere/private.json").resolve() == outside.resolve()
    with pytest.raises(FileNotFoundError, match="outside the archive"):
        model_config_file(folder)

    # inside the archive (ELMoForManyLangs' configs/ beside the model folder): read
    shutil.copytree(MANYLANGS / "configs", archive / "configs")
    assert model_config_file(_manylangs_copy(archive / "x", "../../configs/tiny_char.json")) == (
        archive / "x" / "char-model" / "../../configs/tiny_char.json"
    )

    # a user's own folder keeps ELMoForManyLangs' lookup (documented)
    own = _manylangs_copy(tmp_path / "mine", str(outside))
    assert model_config_file(own) == outside and BiLM.from_pretrained(own).options.lstm.dim == 24


@pytest.mark.parametrize(
    "section, field, value, message",
    [
        ("encoder", "dim", 10**9, "encoder.dim must be at most 1,000,000, got 1,000,000,000"),
        ("encoder", "n_layers", 10**6, "encoder.n_layers must be at most 100, got 1,000,000"),
        (
            "token_embedder",
            "n_highway",
            10**7,
            "token_embedder.n_highway must be at most 100, got 10,000,000",
        ),
        (
            "token_embedder",
            "max_characters_per_token",
            10**9,
            "token_embedder.max_characters_per_token must be at most 1,000, got 1,000,000,000",
        ),
        (
            "token_embedder",
            "filters",
            [[1, 10**9]],
            "a filter count in token_embedder.filters must be at most 1,000,000, got 1,000,000,000",
        ),
        (
            "token_embedder",
            "word_dim",
            10**9,
            "token_embedder.word_dim must be at most 1,000,000, got 1,000,000,000",
        ),
    ],
    ids=["dim", "n_layers", "n_highway", "max_chars", "filters", "word_dim"],
)
def test_manylangs_configs_have_the_same_ceilings(tmp_path, section, field, value, message):
    config = json.loads((MANYLANGS / "configs" / "tiny_char.json").read_text())
    config[section][field] = value
    folder = _manylangs_copy(tmp_path, "tiny_char.json")
    (folder / "tiny_char.json").write_text(json.dumps(config))
    start = time.perf_counter()
    with pytest.raises(OptionsError) as err:
        BiLM.from_pretrained(folder)
    assert str(err.value) == f"{folder / 'tiny_char.json'}: {message}"
    assert time.perf_counter() - start < 10


def test_manylangs_char_ids_are_bounded(tmp_path):
    folder = _manylangs_copy(tmp_path, "../configs/tiny_char.json")
    shutil.copytree(MANYLANGS / "configs", tmp_path / "configs")
    with open(folder / "char.dic", "a", encoding="utf-8") as f:
        f.write("\u2603\t" + "9" * 30 + "\n")
    with pytest.raises(ManyLangsError) as err:
        BiLM.from_pretrained(folder)
    assert str(err.value) == (
        f"{folder / 'char.dic'}: the id of '\u2603' (an integer of 30 digits) is not below 2,000,000"
    )


# -- finite but huge weights -----------------------------------------------------------------------
@pytest.fixture
def huge_char_rows(tmp_path) -> Path:
    """The tiny model with character embedding rows at 3e38: finite, but float32 overflows."""
    folder = tmp_path / "huge"
    folder.mkdir()
    shutil.copy(TINY / "options.json", folder / "options.json")
    shutil.copy(TINY / "lm_weights.hdf5", folder / "weights.hdf5")
    with h5py.File(folder / "weights.hdf5", "r+") as f:
        rows = f["char_embed"][...]
        rows[100:130] = 3e38  # the letters' rows
        f["char_embed"][...] = rows
    return folder


@pytest.mark.parametrize("command", ["embed", "tokens"])
def test_finite_but_huge_weights_are_refused_naming_the_file_and_layer(
    tmp_path, huge_char_rows, capsys, command
):
    text = tmp_path / "in.txt"
    text.write_text("the cat sat .\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    quiet = ["--quiet"] if command == "embed" else []
    assert main([command, str(text), str(out), "--model", str(huge_char_rows), "--mode", "zero", *quiet]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"elmokit: error: the model {huge_char_rows / 'weights.hdf5'} gives vectors that are not finite "
        "(inf or NaN) from layer 0 (the token vectors of the character CNN) on; its weights are finite "
        "but too large for float32 arithmetic"
    ]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["huge", "in.txt"]


def test_the_first_layer_that_is_not_finite_is_named():
    import torch

    from elmokit.embed import Embedder

    embedder = Embedder(BiLM.load(TINY / "options.json", TINY / "lm_weights.hdf5"), device="cpu", mode="zero")
    layers = torch.zeros(3, 2, 4, embedder.dim)
    embedder._check_finite(layers)  # all finite: nothing said
    layers[2, 1, 3, 0] = float("nan")
    with pytest.raises(ValueError, match=r"lm_weights.hdf5 gives .* from layer 2 \(biLSTM layer 2\) on"):
        embedder._check_finite(layers)
    layers[1, 0, 0, 5] = float("inf")
    with pytest.raises(ValueError, match=r"from layer 1 \(biLSTM layer 1\) on"):
        embedder._check_finite(layers)
