#!/usr/bin/env python
"""Baseline vs +ELMo on NER, POS and sentiment, several seeds, and the NER sample-efficiency curve.

Every run is one `elmokit task` command (run here as `python -m elmokit.tasks`, the same code) in its
own folder under --out; a run whose metrics.json exists is not run again, so the script resumes.
It then writes results.md (table: mean and spread over seeds, relative error reduction, whether
the gain is beyond the seed spread, CPU time per run, commands), results.json and
sample_efficiency.png.

--data is a folder laid out like the project's shared data (ner/conll2003/eng.train, ...);
--files TASK TRAIN DEV TEST gives one task's files directly instead.

    python scripts/run_task_experiments.py --data ../shared/data --elmo MODEL --out runs/tasks
    python scripts/run_task_experiments.py --data ../shared/data --baseline-only --tasks ner --seeds 1
    python scripts/run_task_experiments.py --data ../shared/data --elmo MODEL --report-only

The biLM layers are computed once per data set before the runs start (--cache-dir), so parallel
runs (--jobs) never compute them twice; that cost is reported on its own line.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]

# (train, dev, test) relative to --data
TASK_FILES = {
    "ner": ("ner/conll2003/eng.train", "ner/conll2003/eng.testa", "ner/conll2003/eng.testb"),
    "pos": (
        "pos/ud_english_ewt/en_ewt-ud-train.conllu",
        "pos/ud_english_ewt/en_ewt-ud-dev.conllu",
        "pos/ud_english_ewt/en_ewt-ud-test.conllu",
    ),
    "sentiment": ("sentiment/sst/train.txt", "sentiment/sst/dev.txt", "sentiment/sst/test.txt"),
}
TASK_NAMES = {
    "ner": "NER (CoNLL-2003, entity F1)",
    "pos": "POS (UD English-EWT, UPOS accuracy)",
    "sentiment": "Sentiment (SST-5, accuracy)",
    "sentiment-binary": "Sentiment (SST-2, accuracy)",
}


@dataclass(frozen=True)
class Run:
    task: str  # ner, pos, sentiment, sentiment-binary
    elmo: bool
    fraction: float
    seed: int

    @property
    def variant(self) -> str:
        return "elmo" if self.elmo else "baseline"

    def folder(self, out: Path) -> Path:
        return out / self.task / self.variant / f"frac-{self.fraction:g}" / f"seed-{self.seed}"


def base_task(task: str) -> str:
    return "sentiment" if task.startswith("sentiment") else task


def task_files(task: str, args: argparse.Namespace) -> tuple[str, str, str]:
    """(train, dev, test) of a task: from --files, else under --data."""
    task = base_task(task)
    if task in args.files:
        return args.files[task]
    if args.data is None:
        raise SystemExit(f"no files for {task}: give --data DIR or --files {task} TRAIN DEV TEST")
    return tuple(str(args.data / p) for p in TASK_FILES[task])  # type: ignore[return-value]


def command(run: Run, args: argparse.Namespace) -> list[str]:
    train, dev, test = task_files(run.task, args)
    cmd = ["elmokit", "task", base_task(run.task), "--train", train, "--dev", dev, "--test", test]
    cmd += ["--elmo", str(args.elmo)] if run.elmo else ["--no-elmo"]
    if run.task == "sentiment-binary":
        cmd.append("--binary")
    cmd += ["--train-fraction", f"{run.fraction:g}", "--seed", str(run.seed)]
    if args.epochs:
        cmd += ["--epochs", str(args.epochs)]
    if run.elmo:
        cmd += ["--cache-dir", str(args.cache_dir)]
    cmd += ["--out", str(run.folder(args.out)), "--overwrite"]  # a run without metrics.json is redone
    return cmd + list(args.task_args)


def plan(args: argparse.Namespace) -> list[Run]:
    variants = [False] if args.baseline_only else [False, True]
    runs = []
    for task in args.tasks:
        tasks = [task] + (["sentiment-binary"] if task == "sentiment" and args.sst_binary else [])
        for name in tasks:
            fractions = sorted(set(args.fractions) | {1.0}) if name == "ner" else [1.0]
            runs += [Run(name, e, f, s) for f in fractions for e in variants for s in args.seeds]
    return runs


def run_task_command(folder: Path, cmd: list[str], label: str) -> dict | None:
    """Run one ``elmokit task`` command (``cmd``) whose --out is ``folder`` on one thread, its
    output in folder/log.txt; its metrics, read back (or found, if an earlier run wrote them),
    or None if it failed."""
    metrics = folder / "metrics.json"
    if metrics.is_file():
        return json.loads(metrics.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    # `elmokit task` and `python -m elmokit.tasks` are the same command
    argv = [sys.executable, "-m", "elmokit.tasks", *cmd[2:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one core per run
    start = time.perf_counter()
    print(f"[start] {shlex.join(cmd)}", flush=True)
    with open(folder / "log.txt", "w") as log:
        code = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    took = time.perf_counter() - start
    if code != 0:
        print(f"[FAILED {code}] {label} after {took:.0f} s; see {folder / 'log.txt'}", flush=True)
        return None
    result = json.loads(metrics.read_text())
    print(
        f"[done] {label}: dev {result['dev']:.2f} test {result['test']:.2f}, "
        f"{result['cpu_seconds']:.0f} CPU s",
        flush=True,
    )
    return result


def execute(run: Run, args: argparse.Namespace) -> dict | None:
    label = f"{run.task} {run.variant} frac {run.fraction:g} seed {run.seed}"
    return run_task_command(run.folder(args.out), command(run, args), label)


def fill_cache(args: argparse.Namespace, runs: list[Run]) -> dict:
    """Compute the biLM layers of every data set once, before the runs."""
    from elmokit.tasks import TaskConfig
    from elmokit.tasks.train import cache_layers

    seconds = {}
    for task in sorted({r.task for r in runs if r.elmo}):
        train, dev, test = task_files(task, args)
        config = TaskConfig(
            base_task(task),
            train,
            dev,
            test,
            "",
            elmo=str(args.elmo),
            cache_dir=str(args.cache_dir),
            binary=task == "sentiment-binary",
        )
        cpu, wall = time.process_time(), time.perf_counter()
        layers = cache_layers(config)
        created = any(v.created for v in layers.values())
        seconds[task] = {
            "cpu_seconds": time.process_time() - cpu,
            "wall_seconds": time.perf_counter() - wall,
            "computed": created,
            "files": {k: str(v.path) for k, v in layers.items()},
        }
        state = "computed" if created else "found"
        print(f"[cache] {task}: {state} in {seconds[task]['cpu_seconds']:.0f} CPU s", flush=True)
    return seconds


# -- report -------------------------------------------------------------------------------------
def summary(values: list[float]) -> dict:
    if not values:
        return {}
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def fmt(s: dict) -> str:
    if not s:
        return "–"
    if s["n"] == 1:
        return f"{s['mean']:.2f}"
    return f"{s['mean']:.2f} ± {s['std']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def relative_error_reduction(baseline: float, elmo: float) -> float | None:
    """(error_baseline - error_elmo) / error_baseline in %, errors = 100 - score."""
    if baseline >= 100.0:
        return None
    return 100.0 * ((100.0 - baseline) - (100.0 - elmo)) / (100.0 - baseline)


def beyond_spread(baseline: dict, elmo: dict) -> str:
    """ "yes" when the seeds' ranges do not overlap (every ELMo run beats every baseline run, or the
    reverse), "no" when they overlap, "n/a" with a single seed."""
    if baseline["n"] < 2 or elmo["n"] < 2:
        return "n/a (1 seed)"
    if elmo["min"] > baseline["max"] or elmo["max"] < baseline["min"]:
        return "yes"
    return "no: within the seed spread"


def report(args: argparse.Namespace, runs: list[Run], results: dict[Run, dict], cache: dict) -> None:
    groups: dict[tuple[str, float], dict[str, list[dict]]] = {}
    for run in runs:
        if results.get(run) is None:
            continue
        groups.setdefault((run.task, run.fraction), {"baseline": [], "elmo": []})[run.variant].append(
            results[run]
        )
    rows = []
    for (task, fraction), by_variant in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        row = {"task": task, "fraction": fraction}
        for variant, metrics in by_variant.items():
            row[variant] = summary([m["test"] for m in metrics])
            row[f"{variant}_dev"] = summary([m["dev"] for m in metrics])
            row[f"{variant}_cpu"] = summary([m["cpu_seconds"] for m in metrics])
            row[f"{variant}_seeds"] = sorted(m["seed"] for m in metrics)
            row[f"{variant}_sentences"] = metrics[0]["train_sentences"] if metrics else None
            row[f"{variant}_commands"] = [m.get("command") for m in metrics]
            row[f"{variant}_runs"] = [
                {k: m.get(k) for k in ("seed", "dev", "test", "cpu_seconds", "wall_seconds", "epochs")}
                for m in metrics
            ]
            row["metric"] = metrics[0]["metric"] if metrics else row.get("metric")
        if row.get("baseline") and row.get("elmo"):
            row["rer"] = relative_error_reduction(row["baseline"]["mean"], row["elmo"]["mean"])
            row["beyond_spread"] = beyond_spread(row["baseline"], row["elmo"])
        rows.append(row)

    elmo_name = str(args.elmo) if args.elmo else None
    lines = [
        "# Downstream tasks: baseline vs +ELMo",
        "",
        f"ELMo model: `{elmo_name}`" if elmo_name else "Baseline only (no ELMo model given).",
        "",
        "Test scores in %: mean ± sample standard deviation (min–max) over the seeds; each run keeps "
        "its model of the best dev score (dev is scored after every round of epochs). Relative error "
        "reduction = (error_baseline − error_ELMo) / error_baseline with errors = 100 − score, from "
        'the means. "Beyond spread": whether the min–max ranges of baseline and +ELMo over the seeds '
        "do not overlap. CPU s = process CPU time of one run (mean over seeds; one thread), not "
        "counting the one-off biLM layer cache.",
        "",
    ]
    if elmo_name and Path(elmo_name).name == "elmo-tiny-reference":
        lines += ["**The ELMo model is the tiny random-quality test model: these numbers show nothing.**", ""]
    lines += [
        "| task | metric | train data | baseline | +ELMo | rel. error reduction | beyond spread | seeds "
        "| CPU s per run (baseline / +ELMo) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        seeds = row.get("baseline_seeds") or row.get("elmo_seeds")
        sentences = row.get("baseline_sentences") or row.get("elmo_sentences")
        rer = f"{row['rer']:.1f}%" if row.get("rer") is not None else "–"
        cpu = " / ".join(f"{row[k]['mean']:.0f}" if row.get(k) else "–" for k in ("baseline_cpu", "elmo_cpu"))
        lines.append(
            f"| {TASK_NAMES[row['task']]} | {row['metric']} | "
            f"{row['fraction'] * 100:g}% ({sentences} sent.) | "
            f"{fmt(row.get('baseline', {}))} | {fmt(row.get('elmo', {}))} | {rer} | "
            f"{row.get('beyond_spread', '–')} | {', '.join(map(str, seeds))} | {cpu} |"
        )
    if cache:
        lines += ["", "biLM layers, computed once per data set and cached (not included above):", ""]
        for task, c in cache.items():
            state = "computed" if c["computed"] else "already cached"
            wall = "wall not recorded" if c.get("wall_seconds") is None else f"{c['wall_seconds']:.0f} s wall"
            lines.append(f"- {task}: {c['cpu_seconds']:.0f} CPU s, {wall} ({state})")
    lines += ["", "Commands (one per run; `--seed` varies):", ""]
    seen = set()
    for run in runs:
        if results.get(run) is None:
            continue
        cmd = command(run, args)
        key = shlex.join(cmd).replace(f"--seed {run.seed}", "--seed N").replace(f"seed-{run.seed}", "seed-N")
        if key not in seen:
            seen.add(key)
            lines.append(f"    {key}")
    plot = plot_curve(args, rows)
    if plot:
        lines += ["", f"![sample efficiency]({plot.name})", ""]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(
        json.dumps({"elmo": elmo_name, "rows": rows, "cache": cache}, indent=2, default=str) + "\n"
    )
    print("\n".join(lines))


def plot_curve(args: argparse.Namespace, rows: list[dict]) -> Path | None:
    ner = [r for r in rows if r["task"] == "ner"]
    if len({r["fraction"] for r in ner}) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for variant, label, style in (("baseline", "baseline", "o-"), ("elmo", "+ELMo", "s-")):
        points = sorted((r["fraction"] * 100, r[variant]) for r in ner if r.get(variant))
        if not points:
            continue
        x = [p[0] for p in points]
        y = [p[1]["mean"] for p in points]
        err = [[p[1]["mean"] - p[1]["min"] for p in points], [p[1]["max"] - p[1]["mean"] for p in points]]
        ax.errorbar(x, y, yerr=err, fmt=style, capsize=3, label=label)
    ax.set_xscale("log")
    ticks = sorted({r["fraction"] * 100 for r in ner})
    ax.set_xticks(ticks, [f"{t:g}%" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("% of CoNLL-2003 training sentences")
    ax.set_ylabel("test entity F1 (%)")
    seeds = max((r[v]["n"] for r in ner for v in ("baseline", "elmo") if r.get(v)), default=1)
    ax.set_title(f"NER sample efficiency (mean; bars: min–max over {seeds} seeds)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = args.out / "sample_efficiency.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--elmo", help="ELMo model folder or shipped name (required unless --baseline-only)")
    p.add_argument("--baseline-only", action="store_true", help="run only the baselines (--no-elmo)")
    p.add_argument("--data", type=Path, help="data folder (ner/conll2003/eng.train, pos/..., sentiment/...)")
    p.add_argument(
        "--files",
        nargs=4,
        action="append",
        default=[],
        metavar=("TASK", "TRAIN", "DEV", "TEST"),
        help="one task's files (instead of the layout under --data); repeatable",
    )
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "task-experiments")
    p.add_argument("--cache-dir", type=Path, help="biLM layer cache (default OUT/layer-cache)")
    p.add_argument("--tasks", nargs="+", choices=list(TASK_FILES), default=list(TASK_FILES))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--fractions", nargs="+", type=float, default=[0.01, 0.1, 1.0], help="NER train fractions")
    p.add_argument("--sst-binary", action="store_true", help="also run SST-2")
    p.add_argument("--epochs", type=int, help="passed to every run")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (each uses one thread)")
    p.add_argument("--report-only", action="store_true", help="only collect existing runs")
    p.add_argument("--dry-run", action="store_true", help="print the commands")
    p.add_argument("task_args", nargs=argparse.REMAINDER, help="after --: more `elmokit task` options")
    args = p.parse_args(argv)
    if args.task_args[:1] == ["--"]:
        args.task_args = args.task_args[1:]
    files = {}
    for task, *paths in args.files:
        if task not in TASK_FILES:
            p.error(f"--files: unknown task {task!r} (one of {', '.join(TASK_FILES)})")
        files[task] = tuple(paths)
    args.files = files
    if args.data is None and not all(t in files for t in args.tasks):
        p.error("give --data DIR, or --files TASK TRAIN DEV TEST for every task in --tasks")
    if not args.baseline_only and not args.elmo:
        p.error("give --elmo MODEL, or --baseline-only")
    if args.baseline_only:
        args.elmo = None
    args.out.mkdir(parents=True, exist_ok=True)
    args.cache_dir = args.cache_dir or args.out / "layer-cache"
    runs = plan(args)
    if args.dry_run:
        for run in runs:
            print(shlex.join(command(run, args)))
        return 0
    cache_file = args.out / "cache-times.json"
    if not args.report_only and any(r.elmo for r in runs):
        new = fill_cache(args, runs)
        # read, merge and write under a lock: runs of other tasks into the same OUT may do the same
        with FileLock(f"{cache_file}.lock"):
            cache = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
            for task, info in new.items():
                if info["computed"] or task not in cache:
                    cache[task] = info
            cache_file.write_text(json.dumps(cache, indent=2) + "\n")
    cache = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
    results: dict[Run, dict] = {}
    if args.report_only:
        for run in runs:
            metrics = run.folder(args.out) / "metrics.json"
            if metrics.is_file():
                results[run] = json.loads(metrics.read_text())
    else:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for run, result in zip(runs, pool.map(lambda r: execute(r, args), runs)):
                results[run] = result
    report(args, runs, results, cache)
    return 0 if all(results.get(r) is not None for r in runs) or args.report_only else 1


if __name__ == "__main__":
    sys.exit(main())
