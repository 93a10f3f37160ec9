"""A corpus through `elmokit embed`: one process, `--nproc 2` and Ray Data, to HDF5 and Parquet.

    python benchmarks/bench_corpus.py [CORPUS] [--sentences 20000] [--models tiny,small]
        [--workers 2] [--rounds 1] [--threads T] [--cells one-hdf5,...,ray-parquet]
        [--shard-sentences S] [--seed 0]
        [--timeout 1800] [--json OUT]

The same sentences (the first ``--sentences`` non-blank lines of CORPUS, one tokenized sentence a
line, cycled if it is shorter; without CORPUS a generated file of random words, 5 to 35 a line)
go through each model -- ``tiny``: the shipped ``elmo-tiny-reference``; ``small``: random
weights of the small shape (2x1024_128, 1 highway) that the other benchmarks use, written with
``BiLM.save`` -- as the commands a user runs, each a subprocess:

    elmokit embed IN OUT.{hdf5,parquet} --model M --quiet --overwrite              (one process)
    elmokit embed IN OUT.{hdf5,parquet} --model M --quiet --overwrite --nproc 2
    elmokit embed IN OUT.parquet --model M --quiet --overwrite --engine ray --workers 2

(the Ray engine writes Parquet only), with OMP_NUM_THREADS=T (default: the CPUs; ``--nproc`` and
each Ray actor divide them). In every round the cells run one after the other, their order
reversed in every other round, so that the ratios (Ray / ``--nproc 2`` tokens/s, Parquet / HDF5
seconds) compare runs made close in time; each ratio is the median over the rounds of the ratio
within a round (also over the quiet rounds alone: those in which processes outside the runs'
trees took at most 5% of the CPUs). Per run: wall time, tokens/s (input tokens / wall time,
start-up included, as a user sees it), the peak RSS of each process of the command (psutil,
sampled every 0.1 s over the command's process tree; "workers" are the processes that embed: the
one process, the ``--nproc`` processes, Ray's actors) and of its RSS less its shared pages
("private": a Ray actor's RSS counts the pages of Ray's shared-memory object store that it wrote
into), the CPU seconds of the workers, of the command when it does not embed (the ``--nproc``
launcher, Ray's driver) and of the tree's other processes (Ray's services), the output's size,
and the share of the CPUs that processes outside the tree used meanwhile. ``--cells`` picks some
of the five runs of a model (``nproc-parquet,ray-parquet`` for the Ray ratio alone).

Resume (when ``elmokit embed`` has ``--shard-sentences``; "not available" otherwise): per model
and format, an uninterrupted sharded run into a folder of parts of ``--shard-sentences`` lines,
then the same command killed (SIGKILL to its process group) as soon as the manifest names half
of the parts complete, then the same command again; its wall time is compared with the bound
"start-up + the unfinished parts plus one part" (start-up: a 1-line run; a part's time: the
uninterrupted run's embedding time / parts), and the resumed folder's parts with the
uninterrupted one's (SHA-256 in the manifests).

Checks (assertions): every command exits 0; every output holds all lines; a resumed folder's
parts equal the uninterrupted ones. The goals of issue 45 are reported as met or not, never
asserted (a shared machine can miss them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "corpus"
SHAPES = {"tiny": "elmo-tiny-reference", "small": "small"}
CELLS = [("one", "hdf5"), ("one", "parquet"), ("nproc", "hdf5"), ("nproc", "parquet"), ("ray", "parquet")]


# -- the input -----------------------------------------------------------------------------------
def corpus_lines(path: str | None, n: int, seed: int) -> list[str]:
    """``n`` lines: CORPUS's non-blank lines in order (cycled), else random words."""
    if path:
        with open(path, encoding="utf-8") as handle:
            source = [line.strip() for line in handle if line.strip()]
        if not source:
            raise ValueError(f"{path} holds no non-blank line")
        return [source[i % len(source)] for i in range(n)]
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rng.choices(letters, k=rng.randint(1, 9))) for _ in range(5000)]
    weights = [1.0 / (rank + 1) for rank in range(len(vocab))]  # Zipf-like word frequencies
    return [" ".join(rng.choices(vocab, weights, k=rng.randint(5, 35))) for _ in range(n)]


def small_model(folder: Path, seed: int) -> Path:
    """Random weights of the small shape, saved as a model folder (options.json + weights.hdf5)."""
    import torch

    import elmokit
    from elmokit.model.options import preset

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    elmokit.BiLM(preset("small")).save(folder / "options.json", folder / "weights.hdf5")
    return folder


# -- one measured command ------------------------------------------------------------------------
class TreeSampler(threading.Thread):
    """Peak RSS and CPU seconds of every process of a process tree, sampled every ``interval``
    seconds (a process's CPU time as last seen: a Ray cluster's processes, which the command
    stops rather than reaps, count as the command's, not as other processes')."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peaks: dict[int, float] = {}  # MB
        self.private_peaks: dict[int, float] = {}  # MB: RSS less its shared pages
        self.titles: dict[int, str] = {}
        self.cpu: dict[int, float] = {}  # CPU seconds
        self.tree_peak = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self.stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            total = 0.0
            for proc in procs:
                try:
                    memory = proc.memory_info()
                    rss = memory.rss / 2**20
                    private = (memory.rss - getattr(memory, "shared", 0)) / 2**20
                    title = " ".join(proc.cmdline())[:160]
                    times = proc.cpu_times()
                    self.cpu[proc.pid] = times.user + times.system
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                total += rss
                if rss >= self.peaks.get(proc.pid, 0.0):
                    self.peaks[proc.pid] = rss
                if private >= self.private_peaks.get(proc.pid, 0.0):
                    self.private_peaks[proc.pid] = private
                if title:  # the last title seen (Ray renames its workers; an exiting one has none)
                    self.titles[proc.pid] = title
            self.tree_peak = max(self.tree_peak, total)
            self.stop.wait(self.interval)

    def workers(self, engine: str, private: bool = False) -> list[float]:
        """Peak RSS (MB) of each process that embeds, largest first; with ``private``, of its
        RSS less the shared pages (a Ray actor's RSS counts the pages of Ray's shared-memory
        object store that it wrote its results into)."""
        peaks = self.private_peaks if private else self.peaks
        return sorted((round(peaks.get(pid, 0.0), 1) for pid in self.worker_pids(engine)), reverse=True)

    def cpu_split(self, engine: str) -> dict[str, float]:
        """CPU seconds of the processes that embed ("workers"), of the command when it is not
        one of them ("command": the ``--nproc`` launcher, Ray's driver that writes the Parquet
        file) and of the tree's other processes ("rest": Ray's services and helper actors, its
        idle workers, multiprocessing's resource tracker)."""
        workers = set(self.worker_pids(engine))
        command = {self.pid} - workers

        def total(pids: set[int]) -> float:
            return round(sum(self.cpu.get(pid, 0.0) for pid in pids), 1)

        return {
            "workers": total(workers),
            "command": total(command),
            "rest": total(set(self.cpu) - workers - command),
        }

    def worker_pids(self, engine: str) -> list[int]:
        """The processes that embed."""
        if engine == "ray":  # Ray's actors: "ray::MapWorker(MapBatches(EmbedBatches))"
            chosen = [
                pid for pid, title in self.titles.items() if title.startswith("ray::") and "Map" in title
            ]
        elif engine == "nproc":  # the processes that --nproc starts (spawned by the command)
            chosen = [pid for pid, title in self.titles.items() if "spawn_main" in title]
            chosen += [pid for pid in self.peaks if pid not in self.titles]  # seen only without a title
        else:
            chosen = [self.pid]
        return [pid for pid in chosen if pid in self.peaks]


def _children_cpu() -> float:
    """CPU seconds of the reaped children of this process (and of the processes they reaped)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _read_back(handle: Any) -> str:
    handle.seek(0)
    text = handle.read()
    handle.close()
    return str(text)


def run_measured(
    cmd: list[str], env: dict[str, str], timeout: float, kill_when: Any = None
) -> dict[str, Any]:
    """Run ``cmd`` in its own process group; ``kill_when()`` true (polled) SIGKILLs the group."""
    from common import cpu_sample, others_busy  # imports torch: not for --help

    before, children_before = cpu_sample(), _children_cpu()
    start = time.perf_counter()
    # files, not pipes: a progress bar would fill a pipe nobody reads and stop the command
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    killed = False
    try:
        while proc.poll() is None:
            if time.perf_counter() - start > timeout or (kill_when is not None and kill_when()):
                killed = True
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        proc.wait()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        sampler.stop.set()
        sampler.join()
    seconds = time.perf_counter() - start
    stdout, stderr = _read_back(out), _read_back(err)
    after, child_cpu = cpu_sample(), _children_cpu() - children_before
    total_cpu = max(after[0] - before[0], 1) / os.sysconf("SC_CLK_TCK")  # CPU seconds of all CPUs
    if not killed:  # the group's leftovers (a Ray cluster the command started is stopped by it)
        try:
            os.killpg(proc.pid, 0)
            time.sleep(1.0)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {
        "returncode": proc.returncode,
        "killed": killed,
        "seconds": seconds,
        "others_cpu_busy": max(
            others_busy(before, after) - max(child_cpu, sum(sampler.cpu.values())) / total_cpu, 0.0
        ),
        "sampler": sampler,
        "stderr": stderr,
        "stdout": stdout,
    }


def reported_rate(stderr: str) -> float | None:
    """The tokens/s of the command's summary line (its embedding time, start-up excluded)."""
    found = re.findall(r"\(([0-9,]+) tokens/s", stderr)
    return float(found[-1].replace(",", "")) if found else None


def output_size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return path.stat().st_size


def count_rows(path: Path, fmt: str) -> int:
    """Lines held by an output file (Parquet rows, HDF5 line datasets)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    import h5py

    with h5py.File(path, "r") as handle:
        return sum(1 for name in handle if name.isdigit())


# -- the cells -----------------------------------------------------------------------------------
def command(model: str, src: Path, out: Path, engine: str, workers: int) -> list[str]:
    cmd = [sys.executable, "-m", "elmokit.cli", "embed", str(src), str(out), "--model", model]
    cmd += ["--overwrite"]  # not --quiet: its summary line gives the rate without start-up
    if engine == "nproc":
        cmd += ["--nproc", str(workers)]
    elif engine == "ray":
        cmd += ["--engine", "ray", "--workers", str(workers)]
    return cmd


def run_cell(
    args: argparse.Namespace,
    env: dict[str, str],
    shape: str,
    model: str,
    engine: str,
    fmt: str,
    src: Path,
    work: Path,
    n_tokens: int,
    round_: int,
) -> dict[str, Any]:
    out = work / f"{shape}-{engine}.{fmt}"
    result = run_measured(command(model, src, out, engine, args.workers), env, args.timeout)
    label = f"{shape} {engine} {fmt}"
    if result["returncode"] != 0 or result["killed"]:
        raise SystemExit(f"{label} failed (exit {result['returncode']}):\n{result['stderr'][-3000:]}")
    rows = count_rows(out, fmt)
    if rows != args.sentences:
        raise AssertionError(f"{label}: the output holds {rows} lines, the input {args.sentences}")
    sampler: TreeSampler = result["sampler"]
    run = {
        "model": shape,
        "engine": engine,
        "format": fmt,
        "round": round_,
        "wall_seconds": round(result["seconds"], 2),
        "tokens_per_second": round(n_tokens / result["seconds"]),
        "embed_tokens_per_second": reported_rate(result["stderr"]),
        "worker_peak_rss_mb": sampler.workers(engine),
        "worker_peak_private_mb": sampler.workers(engine, private=True),
        "driver_peak_rss_mb": round(sampler.peaks.get(sampler.pid, 0.0), 1),
        "tree_peak_rss_mb": round(sampler.tree_peak, 1),
        "processes_seen": len(sampler.peaks),
        "output_bytes": output_size(out),
        "cpu_seconds": sampler.cpu_split(engine),
        "others_cpu_busy": round(result["others_cpu_busy"], 2),
    }
    out.unlink()
    print(
        f"  {label:24s} {run['wall_seconds']:7.1f} s {run['tokens_per_second']:>8,} tok/s "
        f"(embedding {run['embed_tokens_per_second'] or 0:,.0f})  workers' peak RSS "
        f"{run['worker_peak_rss_mb']} MB (private {run['worker_peak_private_mb']} MB; "
        f"all {run['tree_peak_rss_mb']:.0f} MB)  "
        f"{run['output_bytes'] / 2**20:.1f} MiB  CPU s workers/command/rest "
        f"{'/'.join(str(v) for v in run['cpu_seconds'].values())}  others {run['others_cpu_busy']:.0%}",
        flush=True,
    )
    return run


# -- resume --------------------------------------------------------------------------------------
def has_shards(env: dict[str, str]) -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "elmokit.cli", "embed", "--help"], env=env, capture_output=True, text=True
    )
    return "--shard-sentences" in done.stdout


def complete_parts(folder: Path) -> dict[str, str]:
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {part["name"]: part["sha256"] for part in manifest.get("parts", []) if part.get("sha256")}


def run_resume(
    args: argparse.Namespace, env: dict[str, str], shape: str, model: str, fmt: str, src: Path, work: Path
) -> dict[str, Any]:
    """An uninterrupted sharded run, one killed at half its parts, and the same command again."""
    parts = -(-args.sentences // args.shard_sentences)
    one = work / "one.txt"
    one.write_text(src.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    base = [sys.executable, "-m", "elmokit.cli", "embed"]
    shard = ["--model", model, "--quiet", "--shard-sentences", str(args.shard_sentences)]
    shard += ["--format", "parquet"] if fmt == "parquet" else []  # HDF5: the default
    label = f"{shape} resume {fmt}"
    startup = run_measured([*base, str(one), str(work / "one-out"), *shard], env, args.timeout)
    full = run_measured([*base, str(src), str(work / "full"), *shard], env, args.timeout)
    if startup["returncode"] != 0 or full["returncode"] != 0:
        failed = startup if startup["returncode"] != 0 else full
        return {
            "model": shape,
            "format": fmt,
            "available": False,
            "error": failed["stderr"].strip().splitlines()[-1:] or ["(no message)"],
        }
    folder = work / "resumed"
    half = -(-parts // 2)
    killed = run_measured(
        [*base, str(src), str(folder), *shard],
        env,
        args.timeout,
        kill_when=lambda: len(complete_parts(folder)) >= half,
    )
    done_at_kill = len(complete_parts(folder))
    resumed = run_measured([*base, str(src), str(folder), *shard], env, args.timeout)
    if resumed["returncode"] != 0:
        raise SystemExit(f"{label}: the resumed run failed:\n{resumed['stderr'][-3000:]}")
    same = complete_parts(folder) == complete_parts(work / "full") and len(complete_parts(folder)) == parts
    if not same:
        raise AssertionError(f"{label}: the resumed folder's parts differ from the uninterrupted run's")
    per_part = max(full["seconds"] - startup["seconds"], 0.0) / parts
    bound = startup["seconds"] + (parts - done_at_kill + 1) * per_part
    report = {
        "model": shape,
        "format": fmt,
        "available": True,
        "parts": parts,
        "startup_seconds": round(startup["seconds"], 2),
        "uninterrupted_seconds": round(full["seconds"], 2),
        "killed_after_seconds": round(killed["seconds"], 2),
        "parts_done_at_kill": done_at_kill,
        "resumed_seconds": round(resumed["seconds"], 2),
        "bound_seconds": round(bound, 2),
        "within_bound": resumed["seconds"] <= bound,
        "same_parts_as_uninterrupted": same,
        "others_cpu_busy": round(resumed["others_cpu_busy"], 2),
    }
    for name in ("full", "resumed", "one-out"):
        target = work / name
        if target.is_dir():
            for p in target.iterdir():
                p.unlink()
            target.rmdir()
    print(
        f"  {label:24s} uninterrupted {full['seconds']:.1f} s; killed at {killed['seconds']:.1f} s with "
        f"{done_at_kill}/{parts} parts; resumed {resumed['seconds']:.1f} s (bound {bound:.1f} s)",
        flush=True,
    )
    return report


# -- the report ----------------------------------------------------------------------------------
QUIET = 0.05  # a run is quiet when processes outside its tree took at most this share of the CPUs


def ratios(runs: list[dict[str, Any]], shape: str, quiet_only: bool = False) -> dict[str, float | None]:
    """Per-round ratios, their median over the rounds; with ``quiet_only``, over the rounds in
    which each run of the ratio was quiet (``QUIET``)."""
    by = {
        (r["engine"], r["format"], r["round"]): r
        for r in runs
        if r["model"] == shape and (not quiet_only or r["others_cpu_busy"] <= QUIET)
    }
    rounds = sorted({r["round"] for r in runs})

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 3) if values else None

    ray_vs_nproc = [
        by[("ray", "parquet", k)]["tokens_per_second"] / by[("nproc", "parquet", k)]["tokens_per_second"]
        for k in rounds
        if ("ray", "parquet", k) in by and ("nproc", "parquet", k) in by
    ]
    parquet_vs_hdf5 = {
        engine: median(
            [
                by[(engine, "parquet", k)]["wall_seconds"] / by[(engine, "hdf5", k)]["wall_seconds"]
                for k in rounds
                if (engine, "parquet", k) in by and (engine, "hdf5", k) in by
            ]
        )
        for engine in ("one", "nproc")
    }
    return {
        "ray_over_nproc_tokens_per_second": median(ray_vs_nproc),
        "parquet_over_hdf5_seconds_one": parquet_vs_hdf5["one"],
        "parquet_over_hdf5_seconds_nproc": parquet_vs_hdf5["nproc"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("corpus", nargs="?", help="one tokenized sentence per line (default: generated)")
    parser.add_argument("--sentences", type=int, default=20000)
    parser.add_argument("--models", default="tiny,small", help="comma-separated: tiny, small")
    parser.add_argument("--workers", type=int, default=2, help="--nproc N and Ray's actors")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="OMP_NUM_THREADS")
    parser.add_argument(
        "--shard-sentences",
        type=int,
        default=None,
        help="part size of the resume runs (default: sentences / 10)",
    )
    parser.add_argument(
        "--cells",
        default=",".join("-".join(c) for c in CELLS),
        help="comma-separated ENGINE-FORMAT runs of each model (default: all five)",
    )
    parser.add_argument("--no-resume", action="store_true", help="skip the resume runs")
    parser.add_argument("--resume-only", action="store_true", help="only the resume runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800.0, help="kill a command after this many s")
    parser.add_argument(
        "--json", help=f"the figures as JSON (default: {RESULTS.name}/corpus_N.json in results)"
    )
    args = parser.parse_args()
    from common import shown_command

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # clean up on a kill

    shapes = [s.strip() for s in args.models.split(",") if s.strip()]
    for shape in shapes:
        if shape not in SHAPES:
            parser.error(f"unknown model {shape!r} (choose from {', '.join(SHAPES)})")
    if args.sentences < 2 or args.rounds < 1 or args.workers < 1:
        parser.error("--sentences must be at least 2, --rounds and --workers at least 1")
    if args.resume_only and args.no_resume:
        parser.error("--resume-only and --no-resume exclude each other")
    args.shard_sentences = args.shard_sentences or max(1, args.sentences // 10)
    chosen = [tuple(c.strip().split("-", 1)) for c in args.cells.split(",") if c.strip()]
    for cell in chosen:
        if cell not in CELLS:
            parser.error(
                f"unknown cell {'-'.join(cell)!r} (choose from {', '.join('-'.join(c) for c in CELLS)})"
            )

    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(args.threads)
    env["PYTHONWARNINGS"] = "ignore"
    env["RAY_DEDUP_LOGS"] = "0"
    try:
        lines = corpus_lines(args.corpus, args.sentences, args.seed)
    except (OSError, ValueError) as err:
        parser.error(str(err))
    n_tokens = sum(len(line.split()) for line in lines)
    uptime_before = Path("/proc/loadavg").read_text().split()[:3]
    print(
        f"{args.sentences:,} sentences, {n_tokens:,} tokens; load average {' '.join(uptime_before)}",
        flush=True,
    )

    runs: list[dict[str, Any]] = []
    resumes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_corpus.") as folder:
        work = Path(folder)
        src = work / "in.txt"
        src.write_text("\n".join(lines) + "\n", encoding="utf-8")
        models = {
            s: (str(small_model(work / "small", args.seed)) if s == "small" else SHAPES[s]) for s in shapes
        }
        cells = [(shape, engine, fmt) for shape in shapes for engine, fmt in chosen]
        for round_ in range(0 if args.resume_only else args.rounds):
            print(f"round {round_ + 1}/{args.rounds}", flush=True)
            order = cells if round_ % 2 == 0 else cells[::-1]
            for shape, engine, fmt in order:
                runs.append(
                    run_cell(args, env, shape, models[shape], engine, fmt, src, work, n_tokens, round_)
                )
        shards = not args.no_resume and has_shards(env)
        if shards:
            print(f"resume (parts of {args.shard_sentences:,} lines)", flush=True)
            for shape in shapes:
                for fmt in ("hdf5", "parquet"):
                    resumes.append(run_resume(args, env, shape, models[shape], fmt, src, work))
        else:
            print(
                "resume: not available (this elmokit embed has no --shard-sentences)"
                if not args.no_resume
                else "resume: skipped (--no-resume)",
                flush=True,
            )
    uptime_after = Path("/proc/loadavg").read_text().split()[:3]

    summary = {shape: ratios(runs, shape) for shape in shapes} if runs else {}
    quiet = {shape: ratios(runs, shape, quiet_only=True) for shape in shapes} if runs else {}
    print(
        f"\n{'model':6s} {'engine':6s} {'format':8s} {'tok/s (median)':>15s} {'worker peak RSS MB':>20s} "
        f"{'output MiB':>10s}"
    )
    for shape, engine, fmt in cells if runs else []:
        mine = [r for r in runs if (r["model"], r["engine"], r["format"]) == (shape, engine, fmt)]
        rate = statistics.median(r["tokens_per_second"] for r in mine)
        peak = max(max(r["worker_peak_rss_mb"], default=0.0) for r in mine)
        size = mine[0]["output_bytes"] / 2**20
        print(f"{shape:6s} {engine:6s} {fmt:8s} {rate:>15,.0f} {peak:>20.0f} {size:>10.1f}")
    for shape, figures in summary.items():
        print(f"{shape}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
        print(
            f"{shape}, quiet rounds only (others at most {QUIET:.0%}): "
            + ", ".join(f"{k} {v}" for k, v in quiet[shape].items())
        )
    print(f"load average before {' '.join(uptime_before)}, after {' '.join(uptime_after)}")

    report = {
        "command": shown_command("bench_corpus.py", sys.argv[1:]),
        "sentences": args.sentences,
        "tokens": n_tokens,
        "corpus": Path(args.corpus).name if args.corpus else f"generated (seed {args.seed})",
        "models": {s: ("random weights, preset 'small'" if s == "small" else SHAPES[s]) for s in shapes},
        "threads": args.threads,
        "workers": args.workers,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_average_before": uptime_before,
        "load_average_after": uptime_after,
        "runs": runs,
        "ratios": summary,
        "ratios_quiet_rounds": quiet,
        "resume": resumes if shards else "not available" if not args.no_resume else "skipped",
        "shard_sentences": args.shard_sentences if shards else None,
    }
    path = Path(args.json) if args.json else RESULTS / f"corpus_{args.sentences}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
