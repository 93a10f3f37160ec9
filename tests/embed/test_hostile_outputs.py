"""Nothing lost, nothing clobbered: one output policy for every command that writes
(``atomic.check_output``), and one-line messages where a traceback or a wrong figure came out.

No test touches the real /dev/null: pipes and links are made in tmp_path, and each test checks
with os.lstat and the target's bytes that nothing was replaced."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

import elmokit
from elmokit.base.atomic import atomic_path, check_output
from elmokit.cli import main
from elmokit.compat import AllenNLPConflictError, install_allennlp_modules, uninstall_allennlp_modules
from elmokit.lm.softmax import Softmax
from elmokit.lm.vocabulary import Vocabulary
from elmokit.model.bilm import BiLM
from elmokit.model.weights import save_softmax
from elmokit.training.data import count_tokens

from ..conftest import TINY

SRC = Path(elmokit.__file__).resolve().parents[1]  # the package under test, for subprocesses
TINY_MODEL = ["--model", "elmo-tiny-reference"]


def _error_line(err: str) -> str:
    """The one line of stderr, after checking that every line is elmokit's own (no traceback)."""
    lines = err.strip().splitlines()
    assert lines and all(line.startswith("elmokit: ") for line in lines), err
    return lines[-1]


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _is_fifo(path: Path) -> bool:
    return stat.S_ISFIFO(os.lstat(path).st_mode)


@pytest.fixture
def text(tmp_path) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("the cat sat .\nthe dog sat .\n", encoding="utf-8")
    return path


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file that a link points to: its bytes must survive every refused write."""
    path = tmp_path / "victim.txt"
    path.write_text("precious\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """An exported model folder with a softmax (the tiny reference biLM, a small vocabulary)."""
    folder = tmp_path_factory.mktemp("hostile-model")
    bilm = BiLM.load(TINY / "options.json", TINY / "lm_weights.hdf5")
    bilm.save(folder / "options.json", folder / "weights.hdf5")
    vocab = Vocabulary.build(Counter("the cat sat on the mat .".split()))
    vocab.save(folder / "vocab.txt")
    softmax = Softmax(len(vocab), bilm.options.lstm.projection_dim)
    save_softmax(softmax, folder / "softmax.hdf5")
    return folder


# -- the policy itself -------------------------------------------------------------------------
def test_atomic_path_never_renames_over_a_pipe_or_a_link(tmp_path, victim):
    fifo = _fifo(tmp_path / "pipe")
    with pytest.raises(FileExistsError, match=r"pipe is a named pipe \(FIFO\), not a regular file"):
        with atomic_path(fifo, overwrite=True) as tmp:
            tmp.write_text("new")
    assert _is_fifo(fifo)
    link = tmp_path / "link"
    with pytest.raises(FileExistsError, match="link is a symbolic link"):
        with atomic_path(link, overwrite=True) as tmp:
            tmp.write_text("new")
            link.symlink_to(victim)  # appears while the file is written
    assert link.is_symlink() and victim.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "pipe", "victim.txt"]  # no temporary


def test_check_output_refuses_inputs_under_any_name(tmp_path, text):
    os.link(text, tmp_path / "hard.txt")
    for output in (text, tmp_path / "hard.txt", tmp_path / "sub" / ".." / "in.txt"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        with pytest.raises(ValueError, match=f"is the input file {text}"):
            check_output(output, overwrite=True, inputs=["-", tmp_path / "missing", text])
    assert check_output(tmp_path / "new.txt", inputs=[text]) == tmp_path / "new.txt"


# -- embed, tokens, elmo: HDF5 outputs ---------------------------------------------------------
@pytest.mark.parametrize("command", ["embed", "tokens"])
def test_embed_and_tokens_refuse_a_pipe_and_a_link_even_with_overwrite(
    tmp_path, text, victim, capsys, command
):
    fifo = _fifo(tmp_path / "out.fifo")
    link = tmp_path / "out.hdf5"
    link.symlink_to(victim)
    for output, kind in ((fifo, "a named pipe (FIFO)"), (link, "a symbolic link")):
        assert main([command, str(text), str(output), "--overwrite", *TINY_MODEL]) == 2
        assert f"output {output} is {kind}, not a regular file" in _error_line(capsys.readouterr().err)
    assert _is_fifo(fifo) and link.is_symlink() and victim.read_text() == "precious\n"


def test_elmo_keeps_allennlps_overwrite_but_never_of_its_input_a_pipe_or_a_link(
    tmp_path, text, victim, capsys
):
    original = text.read_bytes()
    os.link(text, tmp_path / "hard.txt")
    fifo = _fifo(tmp_path / "out.fifo")
    link = tmp_path / "link.hdf5"
    link.symlink_to(victim)
    model = ["--options-file", str(TINY / "options.json"), "--weight-file", str(TINY / "lm_weights.hdf5")]
    for output, cause in (
        (text, f"is the input file {text}"),
        (tmp_path / "hard.txt", f"is the input file {text}"),
        (fifo, r"is a named pipe (FIFO), not a regular file"),
        (link, "is a symbolic link, not a regular file"),
    ):
        assert main(["elmo", str(text), str(output), "--all", *model]) == 2
        assert cause in _error_line(capsys.readouterr().err)
    assert text.read_bytes() == original and _is_fifo(fifo) and victim.read_text() == "precious\n"
    existing = tmp_path / "old.hdf5"
    existing.write_bytes(b"an older result")
    assert main(["elmo", str(text), str(existing), "--top", *model]) == 0  # AllenNLP's overwrite
    assert existing.read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"


# -- a command never writes over the model it has just read ------------------------------------
@pytest.fixture
def model_copy(tmp_path, model_dir) -> Path:
    """A copy of the model with a softmax, in a folder of the test's own: m/ (and m.zip)."""
    folder = tmp_path / "m"
    folder.mkdir()
    for name in ("options.json", "weights.hdf5", "vocab.txt", "softmax.hdf5"):
        (folder / name).write_bytes((model_dir / name).read_bytes())
    import zipfile

    with zipfile.ZipFile(tmp_path / "m.zip", "w") as archive:
        for name in ("options.json", "weights.hdf5"):
            archive.write(folder / name, name)
    return folder


def _digests(*paths: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in paths}


def _refused_as_input(argv: list[str], output: Path, capsys) -> None:
    assert main(argv) == 2
    line = _error_line(capsys.readouterr().err)
    assert line.startswith("elmokit: error: ") and f"output {output} is the input file" in line, line


@pytest.mark.parametrize(
    "case",
    [
        "elmo weights (no flag needed)",
        "embed weights",
        "embed options",
        "embed hard link of the weights",
        "tokens weights",
        "score -o softmax",
        "score -o vocab",
        "probe --json options",
    ],
)
def test_a_command_never_writes_over_the_model_it_read(tmp_path, text, model_copy, capsys, case):
    m = model_copy
    before = _digests(*sorted(m.iterdir()))
    os.link(m / "weights.hdf5", tmp_path / "other-name.hdf5")
    conll = str(Path(__file__).parents[1] / "fixtures" / "conll2003-tiny" / "train.txt")
    s = str(text)
    argv, output = {
        "elmo weights (no flag needed)": (
            ["elmo", s, f"{m}/weights.hdf5", "--all", "--options-file", f"{m}/options.json"]
            + ["--weight-file", f"{m}/weights.hdf5"],
            m / "weights.hdf5",
        ),
        "embed weights": (
            ["embed", s, f"{m}/weights.hdf5", "--model", str(m), "--overwrite"],
            m / "weights.hdf5",
        ),
        "embed options": (
            ["embed", s, f"{m}/options.json", "--model", str(m), "--overwrite"],
            m / "options.json",
        ),
        "embed hard link of the weights": (
            ["embed", s, str(tmp_path / "other-name.hdf5"), "--model", str(m), "--overwrite"],
            tmp_path / "other-name.hdf5",
        ),
        "tokens weights": (
            ["tokens", s, f"{m}/weights.hdf5", "--model", str(m), "--overwrite"],
            m / "weights.hdf5",
        ),
        "score -o softmax": (
            ["score", s, "-o", f"{m}/softmax.hdf5", "--model", str(m), "--overwrite", "--device", "cpu"],
            m / "softmax.hdf5",
        ),
        "score -o vocab": (
            ["score", s, "-o", f"{m}/vocab.txt", "--model", str(m), "--overwrite", "--device", "cpu"],
            m / "vocab.txt",
        ),
        "probe --json options": (
            ["probe", "--model", str(m), "--train", conll, "--test", conll, "--column", "3"]
            + ["--json", f"{m}/options.json", "--overwrite"],
            m / "options.json",
        ),
    }[case]
    _refused_as_input(argv, output, capsys)
    assert _digests(*sorted(m.iterdir())) == before
    assert sorted(p.name for p in m.iterdir()) == [
        "options.json",
        "softmax.hdf5",
        "vocab.txt",
        "weights.hdf5",
    ]


def test_embed_never_writes_over_the_shipped_model_it_read(tmp_path, text, monkeypatch, capsys):
    """``embed s.txt <the package>/models/elmo-tiny-reference/weights.hdf5 --model
    elmo-tiny-reference --overwrite``, on a copy of the package's models folder (so that a
    failure cannot break the package under test)."""
    import elmokit.hub.resolve
    import elmokit.hub.shipped

    shipped = Path(elmokit.hub.shipped.MODELS_DIR) / "elmo-tiny-reference"
    models = tmp_path / "models"
    (models / "elmo-tiny-reference").mkdir(parents=True)
    for name in ("options.json", "weights.hdf5"):
        (models / "elmo-tiny-reference" / name).write_bytes((shipped / name).read_bytes())
    monkeypatch.setattr(elmokit.hub.shipped, "MODELS_DIR", models)
    monkeypatch.setattr(elmokit.hub.resolve, "MODELS_DIR", models)
    weights = models / "elmo-tiny-reference" / "weights.hdf5"
    before = weights.read_bytes()
    _refused_as_input(["embed", str(text), str(weights), *TINY_MODEL, "--overwrite"], weights, capsys)
    assert weights.read_bytes() == before


def test_embed_says_the_output_exists_before_it_reads_the_model(tmp_path, text, capsys, monkeypatch):
    import elmokit.model.bilm

    def no_model(*args, **kwargs):
        raise AssertionError("the model was read before the output was checked")

    monkeypatch.setattr(elmokit.model.bilm.BiLM, "from_pretrained", no_model)
    out = tmp_path / "out.hdf5"
    out.write_bytes(b"mine")
    for command in ("embed", "tokens"):
        assert main([command, str(text), str(out), *TINY_MODEL]) == 2
        assert f"{out} exists" in _error_line(capsys.readouterr().err)
    assert out.read_bytes() == b"mine"


def test_export_onnx_never_writes_over_its_model_nor_its_archive(tmp_path, model_copy, capsys):
    pytest.importorskip("onnx")
    m, archive = model_copy, tmp_path / "m.zip"
    os.link(archive, tmp_path / "same.zip")
    before = _digests(m / "weights.hdf5", archive)
    _refused_as_input(["export-onnx", str(m), f"{m}/weights.hdf5", "--overwrite"], m / "weights.hdf5", capsys)
    for argv in (
        ["export-onnx", str(archive), str(archive)],
        ["export-onnx", str(archive), str(archive), "--overwrite"],
    ):
        assert main(argv) == 2
        assert f"output {archive} is the input file" in _error_line(capsys.readouterr().err)
    # the archive under another name: known from the model's own files (its archive)
    same = tmp_path / "same.zip"
    _refused_as_input(["export-onnx", str(archive), str(same), "--overwrite"], same, capsys)
    assert _digests(m / "weights.hdf5", archive) == before


def test_the_files_a_model_was_read_from_are_its_inputs(tmp_path, text, model_copy):
    from elmokit.embed import Embedder
    from elmokit.hub import resolve_model
    from elmokit.lm.language_model import LanguageModel

    m, archive = model_copy, tmp_path / "m.zip"
    files = {p.name for p in resolve_model(str(m)).input_files()}
    assert files == {"options.json", "weights.hdf5", "vocab.txt", "softmax.hdf5"}
    assert archive in resolve_model(str(archive)).input_files()
    assert archive in BiLM.from_pretrained(str(archive)).source_files
    assert set(LanguageModel.from_pretrained(str(m), device="cpu").source_files) == {m / n for n in files}
    embedder = Embedder(str(m), device="cpu", mode="zero")
    before = (m / "weights.hdf5").read_bytes()
    with pytest.raises(ValueError, match="is the input file"):
        embedder.embed_file(text, m / "weights.hdf5", overwrite=True, progress=False)
    with pytest.raises(ValueError, match="is the input file"):
        embedder.embed_tokens_file(text, m / "options.json", overwrite=True)
    assert (m / "weights.hdf5").read_bytes() == before


# -- a full disk: one line, nothing left behind -------------------------------------------------
def _with_file_size_limit(limit: int):
    """A subprocess's ``preexec_fn``: writes past ``limit`` bytes of a file fail with EFBIG (as
    on a full disk, ENOSPC), SIGXFSZ ignored so that the writer sees the error."""
    import resource
    import signal

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limited


def _elmokit_limited(args: list, limit: int, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "ELMOKIT_OFFLINE": "1"}
    argv = [sys.executable, "-m", "elmokit", *map(str, args)]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
        preexec_fn=_with_file_size_limit(limit),
    )


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", ["embed", "embed --pooling mean", "tokens", "elmo"])
def test_a_full_disk_while_embedding_is_one_line_and_leaves_nothing(tmp_path, command):
    sentences = tmp_path / "in.txt"
    sentences.write_text("".join(f"the cat sat on mat number {i} .\n" for i in range(300)), encoding="utf-8")
    name, *options = command.split()
    model = ["--options-file", TINY / "options.json", "--weight-file", TINY / "lm_weights.hdf5", "--all"]
    model = model if name == "elmo" else TINY_MODEL
    args = [name, sentences, "out.hdf5", *model, *options]
    if name == "embed":
        args += ["--quiet", "--mode", "zero"]
    before = _listing(tmp_path)
    done = _elmokit_limited(args, 20_000, tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    line = _error_line(done.stderr)
    assert line == (
        "elmokit: error: out.hdf5 was not written: the file is larger than this process may write "
        "(File too large); no partial file was left"
    ), done.stderr[-2000:]
    assert _listing(tmp_path) == before  # no temporary file, no output


@pytest.fixture(scope="module")
def big_softmax_model(tmp_path_factory) -> Path:
    """An exported model whose softmax (20,003 words) is three times the size of its weights."""
    from elmokit.lm.language_model import LanguageModel
    from elmokit.model.weights import save_options, save_weights

    folder = tmp_path_factory.mktemp("big-softmax")
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", *(f"w{i}" for i in range(20_000))])
    model = LanguageModel(json.loads((TINY / "options.json").read_text()), len(vocab), dropout=0.0)
    save_options(model.bilm.options, folder / "options.json")
    save_weights(model.bilm, folder / "weights.hdf5")
    assert model.softmax is not None
    save_softmax(model.softmax, folder / "softmax.hdf5")
    vocab.save(folder / "vocab.txt")
    assert (folder / "softmax.hdf5").stat().st_size > 2 * (folder / "weights.hdf5").stat().st_size
    return folder


def test_a_full_disk_during_export_leaves_no_partial_model_folder(tmp_path, big_softmax_model):
    limit = (big_softmax_model / "weights.hdf5").stat().st_size + 50_000  # the weights fit, not the softmax
    done = _elmokit_limited(["export", big_softmax_model, "new"], limit, tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert _error_line(done.stderr) == (
        "elmokit: error: new/softmax.hdf5 was not written: the file is larger than this process may "
        "write (File too large); no partial file was left"
    )
    assert not (tmp_path / "new").exists()  # the folder it made is gone
    old = tmp_path / "old"
    old.mkdir()
    (old / "options.json").write_text("mine", encoding="utf-8")
    (old / "notes.txt").write_text("kept", encoding="utf-8")
    before = _listing(old)
    done = _elmokit_limited(["export", big_softmax_model, "old", "--overwrite"], limit, tmp_path)
    assert done.returncode == 2 and "old/softmax.hdf5 was not written" in _error_line(done.stderr)
    assert _listing(old) == before and sorted(p.name for p in old.iterdir()) == ["notes.txt", "options.json"]


def test_a_failed_export_leaves_no_empty_folder(tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    assert "missing" in _error_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()
    (tmp_path / "kept").mkdir()
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "kept" / "new" / "deeper" / "out")]) == 2
    assert "missing" in _error_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"] and not any((tmp_path / "kept").iterdir())


def test_a_task_that_fails_on_its_data_leaves_no_folder_it_made(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    data = [f"--{split}={empty}" for split in ("train", "dev", "test")]
    out = tmp_path / "runs" / "ner" / "first"
    assert main(["task", "ner", "--no-elmo", "--quiet", "--out", str(out), *data]) == 2
    assert "at least one sentence" in _error_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]


def test_a_full_disk_during_a_task_leaves_no_prediction_files(tmp_path):
    pytest.importorskip("seqeval")  # NER's scorer (the tasks extra)
    data = {s: _ner_file(tmp_path / f"{s}.txt") for s in ("train", "dev", "test")}
    args = ["task", "ner", "--no-elmo", "--epochs", "1", "--hidden", "4", "--quiet", "--out", "run"]
    args += [f"--{s}={path}" for s, path in data.items()]
    done = _elmokit_limited(args, 5_000, tmp_path)  # the predictions fit, the model does not
    assert done.returncode == 2, done.stderr[-2000:]
    assert _error_line(done.stderr) == (
        "elmokit: error: the results in run were not written: the file is larger than this process "
        "may write (File too large); nothing was left"
    )
    assert not (tmp_path / "run").exists()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").write_text("{}", encoding="utf-8")
    done = _elmokit_limited([*args, "--overwrite"], 5_000, tmp_path)
    assert done.returncode == 2 and "run is as it was" in _error_line(done.stderr)
    assert _listing(tmp_path / "run") == {"metrics.json": b"{}"}


# -- score: a streaming output ------------------------------------------------------------------
def test_score_writes_into_a_fifo_without_replacing_it(tmp_path, text, model_dir, capsys):
    fifo = _fifo(tmp_path / "scores.fifo")
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text(encoding="utf-8")))
    reader.start()
    argv = ["score", str(text), "-o", str(fifo), "--model", str(model_dir), "--device", "cpu", "--quiet"]
    try:
        assert main(argv) == 0
    finally:
        if reader.is_alive():  # the command never opened the pipe: let the reader end
            with open(fifo, "w"):
                pass
        reader.join()
    assert _is_fifo(fifo)
    lines = [json.loads(line) for line in received[0].splitlines()]
    assert [line["line"] for line in lines] == [1, 2]


def test_score_refuses_a_link_and_its_input_even_with_overwrite(tmp_path, text, victim, model_dir, capsys):
    link = tmp_path / "scores.jsonl"
    link.symlink_to(victim)
    common = ["--model", str(model_dir), "--device", "cpu", "--quiet", "--overwrite"]
    assert main(["score", str(text), "-o", str(link), *common]) == 2
    assert f"output {link} is a symbolic link" in _error_line(capsys.readouterr().err)
    assert main(["score", str(text), "-o", str(text), *common]) == 2
    assert f"is the input file {text}" in _error_line(capsys.readouterr().err)
    assert victim.read_text() == "precious\n" and text.read_text().startswith("the cat sat .")


def test_score_to_dev_stdout_writes_standard_output(tmp_path, text, model_dir):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    argv = [sys.executable, "-m", "elmokit.cli", "score", str(text), "-o", "/dev/stdout"]
    argv += ["--model", str(model_dir), "--device", "cpu", "--quiet"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["line"] for line in done.stdout.splitlines()] == [1, 2]


def test_score_of_a_blank_file_says_the_perplexity_is_undefined(tmp_path, model_dir, capsys):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n", encoding="utf-8")
    assert main(["score", str(blank), "--model", str(model_dir), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "perplexity is undefined" in err and "1.00" not in err


# -- vocab, evaluate --json, export, task: outputs that were replaced silently -------------------
def test_vocab_never_replaces_its_corpus_and_asks_before_replacing_a_file(tmp_path, text, capsys):
    original = text.read_bytes()
    assert main(["vocab", str(text), "-o", str(text)]) == 2
    assert f"is the input file {text}" in _error_line(capsys.readouterr().err)
    assert text.read_bytes() == original
    out = tmp_path / "vocab.txt"
    out.write_text("mine\n", encoding="utf-8")
    assert main(["vocab", str(text), "-o", str(out)]) == 2
    assert f"{out} exists" in _error_line(capsys.readouterr().err)
    assert out.read_text() == "mine\n"
    assert main(["vocab", str(text), "-o", str(out), "--overwrite"]) == 0
    assert out.read_text(encoding="utf-8").splitlines()[:4] == ["<S>", "</S>", "<UNK>", "."]


def test_evaluate_json_never_replaces_the_held_out_text_nor_an_existing_file(
    tmp_path, text, model_dir, capsys
):
    original = text.read_bytes()
    base = ["evaluate", str(model_dir), "--heldout", str(text), "--quiet", "--batch-size", "1"]
    assert main([*base, "--json", str(text)]) == 2
    assert f"is the input file {text}" in _error_line(capsys.readouterr().err)
    assert text.read_bytes() == original
    result = tmp_path / "result.json"
    result.write_text("{}", encoding="utf-8")
    assert main([*base, "--json", str(result)]) == 2
    assert f"{result} exists" in _error_line(capsys.readouterr().err)
    assert result.read_text() == "{}"
    assert main([*base, "--json", str(result), "--overwrite"]) == 0
    assert json.loads(result.read_text())["tokens"] > 0


def test_export_never_replaces_its_input_nor_files_in_out_without_overwrite(tmp_path, model_dir, capsys):
    vocab = (model_dir / "vocab.txt").read_bytes()
    assert main(["export", str(model_dir), str(model_dir)]) == 2
    assert "is the input file" in _error_line(capsys.readouterr().err)
    out = tmp_path / "out"
    out.mkdir()
    (out / "options.json").write_text("mine", encoding="utf-8")
    assert main(["export", str(model_dir), str(out)]) == 2
    assert f"{out / 'options.json'} exists" in _error_line(capsys.readouterr().err)
    assert (out / "options.json").read_text() == "mine" and (model_dir / "vocab.txt").read_bytes() == vocab


def _ner_file(path: Path) -> str:
    path.write_text("EU I-ORG\nrejects O\n\nPeter I-PER\nsmiles O\n", encoding="utf-8")
    return str(path)


def test_task_checks_its_outputs_before_the_work(tmp_path, capsys):
    data = {s: _ner_file(tmp_path / f"{s}.txt") for s in ("train", "dev", "test")}
    out = tmp_path / "run"
    out.mkdir()
    (out / "dev.predictions.txt").symlink_to(data["train"])
    argv = ["task", "ner", "--no-elmo", "--epochs", "1", "--hidden", "4", "--quiet", "--out", str(out)]
    argv += [f"--{s}={path}" for s, path in data.items()]
    assert main(argv) == 2
    assert f"is the input file {data['train']}" in _error_line(capsys.readouterr().err)
    assert Path(data["train"]).read_text().startswith("EU I-ORG") and not (out / "metrics.json").exists()
    (out / "dev.predictions.txt").unlink()
    (out / "metrics.json").write_text("{}", encoding="utf-8")
    assert main(argv) == 2
    assert f"{out / 'metrics.json'} exists" in _error_line(capsys.readouterr().err)
    assert (out / "metrics.json").read_text() == "{}"


def test_task_threads_below_zero_is_one_line(tmp_path, capsys):
    argv = [
        "task",
        "ner",
        "--train",
        "a",
        "--dev",
        "b",
        "--test",
        "c",
        "--out",
        str(tmp_path),
        "--threads",
        "-1",
    ]
    assert main(argv) == 2
    assert "threads must be at least 0" in _error_line(capsys.readouterr().err)


# -- one-line messages ---------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["embed", "score"])
def test_reading_a_closed_standard_input_is_one_line(tmp_path, monkeypatch, capsys, model_dir, command):
    monkeypatch.setattr(sys, "stdin", None)  # what Python gives a process started with <&-
    model = TINY_MODEL if command == "embed" else ["--model", str(model_dir), "--device", "cpu"]
    out = tmp_path / "out"
    argv = [command, "-", *(["-o"] if command == "score" else []), str(out), *model, "--quiet"]
    assert main(argv) == 2
    assert "standard input is closed" in _error_line(capsys.readouterr().err)
    assert not out.exists()


def test_a_failed_nproc_run_prints_only_elmokits_lines(tmp_path, text):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    # a model that is missing is refused before any process starts
    argv = [sys.executable, "-m", "elmokit.cli", "embed", str(text), str(tmp_path / "out.hdf5")]
    argv += ["--nproc", "2", "--model", str(tmp_path / "missing"), "--device", "cpu"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [_error_line(done.stderr)]
    assert _error_line(done.stderr).startswith("elmokit: error: no model folder, archive or known model")
    # a worker that fails: one line naming it and its cause, nothing from torch
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a b\n" * 20 + b"broken \xff line\n")
    argv = [sys.executable, "-m", "elmokit.cli", "embed", str(bad), str(tmp_path / "out.hdf5"), "--quiet"]
    argv += ["--nproc", "2", "--model", "elmo-tiny-reference", "--device", "cpu", "--mode", "zero"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [_error_line(done.stderr)], done.stderr
    assert re.match(r"elmokit: error: embed process [01] failed: ", _error_line(done.stderr))
    assert _error_line(done.stderr).endswith(
        f"line 21 is not valid UTF-8 (invalid start byte); {tmp_path / 'out.hdf5'} was not written"
    )
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".") or p.suffix == ".hdf5"]


def test_corpora_and_vocabularies_drop_a_byte_order_mark(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes("\ufeffthe cat\nthe\n".encode())
    assert count_tokens([str(corpus)]) == Counter({"the": 2, "cat": 1})
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes("\ufeff<S>\n</S>\n<UNK>\nthe\n".encode())
    assert Vocabulary.from_file(vocab).tokens[:4] == ["<S>", "</S>", "<UNK>", "the"]


# -- install_allennlp_modules --------------------------------------------------------------------
@pytest.fixture
def allennlp_hook():
    try:
        yield
    finally:
        uninstall_allennlp_modules()
        for name in [n for n in sys.modules if n == "allennlp" or n.startswith("allennlp.")]:
            del sys.modules[name]
        importlib.invalidate_caches()


def test_a_data_folder_named_allennlp_is_not_a_real_allennlp(tmp_path, monkeypatch, allennlp_hook):
    (tmp_path / "allennlp").mkdir()
    (tmp_path / "allennlp" / "data.csv").write_text("a,b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    install_allennlp_modules()
    import allennlp.modules.elmo

    assert allennlp.modules.elmo.batch_to_ids is not None
    assert importlib.util.find_spec("allennlp.data.fields") is None  # not provided: not found, no error


def test_a_real_allennlp_added_later_is_refused_not_shadowed(tmp_path, monkeypatch, allennlp_hook):
    install_allennlp_modules()
    (tmp_path / "allennlp").mkdir()
    (tmp_path / "allennlp" / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.raises(AllenNLPConflictError, match=r"a real allennlp is importable \(.*__init__.py\)"):
        import allennlp  # noqa: F401
    assert not hasattr(sys.modules.get("allennlp"), "__elmokit_compat__")


# -- smaller edges: each one line that says what is wrong ----------------------------------------
def test_a_truncated_zip_is_called_what_it_is(tmp_path, text, capsys):
    import zipfile

    archive = tmp_path / "m.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(TINY / "options.json", "options.json")
        z.write(TINY / "lm_weights.hdf5", "weights.hdf5")
    cut = tmp_path / "cut.zip"
    cut.write_bytes(archive.read_bytes()[:200_000])
    assert main(["embed", str(text), str(tmp_path / "out.hdf5"), "--model", str(cut), "--quiet"]) == 2
    assert _error_line(capsys.readouterr().err) == (
        f"elmokit: error: {cut} is a .zip archive cut short or damaged (its end, the central directory, "
        "is missing or unreadable): copy or download it again"
    )


def test_embedding_what_is_not_a_tokenized_sentence_says_what_was_expected(tmp_path):
    from elmokit.embed import Embedder

    embedder = Embedder(BiLM.load(TINY / "options.json", TINY / "lm_weights.hdf5"), device="cpu", mode="zero")
    with pytest.raises(TypeError, match=r"^embed_sentence takes one tokenized sentence, .* got NoneType$"):
        embedder.embed_sentence(None)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"^sentence 0 is int, not a list of tokens; expected a list of sentences"
    ):
        list(embedder.embed_sentences([1, 2]))  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"^sentence 1 is a str, not a list of tokens; split it first"):
        list(embedder.embed_sentences([["a"], "b c"]))
    with pytest.raises(OSError, match=r"^cannot read the input file /proc/self/mem: Input/output error$"):
        embedder.embed_file("/proc/self/mem", tmp_path / "out.hdf5", progress=False)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["2", "offline", "ture"])
def test_an_unknown_elmokit_offline_value_is_refused_not_read_as_online(monkeypatch, capsys, value):
    from elmokit.hub.cache import offline

    monkeypatch.setenv("ELMOKIT_OFFLINE", value)
    with pytest.raises(ValueError, match=rf"^ELMOKIT_OFFLINE='{value}' is neither 1, true, yes, on"):
        offline()
    assert main(["download", "elmo-small", "--quiet"]) == 2
    assert f"ELMOKIT_OFFLINE='{value}' is neither" in _error_line(capsys.readouterr().err)
    for value, expected in (
        ("1", True),
        ("Yes", True),
        (" on ", True),
        ("0", False),
        ("off", False),
        ("", False),
    ):
        monkeypatch.setenv("ELMOKIT_OFFLINE", value)
        assert offline() is expected


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path):
    """`elmokit models | head -3`: the exit status of a command that SIGPIPE ended (141), as
    coreutils and git give, and nothing on stderr."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.Popen(
        [sys.executable, "-m", "elmokit", "models"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert done.stdout is not None and done.stderr is not None
    done.stdout.close()  # the reader is gone before the command writes
    err = done.stderr.read()
    assert done.wait(timeout=120) == 141 and err == b""
