"""What a command-line front end sets up around one command, and the library never does by itself:
the ``elmokit`` logger's one-line messages on stderr, and signal handling for atomic writes
(SIGTERM during a write raises, so no partial file is left: ``atomic.handle_signals``).

Used by ``elmokit.cli`` and ``python -m elmokit.tasks``; ``serve_worker_app`` (with ``-v``:
``serve_worker_app_verbose``) is the app factory of each process of ``elmokit serve --workers N``,
which the command's own set-up does not reach.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from .atomic import handle_signals

__all__ = ["command_context", "serve_worker_app", "serve_worker_app_verbose"]


class _OneLine(logging.Formatter):
    """A log record as the command line's own lines: an INFO record as its message, a warning or
    an error as ``elmokit: warning|error: message`` (no traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            return f"elmokit: {'warning' if record.levelno < logging.ERROR else 'error'}: {message}"
        return message


def _stderr_handler() -> logging.Handler:
    """A handler that writes each record to stderr as one line (``_OneLine``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    return handler


@contextmanager
def _logging(verbose: bool) -> Iterator[None]:
    """While the block runs, the ``elmokit`` logger writes to stderr, one line per record:
    warnings and errors, and with ``verbose`` INFO too; before and after, it is as it was."""
    logger = logging.getLogger("elmokit")
    handler = _stderr_handler()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


@contextmanager
def command_context(verbose: bool = False) -> Iterator[None]:
    """Around one command: the ``elmokit`` logger on stderr (warnings and errors; ``verbose``:
    INFO too) and SIGTERM/SIGINT handled during atomic writes."""
    with ExitStack() as stack:
        stack.enter_context(_logging(verbose))
        stack.enter_context(handle_signals())
        yield


def serve_worker_app() -> Any:
    """uvicorn's app factory in each process of ``elmokit serve --workers N``: the ``elmokit``
    logger set as the command sets it (warnings and errors on stderr, and the server's own INFO
    lines), for the life of the process, then ``elmokit.serve.create_app_from_env()``."""
    return _serve_worker(verbose=False)


def serve_worker_app_verbose() -> Any:
    """``serve_worker_app`` of ``elmokit -v serve --workers N``: every INFO line of the
    library too, as ``-v`` shows them in the command's own process."""
    return _serve_worker(verbose=True)


def _serve_worker(verbose: bool) -> Any:
    from .serve import create_app_from_env

    logger = logging.getLogger("elmokit")
    logger.addHandler(_stderr_handler())
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False
    logging.getLogger("elmokit.serve").setLevel(logging.INFO)  # a server's log is its output
    return create_app_from_env()
