"""``elmokit serve``: its options (those of ``ServeConfig`` and ``Limits`` from their fields)
and its handler."""

from __future__ import annotations

import argparse
import logging
import os

from ..base._arguments import add_options, option_values, ranged
from ._options import MODEL_HELP


def serve_command(args: argparse.Namespace) -> int:
    """Serve the models over HTTP until SIGTERM or SIGINT (elmokit.serve); exits 0 after a drain."""
    from ..serve import ServeConfig, serve
    from ..serve.config import API_KEY_ENV, Limits

    config = ServeConfig(
        models=tuple(args.model or ServeConfig.models),
        limits=Limits(**option_values(args, Limits)),
        **option_values(args, ServeConfig),
    )
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    server_log = logging.getLogger("elmokit.serve")  # a server's log is its output: INFO shown
    level = server_log.level
    server_log.setLevel(logging.INFO)
    try:
        serve(
            config,
            args.host,
            args.port,
            api_key,
            workers=args.workers,
            drain_seconds=args.drain_seconds,
            # sets up logging in each worker, with -v as in this process
            worker_factory=(
                "elmokit.cli._serve_worker:serve_worker_app_verbose"
                if args.verbose
                else "elmokit.cli._serve_worker:serve_worker_app"
            ),
        )
    finally:
        server_log.setLevel(level)
    return 0


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    """`elmokit serve`'s description and options; those of ``ServeConfig`` and ``Limits`` from
    their fields (``base._arguments``)."""
    p.description = (
        "Serve models over HTTP, batching concurrent requests (warm mode: a sentence's "
        "vectors do not depend on its batch). Endpoints: POST /v1/embeddings, /embed, /score, "
        "/substitutes, /tokenize; GET /v1/models, /info, /health, /ready, /metrics, /openapi.json. "
        "Requests can name only the models loaded here. SIGTERM stops accepting, answers the "
        "requests in flight and exits 0."
    )
    from dataclasses import fields

    from ..serve import ServeConfig  # without the serve extra, an ImportError (_DeferredParser)
    from ..serve.config import Limits

    p.add_argument(
        "--model",
        action="append",
        metavar="[NAME=]SPEC",
        help=f"a model to serve (repeat for several): {MODEL_HELP}; NAME= sets the name requests "
        f"use (default: the model's name, or the folder's). Default {', '.join(ServeConfig.models)}",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=ranged(int, low=0), default=8000, help="default 8000; 0 picks a free port")
    add_options(p, ServeConfig, ["device"])
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every endpoint but /health (better: "
        "set ELMOKIT_API_KEY, which ps does not show)",
    )
    add_options(p, ServeConfig, ["max_batch_tokens", "max_wait_ms"])
    add_options(p, Limits, ["max_queue"])
    add_options(p, Limits, [f.name for f in fields(Limits) if f.name != "max_queue"])
    add_options(p, ServeConfig, ["header_timeout", "truncate", "tokenize", "threads"])
    p.add_argument(
        "--workers", type=ranged(int, low=1), default=1, help="processes, each with its own models"
    )
    p.add_argument(
        "--drain-seconds",
        type=ranged(float, low=0),
        default=30.0,
        help="on SIGTERM, wait this long for requests in flight",
    )
    p.set_defaults(func=serve_command)
