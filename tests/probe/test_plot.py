"""Tests for scripts/plot_learning_curve.py (reading runs and baselines; drawing if matplotlib is there)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "plot_learning_curve.py"
_spec = importlib.util.spec_from_file_location("plot_learning_curve", _SCRIPT)
PL = importlib.util.module_from_spec(_spec)
sys.modules["plot_learning_curve"] = PL
_spec.loader.exec_module(PL)

HEADER = "step,tokens,forward,backward,average,predictions\n"


def make_run(folder: Path, rows: str) -> Path:
    folder.mkdir()
    (folder / "heldout.csv").write_text(HEADER + rows)
    config = {"heldout": "/data/heldout/reuters-valid.txt", "n_train_tokens": 1000}
    (folder / "train_config.json").write_text(json.dumps(config))
    return folder


def make_baseline(path: Path, predictions: int = 90) -> Path:
    result = {"name": "reuters-valid", "forward": 80.0, "backward": 81.0, "average": 80.5}
    other = {"name": "news.en.heldout-00010-of-00050", "forward": 300.0, "backward": 301.0, "average": 300.5}
    data = {"order": 5, "results": [{**result, "predictions": predictions}, {**other, "predictions": 7}]}
    path.write_text(json.dumps(data))
    return path


def test_read_run_sorts_rows_and_keeps_the_last_evaluation_of_a_step(tmp_path):
    run = PL.read_run(
        make_run(tmp_path / "run", "20,2000,150,140,145,90\n10,1000,300,280,290,90\n20,2000,151,141,146,90\n")
    )
    assert [r["step"] for r in run.rows] == [10, 20]
    assert run.rows[-1]["average"] == 146
    assert run.heldout_set == "reuters-valid" and run.train_tokens == 1000 and run.label == "run"
    assert PL.read_run(tmp_path / "run" / "heldout.csv", label="x").label == "x"


def test_read_baseline_picks_the_run_s_heldout_set(tmp_path):
    b = PL.read_baseline(make_baseline(tmp_path / "kn5.json"), "reuters-valid")
    assert (b.average, b.predictions, b.label) == (80.5, 90, "Kneser-Ney 5-gram")
    with pytest.raises(ValueError, match="no result for held-out set"):
        PL.read_baseline(tmp_path / "kn5.json", "reuters-test")


def test_missing_columns_and_files_are_reported(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "heldout.csv").write_text("step,tokens\n1,2\n")
    with pytest.raises(ValueError, match="missing column"):
        PL.read_run(tmp_path / "bad")
    with pytest.raises(FileNotFoundError, match="first checkpoint"):
        PL.read_run(tmp_path / "nothing")


def test_command_line_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = make_run(tmp_path / "run", "10,1000,300,280,290,90\n20,2000,150,140,145,90\n")
    out = tmp_path / "curve.png"
    assert (
        PL.main([str(run), "--baseline", str(make_baseline(tmp_path / "kn5.json", 91)), "-o", str(out)]) == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    captured = capsys.readouterr()
    assert (
        "average 145.00" in captured.out
        and "Kneser-Ney 5-gram on reuters-valid: average 80.50" in captured.out
    )
    assert "not the same held-out predictions" in captured.err  # 91 vs the run's 90


def test_stage_marks_baseline_labels_and_no_epochs_axis(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = make_run(tmp_path / "run", "10,1000,300,280,290,90\n20,2000,150,140,145,90\n")
    assert PL.tokens_at(PL.read_run(run), 15) == 1500
    out = tmp_path / "curve.png"
    kn = str(make_baseline(tmp_path / "kn5.json", 90))
    args = [str(run), "--baseline", kn, "--baseline-label", "5-gram, news", "--mark", "15=news + Wikipedia"]
    assert PL.main([*args, "--no-epochs", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "5-gram, news on reuters-valid: average 80.50" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        PL.main([str(run), "--mark", "fifteen=x", "-o", str(out)])
    assert "--mark takes STEP=LABEL" in capsys.readouterr().err
    empty = make_run(tmp_path / "empty", "")
    assert PL.main([str(empty), "--mark", "15=x", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "plot_learning_curve: error: " in err and "cannot place a mark at step 15" in err
