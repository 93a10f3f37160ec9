from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "elmo-tiny"

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _no_network_and_a_private_cache(monkeypatch, tmp_path_factory):
    """No test downloads from the internet or touches the user's download cache: ELMOKIT_OFFLINE
    is set and ELMOKIT_CACHE is a folder of the test session (subprocesses inherit both). The
    download tests unset ELMOKIT_OFFLINE and serve their files from 127.0.0.1."""
    monkeypatch.setenv("ELMOKIT_OFFLINE", "1")
    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path_factory.getbasetemp() / "elmokit-cache"))


@pytest.fixture(scope="session")
def tiny_files() -> tuple[Path, Path]:
    """options.json and weights of the tiny reference model that bilm-tf's tests use."""
    return TINY / "options.json", TINY / "lm_weights.hdf5"


@pytest.fixture(scope="session")
def tiny_sentences() -> list[list[str]]:
    """3 lists of 10 whitespace-tokenized sentences."""
    return json.loads((TINY / "sentences.json").read_text())


@pytest.fixture(scope="session")
def tiny_options() -> dict:
    return json.loads((TINY / "options.json").read_text())
