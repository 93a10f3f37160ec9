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

from ..base._console import CommandParser, command_context
from ..hub import DEFAULT_MODEL
from .models import ELMO_SITES, ELMO_WEIGHTINGS, ModelConfig
from .train import TASKS, TaskConfig, run_task

__all__: list[str] = []


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], e.g. 0.01, 0.1 or 1; got {text}")
    return value


def add_task_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``task`` subcommand on an argparse subparsers object (sets ``func``)."""
    p = subparsers.add_parser(
        "task", help="train and score a downstream model (NER, POS, sentiment) with or without ELMo"
    )
    add_task_arguments(p)
    return p


def add_task_arguments(p: argparse.ArgumentParser) -> None:
    """The ``task`` subcommand's description and arguments on its parser ``p`` (sets ``func``)."""
    defaults, model = TaskConfig("ner", "", "", "", ""), ModelConfig()
    p.description = (
        "Train a BiLSTM-CRF tagger (ner: CoNLL-2003 IOB1, scored by conlleval entity F1; pos: "
        "CoNLL-U UPOS, accuracy) or a BiLSTM classifier (sentiment: SST trees, accuracy). ELMo "
        "is added through a learned scalar mix of the frozen biLM's layers, which are computed "
        "once per data set and cached on disk (--fine-tune-elmo trains the biLM too). Writes "
        "metrics.json, the model (model.safetensors + model.json) and the dev/test predictions."
    )
    p.add_argument("task", choices=TASKS, help="the task: " + ", ".join(TASKS))
    p.add_argument("--train", required=True, help="training file")
    p.add_argument("--dev", required=True, help="development file (early stopping)")
    p.add_argument("--test", required=True, help="test file")
    p.add_argument("--out", required=True, help="output folder")
    elmo = p.add_mutually_exclusive_group()
    elmo.add_argument(
        "--elmo",
        default=DEFAULT_MODEL,
        metavar="MODEL",
        help="a model in any form elmokit takes: a shipped or known name, a model folder, a .zip "
        f"archive, a URL or hf://owner/name (default {DEFAULT_MODEL}; not ELMoForManyLangs)",
    )
    elmo.add_argument("--no-elmo", action="store_true", help="the baseline: no ELMo")
    p.add_argument(
        "--fine-tune-elmo", action="store_true", help="train the biLM too (runs it every step; slow)"
    )
    p.add_argument(
        "--train-fraction", type=_fraction, default=1.0, help="use this share of the training sentences"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="random seed: initial weights, batches, --train-fraction's share"
    )
    p.add_argument(
        "--epochs", type=int, help="at most this many epochs (default: rounds and patience decide)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=defaults.rounds,
        help=f"at most this many rounds; a round is the fewest whole epochs with at least "
        f"{defaults.round_updates} updates (--round-updates), and dev is scored after each",
    )
    p.add_argument(
        "--round-updates", type=int, default=defaults.round_updates, help="the fewest updates in a round"
    )
    p.add_argument(
        "--patience",
        type=int,
        default=defaults.patience,
        help="stop after this many rounds without a dev gain",
    )
    p.add_argument("--binary", action="store_true", help="sentiment: SST-2 (drop neutral, negative/positive)")
    p.add_argument("--batch-size", type=int, default=defaults.batch_size, help="sentences per update")
    p.add_argument("--lr", type=float, default=defaults.lr, help="learning rate (Adam)")
    p.add_argument(
        "--elmo-lr", type=float, help="with --fine-tune-elmo: the biLM's learning rate (default: --lr)"
    )
    _add_model_arguments(p.add_argument_group("the task model"), model)
    _add_cache_arguments(p.add_argument_group("the biLM's layers"), defaults)
    p.add_argument(
        "--threads",
        type=int,
        default=defaults.threads,
        help="torch CPU threads (default 1: these small models run fastest on one; 0 = torch's default)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--overwrite", action="store_true", help="replace the files of an earlier run in --out")
    p.set_defaults(func=task_command)


def _add_model_arguments(p: argparse._ArgumentGroup, model: ModelConfig) -> None:
    """The task model's arguments: its BiLSTM, token features, and how ELMo enters it."""
    p.add_argument("--hidden", type=int, default=model.hidden, help="BiLSTM cells per direction")
    p.add_argument(
        "--lstm-layers", type=int, default=model.lstm_layers, help="BiLSTM layers of the task model"
    )
    p.add_argument("--word-dim", type=int, default=model.word_dim, help="0: no word embeddings")
    p.add_argument("--char-filters", type=int, default=model.char_filters, help="0: no char CNN")
    p.add_argument("--dropout", type=float, default=model.dropout, help="dropout rate of the task model")
    p.add_argument(
        "--elmo-layer-norm", action="store_true", help="layer-normalise the biLM layers in the mix"
    )
    p.add_argument(
        "--elmo-at",
        choices=ELMO_SITES,
        default=model.elmo_at,
        help="where ELMo enters the task BiLSTM: its input (beside the token features), its output "
        "(beside its states, before the output layer) or both, each with its own layer weights "
        f"(default {model.elmo_at})",
    )
    p.add_argument(
        "--layers",
        choices=ELMO_WEIGHTINGS,
        default=model.elmo_weighting,
        help="how the biLM layers are weighted: mix (learned softmax weights and scale), average "
        f"(equal weights, learned scale) or top (the top layer alone) (default {model.elmo_weighting})",
    )
    p.add_argument(
        "--mix-l2",
        type=float,
        default=model.mix_l2,
        metavar="LAMBDA",
        help="with --layers mix: add LAMBDA * sum(s_j^2) of the raw layer weights to the loss; large "
        "values pull the mix to an average (the paper's lambda: 1 or 0.001) "
        f"(default {model.mix_l2:g})",
    )


def _add_cache_arguments(p: argparse._ArgumentGroup, defaults: TaskConfig) -> None:
    """How the frozen biLM's layers are computed and cached."""
    p.add_argument(
        "--cache-dir", help="where the biLM layers are cached (default ~/.cache/elmokit/task-layers)"
    )
    p.add_argument(
        "--elmo-batch-size",
        type=int,
        default=defaults.elmo_batch_size,
        help="sentences per batch when the biLM's layers are computed for the cache",
    )
    p.add_argument(
        "--elmo-dtype",
        choices=["float32", "int8"],
        default=defaults.elmo_dtype,
        help="the frozen biLM's features: float32 (default) or int8 matmuls (approximate; "
        "docs/export.md); cached under their own key",
    )


def config_from_args(args: argparse.Namespace) -> TaskConfig:
    model = ModelConfig(
        word_dim=args.word_dim,
        char_filters=args.char_filters,
        hidden=args.hidden,
        lstm_layers=args.lstm_layers,
        dropout=args.dropout,
        elmo_layer_norm=args.elmo_layer_norm,
        elmo_at=args.elmo_at,
        elmo_weighting=args.layers,
        mix_l2=args.mix_l2,
    )
    return TaskConfig(
        task=args.task,
        train=args.train,
        dev=args.dev,
        test=args.test,
        out=args.out,
        elmo=None if args.no_elmo else args.elmo,
        fine_tune_elmo=args.fine_tune_elmo,
        train_fraction=args.train_fraction,
        seed=args.seed,
        epochs=args.epochs,
        rounds=args.rounds,
        round_updates=args.round_updates,
        patience=args.patience,
        batch_size=args.batch_size,
        lr=args.lr,
        elmo_lr=args.elmo_lr,
        binary=args.binary,
        model=model,
        cache_dir=args.cache_dir,
        elmo_batch_size=args.elmo_batch_size,
        elmo_dtype=args.elmo_dtype,
        threads=args.threads,
        progress=not args.quiet,
        overwrite=args.overwrite,
    )


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
            print(f"elmokit: error: {err}", file=sys.stderr)
            return 2
