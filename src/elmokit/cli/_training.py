"""Training a biLM from the command line: ``vocab``, ``train`` (its options from the training
configuration's fields) and ``export`` (a save dir written as a model folder)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from ..base._arguments import add_options, option_values, ranged
from ._errors import _fail
from ._options import _add_checkpoint_choice, _model_files


def _read_config(value: str) -> dict:
    from ..model.options import PRESETS, preset, read_json

    if value in PRESETS:
        return preset(value)
    path = Path(value)
    if not path.is_file():
        raise FileNotFoundError(f"--config {value!r} is neither a preset ({', '.join(PRESETS)}) nor a file")
    return read_json(path)


def vocab(args: argparse.Namespace) -> int:
    """Build a frequency-sorted vocabulary file from corpus files."""
    from ..base.atomic import check_output
    from ..lm.vocabulary import Vocabulary
    from ..training.data import corpus_files, count_tokens

    files = [f for pattern in args.corpus for f in corpus_files(pattern)]
    check_output(args.output, args.overwrite, files)  # before the work, not after it
    counts = count_tokens(files)
    if not counts:
        raise ValueError(f"empty corpus: {' '.join(args.corpus)} holds no tokens")
    built = Vocabulary.build(counts, min_count=args.min_count, max_size=args.max_size)
    built.save(args.output, overwrite=args.overwrite)
    total = sum(counts.values())
    print(
        f"{len(files)} files, {total:,} tokens, {len(counts):,} distinct; vocabulary of "
        f"{len(built):,} (with <S>, </S>, <UNK>) written to {args.output}; it covers "
        f"{built.coverage(counts):.2%} of the corpus tokens"
    )
    return 0


def _add_vocab_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit vocab`'s parser."""
    p = sub.add_parser("vocab", help="build a frequency-sorted vocabulary from corpus files")
    p.add_argument("corpus", nargs="+", help="corpus files or globs (one sentence per line)")
    p.add_argument("-o", "--output", required=True, help="vocabulary file to write")
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    p.add_argument(
        "--min-count", type=ranged(int, low=1), default=1, help="leave out tokens seen fewer times"
    )
    p.add_argument("--max-size", type=ranged(int, low=3), default=None, help="including <S>, </S>, <UNK>")
    p.set_defaults(func=vocab)


def _train_arguments(p: argparse.ArgumentParser) -> None:
    """``elmokit train``'s description and options (from the training configuration's fields)."""
    from ..training.config import RESUMABLE, option_name

    p.description = (
        "Train a biLM. With --resume, the run in --save-dir continues with its own "
        f"configuration; only {', '.join(option_name(n) for n in RESUMABLE)} may change (other "
        "options, if given, must equal the run's; --gpus or --nproc are given again, for as many "
        "processes). Exit status: 0 when a limit ended the run, 128 + N when signal N stopped it "
        "early (it can be resumed), 2 on an error."
    )
    _add_train_options(p)
    p.add_argument(
        "--nproc",
        type=ranged(int, low=1),
        default=1,
        help="start this many CPU processes (gloo DDP)",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --save-dir")
    p.add_argument(
        "--resume-from",
        metavar="CHECKPOINT",
        help="continue the run in --save-dir from this checkpoint folder of it (e.g. "
        "checkpoint-000000117) instead of the one its 'latest' names; implies --resume",
    )
    p.add_argument(
        "--new-data",
        action="store_true",
        help="with --resume and a new --train: continue weights, optimizer and step on other text, "
        "read from its beginning (without it a resumed run must keep its shards)",
    )
    p.set_defaults(func=train_command, parser=p)


def _add_train_options(p: argparse.ArgumentParser) -> None:
    """`elmokit train`'s options for the TrainConfig fields, generated from the fields: each
    field's help, kind, range and choices (``base._arguments.OptionSpec``), and its default. Each
    option's argparse default is None: not given (the configuration's default, or the resumed
    run's value)."""
    from ..training.config import TrainConfig, check_option

    add_options(p, TrainConfig, defaults=False, check=check_option)


def train_command(args: argparse.Namespace) -> int:
    """Train a biLM (or resume, or fine-tune from --init-from). Exits 0 when the run reached its
    limit, 128 + the signal's number when SIGINT/SIGTERM stopped it early."""
    from ..base.devices import this_process
    from ..lm.checkpoints import CONFIG_FILE
    from ..training.config import TrainConfig, TrainingError, config_from_options, resume_config
    from ..training.launch import launch

    given = option_values(args, TrainConfig)
    resume = args.resume or args.resume_from is not None  # from a named checkpoint is resuming
    again = _resume_command(args)
    try:
        if resume:  # only what is given changes (and only what a resumed run may change)
            given["options"] = _read_config(args.options) if args.options else {}
            config = resume_config(args.save_dir, given)
        else:
            if args.train is None or args.vocab is None:
                args.parser.error("--train and --vocab are required (unless --resume)")
            given["options"] = _read_config(args.options or "small") if not args.init_from else {}
            config = config_from_options(given)
        outcome = launch(
            config, resume=resume, processes=args.nproc, new_data=args.new_data, resume_from=args.resume_from
        )
    except (TrainingError, OSError) as err:
        return _fail(err)
    except KeyboardInterrupt as err:  # a second signal (Interrupted), or one before training
        signum = getattr(err, "signum", signal.SIGINT)
        begun = (Path(args.save_dir) / CONFIG_FILE).is_file()
        print(
            f"elmokit: stopped at once by {signal.Signals(signum).name}; "
            + (
                f"the steps since the last checkpoint are lost. Resume with: {again}"
                if begun
                else "the run had not begun"
            ),
            file=sys.stderr,
        )
        return 128 + signum
    main_process = this_process().is_main  # say it once under torchrun
    if not outcome.finished:
        if main_process:
            print(
                f"elmokit: stopped early by {outcome.ended_by} at step {outcome.run.step:,}: the run "
                f"is not finished (its checkpoint is in {args.save_dir}). Resume with: {again}",
                file=sys.stderr,
            )
        return 128 + (outcome.signal or 0)
    if main_process:
        print(
            f"finished at step {outcome.run.step:,}: reached {outcome.ended_by}. Checkpoint and "
            f"metrics.csv in {args.save_dir}; export with: elmokit export {args.save_dir} OUT_DIR"
        )
    return 0


def _resume_command(args: argparse.Namespace) -> str:
    """The command that resumes the run ``args`` start."""
    import shlex

    from ..base.devices import this_process

    command = f"elmokit train --save-dir {shlex.quote(args.save_dir)} --resume"
    if this_process().distributed:  # started by torchrun
        command = command.replace("elmokit ", "torchrun [its options] -m elmokit.cli ", 1)
    if args.gpus:
        command += f" --gpus {','.join(map(str, args.gpus))}"
    elif args.nproc and args.nproc > 1:
        command += f" --nproc {args.nproc}"
    return command


def export_command(args: argparse.Namespace) -> int:
    from ..base.atomic import check_outputs_in
    from ..model.weights import SOFTMAX_FILE, has_start_state
    from ..training.export import TRAINING_FILE, export_model

    written = ("options.json", "weights.hdf5", "vocab.txt", SOFTMAX_FILE, TRAINING_FILE)
    check_outputs_in(args.out_dir, written, args.overwrite, _model_files(args.model_dir))
    out = export_model(args.model_dir, args.out_dir, checkpoint=args.checkpoint, average=args.average)
    which = f"{args.checkpoint} checkpoint"
    if args.average:
        which = f"mean of the newest {args.average} checkpoints"
    print(f"wrote {out}/options.json, weights.hdf5 (original layout), vocab.txt, softmax.hdf5 ({which})")
    if not has_start_state(out / "weights.hdf5"):
        print(
            f"elmokit: note: {out} has no start state, so warm mode (the default) starts every "
            f"sentence from zero states; add one with: elmokit start-state {out} --text FILES --write",
            file=sys.stderr,
        )
    return 0


def _add_export_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit export`'s parser."""
    p = sub.add_parser("export", help="write a trained model in the original layout")
    p.add_argument("model_dir", help="a training save dir")
    p.add_argument("out_dir", help="folder to write options.json, weights.hdf5, vocab.txt, softmax.hdf5 into")
    p.add_argument("--overwrite", action="store_true", help="replace the model files already in OUT_DIR")
    _add_checkpoint_choice(p)
    p.set_defaults(func=export_command)
