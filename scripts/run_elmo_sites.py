#!/usr/bin/env python
"""Where ELMo goes in a task model and how its layers are weighted (the paper's Tables 2 and 3).

Runs `elmokit task` with ELMo at the BiLSTM's input, its output, or both (--elmo-at) on NER, POS and
SST-5, and the layer weightings (--layers top; --layers mix with --mix-l2 1 and 0.001; the default
mix without a penalty is the "input" run) on NER and SST-5, several seeds each, every run in its
own folder under --out. A run whose metrics.json exists is not run again, so the script resumes.
It writes results.md (tables: mean and spread over seeds, the learned layer weights of each site,
the commands) and results.json.

    python scripts/run_elmo_sites.py --data ../shared/data --elmo elmo-news-512 --jobs 2
    python scripts/run_elmo_sites.py --data ../shared/data --elmo elmo-news-512 --report-only

The biLM layers are computed once per data set before the runs start (--cache-dir), shared by
every variant (run_task_experiments.py's cache; pass the same --cache-dir to reuse it).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from run_task_experiments import (
    TASK_NAMES,
    base_task,
    fill_cache,
    fmt,
    run_task_command,
    summary,
    task_files,
)

ROOT = Path(__file__).resolve().parents[1]

# variant -> the `elmokit task` options that make it
SITES = {"input": [], "output": ["--elmo-at", "output"], "both": ["--elmo-at", "both"]}
WEIGHTINGS = {
    "top": ["--layers", "top"],
    "mix-l2-1": ["--mix-l2", "1"],
    "mix-l2-0.001": ["--mix-l2", "0.001"],
}
VARIANTS = {**SITES, **WEIGHTINGS}
WEIGHTING_NAMES = {
    "top": "top layer only",
    "mix-l2-1": "mix, λ = 1",
    "mix-l2-0.001": "mix, λ = 0.001",
    "input": "mix, λ = 0 (default)",
}
SITE_TASKS = ("sentiment", "ner", "pos")  # cheapest first, so whole tables finish early
WEIGHTING_TASKS = ("sentiment", "ner")
# The paper (NAACL 2018), Table 3: ELMo at input only / input and output / output only.
PAPER_SITES = {
    "SQuAD (F1)": (85.1, 85.6, 84.8),
    "SNLI (acc.)": (88.9, 89.5, 88.7),
    "SRL (F1)": (84.7, 84.3, 80.9),
}


@dataclass(frozen=True)
class Run:
    task: str
    variant: str
    seed: int
    elmo: bool = True  # every run here uses ELMo (fill_cache reads this)

    def folder(self, out: Path) -> Path:
        return out / self.task / self.variant / f"seed-{self.seed}"


def plan(args: argparse.Namespace) -> list[Run]:
    """Every run, in the order they start: the cheap task's whole set first, then the sites of
    the others, then their weightings, each seed by seed, so that whole rows finish early."""
    tasks = [t for t in SITE_TASKS if t in args.tasks]
    runs = []
    for task in tasks[:1]:
        variants = list(SITES) + (list(WEIGHTINGS) if task in WEIGHTING_TASKS else [])
        runs += [Run(task, v, s) for s in args.seeds for v in variants]
    for s in args.seeds:
        runs += [Run(task, v, s) for task in tasks[1:] for v in SITES]
    for s in args.seeds:
        runs += [Run(task, v, s) for task in tasks[1:] if task in WEIGHTING_TASKS for v in WEIGHTINGS]
    return runs


def command(run: Run, args: argparse.Namespace) -> list[str]:
    train, dev, test = task_files(run.task, args)
    cmd = ["elmokit", "task", base_task(run.task), "--train", train, "--dev", dev, "--test", test]
    cmd += ["--elmo", str(args.elmo), *VARIANTS[run.variant], "--seed", str(run.seed)]
    cmd += ["--cache-dir", str(args.cache_dir), "--out", str(run.folder(args.out)), "--overwrite"]
    return cmd


def execute(run: Run, args: argparse.Namespace) -> dict | None:
    label = f"{run.task} {run.variant} seed {run.seed}"
    return run_task_command(run.folder(args.out), command(run, args), label)


def layer_weights(folder: Path) -> dict[str, list[float]]:
    """The softmax-normalised layer weights each site learned (from the saved model)."""
    from safetensors.torch import load_file

    if not (folder / "model.safetensors").is_file():  # a run copied from an earlier report
        return {}
    state = load_file(str(folder / "model.safetensors"))
    sites = {"input": "features.weighting.scalar_mix.", "output": "output_weighting.scalar_mix."}
    weights = {}
    for site, prefix in sites.items():
        s = state.get(prefix + "scalar_parameters")
        if s is not None:
            weights[site] = s.softmax(0).tolist()
    return weights


def report(args: argparse.Namespace, runs: list[Run], results: dict[Run, dict]) -> None:
    cells: dict[tuple[str, str], dict] = {}
    weights: dict[tuple[str, str], dict[str, list[float]]] = {}
    for task in dict.fromkeys(r.task for r in runs):
        for variant in VARIANTS:
            done = [r for r in runs if r.task == task and r.variant == variant and results.get(r)]
            if not done:
                continue
            cells[task, variant] = {
                "test": summary([results[r]["test"] for r in done]),
                "dev": summary([results[r]["dev"] for r in done]),
                "seeds": [r.seed for r in done],
            }
            per_run = [w for w in (layer_weights(r.folder(args.out)) for r in done) if w]
            if per_run:
                weights[task, variant] = {
                    site: [statistics.fmean(layer) for layer in zip(*(w[site] for w in per_run))]
                    for site in per_run[0]
                }

    def cell(task: str, variant: str) -> str:
        c = cells.get((task, variant))
        return fmt(c["test"]) if c else "–"

    def best_note(task: str, variants: list[str], names: dict[str, str] | None = None) -> str:
        have = [v for v in variants if (task, v) in cells and cells[task, v]["test"]["n"] > 1]
        if len(have) < 2:
            return "–"
        ranked = sorted(have, key=lambda v: -cells[task, v]["test"]["mean"])
        first, second = cells[task, ranked[0]]["test"], cells[task, ranked[1]]["test"]
        beyond = "beyond" if first["min"] > second["max"] else "within"
        label = names or {}
        best, runner_up = label.get(ranked[0], ranked[0]), label.get(ranked[1], ranked[1])
        return f"{best} ({beyond} the seed spread of {runner_up})"

    lines = [
        "# Where ELMo goes, and how its layers are weighted",
        "",
        f"ELMo model: `{args.elmo}`. Test scores in % (NER: entity F1; POS: UPOS accuracy; SST-5: "
        "accuracy): mean ± sample standard deviation (min–max) over the seeds; each run keeps its "
        'model of the best dev score. "Best" says whether the best variant\'s worst seed beats the '
        "runner-up's best seed (beyond the seed spread) or not (within it).",
        "",
        "## ELMo at the input, the output, or both (`--elmo-at`)",
        "",
        "| task | input | output | both | best | seeds |",
        "|---|---|---|---|---|---|",
    ]
    for task in SITE_TASKS:
        if any((task, v) in cells for v in SITES):
            seeds = sorted({s for v in SITES for s in cells.get((task, v), {}).get("seeds", [])})
            row = [TASK_NAMES[task], *(cell(task, v) for v in SITES), best_note(task, list(SITES))]
            lines.append("| " + " | ".join(row) + f" | {', '.join(map(str, seeds))} |")
    lines += [
        "",
        "The paper's Table 3 (input only / output only / input and output) for comparison, on its "
        "tasks: " + "; ".join(f"{k} {v[0]} / {v[2]} / {v[1]}" for k, v in PAPER_SITES.items()) + ".",
        "",
        "## Layer weighting (`--layers`, `--mix-l2`)",
        "",
        "| task | " + " | ".join(WEIGHTING_NAMES[v] for v in WEIGHTING_NAMES) + " | best | seeds |",
        "|---|" + "---|" * (len(WEIGHTING_NAMES) + 2),
    ]
    for task in WEIGHTING_TASKS:
        if any((task, v) in cells for v in WEIGHTINGS):
            seeds = sorted({s for v in WEIGHTING_NAMES for s in cells.get((task, v), {}).get("seeds", [])})
            row = [TASK_NAMES[task], *(cell(task, v) for v in WEIGHTING_NAMES)]
            row.append(best_note(task, list(WEIGHTING_NAMES), WEIGHTING_NAMES))
            lines.append("| " + " | ".join(row) + f" | {', '.join(map(str, seeds))} |")
    lines += [
        "",
        "## The layer weights each site learned",
        "",
        "softmax(s) over layers 0 (the character encoding), 1 and 2, mean over the seeds.",
        "",
        "| task | variant | site | layer weights |",
        "|---|---|---|---|",
    ]
    for (task, variant), sites in weights.items():
        for site, w in sites.items():
            lines.append(f"| {TASK_NAMES[task]} | {variant} | {site} | {', '.join(f'{x:.3f}' for x in w)} |")
    copied = sorted(
        (r.folder(args.out) / "copied-from.txt").read_text().strip()
        for r in runs
        if (r.folder(args.out) / "copied-from.txt").is_file()
    )
    if copied:
        lines += [
            "",
            f"{len(copied)} runs were not run here but taken from an earlier report of the same "
            "command (their folders' copied-from.txt): " + ", ".join(f"`{c}`" for c in copied) + ".",
        ]
    lines += ["", "## Commands", "", "One per run; `--seed` varies:", ""]
    shown = set()
    for run in runs:
        if (run.task, run.variant) not in shown:
            shown.add((run.task, run.variant))
            cmd = command(Run(run.task, run.variant, 0), args)
            lines.append("    " + shlex.join(cmd).replace("--seed 0", "--seed N").replace("seed-0", "seed-N"))
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    table = [
        {"task": t, "variant": v, **c, "layer_weights": weights.get((t, v), {})}
        for (t, v), c in cells.items()
    ]
    data = {"elmo": str(args.elmo), "cells": table}
    (args.out / "results.json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out / 'results.md'}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--elmo", required=True, help="the ELMo model (any spec elmokit takes)")
    p.add_argument("--data", type=Path, required=True, help="data folder (ner/conll2003/eng.train, ...)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "elmo-sites")
    p.add_argument("--cache-dir", type=Path, help="biLM layer cache (default OUT/layer-cache)")
    p.add_argument("--tasks", nargs="+", choices=SITE_TASKS, default=list(SITE_TASKS))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (each uses one thread)")
    p.add_argument("--report-only", action="store_true", help="only collect existing runs")
    p.add_argument("--dry-run", action="store_true", help="print the commands")
    args = p.parse_args(argv)
    args.files = {}
    args.out.mkdir(parents=True, exist_ok=True)
    args.cache_dir = args.cache_dir or args.out / "layer-cache"
    runs = plan(args)
    if args.dry_run:
        for run in runs:
            print(shlex.join(command(run, args)))
        return 0
    results: dict[Run, dict | None] = {}
    if args.report_only:
        for run in runs:
            metrics = run.folder(args.out) / "metrics.json"
            results[run] = json.loads(metrics.read_text()) if metrics.is_file() else None
    else:
        fill_cache(args, runs)
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for run, result in zip(runs, pool.map(lambda r: execute(r, args), runs)):
                results[run] = result
    report(args, runs, {r: v for r, v in results.items() if v is not None})
    return 0 if all(results.values()) or args.report_only else 1


if __name__ == "__main__":
    sys.exit(main())
