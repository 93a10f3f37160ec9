"""scripts/clip_binding.py: how often a model's LSTM clips bind on text."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from elmokit.hub.shipped import TINY_REFERENCE
from elmokit.model.bilm import BiLM
from elmokit.model.lstm import BiLstmLayer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "clip_binding.py"
SENTENCES = [
    "the cat sat on the mat .",
    "a dog ran under the red house quickly",
    "and but slowly",
    "blue",
]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("clip_binding", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["clip_binding"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["clip_binding"]


def _model(tmp_path: Path, cell_clip: float, proj_clip: float) -> Path:
    """The tiny reference model with other clips, saved as a model folder."""
    tiny = BiLM.from_pretrained(TINY_REFERENCE)
    lstm = dataclasses.replace(tiny.options.lstm, cell_clip=cell_clip, proj_clip=proj_clip)
    model = BiLM(dataclasses.replace(tiny.options, lstm=lstm))
    model.load_state_dict(tiny.state_dict())
    folder = tmp_path / f"clips-{cell_clip}-{proj_clip}"
    folder.mkdir()
    model.save(folder / "options.json", folder / "weights.hdf5")
    return folder


def _text(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text("\n".join([SENTENCES[0], "", *SENTENCES[1:]]) + "\n", encoding="utf-8")
    return path


def test_tight_clips_bind_and_the_counts_match_the_models_outputs(script, tmp_path, capsys):
    """With clips of 0.05 both bind. The share of projected outputs at the clip in layer 1
    equals the share read off the model's own layer-1 outputs (boundaries kept), token steps
    count <S> and </S>, and the step function is restored after the run."""
    folder = _model(tmp_path, 0.05, 0.05)
    out = tmp_path / "clips.json"
    assert (
        script.main(
            [
                "--model",
                str(folder),
                "--sentences",
                str(_text(tmp_path)),
                "--mode",
                "zero",
                "--batch-size",
                "3",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text(encoding="utf-8"))
    tokens = sum(len(s.split()) for s in SENTENCES)
    assert report["sentences"] == 4 and report["tokens"] == tokens
    records = {(r["layer"], r["direction"]): r for r in report["layers"]}
    assert set(records) == {(1, "forward"), (1, "backward"), (2, "forward"), (2, "backward")}
    for r in records.values():
        assert r["token_steps"] == tokens + 2 * 4
        assert 0 < r["cell_values_at_clip"] <= r["cell_steps_at_clip"] <= 1
        assert 0 < r["output_values_at_clip"] <= r["output_steps_at_clip"] <= 1
        assert r["cell_max_abs"] == pytest.approx(0.05) and r["output_max_abs"] == pytest.approx(0.05)

    model = BiLM.from_pretrained(folder)
    with torch.inference_mode():
        layers = model(
            model.batch_to_ids([s.split() for s in SENTENCES]), "zero", keep_sentence_boundaries=True
        )
    first = layers.layers[1][layers.mask]  # (token steps, 2 * projection_dim): layer 1, no skip yet
    dim = first.shape[-1] // 2
    for d, direction in enumerate(("forward", "backward")):
        half = first[:, d * dim : (d + 1) * dim]
        expected = float((half.abs() >= 0.05).float().mean())
        assert records[(1, direction)]["output_values_at_clip"] == pytest.approx(expected, abs=1e-6)
    assert BiLstmLayer._step.__name__ == "_step"
    assert "mode zero" in capsys.readouterr().out


def test_loose_clips_never_bind(script, tmp_path):
    folder = _model(tmp_path, 1000.0, 1000.0)
    records = script.clip_binding(BiLM.from_pretrained(folder), [s.split() for s in SENTENCES], 64, "warm")
    for r in records:
        assert r["cell_values_at_clip"] == r["output_values_at_clip"] == 0.0
        assert r["cell_steps_at_clip"] == r["output_steps_at_clip"] == 0.0
        assert 0 < r["cell_max_abs"] < 1000 and 0 < r["output_max_abs"] < 1000


def test_a_missing_file_is_one_line(script, tmp_path, capsys):
    assert script.main(["--model", TINY_REFERENCE, "--sentences", str(tmp_path / "none.txt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clip_binding.py: error:") and "none.txt" in err and err.count("\n") == 1
