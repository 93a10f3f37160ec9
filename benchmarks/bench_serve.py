"""`elmokit serve` under load, beside the offline Embedder on the same sentences in the same run.

    python benchmarks/bench_serve.py [--text GLOB] [--shape small] [--sentences 2000]
        [--clients 64] [--requests 4000] [--malformed 0.1] [--memory-requests 100000]
        [--memory-malformed 0.1] [--server-threads N]
        [--threads 2] [--max-batch-tokens 4096] [--max-wait-ms 5] [--device cpu] [--json FILE]
        [--stacks new] [--rounds 1] [--header-attack]

With random weights in a preset shape (written to a temporary model folder), measures:
- offline: ``Embedder.embed_sentences`` at batch 64 over the sentences, and one sentence per
  ``embed_sentence`` call (the first ``--one-per-call`` sentences), in this process with
  ``--threads`` torch threads, after a warm-up pass over all of them;
- the server: ``elmokit serve`` started as a subprocess with the same threads
  (OMP_NUM_THREADS and ``--threads``), driven over loopback by ``--clients`` concurrent clients
  (asyncio, one keep-alive HTTP/1.1 connection each), one sentence per ``POST /v1/embeddings``
  request, after a warm-up pass over all of them (so both sides run with the sentences' tokens
  in the token cache, the steady state of a server). ``--malformed`` of the requests are bad
  (malformed JSON, wrong types, empty input, non-UTF-8, too many tokens) and must be answered
  4xx; every good one must be 200 with the vector of the offline run (mean over tokens of the
  layers' average, scaled to length 1, within 1e-4).

Prints throughput (good requests/s and tokens/s), p50/p99 latency of good requests, errors
(a good request not answered correctly, a bad one not 4xx, a connection error), the ratios to
the offline rates, and the server's RSS after 1,000 requests and at the end.

``--stacks old,new`` measures the server's throughput on each HTTP stack, interleaved over
``--rounds`` rounds (a fresh server per stack and round): ``new`` is what `elmokit serve` runs
(httptools within the request-head limits, elmokit.serve.http), ``old`` uvicorn's own httptools
protocol (no head limits, put back by the launcher), ``h11`` the bounded h11 protocol.

``--header-attack`` starts the server with an API key and sends, from 127.0.0.1 only: 4 requests
with one 100 MB header and no key (at once), one request of 50,000 headers of 1 KB with the key,
and 200 connections that send one byte a second (each for at most 20 s); it prints the server's
RSS when idle and its peak during each part (sampled every 20 ms), the answers, and how long the
slow connections stayed open.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_embed import read_pool
from common import LM1B_SHARDS, _process_jiffies, thread_env

import elmokit
from elmokit.model.options import preset

MODEL = "bench"
API_KEY = "bench-key"
# the launcher of the other stacks: `python -c LAUNCHER serve ...`, with elmokit.serve.http.protocol
# replaced before the command runs (serve() looks it up when it starts uvicorn)
LAUNCHER = (
    "import sys; import elmokit.serve.http as h; bounded = h.protocol; "
    "h.protocol = {replace}; from elmokit.cli import main; sys.exit(main(sys.argv[1:]))"
)
STACKS = {
    "new": None,
    "old": LAUNCHER.format(replace="lambda http, head: 'httptools'"),
    "h11": LAUNCHER.format(replace="lambda http, head: bounded('h11', head)"),
}


def read_sentences(patterns: str, n: int) -> list[str]:
    """The first ``n`` non-blank lines (whitespace-normalised) of the files of a comma list of globs."""
    return [" ".join(line.split()) for line in read_pool(patterns)[:n]]


# -- offline -------------------------------------------------------------------------------------
def offline(model_dir: Path, sentences: list[str], device: str, one_per_call: int) -> dict[str, Any]:
    """Sentences/s of the Embedder at batch 64 and one sentence per call; the pooled vectors."""
    embedder = elmokit.Embedder(str(model_dir), batch_size=64, device=device)
    tokens = [s.split() for s in sentences]
    # warm-up over every sentence: the token cache then holds their tokens, as the server's does
    # after its warm-up pass (a cold cache adds the character CNN of every new token)
    list(embedder.embed_sentences(tokens))
    start = time.perf_counter()
    arrays = list(embedder.embed_sentences(tokens))
    batch_seconds = time.perf_counter() - start
    means = [a.astype(np.float64).mean(axis=0).mean(axis=0) for a in arrays]
    pooled = [m / np.linalg.norm(m) for m in means]  # /v1/embeddings gives unit vectors
    few = tokens[:one_per_call]
    for s in few[:10]:
        embedder.embed_sentence(s)
    start = time.perf_counter()
    for s in few:
        embedder.embed_sentence(s)
    single_seconds = time.perf_counter() - start
    n_tokens = sum(len(t) for t in tokens)
    return {
        "batch64_sentences_per_s": len(tokens) / batch_seconds,
        "batch64_tokens_per_s": n_tokens / batch_seconds,
        "one_per_call_sentences_per_s": len(few) / single_seconds,
        "one_per_call_sentences": len(few),
        "pooled": pooled,
    }


# -- the server ----------------------------------------------------------------------------------
def start_server(
    args: argparse.Namespace, model_dir: Path, stack: str = "new", api_key: str | None = None
) -> tuple[subprocess.Popen, int, list[str]]:
    """`elmokit serve` on a free port, on an HTTP ``stack`` of ``STACKS``; (process, port, its
    stderr lines, kept up to date)."""
    launcher = STACKS[stack]
    cmd = [
        sys.executable,
        *(["-m", "elmokit.cli"] if launcher is None else ["-c", launcher]),
        "serve",
        "--model",
        f"{MODEL}={model_dir}",
        "--port",
        "0",
        "--threads",
        str(args.server_threads or args.threads),
        "--max-batch-tokens",
        str(args.max_batch_tokens),
        "--max-wait-ms",
        str(args.max_wait_ms),
        "--max-queue",
        str(max(1024, 2 * args.clients)),
    ]
    if args.device:
        cmd += ["--device", args.device]
    if args.workers > 1:
        cmd += ["--workers", str(args.workers)]
    env = thread_env(args.server_threads or args.threads)
    if api_key:
        env["ELMOKIT_API_KEY"] = api_key
    process = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    lines: list[str] = []
    assert process.stderr is not None
    for line in process.stderr:
        lines.append(line)
        if "Application startup complete" in line and (
            args.workers == 1 or sum("Application startup complete" in x for x in lines) == args.workers
        ):
            port = int(next(m.group(1) for x in lines if (m := re.search(r"http://[^:]+:(\d+)", x))))
            threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
            return process, port, lines
    raise SystemExit("the server did not start:\n" + "".join(lines))


def cpu_model() -> str:
    """The CPU's model name (Linux), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def batch_figures(port: int) -> dict[str, float]:
    """The server's batch count, sentences and model seconds so far (its /metrics)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()

    def value(name: str) -> float:
        found = re.search(re.escape(name) + r"\{[^}]*\} (\S+)", text)
        return float(found.group(1)) if found else 0.0

    return {
        "count": value("elmokit_batch_sentences_count"),
        "sentences": value("elmokit_batch_sentences_sum"),
        "seconds": value("elmokit_batch_seconds_sum"),
    }


def http_stack() -> str:
    """uvicorn's event loop and HTTP parser in this environment (the server's: it inherits it):
    uvloop and httptools where installed (the serve extra), else asyncio and h11."""
    import importlib.util

    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return f"{loop} + {'httptools' if importlib.util.find_spec('httptools') else 'h11'}"


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds a process has used so far."""
    return _process_jiffies(pid) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# -- the clients ---------------------------------------------------------------------------------
def bad_bodies(rng: random.Random) -> list[bytes]:
    """Malformed requests of each kind the server must answer 4xx."""
    return [
        b'{"input": "unterminated',
        b'{"input": 42, "model": "bench"}',
        b'{"input": "", "model": "bench"}',
        b'{"input": [], "model": "bench"}',
        b'{"input": "caf\xe9 au lait", "model": "bench"}',
        json.dumps({"input": " ".join(["w"] * 600), "model": MODEL}).encode(),  # > 512 tokens
        json.dumps({"input": "a", "model": "/etc/passwd"}).encode(),
        json.dumps({"input": [[1, 2, 3]], "model": MODEL}).encode(),
    ]


class Connection:
    """One keep-alive HTTP/1.1 connection: POST a body, read status and body (Content-Length)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        length, close = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and value.strip().lower() == "close":
                close = True
        data = await self.reader.readexactly(length)
        if close:
            self.close()
        return status, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def drive(
    port: int,
    sentences: list[str],
    pooled: list[np.ndarray],
    clients: int,
    requests: int,
    malformed: float,
    on_count: dict[int, Any],
) -> dict[str, Any]:
    """``requests`` requests from ``clients`` concurrent clients; good ones checked against
    ``pooled``. ``on_count``: callbacks run when that many requests are done."""
    rng = random.Random(0)
    bad = bad_bodies(rng)
    plan = [
        (-1 - rng.randrange(len(bad))) if rng.random() < malformed else i % len(sentences)
        for i in range(requests)
    ]
    latencies: list[float] = []
    errors: list[str] = []
    counts = {"good": 0, "bad": 0}
    next_index = 0
    done = 0

    async def client() -> None:
        nonlocal next_index, done
        connection = Connection(port)
        while next_index < len(plan):
            item = plan[next_index]
            next_index += 1
            body = (
                bad[-1 - item]
                if item < 0
                else json.dumps(
                    {"input": sentences[item], "model": MODEL, "encoding_format": "base64"}
                ).encode()
            )
            start = time.perf_counter()
            try:
                status, data = await connection.post("/v1/embeddings", body)
            except (ConnectionError, OSError, asyncio.IncompleteReadError) as err:
                errors.append(f"connection: {err}")
                connection.close()
                continue
            finally:
                done += 1
                if done in on_count:
                    on_count[done]()
            if item < 0:
                counts["bad"] += 1
                if not 400 <= status < 500:
                    errors.append(f"bad request {-1 - item} answered {status}")
                continue
            latencies.append(time.perf_counter() - start)
            counts["good"] += 1
            if status != 200:
                errors.append(f"good request answered {status}: {data[:200]!r}")
                continue
            vector = np.frombuffer(base64.b64decode(json.loads(data)["data"][0]["embedding"]), "<f4")
            if not np.allclose(vector, pooled[item], atol=1e-4):
                errors.append(
                    f"sentence {item}: a wrong vector (max diff {np.abs(vector - pooled[item]).max():.2e})"
                )
        connection.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    seconds = time.perf_counter() - start
    tokens = sum(len(sentences[i].split()) for i in plan if i >= 0)
    lat = np.array(latencies) if latencies else np.array([float("nan")])
    return {
        "requests": len(plan),
        "good": counts["good"],
        "bad": counts["bad"],
        "seconds": seconds,
        "good_per_s": counts["good"] / seconds,
        "tokens_per_s": tokens / seconds,
        "p50_ms": 1000 * float(np.percentile(lat, 50)),
        "p99_ms": 1000 * float(np.percentile(lat, 99)),
        "errors": len(errors),
        "first_errors": errors[:5],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--text", default=LM1B_SHARDS, help="comma list of globs (default: lm1b held-out shards)")
    p.add_argument("--shape", default="small", help="preset: small, medium or original (default small)")
    p.add_argument("--sentences", type=int, default=2000, help="distinct sentences (default 2000)")
    p.add_argument("--one-per-call", type=int, default=300, help="sentences of the one-per-call rate")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--requests", type=int, default=4000, help="requests of the measured pass")
    p.add_argument("--malformed", type=float, default=0.0, help="share of bad requests (e.g. 0.1)")
    p.add_argument(
        "--memory-requests",
        type=int,
        default=0,
        help="a second pass of this many requests, RSS after 1,000 and at the end",
    )
    p.add_argument(
        "--memory-malformed", type=float, default=0.1, help="share of bad requests in the memory pass"
    )
    p.add_argument("--threads", type=int, default=2, help="torch threads of the offline runs and the server")
    p.add_argument(
        "--server-threads",
        type=int,
        default=None,
        help="the server's torch threads, if not --threads (its event loop needs a share of the cores too)",
    )
    p.add_argument(
        "--workers", type=int, default=1, help="server processes (--workers); RSS is then the parent's only"
    )
    p.add_argument("--max-batch-tokens", type=int, default=4096)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the figures to this JSON file")
    p.add_argument(
        "--stacks",
        default="new",
        help="comma list of HTTP stacks to measure, interleaved: new (default), old, h11",
    )
    p.add_argument("--rounds", type=int, default=1, help="rounds of --stacks (a fresh server each)")
    p.add_argument(
        "--header-attack", action="store_true", help="the header attack and the server's RSS (no throughput)"
    )
    return p.parse_args(argv)


# -- the header attack ---------------------------------------------------------------------------
class PeakRss:
    """The peak RSS of a process, sampled every 20 ms in a thread while in the ``with`` block."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()

    def __enter__(self) -> PeakRss:
        def sample() -> None:
            while not self._stop.wait(0.02):
                self.peak = max(self.peak, rss_mb(self.pid))

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb(self.pid))


def _status(answer: bytes) -> str:
    return answer.split(b"\r\n", 1)[0].decode("latin-1") if answer else "(closed, no answer)"


def send_until_closed(port: int, head: bytes, body_source, total: int) -> str:
    """Send ``head``, ``total`` bytes from ``body_source(n)`` in chunks of 64 KiB and the end of
    the headers, until the server answers or closes; the answer's status line."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        try:
            conn.sendall(head)
            sent = 0
            while sent < total:
                chunk = body_source(min(65536, total - sent))
                conn.sendall(chunk)
                sent += len(chunk)
            conn.sendall(b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            return _status(conn.recv(4096))
        except ConnectionResetError:
            return "(reset)"
        except TimeoutError:
            return "(no answer in 60 s)"


def header_attack(port: int, pid: int) -> dict[str, Any]:
    """The three attacks of the docstring, one after the other; RSS idle and at each peak."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    time.sleep(1.0)
    figures: dict[str, Any] = {"idle_rss_mb": rss_mb(pid)}
    print(f"header attack: server RSS idle {figures['idle_rss_mb']:.0f} MB", flush=True)

    big_head = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
    filler = b"a" * 65536
    with PeakRss(pid) as peak, ThreadPoolExecutor(4) as pool:
        start = time.perf_counter()
        answers = list(
            pool.map(lambda _: send_until_closed(port, big_head, lambda n: filler[:n], 100 << 20), range(4))
        )
    figures["big_header"] = {
        "answers": answers,
        "peak_rss_mb": peak.peak,
        "seconds": time.perf_counter() - start,
    }
    print(
        f"  4 requests with one 100 MB header, no key: {answers}; peak RSS {peak.peak:.0f} MB "
        f"(+{peak.peak - figures['idle_rss_mb']:.0f} MB)",
        flush=True,
    )

    many_head = f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n".encode()
    line = b"X-H: " + b"h" * 1017 + b"\r\n"  # 1 KB a header
    lines = line * 64
    with PeakRss(pid) as peak:
        answer = send_until_closed(port, many_head, lambda n: lines[:n], 50_000 * len(line))
    figures["many_headers"] = {"answer": answer, "peak_rss_mb": peak.peak}
    print(
        f"  50,000 headers of 1 KB with the key: {answer}; peak RSS {peak.peak:.0f} MB "
        f"(+{peak.peak - figures['idle_rss_mb']:.0f} MB)",
        flush=True,
    )

    def slow() -> tuple[float, str]:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            start = time.monotonic()
            request = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"s" * 100
            answer = b""
            for byte in request[:20]:  # one byte a second, 20 s at most
                try:
                    conn.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    break
                conn.settimeout(1.0)
                try:
                    answer = conn.recv(4096)
                    break  # answered or closed
                except TimeoutError:
                    continue
                except ConnectionResetError:
                    break
            return time.monotonic() - start, _status(answer)

    with PeakRss(pid) as peak, ThreadPoolExecutor(200) as pool:
        results = list(pool.map(lambda _: slow(), range(200)))
    open_for = sorted(r[0] for r in results)
    figures["slow"] = {
        "answers": sorted({r[1] for r in results}),
        "open_seconds_max": open_for[-1],
        "open_seconds_median": open_for[len(open_for) // 2],
        "peak_rss_mb": peak.peak,
    }
    print(
        f"  200 connections sending a byte a second: answers {figures['slow']['answers']}; open for "
        f"{open_for[len(open_for) // 2]:.1f} s (median), {open_for[-1]:.1f} s at most; peak RSS "
        f"{peak.peak:.0f} MB (+{peak.peak - figures['idle_rss_mb']:.0f} MB)",
        flush=True,
    )
    figures["after_rss_mb"] = rss_mb(pid)
    return figures


def stop_server(process: subprocess.Popen, lines: list[str]) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        code = process.wait()
    if code != 0:
        print("".join(lines[-20:]), file=sys.stderr)
    return code


def compare_stacks(
    args: argparse.Namespace, model_dir: Path, sentences: list[str], pooled: list[np.ndarray]
) -> dict[str, Any]:
    """Throughput of each of ``--stacks``, interleaved over ``--rounds`` rounds."""
    stacks = args.stacks.split(",")
    runs: dict[str, list[float]] = {s: [] for s in stacks}
    cpu: dict[str, list[float]] = {s: [] for s in stacks}
    for round_ in range(args.rounds):
        for stack in stacks:
            process, port, lines = start_server(args, model_dir, stack)
            try:
                warm_up = max(4 * args.clients, len(sentences))
                asyncio.run(drive(port, sentences, pooled, args.clients, warm_up, 0.0, {}))
                server_cpu = cpu_seconds(process.pid)
                run = asyncio.run(
                    drive(port, sentences, pooled, args.clients, args.requests, args.malformed, {})
                )
                # the server's CPU per request: less shaken than throughput by a shared machine
                cpu_ms = 1000 * (cpu_seconds(process.pid) - server_cpu) / run["requests"]
            finally:
                stop_server(process, lines)
            runs[stack].append(run["good_per_s"])
            cpu[stack].append(cpu_ms)
            print(
                f"round {round_ + 1}, {stack}: {run['good_per_s']:,.1f} good requests/s, server CPU "
                f"{cpu_ms:.2f} ms a request, p50 "
                f"{run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms, errors {run['errors']}; load average "
                f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}",
                flush=True,
            )
    medians = {s: float(np.median(v)) for s, v in runs.items()}
    cpu_medians = {s: float(np.median(v)) for s, v in cpu.items()}
    print(
        "medians: "
        + ", ".join(
            f"{s} {m:,.1f} requests/s, {cpu_medians[s]:.2f} ms of server CPU a request"
            for s, m in medians.items()
        )
        + (f"; new/old {medians['new'] / medians['old']:.3f}" if {"new", "old"} <= set(medians) else ""),
        flush=True,
    )
    return {"runs": runs, "medians": medians, "server_cpu_ms": cpu, "server_cpu_ms_medians": cpu_medians}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    shown = [Path(a).name if a.startswith("/") else a for a in (sys.argv[1:] if argv is None else argv)]
    command = shlex.join(["python", "benchmarks/bench_serve.py", *shown])
    print(f"command: {command}", flush=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    sentences = read_sentences(args.text, args.sentences)
    n_tokens = sum(len(s.split()) for s in sentences)
    print(
        f"{args.shape} shape, random weights, {args.threads} threads (server "
        f"{args.server_threads or args.threads}), {args.device}; {len(sentences):,} "
        f"sentences, {n_tokens / len(sentences):.1f} tokens a sentence; load average "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    machine = f"{cpu_model()}, {os.cpu_count()} CPUs"
    print(
        f"machine: {machine}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"server HTTP: {http_stack()}",
        flush=True,
    )
    report: dict[str, Any] = {
        "machine": machine,
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "load_average_start": os.getloadavg(),
        "server_threads": args.server_threads or args.threads,
        "server_workers": args.workers,
        "server_http": http_stack(),
        "command": command,
        "shape": args.shape,
        "threads": args.threads,
        "device": args.device,
    }
    with tempfile.TemporaryDirectory(prefix="bench_serve.") as tmp:
        model_dir = Path(tmp) / args.shape
        model_dir.mkdir()
        elmokit.BiLM(preset(args.shape)).save(model_dir / "options.json", model_dir / "weights.hdf5")
        if args.header_attack:
            for stack in args.stacks.split(","):
                process, port, lines = start_server(args, model_dir, stack, api_key=API_KEY)
                try:
                    print(f"stack {stack}:", flush=True)
                    report[f"header_attack_{stack}"] = header_attack(port, process.pid)
                finally:
                    stop_server(process, lines)
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
            return
        base = offline(model_dir, sentences, args.device, args.one_per_call)
        pooled = base.pop("pooled")
        if args.stacks != "new" or args.rounds > 1:
            report["stacks"] = compare_stacks(args, model_dir, sentences, pooled)
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
            return
        report["offline"] = base
        print(
            f"offline Embedder: batch 64 {base['batch64_sentences_per_s']:,.1f} sentences/s "
            f"({base['batch64_tokens_per_s']:,.0f} tokens/s); one sentence per call "
            f"{base['one_per_call_sentences_per_s']:,.1f} sentences/s",
            flush=True,
        )
        process, port, lines = start_server(args, model_dir)
        try:
            report["server_rss_after_start_mb"] = rss_mb(process.pid)
            # warm-up over every sentence (its tokens cached, as in the offline runs)
            warm_up = max(4 * args.clients, len(sentences))
            asyncio.run(drive(port, sentences, pooled, args.clients, warm_up, 0.0, {}))
            before = batch_figures(port)
            server_cpu, client_cpu = cpu_seconds(process.pid), time.process_time()
            run = asyncio.run(drive(port, sentences, pooled, args.clients, args.requests, args.malformed, {}))
            # CPU per request of each side: the clients share the cores with the server here
            server_cpu, client_cpu = cpu_seconds(process.pid) - server_cpu, time.process_time() - client_cpu
            run["client_cpu_ms_per_request"] = 1000 * client_cpu / run["requests"]
            run["server_cpu_ms_per_request"] = 1000 * server_cpu / run["requests"]
            after = batch_figures(port)
            batches = {k: after[k] - before[k] for k in after}
            run["batches"] = batches["count"]
            run["mean_batch_sentences"] = batches["sentences"] / max(batches["count"], 1)
            run["model_seconds"] = batches["seconds"]
            run["sentences_per_model_second"] = batches["sentences"] / max(batches["seconds"], 1e-9)
            report["server"] = run
            ratio_batch = run["good_per_s"] / base["batch64_sentences_per_s"]
            ratio_single = run["good_per_s"] / base["one_per_call_sentences_per_s"]
            report["ratio_to_batch64"], report["ratio_to_one_per_call"] = ratio_batch, ratio_single
            print(
                f"server, {args.clients} clients, {run['requests']:,} requests ({run['bad']:,} malformed): "
                f"{run['good_per_s']:,.1f} good requests/s ({run['tokens_per_s']:,.0f} tokens/s), "
                f"p50 {run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms, errors {run['errors']}",
                flush=True,
            )
            print(
                f"  = {ratio_batch:.0%} of offline batch 64 (goal 75%), {ratio_single:.2f}x the offline "
                f"one-per-call rate (goal 3x); load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}",
                flush=True,
            )
            print(
                f"  batches (one worker's /metrics): {run['batches']:.0f}, {run['mean_batch_sentences']:.1f} "
                f"sentences on average; model time {run['model_seconds']:.1f} s of {run['seconds']:.1f} s, "
                f"{run['sentences_per_model_second']:,.1f} sentences per second of model time",
                flush=True,
            )
            print(
                f"  CPU per request: server {run['server_cpu_ms_per_request']:.2f} ms (model and HTTP), "
                f"clients {run['client_cpu_ms_per_request']:.2f} ms, on the same cores",
                flush=True,
            )
            for error in run["first_errors"]:
                print(f"  error: {error}")
            if args.memory_requests:
                marks: dict[str, float] = {}
                pid = process.pid
                start = time.perf_counter()

                def mark(n: int):
                    def note() -> None:  # printed as it goes, so a stopped pass still tells its figures
                        marks[f"after_{n}_mb"] = rss_mb(pid)
                        print(
                            f"  memory pass: server RSS {marks[f'after_{n}_mb']:.0f} MB after {n:,} requests "
                            f"({time.perf_counter() - start:.0f} s)",
                            flush=True,
                        )

                    return note

                memory = asyncio.run(
                    drive(
                        port,
                        sentences,
                        pooled,
                        args.clients,
                        args.memory_requests,
                        args.memory_malformed,
                        {
                            n: mark(n)
                            for n in (1000, 10_000, 25_000, 50_000, 75_000)
                            if n < args.memory_requests
                        },
                    )
                )
                marks["at_end_mb"] = rss_mb(pid)
                report["memory"] = {**memory, **marks}
                growth = marks["at_end_mb"] / marks["after_1000_mb"] - 1
                print(
                    f"memory pass, {memory['requests']:,} requests ({memory['bad']:,} malformed): server RSS "
                    f"{marks['after_1000_mb']:.0f} MB after 1,000, {marks['at_end_mb']:.0f} MB at the end "
                    f"({growth:+.1%}; goal within 10%); {memory['good_per_s']:,.1f} good requests/s, "
                    f"p99 {memory['p99_ms']:.1f} ms, errors {memory['errors']}",
                    flush=True,
                )
                for error in memory["first_errors"]:
                    print(f"  error: {error}")
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            report["server_exit_status"] = code
            if code != 0:
                print("".join(lines[-20:]), file=sys.stderr)
        print(f"server exit status after SIGTERM: {code}")
    report["load_average_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
