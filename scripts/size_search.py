"""Held-out perplexity per CPU hour for a few model sizes (issue: which size to train here).

Each size trains from scratch with `elmokit train` on one thread. The run is stopped by SIGTERM
(it checkpoints and exits) when the trainer's own CPU time reaches each budget in
--cpu-minutes, is evaluated with `elmokit evaluate` in fresh processes, and resumed for the next
budget. Sizes scale the LSTM width and every char-CNN filter count of --base-options by each
factor in --scales (projection and depth stay).

    python scripts/size_search.py --train 'corpus/*.txt' --vocab vocab.txt \
        --base-options options.json --heldout reuters=valid.txt --heldout lm1b=news.en.heldout-00010 \
        --scales 0.5,1,2 --cpu-minutes 12,25 --out runs/size-search

Prints a table and writes OUT/size_search.json. Run it on an otherwise idle core: CPU seconds
are counted, but a busy machine still slows memory-bound steps.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def scaled(options: dict, factor: float) -> dict:
    """A copy of bilm-tf ``options`` with the LSTM width and filter counts times ``factor``."""
    out = json.loads(json.dumps(options))
    out["lstm"]["dim"] = int(round(options["lstm"]["dim"] * factor))
    out["char_cnn"]["filters"] = [
        [w, max(1, int(round(n * factor)))] for w, n in options["char_cnn"]["filters"]
    ]
    return out


def n_parameters(options: dict, vocab_size: int) -> dict:
    """Parameter counts of the encoder (char CNN + LSTMs: the BiLM these options build) and of
    the softmax (an embedding and a bias per word)."""
    from elmokit import BiLM

    encoder = sum(p.numel() for p in BiLM(options).parameters())
    return {"encoder": encoder, "softmax": vocab_size * (options["lstm"]["projection_dim"] + 1)}


def train_until(cmd: list[str], budget_s: float, log: Path, env: dict) -> tuple[float, int]:
    """Runs the trainer until it has used ``budget_s`` CPU seconds (or exits); returns its CPU
    seconds and exit status."""
    with log.open("a") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        used = 0.0
        while proc.poll() is None:
            try:
                used = cpu_seconds(proc.pid)
            except (FileNotFoundError, ProcessLookupError):
                break
            if used >= budget_s:
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(2)
        rc = proc.wait()
    return used, rc


def spent_cpu(entry: dict) -> float:
    """The trainer CPU seconds a size has used so far: its points' segments and what a segment
    stopped before its budget used."""
    return sum(pt["segment_cpu_s"] for pt in entry["points"]) + entry.get("unfinished_cpu_s", 0.0)


def record_segment(
    entry: dict, budget_s: float, used_s: float, rc: int, step: int, tokens: int
) -> dict | None:
    """Account a training segment of ``used_s`` CPU seconds to a size's ``entry``. It gives the
    point at ``budget_s`` when the trainer reached that budget (stopped by this script) or
    finished on its own (exit 0); one stopped earlier from outside (a signal, a crash) gives no
    point: its CPU time is kept as unfinished, and the next run resumes towards the same
    budget. Returns the new point or None."""
    spent = spent_cpu(entry) + used_s
    if spent < budget_s and rc != 0:
        entry["unfinished_cpu_s"] = entry.get("unfinished_cpu_s", 0.0) + used_s
        return None
    segment = used_s + entry.pop("unfinished_cpu_s", 0.0)
    point = {"budget_s": budget_s, "segment_cpu_s": segment, "cpu_s": spent, "exit": rc}
    point.update(step=step, tokens=tokens, perplexity={})
    entry["points"].append(point)
    return point


def evaluate(save_dir: Path, heldout: str, out: Path, env: dict) -> float:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "elmokit.cli",
            "evaluate",
            str(save_dir),
            "--heldout",
            heldout,
            "--json",
            str(out),
            "--overwrite",  # of an evaluation whose figure was not saved
            "--quiet",
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return json.loads(out.read_text())["average"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", required=True)
    p.add_argument("--vocab", required=True)
    p.add_argument("--base-options", required=True, help="bilm-tf options JSON or a run's train_config.json")
    p.add_argument("--heldout", action="append", required=True, help="NAME=FILE, repeatable")
    p.add_argument("--scales", default="0.5,1,2")
    p.add_argument("--cpu-minutes", default="12,25", help="trainer CPU minutes at which to evaluate")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--n-negative-samples", type=int, default=8192)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    base = json.loads(Path(args.base_options).read_text())
    base = base.get("options", base)
    heldout = dict(h.split("=", 1) for h in args.heldout)
    budgets = [float(m) * 60 for m in args.cpu_minutes.split(",")]
    vocab_size = sum(1 for _ in open(args.vocab, encoding="utf-8"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    results_path = out / "size_search.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}

    sizes = []
    for factor in [float(s) for s in args.scales.split(",")]:
        options = scaled(base, factor)
        name = f"lstm{options['lstm']['dim']}-cnn{sum(n for _, n in options['char_cnn']['filters'])}"
        options_file = out / f"{name}.json"
        options_file.write_text(json.dumps(options, indent=1))
        results.setdefault(name, {"scale": factor, "params": n_parameters(options, vocab_size), "points": []})
        sizes.append((name, options_file))

    def save() -> None:
        results_path.write_text(json.dumps(results, indent=1))

    for budget in budgets:  # every size to a budget before any goes further
        for name, options_file in sizes:
            run, points = out / name, results[name]["points"]
            point = next((pt for pt in points if round(pt["budget_s"]) == round(budget)), None)
            if point is None:
                cmd = [sys.executable, "-m", "elmokit.cli", "train", "--save-dir", str(run)]
                if (run / "latest").exists():
                    cmd += ["--resume"]
                else:
                    cmd += ["--train", args.train, "--vocab", args.vocab, "--config", str(options_file)]
                    cmd += ["--batch-size", str(args.batch_size), "--checkpoint-minutes", "1000"]
                    cmd += ["--n-negative-samples", str(args.n_negative_samples)]
                used, rc = train_until(cmd, budget - spent_cpu(results[name]), out / f"{name}.log", env)
                step = int((run / "latest").read_text().strip().rsplit("-", 1)[1])
                config = json.loads((run / "train_config.json").read_text())
                tokens = step * config["batch_size"] * config["unroll_steps"]
                point = record_segment(results[name], budget, used, rc, step, tokens)
                save()  # the training is accounted for before the evaluations
                if point is None:
                    sys.exit(
                        f"size_search: the trainer of {name} stopped (exit {rc}) at step {step:,} before "
                        f"its {budget / 60:g} CPU-minute budget; its {used:.0f} CPU s are kept: run "
                        "again to go on"
                    )
            for set_name, path in heldout.items():
                if set_name not in point["perplexity"]:
                    target = out / f"{name}-{round(budget)}-{set_name}.json"
                    point["perplexity"][set_name] = evaluate(run, path, target, env)
                    save()
            print(name, json.dumps(point), flush=True)

    print("| size | encoder params | CPU min | steps | tokens | " + " | ".join(heldout) + " |")
    print("|---|---|---|---|---|" + "---|" * len(heldout))
    for name, entry in results.items():
        for pt in entry["points"]:
            ppl = " | ".join(f"{pt['perplexity'][k]:.2f}" for k in heldout)
            print(
                f"| {name} | {entry['params']['encoder'] / 1e6:.1f}M | {pt['cpu_s'] / 60:.1f} "
                f"| {pt['step']:,} | {pt['tokens'] / 1e6:.2f}M | {ppl} |"
            )


if __name__ == "__main__":
    main()
