"""Shared by the benchmarks: the CPU-usage helpers (``cpu_sample``, ``others_busy``), the matmul
rate, a measured child process, a paused neighbour, the checks that a round called cold starts
with an empty token cache (``start_cold``, ``assert_cold``) or one called warm with a filled one
(``assert_warm``). It imports no benchmark."""

from __future__ import annotations

import json
import os
import resource
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch

# ../shared/data beside the repository (the project's shared data folder).
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
LM1B_SHARDS = str(SHARED_DATA / "lm" / "lm1b_heldout" / "news.en.heldout-000*-of-00050")
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


class Pauser:
    """SIGSTOP a process (e.g. a training job sharing the cores) while a measurement runs.

    ``with pauser:`` stops ``pid`` and always sends SIGCONT when the block ends, also on an
    exception, Ctrl-C or SIGTERM (turned into SystemExit while a pause is active). Keeps the total
    and longest paused time. ``pid=None`` does nothing.
    """

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.total = self.longest = 0.0
        self.count = 0
        self._since: float | None = None

    def __enter__(self) -> Pauser:
        if self.pid is None:
            return self
        previous = signal.signal(signal.SIGTERM, _raise_exit)
        self._previous_handler = previous
        os.kill(self.pid, signal.SIGSTOP)
        self._since = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        if self.pid is None or self._since is None:
            return
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        paused = time.monotonic() - self._since
        self._since = None
        self.total += paused
        self.longest = max(self.longest, paused)
        self.count += 1
        signal.signal(signal.SIGTERM, self._previous_handler)

    def summary(self) -> str:
        if self.pid is None:
            return "no process paused (--pause-pid not given)"
        return (
            f"process {self.pid} paused {self.count} times, {self.total:.0f} s in total "
            f"(longest {self.longest:.0f} s)"
        )


def _raise_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


@dataclass
class ChildResult:
    returncode: int
    seconds: float  # wall time
    cpu_seconds: float  # user + system time of the child
    peak_rss_mb: float  # the child's own ru_maxrss (not the max over all children)
    others_cpu_busy: float  # share of all CPUs used by other processes meanwhile
    stdout: str
    stderr: str
    timed_out: bool = False


def run_child(
    cmd: list[str], env: dict[str, str] | None = None, timeout: float | None = None, nice: int = 0
) -> ChildResult:
    """Run ``cmd`` and measure it with ``os.wait4``: wall time, CPU time and peak RSS of this child
    alone (``RUSAGE_CHILDREN`` would give the largest child so far). ``timeout`` kills it;
    ``nice`` > 0 runs it at a lower priority."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        before = cpu_sample()
        start = time.perf_counter()
        preexec = (lambda: os.nice(nice)) if nice else None
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True, preexec_fn=preexec)
        timed_out = False
        try:
            if timeout is not None:
                deadline = start + timeout
                while True:
                    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                    if pid:
                        break
                    if time.perf_counter() > deadline:
                        proc.kill()
                        timed_out = True
                        pid, status, usage = os.wait4(proc.pid, 0)
                        break
                    time.sleep(0.05)
            else:
                pid, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            os.wait4(proc.pid, 0)
            proc.returncode = -9
            raise
        seconds = time.perf_counter() - start
        after = cpu_sample()
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        total_jiffies = max(after[0] - before[0], 1)
        child_share = cpu * os.sysconf("SC_CLK_TCK") / total_jiffies
        others = max(others_busy(before, after) - child_share, 0.0)
        out.seek(0)
        err.seek(0)
        return ChildResult(
            returncode=proc.returncode,
            seconds=seconds,
            cpu_seconds=cpu,
            peak_rss_mb=usage.ru_maxrss / 1024,  # KB on Linux
            others_cpu_busy=others,
            stdout=out.read(),
            stderr=err.read(),
            timed_out=timed_out,
        )


def thread_env(threads: int) -> dict[str, str]:
    """The environment with OMP/MKL threads set (torch reads OMP_NUM_THREADS at start)."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    return env


def self_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _process_jiffies(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime + stime


def wait_until_quiet(max_busy: float, timeout: float, exclude_pid: int | None = None) -> float:
    """Wait until other processes use at most ``max_busy`` of all CPUs over a 2 s window,
    not counting ``exclude_pid`` (the process ``--pause-pid`` will stop), or ``timeout`` seconds
    pass. Returns the last share seen. ``max_busy >= 1`` returns at once."""
    if max_busy >= 1:
        return 0.0
    deadline = time.monotonic() + timeout
    while True:
        before, jiffies = cpu_sample(), _process_jiffies(exclude_pid)
        time.sleep(2.0)
        after, excluded = cpu_sample(), _process_jiffies(exclude_pid) - jiffies
        busy = others_busy(before, after) - excluded / max(after[0] - before[0], 1)
        if busy <= max_busy or time.monotonic() > deadline:
            return max(busy, 0.0)


def write_report(
    path: str, command: str, pauser: Pauser, rate: float, matmul_others: float, **fields
) -> None:
    """The --json file of a benchmark: the command, pause and matmul-rate context, then ``fields``."""
    report = {
        "command": command,
        "paused_seconds": pauser.total,
        "matmul_gflops": rate,
        "matmul_others_cpu_busy": matmul_others,
        **fields,
    }
    Path(path).write_text(json.dumps(report, indent=2) + "\n")


def matmul_rate(threads: int, pauser: Pauser) -> tuple[float, float]:
    """The fp32 matmul rate (GFLOP/s, ``matmul_gflops``) measured with ``pauser``'s
    process stopped, and the share of the CPUs other processes used meanwhile."""
    with pauser:
        before = cpu_sample()
        rate = matmul_gflops(threads)
        return rate, others_busy(before, cpu_sample())


def token_cache_entries(model: torch.nn.Module) -> int:
    """Distinct tokens whose encodings the token cache of ``model`` (a BiLM, ``Elmo``'s BiLM or
    the int8 form) holds now; the one cache of token encodings is its ``TokenEncoder``'s."""
    encoder = model.token_encoder  # an AttributeError if the cache moves: fix this, not the claim
    cache = encoder._cache
    return 0 if cache is None else len(cache)


def assert_cold(model: torch.nn.Module, what: str = "a cold round") -> None:
    """Raise AssertionError unless the token cache of ``model`` is empty: the check a benchmark
    makes at the start of every round it calls cold (a raise, so ``python -O`` keeps it)."""
    entries, stats = token_cache_entries(model), model.token_encoder.cache_stats
    if entries or stats != (0, 0):
        raise AssertionError(
            f"{what} must start with an empty token cache, but it holds {entries} tokens "
            f"(hits, misses since emptied: {stats}): empty it with model.token_encoder.clear_cache()"
        )


def start_cold(model: torch.nn.Module, what: str = "a cold round") -> None:
    """Empty the token cache of ``model`` and check that it is empty (``assert_cold``)."""
    model.token_encoder.clear_cache()
    assert_cold(model, what)


def assert_warm(model: torch.nn.Module, what: str = "a warm round") -> None:
    """Raise AssertionError if the token cache of ``model`` is empty (a round called warm)."""
    if not token_cache_entries(model):
        raise AssertionError(f"{what} must start with tokens in the token cache, but it is empty")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU): before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def shown_command(script: str, argv: list[str]) -> str:
    """The command as run, each absolute path (``/...``, ``--opt=/...``) named by its last part only."""

    def shown(arg: str) -> str:
        option, equals, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        value = Path(value).name if value.startswith(("/", "~")) else value
        return f"{option}{equals}{value}"

    return shlex.join(["python", f"benchmarks/{script}", *(shown(a) for a in argv)])
