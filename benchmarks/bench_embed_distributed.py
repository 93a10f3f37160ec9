"""`elmokit embed` in one process against the same command shared by N processes (torchrun).

    python benchmarks/bench_embed_distributed.py TEXT [--lines 2000] [--nproc 2]
        [--model elmo-news-512] [--layers all] [--threads 1] [--repeats 1] [--json OUT]

Takes the first ``--lines`` lines of TEXT (e.g. a shard of the 1B Word Benchmark's held-out
set) and runs, alternately, ``--repeats`` times each:

    python -m elmokit.cli embed IN OUT --model MODEL --layers LAYERS
    python -m torch.distributed.run --standalone --nproc-per-node N -m elmokit.cli embed IN OUT ...

with OMP_NUM_THREADS=threads in every process (torchrun's default, 1 thread a process). For each
run: wall time, CPU seconds (user + system of the command and every process it started: wait4
counts the processes that it waited for), the seconds process 0 spent merging the parts (from the
command's summary line), and the share of the CPUs that other processes used meanwhile (a shared
machine slows the wall time). The outputs are compared: the same datasets, the largest
difference of their values.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np
from common import run_child, thread_env


def compare(one: Path, other: Path) -> dict[str, float | int | bool]:
    """Same dataset names and shapes; how many values differ and by how much at most."""
    with h5py.File(one, "r") as a, h5py.File(other, "r") as b:
        same_names = sorted(a) == sorted(b)
        differing, largest = 0, 0.0
        for name in a:
            x, y = a[name][...], b[name][...]
            if name == "sentence_to_index" or x.shape != y.shape:
                differing += int(not np.array_equal(x, y))
                continue
            if not np.array_equal(x, y):
                differing += 1
                largest = max(largest, float(np.abs(x - y).max()))
    return {"same_datasets": same_names, "datasets_differing": differing, "max_abs_difference": largest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("text", help="a text file, one tokenized sentence per line")
    parser.add_argument("--lines", type=int, default=2000, help="the first N lines of TEXT")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--model", default="elmo-news-512")
    parser.add_argument("--layers", default="all", choices=["all", "top", "average"])
    parser.add_argument("--threads", type=int, default=1, help="threads per process")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    env = thread_env(args.threads)
    env["PYTHONWARNINGS"] = "ignore"
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        with open(args.text, encoding="utf-8") as source:
            lines = [line for _, line in zip(range(args.lines), source)]
        (work / "in.txt").write_text("".join(lines), encoding="utf-8")
        n_tokens = sum(len(line.split()) for line in lines)
        embed = ["-m", "elmokit.cli", "embed", str(work / "in.txt")]
        options = ["--model", args.model, "--layers", args.layers, "--overwrite"]
        commands = {
            1: [sys.executable, *embed, str(work / "out-1.hdf5"), *options],
            args.nproc: [
                sys.executable,
                *["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc)],
                *embed,
                str(work / f"out-{args.nproc}.hdf5"),
                *options,
            ],
        }
        runs: list[dict] = []
        for repeat in range(args.repeats):
            for processes, command in commands.items():
                result = run_child(command, env=env)
                if result.returncode != 0:
                    raise SystemExit(f"{processes} process(es) failed:\n{result.stderr[-3000:]}")
                merge = re.search(r"merge ([0-9.]+) s\)", result.stderr)
                run = {
                    "processes": processes,
                    "repeat": repeat,
                    "wall_seconds": round(result.seconds, 2),
                    "cpu_seconds": round(result.cpu_seconds, 2),
                    "merge_seconds": float(merge.group(1)) if merge else 0.0,
                    "tokens_per_second": round(n_tokens / result.seconds),
                    "others_cpu_busy": round(result.others_cpu_busy, 2),
                }
                runs.append(run)
                print(
                    f"{processes} process(es): wall {run['wall_seconds']:.1f} s, "
                    f"CPU {run['cpu_seconds']:.1f} s, merge {run['merge_seconds']:.1f} s, "
                    f"{run['tokens_per_second']:,} tokens/s "
                    f"(other processes used {run['others_cpu_busy']:.0%} of the CPUs meanwhile)",
                    flush=True,
                )
        outputs = compare(work / "out-1.hdf5", work / f"out-{args.nproc}.hdf5")
    print(
        f"{args.lines:,} lines, {n_tokens:,} tokens, model {args.model}, --layers {args.layers}, "
        f"{args.threads} thread(s) per process; outputs: {outputs}"
    )
    if args.json:
        report = {
            "command": "python benchmarks/bench_embed_distributed.py TEXT " + " ".join(sys.argv[2:]),
            "text": Path(args.text).name,
            "lines": args.lines,
            "tokens": n_tokens,
            "model": args.model,
            "layers": args.layers,
            "threads_per_process": args.threads,
            "runs": runs,
            "outputs": outputs,
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
