"""Dynamic batching: the bounded queue of each model and the worker that empties it, and the
Prometheus metrics of an app."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
import prometheus_client as prom
from starlette.requests import Request

from .config import ServeConfig, ServedModel
from .limits import RETRY, ApiError, ClientGone

__all__: list[str] = []

log = logging.getLogger(__name__)


# -- dynamic batching ---------------------------------------------------------------------------
@dataclass(eq=False)
class _Job:
    """One request's work: sentences to embed (batched with others) or a call that runs alone."""

    future: asyncio.Future
    sentences: list[list[str]] | None = None
    call: Callable[[], Any] | None = None
    tokens: int = 0
    queued: float = 0.0  # perf_counter times: queued, its batch started and ended
    started: float = 0.0
    ended: float = 0.0


class Batcher:
    """The queue of one model and the worker that empties it, one batch at a time, on the
    model's own thread (``ServedModel.runner``, so the event loop keeps answering while the
    model runs)."""

    def __init__(self, model: ServedModel, config: ServeConfig, metrics: Metrics) -> None:
        self.model, self.metrics = model, metrics
        self.max_tokens, self.max_wait = config.max_batch_tokens, config.max_wait_ms / 1000
        self.max_queue = config.limits.max_queue
        self.queue: deque[_Job] = deque()
        self._wakeup = asyncio.Event()
        self._executor = model.runner
        self._task: asyncio.Task | None = None
        self._taken: list[_Job] = []  # the jobs of the batch being gathered or run

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for job in [*self._taken, *self.queue]:
            if not job.future.done():
                job.future.set_exception(ApiError(503, "the server is shutting down", headers=RETRY))
        self.queue.clear()
        # the model's thread outlives the app (another app may serve the model): wait for the
        # batch it may be running, which comes before this in its queue
        await asyncio.wrap_future(self._executor.submit(_idle))

    async def embed(self, sentences: list[list[str]], request: Request) -> list[np.ndarray]:
        """The sentences' arrays, computed in a batch with whatever else is queued."""
        tokens = sum(len(s) + 2 for s in sentences)
        return await self._submit(
            _Job(asyncio.get_running_loop().create_future(), sentences, None, tokens), request
        )

    async def call(self, call: Callable[[], Any], request: Request) -> Any:
        """``call()`` on the worker's thread, alone, in its turn in the queue."""
        return await self._submit(_Job(asyncio.get_running_loop().create_future(), None, call), request)

    async def _submit(self, job: _Job, request: Request) -> Any:
        if len(self.queue) >= self.max_queue:
            raise ApiError(
                503,
                f"model {self.model.name} is busy: {len(self.queue)} requests are waiting "
                f"(the queue holds {self.max_queue}); retry later",
                headers=RETRY,
            )
        job.queued = time.perf_counter()
        self.queue.append(job)
        self.metrics.queue_depth.labels(self.model.name).set(len(self.queue))
        self._wakeup.set()
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({job.future, gone}, return_when=asyncio.FIRST_COMPLETED)
            if job.future.done():
                result = job.future.result()
                # the x-queue-time and x-inference-time headers (the app's guard sends them)
                request.state.queue_seconds = job.started - job.queued
                request.state.inference_seconds = job.ended - job.started
                return result
            # the client left: drop its work if it has not started (a running batch finishes)
            with contextlib.suppress(ValueError):
                self.queue.remove(job)
            self.metrics.queue_depth.labels(self.model.name).set(len(self.queue))
            self.metrics.cancelled.labels(self.model.name).inc()
            job.future.cancel()
            raise ClientGone
        finally:
            gone.cancel()

    def _take(self) -> list[_Job]:
        """The next batch's jobs from the queue's head (at least one): a call alone, or
        embedding jobs up to ``max_tokens`` tokens."""
        first = self.queue.popleft()
        jobs, tokens = [first], first.tokens
        if first.call is None:
            while (
                self.queue and self.queue[0].call is None and tokens + self.queue[0].tokens <= self.max_tokens
            ):
                job = self.queue.popleft()
                jobs.append(job)
                tokens += job.tokens
        return jobs

    def _full(self, tokens: int) -> bool:
        """Whether the batch cannot take the next queued job (or there is no point waiting)."""
        if tokens >= self.max_tokens:
            return True
        return bool(self.queue) and (
            self.queue[0].call is not None or tokens + self.queue[0].tokens > self.max_tokens
        )

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            jobs = self._taken = self._take()
            if jobs[0].call is None:  # wait up to max_wait for more sentences to batch with
                deadline = loop.time() + self.max_wait
                tokens = sum(j.tokens for j in jobs)
                while not self._full(tokens) and (remaining := deadline - loop.time()) > 0:
                    self._wakeup.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._wakeup.wait(), remaining)
                    while self.queue and not self._full(tokens):
                        job = self.queue.popleft()
                        jobs.append(job)
                        tokens += job.tokens
            self.metrics.queue_depth.labels(self.model.name).set(len(self.queue))
            jobs = [j for j in jobs if not j.future.done()]  # cancelled by a client that left
            try:
                if jobs:
                    await self._execute(jobs, loop)
            except Exception as err:  # a bug here must not stop the worker: fail this batch only
                log.exception("batch of model %s failed", self.model.name)
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(err)
            self._taken = []

    async def _execute(self, jobs: list[_Job], loop: asyncio.AbstractEventLoop) -> None:
        name = self.model.name
        started = time.perf_counter()
        for job in jobs:
            job.started = started
        if jobs[0].call is not None:
            results: list[Any] = [await _run_on(loop, self._executor, jobs[0].call)]
        else:
            sentences = [s for job in jobs for s in job.sentences or []]
            self.metrics.batch_sentences.labels(name).observe(len(sentences))
            self.metrics.batch_tokens.labels(name).observe(sum(len(s) for s in sentences))
            start = time.perf_counter()
            outcome = await _run_on(loop, self._executor, self.model.embed, sentences)
            self.metrics.batch_seconds.labels(name).observe(time.perf_counter() - start)
            if isinstance(outcome, BaseException) and len(jobs) > 1:  # find whose input failed
                for job in jobs:
                    await self._execute([job], loop)
                return
            if not isinstance(outcome, BaseException):
                self.metrics.tokens.labels(name).inc(sum(len(s) for s in sentences))
                results, at = [], 0
                for job in jobs:
                    n = len(job.sentences or [])
                    results.append(outcome[at : at + n])
                    at += n
            else:
                results = [outcome]
        ended = time.perf_counter()
        for job, result in zip(jobs, results):
            job.ended = ended
            if job.future.done():
                continue
            if isinstance(result, BaseException):
                job.future.set_exception(result)
            else:
                job.future.set_result(result)


def _idle() -> None:
    """Nothing: run on a model's thread, its end says the work queued before it is done."""


async def _run_on(loop: asyncio.AbstractEventLoop, executor: Executor, fn, *args) -> Any:
    """``fn(*args)`` on ``executor``; an exception is returned, not raised (the worker goes on)."""
    try:
        return await loop.run_in_executor(executor, fn, *args)
    except Exception as err:  # logged here, answered as a 500 (or a 400 for a ValueError)
        log.exception("model call failed")
        return err


async def _disconnected(request: Request) -> None:
    """Return when the client has disconnected (the request's body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# -- metrics ------------------------------------------------------------------------------------
class Metrics:
    """The Prometheus metrics of one app, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.requests = prom.Counter(
            "elmokit_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.latency = prom.Histogram(
            "elmokit_request_seconds",
            "time from a request's arrival to its answer",
            ["endpoint"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.tokens = prom.Counter("elmokit_tokens", "tokens embedded", ["model"], registry=r)
        self.batch_sentences = prom.Histogram(
            "elmokit_batch_sentences",
            "sentences per batch",
            ["model"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=r,
        )
        self.batch_tokens = prom.Histogram(
            "elmokit_batch_tokens",
            "tokens per batch",
            ["model"],
            buckets=(16, 64, 256, 1024, 2048, 4096, 8192, 16384, 65536),
            registry=r,
        )
        self.batch_seconds = prom.Histogram(
            "elmokit_batch_seconds",
            "time the model took for a batch",
            ["model"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.in_flight = prom.Gauge(
            "elmokit_requests_in_flight", "HTTP requests being answered", ["endpoint"], registry=r
        )
        self.queue_depth = prom.Gauge("elmokit_queue_depth", "requests waiting", ["model"], registry=r)
        self.cancelled = prom.Counter(
            "elmokit_cancelled", "requests whose client left before the answer", ["model"], registry=r
        )
