"""`elmokit task ner|pos|sentiment ...`: train and score a downstream model, with or without ELMo.

Wire it into a parser with ``add_task_parser(subparsers)``; the handler is ``task_command``.
``python -m elmokit.tasks ner --train ...`` runs the same command on its own.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from ..base._arguments import add_options, option_values
from ..base._console import CommandParser, command_context, error_text
from .models import ModelConfig
from .train import TaskConfig, run_task

__all__: list[str] = []


# The order of the options in the help (the fields' own order is the stored configuration's).
_MODEL_OPTIONS = [
    "hidden",
    "lstm_layers",
    "word_dim",
    "char_filters",
    "dropout",
    "elmo_layer_norm",
    "elmo_at",
    "elmo_weighting",
    "mix_l2",
]
_CACHE_OPTIONS = ["cache_dir", "elmo_batch_size", "elmo_dtype"]


def add_task_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``task`` subcommand on an argparse subparsers object (sets ``func``)."""
    p = subparsers.add_parser(
        "task", help="train and score a downstream model (NER, POS, sentiment) with or without ELMo"
    )
    add_task_arguments(p)
    return p


def add_task_arguments(p: argparse.ArgumentParser) -> None:
    """The ``task`` subcommand's description and arguments on its parser ``p`` (sets ``func``):
    the options of ``TaskConfig`` and of its ``ModelConfig``, from their fields
    (``base._arguments``), and ``--no-elmo``."""
    p.description = (
        "Train a BiLSTM-CRF tagger (ner: CoNLL-2003 IOB1, scored by conlleval entity F1; pos: "
        "CoNLL-U UPOS, accuracy) or a BiLSTM classifier (sentiment: SST trees, accuracy). ELMo "
        "is added through a learned scalar mix of the frozen biLM's layers, which are computed "
        "once per data set and cached on disk (--fine-tune-elmo trains the biLM too). Writes "
        "metrics.json, the model (model.safetensors + model.json) and the dev/test predictions."
    )
    add_options(p, TaskConfig, ["task", "train", "dev", "test", "out"])
    elmo = p.add_mutually_exclusive_group()
    add_options(elmo, TaskConfig, ["elmo"])
    elmo.add_argument("--no-elmo", action="store_true", help="the baseline: no ELMo")
    add_options(
        p,
        TaskConfig,
        ["fine_tune_elmo", "train_fraction", "seed", "epochs", "rounds", "round_updates", "patience"]
        + ["binary", "batch_size", "lr", "elmo_lr"],
    )
    add_options(p.add_argument_group("the task model"), ModelConfig, _MODEL_OPTIONS)
    add_options(p.add_argument_group("the biLM's layers"), TaskConfig, _CACHE_OPTIONS)
    add_options(p, TaskConfig, ["threads", "progress", "overwrite"])
    p.set_defaults(func=task_command)


def config_from_args(args: argparse.Namespace) -> TaskConfig:
    """The run's configuration from the parsed options (``--no-elmo``: ``elmo`` None)."""
    values = option_values(args, TaskConfig)
    if args.no_elmo:
        values["elmo"] = None
    return TaskConfig(**values, model=ModelConfig(**option_values(args, ModelConfig)))


def _command_line() -> str:
    """This process's command as ``elmokit task ...`` (also when run as python -m elmokit.tasks)."""
    args = sys.argv[1:]
    if Path(sys.argv[0]).name == "__main__.py" and args[:1] != ["task"]:
        args = ["task", *args]
    return shlex.join(["elmokit", *args])


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def task_command(args: argparse.Namespace) -> int:
    """Handler of ``elmokit task``: run it and print the metrics' summary line."""
    log = None if args.quiet else _progress  # progress lines on stderr (the library logs them at INFO)
    metrics = run_task(config_from_args(args), log, command=_command_line())
    print(
        f"{metrics['task']} {metrics['metric']}: dev {metrics['dev']:.2f} test {metrics['test']:.2f} "
        f"(elmo: {metrics['elmo'] or 'none'}, seed {metrics['seed']}, "
        f"train fraction {metrics['train_fraction']:g}, {metrics['cpu_seconds']:.0f} CPU s)"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m elmokit.tasks ner|pos|sentiment ...`` (the same options as ``elmokit task``)."""
    parser = CommandParser(prog="elmokit")
    sub = parser.add_subparsers(dest="command", required=True)
    add_task_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["task"]:
        argv = ["task", *argv]
    args = parser.parse_args(argv)
    with command_context():
        try:
            return args.func(args)
        except (OSError, ValueError, ImportError) as err:
            print(f"elmokit: error: {error_text(err)}", file=sys.stderr)
            return 2
