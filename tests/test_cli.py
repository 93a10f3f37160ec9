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
