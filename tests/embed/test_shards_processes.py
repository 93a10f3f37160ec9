"""Sharded runs across processes and crashes: `elmokit embed --shard-sentences N` killed with
SIGKILL after its first part and started again with the same command ends with the folder of an
uninterrupted run, byte for byte; --nproc 2 resuming a folder and torchrun from scratch write
the same bytes (each part is embedded on its own, its token cache emptied before it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from elmokit.embed.embedder import Embedder
from elmokit.embed.shards import MANIFEST

from .test_multiprocess_embed import ENV, TORCHRUN, corpus_lines, write_lines

MODEL = "elmo-tiny-reference"
ARGS = ["--model", MODEL, "--batch-size", "4", "--mode", "zero", "--device", "cpu", "--shard-sentences", "50"]


def contents(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def finished(folder: Path) -> list[dict]:
    """The parts the manifest records as complete (the manifest is replaced atomically)."""
    try:
        return [part for part in json.loads((folder / MANIFEST).read_text())["parts"] if part["sha256"]]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def test_a_killed_run_resumes_to_the_uninterrupted_folder_and_processes_agree(tmp_path):
    lines = corpus_lines(copies=14, seed=3)
    assert len(lines) > 400
    source = write_lines(tmp_path / "in.txt", lines)
    parts = -(-len(lines) // 50)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the subprocesses' thread count (OMP_NUM_THREADS=1): the same floats
    try:
        reference = tmp_path / "reference"
        Embedder(MODEL, batch_size=4, mode="zero", device="cpu").embed_file(
            source, reference, progress=False, shard_sentences=50
        )
    finally:
        torch.set_num_threads(threads)
    expected = contents(reference)
    assert len(expected) == parts + 1

    command = [sys.executable, "-m", "elmokit.cli", "embed", "in.txt", "out", *ARGS]
    process = subprocess.Popen(command, cwd=tmp_path, env=ENV, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not finished(tmp_path / "out"):  # the first part is complete and recorded
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    done = finished(tmp_path / "out")
    assert 1 <= len(done) < parts  # killed in the middle of the run
    again = subprocess.run(command, cwd=tmp_path, env=ENV, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert f"resuming out: {len(done)} of {parts} parts done, skipped" in again.stderr
    summary = again.stderr.splitlines()[-1]
    assert summary.endswith(f"; {parts} parts, {len(done)} done before and skipped) -> out"), summary
    assert contents(tmp_path / "out") == expected  # the killed run's temporary files are gone too

    # --nproc 2 resuming a folder of which three parts are left to do
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    for name, data in expected.items():
        if name not in ("part-00001.hdf5", "part-00004.hdf5", f"part-{parts - 1:05d}.hdf5"):
            (resumed / name).write_bytes(data)
    nproc = subprocess.run(
        [*command[:5], "resumed", *ARGS, "--nproc", "2", "--quiet"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
    )
    assert nproc.returncode == 0, nproc.stderr
    assert contents(resumed) == expected
    # torchrun from scratch
    two = subprocess.run(
        [*TORCHRUN, "-m", "elmokit.cli", "embed", "in.txt", "two", *ARGS],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert two.returncode == 0, two.stderr
    assert contents(tmp_path / "two") == expected
    assert sum(" sentences (" in line for line in two.stderr.splitlines()) == 1  # one summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out", "reference", "resumed", "two"]
