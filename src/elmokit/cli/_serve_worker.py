"""The app factory uvicorn calls in each process of ``elmokit serve --workers N``: the
``elmokit`` logger set as the command sets it (``elmokit.base._console``), which the command's
own set-up in its first process does not reach."""

from __future__ import annotations

import logging
from typing import Any

from ..base._console import _stderr_handler

__all__ = ["serve_worker_app", "serve_worker_app_verbose"]


def serve_worker_app() -> Any:
    """uvicorn's app factory in each process of ``elmokit serve --workers N``: the ``elmokit``
    logger set as the command sets it (warnings and errors on stderr, and the server's own INFO
    lines), for the life of the process, then ``elmokit.serve.app.create_app_from_env()``."""
    return _serve_worker(verbose=False)


def serve_worker_app_verbose() -> Any:
    """``serve_worker_app`` of ``elmokit -v serve --workers N``: every INFO line of the
    library too, as ``-v`` shows them in the command's own process."""
    return _serve_worker(verbose=True)


def _serve_worker(verbose: bool) -> Any:
    from ..serve.app import create_app_from_env

    logger = logging.getLogger("elmokit")
    logger.addHandler(_stderr_handler())
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False
    logging.getLogger("elmokit.serve").setLevel(logging.INFO)  # a server's log is its output
    return create_app_from_env()
