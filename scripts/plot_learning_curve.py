#!/usr/bin/env python
"""Learning curve of biLM training runs: held-out perplexity against tokens seen, as a PNG.

Reads each run's ``heldout.csv`` (written by ``elmokit train`` at every checkpoint: step, tokens,
forward, backward, average, predictions) and draws forward (dashed), backward (dotted) and
average (solid) perplexity on a log scale. ``--baseline`` adds the average perplexity of
n-gram baselines (JSON from scripts/ngram_baseline.py) on the same held-out set as horizontal
lines; the set is taken from the run's train_config.json (or ``--set``), and a warning is printed
when the baseline counted a different number of predictions than the run.

    python scripts/plot_learning_curve.py runs/news-512 --baseline kn5.json -o curve.png

A run whose data changed (``elmokit train --resume --new-data``) can mark the step where each
stage began (``--mark 14153="news + Wikipedia"``, repeatable) and drop the epochs axis, which
counts epochs of its latest corpus only (``--no-epochs``); ``--baseline-label`` names each
baseline (e.g. the text it was trained on).

Needs matplotlib: ``pip install -e ".[plots]"``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

COLUMNS = ("step", "tokens", "forward", "backward", "average", "predictions")


@dataclass
class Run:
    label: str
    heldout_set: str | None  # name of the held-out file(s) the run evaluates on
    train_tokens: int | None  # tokens in one epoch of its training data
    rows: list[dict[str, float]] = field(default_factory=list)


def set_name(path: str) -> str:
    """Name of a held-out file or glob as ngram_baseline.py reports it (basename less .txt)."""
    name = Path(path).name
    return name[: -len(".txt")] if name.endswith(".txt") else name


def read_run(path: str | Path, label: str | None = None) -> Run:
    """A save dir (or its heldout.csv): rows sorted by tokens, the last row kept for each step."""
    path = Path(path)
    csv_path = path / "heldout.csv" if path.is_dir() else path
    folder = csv_path.parent
    if not csv_path.is_file():
        raise FileNotFoundError(f"{csv_path} does not exist (has the run reached its first checkpoint?)")
    by_step: dict[int, dict[str, float]] = {}
    with csv_path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{csv_path}: missing column(s) {', '.join(missing)}")
        for row in reader:
            values = {c: float(row[c]) for c in COLUMNS}
            by_step[int(values["step"])] = values  # a resumed run may evaluate a step again
    heldout_set = train_tokens = None
    config = folder / "train_config.json"
    if config.is_file():
        data = json.loads(config.read_text(encoding="utf-8"))
        if data.get("heldout"):
            heldout_set = set_name(str(data["heldout"]))
        train_tokens = data.get("n_train_tokens")
    return Run(
        label=label or folder.name,
        heldout_set=heldout_set,
        train_tokens=train_tokens,
        rows=sorted(by_step.values(), key=lambda r: r["tokens"]),
    )


@dataclass
class Baseline:
    label: str
    forward: float
    backward: float
    average: float
    predictions: int | None


def parse_mark(text: str) -> tuple[int, str]:
    """``STEP=LABEL`` -> (step, label), for --mark."""
    step, sep, label = text.partition("=")
    if not sep or not step.strip().isdigit() or not label.strip():
        raise argparse.ArgumentTypeError(
            f"--mark takes STEP=LABEL, e.g. 14153=\"news + Wikipedia\", got {text!r}"
        )
    return int(step), label.strip()


def tokens_at(run: Run, step: int) -> float:
    """Training tokens seen by ``run`` after ``step`` steps (its rows' tokens per step)."""
    if not run.rows:
        raise ValueError(f"{run.label} has no held-out rows: cannot place a mark at step {step}")
    first = run.rows[0]
    return step * first["tokens"] / first["step"]


def read_baseline(path: str | Path, heldout_set: str, label: str | None = None) -> Baseline:
    """The result for ``heldout_set`` in a scripts/ngram_baseline.py JSON file (``label``, or
    "Kneser-Ney N-gram")."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    names = [r["name"] for r in data["results"]]
    if heldout_set not in names:
        raise ValueError(f"{path} has no result for held-out set {heldout_set!r} (it has {', '.join(names)})")
    r = data["results"][names.index(heldout_set)]
    order = data.get("order")
    label = label or (f"Kneser-Ney {order}-gram" if order else Path(path).stem)
    return Baseline(label, r["forward"], r["backward"], r["average"], r.get("predictions"))


def plot(
    runs: Sequence[Run],
    baselines: Sequence[Baseline],
    output: str | Path,
    title: str | None = None,
    heldout_set: str | None = None,
    marks: Sequence[tuple[int, str]] = (),
    epochs_axis: bool = True,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator
    from matplotlib.transforms import blended_transform_factory

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    values: list[float] = []
    for i, run in enumerate(runs):
        color = colors[i % len(colors)]
        x = [r["tokens"] / 1e6 for r in run.rows]
        few = len(x) < 30
        for column, style, width, marker in (
            ("average", "-", 2.0, "o"),
            ("forward", "--", 1.0, ">"),
            ("backward", ":", 1.2, "<"),
        ):
            y = [r[column] for r in run.rows]
            values += y
            ax.plot(
                x,
                y,
                style,
                color=color,
                linewidth=width,
                marker=marker if few else None,
                markersize=3,
                label=f"{run.label} {column}",
            )
        if run.rows:
            last = run.rows[-1]
            ax.annotate(
                f"{last['average']:.1f}",
                (last["tokens"] / 1e6, last["average"]),
                textcoords="offset points",
                xytext=(5, 4),
                color=color,
                fontsize=8,
            )
    grays = ["0.35", "0.55", "0.7", "0.45"]
    for j, b in enumerate(baselines):
        values.append(b.average)
        ax.axhline(
            b.average,
            color=grays[j % len(grays)],
            linewidth=1.2,
            linestyle=(0, (6, 2, 1, 2)),
            label=f"{b.label}: average {b.average:.1f} (forward {b.forward:.1f}, backward {b.backward:.1f})",
        )
        ax.text(
            0.01,
            b.average,
            f"{b.label} {b.average:.1f}",
            transform=blended_transform_factory(ax.transAxes, ax.transData),
            va="bottom",
            fontsize=7,
            color=grays[j % len(grays)],
        )
    for step, label in marks:  # the step where a stage of the first run began
        x = tokens_at(runs[0], step) / 1e6
        ax.axvline(x, color="0.5", linewidth=0.8, linestyle=":")
        ax.text(
            x,
            0.98,
            f" {label}",
            transform=blended_transform_factory(ax.transData, ax.transAxes),
            va="top",
            fontsize=7,
            color="0.3",
        )
    ax.set_yscale("log")
    if values:
        low, high = min(values), max(values)
        ax.set_ylim(low / 1.15, high * 1.3)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=tuple(range(1, 10))))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel("training tokens seen (millions)")
    ax.set_ylabel("held-out perplexity (log scale)")
    ax.set_xlim(left=0)
    if epochs_axis and len(runs) == 1 and runs[0].train_tokens:
        epochs = runs[0].train_tokens / 1e6
        top = ax.secondary_xaxis("top", functions=(lambda m: m / epochs, lambda e: e * epochs))
        top.set_xlabel("epochs")
    ax.set_title(title or f"Held-out perplexity{f' on {heldout_set}' if heldout_set else ''}")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.1)
    ax.legend(fontsize=7, loc="best", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="training save dirs (or their heldout.csv files)")
    parser.add_argument("-o", "--output", required=True, help="PNG to write")
    parser.add_argument("--label", action="append", help="legend label of each run, in order")
    parser.add_argument(
        "--baseline", action="append", default=[], help="JSON from scripts/ngram_baseline.py (repeatable)"
    )
    parser.add_argument(
        "--set", dest="heldout_set", help="held-out set name for the baselines (default: the runs')"
    )
    parser.add_argument(
        "--baseline-label", action="append", default=[], help="legend label of each --baseline, in order"
    )
    parser.add_argument(
        "--mark", action="append", type=parse_mark, default=[], metavar="STEP=LABEL",
        help="a vertical line where a stage of the (first) run began (repeatable)",
    )
    parser.add_argument(
        "--no-epochs", action="store_true", help="no epochs axis (a run whose corpus changed)"
    )
    parser.add_argument("--title")
    args = parser.parse_args(argv)
    if len(args.baseline_label) > len(args.baseline):
        parser.error("more --baseline-label than --baseline")
    try:
        return _run(args, parser)
    except (ValueError, OSError) as err:  # files and their contents: one line, never a traceback
        print(f"plot_learning_curve: error: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Read the runs and baselines, draw the PNG, print a summary."""

    labels = args.label or []
    if len(labels) > len(args.runs):
        parser.error("more --label than runs")
    runs = [read_run(p, labels[i] if i < len(labels) else None) for i, p in enumerate(args.runs)]
    for run in runs:
        if not run.rows:
            print(f"warning: {run.label} has no held-out rows yet", file=sys.stderr)
    sets = {r.heldout_set for r in runs if r.heldout_set}
    heldout_set = args.heldout_set or (sets.pop() if len(sets) == 1 else None)
    if args.baseline and heldout_set is None:
        parser.error(f"the runs do not name one held-out set ({sorted(sets)}); pass --set")
    names = args.baseline_label + [None] * len(args.baseline)
    baselines = [read_baseline(p, heldout_set, name) for p, name in zip(args.baseline, names)]
    for b in baselines:
        for run in runs:
            counts = {int(r["predictions"]) for r in run.rows}
            if b.predictions is not None and counts and counts != {b.predictions}:
                print(
                    f"warning: {b.label} counted {b.predictions} predictions, {run.label} {sorted(counts)}: "
                    "not the same held-out predictions",
                    file=sys.stderr,
                )
    plot(runs, baselines, args.output, args.title, heldout_set, args.mark, not args.no_epochs)
    for run in runs:
        if run.rows:
            last = run.rows[-1]
            print(
                f"{run.label}: {len(run.rows)} evaluation(s); last at step {int(last['step'])}, "
                f"{last['tokens'] / 1e6:.2f}M tokens: forward {last['forward']:.2f}, "
                f"backward {last['backward']:.2f}, average {last['average']:.2f}"
            )
    for b in baselines:
        print(f"{b.label} on {heldout_set}: average {b.average:.2f}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
