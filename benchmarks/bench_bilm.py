"""Inference speed of the biLM on real sentences, in the published model shapes (random weights).

    python benchmarks/bench_bilm.py --sentences FILE [--shapes small,original]
        [--batch-sizes 1,16,64] [--n-sentences N] [--time-budget T] [--threads 2]
        [--pause-pid PID] [--profile N] [--json OUT]

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

import elmokit
from elmokit.char_cnn import TokenEncoder
from elmokit.options import BiLMOptions, preset

SHAPES = ("small", "original")
# Default sentences per shape: the original shape runs at a few hundred tokens/s on 2 cores.
DEFAULT_N = {"small": 256, "original": 64}


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


def matmul_gflops(threads: int, repeats: int = 10, runs: int = 10) -> float:
    """Best-of-``runs`` fp32 rate of (64x512) @ (512x16384), ``repeats`` matmuls per run."""
    torch.set_num_threads(threads)
    a, b = torch.randn(64, 512), torch.randn(512, 16384)
    out = torch.empty(64, 16384)
    for _ in range(5 * repeats):  # warm-up (the first runs are slower)
        torch.matmul(a, b, out=out)
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(repeats):
            torch.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return 2 * 64 * 512 * 16384 * repeats / best / 1e9


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


def cpu_sample() -> tuple[int, int, float]:
    """(all CPUs' total jiffies, idle jiffies, this process's CPU seconds) for ``others_busy``."""
    with open("/proc/stat") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    own = resource.getrusage(resource.RUSAGE_SELF)
    return sum(values), values[3] + values[4], own.ru_utime + own.ru_stime


def others_busy(before: tuple[int, int, float], after: tuple[int, int, float]) -> float:
    """Fraction of all CPUs used by other processes between two ``cpu_sample`` calls."""
    total = max(after[0] - before[0], 1)
    busy = 1 - (after[1] - before[1]) / total
    own = (after[2] - before[2]) * os.sysconf("SC_CLK_TCK") / total
    return max(busy - own, 0.0)


def rss_mb() -> float:
    """Current resident set size of this process in MB."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Load one model, time it on one batch size; returns the figures of this configuration."""
    torch.set_num_threads(spec["threads"])
    rss_import = rss_mb()
    model = elmokit.BiLM.load(spec["options_file"], spec["weight_file"])
    model.token_encoder.cache_size = spec["token_cache"]
    rss_model = rss_mb()
    sentences = read_sentences(spec["sentences"], spec["n_sentences"])
    size = spec["batch_size"]
    batches = [sentences[i : i + size] for i in range(0, len(sentences), size)]
    char_ids = [elmokit.batch_to_ids(b) for b in batches]
    tokens = sentences_done = distinct = 0
    elapsed = 0.0
    with torch.no_grad():
        model(char_ids[0])  # warm-up, not timed
        model.token_encoder.clear_cache()  # the timed run starts with an empty token cache
        cpu_before = cpu_sample()
        for batch, ids in zip(batches, char_ids):
            start = time.perf_counter()
            model(ids)
            elapsed += time.perf_counter() - start
            tokens += sum(len(s) for s in batch)
            distinct += len({t for s in batch for t in s})
            sentences_done += len(batch)
            if elapsed >= spec["time_budget"]:
                break
    others = others_busy(cpu_before, cpu_sample())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
    hits, misses = model.token_encoder.cache_stats  # before the profile run adds its own
    top = (
        profile_ops(model, char_ids, spec["profile_sentences"], size)
        if spec.get("profile_sentences")
        else None
    )
    return {
        "profile": top,
        "token_cache": spec["token_cache"],
        "token_cache_hit_rate": hits / max(hits + misses, 1),
        "tokens": tokens,
        "sentences": sentences_done,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
        "sentences_per_s": sentences_done / elapsed,
        "distinct_fraction": distinct / tokens,
        "others_cpu_busy": others,
        "rss_after_import_mb": rss_import,
        "rss_after_load_mb": rss_model,
        "peak_rss_mb": peak,
    }


def profile_ops(model: elmokit.BiLM, char_ids: list[torch.Tensor], sentences: int, size: int) -> list:
    """torch.profiler over the first ``sentences`` sentences (after the timed run): the 12 ops
    with the largest self CPU time, as [op, share of all self CPU time, calls]."""
    from torch.profiler import profile

    model.token_encoder.clear_cache()  # as cold as the timed run
    with torch.no_grad(), profile() as prof:
        for ids in char_ids[: max(sentences // size, 1)]:
            model(ids)
    averages = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in averages)
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return [[e.key, e.self_cpu_time_total / total, e.count] for e in top]


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``worker(spec)`` in a fresh interpreter; its result is the last line of its stdout."""
    cmd = [sys.executable, __file__, "--worker", json.dumps(spec)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


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
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is None and not args.sentences:
        p.error("--sentences is required")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    command = shlex.join([sys.executable, *sys.argv])
    print(f"command: {command}", flush=True)
    from common import Pauser, write_report  # common imports this module: import it only here

    pauser = Pauser(args.pause_pid)
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
                with pauser:
                    measured = run_worker(spec)
                result = {"shape": shape, "batch_size": size, **measured}
                result["gflops_per_s"] = per_token * result["tokens_per_s"] / 1e9
                result["fraction_of_matmul"] = result["gflops_per_s"] / rate
                # The roofline: LSTM FLOPs per token + encoder FLOPs per distinct token.
                needed = flops[shape]["lstm"] + flops[shape]["token_encoder"] * result["distinct_fraction"]
                result["roofline_tokens_per_s"] = rate * 1e9 / needed
                result["fraction_of_roofline"] = result["tokens_per_s"] / result["roofline_tokens_per_s"]
                results.append(result)
                print(
                    f"  batch {size}: {result['sentences']} sentences, {result['tokens']} tokens "
                    f"in {result['seconds']:.1f} s",
                    flush=True,
                )
    header = (
        f"{'shape':<9} {'batch':>5} {'tokens/s':>9} {'sent/s':>7} {'GFLOP/s':>8} "
        f"{'% matmul':>8} {'% roofline':>10} {'distinct':>8} "
        f"{'cached':>6} {'peak RSS MB':>11} {'model RSS MB':>12} {'others':>6}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        print(
            f"{r['shape']:<9} {r['batch_size']:>5} {r['tokens_per_s']:>9.1f} "
            f"{r['sentences_per_s']:>7.2f} {r['gflops_per_s']:>8.2f} "
            f"{100 * r['fraction_of_matmul']:>7.1f}% {100 * r['fraction_of_roofline']:>9.1f}% "
            f"{100 * r['distinct_fraction']:>7.0f}% {100 * r['token_cache_hit_rate']:>5.0f}% "
            f"{r['peak_rss_mb']:>11.0f} {r['rss_after_load_mb']:>12.0f} "
            f"{100 * r['others_cpu_busy']:>5.0f}%"
        )
    for r in results:
        if r["profile"]:
            print(f"\nprofile, {r['shape']} batch {r['batch_size']} (share of self CPU time, calls):")
            for op, share, calls in r["profile"]:
                print(f"  {op:<32} {100 * share:5.1f}%  {calls:>7}")
    baseline = min(r["rss_after_import_mb"] for r in results)
    print(f"(model RSS = RSS right after BiLM.load; python + torch alone is ~{baseline:.0f} MB)")
    print("(others = share of all CPUs that other processes used while this configuration ran)")
    if max([matmul_others] + [r["others_cpu_busy"] for r in results]) > 0.1:
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
        )


if __name__ == "__main__":
    main()
