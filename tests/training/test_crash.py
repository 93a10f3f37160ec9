"""Crash safety: `elmokit embed` and `elmokit train` killed with SIGKILL at random (seeded) moments.

An embedding run never leaves a partial file at its output path: after a kill the output either
does not exist or equals an uninterrupted run's. A training run killed several times and
resumed each time ends with the same final checkpoint, tensor for tensor, as an uninterrupted run
of the same number of steps, and its save dir holds the same files.

Most kills fall in the part of a run that writes (after Python has started and imported torch,
which takes most of a short run's time): ``started`` tells when that part begins, and the kill
comes a random time after it. The first kill of each test is at a random moment of the whole run.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import torch

from elmokit.lm.checkpoints import SaveFolder, load_checkpoint_file
from elmokit.lm.vocabulary import Vocabulary
from elmokit.training.data import count_tokens

from ..conftest import TINY
from .test_loop import write_corpus

SEED = 13
KILLS = 3
STEPS = 30
# the same thread count in every process, so that every run computes the same floats
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def elmokit(
    args: list, cwd: Path, started: Callable[[], bool] | None = None, kill_after: float | None = None
) -> tuple[int | None, float]:
    """Run `elmokit ARGS` in a new process and wait until ``started()`` (None: at once); SIGKILL
    it ``kill_after`` seconds later unless it ends before. Returns its exit status (None when
    killed) and the seconds from then to its end."""
    with open(cwd / "stderr.txt", "ab") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "elmokit.cli", *map(str, args)],
            cwd=cwd,
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        while started is not None and process.poll() is None and not started():
            time.sleep(0.002)
        begin = time.monotonic()
        try:
            code = process.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            process.kill()  # SIGKILL: no handler runs, nothing is cleaned up
            process.wait()
            code = None
    return code, time.monotonic() - begin


def written_after(path: Path, since: float) -> Callable[[], bool]:
    """A test that ``path`` was written after the wall-clock time ``since``."""

    def test() -> bool:
        try:
            return path.stat().st_mtime >= since
        except FileNotFoundError:
            return False

    return test


def hdf5_content(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {name: f[name][...] for name in f}


def test_killed_embed_never_leaves_a_partial_output(tmp_path):
    sentences = [s for group in json.loads((TINY / "sentences.json").read_text()) for s in group]
    (tmp_path / "in.txt").write_text("\n".join(sentences * 150) + "\n", encoding="utf-8")
    model = ["--options", TINY / "options.json", "--weights", TINY / "lm_weights.hdf5", "--quiet"]

    def writing(output: str) -> Callable[[], bool]:  # its temporary file or the output exists
        return lambda: any(tmp_path.glob(f".{output}.*")) or (tmp_path / output).exists()

    start = time.monotonic()
    code, writes = elmokit(["embed", "in.txt", "reference.hdf5", *model], tmp_path, writing("reference.hdf5"))
    whole = time.monotonic() - start
    assert code == 0, (tmp_path / "stderr.txt").read_text()
    reference = hdf5_content(tmp_path / "reference.hdf5")
    assert len(reference) == len(sentences) * 150 + 1
    rng = random.Random(SEED)
    for k in range(KILLS):
        output = f"out-{k}.hdf5"
        started = None if k == 0 else writing(output)
        code, _ = elmokit(
            ["embed", "in.txt", output, *model],
            tmp_path,
            started,
            rng.uniform(0, whole if k == 0 else writes),
        )
        assert code in (0, None)
        if (tmp_path / output).exists():  # the run ended before the kill: the whole result
            got = hdf5_content(tmp_path / output)
            assert got.keys() == reference.keys()
            assert all(np.array_equal(got[name], reference[name]) for name in reference)
        else:
            assert code is None


def test_killed_training_resumes_to_the_uninterrupted_result(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", n_sentences=200)
    Vocabulary.build(count_tokens(corpus)).save(tmp_path / "vocab.txt")
    fresh = [
        "train",
        "--train",
        corpus,
        "--vocab",
        "vocab.txt",
        "--config",
        "tiny",
        "--batch-size",
        4,
        "--unroll-steps",
        5,
        "--n-negative-samples",
        8,
        "--max-steps",
        STEPS,
        "--checkpoint-minutes",
        0,
    ]

    def session(save_dir: Path, kill: bool, rng: random.Random, first: bool = False) -> int | None:
        """One session of the run in ``save_dir`` (resumed once it has begun, as
        scripts/build_news_model.sh does), killed during its remaining steps (``first``: at any
        moment); its training starts when it writes train_config.json."""
        begun = (save_dir / "train_config.json").exists()
        args = ["train", "--save-dir", save_dir, "--resume"] if begun else [*fresh, "--save-dir", save_dir]
        started = None if first else written_after(save_dir / "train_config.json", time.time())
        latest = SaveFolder(save_dir).latest_checkpoint()
        remaining = STEPS - (int(latest.name.split("-")[1]) if latest else 0)
        after = rng.uniform(0, whole if first else 1.2 * trains * remaining / STEPS) if kill else None
        code, _ = elmokit(args, tmp_path, started, after)
        assert code in (0, None), (tmp_path / "stderr.txt").read_text()
        return code

    reference = tmp_path / "reference"
    start = time.monotonic()
    code, _ = elmokit([*fresh, "--save-dir", reference], tmp_path)
    whole = time.monotonic() - start
    assert code == 0, (tmp_path / "stderr.txt").read_text()
    # from writing train_config.json to the last checkpoint
    trains = (reference / "latest").stat().st_mtime - (reference / "train_config.json").stat().st_mtime
    run = tmp_path / "run"
    rng = random.Random(SEED)
    kills = 0
    for k in range(KILLS):
        kills += session(run, kill=True, rng=rng, first=k == 0) is None
        latest = SaveFolder(run).latest_checkpoint()
        if latest is not None:  # whatever `latest` names is complete
            assert load_checkpoint_file(latest / "model.pt")["run"]["step"] == int(latest.name.split("-")[1])
    assert kills > 0
    assert session(run, kill=False, rng=rng) == 0

    expected = load_checkpoint_file(SaveFolder(reference).latest_checkpoint() / "model.pt")
    got = load_checkpoint_file(SaveFolder(run).latest_checkpoint() / "model.pt")
    assert got["run"]["step"] == expected["run"]["step"] == STEPS
    assert got["model"].keys() == expected["model"].keys()
    for name, value in expected["model"].items():
        assert torch.equal(got["model"][name], value), name
    for state, value in expected["optimizer"]["state"].items():
        assert torch.equal(got["optimizer"]["state"][state]["sum"], value["sum"]), state
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in reference.iterdir())

    def logged(save_dir: Path) -> list[list[str]]:  # all but the timings
        rows = (save_dir / "metrics.csv").read_text().splitlines()
        return [[v for i, v in enumerate(r.split(",")) if i not in (2, 6)] for r in rows]

    assert logged(run) == logged(reference)
