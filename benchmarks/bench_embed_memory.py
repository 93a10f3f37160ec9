"""Peak memory of `elmokit embed` against the number of input lines: it must stay flat.

    python benchmarks/bench_embed_memory.py [--sizes 10000,100000,300000] [--model elmo-tiny-reference]
        [--formats hdf5,parquet] [--words N] [--text GLOB,GLOB] [--threads 1] [--src PATH] [--json OUT]

For each size N it writes a temp file of N distinct sentences (the non-blank lines of ``--text``,
cycled, the tokens of every line after the first cycle shuffled, so every line is a new sentence
for ``sentence_to_index``; ``--words N`` keeps each line's first N tokens, so that a million
lines take minutes and what grows per line, not per token, dominates) and runs the real command
line as a subprocess, once per format of ``--formats`` (Parquet needs pyarrow),

    python -m elmokit.cli embed IN OUT.{hdf5,parquet} --model MODEL --layers all --quiet

with OMP_NUM_THREADS=threads, measuring its own peak RSS (``os.wait4``; VmHWM of that process),
its wall time and the output size. ``--src PATH`` puts PATH first on PYTHONPATH, to measure
another copy of the package (e.g. a snapshot of ``src`` before a change) with the same script.

The format ``h5py`` is the baseline of ``hdf5``: no elmokit, a child that writes with h5py alone
one dataset of zeros a line, of the shape elmokit gives it (3 layers, the line's tokens, the
model's output dimension), as the HDF5 layout has one dataset per sentence: what libhdf5
itself keeps per dataset of an open file shows in its growth. Its peak is the child's VmHWM,
which starts at its exec: ``ru_maxrss`` starts at the fork, at the size of this process (about
220 MB with torch), above a small child's own peak.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from common import LM1B_SHARDS, SHARED_DATA, run_child, thread_env

ABC_NEWS = str(SHARED_DATA / "lm" / "abc_news" / "*.txt")
FORMATS = ("hdf5", "parquet", "h5py")
# the h5py baseline: IN OUT DIM
H5PY_ONLY = """
import sys, h5py, numpy as np
dim = int(sys.argv[3])
with open(sys.argv[1], encoding="utf-8") as lines, h5py.File(sys.argv[2], "w") as out:
    for i, line in enumerate(lines):
        out.create_dataset(str(i), data=np.zeros((3, len(line.split()), dim), np.float32))
with open("/proc/self/status", encoding="ascii") as status:  # VmHWM: since exec, not the fork
    print(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
"""


def output_dim(model: str, env: dict[str, str]) -> int:
    """The model's vector size, twice its LSTM projection (both directions), asked of a child:
    this process stays small, as a child's peak RSS starts from its parent's at the fork."""
    code = (
        "import json, sys; from pathlib import Path; from elmokit.hub import resolve_model; "
        "o = json.loads(Path(resolve_model(sys.argv[1]).options_file).read_text(encoding='utf-8')); "
        "print(2 * int(o['lstm']['projection_dim']))"
    )
    done = subprocess.run([sys.executable, "-c", code, model], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"--model {model}: {done.stderr.strip().splitlines()[-1:]}")
    return int(done.stdout)


def read_pool(patterns: str) -> list[str]:
    """Non-blank lines (stripped) of the files matching a comma list of globs, in sorted order."""
    lines: list[str] = []
    for pattern in patterns.split(","):
        for path in sorted(glob.glob(pattern.strip())):
            with open(path, encoding="utf-8", errors="replace") as handle:
                lines.extend(line.strip() for line in handle if line.strip())
    if not lines:
        raise SystemExit(f"--text {patterns!r}: no lines found")
    return lines


def write_input(pool: list[str], n: int, path: Path, words_per_line: int | None = None) -> int:
    """``n`` distinct sentences cycled from ``pool`` (each cut to its first ``words_per_line``
    tokens, if given); returns the number of tokens."""
    rng = random.Random(0)
    tokens = 0
    with open(path, "w", encoding="utf-8") as out:
        for i in range(n):
            words = pool[i % len(pool)].split()
            if i >= len(pool):
                rng.shuffle(words)
            if words_per_line is not None:
                words = words[:words_per_line]
            tokens += len(words)
            out.write(" ".join(words) + "\n")
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000,300000")
    parser.add_argument("--model", default="elmo-tiny-reference")
    parser.add_argument("--formats", default="hdf5", help="comma-separated: hdf5, parquet, h5py")
    parser.add_argument("--words", type=int, help="keep each line's first N tokens")
    parser.add_argument("--text", default=f"{LM1B_SHARDS},{ABC_NEWS}")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--src", help="put this folder first on PYTHONPATH (another copy of elmokit)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    pool = read_pool(args.text)
    env = thread_env(args.threads)
    if args.src:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(args.src).resolve()), env.get("PYTHONPATH", "")])
    results = []
    formats = [f.strip() for f in args.formats.split(",")]
    for fmt in formats:
        if fmt not in FORMATS:
            raise SystemExit(f"--formats: {fmt!r} is not one of {', '.join(FORMATS)}")
    if args.words is not None and args.words < 1:
        raise SystemExit(f"--words must be at least 1, got {args.words}")
    print(f"{'format':>8} {'lines':>8} {'tokens':>10} {'seconds':>8} {'peak RSS MB':>12} {'output MB':>10}")
    dim = output_dim(args.model, env) if "h5py" in formats else None
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            source = Path(tmp) / f"in-{n}.txt"
            tokens = write_input(pool, n, source, args.words)
            for fmt in formats:
                output = Path(tmp) / f"out-{n}.{'hdf5' if fmt == 'h5py' else fmt}"
                if fmt == "h5py":
                    cmd = [sys.executable, "-c", H5PY_ONLY, str(source), str(output)]
                    cmd += [str(dim)]
                else:
                    cmd = [sys.executable, "-m", "elmokit.cli", "embed", str(source), str(output)]
                    cmd += ["--model", args.model, "--layers", "all", "--quiet"]
                result = run_child(cmd, env=env)
                if result.returncode != 0:
                    raise SystemExit(f"embed failed ({result.returncode}): {result.stderr[-2000:]}")
                peak = result.peak_rss_mb  # ru_maxrss: from the fork, when this process was larger
                if fmt == "h5py":
                    peak = int(result.stdout.split()[-1]) / 1024
                size_mb = output.stat().st_size / 1e6
                row = {
                    "format": fmt,
                    "lines": n,
                    "tokens": tokens,
                    "seconds": round(result.seconds, 1),
                    "peak_rss_mb": round(peak, 1),
                    "output_mb": round(size_mb, 1),
                }
                results.append(row)
                print(
                    f"{fmt:>8} {n:>8} {tokens:>10} {row['seconds']:>8} {row['peak_rss_mb']:>12} "
                    f"{row['output_mb']:>10}",
                    flush=True,
                )
                output.unlink()
            source.unlink()
    if args.json:  # without machine paths: the shared data folder as ../shared, --src by name
        shown = {k: v for k, v in vars(args).items() if k != "json"}
        shown["text"] = args.text.replace(str(SHARED_DATA.parent), "../shared")
        shown["src"] = args.src and Path(args.src).name
        Path(args.json).write_text(json.dumps({"args": shown, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
