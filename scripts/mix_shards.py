"""Deal the sentences of several corpora into shards that each mix all of them.

Training reads one shard at a time (bilm-tf's recipe: every batch row draws from the same
shard), so a corpus whose shards hold one source each (news shards, Wikipedia shards) trains the
model on one source for a stretch, then on the other, and the held-out perplexity of each source
swings from checkpoint to checkpoint. This script shuffles the non-blank lines of all INPUT files
together (one seeded permutation; a file given twice counts twice, which is how a source is
weighted) and deals them round-robin into --shards files:

    python scripts/mix_shards.py 'news/*.txt' 'news/*.txt' 'wiki/*.txt' --out mixed --shards 24

Sentence order inside a shard does not matter for training (it shuffles each shard's sentences).
Lines are copied byte for byte; the output holds exactly the input lines, in another order.
"""

from __future__ import annotations

import argparse
import glob
import random
import sys
from pathlib import Path


def mix(inputs: list[str], out: Path, shards: int, seed: int) -> tuple[int, int]:
    """Writes ``shards`` files ``mix-train-0000k-of-0000n.txt`` into ``out``; returns the number
    of lines and of whitespace-separated tokens written."""
    lines: list[bytes] = []
    for path in inputs:
        with open(path, "rb") as handle:
            for line in handle:
                if line.strip():
                    lines.append(line if line.endswith(b"\n") else line + b"\n")
    random.Random(seed).shuffle(lines)
    out.mkdir(parents=True, exist_ok=True)
    for k in range(shards):
        target = out / f"mix-train-{k:05d}-of-{shards:05d}.txt"
        partial = target.with_name(target.name + ".partial")
        with open(partial, "wb") as handle:
            handle.writelines(lines[k::shards])
        partial.replace(target)
    return len(lines), sum(len(line.split()) for line in lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("inputs", nargs="+", help="files or globs; repeat one to count it again")
    p.add_argument("--out", required=True, help="folder for the mixed shards")
    p.add_argument("--shards", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.shards < 1:
        sys.exit("mix_shards: error: --shards must be at least 1")
    files = []
    for pattern in args.inputs:
        matched = sorted(glob.glob(pattern))
        if not matched:
            sys.exit(f"mix_shards: error: no file matches {pattern!r}")
        files.extend(matched)
    n_lines, n_tokens = mix(files, Path(args.out), args.shards, args.seed)
    print(f"{len(files)} files, {n_lines:,} sentences, {n_tokens:,} tokens -> {args.shards} shards", end="")
    print(f" in {args.out}")


if __name__ == "__main__":
    main()
