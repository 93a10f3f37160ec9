"""scripts/size_search.py: the sizes it builds and the parameter counts it reports."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

import elmokit
from elmokit.options import preset

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "size_search.py"


@pytest.fixture(scope="module")
def size_search():
    spec = importlib.util.spec_from_file_location("size_search", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name,factor", [("tiny", 1.0), ("tiny", 2.0), ("small", 0.25)])
def test_encoder_parameter_count_equals_the_model_built_from_the_options(size_search, name, factor):
    options = size_search.scaled(preset(name), factor)
    counted = size_search.n_parameters(options, vocab_size=100)
    assert counted["encoder"] == sum(p.numel() for p in elmokit.BiLM(options).parameters())
    assert counted["softmax"] == 100 * (options["lstm"]["projection_dim"] + 1)


def test_scaled_widens_lstm_and_filters_and_leaves_its_input_alone(size_search):
    base = preset("tiny")
    before = copy.deepcopy(base)
    wide = size_search.scaled(base, 2.0)
    assert base == before
    assert wide["lstm"]["dim"] == 2 * base["lstm"]["dim"]
    assert wide["lstm"]["projection_dim"] == base["lstm"]["projection_dim"]
    assert wide["char_cnn"]["filters"] == [[w, 2 * n] for w, n in base["char_cnn"]["filters"]]
