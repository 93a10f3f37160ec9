"""`elmokit serve`: ELMo as an HTTP service that batches concurrent requests.

Endpoints: ``POST /v1/embeddings`` (OpenAI-compatible: one pooled vector per input), ``POST /embed``
(token-level vectors, the numbers of ``Embedder``), ``POST /score`` and ``POST /substitutes`` (the
language model, for models with a softmax), ``POST /tokenize``, ``GET /v1/models``, ``GET /info``,
``GET /health``, ``GET /ready``, ``GET /metrics`` (Prometheus text) and ``GET /openapi.json``.

Concurrent embedding requests of a model wait in one bounded queue; its worker takes what is
queued (up to ``max_batch_tokens`` tokens, waiting at most ``max_wait_ms`` for more) and embeds
it as one length-sorted batch. The models run in warm mode, where a sentence's vectors do not
depend on what it is batched with, so a request's answer is the one it would get alone.

Models are loaded once, at start; a request can only name one of them, never a path or a URL.
This package is a product layer over ``elmokit.embed`` and ``elmokit.lm.scoring``: only the CLI
imports it. It needs the ``serve`` extra (Starlette, uvicorn, prometheus-client).

Modules: ``config`` (what the server is started with, the models it loads), ``limits`` (reading
and checking requests, the JSON errors), ``batcher`` (the queue and worker of each model, the
metrics), ``app`` (the endpoints, the API key, running the server), ``http`` (uvicorn's HTTP
protocols within the limits on a request's head), ``openapi`` (the API's schema).
"""

from __future__ import annotations

try:
    import prometheus_client  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as _err:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"elmokit serve needs the serve extra ({_err}); install it with: pip install 'elmokit[serve]'"
    ) from None

from .app import create_app, serve
from .config import ServeConfig

__all__ = ["ServeConfig", "create_app", "serve"]
