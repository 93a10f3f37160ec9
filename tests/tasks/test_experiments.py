"""scripts/run_task_experiments.py: two runs into one --out keep each other's cache timings."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "run_task_experiments.py"


def load_script(monkeypatch):
    spec = importlib.util.spec_from_file_location("run_task_experiments", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def test_cache_timings_written_meanwhile_by_another_run_are_kept(tmp_path, monkeypatch):
    script = load_script(monkeypatch)
    out = tmp_path / "out"
    entry = {"cpu_seconds": 1.0, "wall_seconds": 2.0, "computed": True, "files": {}}

    def fill_cache(args, runs):  # while this run computes the POS layers, a NER run records its own
        (out / "cache-times.json").write_text(json.dumps({"ner": entry}))
        return {"pos": {**entry, "cpu_seconds": 3.0}}

    monkeypatch.setattr(script, "fill_cache", fill_cache)
    monkeypatch.setattr(script, "execute", lambda run, args: None)  # no training here: runs "fail"
    argv = ["--data", str(tmp_path), "--elmo", "m", "--out", str(out), "--tasks", "pos", "--seeds", "1"]
    assert script.main(argv) == 1
    cache = json.loads((out / "cache-times.json").read_text())
    assert cache == {"ner": entry, "pos": {**entry, "cpu_seconds": 3.0}}
    report = (out / "results.md").read_text()
    assert "- ner: 1 CPU s, 2 s wall (computed)" in report and "- pos: 3 CPU s, 2 s wall (computed)" in report
