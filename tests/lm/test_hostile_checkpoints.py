"""Hostile tests of training save dirs: pointers, checkpoint files and what a run may delete.

One run (5 steps of the tiny preset, a checkpoint at every step, the newest 3 kept, held-out
perplexity at each) is trained once; every test damages a copy of it and checks that elmokit
refuses in one line that names the file and the cause, and that it deleted or changed nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from elmokit.lm.checkpoints import SaveFolder, load_checkpoint_file
from elmokit.lm.vocabulary import Vocabulary
from elmokit.training.data import count_tokens

from ..training.test_loop import TINY_RUN, cli, write_corpus

MANIFEST_FILE = "manifest.json"  # checkpoints.MANIFEST_FILE
NAMES = [f"checkpoint-00000000{s}" for s in (3, 4, 5)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A finished run: checkpoints 3, 4, 5 (5 the latest), best.json, held-out data."""
    from elmokit.cli import main

    root = tmp_path_factory.mktemp("hostile-checkpoints")
    corpus = write_corpus(root / "corpus")
    Vocabulary.build(count_tokens(corpus)).save(root / "vocab.txt")
    heldout = write_corpus(root / "heldout", n_sentences=300, n_files=1, seed=9)
    args = ["train", "--train", corpus, "--vocab", root / "vocab.txt", "--save-dir", root / "run", *TINY_RUN]
    args += ["--checkpoint-minutes", 0, "--max-steps", 5, "--keep-checkpoints", 3, "--heldout", heldout]
    assert main([str(a) for a in args]) == 0
    assert sorted(p.name for p in (root / "run").glob("checkpoint-*")) == NAMES
    return {"run": root / "run", "heldout": Path(heldout), "corpus": Path(corpus)}


@pytest.fixture()
def run(trained, tmp_path) -> Path:
    """A fresh copy of the trained run, for one test to damage."""
    return Path(shutil.copytree(trained["run"], tmp_path / "run"))


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(capsys, *args) -> str:
    """Run ``elmokit ARGS``, which must fail with exit status 2 and one line (besides a progress
    bar); that line."""
    code, out, err = cli(capsys, *args)
    lines = [line for line in err.replace("\r", "\n").strip().splitlines() if line and "%|" not in line]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("elmokit: error: "), (code, out, err)
    assert "Traceback" not in err
    return lines[0]


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


# -- 1. a damaged or missing pointer deletes nothing and names the checkpoints ----------------


@pytest.mark.parametrize("resume", [("--resume",), ()], ids=["resume", "fresh"])
def test_missing_latest_deletes_nothing_and_says_how_to_resume(run, trained, capsys, resume):
    (run / "latest").unlink()
    before = snapshot(run)
    start = () if resume else ("--train", trained["corpus"], "--vocab", run / "vocab.txt", *TINY_RUN)
    line = refused(capsys, "train", "--save-dir", run, *resume, *start, "--max-steps", 10)
    assert f"{run / 'latest'} is missing" in line
    assert f"{run} holds {', '.join(NAMES)}" in line and "--resume-from checkpoint-000000005" in line
    assert snapshot(run) == before


def test_missing_latest_without_heldout_keeps_every_checkpoint(run, capsys):
    """The repro of the issue without held-out data: nothing protected any checkpoint."""
    (run / "latest").unlink()
    (run / "best.json").unlink()
    before = snapshot(run)
    refused(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 10)
    assert snapshot(run) == before


@pytest.mark.parametrize("pointer", ["checkpoint-000000099", "../other/checkpoint-000000005", "ABSOLUTE"])
def test_dangling_or_outside_latest_is_refused(run, tmp_path, capsys, pointer):
    other = Path(shutil.copytree(run, tmp_path / "other"))
    if pointer == "ABSOLUTE":
        pointer = str(other / "checkpoint-000000005")
    (run / "latest").write_text(pointer + "\n")
    before, theirs = snapshot(run), snapshot(other)
    line = refused(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 10)
    assert f"{run / 'latest'} names" in line and "--resume-from checkpoint-000000005" in line
    line = refused(capsys, "export", run, tmp_path / "out")
    assert f"{run / 'latest'} names" in line and "--checkpoint checkpoint-000000005" in line
    assert snapshot(run) == before and snapshot(other) == theirs
    assert not (tmp_path / "out" / "weights.hdf5").exists()


def test_a_checkpoint_folder_that_links_outside_is_refused(run, tmp_path, capsys):
    other = Path(shutil.copytree(run, tmp_path / "other"))
    shutil.rmtree(run / "checkpoint-000000005")
    (run / "checkpoint-000000005").symlink_to(other / "checkpoint-000000005")
    before, theirs = snapshot(other), snapshot(run / "checkpoint-000000004")
    line = refused(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 7)
    assert "names checkpoint-000000005, which is a link" in line
    assert snapshot(other) == before and snapshot(run / "checkpoint-000000004") == theirs


def test_resume_from_a_named_checkpoint_continues_there(run, tmp_path, capsys):
    """--resume-from NAME implies --resume; a newer checkpoint, which the run would replace, must
    be moved away first; the best checkpoint being gone is no obstacle."""
    (run / "latest").unlink()
    before = snapshot(run)
    args = ("train", "--save-dir", run, "--resume-from", "checkpoint-000000004", "--max-steps", 6)
    line = refused(capsys, *args)
    assert "holds newer checkpoints (checkpoint-000000005)" in line and snapshot(run) == before
    shutil.move(run / "checkpoint-000000005", tmp_path / "checkpoint-000000005")  # best.json's
    code, out, err = cli(capsys, *args)
    assert code == 0 and "finished at step 6" in out, err
    assert SaveFolder(run).latest_checkpoint().name == "checkpoint-000000006"
    assert load_checkpoint_file(run / "checkpoint-000000006" / "model.pt")["run"]["step"] == 6
    heldout_steps = [int(r.split(",")[0]) for r in (run / "heldout.csv").read_text().splitlines()[1:]]
    assert heldout_steps == [1, 2, 3, 4, 5, 6]  # the first step 5's row dropped: it went on from 4
    line = refused(capsys, "train", "--save-dir", run, "--resume-from", "../checkpoint-000000004")
    assert "--resume-from names '../checkpoint-000000004', which is not a checkpoint folder" in line


def test_best_pointing_outside_is_refused_before_training(run, capsys):
    (run / "best.json").write_text(json.dumps({"folder": "../../..", "step": 1}))
    before = snapshot(run)
    line = refused(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 7)
    assert f"{run / 'best.json'}: its 'folder' is '../../..'" in line
    line = refused(capsys, "export", run, run.parent / "out", "--checkpoint", "best")
    assert "best.json: its 'folder' is '../../..'" in line
    assert snapshot(run) == before


@pytest.mark.parametrize("name", ["best.json", "train_config.json"])
def test_a_pointer_or_config_that_is_not_json_is_named(run, capsys, name):
    (run / name).write_bytes(b'{"folder": \x00\xff')
    before = snapshot(run)
    line = refused(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 7)
    assert f"{run / name}: not" in line and "JSON" in line
    assert snapshot(run) == before


def test_binary_metrics_log_is_named(run, capsys):
    (run / "metrics.csv").write_bytes(b"step,tokens\n\x00\xff\xfe\x00garbage")
    before = snapshot(run)
    line = refused(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 7)
    assert f"{run / 'metrics.csv'}: not a CSV log" in line
    assert snapshot(run) == before


# -- 1. checksums: a flipped byte is never resumed or exported --------------------------------


@pytest.mark.parametrize("file", ["model.pt", "rank0.pt"])
def test_a_flipped_byte_is_found_on_resume_export_evaluate_and_average(run, trained, capsys, file):
    damaged = run / "checkpoint-000000005" / file
    flip_byte(damaged)
    before = snapshot(run)
    line = refused(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 7)
    assert f"{damaged}: damaged: its SHA-256 differs" in line
    if file == "model.pt":
        for args in (
            ("export", run, run.parent / "out"),
            ("export", run, run.parent / "out", "--average", 3),
            ("evaluate", run, "--heldout", trained["heldout"], "--quiet"),
        ):
            assert f"{damaged}: damaged: its SHA-256 differs" in refused(capsys, *args)
    assert snapshot(run) == before


def test_a_truncated_model_is_one_line_in_export(run, capsys):
    model = run / "checkpoint-000000005" / "model.pt"
    model.write_bytes(model.read_bytes()[:5000])
    assert f"{model}: damaged: it has 5000 bytes" in refused(capsys, "export", run, run.parent / "out")
    (run / "checkpoint-000000005" / MANIFEST_FILE).unlink()  # as an older elmokit wrote it
    line = refused(capsys, "export", run, run.parent / "out")
    assert str(model) in line and "damaged" in line


def test_a_code_running_model_is_refused_in_one_line_everywhere(run, trained, capsys):
    class Payload:
        def __reduce__(self):
            return (print, ("ran code",))

    folder = run / "checkpoint-000000005"
    (folder / MANIFEST_FILE).unlink(missing_ok=True)  # as an older elmokit wrote it: the loader refuses it
    torch.save({"model": Payload()}, folder / "model.pt")
    for args in (
        ("export", run, run.parent / "out"),
        ("evaluate", run, "--heldout", trained["heldout"], "--quiet"),
        ("train", "--save-dir", run, "--resume", "--max-steps", 7),
    ):
        line = refused(capsys, *args)
        assert f"{folder / 'model.pt'}: refused to load" in line and "the Python global print" in line
        assert "weights_only=False" not in line


def test_a_checkpoint_without_manifest_still_resumes_and_its_crcs_are_checked(run, capsys):
    """Checkpoints written before manifests existed (e.g. checkpoints/news-512) resume and export;
    their zip CRCs are what can be checked."""
    for name in NAMES:
        (run / name / MANIFEST_FILE).unlink()
    code, _, err = cli(capsys, "export", run, run.parent / "out")
    assert code == 0, err
    code, out, err = cli(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 6)
    assert code == 0 and "finished at step 6" in out, err
    assert (run / "checkpoint-000000006" / MANIFEST_FILE).is_file()
    flip_byte(run / "checkpoint-000000005" / "model.pt")
    line = refused(capsys, "export", run, run.parent / "out2", "--checkpoint", "checkpoint-000000005")
    assert "checkpoint-000000005/model.pt: damaged: the CRC of its record" in line


def test_the_committed_pre_manifest_checkpoint_verifies():
    from elmokit.lm.checkpoints import verify_checkpoint_file

    folder = Path(__file__).parents[2] / "checkpoints" / "news-512"
    latest = SaveFolder(folder).latest_checkpoint()
    if latest is None:
        pytest.skip("the repository's checkpoints folder is not here")
    for file in sorted(latest.glob("*.pt")):
        verify_checkpoint_file(file)


# -- startup cleanup: only provable leftovers go ------------------------------------------------


def test_startup_removes_partials_but_never_a_complete_checkpoint(run, capsys):
    shutil.copytree(run / "checkpoint-000000005", run / "checkpoint-000000009")  # no pointer names it
    (run / ".checkpoint-000000006.partial").mkdir()
    (run / ".checkpoint-000000006.partial" / "rank0.pt").write_bytes(b"half")
    kept = snapshot(run / "checkpoint-000000009")
    code, out, err = cli(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 6)
    assert code == 0, err
    assert not (run / ".checkpoint-000000006.partial").exists()
    assert snapshot(run / "checkpoint-000000009") == kept
    assert sorted(p.name for p in run.glob("checkpoint-*")) == [
        *NAMES[1:],
        "checkpoint-000000006",
        "checkpoint-000000009",
    ]


# -- a full disk while writing a checkpoint ----------------------------------------------------


def test_a_full_disk_is_named_and_the_previous_checkpoint_stays(run, capsys, monkeypatch):
    """The write of model.pt fails as on a full disk (its bytes go to /dev/full): one line naming
    the save dir and "no space left"; checkpoint 5 stays the latest, byte for byte; no partial."""
    real_save = torch.save

    def to_full_disk(value, f, *args, **kwargs):
        if isinstance(value, dict) and "model" in value:
            if hasattr(f, "write"):
                with open("/dev/full", "wb", buffering=0) as full:
                    return real_save(value, full, *args, **kwargs)
            return real_save(value, "/dev/full", *args, **kwargs)
        return real_save(value, f, *args, **kwargs)

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    before = snapshot(run / "checkpoint-000000005")
    monkeypatch.setattr(torch, "save", to_full_disk)
    line = refused(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 6)
    assert f"in {run} failed" in line and "no space left" in line
    assert SaveFolder(run).latest_checkpoint().name == "checkpoint-000000005"
    assert snapshot(run / "checkpoint-000000005") == before
    assert not list(run.glob(".checkpoint-*"))
