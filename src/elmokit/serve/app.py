"""The ASGI app of `elmokit serve` (Starlette): its endpoints and the API key, and ``serve``, which
runs it with uvicorn until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import re
import signal
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import prometheus_client as prom
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .._version import __version__
from ..base.signals import STOP_SIGNALS, installed, noting
from ..embed.vectors_file import output_array, select_layers
from .batcher import Batcher, Metrics
from .config import API_KEY_ENV, CONFIG_ENV, Limits, ServeConfig, ServedModel, check_models, load_models
from .limits import (
    REQUEST_ID,
    RETRY,
    ApiError,
    ClientGone,
    Inputs,
    choice,
    encode,
    error_response,
    flag,
    integer,
    kind_of,
    read_json,
)

__all__ = ["create_app", "serve"]

log = logging.getLogger(__name__)

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
    "/info",
    "/tokenize",
    "/openapi.json",
)
POOLED_LAYERS = ("average", "top")  # /v1/embeddings: one vector per input
ENCODINGS = ("float", "base64")
MAX_K = 1000  # /substitutes: words listed per direction
_SANE_ID = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,128}")  # an x-request-id taken as it is


class _Guard:
    """ASGI middleware of every HTTP request: its id (``x-request-id``: the client's when sane,
    else a new one; in every answer, error bodies and log lines), the size and number of its
    headers (431 past the limits; the HTTP protocol already bounds what it reads), the API key
    (all paths but /health), the timing headers and the request metrics (the endpoint label is
    one of ``ENDPOINTS`` or "other")."""

    def __init__(self, app, api_key: str | None, metrics: Metrics, limits: Limits) -> None:
        self.app, self.metrics, self.limits = app, metrics, limits
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else "other"
        start, status = time.perf_counter(), [500]
        headers = scope["headers"]
        given = [v for k, v in headers if k == b"x-request-id"]
        sane = len(given) == 1 and _SANE_ID.fullmatch(given[0])
        request_id = given[0].decode() if sane else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        token = REQUEST_ID.set(request_id)
        self.metrics.in_flight.labels(endpoint).inc()

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                extra = [(b"x-request-id", request_id.encode())]
                for name in ("queue", "inference"):
                    seconds = state.get(f"{name}_seconds")
                    if seconds is not None:  # milliseconds, as TEI gives them
                        extra.append((f"x-{name}-time".encode(), f"{1000 * seconds:.3f}".encode()))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            too_large = self._too_large(headers)
            if too_large:
                await error_response(431, too_large)(scope, receive, sending)
            elif self.key is not None and path not in OPEN_PATHS and not self._authorized(scope, self.key):
                refusal = error_response(
                    401,
                    "this server needs an API key: send the header 'Authorization: Bearer KEY'",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await refusal(scope, receive, sending)
            else:
                await self.app(scope, receive, sending)
        finally:
            REQUEST_ID.reset(token)
            self.metrics.in_flight.labels(endpoint).dec()
            self.metrics.requests.labels(endpoint, str(status[0])).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
            if status[0] >= 400:
                log.debug("request %s: %s %s answered %d", request_id, scope["method"], path, status[0])

    def _too_large(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """Why the request's headers are refused (431), or None."""
        if len(headers) > self.limits.max_headers:
            return f"the request has more than {self.limits.max_headers} headers"
        if sum(len(k) + len(v) + 4 for k, v in headers) > self.limits.max_header_bytes:
            return (
                f"the request's headers are larger than {self.limits.max_header_bytes:,} bytes, "
                "the most this server reads"
            )
        return None

    @staticmethod
    def _authorized(scope, key: bytes) -> bool:
        """Whether the request carries one ``Authorization: Bearer KEY`` header (constant-time)."""
        given = [v for k, v in scope["headers"] if k == b"authorization"]
        if len(given) != 1:
            return False
        scheme, _, token = given[0].partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key)


# -- the app ------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Service:
    """What the handlers of one app read (``request.app.state.service``): the models, their
    batchers (from the app's start to its stop) and the configuration."""

    models: list[ServedModel]
    config: ServeConfig
    metrics: Metrics
    ready: bool = False
    batchers: dict[str, Batcher] = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))  # /v1/models' "created"

    def __post_init__(self) -> None:
        self.by_name = {m.name: m for m in self.models}
        self.inputs = Inputs(self.config.limits, self.config.tokenize)

    def chosen(self, data: dict, scoring: bool = False) -> tuple[ServedModel, Batcher]:
        """The model a request names (the first one served when it names none) and its batcher."""
        name = data.get("model")
        if name is None:
            name = self.models[0].name
        if not isinstance(name, str):
            raise ApiError(400, f"'model' must be a string, got {kind_of(name)}", "model")
        if name not in self.by_name:  # only the models loaded at start: never a path or URL
            raise ApiError(
                404,
                f"model {json.dumps(name)[:80]} is not served here; served: {', '.join(self.by_name)}",
                "model",
            )
        model = self.by_name[name]
        if scoring and model.language_model is None:
            raise ApiError(400, f"model {name} has no softmax: it cannot score or predict words", "model")
        if not self.ready:
            raise ApiError(503, "the server is not ready", headers=RETRY)
        return model, self.batchers[name]

    def truncate(self, data: dict) -> bool:
        """A request's ``truncate`` (true or false), else the server's ``--truncate``."""
        value = data.get("truncate")
        if value is None:
            return self.config.truncate
        if not isinstance(value, bool):
            raise ApiError(400, f"'truncate' must be true or false, got {kind_of(value)}", "truncate")
        return value

    def info(self) -> dict[str, Any]:
        config = self.config
        return {
            "version": __version__,
            "models": [
                {
                    "id": m.name,
                    "dimensions": m.dim,
                    "layers": m.num_layers,
                    "softmax": m.language_model is not None,
                }
                for m in self.models
            ],
            "limits": {**asdict(config.limits), "header_timeout_seconds": config.header_timeout},
            "max_batch_tokens": config.max_batch_tokens,
            "max_wait_ms": config.max_wait_ms,
            "tokenize": config.tokenize,
            "truncate": config.truncate,
        }


async def _answer(call, in_thread: bool = False) -> Response:
    """Run a handler body, turning refusals into JSON errors; ``in_thread`` renders the JSON
    on a thread (a large answer does not hold up the event loop)."""
    try:
        body = await call()
        return await asyncio.to_thread(JSONResponse, body) if in_thread else JSONResponse(body)
    except ApiError as err:
        return err.response()
    except (ClientGone, ClientDisconnect):  # nobody is left to answer
        return Response(status_code=499)
    except ValueError as err:  # a check of the model library the parsing above missed
        return error_response(400, str(err))


def _unit(vector: np.ndarray) -> np.ndarray:
    """``vector`` scaled to length 1 (float32); all zeros stays zeros."""
    norm = float(np.linalg.norm(vector.astype(np.float64)))
    return (vector.astype(np.float64) / norm).astype(np.float32) if norm > 0 else vector


# -- the endpoints: each reads the app's _Service from request.app.state.service -----------------
def _service(request: Request) -> _Service:
    return request.app.state.service


def _dimensions(data: dict, model: ServedModel) -> None:
    """Refuse ``dimensions`` other than the model's size (ELMo has no shorter prefix)."""
    dimensions = data.get("dimensions")
    number = isinstance(dimensions, int) and not isinstance(dimensions, bool)
    if dimensions is not None and not (number and dimensions == model.dim):
        shown = json.dumps(dimensions)[:20] if number else kind_of(dimensions)
        raise ApiError(
            400,
            f"'dimensions' must be {model.dim}, the model's size, got {shown}: an ELMo vector is "
            "a forward half and a backward half, not a prefix that can be cut shorter",
            "dimensions",
        )


async def embeddings(request: Request) -> Response:
    """POST /v1/embeddings (OpenAI's): one mean-pooled vector per input, of length 1 unless
    ``normalize`` is false."""
    service = _service(request)

    async def run() -> dict:
        data = await read_json(request, service.config.limits)
        model, batcher = service.chosen(data)
        encoding = choice(data, "encoding_format", ENCODINGS, "float")
        layers = choice(data, "layers", POOLED_LAYERS, "average")
        normalize = data.get("normalize", True)
        if not isinstance(normalize, bool):
            raise ApiError(400, f"'normalize' must be true or false, got {kind_of(normalize)}", "normalize")
        _dimensions(data, model)
        sentences = service.inputs.sentences(data.get("input"), "input", service.truncate(data))
        arrays = await batcher.embed(sentences, request)
        n = sum(len(s) for s in sentences)
        pooled = [output_array(a, layers, "mean") for a in arrays]
        return {
            "object": "list",
            "data": [
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": encode(_unit(v) if normalize else v, encoding),
                }
                for i, v in enumerate(pooled)
            ],
            "model": model.name,
            "usage": {"prompt_tokens": n, "total_tokens": n},
        }

    return await _answer(run)


async def embed(request: Request) -> Response:
    """POST /embed: every token's vectors, of all layers or one."""
    service = _service(request)
    limits = service.config.limits

    async def run() -> dict:
        data = await read_json(request, limits)
        model, batcher = service.chosen(data)
        layers = choice(data, "layers", ("all", "top", "average"), "all")
        encoding = choice(data, "encoding_format", ENCODINGS, "float")
        sentences = service.inputs.sentences(data.get("sentences"), "sentences", service.truncate(data))
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
            selected = select_layers(array, layers)
            results.append(
                {"tokens": tokens, "shape": list(selected.shape), "embedding": encode(selected, encoding)}
            )
        return {"model": model.name, "layers": layers, "results": results}

    return await _answer(run, in_thread=True)


async def score(request: Request) -> Response:
    """POST /score: each sentence's log-probability and perplexity (full softmax)."""
    service = _service(request)

    async def run() -> dict:
        from ..lm.scoring import score_sentences

        data = await read_json(request, service.config.limits)
        model, batcher = service.chosen(data, scoring=True)
        per_token = flag(data, "per_token")
        sentences = service.inputs.sentences(data.get("sentences"), "sentences")

        def compute() -> list[dict]:
            scores = score_sentences(model.language_model, sentences)
            return [{"sentence": s.tokens, **s.to_dict(per_token, digits=6)} for s in scores]

        return {"model": model.name, "results": await batcher.call(compute, request)}

    return await _answer(run)


async def substitutes(request: Request) -> Response:
    """POST /substitutes: the words the model predicts at a position."""
    service = _service(request)

    async def run() -> dict:
        from ..lm.scoring import substitutes as predict

        data = await read_json(request, service.config.limits)
        model, batcher = service.chosen(data, scoring=True)
        tokens = service.inputs.sentence(data.get("sentence"), "sentence")
        position = integer(data, "position", None, 0, len(tokens) - 1)
        k = integer(data, "k", 10, 1, MAX_K)
        found = await batcher.call(lambda: predict(model.language_model, tokens, position, k=k), request)
        return {"model": model.name, **found.to_dict()}

    return await _answer(run)


async def list_models(request: Request) -> Response:
    """GET /v1/models (OpenAI's): the models served."""
    service = _service(request)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": m.name,
                    "object": "model",
                    "created": service.created,
                    "owned_by": "elmokit",
                    "dim": m.dim,
                    "layers": m.num_layers,
                    "softmax": m.language_model is not None,
                }
                for m in service.models
            ],
        }
    )


async def health(request: Request) -> Response:
    """GET /health: the process answers (no API key needed)."""
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    """GET /ready: 200 once the models' batchers run, 503 while loading or stopping."""
    service = _service(request)
    if not service.ready:
        return error_response(
            503, "not ready: the models are loading or the server is stopping", headers=RETRY
        )
    return JSONResponse({"status": "ready", "models": list(service.by_name)})


async def prometheus(request: Request) -> Response:
    """GET /metrics: the Prometheus metrics."""
    registry = _service(request).metrics.registry
    return Response(prom.generate_latest(registry), media_type=prom.CONTENT_TYPE_LATEST)


async def info(request: Request) -> Response:
    """GET /info: the version, the models (dimensions, layers, softmax) and the limits."""
    return JSONResponse(_service(request).info())


async def tokenize(request: Request) -> Response:
    """POST /tokenize: the tokens each input becomes, as the embedding endpoints split and check it."""
    service = _service(request)

    async def run() -> dict:
        data = await read_json(request, service.config.limits)
        model, _ = service.chosen(data)
        sentences = service.inputs.sentences(data.get("input"), "input", service.truncate(data))
        return {"model": model.name, "tokens": sentences, "count": [len(s) for s in sentences]}

    return await _answer(run)


async def openapi(request: Request) -> Response:
    """GET /openapi.json: the API's OpenAPI schema (docs/openapi.json)."""
    from .openapi import schema

    return JSONResponse(schema())


async def _http_error(request: Request, err: Exception) -> Response:
    assert isinstance(err, StarletteHTTPException)
    return error_response(
        err.status_code, f"{request.method} {request.url.path}: {err.detail}", headers=err.headers
    )


async def _server_error(request: Request, err: Exception) -> Response:
    # outside the guard (Starlette's outermost layer): the request id is read from its state
    request_id = getattr(request.state, "request_id", None)
    log.error("internal error on %s (request %s)", request.url.path, request_id, exc_info=err)
    token = REQUEST_ID.set(request_id)
    try:
        return error_response(
            500,
            "internal error; the server log has its details",
            headers={"x-request-id": request_id} if request_id else None,
        )
    finally:
        REQUEST_ID.reset(token)


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette):
    """The models' batchers run from the app's start to its stop; /ready says so."""
    service: _Service = app.state.service
    batchers = service.batchers = {
        m.name: Batcher(m, service.config, service.metrics) for m in service.models
    }
    for batcher in batchers.values():
        batcher.start()
    service.ready = True
    log.info("ready: %s", ", ".join(service.by_name))
    try:
        yield
    finally:
        service.ready = False
        for batcher in batchers.values():
            await batcher.stop()


# Starlette itself, not FastAPI: each handler reads its own request, and FastAPI's layers
# (dependency solving, its telemetry and body-limit middleware) took more than a third of the
# event loop's time per request (0.65 ms against 0.39 without dependency solving, measured)
_ROUTES = [
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/embed", embed, methods=["POST"]),
    Route("/score", score, methods=["POST"]),
    Route("/substitutes", substitutes, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/metrics", prometheus, methods=["GET"]),
    Route("/info", info, methods=["GET"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/openapi.json", openapi, methods=["GET"]),
]


def create_app(models: list[ServedModel], config: ServeConfig, api_key: str | None = None) -> Starlette:
    """The ASGI app serving ``models`` (loaded and warmed up). ``api_key``: required as
    ``Authorization: Bearer`` on every endpoint but /health."""
    if not models:
        raise ValueError("no model to serve")
    service = _Service(models, config, Metrics())
    app = Starlette(
        routes=_ROUTES,
        middleware=[Middleware(_Guard, api_key=api_key, metrics=service.metrics, limits=config.limits)],
        exception_handlers={StarletteHTTPException: _http_error, Exception: _server_error},
        lifespan=_lifespan,
    )
    app.state.service = service
    return app


def create_app_from_env() -> Starlette:
    """The app of one ``--workers`` process: the configuration from ``ELMOKIT_SERVE_CONFIG``,
    the API key from ``ELMOKIT_API_KEY``; each process loads its own copy of the models. It
    leaves logging as it finds it (the command line's factory, ``elmokit.cli._serve_worker.serve_worker_app``,
    sets it up first)."""
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
    worker_factory: str = "elmokit.serve.app:create_app_from_env",
    http: str = "auto",
) -> None:
    """Load the models, listen on ``host:port`` (0: a free port, logged) and serve until
    SIGTERM or SIGINT, which stop accepting, answer the requests in flight (for at most
    ``drain_seconds``) and return. ``workers`` > 1: that many processes, each of which builds
    its app with ``worker_factory`` ("module:function", what uvicorn imports; the command line
    passes one that sets up logging in the new process first). ``http``: the HTTP parser, "auto"
    (httptools where installed, else h11), "httptools" or "h11", each within the request-head
    limits (``elmokit.serve.http``). While it serves, SIGINT and SIGTERM have its handlers (in the
    main thread, ``base.signals``); those it found are restored when it returns."""
    import socket

    import uvicorn

    from . import http as bounded

    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    check_models(config)  # a missing model: its error, not a worker process that dies again and again
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
    # bound now, so that a port in use is an error before the models load; uvicorn listens on it
    # once they are loaded and warmed up (until then a connection is refused, not left waiting)
    limits = config.limits
    head = bounded.HeadLimits(limits.max_header_bytes, limits.max_headers, config.header_timeout)
    options: dict[str, Any] = {
        "timeout_graceful_shutdown": drain_seconds,
        "log_level": "info",
        "access_log": False,
        "lifespan": "on",
        "http": bounded.protocol(http, head),
        "h11_max_incomplete_event_size": limits.max_header_bytes,  # under h11: its own stop too
    }
    bound = sock.getsockname()[1]
    _log_http_stack()
    log.info(
        "request heads: at most %d bytes and %d headers, within %g s",
        head.max_bytes,
        head.max_count,
        head.timeout,
    )
    stopped_by: list[int] = []
    # uvicorn handles SIGINT and SIGTERM while it serves (stop accepting, drain, shut down) and
    # then raises the signal again into the handlers it found: these note it, so that a drained
    # stop returns and the command exits 0 instead of dying by the signal (main thread only)
    with installed(dict.fromkeys(STOP_SIGNALS, noting(stopped_by))):
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
                    worker_factory,
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
    if stopped_by:
        log.info("stopped by %s after answering the requests in flight", signal.Signals(stopped_by[0]).name)


def _log_http_stack() -> None:
    """Say which event loop and HTTP parser uvicorn will use ("auto": uvloop and httptools when
    installed, as the serve extra does); warn when it falls back to asyncio or h11, which take
    more CPU per request, so that under load the batches stay smaller and throughput lower."""
    import importlib.util

    fallbacks = {"uvloop": "asyncio", "httptools": "h11"}
    missing = [name for name in fallbacks if importlib.util.find_spec(name) is None]
    if missing:
        log.warning(
            "%s not installed: uvicorn runs on %s, which is slower under load "
            "(pip install 'elmokit[serve]' brings uvloop and httptools)",
            " and ".join(missing),
            " and ".join(fallbacks[name] for name in missing),
        )
    else:
        log.info("HTTP: uvloop and httptools")
