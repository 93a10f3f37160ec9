"""Inference speed of the biLM on real sentences, in the published model shapes (random weights).

    python benchmarks/bench_bilm.py --sentences FILE [--shapes small,original]
        [--batch-sizes 1,16,64] [--n-sentences N] [--time-budget T] [--threads 2]
        [--kernels on|off|NAMES] [--compare-kernel NAME [--repeats 3] [--in-process]]
        [--pause-pid PID] [--wait-quiet 0.25] [--retry-busy 2] [--profile N] [--json OUT]

Each shape is built with fresh random weights, written with ``BiLM.save`` to a temp dir and read
back with ``BiLM.load``. Every (shape, batch size) runs in its own subprocess (this script with
``--worker``) so that its peak RSS is its own. A worker reads the first N non-empty lines of FILE
(whitespace tokens; the same sentences for every batch size of a shape), batches them in file
order (no length sorting), runs one untimed warm-up batch, then times ``model(char_ids)`` under
``torch.no_grad`` in stateless mode, stopping after the batch that passes the time budget.
Tokens are real tokens only (the <S> </S> boundaries and padding are not counted); char ids are
made before timing. GFLOP/s = FLOPs/token (see ``flops_per_token``) * tokens/s, so it counts
useful work only, not the work the model spends on boundaries and padding. The model runs the
char CNN once per distinct token of a batch, so it does less token-encoder work than FLOPs/token
says: the "distinct" column (distinct tokens per batch / tokens) shows how much less; GFLOP/s
can thus exceed the matmul rate at large batches. "% roofline" is the issue's measure: tokens/s
against the matmul rate divided by (LSTM FLOPs per token + encoder FLOPs per distinct token); the
encoder FLOPs count all 50 character positions, while the model convolves only real windows, so
it can exceed 100% too.

The model keeps token encodings across calls (its token cache, ``--token-cache N``, 0 = off;
on by default as in the library). The cache is emptied after the warm-up batch, so the timed
run starts cold; "cached" is the share of each batch's distinct tokens found from earlier
batches. The roofline does not know about the cache: compare "% roofline" with
``--token-cache 0``.

``--kernels`` sets ``ELMOKIT_KERNELS`` for the workers (``on``, ``off``, or a value that
``elmokit.base.kernels.parse`` reads, e.g. ``--kernels=-token_cache``). ``--compare-kernel NAME`` runs
every configuration with that kernel on and off in turn (on, off, on, off, ...; ``--repeats``
times each, 3 by default) and prints the median tokens/s of each and the kernel's gain; with
``--in-process`` one worker per configuration does that, switching the kernel between passes over
the sentences (``elmokit.base.kernels.set_enabled``), which leaves out the drift between processes.

``--pause-pid PID`` stops that process (e.g. a training job on the same cores) during the matmul
measurement and each worker run, and resumes it right after (always, also on errors).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import Pauser, cpu_sample, matmul_gflops, others_busy, start_cold, wait_until_quiet, write_report

import elmokit
from elmokit.model.char_cnn import TokenEncoder
from elmokit.model.options import BiLMOptions, preset

SHAPES = ("small", "original")
# Default sentences per shape: the original shape runs at a few hundred tokens/s on 2 cores.
DEFAULT_N = {"small": 256, "original": 64}
# Share of the CPUs used by other processes above which a measurement is unreliable.
BUSY = 0.1


def flops_per_token(options: BiLMOptions) -> dict[str, int]:
    """Multiply-add FLOPs (2 per MAC) per token from the shapes; elementwise ops are ignored.

    LSTM, per layer and direction (in = input size, here always projection_dim):
        2 * (in + proj) * 4 * dim  +  2 * dim * proj   (gates, then projection)
    times 2 directions and n_layers.
    Token encoder (C = max_characters_per_token, e = char embedding dim, F = total filters):
        char CNN:   sum over filters (w, n) of 2 * w * e * n * (C - w + 1)
        highway:    n_highway * 2 matmuls * 2 * F^2
        projection: 2 * F * proj (if F != proj)
    """
    lstm, cnn = options.lstm, options.char_cnn
    dim, proj = lstm.dim, lstm.projection_dim
    per_layer = 2 * (proj + proj) * 4 * dim + (2 * dim * proj if lstm.has_projection else 0)
    n_filters, chars = cnn.n_filters, cnn.max_characters_per_token
    conv = sum(2 * w * cnn.embedding_dim * n * (chars - w + 1) for w, n in cnn.filters)
    highway = cnn.n_highway * 2 * 2 * n_filters**2
    projection = 2 * n_filters * proj if n_filters != proj else 0
    return {"lstm": 2 * lstm.n_layers * per_layer, "token_encoder": conv + highway + projection}




def read_sentences(path: str, n: int) -> list[list[str]]:
    """The first ``n`` non-empty lines of ``path``, split on whitespace."""
    sentences: list[list[str]] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if tokens := line.split():
                sentences.append(tokens)
                if len(sentences) == n:
                    break
    return sentences






def rss_mb() -> float:
    """Current resident set size of this process in MB."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Load one model, time it on one batch size; returns the figures of each timed pass.

    One pass over the sentences, or with ``spec["alternate"]`` (``ELMOKIT_KERNELS`` values) one
    pass per value in turn, ``spec["passes"]`` rounds, switching with ``elmokit.base.kernels``."""
    from elmokit.base import kernels

    torch.set_num_threads(spec["threads"])
    rss_import = rss_mb()
    model = elmokit.BiLM.load(spec["options_file"], spec["weight_file"])
    model.token_encoder.cache_size = spec["token_cache"]
    rss_model = rss_mb()
    sentences = read_sentences(spec["sentences"], spec["n_sentences"])
    size = spec["batch_size"]
    batches = [sentences[i : i + size] for i in range(0, len(sentences), size)]
    char_ids = [elmokit.batch_to_ids(b) for b in batches]
    settings = spec.get("alternate") or [spec.get("kernels", "1")]

    def use(setting: str) -> None:
        names = kernels.parse(setting)
        kernels.set_enabled(False)
        if names:
            kernels.set_enabled(True, *names)

    results = []
    with torch.no_grad():
        for setting in settings:  # warm-up, not timed
            use(setting)
            model(char_ids[0])
        for _ in range(spec.get("passes", 1)):
            for setting in settings:
                use(setting)
                start_cold(model, "a timed pass")  # each timed pass starts with an empty token cache
                results.append(
                    {"kernels": setting, **timed_pass(model, batches, char_ids, spec["time_budget"])}
                )
    top = (
        profile_ops(model, char_ids, spec["profile_sentences"], size)
        if spec.get("profile_sentences")
        else None
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
    for result in results:
        result.update(
            profile=top,
            token_cache=spec["token_cache"],
            rss_after_import_mb=rss_import,
            rss_after_load_mb=rss_model,
            peak_rss_mb=peak,
        )
    return results


def timed_pass(
    model: elmokit.BiLM, batches: list[list[list[str]]], char_ids: list[torch.Tensor], budget: float
) -> dict[str, Any]:
    """Time ``model(ids)`` over the batches, stopping after the batch that passes ``budget`` s."""
    tokens = sentences_done = distinct = 0
    elapsed = 0.0
    cpu_before = cpu_sample()
    for batch, ids in zip(batches, char_ids):
        start = time.perf_counter()
        model(ids)
        elapsed += time.perf_counter() - start
        tokens += sum(len(s) for s in batch)
        distinct += len({t for s in batch for t in s})
        sentences_done += len(batch)
        if elapsed >= budget:
            break
    hits, misses = model.token_encoder.cache_stats
    return {
        "token_cache_hit_rate": hits / max(hits + misses, 1),
        "tokens": tokens,
        "sentences": sentences_done,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
        "sentences_per_s": sentences_done / elapsed,
        "distinct_fraction": distinct / tokens,
        "others_cpu_busy": others_busy(cpu_before, cpu_sample()),
    }


def profile_ops(model: elmokit.BiLM, char_ids: list[torch.Tensor], sentences: int, size: int) -> list:
    """torch.profiler over the first ``sentences`` sentences (after the timed run): the 12 ops
    with the largest self CPU time, as [op, share of all self CPU time, calls]."""
    from torch.profiler import profile

    start_cold(model, "the profiled pass")  # as cold as the timed run
    with torch.no_grad(), profile() as prof:
        for ids in char_ids[: max(sentences // size, 1)]:
            model(ids)
    averages = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in averages)
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return [[e.key, e.self_cpu_time_total / total, e.count] for e in top]


def run_worker(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Run ``worker(spec)`` in a fresh interpreter (``ELMOKIT_KERNELS`` = ``spec["kernels"]``);
    its results are the last line of its stdout."""
    cmd = [sys.executable, __file__, "--worker", json.dumps(spec)]
    env = {**os.environ, "ELMOKIT_KERNELS": spec.get("kernels", "1")}
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def kernel_settings(base: str, compare: str | None) -> list[str]:
    """The ``ELMOKIT_KERNELS`` values to run: ``base``, or (comparing kernel ``compare``) base
    with that kernel on, then off."""
    from elmokit.base import kernels

    value = {"on": "1", "off": "0"}.get(base, base)
    if compare is None:
        return [value]
    on = kernels.parse(value)
    if compare not in kernels.NAMES:
        raise SystemExit(f"--compare-kernel: unknown kernel {compare} (known: {', '.join(kernels.NAMES)})")
    return [",".join(sorted(on | {compare})), ",".join(sorted(on - {compare})) or "0"]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sentences", help="text file, one whitespace-tokenized sentence a line")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma list of: small, original")
    p.add_argument("--batch-sizes", default="1,16,64", help="comma list of batch sizes")
    p.add_argument("--n-sentences", type=int, help=f"sentences per shape (default {DEFAULT_N})")
    p.add_argument(
        "--time-budget",
        type=float,
        default=20.0,
        help="stop a configuration after the batch that passes T seconds (default 20)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--pause-pid", type=int, help="SIGSTOP this process during each run (SIGCONT after)")
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
        "--profile",
        type=int,
        metavar="N",
        help="after timing, profile N sentences (torch.profiler) and print each op's share",
    )
    p.add_argument(
        "--token-cache",
        type=int,
        default=TokenEncoder.DEFAULT_CACHE_SIZE,
        help="the token encoder's cache size (tokens kept across batches); 0 = off "
        f"(default {TokenEncoder.DEFAULT_CACHE_SIZE:,}, the model's default)",
    )
    p.add_argument(
        "--kernels",
        default="on",
        help="ELMOKIT_KERNELS for the workers: on (default), off, or e.g. --kernels=-token_cache",
    )
    p.add_argument("--compare-kernel", metavar="NAME", help="run each configuration with NAME on and off")
    p.add_argument("--repeats", type=int, help="runs of each setting, interleaved (default 1; 3 comparing)")
    p.add_argument(
        "--in-process",
        action="store_true",
        help="with --compare-kernel: one worker per configuration switches the kernel pass by pass",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is None and not args.sentences:
        p.error("--sentences is required")
    if args.repeats is None:
        args.repeats = 3 if args.compare_kernel else 1
    return args


def compare(results: list[dict[str, Any]], settings: list[str], name: str) -> list[dict[str, Any]]:
    """Print and return, per (shape, batch size), the median tokens/s with kernel ``name`` on
    and off and its gain: the median of the on/off ratios of consecutive runs (on, off), which
    drift on a shared machine moves less than the ratio of the medians."""
    print(f"\nkernel {name}: median tokens/s of the interleaved runs (range); gain = median on/off ratio")
    rows = []
    for shape, size in dict.fromkeys((r["shape"], r["batch_size"]) for r in results):
        same = [r for r in results if (r["shape"], r["batch_size"]) == (shape, size)]
        runs = [[r["tokens_per_s"] for r in same if r["kernels"] == s] for s in settings]
        on, off = median(runs[0]), median(runs[1])
        gain = median([a / b for a, b in zip(*runs)]) - 1
        rows.append({"shape": shape, "batch_size": size, "on": on, "off": off, "gain": gain, "runs": runs})
        print(
            f"  {shape} batch {size}: on {on:,.0f} ({min(runs[0]):,.0f}-{max(runs[0]):,.0f}), "
            f"off {off:,.0f} ({min(runs[1]):,.0f}-{max(runs[1]):,.0f}): gain {100 * gain:+.1f}%"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    command = shlex.join(["python", *sys.argv])  # no machine path in the record
    print(f"command: {command}", flush=True)
    pauser = Pauser(args.pause_pid)
    wait_until_quiet(args.wait_quiet, args.wait_timeout, exclude_pid=args.pause_pid)
    with pauser:
        cpu_before = cpu_sample()  # other processes on the machine skew every figure
        rate = matmul_gflops(args.threads)
        matmul_others = others_busy(cpu_before, cpu_sample())
    print(
        f"torch {torch.__version__}, {args.threads} threads; fp32 matmul (64x512)@(512x16384): "
        f"{rate:.1f} GFLOP/s (best of 10; other processes used {matmul_others:.0%} of the CPUs)"
    )
    results: list[dict[str, Any]] = []
    flops: dict[str, dict[str, int]] = {}
    settings = kernel_settings(args.kernels, args.compare_kernel)
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            options_file, weight_file = Path(tmp, f"{shape}.json"), Path(tmp, f"{shape}.hdf5")
            model = elmokit.BiLM(preset(shape))
            model.save(options_file, weight_file)
            flops[shape] = flops_per_token(model.options)
            del model
            per_token = sum(flops[shape].values())
            print(
                f"{shape}: LSTM {flops[shape]['lstm'] / 1e6:.1f} MFLOP/token, token encoder "
                f"{flops[shape]['token_encoder'] / 1e6:.1f} MFLOP/token, weights "
                f"{weight_file.stat().st_size / 2**20:.0f} MB"
            )
            for size in sizes:
                spec = {
                    "options_file": str(options_file),
                    "weight_file": str(weight_file),
                    "sentences": args.sentences,
                    "batch_size": size,
                    "threads": args.threads,
                    "n_sentences": args.n_sentences or DEFAULT_N.get(shape, 64),
                    "time_budget": args.time_budget,
                    "profile_sentences": args.profile,
                    "token_cache": args.token_cache,
                }
                if args.in_process:  # one worker: on, off, on, off, ... pass by pass
                    runs = [{"alternate": settings, "passes": args.repeats}]
                else:  # one worker a run: on, off, on, off, ...
                    runs = [{"kernels": setting} for _ in range(args.repeats) for setting in settings]
                for run in runs:
                    for _ in range(1 + args.retry_busy):  # again while others used the CPUs
                        wait_until_quiet(args.wait_quiet, args.wait_timeout, exclude_pid=args.pause_pid)
                        with pauser:
                            measured = run_worker({**spec, **run})
                        if max(m["others_cpu_busy"] for m in measured) <= BUSY:
                            break
                    for m in measured:
                        result = {"shape": shape, "batch_size": size, **m}
                        result["gflops_per_s"] = per_token * result["tokens_per_s"] / 1e9
                        result["fraction_of_matmul"] = result["gflops_per_s"] / rate
                        # The roofline: LSTM FLOPs per token + encoder FLOPs per distinct token.
                        needed = (
                            flops[shape]["lstm"] + flops[shape]["token_encoder"] * result["distinct_fraction"]
                        )
                        result["roofline_tokens_per_s"] = rate * 1e9 / needed
                        result["fraction_of_roofline"] = (
                            result["tokens_per_s"] / result["roofline_tokens_per_s"]
                        )
                        results.append(result)
                        print(
                            f"  batch {size}, kernels {result['kernels']}: {result['sentences']} sentences, "
                            f"{result['tokens']} tokens in {result['seconds']:.1f} s "
                            f"({result['tokens_per_s']:.0f} tokens/s)",
                            flush=True,
                        )
    header = (
        f"{'shape':<9} {'batch':>5} {'tokens/s':>9} {'sent/s':>7} {'GFLOP/s':>8} "
        f"{'% matmul':>8} {'% roofline':>10} {'distinct':>8} "
        f"{'cached':>6} {'peak RSS MB':>11} {'model RSS MB':>12} {'others':>6}  kernels"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        print(
            f"{r['shape']:<9} {r['batch_size']:>5} {r['tokens_per_s']:>9.1f} "
            f"{r['sentences_per_s']:>7.2f} {r['gflops_per_s']:>8.2f} "
            f"{100 * r['fraction_of_matmul']:>7.1f}% {100 * r['fraction_of_roofline']:>9.1f}% "
            f"{100 * r['distinct_fraction']:>7.0f}% {100 * r['token_cache_hit_rate']:>5.0f}% "
            f"{r['peak_rss_mb']:>11.0f} {r['rss_after_load_mb']:>12.0f} "
            f"{100 * r['others_cpu_busy']:>5.0f}%  {r['kernels']}"
        )
    comparison = compare(results, settings, args.compare_kernel) if args.compare_kernel else []
    for r in results:
        if r["profile"]:
            print(f"\nprofile, {r['shape']} batch {r['batch_size']} (share of self CPU time, calls):")
            for op, share, calls in r["profile"]:
                print(f"  {op:<32} {100 * share:5.1f}%  {calls:>7}")
    baseline = min(r["rss_after_import_mb"] for r in results)
    print(f"(model RSS = RSS right after BiLM.load; python + torch alone is ~{baseline:.0f} MB)")
    print("(others = share of all CPUs that other processes used while this configuration ran)")
    if max([matmul_others] + [r["others_cpu_busy"] for r in results]) > BUSY:
        print("WARNING: other processes were using the CPUs; the figures are unreliable (low)")
    print(pauser.summary())
    if args.json:
        write_report(
            args.json,
            command,
            pauser,
            rate,
            matmul_others,
            torch=torch.__version__,
            threads=args.threads,
            flops_per_token=flops,
            results=results,
            comparison=comparison,
        )


if __name__ == "__main__":
    main()
