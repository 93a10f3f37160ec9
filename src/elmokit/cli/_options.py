"""What several commands share: the --model help, the model that --model (or --options and
--weights) names, the files of a model that no output may replace, and --checkpoint or --average,
which weights of a training save dir to use."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ..base._arguments import ranged
from ..hub import resolve_model

if TYPE_CHECKING:
    from ..model.bilm import BiLM

# the model's modules are imported inside the functions, so that --help and argument errors
# answer at once


MODEL_HELP = (
    "a shipped or known model's name (elmokit models), a model folder, a .zip archive, a URL or "
    "hf://owner/name[@revision]"
)


def _load_model(args: argparse.Namespace) -> BiLM:
    from ..model.bilm import BiLM

    if args.options or args.weights:
        if not (args.options and args.weights):
            raise SystemExit("elmokit: give both --options and --weights (or --model DIR)")
        return BiLM.load(*resolve_model(args.options, args.weights).files())  # each a path or a URL
    return BiLM.from_pretrained(args.model)  # a name, folder, .zip archive, URL or hf://


def _model_files(model_dir: str) -> list[Path]:
    """The files of a model folder or training save dir that a command reads (weights,
    checkpoints, vocabulary, options and run configuration; not the files a run writes, such
    as metrics or an earlier --json): inputs that no output may replace."""
    from ..lm.checkpoints import BEST_POINTER, CHECKPOINT_POINTER, CONFIG_FILE

    folder = Path(model_dir)
    if not folder.is_dir():
        return []
    names = {"options.json", CONFIG_FILE, BEST_POINTER, CHECKPOINT_POINTER}
    return [
        path
        for path in folder.rglob("*")
        if path.is_file() and (path.suffix in (".pt", ".hdf5", ".txt") or path.name in names)
    ]


def _model_inputs(spec: str) -> list[Path]:
    """Every file of the model ``spec`` names, as the command will read it: a folder's model
    files (a training save dir's checkpoints too) and what the resolver finds (a name's, an
    archive's and the archive itself, an ELMoForManyLangs folder's): inputs that no output may
    replace, checked before the work."""
    files = _model_files(spec)
    try:
        files += resolve_model(spec).input_files()
    except (OSError, ValueError):
        if not files:  # not a model: loading it says why
            raise
    return files


def _checkpoint_choice(value: str) -> str:
    """An argparse type: latest, best, or a checkpoint folder's name (checkpoint-<9 digits>)."""
    from ..lm.checkpoints import CHECKPOINT_NAME

    if value in ("latest", "best") or CHECKPOINT_NAME.fullmatch(value):
        return value
    raise argparse.ArgumentTypeError(
        f"expected latest, best or a checkpoint folder's name (checkpoint-<9 digits>), got {value!r}"
    )


def _add_checkpoint_choice(p: argparse.ArgumentParser) -> None:
    """--checkpoint latest|best and --average N: which weights of a training save dir to use."""
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--checkpoint",
        type=_checkpoint_choice,
        default="latest",
        metavar="latest|best|checkpoint-<step>",
        help="of a training save dir: the latest, the one with the lowest held-out perplexity, or "
        "one of its checkpoint folders by name",
    )
    which.add_argument(
        "--average",
        type=ranged(int, low=1),
        metavar="N",
        help="of a training save dir: the mean of the weights of its newest N checkpoints "
        "(a run trained with --keep-checkpoints N or more)",
    )
