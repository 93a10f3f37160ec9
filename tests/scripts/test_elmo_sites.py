"""scripts/run_elmo_sites.py: the order of its runs and its report, from runs' metrics files."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("safetensors", reason="the tasks extra")
from safetensors.torch import save_file

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # it imports run_task_experiments from beside it
    spec = importlib.util.spec_from_file_location("run_elmo_sites", SCRIPTS / "run_elmo_sites.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def test_runs_go_cheap_task_first_then_sites_then_weightings(tmp_path, monkeypatch, capsys):
    script = load_script(monkeypatch)
    argv = ["--data", "data", "--elmo", "m", "--out", str(tmp_path), "--seeds", "1", "2", "--dry-run"]
    assert script.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    order = [(line.split()[2], line.split("--out ")[1].split()[0].split("/")[-2]) for line in lines]
    assert order[:12] == [("sentiment", v) for _ in (1, 2) for v in script.VARIANTS]
    sites = [("ner", v) for v in script.SITES] + [("pos", v) for v in script.SITES]
    assert order[12:24] == sites + sites
    assert order[24:] == [("ner", v) for _ in (1, 2) for v in script.WEIGHTINGS]
    assert "--elmo-at both" in lines[2] and "--layers top" in lines[3] and "--mix-l2 0.001" in lines[5]


def fake_run(folder: Path, test: float, mixes: dict[str, list[float]]) -> None:
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"dev": test - 1, "test": test}))
    prefixes = {"input": "features.weighting.scalar_mix.", "output": "output_weighting.scalar_mix."}
    tensors = {prefixes[s] + "scalar_parameters": torch.tensor(w) for s, w in mixes.items()}
    save_file(tensors, str(folder / "model.safetensors"))


def test_the_report_has_mean_spread_best_row_and_learned_weights(tmp_path, monkeypatch):
    script = load_script(monkeypatch)
    out = tmp_path / "out"
    zeros = [0.0, 0.0, 0.0]
    for seed, (a, b) in enumerate([(40.0, 42.0), (41.0, 43.0), (42.0, 44.0)], 1):
        fake_run(out / "sentiment" / "input" / f"seed-{seed}", a, {"input": zeros})
        fake_run(out / "sentiment" / "both" / f"seed-{seed}", b, {"input": zeros, "output": [0.0, 0.0, 1.0]})
    argv = ["--data", "data", "--elmo", "m", "--out", str(out), "--tasks", "sentiment", "--report-only"]
    assert script.main(argv) == 0
    report = (out / "results.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| Sentiment") and "both" in line)
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1:4] == ["41.00 ± 1.00 (40.00–42.00)", "–", "43.00 ± 1.00 (42.00–44.00)"]
    assert cells[4] == "both (within the seed spread of input)" and cells[5] == "1, 2, 3"
    # softmax of (0, 0, 1), the output mix of every seed
    e = 2.718281828459045
    expected = ", ".join(f"{x:.3f}" for x in (1 / (2 + e), 1 / (2 + e), e / (2 + e)))
    assert f"| Sentiment (SST-5, accuracy) | both | output | {expected} |" in report
    cells_json = json.loads((out / "results.json").read_text())["cells"]
    both = next(c for c in cells_json if c["variant"] == "both")
    assert both["test"]["n"] == 3 and both["layer_weights"]["input"] == pytest.approx([1 / 3] * 3)
