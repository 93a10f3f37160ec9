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
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import sys
import tempfile
from pathlib import Path

from common import LM1B_SHARDS, SHARED_DATA, run_child, thread_env

ABC_NEWS = str(SHARED_DATA / "lm" / "abc_news" / "*.txt")


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
    parser.add_argument("--formats", default="hdf5", help="comma-separated: hdf5, parquet")
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
        if fmt not in ("hdf5", "parquet"):
            raise SystemExit(f"--formats: {fmt!r} is neither hdf5 nor parquet")
    if args.words is not None and args.words < 1:
        raise SystemExit(f"--words must be at least 1, got {args.words}")
    print(f"{'format':>8} {'lines':>8} {'tokens':>10} {'seconds':>8} {'peak RSS MB':>12} {'output MB':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            source = Path(tmp) / f"in-{n}.txt"
            tokens = write_input(pool, n, source, args.words)
            for fmt in formats:
                output = Path(tmp) / f"out-{n}.{fmt}"
                cmd = [sys.executable, "-m", "elmokit.cli", "embed", str(source), str(output)]
                cmd += ["--model", args.model, "--layers", "all", "--quiet"]
                result = run_child(cmd, env=env)
                if result.returncode != 0:
                    raise SystemExit(f"embed failed ({result.returncode}): {result.stderr[-2000:]}")
                size_mb = output.stat().st_size / 1e6
                row = {
                    "format": fmt,
                    "lines": n,
                    "tokens": tokens,
                    "seconds": round(result.seconds, 1),
                    "peak_rss_mb": round(result.peak_rss_mb, 1),
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
