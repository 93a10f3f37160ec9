"""Held-out perplexity of a model on several sets, each in a fresh `elmokit evaluate` process, and
a markdown table of the results against a n-gram baseline and older results.

    python scripts/heldout_table.py MODEL --heldout NAME=FILE [NAME=FILE ...] --out DIR \
        [--evaluate-args "--average 5"] [--jobs 2] [--baseline kn5.json] [--compare LABEL=DIR ...]

Every set is evaluated by `elmokit evaluate MODEL --heldout FILE --json DIR/NAME.json` with its
output in DIR/NAME.log, ``--jobs`` processes at a time with one thread each (a set whose JSON
exists is not evaluated again). The table (also written to DIR/table.md) gives the average
perplexity of each set for MODEL, for each ``--compare`` folder of such JSON files (NAME.json,
eval-NAME.json or FILE_NAME.json), and for the baseline (a ``scripts/ngram_baseline.py --json``
file, matched by set name or by file name), with MODEL's difference to the baseline in percent.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def evaluate(model: str, name: str, heldout: str, out: Path, extra: list[str]) -> dict:
    """One fresh `elmokit evaluate` process on one thread; returns its JSON figures."""
    target = out / f"{name}.json"
    if not target.is_file():
        command = ["elmokit", "evaluate", model, "--heldout", heldout, "--json", str(target), "--quiet"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with open(out / f"{name}.log", "w", encoding="utf-8") as log:
            done = subprocess.run(command + extra, stdout=log, stderr=subprocess.STDOUT, env=env)
        if done.returncode != 0:
            raise SystemExit(f"heldout_table: error: evaluating {name} failed; see {out / (name + '.log')}")
    return json.loads(target.read_text(encoding="utf-8"))


def baseline_figures(path: Path) -> dict[str, float]:
    """Average perplexity by set name and by held-out file name, from an ngram_baseline JSON."""
    figures = {}
    for result in json.loads(path.read_text(encoding="utf-8"))["results"]:
        figures[result["name"]] = result["average"]
        for file in result["files"]:
            figures[Path(file).name] = result["average"]
    return figures


def compared(folder: Path, name: str, file: str) -> str:
    """The average perplexity of set ``name`` (held-out ``file``) in an older result folder."""
    for stem in (name, f"eval-{name}", Path(file).name):
        candidate = folder / f"{stem}.json"
        if candidate.is_file():
            return f"{json.loads(candidate.read_text(encoding='utf-8'))['average']:.2f}"
    return "not measured"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--heldout", nargs="+", type=_pair, required=True, metavar="NAME=FILE")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--evaluate-args", default="", help='e.g. "--average 5"')
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--baseline", type=Path)
    parser.add_argument("--label", default="model")
    parser.add_argument("--compare", nargs="*", type=_pair, default=[], metavar="LABEL=DIR")
    args = parser.parse_args(argv)
    for name, file in args.heldout:
        if not Path(file).is_file():
            parser.error(f"held-out file of {name} not found: {file}")
    args.out.mkdir(parents=True, exist_ok=True)
    extra = shlex.split(args.evaluate_args)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        jobs = [pool.submit(evaluate, args.model, n, f, args.out, extra) for n, f in args.heldout]
        results = [job.result() for job in jobs]
    baseline = baseline_figures(args.baseline) if args.baseline else {}
    compare = [(label, Path(folder)) for label, folder in args.compare]
    head = ["held-out set", "predictions", f"{args.label} forward / backward / **average**"]
    head += [label for label, _ in compare] + (["5-gram", f"{args.label} vs 5-gram"] if baseline else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (name, file), r in zip(args.heldout, results):
        row = [name, f"{r['tokens']:,}", f"{r['forward']:.2f} / {r['backward']:.2f} / **{r['average']:.2f}**"]
        row += [compared(folder, name, file) for _, folder in compare]
        if baseline:
            kn = baseline.get(name, baseline.get(Path(file).name))
            if kn is None:
                row += ["not measured", ""]
            else:
                row += [f"{kn:.2f}", f"{100 * (r['average'] / kn - 1):+.1f}%"]
        lines.append("| " + " | ".join(row) + " |")
    table = "\n".join(lines) + "\n"
    (args.out / "table.md").write_text(table, encoding="utf-8")
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
