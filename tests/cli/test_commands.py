from __future__ import annotations

import re

from elmokit.cli import main


def test_demo_ranks_held_out_contexts_per_layer(capsys):
    assert main(["demo", "--model", "elmo-tiny-reference", "-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "embedded 207 held-out news sentences containing 'bank'" in out
    assert out.count("layer 0 (char CNN, context-free): all 207 contexts score 1.000") == 2
    ranks = re.findall(r"layer (\d) \(biLSTM\): \d+% of the top 2 .*?contexts: ([\d, .]+)", out)
    assert [layer for layer, _ in ranks] == ["1", "2", "1", "2"]
    assert len(re.findall(r"^ +\d\.\d{3} \[(money|river|other)\] ", out, re.M)) == 8


def test_demo_reports_missing_model_folder(capsys, tmp_path):
    assert main(["demo", "--model", str(tmp_path / "missing")]) == 2
    assert "no model folder" in capsys.readouterr().err
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "options.json").write_text("{}")
    assert main(["demo", "--model", str(tmp_path / "m")]) == 2
    assert "has no weights.hdf5" in capsys.readouterr().err


# -- every bad input is one `elmokit: error: ...` line and a non-zero exit -----------------------

import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import h5py  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from ..conftest import TINY  # noqa: E402


def _error_line(err: str) -> str:
    """The last line of stderr, after checking that every line is elmokit's own (no traceback)."""
    lines = err.strip().splitlines()
    assert lines and all(line.startswith("elmokit: ") for line in lines), err
    return lines[-1]


@pytest.fixture
def text_file(tmp_path) -> str:
    path = tmp_path / "text.txt"
    path.write_text("the bank raised rates .\nthey sat on the bank .\n" * 40, encoding="utf-8")
    return str(path)


def _device_commands(text_file: str, tmp_path) -> dict[str, list[str]]:
    out = str(tmp_path / "out.hdf5")
    return {
        "embed": ["embed", text_file, out, "--model", "elmo-tiny-reference", "--quiet"],
        "tokens": ["tokens", text_file, out, "--model", "elmo-tiny-reference"],
        "evaluate": ["evaluate", "elmo-news-512", "--heldout", text_file, "--quiet"],
        "start-state": ["start-state", "elmo-tiny-reference", "--text", text_file, "--quiet"],
    }


@pytest.mark.parametrize("command", ["embed", "tokens", "evaluate", "start-state"])
@pytest.mark.parametrize(
    "device, message",
    [
        ("foo", "unknown device 'foo': use cpu, cuda or cuda:N"),
        ("cuda:x", "unknown device 'cuda:x': use cpu, cuda or cuda:N"),
        ("meta", "device 'meta' is not supported: use cpu, cuda or cuda:N"),
    ],
)
def test_bad_device_is_one_error_line(command, device, message, text_file, tmp_path, capsys):
    assert main([*_device_commands(text_file, tmp_path)[command], "--device", device]) == 2
    assert _error_line(capsys.readouterr().err) == f"elmokit: error: {message}"
    assert not (tmp_path / "out.hdf5").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("command", ["embed", "tokens", "evaluate", "start-state"])
@pytest.mark.parametrize("device", ["cuda", "cuda:7"])
def test_cuda_without_cuda_is_one_error_line(command, device, text_file, tmp_path, capsys):
    why = "this torch has no CUDA support" if torch.version.cuda is None else "no CUDA GPU was found"
    assert main([*_device_commands(text_file, tmp_path)[command], "--device", device]) == 2
    assert _error_line(capsys.readouterr().err) == (
        f"elmokit: error: device '{device}' is not available: {why}; use --device cpu"
    )


def test_a_gpu_index_the_machine_lacks_is_named(monkeypatch):
    from elmokit.base.devices import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(
        ValueError,
        match=r"^device 'cuda:7' does not exist: this machine has 1 CUDA GPU\(s\), cuda:0 to cuda:0$",
    ):
        resolve_device("cuda:7")


def test_folder_given_as_an_output_file_is_one_error_line(text_file, tmp_path, capsys):
    folder = tmp_path / "folder"
    folder.mkdir()
    for argv in (
        ["embed", text_file, str(folder), "--model", "elmo-tiny-reference", "--quiet"],
        ["embed", text_file, str(folder), "--model", "elmo-tiny-reference", "--quiet", "--overwrite"],
        ["tokens", text_file, str(folder), "--model", "elmo-tiny-reference"],
        ["evaluate", "elmo-news-512", "--heldout", text_file, "--json", str(folder)],
    ):
        assert main(argv) == 2
        expected = f"elmokit: error: output {folder} is a folder; give the path of a file to write"
        assert _error_line(capsys.readouterr().err) == expected
    assert main(["export", "elmo-news-512", text_file]) == 2
    assert _error_line(capsys.readouterr().err) == (
        f"elmokit: error: output {text_file} is a file; give a folder to write the model into"
    )
    assert main(["start-state", "elmo-tiny-reference", "--text", text_file, "--out", text_file]) == 2
    assert _error_line(capsys.readouterr().err) == (
        f"elmokit: error: {text_file} exists and is not an empty folder; give a new folder"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "text.txt"]
    assert list(folder.iterdir()) == []


@pytest.fixture
def shared_dir():
    """A folder that an unprivileged user can read (pytest's tmp_path is root's own)."""
    path = Path(tempfile.mkdtemp(prefix="elmokit-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run_unprivileged(argv: list[str]) -> subprocess.CompletedProcess:
    """The command line as a user who cannot write a read-only folder (root can: as root the
    command runs as nobody, through setpriv)."""
    command = [sys.executable, "-m", "elmokit.cli", *argv]
    if os.getuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot test a read-only folder")
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
        probe = subprocess.run([*command[:4], sys.executable, "-c", "import elmokit.cli"], capture_output=True)
        if probe.returncode != 0:  # e.g. a checkout or venv inside a folder only root may read
            pytest.skip("an unprivileged user cannot import this elmokit: cannot test a read-only folder")
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HOME": "/tmp"})


def test_read_only_output_folder_is_one_error_line(shared_dir):
    text = shared_dir / "text.txt"
    text.write_text("the bank raised rates .\n" * 80, encoding="utf-8")
    model = shared_dir / "model"
    shutil.copytree(TINY.parent.parent.parent / "src/elmokit/models/elmo-tiny-reference", model)
    read_only = shared_dir / "read-only"
    read_only.mkdir()
    for path in (text, model / "options.json", model / "weights.hdf5"):
        path.chmod(0o644)
    model.chmod(0o555)
    read_only.chmod(0o555)
    ro = str(read_only)
    cases = [
        (
            ["embed", str(text), f"{ro}/out.hdf5", "--model", str(model), "--quiet"],
            f"cannot write {ro}/out.hdf5: the folder {ro} is not writable",
        ),
        (
            ["tokens", str(text), f"{ro}/t.hdf5", "--model", str(model)],
            f"cannot write {ro}/t.hdf5: the folder {ro} is not writable",
        ),
        (
            ["evaluate", "elmo-news-512", "--heldout", str(text), "--json", f"{ro}/r.json"],
            f"cannot write {ro}/r.json: the folder {ro} is not writable",
        ),
        (["export", "elmo-news-512", ro], f"cannot write into {ro}: the folder is not writable"),
        (
            ["export", "elmo-news-512", f"{ro}/sub"],
            f"cannot make the output folder {ro}/sub: its parent is not writable",
        ),
        (
            ["start-state", str(model), "--text", str(text), "--out", f"{ro}/copy"],
            f"cannot make {ro}/copy: the folder {ro} is not writable",
        ),
        (
            ["start-state", str(model), "--text", str(text), "--write"],
            f"cannot write {model}/weights.hdf5: the folder {model} is not writable",
        ),
    ]
    for argv, message in cases:
        done = _run_unprivileged(argv)
        assert done.returncode == 2, (argv, done.stderr)
        assert _error_line(done.stderr) == f"elmokit: error: {message}", argv
    assert list(read_only.iterdir()) == []


def _broken_model(folder: Path, options_change=None, weights_bytes: bytes | None = None) -> str:
    folder.mkdir()
    options = json.loads((TINY / "options.json").read_text())
    if options_change:
        options_change(options)
    (folder / "options.json").write_text(json.dumps(options))
    (folder / "weights.hdf5").write_bytes(weights_bytes or (TINY / "lm_weights.hdf5").read_bytes())
    return str(folder)


def test_bad_model_files_are_one_error_line(text_file, tmp_path, capsys):
    out = str(tmp_path / "out.hdf5")
    null_dim = _broken_model(tmp_path / "null", lambda o: o["lstm"].update(dim=None))
    assert main(["embed", text_file, out, "--model", null_dim, "--quiet"]) == 2
    assert _error_line(capsys.readouterr().err) == (
        f"elmokit: error: {null_dim}/options.json: lstm.dim must be an integer of at least 1, got null"
    )
    data = bytearray((TINY / "lm_weights.hdf5").read_bytes())
    data[data.index(b"TREE", 1000)] ^= 0xFF
    damaged = _broken_model(tmp_path / "damaged", weights_bytes=bytes(data))
    assert main(["embed", text_file, out, "--model", damaged, "--quiet"]) == 2
    assert _error_line(capsys.readouterr().err).startswith(
        f"elmokit: error: {damaged}/weights.hdf5: damaged HDF5 file, it cannot be read ("
    )
    nan = _broken_model(tmp_path / "nan")
    with h5py.File(Path(nan) / "weights.hdf5", "a") as f:
        f["char_embed"][0, 0] = float("nan")
    assert main(["start-state", nan, "--text", text_file, "--quiet"]) == 2
    assert _error_line(capsys.readouterr().err) == (
        f"elmokit: error: {nan}/weights.hdf5: dataset 'char_embed' holds 1 non-finite values "
        "(NaN or infinity, or too large for float32)"
    )
    assert not Path(out).exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["start-state", "elmo-tiny-reference", "--text", "x", "--rows", "0"],
            "argument --rows: must be at least 1, got 0; see 'elmokit start-state --help'",
        ),
        (
            ["start-state", "elmo-tiny-reference", "--text", "x", "--sentences", "-5"],
            "argument --sentences: must be at least 1, got -5; see 'elmokit start-state --help'",
        ),
        (
            ["embed", "in", "out", "--batch-size", "0"],
            "argument --batch-size: must be at least 1, got 0; see 'elmokit embed --help'",
        ),
        (
            ["embed", "in", "out", "--max-tokens-per-batch", "two"],
            "argument --max-tokens-per-batch: not an integer: 'two'; see 'elmokit embed --help'",
        ),
        (
            ["evaluate", "m", "--heldout", "h", "--batch-size", "0"],
            "argument --batch-size: must be at least 1, got 0; see 'elmokit evaluate --help'",
        ),
        (["embed", "in"], "the following arguments are required: output; see 'elmokit embed --help'"),
    ],
)
def test_bad_option_values_are_one_error_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"elmokit: error: {message}\n"


def test_start_state_rows_are_checked_in_the_api_too(tiny_files):
    from elmokit import BiLM
    from elmokit.lm.start_state import estimate_start_state

    with pytest.raises(
        ValueError, match=r"^rows \(parallel streams\) must be an integer of at least 1, got 0$"
    ):
        estimate_start_state(BiLM.load(*tiny_files), [["a"]] * 10, rows=0)
