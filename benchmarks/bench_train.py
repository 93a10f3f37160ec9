"""Training speed and peak memory of the biLM recipe (Trainer.step) for the presets.

    python benchmarks/bench_train.py [--train GLOB | --vocab FILE] [--presets tiny,small]
        [--batch-size 32] [--unroll-steps 20] [--n-negative-samples 8192]
        [--devices cpu,cuda] [--precisions fp32,bf16] [--threads 2]
        [--warmup 3] [--steps 10] [--time-budget T] [--profile] [--pause-pid PID] [--json OUT]
        [--kernels on|off|NAMES] [--compare-kernel NAME [--repeats 3] [--in-process]]

The vocabulary is built from ``--train`` (default: the three lm1b held-out shards in
../shared/data/lm) with ``Vocabulary.build(count_tokens(...), min_count)``, unless ``--vocab``
gives one. Every (preset, device, precision) runs in its own subprocess (this script with
``--worker``) so that its peak RSS is its own. A worker builds ``BidirectionalLMBatches`` over
the ``--train`` files and a ``Trainer`` (``TrainConfig`` with the given batch, unroll, negatives,
device and precision; Adagrad, clipping, dropout 0.1 as in training), runs ``--warmup`` untimed
steps, then times ``--steps`` steps (stopping early after the step that passes the time budget).
Per step, getting the next batch (data) and ``Trainer.step`` (forward, sampled softmax,
backward, clip, Adagrad) are timed separately. tokens/step = batch * unroll (one direction, as
the Trainer counts); "tok/s" includes the data time, "step tok/s" does not.

``--precisions bf16`` uses TrainConfig.precision="bf16" (the Trainer's own autocast of the
forward pass; nothing is added here). ``--devices cuda`` prints "skipped: no CUDA" without one.
``--profile`` adds a torch.profiler run of 3 steps (after the timed ones) for the small preset on
the first device/precision and prints the top 10 ops by self CPU time, and the GFLOP per step
of the ops the profiler counts FLOPs of (the matmuls, not conv1d) with the least time
they need at the measured matmul rate: a floor under the step time.

``--kernels`` sets ``ELMOKIT_KERNELS`` for the workers (``on``, ``off``, or a value that
``elmokit.base.kernels.parse`` reads, e.g. ``--kernels=-sampled_softmax``). ``--compare-kernel NAME``
runs every configuration with that kernel on and off in turn (on, off, on, off, ...;
``--repeats`` times each, 3 by default) and prints the median ms/step of each and the gain; with
``--in-process`` one worker per configuration does that, switching the kernel step by step
(``elmokit.base.kernels.set_enabled``; ``--steps`` steps each), which leaves out the drift between
processes.

``--pause-pid PID`` stops that process (e.g. a training job on the same cores) while each worker
runs and resumes it right after (always, also on errors). "others" = share of all CPUs that
other processes used during the timed steps: figures with a high share are low.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_bilm import BUSY, kernel_settings, median, rss_mb
from common import (
    LM1B_SHARDS,
    Pauser,
    cpu_sample,
    matmul_rate,
    others_busy,
    run_child,
    synchronize,
    thread_env,
    wait_until_quiet,
    write_report,
)

# The target for the small preset on 2 CPU threads.
TARGET = {"preset": "small", "batch_size": 32, "unroll_steps": 20, "negatives": 8192, "tokens_per_s": 1100}


def build_trainer(
    vocab_file: str,
    train: str,
    options: dict[str, Any],
    batch_size: int,
    unroll_steps: int,
    negatives: int,
    device: str = "cpu",
    precision: str = "fp32",
) -> tuple[Any, Any, Any]:
    """The training recipe's batches over ``train`` and a ``Trainer`` (a throw-away save dir):
    (trainer, batches, vocabulary)."""
    from elmokit.lm.vocabulary import Vocabulary
    from elmokit.model.options import BiLMOptions
    from elmokit.training.collectives import Distributed
    from elmokit.training.config import TrainConfig
    from elmokit.training.data import BidirectionalLMBatches, corpus_files
    from elmokit.training.loop import Trainer

    vocab = Vocabulary.from_file(vocab_file)
    max_chars = BiLMOptions.from_dict(options).char_cnn.max_characters_per_token
    data = BidirectionalLMBatches(
        corpus_files(train), vocab, batch_size, unroll_steps, seed=0, max_characters_per_token=max_chars
    )
    with tempfile.TemporaryDirectory() as save_dir:
        config = TrainConfig(
            train=train, vocab=vocab_file, save_dir=save_dir, options=options, batch_size=batch_size,
            unroll_steps=unroll_steps, n_negative_samples=negatives, device=device, precision=precision,
        )  # fmt: skip
        trainer = Trainer(config, data, len(vocab), Distributed(device=torch.device(device)))
    return trainer, data, vocab


def worker(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Build the data and the Trainer of one configuration, time its steps; returns the figures
    of each setting: one, or with ``spec["alternate"]`` (``ELMOKIT_KERNELS`` values) each in turn,
    switched step by step with ``elmokit.base.kernels`` (``steps`` steps each)."""
    from elmokit.base import kernels
    from elmokit.model.options import preset

    torch.set_num_threads(spec["threads"])
    rss_import = rss_mb()
    trainer, data, vocab = build_trainer(
        spec["vocab"], spec["train"], preset(spec["preset"]), spec["batch_size"], spec["unroll_steps"],
        spec["negatives"], spec["device"], spec["precision"],
    )  # fmt: skip
    device = torch.device(spec["device"])
    rss_model = rss_mb()
    n_params = sum(p.numel() for p in trainer.model.parameters())
    settings = spec.get("alternate") or [spec.get("kernels", "1")]

    def use(setting: str) -> None:
        names = kernels.parse(setting)
        kernels.set_enabled(False)
        if names:
            kernels.set_enabled(True, *names)

    batches = iter(data)
    for i in range(spec["warmup"] * len(settings)):
        use(settings[i % len(settings)])
        trainer.step(next(batches))
    synchronize(device)
    times: dict[str, dict[str, list[float]]] = {s: {"data": [], "step": [], "loss": []} for s in settings}
    distinct: list[float] = []  # distinct tokens (char-id rows) / tokens, both directions
    cpu_before = cpu_sample()
    elapsed = 0.0
    for i in range(spec["steps"] * len(settings)):  # alternating step by step
        setting = settings[i % len(settings)]
        use(setting)
        start = time.perf_counter()
        batch = next(batches)
        middle = time.perf_counter()
        forward, backward = trainer.step(batch)  # returns floats: synchronizes a GPU
        synchronize(device)
        end = time.perf_counter()
        times[setting]["data"].append(middle - start)
        times[setting]["step"].append(end - middle)
        times[setting]["loss"].append(0.5 * (forward + backward))
        elapsed += end - start
        chars = np.concatenate([batch["char_ids"], batch["char_ids_reverse"]])
        rows = chars.reshape(-1, chars.shape[-1])
        distinct.append(len(np.unique(rows, axis=0)) / len(rows))
        if elapsed >= spec["time_budget"] and i % len(settings) == len(settings) - 1:
            break
    others = others_busy(cpu_before, cpu_sample())
    tokens = spec["batch_size"] * spec["unroll_steps"]
    results = []
    for setting in settings:
        data_s, step_s = sum(times[setting]["data"]), sum(times[setting]["step"])
        steps, losses = len(times[setting]["step"]), times[setting]["loss"]
        results.append(
            {
                "kernels": setting,
                "vocab_size": len(vocab),
                "sampled": trainer.num_sampled is not None,
                "parameters": n_params,
                "steps": steps,
                "ms_per_step": 1000 * step_s / steps,
                "min_ms_per_step": 1000 * min(times[setting]["step"]),
                "step_ms": [1000 * t for t in times[setting]["step"]],
                "data_ms_per_step": 1000 * data_s / steps,
                "tokens_per_s": tokens * steps / (step_s + data_s),
                "step_tokens_per_s": tokens * steps / step_s,
                "distinct_fraction": sum(distinct) / len(distinct),
                "first_loss": losses[0],
                "last_loss": losses[-1],
                "others_cpu_busy": others,
                "rss_after_import_mb": rss_import,
                "rss_after_model_mb": rss_model,
            }
        )
    if spec.get("profile_steps"):
        results[0]["profile"] = profile(trainer, batches, spec["profile_steps"], device)
    return results


def profile(trainer: Any, batches: Any, steps: int, device: torch.device) -> dict[str, Any]:
    """torch.profiler over ``steps`` Trainer steps: top 10 ops by self CPU time, and the FLOPs
    of the ops the profiler counts (matmuls; conv1d is not counted)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    inputs = [next(batches) for _ in range(steps)]
    start = time.perf_counter()
    with torch_profile(activities=activities, with_flops=True) as prof:
        for batch in inputs:
            trainer.step(batch)
        synchronize(device)
    wall = time.perf_counter() - start
    averages = prof.key_averages()
    total_self = sum(e.self_cpu_time_total for e in averages)
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    optimizer = [e for e in averages if e.key.startswith("Optimizer.step")]
    return {
        "steps": steps,
        "wall_ms_per_step": 1000 * wall / steps,
        "table": averages.table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=48),
        "top": [
            {
                "op": e.key,
                "calls": e.count,
                "self_cpu_ms_per_step": e.self_cpu_time_total / 1000 / steps,
                "self_cpu_share": e.self_cpu_time_total / max(total_self, 1),
            }
            for e in top
        ],
        "optimizer_ms_per_step": sum(e.cpu_time_total for e in optimizer) / 1000 / steps,
        "counted_gflop_per_step": sum(e.flops for e in averages) / 1e9 / steps,
    }


def build_vocab(args: argparse.Namespace, folder: Path) -> str:
    if args.vocab:
        return args.vocab
    from elmokit.lm.vocabulary import Vocabulary
    from elmokit.training.data import corpus_files, count_tokens

    counts = count_tokens(corpus_files(args.train))
    path = folder / "vocab.txt"
    Vocabulary.build(counts, min_count=args.min_count).save(path)
    return str(path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", default=LM1B_SHARDS, help="glob of training text (default: lm1b shards)")
    p.add_argument("--vocab", help="vocabulary file (default: built from --train)")
    p.add_argument("--min-count", type=int, default=1, help="for the built vocabulary (default 1)")
    p.add_argument("--presets", default="tiny,small", help="comma list of presets")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--unroll-steps", type=int, default=20)
    p.add_argument("--n-negative-samples", type=int, default=8192)
    p.add_argument("--devices", default="cpu,cuda", help="comma list (cuda skipped without CUDA)")
    p.add_argument("--precisions", default="fp32,bf16", help="comma list of fp32, bf16")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument(
        "--time-budget",
        type=float,
        default=60.0,
        help="stop timing a configuration after the step that passes T s (default 60)",
    )
    p.add_argument("--profile", action="store_true", help="profile 3 steps of the small preset")
    p.add_argument("--pause-pid", type=int, help="SIGSTOP this process while each worker runs")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.25,
        help="before each worker wait until other processes (but --pause-pid) use at most this "
        "share of the CPUs (default 0.25; 1 = do not wait)",
    )
    p.add_argument("--wait-timeout", type=float, default=60.0, help="wait at most T s (default 60)")
    p.add_argument(
        "--retry-busy",
        type=int,
        default=2,
        help=f"run a configuration again (at most N times) when other processes used more than "
        f"{BUSY * 100:.0f}%% of the CPUs meanwhile (default 2)",
    )
    p.add_argument("--json", help="also write the results as JSON to this file")
    p.add_argument(
        "--kernels",
        default="on",
        help="ELMOKIT_KERNELS for the workers: on (default), off, or e.g. --kernels=-sampled_softmax",
    )
    p.add_argument("--compare-kernel", metavar="NAME", help="run each configuration with NAME on and off")
    p.add_argument("--repeats", type=int, help="runs of each setting, interleaved (default 1; 3 comparing)")
    p.add_argument(
        "--in-process",
        action="store_true",
        help="with --compare-kernel: one worker per configuration switches the kernel step by step",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.compare_kernel else 1
    return args


def compare(results: list[dict[str, Any]], settings: list[str], name: str) -> list[dict[str, Any]]:
    """Print and return, per (preset, device, precision), the median ms/step with kernel ``name``
    on and off and its gain (the speed-up): the median of the off/on ratios of consecutive runs."""
    print(f"\nkernel {name}: median ms/step of the interleaved runs (range); gain = median off/on ratio")
    rows = []
    for key in dict.fromkeys((r["preset"], r["device"], r["precision"]) for r in results):
        same = [r for r in results if (r["preset"], r["device"], r["precision"]) == key]
        if all(len(r["step_ms"]) > 1 for r in same) and len(same) == 2:  # --in-process: the steps
            runs = [r["step_ms"] for s in settings for r in same if r["kernels"] == s]
        else:
            runs = [[r["ms_per_step"] for r in same if r["kernels"] == s] for s in settings]
        on, off = median(runs[0]), median(runs[1])
        gain = median([b / a for a, b in zip(*runs)]) - 1
        rows.append(dict(zip(("preset", "device", "precision"), key), on=on, off=off, gain=gain, runs=runs))
        print(
            f"  {' '.join(key)}: on {on:.0f} ms ({min(runs[0]):.0f}-{max(runs[0]):.0f}), "
            f"off {off:.0f} ms ({min(runs[1]):.0f}-{max(runs[1]):.0f}): gain {100 * gain:+.1f}%"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    command = shlex.join(["python", *sys.argv])  # no machine path in the record
    print(f"command: {command}", flush=True)
    presets = [s.strip() for s in args.presets.split(",") if s.strip()]
    devices = [s.strip() for s in args.devices.split(",") if s.strip()]
    precisions = [s.strip() for s in args.precisions.split(",") if s.strip()]
    pauser = Pauser(args.pause_pid)
    settings = kernel_settings(args.kernels, args.compare_kernel)
    results: list[dict[str, Any]] = []
    notes: list[str] = []
    profiled = False
    with tempfile.TemporaryDirectory() as tmp:
        vocab = build_vocab(args, Path(tmp))
        wait_until_quiet(args.wait_quiet, args.wait_timeout, exclude_pid=args.pause_pid)
        rate, matmul_others = matmul_rate(args.threads, pauser)
        print(
            f"fp32 matmul (64x512)@(512x16384), {args.threads} threads: {rate:.1f} GFLOP/s "
            f"(best of 10; other processes used {matmul_others:.0%} of the CPUs)",
            flush=True,
        )
        for device in devices:
            if device.startswith("cuda") and not torch.cuda.is_available():
                notes.append(f"device {device}: skipped: no CUDA")
                print(notes[-1], flush=True)
                continue
            for precision in precisions:
                for name in presets:
                    if args.in_process:  # one worker: on, off, on, off, ... step by step
                        runs = [{"alternate": settings}]
                    else:  # one worker a run: on, off, on, off, ...
                        runs = [{"kernels": setting} for _ in range(args.repeats) for setting in settings]
                    for run in runs:
                        spec = {
                            "preset": name,
                            "train": args.train,
                            "vocab": vocab,
                            "batch_size": args.batch_size,
                            "unroll_steps": args.unroll_steps,
                            "negatives": args.n_negative_samples,
                            "device": device,
                            "precision": precision,
                            "threads": args.threads,
                            "warmup": args.warmup,
                            "steps": args.steps,
                            "time_budget": args.time_budget,
                            **run,
                        }
                        env = {**thread_env(args.threads), "ELMOKIT_KERNELS": run.get("kernels", settings[0])}
                        if args.profile and name == "small" and not profiled:
                            spec["profile_steps"] = 3
                            profiled = True
                        cmd = [sys.executable, __file__, "--worker", json.dumps(spec)]
                        for _ in range(1 + args.retry_busy):  # again while others used the CPUs
                            wait_until_quiet(args.wait_quiet, args.wait_timeout, exclude_pid=args.pause_pid)
                            with pauser:
                                child = run_child(cmd, env=env)
                            if child.returncode != 0:
                                raise SystemExit(
                                    f"worker failed ({child.returncode}) for {name} {device} {precision}:\n"
                                    f"{child.stderr[-3000:]}"
                                )
                            measured = json.loads(child.stdout.strip().splitlines()[-1])
                            if measured[0]["others_cpu_busy"] <= BUSY:
                                break
                        for m in measured:
                            result = {
                                "preset": name,
                                "device": device,
                                "precision": precision,
                                **m,
                                "peak_rss_mb": child.peak_rss_mb,
                                "process_seconds": child.seconds,
                            }
                            results.append(result)
                            print(
                                f"  {name} {device} {precision}: {result['steps']} steps, "
                                f"{result['ms_per_step']:.0f} ms/step, loss {result['first_loss']:.2f} -> "
                                f"{result['last_loss']:.2f} ({child.seconds:.0f} s with start-up; kernels "
                                f"{result['kernels']})",
                                flush=True,
                            )

    if results:
        r0 = results[0]
        print(
            f"\ntorch {torch.__version__}, {args.threads} threads; batch {args.batch_size} x unroll "
            f"{args.unroll_steps} = {args.batch_size * args.unroll_steps} tokens/step; "
            f"{args.n_negative_samples} negatives; vocabulary {r0['vocab_size']:,} tokens "
            f"({'sampled' if r0['sampled'] else 'full'} softmax) from {args.vocab or args.train}"
        )
    header = (
        f"{'preset':<7} {'device':<6} {'prec':<5} {'params':>7} {'steps':>5} {'ms/step':>8} "
        f"{'min ms':>7} {'data ms':>7} {'distinct':>8} {'tok/s':>7} {'step tok/s':>10} {'peak RSS MB':>11} "
        f"{'model RSS MB':>12} {'others':>6}  kernels"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        print(
            f"{r['preset']:<7} {r['device']:<6} {r['precision']:<5} {r['parameters'] / 1e6:>6.1f}M "
            f"{r['steps']:>5} {r['ms_per_step']:>8.0f} {r['min_ms_per_step']:>7.0f} "
            f"{r['data_ms_per_step']:>7.1f} {100 * r['distinct_fraction']:>7.0f}% "
            f"{r['tokens_per_s']:>7.0f} {r['step_tokens_per_s']:>10.0f} "
            f"{r['peak_rss_mb']:>11.0f} {r['rss_after_model_mb']:>12.0f} "
            f"{100 * r['others_cpu_busy']:>5.0f}%  {r['kernels']}"
        )
    for note in notes:
        print(note)
    print("(ms/step = Trainer.step only; data ms = next batch; tok/s counts both; min ms = fastest step)")
    print("(distinct = distinct tokens / tokens of a step: the char CNN runs once per distinct token)")
    print("(others = share of all CPUs that other processes used during the timed steps)")
    matches_target = (
        args.batch_size == TARGET["batch_size"]
        and args.unroll_steps == TARGET["unroll_steps"]
        and args.n_negative_samples == TARGET["negatives"]
    )
    for r in results:
        if r["preset"] == TARGET["preset"] and r["device"] == "cpu" and matches_target:
            verdict = "meets" if r["tokens_per_s"] >= TARGET["tokens_per_s"] else "BELOW"
            print(
                f"target (issue): small preset, batch 32 x 20, 8192 negatives, CPU {args.threads} "
                f"threads: >= {TARGET['tokens_per_s']:,} tokens/s; {r['precision']}: "
                f"{r['tokens_per_s']:,.0f} tokens/s ({verdict})"
            )
    for r in results:
        if "profile" in r:
            prof = r["profile"]
            print(
                f"\nprofile: {r['preset']} {r['device']} {r['precision']}, {prof['steps']} steps, "
                f"{prof['wall_ms_per_step']:.0f} ms/step under the profiler; Optimizer.step "
                f"{prof['optimizer_ms_per_step']:.0f} ms/step; top 10 ops by self CPU time:"
            )
            print(prof["table"])
            print(
                f"FLOPs the profiler counts (matmul ops; not conv1d): "
                f"{prof['counted_gflop_per_step']:.1f} GFLOP/step, at least "
                f"{1000 * prof['counted_gflop_per_step'] / rate:.0f} ms/step at the matmul rate above"
            )
    comparison = compare(results, settings, args.compare_kernel) if args.compare_kernel else []
    print(pauser.summary())
    if args.json:
        write_report(
            args.json, command, pauser, rate, matmul_others,
            torch=torch.__version__, threads=args.threads, notes=notes, results=results,
            comparison=comparison,
        )


if __name__ == "__main__":
    main()
