"""Speed and peak memory of the `elmokit embed` command (random-weight models, published shapes).

    python benchmarks/bench_embed.py [--text GLOB] [--shapes small,original]
        [--sizes 10000,100000] [--original-sizes 1000] [--batch-size 64] [--mode warm]
        [--threads 2] [--time-budget T] [--pause-pid PID] [--json OUT]

Each shape gets fresh random weights, written with ``BiLM.save`` into a temp model folder
(options.json + weights.hdf5). Each (shape, size) runs the real command line as a subprocess,

    elmokit embed IN OUT --model DIR --layers top --quiet --batch-size B --mode M

with OMP_NUM_THREADS=MKL_NUM_THREADS=threads, and measures its wall time and its own peak RSS
(``os.wait4``). The input is a temp file of N sentences: the non-blank lines of the ``--text``
files in order, cycled until N; from the second cycle on each line's tokens are shuffled (same
tokens and length, new text), so that the sentence_to_index dataset grows as with N distinct
sentences. tokens = whitespace tokens of the input (what the command embeds).

"startup" is the wall time of the same command on a 1-sentence file (interpreter, torch, model
load, HDF5 output); "embed tok/s" = tokens / (seconds - startup) estimates the steady rate.
The original shape runs at a few hundred tokens/s on 2 cores, so it gets the smaller
``--original-sizes``. Memory must not grow with the file: compare the peak RSS of the sizes of a
shape. A run predicted (from the previous size of its shape) to take longer than
``--time-budget`` is skipped; a run still going at 2 x budget is killed.

``--pause-pid PID`` stops that process (e.g. a training job on the same cores) during each run
and resumes it right after (always, also on errors). Before each run the script waits (at most
``--wait-timeout`` s) until other processes use at most ``--wait-quiet`` of the CPUs.
"others" = share of all CPUs that other processes used during a run: figures with a high share
are low (with 2 threads on 2 cores, a busy neighbour slows every parallel op a lot).
"""

from __future__ import annotations

import argparse
import glob
import random
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import LM1B_SHARDS, Pauser, matmul_rate, run_child, thread_env, wait_until_quiet, write_report

import elmokit
from elmokit.model.options import preset

SHAPES = ("small", "original")


def read_pool(patterns: str) -> list[str]:
    """Non-blank lines (stripped) of the files matching a comma list of globs, in sorted order."""
    lines: list[str] = []
    for pattern in patterns.split(","):
        files = sorted(glob.glob(pattern.strip()))
        if not files:
            raise SystemExit(f"--text: no file matches {pattern!r}")
        for path in files:
            with open(path, encoding="utf-8") as handle:
                lines.extend(line.strip() for line in handle if line.strip())
    return lines


def write_input(pool: list[str], n: int, path: Path) -> int:
    """Write ``n`` sentences cycled from ``pool`` (tokens shuffled after the first cycle).
    Returns the number of tokens."""
    rng = random.Random(0)
    tokens = 0
    with open(path, "w", encoding="utf-8") as out:
        for i in range(n):
            words = pool[i % len(pool)].split()
            if i >= len(pool):
                rng.shuffle(words)
            tokens += len(words)
            out.write(" ".join(words) + "\n")
    return tokens


def embed_command(args: argparse.Namespace, model_dir: Path, inp: Path, out: Path) -> list[str]:
    script = Path(sys.executable).with_name("elmokit")
    prefix = [str(script)] if script.exists() else [sys.executable, "-m", "elmokit.cli"]
    return [
        *prefix,
        "embed",
        str(inp),
        str(out),
        "--model",
        str(model_dir),
        "--layers",
        args.layers,
        "--quiet",
        "--overwrite",
        "--batch-size",
        str(args.batch_size),
        "--mode",
        args.mode,
        "--device",
        "cpu",
        *shlex.split(args.embed_args),
    ]


def measure(
    args: argparse.Namespace, cmd: list[str], pauser: Pauser, timeout: float | None
) -> dict[str, Any]:
    wait_until_quiet(args.wait_quiet, args.wait_timeout, exclude_pid=args.pause_pid)
    with pauser:
        result = run_child(cmd, env=thread_env(args.threads), timeout=timeout, nice=args.nice)
    if result.timed_out:
        return {"timed_out": True, "seconds": result.seconds}
    if result.returncode != 0:
        raise SystemExit(f"failed ({result.returncode}): {shlex.join(cmd)}\n{result.stderr[-3000:]}")
    return {
        "seconds": result.seconds,
        "cpu_seconds": result.cpu_seconds,
        "peak_rss_mb": result.peak_rss_mb,
        "others_cpu_busy": result.others_cpu_busy,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--text",
        default=LM1B_SHARDS,
        help="comma list of globs of text, one whitespace-tokenized sentence a line "
        "(default: the three lm1b held-out shards in ../shared/data/lm)",
    )
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma list of presets")
    p.add_argument("--sizes", default="10000,100000", help="sentences per file (all shapes but original)")
    p.add_argument("--original-sizes", default="1000", help="sentences per file, original shape")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--mode", default="warm", choices=["warm", "zero", "stateful"])
    p.add_argument("--layers", default="top", choices=["all", "top", "average"])
    p.add_argument("--threads", type=int, default=2, help="OMP/MKL threads of the command")
    p.add_argument(
        "--time-budget",
        type=float,
        default=240.0,
        help="skip a run predicted to take longer than T s; kill one at 2 T (default 240)",
    )
    p.add_argument("--no-startup", action="store_true", help="do not measure the 1-sentence startup")
    p.add_argument("--embed-args", default="", help="extra arguments for elmokit embed (one string)")
    p.add_argument("--nice", type=int, default=0, help="run the command at this niceness (a memory-only run)")
    p.add_argument("--pause-pid", type=int, help="SIGSTOP this process during each run (SIGCONT after)")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.25,
        help="before each run wait until other processes (but --pause-pid) use at most this share "
        "of the CPUs (default 0.25; 1 = do not wait)",
    )
    p.add_argument("--wait-timeout", type=float, default=60.0, help="wait at most T s (default 60)")
    p.add_argument("--json", help="also write the results as JSON to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = shlex.join(["python", *sys.argv])  # no machine path in the record
    print(f"command: {command}", flush=True)
    pool = read_pool(args.text)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    print(f"text: {len(pool):,} sentences from {args.text}; {args.threads} threads", flush=True)
    pauser = Pauser(args.pause_pid)
    wait_until_quiet(args.wait_quiet, args.wait_timeout, exclude_pid=args.pause_pid)
    rate, matmul_others = matmul_rate(args.threads, pauser)
    print(
        f"fp32 matmul (64x512)@(512x16384), {args.threads} threads: {rate:.1f} GFLOP/s "
        f"(best of 10; other processes used {matmul_others:.0%} of the CPUs)",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    commands: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench_embed."))
    try:
        for shape in shapes:
            model_dir = tmp / shape
            model_dir.mkdir()
            elmokit.BiLM(preset(shape)).save(model_dir / "options.json", model_dir / "weights.hdf5")
            weights_mb = (model_dir / "weights.hdf5").stat().st_size / 2**20
            startup = None
            if not args.no_startup:
                one = tmp / "one.txt"
                write_input(pool, 1, one)
                cmd = embed_command(args, model_dir, one, tmp / "one.hdf5")
                startup = measure(args, cmd, pauser, timeout=args.time_budget)
                print(
                    f"{shape}: weights {weights_mb:.0f} MB; startup (1 sentence) "
                    f"{startup['seconds']:.1f} s, peak RSS {startup['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
            sizes_arg = args.original_sizes if shape == "original" else args.sizes
            rate = None  # sentences/s of the previous size, to predict the next
            for n in sorted(int(s) for s in sizes_arg.split(",")):
                row: dict[str, Any] = {"shape": shape, "sentences": n, "weights_mb": weights_mb}
                if startup is not None:
                    row["startup_seconds"] = startup["seconds"]
                    row["startup_peak_rss_mb"] = startup["peak_rss_mb"]
                if rate is not None:
                    predicted = (startup["seconds"] if startup else 0.0) + n / rate
                    if predicted > args.time_budget:
                        print(
                            f"  {n} sentences: skipped, predicted {predicted:.0f} s > "
                            f"--time-budget {args.time_budget:.0f}",
                            flush=True,
                        )
                        results.append({**row, "skipped": f"predicted {predicted:.0f} s"})
                        continue
                inp, out = tmp / f"in-{n}.txt", tmp / "out.hdf5"
                row["tokens"] = write_input(pool, n, inp)
                cmd = embed_command(args, model_dir, inp, out)
                commands.append(shlex.join(["elmokit", *cmd[cmd.index("embed"):]]).replace(str(tmp), "DIR"))
                row.update(measure(args, cmd, pauser, timeout=2 * args.time_budget))
                inp.unlink()
                if row.get("timed_out"):
                    print(f"  {n} sentences: killed after {row['seconds']:.0f} s", flush=True)
                    results.append(row)
                    continue
                row["output_mb"] = out.stat().st_size / 2**20
                out.unlink()
                row["sentences_per_s"] = n / row["seconds"]
                row["tokens_per_s"] = row["tokens"] / row["seconds"]
                if startup is not None and row["seconds"] > startup["seconds"]:
                    row["embed_tokens_per_s"] = row["tokens"] / (row["seconds"] - startup["seconds"])
                rate = n / max(row["seconds"] - (startup["seconds"] if startup else 0.0), 1e-3)
                results.append(row)
                print(
                    f"  {n} sentences, {row['tokens']} tokens in {row['seconds']:.1f} s, "
                    f"peak RSS {row['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    header = (
        f"{'shape':<9} {'sentences':>9} {'tokens':>9} {'seconds':>8} {'sent/s':>7} {'tok/s':>7} "
        f"{'embed tok/s':>11} {'peak RSS MB':>11} {'startup s':>9} {'others':>6}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        if "skipped" in r or r.get("timed_out"):
            note = r.get("skipped") or f"killed after {r['seconds']:.0f} s"
            print(f"{r['shape']:<9} {r['sentences']:>9} ({note})")
            continue
        embed_rate = r.get("embed_tokens_per_s")
        startup_s = r.get("startup_seconds")
        print(
            f"{r['shape']:<9} {r['sentences']:>9} {r['tokens']:>9} {r['seconds']:>8.1f} "
            f"{r['sentences_per_s']:>7.1f} {r['tokens_per_s']:>7.0f} "
            f"{(f'{embed_rate:.0f}' if embed_rate else '-'):>11} {r['peak_rss_mb']:>11.0f} "
            f"{(f'{startup_s:.1f}' if startup_s is not None else '-'):>9} "
            f"{100 * r['others_cpu_busy']:>5.0f}%"
        )
    print(
        f"(batch {args.batch_size}, mode {args.mode}, --layers {args.layers}, {args.threads} threads; "
        "seconds = wall time of the whole command; embed tok/s = tokens / (seconds - startup))"
    )
    print("(others = share of all CPUs that other processes used during the run; high = unreliable)")
    for shape in shapes:
        done = [r for r in results if r["shape"] == shape and "peak_rss_mb" in r]
        if len(done) >= 2:
            small, large = done[0], done[-1]
            print(
                f"memory, {shape}: {small['sentences']:,} -> {large['sentences']:,} sentences: "
                f"peak RSS {small['peak_rss_mb']:.0f} -> {large['peak_rss_mb']:.0f} MB "
                f"({large['peak_rss_mb'] - small['peak_rss_mb']:+.0f} MB)"
            )
    print("commands (DIR is a temporary folder):")
    for c in commands:
        print(f"  {c}")
    print(pauser.summary())
    if args.json:
        write_report(
            args.json, command, pauser, rate, matmul_others,
            threads=args.threads, batch_size=args.batch_size, mode=args.mode, layers=args.layers,
            text=args.text, embed_commands=commands, results=results,
        )


if __name__ == "__main__":
    main()
