from __future__ import annotations

import re

from elmokit.cli import main


def test_demo_prints_context_free_layer_zero_and_contextual_layers(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "layers tensor (3, 3, 11, 32)" in out
    rows = {
        m.group(1): [float(x) for x in m.group(2).split()]
        for m in re.finditer(r"^\s+(\d) \(.*?\)\s+([-\d. ]+)$", out, re.M)
    }
    assert rows["0"] == [1.0, 1.0, 1.0]
    assert all(v < 0.999 for v in rows["1"] + rows["2"])


def test_demo_reports_missing_model_folder(capsys, tmp_path):
    assert main(["demo", "--model", str(tmp_path / "missing")]) == 2
    assert "no model folder" in capsys.readouterr().err
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "options.json").write_text("{}")
    assert main(["demo", "--model", str(tmp_path / "m")]) == 2
    assert "has no weights.hdf5" in capsys.readouterr().err
