"""What `elmokit serve` is started with (``ServeConfig``, ``Limits``) and the models it loads
(``ServedModel``): loaded once, at start; requests can name nothing else."""

from __future__ import annotations

import json
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..base._arguments import Range, spec
from ..embed.embedder import Embedder
from ..hub import DEFAULT_MODEL, resolve_model
from ..lm.language_model import LanguageModel

__all__ = ["ServeConfig"]

log = logging.getLogger(__name__)

API_KEY_ENV = "ELMOKIT_API_KEY"
CONFIG_ENV = "ELMOKIT_SERVE_CONFIG"  # the configuration of `--workers` processes (JSON)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


# -- configuration ------------------------------------------------------------------------------
# Each field that `elmokit serve` offers carries its option's help and range (base._arguments).


def _limit(help: str) -> dict[str, Any]:
    """The metadata of a Limits field: its option's help, a positive integer."""
    return spec(help, kind=int, range=Range(1))


@dataclass(frozen=True)
class Limits:
    """What one request may ask and how many may wait; past them a request is refused (413 for
    its size, 503 with Retry-After when the queue is full)."""

    max_body_bytes: int = field(
        default=1 << 20,
        metadata=_limit("request body size in bytes (default: {default}, 1 MiB); past it 413"),
    )
    max_inputs: int = field(default=256, metadata=_limit("sentences per request (default {default})"))
    max_input_tokens: int = field(default=512, metadata=_limit("tokens per sentence (default {default})"))
    max_token_chars: int = field(  # the token cache keeps the tokens it has seen
        default=100, metadata=_limit("characters per token (default {default})")
    )
    max_request_tokens: int = field(  # all sentences together
        default=16384, metadata=_limit("tokens per request (default {default})")
    )
    max_queue: int = field(  # requests waiting for a model's worker
        default=1024, metadata=_limit("requests waiting per model (default {default}); past it 503")
    )
    max_response_values: int = field(  # 16 MB as float32
        default=4_000_000,
        metadata=_limit("/embed: numbers in one answer (tokens x layers x dim; default {default:,})"),
    )
    max_header_bytes: int = field(  # a request's line and headers together
        default=32 * 1024,
        metadata=_limit("a request's line and headers, in bytes (default {default}); past it 431"),
    )
    max_headers: int = field(
        default=100, metadata=_limit("headers per request (default {default}); past it 431")
    )

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``elmokit serve`` is started with, except the API key (kept out of the
    environment copy that ``--workers`` processes read: they take it from ``ELMOKIT_API_KEY``)."""

    models: tuple[str, ...] = (DEFAULT_MODEL,)
    device: str | None = field(default=None, metadata=spec("cpu, cuda or cuda:N (default: cuda if present)"))
    max_batch_tokens: int = field(
        default=4096, metadata=spec("tokens per batch (default {default})", kind=int, range=Range(1))
    )
    max_wait_ms: float = field(
        default=5.0,
        metadata=spec("longest wait for a batch to fill (default {default:g})", kind=float, range=Range(0)),
    )
    tokenize: bool = field(
        default=False,
        metadata=spec("tokenize text inputs as the training corpus was (default: split on spaces)"),
    )
    threads: int | None = field(
        default=None, metadata=spec("torch threads per process", kind=int, range=Range(1))
    )
    limits: Limits = field(default_factory=Limits)
    header_timeout: float = field(
        default=5.0,
        metadata=spec(
            "seconds a request's headers may take to arrive (default {default:g}); past it 408",
            kind=float,
            range=Range(0),
        ),
    )
    truncate: bool = field(
        default=False,
        metadata=spec("cut long inputs to the limits instead of a 413 (a request's 'truncate' overrides it)"),
    )

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("give at least one --model")
        if self.max_batch_tokens < 1:
            raise ValueError(f"--max-batch-tokens must be at least 1, got {self.max_batch_tokens}")
        if not 0 <= self.max_wait_ms <= 10_000:
            raise ValueError(f"--max-wait-ms must be between 0 and 10000, got {self.max_wait_ms}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {self.threads}")
        if not 0 < self.header_timeout <= 3600:
            raise ValueError(f"--header-timeout must be above 0 and at most 3600, got {self.header_timeout}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServeConfig:
        data = json.loads(text)
        return cls(**{**data, "models": tuple(data["models"]), "limits": Limits(**data["limits"])})


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
def _model_thread(name: str) -> ThreadPoolExecutor:
    """The one thread that loads a served model and runs all its work. torch's OpenMP threads
    are a team per calling thread: a model loaded on one thread and run on another leaves two
    teams on the cores, and with as many torch threads as cores the model then ran at about
    3/4 of its speed (1.5 cores busy of 2). Loading it on the thread that runs it keeps one."""
    return ThreadPoolExecutor(1, thread_name_prefix=f"elmokit-model-{name}")


@dataclass(eq=False)
class ServedModel:
    """A model loaded at start: its ``Embedder`` (warm mode) and, when it has a softmax, the
    language model (with its vocabulary) that /score and /substitutes use (sharing the
    Embedder's biLM); ``runner``, the thread its batches run on (``_model_thread``: the one it
    was loaded on, for ``load_model``'s models)."""

    name: str
    embedder: Embedder
    language_model: Any = None
    runner: ThreadPoolExecutor = field(default_factory=lambda: _model_thread("model"))

    @property
    def dim(self) -> int:
        return self.embedder.dim

    @property
    def num_layers(self) -> int:
        return self.embedder.bilm.num_layers

    def embed(self, sentences: list[list[str]]) -> list[np.ndarray]:
        """(num_layers, n_tokens, dim) per sentence, in order, batched by length."""
        return list(self.embedder.embed_sentences(sentences))


def load_model(
    spec: str, device: str | None, max_batch_tokens: int, threads: int | None = None
) -> ServedModel:
    """Load a ``--model`` (see ``model_name``) with its softmax where it has one, and warm it
    up with one sentence, on the model's own thread (``_model_thread``), with ``threads`` torch
    threads when given."""
    name, source = model_name(spec)
    runner = _model_thread(name)
    try:
        return runner.submit(_load, name, source, device, max_batch_tokens, threads, runner).result()
    except BaseException:
        runner.shutdown(wait=False)
        raise


def _load(
    name: str,
    source: str,
    device: str | None,
    max_batch_tokens: int,
    threads: int | None,
    runner: ThreadPoolExecutor,
) -> ServedModel:
    """``load_model``'s work, on ``runner``'s thread."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    language_model = None
    try:
        language_model = LanguageModel.from_pretrained(source, device=device)
    except FileNotFoundError:  # no softmax (or not a language model folder): embeddings only
        pass
    bilm = language_model.bilm if language_model is not None else source
    embedder = Embedder(bilm, batch_size=1024, device=device, max_tokens_per_batch=max_batch_tokens)
    served = ServedModel(name, embedder, language_model, runner)
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


def _served_names(config: ServeConfig) -> list[tuple[str, str]]:
    """(name served, spec loaded) of each model of ``config``; two with one name are a ValueError."""
    named = [model_name(spec) for spec in config.models]
    names = [name for name, _ in named]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two --model share the name {twice[0]}; name them with NAME=SPEC")
    return named


def check_models(config: ServeConfig) -> None:
    """Raise the one-line error of a model of ``config`` that cannot be served (two with one
    name, a spec that names no model: ``hub.resolve_model``, which downloads what is not
    cached), before a socket is bound or a worker process started."""
    for _, source in _served_names(config):
        resolve_model(source)


def load_models(config: ServeConfig) -> list[ServedModel]:
    """Every model of ``config``, loaded and warmed up (each on its own thread, with
    ``config.threads`` torch threads); two with one name are a ValueError."""
    _served_names(config)
    return [
        load_model(spec, config.device, config.max_batch_tokens, config.threads) for spec in config.models
    ]
