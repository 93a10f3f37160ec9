"""`elmokit embed` and `elmokit tokens` shared by processes (``Embedder.embed_file(processes=N)``,
``--nproc N``, torchrun): two CPU processes write the output of one process; stateful mode and
stdin are refused; a killed process leaves the previous output (or none) and its leftovers are
removed by the next write."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmokit.base import kernels
from elmokit.embed.embedder import Embedder

from ..conftest import TINY

MODEL = "elmo-tiny-reference"
# the same thread count in every process, so that they compute the same floats
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
# (layers, mode, pooling) of the outputs compared with one process's
JOBS = [("all", "warm", None), ("top", "zero", None), ("average", "warm", None), ("all", "zero", "mean")]
JOBS += [("top", "warm", "max")]
MODES = {
    "warm": None,
    "zero": "zero",
}  # None: warm, without the warning that the tiny model has no start state


def corpus_lines(copies: int = 10, seed: int = 0) -> list[str]:
    """The 30 fixture sentences, shuffled and cut to random lengths, ``copies`` times, with empty
    and blank lines among them (embed gives them empty entries)."""
    sentences = [s for group in json.loads((TINY / "sentences.json").read_text()) for s in group]
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(copies):
        for sentence in rng.sample(sentences, len(sentences)):
            tokens = sentence.split()
            lines.append(" ".join(tokens[: rng.randint(1, len(tokens))]))
            if rng.random() < 0.05:
                lines.append(rng.choice(["", "   ", "\t"]))
    return lines


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def hdf5_content(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {name: f[name][...] for name in f}


def _output(folder: Path, layers: str, mode: str, pooling: str | None, processes: int) -> Path:
    return folder / f"{layers}-{mode}-{pooling}-{processes}.hdf5"


def test_two_processes_write_the_file_of_one_bit_for_bit(tmp_path):
    """With the token cache off, each process computes exactly the batches one process computes
    (chunk c of 8 x batch size lines goes to process c mod 2), so the merged file is the single
    process's file byte for byte, for every --layers, mode and pooling."""
    lines = corpus_lines()
    assert len(lines) > 300 and "" in lines
    write_lines(tmp_path / "in.txt", lines)
    vocab = write_lines(tmp_path / "vocab.txt", [f"w{i}" for i in range(9000)])  # 3 blocks of 4096
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers take at most this process's threads: the same floats
    try:
        with kernels.disabled("token_cache"):  # passed on to the workers
            for layers, mode, pooling in JOBS:
                embedder = Embedder(MODEL, batch_size=4, mode=MODES[mode], device="cpu")
                sums = []
                for processes in (1, 2):
                    output = _output(tmp_path, layers, mode, pooling, processes)
                    sums.append(
                        embedder.embed_file(
                            tmp_path / "in.txt",
                            output,
                            layers,
                            progress=False,
                            pooling=pooling,
                            processes=processes,
                        )
                    )
                one, two = (_output(tmp_path, layers, mode, pooling, n) for n in (1, 2))
                assert two.read_bytes() == one.read_bytes(), (layers, mode, pooling)
                assert sums[0].sentences == sums[1].sentences == len(lines)
                assert sums[0].empty == sums[1].empty == sum(not x.split() for x in lines)
                assert sums[0].tokens == sums[1].tokens and sums[1].processes == 2
            embedder = Embedder(MODEL, device="cpu")
            assert embedder.embed_tokens_file(vocab, tmp_path / "tokens-1.hdf5") == 9000
            assert embedder.embed_tokens_file(vocab, tmp_path / "tokens-2.hdf5", processes=2) == 9000
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "tokens-2.hdf5").read_bytes() == (tmp_path / "tokens-1.hdf5").read_bytes()
    with h5py.File(tmp_path / "tokens-2.hdf5") as f:
        assert f["embedding"].shape == (9000, 16)
    pooled = hdf5_content(_output(tmp_path, "all", "zero", "mean", 2))
    assert sorted(pooled) == ["embedding", "sentence_to_index"]
    assert pooled["embedding"].shape == (len(lines), 3, 32)
    # nothing but the inputs and the outputs is left
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_torchrun_embed_equals_one_process(tmp_path):
    """`torchrun --nproc-per-node 2 -m elmokit.cli embed` (token cache on, as by default): the
    same datasets, shapes and sentence_to_index as one process, the values equal to float
    rounding (a token's char-CNN vector comes from the batch where its process first met it);
    one progress bar and one summary."""
    lines = corpus_lines(seed=1)
    write_lines(tmp_path / "in.txt", lines)
    # --device cpu: two CPU processes (gloo) also on a machine with fewer GPUs than processes
    args = ["embed", "in.txt", "--model", MODEL, "--batch-size", "4", "--layers", "top", "--mode", "zero"]
    args += ["--device", "cpu"]
    one = subprocess.run(
        [sys.executable, "-m", "elmokit.cli", *args[:2], "one.hdf5", *args[2:], "--quiet"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert one.returncode == 0, one.stderr
    two = subprocess.run(
        [*TORCHRUN, "-m", "elmokit.cli", *args[:2], "two.hdf5", *args[2:]],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert two.returncode == 0, two.stderr
    a, b = hdf5_content(tmp_path / "one.hdf5"), hdf5_content(tmp_path / "two.hdf5")
    assert sorted(a) == sorted(b) == sorted([str(i) for i in range(len(lines))] + ["sentence_to_index"])
    assert a["sentence_to_index"] == b["sentence_to_index"]
    for name in a:
        if name != "sentence_to_index":
            assert a[name].shape == b[name].shape and b[name].dtype == np.float32
            np.testing.assert_allclose(b[name], a[name], atol=1e-6, rtol=0)
    summaries = [line for line in two.stderr.splitlines() if " sentences (" in line]
    assert len(summaries) == 1 and "2 processes, merge" in summaries[0], two.stderr
    assert f"{len(lines):,} sentences ({sum(not x.split() for x in lines)} empty)" in summaries[0]
    bars = two.stderr.replace("\n", "\r").split("\r")
    assert sum(bar.startswith("  0%|") for bar in bars) == 1  # the bar of process 0 only
    assert any(bar.startswith(f"100%|██████████| {len(lines)}/{len(lines)}") for bar in bars)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "one.hdf5", "two.hdf5"]


def test_refused_with_one_line_errors(tmp_path, monkeypatch, capsys):
    from elmokit.cli import main

    source = write_lines(tmp_path / "in.txt", ["a b", "c"])
    base = ["embed", str(source), str(tmp_path / "out.hdf5"), "--model", MODEL, "--nproc", "2"]
    assert main([*base, "--mode", "stateful"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "elmokit: error: --mode stateful carries LSTM states from each batch into the next, so its "
        "vectors depend on the file's order and it cannot be split between processes; run it in one "
        "process (without torchrun or --nproc), or use warm or zero mode"
    ]
    base[1] = "-"
    assert main(base) == 2
    assert capsys.readouterr().err.splitlines()[-1:] == [
        "elmokit: error: standard input can be read only once, so it cannot be split between "
        "processes; give a file"
    ]
    with pytest.raises(ValueError, match="^processes must be a whole number of at least 1, got 0$"):
        Embedder(MODEL).embed_file(source, tmp_path / "out.hdf5", processes=0)
    # under torchrun (WORLD_SIZE set) the library refuses the same before any process talks
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match="^--mode stateful carries LSTM states"):
        Embedder(MODEL, mode="stateful").embed_file(source, tmp_path / "out.hdf5")
    assert main(["embed", str(source), str(tmp_path / "o.hdf5"), "--nproc", "2"]) == 2
    assert capsys.readouterr().err.splitlines()[-1:] == [
        "elmokit: error: under torchrun, leave out --nproc (processes): torchrun starts the processes"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_a_bad_line_stops_every_process_and_leaves_nothing(tmp_path):
    lines = corpus_lines(copies=3)
    (tmp_path / "in.txt").write_bytes(("\n".join(lines[:50]) + "\n").encode() + b"broken \xff line\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "elmokit.cli",
            "embed",
            "in.txt",
            "out.hdf5",
            "--model",
            MODEL,
            "--nproc",
            "2",
            "--device",
            "cpu",
        ],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("elmokit: error:")]
    assert len(errors) == 1 and errors[0].startswith("elmokit: error: embed process "), result.stderr
    assert errors[0].endswith(
        " failed: in.txt: line 51 is not valid UTF-8 (invalid start byte); out.hdf5 was not written"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def _scratch(folder: Path, merging: bool) -> dict[int, int]:
    """The processes writing OUTPUT's scratch files: {rank: pid} of the parts, or {0: pid} of
    the temporary output that the merge writes."""
    found = {}
    for path in folder.glob(".out.hdf5.*.tmp"):
        pid = int(path.name[len(".out.hdf5.") :].split("@")[0])
        label = path.name.split(".")[-2]
        if merging and "part" not in label:
            found[0] = pid
        elif not merging and label.startswith("part"):
            found[int(label[4 : label.index("-")])] = pid
    return found


@pytest.mark.parametrize(
    "launcher, victim", [("nproc", "part"), ("torchrun", "part"), ("nproc", "merge")], ids=str
)
def test_a_killed_process_leaves_the_previous_output(tmp_path, launcher, victim):
    """SIGKILL one process while the parts are written (process 1) or while process 0 merges
    them: OUTPUT stays the previous file, the other process removes its scratch file on the
    launcher's SIGTERM, the launcher says which process failed, and the next write of OUTPUT
    removes what the killed process left."""
    lines = corpus_lines(copies=150, seed=2)
    write_lines(tmp_path / "in.txt", lines)
    previous = b"the previous output"
    (tmp_path / "out.hdf5").write_bytes(previous)
    args = ["embed", "in.txt", "out.hdf5", "--model", MODEL, "--batch-size", "4", "--overwrite", "--quiet"]
    args += ["--device", "cpu"]  # two CPU processes also on a machine with fewer GPUs
    if launcher == "nproc":
        command = [sys.executable, "-m", "elmokit.cli", *args, "--nproc", "2"]
    else:
        command = [*TORCHRUN, "-m", "elmokit.cli", *args]
    process = subprocess.Popen(command, cwd=tmp_path, env=ENV, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    wanted = {0} if victim == "merge" else {0, 1}
    while set(found := _scratch(tmp_path, victim == "merge")) != wanted:
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    rank = 0 if victim == "merge" else 1
    if victim == "part":
        time.sleep(0.05)  # both began: the kill falls inside the embedding, long before its end
    os.kill(found[rank], signal.SIGKILL)
    _, err = process.communicate(timeout=120)
    assert process.returncode != 0
    assert (tmp_path / "out.hdf5").read_bytes() == previous
    if launcher == "nproc":
        assert err.splitlines()[-1] == (
            f"elmokit: error: embed process {rank} failed (killed by SIGKILL); out.hdf5 was not written"
        )
    if victim == "part" and launcher == "torchrun":  # process 0, stopped while it wrote its part
        assert "elmokit: error: interrupted by SIGTERM; no partial output was left" in err.splitlines()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    # the killed process's only: its part (and the temporary output when it was merging)
    assert len(left) == (2 if victim == "merge" else 1), left
    assert all(name.startswith(f".out.hdf5.{found[rank]}@") for name in left), left
    Embedder(MODEL, batch_size=4).embed_file(
        tmp_path / "in.txt", tmp_path / "out.hdf5", "top", True, progress=False
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.hdf5"]


def test_each_process_takes_the_gpu_of_its_local_rank(monkeypatch):
    from elmokit.base.devices import process_device

    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert process_device(None) == process_device("cuda") == torch.device("cuda:1")
    assert process_device("cuda:3") == torch.device("cuda:3")  # as given
    assert process_device("cpu") == torch.device("cpu")
    assert process_device(None, gpus=(0, 2)) == torch.device("cuda:2")
    assert chosen == [torch.device(f"cuda:{i}") for i in (1, 1, 3, 2)]
    with pytest.raises(ValueError, match=r"^the process of local rank 1 has no GPU in the list \[3\]"):
        process_device(None, gpus=(3,))
    monkeypatch.setenv("LOCAL_RANK", "5")
    with pytest.raises(
        ValueError,
        match=r"^device .cuda:5. does not exist: this machine has 4 CUDA GPU.*local rank 5: start as many processes per machine as it has GPUs, or pass --device cpu\)$",
    ):
        process_device(None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only machine
    assert process_device(None) == torch.device("cpu")


def test_this_process_reads_torchruns_environment():
    from elmokit.base.devices import Process, this_process

    assert this_process({}) == Process(0, 0, 1, 0)
    got = this_process({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "TORCHELASTIC_RESTART_COUNT": "2"})
    assert got == Process(3, 1, 4, 2) and got.distributed and not got.is_main
    with pytest.raises(ValueError, match=r"^environment variable RANK='x' is not a whole number$"):
        this_process({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match=r"^RANK=4, LOCAL_RANK=0, WORLD_SIZE=2 do not fit together$"):
        this_process({"RANK": "4", "WORLD_SIZE": "2"})
