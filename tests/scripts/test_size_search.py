"""scripts/size_search.py: the sizes it builds and the parameter counts it reports."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

import elmokit
from elmokit.model.options import preset

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "size_search.py"


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


def test_a_trainer_stopped_from_outside_gives_no_point_and_its_cpu_time_counts(size_search):
    """A segment that ended before its budget with a non-zero exit (a signal from outside)
    records no point at that budget; its CPU time is carried into the segment that reaches it."""
    entry = {"points": []}
    assert size_search.record_segment(entry, 720.0, 300.0, 143, step=100, tokens=128_000) is None
    assert entry == {"points": [], "unfinished_cpu_s": 300.0}
    assert size_search.spent_cpu(entry) == 300.0
    point = size_search.record_segment(entry, 720.0, 421.0, 143, step=250, tokens=320_000)
    assert (point["budget_s"], point["segment_cpu_s"], point["cpu_s"], point["step"]) == (720.0, 721.0, 721.0, 250)
    assert entry == {"points": [point]}
    # The next budget starts from 721 s; a trainer that finished on its own (exit 0) early still
    # gives its point: there is nothing more to train.
    done = size_search.record_segment(entry, 1500.0, 100.0, 0, step=300, tokens=384_000)
    assert (done["cpu_s"], done["exit"]) == (821.0, 0) and len(entry["points"]) == 2
