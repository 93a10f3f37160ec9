"""`elmokit serve`: ELMo as an HTTP service that batches concurrent requests.

Endpoints: ``POST /v1/embeddings`` (OpenAI-compatible: one pooled vector per input), ``POST /embed``
(token-level vectors, the numbers of ``Embedder``), ``POST /score`` and ``POST /substitutes`` (the
language model, for models with a softmax), ``GET /v1/models``, ``GET /health``, ``GET /ready``
and ``GET /metrics`` (Prometheus text).

Concurrent embedding requests of a model wait in one bounded queue; its worker takes what is
queued (up to ``max_batch_tokens`` tokens, waiting at most ``max_wait_ms`` for more) and embeds
it as one length-sorted batch. The models run in warm mode, where a sentence's vectors do not
depend on what it is batched with, so a request's answer is the one it would get alone.

Models are loaded once, at start; a request can only name one of them, never a path or a URL.
This module is a product layer over ``elmokit.embed`` and ``elmokit.scoring``: only the CLI
imports it. It needs the ``serve`` extra (FastAPI, uvicorn, prometheus-client).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import os
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

try:
    import prometheus_client as prom
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import ClientDisconnect
except ImportError as _err:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"elmokit serve needs the serve extra ({_err}); install it with: pip install 'elmokit[serve]'"
    ) from None

from .embed import Embedder, _output_array, _select_layers, _tokenizer

log = logging.getLogger(__name__)

API_KEY_ENV = "ELMOKIT_API_KEY"
CONFIG_ENV = "ELMOKIT_SERVE_CONFIG"  # the configuration of `--workers` processes (JSON)
OPEN_PATHS = ("/health",)  # answered without the API key
ENDPOINTS = (
    "/v1/embeddings",
    "/embed",
    "/score",
    "/substitutes",
    "/v1/models",
    "/health",
    "/ready",
    "/metrics",
)
POOLED_LAYERS = ("average", "top")  # /v1/embeddings: one vector per input
ENCODINGS = ("float", "base64")
MAX_K = 1000  # /substitutes: words listed per direction
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


# -- configuration ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """What one request may ask and how many may wait; past them a request is refused (413 for
    its size, 503 with Retry-After when the queue is full)."""

    max_body_bytes: int = 1 << 20
    max_inputs: int = 256  # sentences (inputs) per request
    max_input_tokens: int = 512  # tokens per sentence
    max_request_tokens: int = 16384  # tokens per request, all sentences together
    max_queue: int = 1024  # requests waiting for a model's worker
    max_response_values: int = 4_000_000  # /embed: numbers in one answer (16 MB as float32)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``elmokit serve`` is started with, except the API key (kept out of the
    environment copy that ``--workers`` processes read: they take it from ``ELMOKIT_API_KEY``)."""

    models: tuple[str, ...] = ("elmo-news-512",)
    device: str | None = None
    max_batch_tokens: int = 4096
    max_wait_ms: float = 5.0
    tokenize: bool = False
    threads: int | None = None
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("give at least one --model")
        if self.max_batch_tokens < 1:
            raise ValueError(f"--max-batch-tokens must be at least 1, got {self.max_batch_tokens}")
        if not 0 <= self.max_wait_ms <= 10_000:
            raise ValueError(f"--max-wait-ms must be between 0 and 10000, got {self.max_wait_ms}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {self.threads}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServeConfig:
        data = json.loads(text)
        return cls(
            **{**data, "models": tuple(data["models"]), "limits": Limits(**data["limits"])}  # type: ignore[arg-type]
        )


def model_name(spec: str) -> tuple[str, str]:
    """(name served, spec loaded) of a ``--model``: ``NAME=SPEC`` names it; else a shipped or
    known model keeps its name and a folder, archive or URL is named by its last part."""
    head, equals, rest = spec.partition("=")
    if equals and _NAME.fullmatch(head) and rest:
        return head, rest
    last = spec.rstrip("/").rsplit("/", 1)[-1]
    name = last.removesuffix(".zip") or spec
    if not _NAME.fullmatch(name):
        raise ValueError(f"--model {spec}: cannot name it from its path; give NAME={spec}")
    return name, spec


# -- the models ---------------------------------------------------------------------------------
@dataclass(eq=False)
class ServedModel:
    """A model loaded at start: its ``Embedder`` (warm mode) and, when it has a softmax, the
    language model and vocabulary that /score and /substitutes use (sharing the Embedder's biLM)."""

    name: str
    embedder: Embedder
    language_model: Any = None
    vocab: Any = None

    @property
    def dim(self) -> int:
        return self.embedder.dim

    @property
    def num_layers(self) -> int:
        return self.embedder.bilm.num_layers

    def embed(self, sentences: list[list[str]]) -> list[np.ndarray]:
        """(num_layers, n_tokens, dim) per sentence, in order, batched by length."""
        return list(self.embedder.embed_sentences(sentences))


def load_model(spec: str, device: str | None, max_batch_tokens: int) -> ServedModel:
    """Load a ``--model`` (see ``model_name``) with its softmax where it has one, and warm it
    up with one sentence."""
    from .scoring import load_scoring_model

    name, source = model_name(spec)
    language_model = vocab = None
    try:
        language_model, vocab = load_scoring_model(source, device=device)
    except FileNotFoundError:  # no softmax (or not a language model folder): embeddings only
        pass
    bilm = language_model.bilm if language_model is not None else source
    embedder = Embedder(bilm, batch_size=1024, device=device, max_tokens_per_batch=max_batch_tokens)
    served = ServedModel(name, embedder, language_model, vocab)
    served.embed([["warm", "up", "."]])
    log.info(
        "model %s: %s, %d layers of %d, %s",
        name,
        source,
        served.num_layers,
        served.dim,
        "with a softmax (score, substitutes)" if language_model is not None else "no softmax",
    )
    return served


def load_models(config: ServeConfig) -> list[ServedModel]:
    """Every model of ``config``, loaded and warmed up; two with one name are a ValueError."""
    if config.threads is not None:
        import torch

        torch.set_num_threads(config.threads)
    names = [model_name(spec)[0] for spec in config.models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two --model share the name {twice[0]}; name them with NAME=SPEC")
    return [load_model(spec, config.device, config.max_batch_tokens) for spec in config.models]


# -- errors -------------------------------------------------------------------------------------
class ApiError(Exception):
    """A request refused: its HTTP status and the one-line message of its JSON error."""

    KINDS = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large", 503: "overloaded"}

    def __init__(
        self, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.param, self.headers)


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The JSON error of every refusal, in the OpenAI layout: {"error": {message, type, param, code}}."""
    kind = ApiError.KINDS.get(status, "invalid_request_error" if status < 500 else "server_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


class _ClientGone(Exception):
    """The client disconnected before its answer was ready."""


# -- dynamic batching ---------------------------------------------------------------------------
@dataclass(eq=False)
class _Job:
    """One request's work: sentences to embed (batched with others) or a call that runs alone."""

    future: asyncio.Future
    sentences: list[list[str]] | None = None
    call: Callable[[], Any] | None = None
    tokens: int = 0


class Batcher:
    """The queue of one model and the worker that empties it, one batch at a time, on a thread
    of its own (so the event loop keeps answering while the model runs)."""

    def __init__(self, model: ServedModel, config: ServeConfig, metrics: Metrics) -> None:
        self.model, self.metrics = model, metrics
        self.max_tokens, self.max_wait = config.max_batch_tokens, config.max_wait_ms / 1000
        self.max_queue = config.limits.max_queue
        self.queue: deque[_Job] = deque()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"elmokit-serve-{model.name}")
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
                job.future.set_exception(ApiError(503, "the server is shutting down", headers=_RETRY))
        self.queue.clear()
        self._executor.shutdown(wait=True)

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
                headers=_RETRY,
            )
        self.queue.append(job)
        self.metrics.queue_depth.labels(self.model.name).set(len(self.queue))
        self._wakeup.set()
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({job.future, gone}, return_when=asyncio.FIRST_COMPLETED)
            if job.future.done():
                return job.future.result()
            # the client left: drop its work if it has not started (a running batch finishes)
            with contextlib.suppress(ValueError):
                self.queue.remove(job)
            self.metrics.queue_depth.labels(self.model.name).set(len(self.queue))
            self.metrics.cancelled.labels(self.model.name).inc()
            job.future.cancel()
            raise _ClientGone
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
            if jobs:
                await self._execute(jobs, loop)
            self._taken = []

    async def _execute(self, jobs: list[_Job], loop: asyncio.AbstractEventLoop) -> None:
        name = self.model.name
        if jobs[0].call is not None:
            results: list[Any] = [await _run_on(loop, self._executor, jobs[0].call)]
        else:
            sentences = [s for job in jobs for s in job.sentences or []]
            self.metrics.batch_sentences.labels(name).observe(len(sentences))
            self.metrics.batch_tokens.labels(name).observe(sum(len(s) for s in sentences))
            outcome = await _run_on(loop, self._executor, self.model.embed, sentences)
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
        for job, result in zip(jobs, results):
            if job.future.done():
                continue
            if isinstance(result, BaseException):
                job.future.set_exception(result)
            else:
                job.future.set_result(result)


_RETRY = {"Retry-After": "1"}


async def _run_on(loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor, fn, *args) -> Any:
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
        self.in_flight = prom.Gauge(
            "elmokit_requests_in_flight", "HTTP requests being answered", ["endpoint"], registry=r
        )
        self.queue_depth = prom.Gauge("elmokit_queue_depth", "requests waiting", ["model"], registry=r)
        self.cancelled = prom.Counter(
            "elmokit_cancelled", "requests whose client left before the answer", ["model"], registry=r
        )


class _Guard:
    """ASGI middleware of every HTTP request: the API key (all paths but /health) and the
    request metrics (the endpoint label is one of ``ENDPOINTS`` or "other")."""

    def __init__(self, app, api_key: str | None, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else "other"
        start, status = time.perf_counter(), [500]
        self.metrics.in_flight.labels(endpoint).inc()

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if self.key is not None and path not in OPEN_PATHS and not self._authorized(scope, self.key):
                refusal = error_response(
                    401,
                    "this server needs an API key: send the header 'Authorization: Bearer KEY'",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await refusal(scope, receive, sending)
            else:
                await self.app(scope, receive, sending)
        finally:
            self.metrics.in_flight.labels(endpoint).dec()
            self.metrics.requests.labels(endpoint, str(status[0])).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)

    @staticmethod
    def _authorized(scope, key: bytes) -> bool:
        """Whether the request carries one ``Authorization: Bearer KEY`` header (constant-time)."""
        given = [v for k, v in scope["headers"] if k == b"authorization"]
        if len(given) != 1:
            return False
        scheme, _, token = given[0].partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key)


# -- requests -----------------------------------------------------------------------------------
async def _read_json(request: Request, limits: Limits) -> dict:
    """The request's body as a JSON object, read up to ``max_body_bytes``."""
    limit = limits.max_body_bytes
    too_large = f"the request body is larger than {limit:,} bytes, the most this server takes"
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, too_large)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, too_large)
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body.strip():
        raise ApiError(400, "the request body is empty: send a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ApiError(
            400, f"the request body is not UTF-8 (byte {err.start} is {body[err.start]:#04x})"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ApiError(
            400, f"the request body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"
        ) from None
    except RecursionError:
        raise ApiError(400, "the request body is not valid JSON: nested too deeply") from None
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise ApiError(400, f"the request body is not valid JSON: {str(err)[:120]}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {_kind(data)}")
    return data


def _kind(value: Any) -> str:
    """A JSON value's type, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _choice(data: dict, key: str, choices: Sequence[str], default: str) -> str:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str) or value not in choices:
        shown = json.dumps(value)[:40] if isinstance(value, str) else _kind(value)
        raise ApiError(400, f"'{key}' must be one of {', '.join(choices)}, got {shown}", key)
    return value


def _integer(data: dict, key: str, default: int | None, low: int, high: int) -> int:
    value = data.get(key, default)
    if value is None:
        raise ApiError(400, f"'{key}' is required: an integer", key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, f"'{key}' must be an integer, got {_kind(value)}", key)
    if not low <= value <= high:
        raise ApiError(400, f"'{key}' must be between {low} and {high}, got {value}", key)
    return value


def _flag(data: dict, key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise ApiError(400, f"'{key}' must be true or false, got {_kind(value)}", key)
    return value


class _Inputs:
    """Turns a request's sentences (strings, split as the server was told, or lists of token
    strings) into checked token lists within the limits."""

    def __init__(self, limits: Limits, tokenize: bool) -> None:
        self.limits, self.split = limits, _tokenizer(tokenize)

    def sentence(self, value: Any, where: str) -> list[str]:
        if isinstance(value, str):
            _check_text(value, where)
            tokens = self.split(value)
        elif isinstance(value, list):
            if value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
                raise ApiError(
                    400,
                    f"{where} is a list of token ids: ELMo reads characters, so send text or a list "
                    "of token strings",
                    where,
                )
            for j, token in enumerate(value):
                if not isinstance(token, str):
                    raise ApiError(400, f"{where}[{j}] must be a token string, got {_kind(token)}", where)
                _check_text(token, f"{where}[{j}]")
                if not token or token.isspace():
                    raise ApiError(400, f"{where}[{j}] is an empty token", where)
            tokens = list(value)
        else:
            raise ApiError(
                400, f"{where} must be a string or a list of token strings, got {_kind(value)}", where
            )
        if not tokens:
            raise ApiError(400, f"{where} is empty: it has no tokens", where)
        if len(tokens) > self.limits.max_input_tokens:
            raise ApiError(
                413,
                f"{where} has {len(tokens):,} tokens; this server takes at most "
                f"{self.limits.max_input_tokens:,} per sentence",
                where,
            )
        return tokens

    def sentences(self, value: Any, key: str) -> list[list[str]]:
        """The sentences of ``value``: one string, or a list whose items are strings or lists of
        token strings (a bare list of strings is that many sentences, as OpenAI's ``input``)."""
        if value is None:
            raise ApiError(400, f"'{key}' is required: a string or a list of sentences", key)
        if isinstance(value, str):
            items = [value]
        elif isinstance(value, list):
            if all(isinstance(t, int) and not isinstance(t, bool) for t in value) and value:
                raise ApiError(
                    400,
                    f"'{key}' is a list of token ids: ELMo reads characters, so send text or lists "
                    "of token strings",
                    key,
                )
            items = value
        else:
            raise ApiError(400, f"'{key}' must be a string or a list of sentences, got {_kind(value)}", key)
        if not items:
            raise ApiError(400, f"'{key}' is empty: give at least one sentence", key)
        if len(items) > self.limits.max_inputs:
            raise ApiError(
                413,
                f"'{key}' has {len(items):,} sentences; this server takes at most {self.limits.max_inputs:,}",
                key,
            )
        out = [self.sentence(item, f"{key}[{i}]") for i, item in enumerate(items)]
        total = sum(len(s) for s in out)
        if total > self.limits.max_request_tokens:
            raise ApiError(
                413,
                f"'{key}' has {total:,} tokens in all; this server takes at most "
                f"{self.limits.max_request_tokens:,} per request",
                key,
            )
        return out


def _check_text(text: str, where: str) -> None:
    """Text a response can carry: UTF-8 encodable (JSON's \\ud800 escapes can make lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(
            400, f"{where} holds an unpaired surrogate (\\ud800-\\udfff): not text", where
        ) from None


def _encode(vector: np.ndarray, encoding: str) -> list | str:
    """A float32 array as JSON numbers (nested lists), or base64 of its little-endian bytes."""
    if encoding == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.tolist()


# -- the app ------------------------------------------------------------------------------------
def create_app(models: list[ServedModel], config: ServeConfig, api_key: str | None = None) -> FastAPI:
    """The ASGI app serving ``models`` (loaded and warmed up). ``api_key``: required as
    ``Authorization: Bearer`` on every endpoint but /health."""
    if not models:
        raise ValueError("no model to serve")
    by_name = {m.name: m for m in models}
    limits, inputs = config.limits, _Inputs(config.limits, config.tokenize)
    metrics = Metrics()
    state: dict[str, Any] = {"ready": False, "batchers": {}}
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        batchers = state["batchers"] = {m.name: Batcher(m, config, metrics) for m in models}
        for batcher in batchers.values():
            batcher.start()
        state["ready"] = True
        log.info("ready: %s", ", ".join(by_name))
        try:
            yield
        finally:
            state["ready"] = False
            for batcher in batchers.values():
                await batcher.stop()

    app = FastAPI(title="elmokit", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = metrics

    def chosen(data: dict, scoring: bool = False) -> tuple[ServedModel, Batcher]:
        name = data.get("model")
        if name is None:
            name = models[0].name
        if not isinstance(name, str):
            raise ApiError(400, f"'model' must be a string, got {_kind(name)}", "model")
        if name not in by_name:  # only the models loaded at start: never a path or URL
            raise ApiError(
                404,
                f"model {json.dumps(name)[:80]} is not served here; served: {', '.join(by_name)}",
                "model",
            )
        model = by_name[name]
        if scoring and model.language_model is None:
            raise ApiError(400, f"model {name} has no softmax: it cannot score or predict words", "model")
        if not state["ready"]:
            raise ApiError(503, "the server is not ready", headers=_RETRY)
        return model, state["batchers"][name]

    async def answer(call, in_thread: bool = False) -> Response:
        """Run a handler body, turning refusals into JSON errors; ``in_thread`` renders the JSON
        on a thread (a large answer does not hold up the event loop)."""
        try:
            body = await call()
            return await asyncio.to_thread(JSONResponse, body) if in_thread else JSONResponse(body)
        except ApiError as err:
            return err.response()
        except (_ClientGone, ClientDisconnect):  # nobody is left to answer
            return Response(status_code=499)
        except ValueError as err:  # a check of the model library the parsing above missed
            return error_response(400, str(err))

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        async def run() -> dict:
            data = await _read_json(request, limits)
            model, batcher = chosen(data)
            encoding = _choice(data, "encoding_format", ENCODINGS, "float")
            layers = _choice(data, "layers", POOLED_LAYERS, "average")
            dimensions = data.get("dimensions")
            if dimensions is not None and dimensions != model.dim:
                raise ApiError(
                    400,
                    f"'dimensions' must be {model.dim} (the model's), got {json.dumps(dimensions)[:20]}",
                    "dimensions",
                )
            sentences = inputs.sentences(data.get("input"), "input")
            arrays = await batcher.embed(sentences, request)
            n = sum(len(s) for s in sentences)
            return {
                "object": "list",
                "data": [
                    {
                        "object": "embedding",
                        "index": i,
                        "embedding": _encode(_output_array(a, layers, "mean"), encoding),
                    }
                    for i, a in enumerate(arrays)
                ],
                "model": model.name,
                "usage": {"prompt_tokens": n, "total_tokens": n},
            }

        return await answer(run)

    @app.post("/embed")
    async def embed(request: Request) -> Response:
        async def run() -> dict:
            data = await _read_json(request, limits)
            model, batcher = chosen(data)
            layers = _choice(data, "layers", ("all", "top", "average"), "all")
            encoding = _choice(data, "encoding_format", ENCODINGS, "float")
            sentences = inputs.sentences(data.get("sentences"), "sentences")
            values = sum(len(s) for s in sentences) * model.dim * (model.num_layers if layers == "all" else 1)
            if values > limits.max_response_values:
                raise ApiError(
                    413,
                    f"the answer would hold {values:,} numbers; this server gives at most "
                    f"{limits.max_response_values:,} per request: send fewer tokens or ask for fewer layers",
                    "sentences",
                )
            arrays = await batcher.embed(sentences, request)
            results = []
            for tokens, array in zip(sentences, arrays):
                selected = _select_layers(array, layers)
                results.append(
                    {
                        "tokens": tokens,
                        "shape": list(selected.shape),
                        "embedding": _encode(selected, encoding),
                    }
                )
            return {"model": model.name, "layers": layers, "results": results}

        return await answer(run, in_thread=True)

    @app.post("/score")
    async def score(request: Request) -> Response:
        async def run() -> dict:
            from .scoring import score_sentences

            data = await _read_json(request, limits)
            model, batcher = chosen(data, scoring=True)
            per_token = _flag(data, "per_token")
            sentences = inputs.sentences(data.get("sentences"), "sentences")

            def compute() -> list[dict]:
                scores = score_sentences(model.language_model, model.vocab, sentences)
                return [{"sentence": s.tokens, **s.to_dict(per_token, digits=6)} for s in scores]

            return {"model": model.name, "results": await batcher.call(compute, request)}

        return await answer(run)

    @app.post("/substitutes")
    async def substitutes(request: Request) -> Response:
        async def run() -> dict:
            from .scoring import substitutes as predict

            data = await _read_json(request, limits)
            model, batcher = chosen(data, scoring=True)
            tokens = inputs.sentence(data.get("sentence"), "sentence")
            position = _integer(data, "position", None, 0, len(tokens) - 1)
            k = _integer(data, "k", 10, 1, MAX_K)
            found = await batcher.call(
                lambda: predict(model.language_model, model.vocab, tokens, position, k=k), request
            )
            return {"model": model.name, **found.to_dict()}

        return await answer(run)

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": m.name,
                    "object": "model",
                    "created": created,
                    "owned_by": "elmokit",
                    "dim": m.dim,
                    "layers": m.num_layers,
                    "softmax": m.language_model is not None,
                }
                for m in models
            ],
        }

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> Response:
        if not state["ready"]:
            return error_response(
                503, "not ready: the models are loading or the server is stopping", headers=_RETRY
            )
        return JSONResponse({"status": "ready", "models": list(by_name)})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(prom.generate_latest(metrics.registry), media_type=prom.CONTENT_TYPE_LATEST)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        return error_response(
            err.status_code, f"{request.method} {request.url.path}: {err.detail}", headers=err.headers
        )

    @app.exception_handler(Exception)
    async def server_error(request: Request, err: Exception) -> Response:
        log.error("internal error on %s", request.url.path, exc_info=err)
        return error_response(500, "internal error; the server log has its details")

    app.add_middleware(_Guard, api_key=api_key, metrics=metrics)
    return app


def create_app_from_env() -> FastAPI:
    """The app of one ``--workers`` process: the configuration from ``ELMOKIT_SERVE_CONFIG``,
    the API key from ``ELMOKIT_API_KEY``; each process loads its own copy of the models."""
    logging.basicConfig(level=logging.INFO, format="elmokit serve: %(message)s")
    config = ServeConfig.from_json(os.environ[CONFIG_ENV])
    return create_app(load_models(config), config, os.environ.get(API_KEY_ENV) or None)


# -- running ------------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def serve(
    config: ServeConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    workers: int = 1,
    drain_seconds: float = 30.0,
) -> None:
    """Load the models, listen on ``host:port`` (0: a free port, logged) and serve until
    SIGTERM or SIGINT, which stop accepting, answer the requests in flight (for at most
    ``drain_seconds``) and return."""
    import socket

    import uvicorn

    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if not is_loopback(host) and not api_key:
        log.warning("listening on %s without an API key: anyone who reaches this port can use it", host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.listen(2048)
    options: dict[str, Any] = {
        "timeout_graceful_shutdown": drain_seconds,
        "log_level": "info",
        "access_log": False,
        "lifespan": "on",
    }
    bound = sock.getsockname()[1]
    stopped_by: list[int] = []
    replayed = _note_signals(stopped_by)
    try:
        if workers > 1:
            os.environ[CONFIG_ENV] = config.to_json()
            if api_key:
                os.environ[API_KEY_ENV] = api_key
            log.info(
                "serving %s on http://%s:%d with %d worker processes",
                ", ".join(config.models),
                host,
                bound,
                workers,
            )
            uvicorn.run(
                "elmokit.serve:create_app_from_env",
                factory=True,
                fd=sock.fileno(),
                workers=workers,
                **options,
            )
            return
        app = create_app(load_models(config), config, api_key)
        log.info("serving %s on http://%s:%d", ", ".join(m for m in config.models), host, bound)
        uvicorn.Server(uvicorn.Config(app, **options)).run(sockets=[sock])
    finally:
        sock.close()
        for signum, handler in replayed.items():
            signal.signal(signum, handler)
    if stopped_by:
        log.info("stopped by %s after answering the requests in flight", signal.Signals(stopped_by[0]).name)


def _note_signals(stopped_by: list[int]) -> dict[int, Any]:
    """Make SIGINT and SIGTERM append to ``stopped_by``; returns the handlers they had.

    uvicorn handles both while it serves (stop accepting, drain, shut down) and then raises the
    signal again into the handlers it found: these note it, so a drained stop returns and the
    command exits 0 instead of dying by the signal. Only in the main thread (where signals go)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def note(signum: int, frame: Any) -> None:
        stopped_by.append(signum)

    return {signum: signal.signal(signum, note) for signum in (signal.SIGINT, signal.SIGTERM)}


__all__ = [
    "API_KEY_ENV",
    "ApiError",
    "Batcher",
    "Limits",
    "ServeConfig",
    "ServedModel",
    "create_app",
    "is_loopback",
    "load_model",
    "load_models",
    "model_name",
    "serve",
]
