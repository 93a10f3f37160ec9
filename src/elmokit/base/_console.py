"""What a command-line front end sets up around one command, and the library never does by itself:
the ``elmokit`` logger's one-line messages on stderr (each on its own line above a progress bar),
and signal handling for atomic writes (SIGTERM during a write raises, so no partial file is left:
``atomic.handle_signals``). ``CommandParser`` is the argument parser of the front ends: every
error in one line, a close match suggested for a mistyped option or command, defaults in --help.

Used by the front ends, ``elmokit.cli`` and ``python -m elmokit.tasks``, which both import it:
so it sits in the base layer, below both (the library itself never calls it). The app factory of
each process of ``elmokit serve --workers N`` is ``elmokit.cli._serve_worker``.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, NoReturn

from .atomic import handle_signals

__all__ = ["CommandParser", "command_context", "error_text", "say"]


def _close_match(word: str, choices: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(word, list(choices), n=1)
    return found[0] if found else None


class _DefaultsFormatter(argparse.HelpFormatter):
    """argparse's help with each option's default, "(default: X)", unless its help already
    speaks of the default or it has none worth saying (None, False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            default is None
            or default is False
            or default == argparse.SUPPRESS
            or not action.option_strings
            or "default" in text.lower()
        ):
            return text
        return f"{text} (default: %(default)s)"


class CommandParser(argparse.ArgumentParser):
    """argparse for the command line: every error (a missing or bad option, an unknown option or
    command) is one line, ``elmokit: error: ...; see 'PROG --help'``, naming the subcommand
    whose help to read and a close match of a mistyped name; --help shows the defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"elmokit: error: {message}; see '{self.prog} --help'\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            _command_parser(self, parsed).unrecognized(extras)
        return parsed

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        """The error for arguments this (sub)command does not take: the first unknown option,
        with its closest option if one is close."""
        options = [x for x in extras if x.startswith("-") and len(x) > 1]
        if not options:
            self.error(f"unrecognized argument{'s' if len(extras) > 1 else ''} {' '.join(extras)}")
        name = options[0].split("=", 1)[0]
        match = _close_match(name, (s for a in self._actions for s in a.option_strings))
        self.error(f"unrecognized argument {options[0]}" + (f" (did you mean {match}?)" if match else ""))

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(c) for c in choices]
        match = _close_match(str(value), names)
        maybe = f"did you mean {match}?" if match else ""
        if isinstance(action, argparse._SubParsersAction):
            raise argparse.ArgumentError(
                None, f"unrecognized command {value}" + (f" ({maybe})" if maybe else "")
            )
        listed = ", ".join(map(repr, choices))
        raise argparse.ArgumentError(
            action, f"invalid choice: {value!r} ({maybe + ' ' if maybe else ''}choose from {listed})"
        )


def _command_parser(parser: argparse.ArgumentParser, parsed: Any) -> CommandParser:
    """The (sub)command's parser that ``parsed`` came from: the deepest one chosen."""
    found = True
    while found:
        found = False
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(str(getattr(parsed, action.dest, "")))
                if chosen is not None:
                    parser, found = chosen, True
                    break
    return parser if isinstance(parser, CommandParser) else CommandParser(prog=parser.prog)


def say(line: str) -> None:
    """Write ``line`` to stderr on a line of its own, above a progress bar if one is shown."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is not None and getattr(tqdm.tqdm, "_instances", None):
        tqdm.tqdm.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr)


class _BarAwareHandler(logging.StreamHandler):
    """A stderr handler whose records go above a progress bar (``tqdm.write``) while one is
    shown, so that a warning never joins the bar's line."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm = sys.modules.get("tqdm")
        if tqdm is None or not getattr(tqdm.tqdm, "_instances", None):
            super().emit(record)
            return
        try:
            tqdm.tqdm.write(self.format(record), file=self.stream)
        except Exception:  # as StreamHandler does
            self.handleError(record)


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
    handler = _BarAwareHandler(sys.stderr)
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


def error_text(err: BaseException | str) -> str:
    """The error's message; an OSError that Python raised itself (``[Errno 2] No such file or
    directory: 'x'``) as ``x: no such file or directory``."""
    raw = isinstance(err, OSError) and str(err).startswith("[Errno")
    if raw and isinstance(err, OSError) and err.filename is not None and err.strerror:
        return f"{os.fsdecode(err.filename)}: {err.strerror[:1].lower()}{err.strerror[1:]}"
    return str(err)
