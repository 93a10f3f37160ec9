"""The `elmokit` command line: the parser, ``main`` and ``run``. Each command's arguments and
handler are in the module of its idea: ``_demo``, ``_embed``, ``_lm``, ``_training``, ``_models``,
``_serve``, ``_probe`` (and ``data``), what several share in ``_options`` and ``_errors``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ..base._console import CommandParser, command_context, say
from ._demo import _add_demo_parser
from ._embed import _add_embed_parser, _add_tokens_parser
from ._errors import _fail, _reader_gone
from ._lm import _add_evaluate_parser, _add_score_parser, _add_start_state_parser, _add_substitutes_parser
from ._models import _add_convert_parser, _add_download_parser, _add_export_onnx_parser, _add_models_parser
from ._probe import _add_probe_parser
from ._serve import _serve_arguments
from ._training import _add_export_parser, _add_vocab_parser, _train_arguments

# torch and the model's modules are imported inside the commands, so that --help and argument
# errors answer at once

__all__ = ["main"]


class _Deferred:
    """An attribute of a ``_DeferredParser``: reading it adds the parser's arguments first."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = f"_deferred{name}"

    def __get__(self, parser: Any, owner: type | None = None) -> Any:
        if parser is None:
            return self
        parser.fill()
        return parser.__dict__[self.key]

    def __set__(self, parser: Any, value: Any) -> None:
        parser.__dict__[self.key] = value


class _DeferredParser(CommandParser):
    """A subcommand whose arguments are declared by a module that imports torch (``train``,
    ``serve``, ``task``, ``elmo``): they are added when the subcommand is used or its help is
    read, so that ``elmokit --help`` and the other commands do not wait for torch. A module that
    cannot be imported (``serve`` without its extra) leaves a command that takes any arguments
    and, run, says why in one line (the ImportError)."""

    _actions = _Deferred()
    _option_string_actions = _Deferred()
    _mutually_exclusive_groups = _Deferred()
    _defaults = _Deferred()
    description = _Deferred()

    def defer(self, fill: Callable[[argparse.ArgumentParser], None]) -> None:
        self.__dict__["_fill"] = fill

    def fill(self) -> None:
        fill = self.__dict__.pop("_fill", None)
        if fill is not None:
            try:
                fill(self)
            except ImportError as err:
                self.__dict__["_missing"] = err
                self.set_defaults(func=self._say_missing)

    def _say_missing(self, args: argparse.Namespace) -> int:
        raise self.__dict__["_missing"]

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        missing = self.__dict__.get("_missing")
        if missing is not None:  # its options are unknown: what is missing is the error
            self.exit(2, f"elmokit: error: {missing}\n")
        super().unrecognized(extras)


def _deferred_command(
    sub: Any, name: str, fill: Callable[[argparse.ArgumentParser], None], **kwargs: Any
) -> argparse.ArgumentParser:
    """Subcommand ``name`` of ``sub``, its arguments added by ``fill(parser)`` on first use."""
    kind, sub._parser_class = sub._parser_class, _DeferredParser
    try:
        parser = sub.add_parser(name, **kwargs)
    finally:
        sub._parser_class = kind
    parser.defer(fill)
    return parser


def _task_arguments(p: argparse.ArgumentParser) -> None:
    from ..tasks.cli import add_task_arguments

    add_task_arguments(p)


def _elmo_arguments(p: argparse.ArgumentParser) -> None:
    from ..compat.allennlp import add_elmo_arguments

    add_elmo_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="elmokit", description="ELMo: deep contextualized word representations.")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also show what the library logs (INFO lines)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo_parser(sub)
    _add_embed_parser(sub)
    _add_tokens_parser(sub)
    _add_start_state_parser(sub)
    _add_vocab_parser(sub)
    _deferred_command(sub, "train", _train_arguments, help="train a biLM with the original recipe")
    _add_evaluate_parser(sub)
    _add_export_parser(sub)
    _add_convert_parser(sub)
    _add_export_onnx_parser(sub)
    _add_score_parser(sub)
    _add_substitutes_parser(sub)
    _add_models_parser(sub)
    _add_download_parser(sub)
    _add_probe_parser(sub)
    _deferred_command(
        sub,
        "serve",
        _serve_arguments,
        help="serve models over HTTP: OpenAI-compatible /v1/embeddings, /embed, /score, /substitutes",
    )
    _deferred_command(  # elmokit task ner|pos|sentiment ...
        sub,
        "task",
        _task_arguments,
        help="train and score a downstream model (NER, POS, sentiment) with or without ELMo",
    )
    _deferred_command(  # elmokit elmo ...: `allennlp elmo`'s arguments, layout and numbers
        sub,
        "elmo",
        _elmo_arguments,
        help="allennlp elmo's command: stateful vectors of a file, in its HDF5 layout",
    )
    from .data import add_data_parser

    add_data_parser(sub)  # elmokit data list|sample|fetch: the probe and task data sets
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``elmokit`` command: ``main(["embed", "in.txt", "out.hdf5"])`` runs what
    ``elmokit embed in.txt out.hdf5`` runs (``argv`` None: ``sys.argv[1:]``) and returns its exit
    status. An error is one line on stderr, ``elmokit: error: ...``, never a traceback; a bad option
    and ``--help`` exit (``SystemExit``) as argparse does."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run a parsed command; every error is one line. Returns the exit status."""
    with warnings.catch_warnings(), command_context(verbose=getattr(args, "verbose", False)):
        warnings.showwarning = _show_warning
        try:
            status = args.func(args)
            sys.stdout.flush()  # a reader that stopped early (`| head`) is met here, not at exit
            return status
        except BrokenPipeError:
            return _reader_gone()
        except (OSError, ValueError, ImportError) as err:  # OSError: missing, unwritable, a folder...
            return _fail(err)
        except MemoryError:
            return _fail("out of memory: the model or a batch does not fit (try a smaller --batch-size)")
        except RuntimeError as err:  # torch's (out of memory on a device, ...) and elmokit's own checks
            logging.getLogger("elmokit").info("where the error was raised:", exc_info=True)
            return _fail(_first_line(err) + ("" if getattr(args, "verbose", False) else " (-v shows where)"))
        except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM during a write (atomic.Terminated)
            signum = getattr(err, "signum", signal.SIGINT)
            print(
                f"elmokit: error: interrupted by {signal.Signals(signum).name}; no partial output was left",
                file=sys.stderr,
            )
            return 128 + signum


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings in one line, as errors are."""
    say(f"elmokit: warning: {message}")


def _first_line(err: BaseException) -> str:
    """The first line of an error's message that says something (torch's run to many lines)."""
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
