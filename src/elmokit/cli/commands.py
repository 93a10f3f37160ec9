"""The `elmokit` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ..base._arguments import add_options, option_values, ranged
from ..base._console import CommandParser, command_context, error_text, say
from ..base.atomic import make_folders, remove_made_folders, write_json
from ..hub import DEFAULT_MODEL, resolve_model
from ..hub.shipped import TINY_REFERENCE

if TYPE_CHECKING:
    from ..model.bilm import BiLM

# torch and the model's modules are imported inside the commands, so that --help and argument
# errors answer at once

__all__ = ["main"]

DEMO_WORD = "bank"
MODEL_HELP = (
    "a shipped or known model's name (elmokit models), a model folder, a .zip archive, a URL or "
    "hf://owner/name[@revision]"
)
DEMO_QUERIES = [
    ("She went to the bank to withdraw money .", "money"),
    ("They had a picnic on the bank of the river .", "river"),
]


def _load_model(args: argparse.Namespace) -> BiLM:
    from ..model.bilm import BiLM

    if args.options or args.weights:
        if not (args.options and args.weights):
            raise SystemExit("elmokit: give both --options and --weights (or --model DIR)")
        return BiLM.load(*resolve_model(args.options, args.weights).files())  # each a path or a URL
    return BiLM.from_pretrained(args.model)  # a name, folder, .zip archive, URL or hf://


def _snippet(tokens: Sequence[str], word: str, width: int = 96) -> str:
    """The sentence around the first ``word``, cut to about ``width`` characters."""
    text = " ".join(tokens)
    if len(text) <= width:
        return text
    at = text.find(f" {word} ") if f" {word} " in text else text.find(word)
    begin = max(0, min(at - width // 2, len(text) - width))
    end = begin + width
    return ("..." if begin else "") + text[begin:end] + ("..." if end < len(text) else "")


def demo(args: argparse.Namespace) -> int:
    """Show that context separates word senses: neighbours of "bank" among held-out news."""
    from ..embed.embedder import Embedder
    from ..embed.senses import nearest_contexts, read_contexts

    model = _load_model(args)
    embedder = Embedder(model)
    contexts = read_contexts()
    queries = [(text.split(), sense) for text, sense in DEMO_QUERIES]
    start = time.perf_counter()
    results = nearest_contexts(embedder, DEMO_WORD, queries, contexts, k=args.k)
    seconds = time.perf_counter() - start
    lstm = model.options.lstm
    senses = {s: sum(c.sense == s for c in contexts) for s in dict.fromkeys(c.sense for c in contexts)}
    n_tokens = sum(len(c.tokens) for c in contexts) + sum(len(q) for q, _ in queries)
    print(
        f"model {args.options or args.model}: {lstm.n_layers} biLSTM layers of {lstm.dim} cells, "
        f"projection {lstm.projection_dim}, {sum(p.numel() for p in model.parameters()):,} parameters"
    )
    print(
        f"embedded {len(contexts)} held-out news sentences containing '{DEMO_WORD}' "
        f"({', '.join(f'{n} {s}' for s, n in senses.items())} sense) and {len(queries)} queries, "
        f"{n_tokens:,} tokens, in {seconds:.1f} s\n"
    )
    for (tokens, sense), rankings in zip(queries, results):
        print(f"query ({sense} sense): {' '.join(tokens)}")
        for ranking in rankings:
            if ranking.layer == 0:
                print(
                    f"  layer 0 (char CNN, context-free): all {len(contexts)} contexts score "
                    f"{ranking.neighbours[0].score:.3f}; it cannot tell the senses apart"
                    if ranking.distinct_scores == 1
                    else f"  layer 0: {ranking.distinct_scores} distinct scores"
                )
                continue
            ranks = ranking.same_sense_ranks
            shown = ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")
            print(
                f"  layer {ranking.layer} (biLSTM): {ranking.same_sense_at_k:.0%} of the top "
                f"{args.k} have the query's sense; ranks of the {len(ranks)} {sense} contexts: {shown}"
            )
            for n in ranking.neighbours:
                print(f"     {n.score:.3f} [{n.context.sense}] {_snippet(n.context.tokens, DEMO_WORD)}")
        print()
    print(
        f"Layer 0 gives '{DEMO_WORD}' one vector whatever the sentence. The biLSTM layers read the "
        "whole sentence,\nso the same word gets different vectors; the ranks above show how well they "
        "find the query's sense."
    )
    _demo_substitutes(args, [tokens for tokens, _ in queries])
    if args.model == TINY_REFERENCE and not args.options:
        print(
            "(This is the tiny reference model of the original's tests: it shows the machinery, "
            "not linguistic quality.)"
        )
    return 0


def _add_demo_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit demo`'s parser."""
    p = sub.add_parser("demo", help="embed example sentences and show what the layers do")
    p.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--options", help="options.json (with --weights, instead of --model)")
    p.add_argument("--weights", help="weights HDF5 in the original layout")
    p.add_argument("-k", type=ranged(int, low=1), default=3, help="neighbours shown per layer")
    p.set_defaults(func=demo)


def _demo_substitutes(args: argparse.Namespace, queries: list[list[str]], k: int = 6) -> None:
    """What the language model predicts in place of the demo word in each query, from both
    contexts (``elmokit substitutes``); models without a softmax are said to have none."""
    from ..lm.language_model import LanguageModel
    from ..lm.scoring import substitutes

    try:
        if args.options or args.weights:
            raise FileNotFoundError("options + weights only")
        model = LanguageModel.from_pretrained(args.model, device="cpu")
    except (FileNotFoundError, ValueError):
        print(f"\n(no softmax ships with this model: it cannot predict words in place of '{DEMO_WORD}')")
        return
    print(
        f"\nWhat the language model predicts in place of '{DEMO_WORD}' from both contexts "
        "(elmokit substitutes):"
    )
    for tokens in queries:
        found = substitutes(model, tokens, tokens.index(DEMO_WORD), k=k)
        words = ", ".join(f"{word} {p:.3f}" for word, p in found.both)
        print(f"  {' '.join(tokens)}\n     {words}")


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


def evaluate_command(args: argparse.Namespace) -> int:
    """Held-out perplexity with the full softmax, as bilm-tf's test."""
    from ..base.atomic import check_output
    from ..base.devices import resolve_device
    from ..lm.language_model import LanguageModel
    from ..training.data import corpus_files
    from ..training.evaluate import evaluate_perplexity

    device = resolve_device(args.device)
    if args.json:  # before the work, not after it; the model's files and the held-out text are inputs
        check_output(args.json, args.overwrite, [*_model_inputs(args.model_dir), *corpus_files(args.heldout)])
    model = LanguageModel.from_pretrained(
        args.model_dir, device=device, checkpoint=args.checkpoint, average=args.average
    )
    vocabulary = model.vocab
    files = corpus_files(args.heldout)
    result = evaluate_perplexity(
        model,
        vocabulary,
        files,
        batch_size=args.batch_size,
        device=device,
        progress=not args.quiet,
    )
    print(f"held-out: {len(files)} files, {result.tokens:,} predictions per direction")
    print(f"protocol: {result.protocol}")
    print(
        f"perplexity forward {result.forward:.2f}  backward {result.backward:.2f}  "
        f"average {result.average:.2f} (exp of the mean loss of both directions; "
        f"arithmetic mean of the two: {result.arithmetic_mean:.2f})"
    )
    if args.json:
        write_json(args.json, asdict(result), overwrite=args.overwrite)
    return 0


def _add_evaluate_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit evaluate`'s parser."""
    p = sub.add_parser("evaluate", help="held-out perplexity (full softmax, bilm-tf protocol)")
    p.add_argument("model_dir", help="training save dir, or a model with its softmax in any form of --model")
    p.add_argument("--heldout", required=True, help="glob of held-out files")
    p.add_argument("--batch-size", type=ranged(int, low=1), default=256, help="parallel streams")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    _add_checkpoint_choice(p)
    p.add_argument("--json", help="also write the figures to this JSON file")
    p.add_argument("--overwrite", action="store_true", help="replace the --json file if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=evaluate_command)


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


def convert_command(args: argparse.Namespace) -> int:
    """Write a TF-Hub module folder once in bilm-tf's layout (options.json + weights.hdf5)."""
    from ..base.atomic import check_outputs_in
    from ..model.bilm import BiLM

    source = resolve_model(args.module)
    if source.kind != "tfhub" or source.folder is None:
        raise ValueError(
            f"{args.module} is not a TF-Hub module folder (saved_model.pb + variables/); convert writes "
            "a TF-Hub module in bilm-tf's layout, every other model is used as it is"
        )
    module, out = source.folder.resolve(), Path(args.out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a folder")
    if out.resolve() == module or module in out.resolve().parents:
        raise ValueError(f"{out} is inside the module folder {module}; write to another folder")
    names = ("options.json", "weights.hdf5")
    inputs = [p for p in module.rglob("*") if p.is_file()]
    check_outputs_in(out, names, args.overwrite, inputs)
    bilm = BiLM.from_tfhub(module)
    new = [name for name in names if not (out / name).exists()]
    made = make_folders(out)
    try:
        bilm.save(out / names[0], out / names[1])
    except BaseException:
        for name in new:  # what this command wrote, nothing else
            (out / name).unlink(missing_ok=True)
        remove_made_folders(made)
        raise
    print(f"wrote {out}/options.json, weights.hdf5 (bilm-tf's layout) from the TF-Hub module {module}")
    return 0


def _add_convert_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit convert`'s parser."""
    p = sub.add_parser(
        "convert",
        help="write a TF-Hub module folder in bilm-tf's layout (options.json + weights.hdf5)",
    )
    p.add_argument("module", help="a TF-Hub ELMo module folder (saved_model.pb + variables/)")
    p.add_argument("out_dir", help="folder to write options.json and weights.hdf5 into")
    p.add_argument("--overwrite", action="store_true", help="replace the model files already in OUT_DIR")
    p.set_defaults(func=convert_command)


def export_onnx_command(args: argparse.Namespace) -> int:
    """Write a model as one ONNX graph (elmokit.embed.onnx_export): dynamic batch and length, state in
    and out, the start state inside."""
    from ..base.atomic import check_output
    from ..embed.onnx_export import export_onnx, require_onnx
    from ..model.bilm import BiLM

    require_onnx("export-onnx")
    check_output(args.output, args.overwrite, [args.model])  # before the model is read
    # export_onnx refuses an output that is one of the model's files (its weights, its archive)
    data = export_onnx(BiLM.from_pretrained(args.model), args.output, args.overwrite, int8=args.int8)
    print(f"wrote {args.output} ({len(data):,} bytes)", file=sys.stderr)
    return 0


def _add_export_onnx_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit export-onnx`'s parser."""
    p = sub.add_parser("export-onnx", help="write a model as one ONNX graph (dynamic shapes, LSTM state)")
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("output", help="the .onnx file to write")
    p.add_argument("--int8", action="store_true", help="int8 matmuls (approximate; docs/export.md)")
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    p.set_defaults(func=export_onnx_command)


def _embedder(args: argparse.Namespace):
    from ..base.devices import process_device, this_process
    from ..embed.embedder import Embedder

    model = _load_model(args) if (args.options or args.weights) else args.model
    shared = this_process().distributed
    return Embedder(
        model,
        batch_size=args.batch_size,
        device=process_device(args.device) if shared else args.device,  # cuda:LOCAL_RANK
        mode=args.mode if args.command == "embed" else None,  # token vectors have no LSTM state
        max_tokens_per_batch=getattr(args, "max_tokens_per_batch", None),
        dtype=args.dtype,
        backend=getattr(args, "backend", "torch"),
        onnx_file=getattr(args, "onnx", None),
    )


def embed_command(args: argparse.Namespace) -> int:
    """Embed a file of sentences into HDF5 (the layout of `allennlp elmo`) or Parquet; with
    --nproc N or under torchrun the processes share the lines (``Embedder.embed_file(processes=N)``)."""
    from ..base.atomic import check_output
    from ..base.devices import this_process
    from ..base.textfiles import check_input
    from ..embed.parquet_file import output_format, require_pyarrow

    if args.fasta is not None or args.reduced_output is not None:
        return _embed_fasta(args)
    if args.input is None:
        # one file named and no --fasta: argparse's own error, as when INPUT was required
        say("elmokit: error: the following arguments are required: output; see 'elmokit embed --help'")
        raise SystemExit(2)
    args.mode = args.mode or "warm"
    check_input(args.input)  # before the model is read
    if args.shard_sentences is None:
        if output_format(args.output, args.format) == "parquet":  # before the model is read
            require_pyarrow()
        check_output(args.output, args.overwrite, [args.input])
    elif os.path.lexists(args.output) and not os.path.isdir(args.output):
        raise NotADirectoryError(
            f"output {args.output} is a file; with --shard-sentences the output is a folder"
        )
    elif args.format == "parquet":
        require_pyarrow()
    if args.engine == "ray":
        if args.shard_sentences is not None:
            raise ValueError("--shard-sentences goes with the local engine (--nproc, torchrun), not ray")
        return _embed_on_ray(args)
    if args.address is not None or args.workers is not None:
        raise ValueError("--address and --workers go with --engine ray (the local engine takes --nproc)")
    summary = _embedder(args).embed_file(
        args.input,
        args.output,
        layers=args.layers,
        overwrite=args.overwrite,
        sentence_index=not args.no_sentence_index,
        tokenize=args.tokenize,
        progress=not args.quiet,
        pooling=args.pooling,
        processes=args.nproc,
        shard_sentences=args.shard_sentences,
        format=args.format,
    )
    if not args.quiet and this_process().is_main:  # said once under torchrun
        shared = ""
        if summary.processes > 1 and args.shard_sentences is None:
            shared = f", {summary.processes} processes, merge {summary.merge_seconds:.1f} s"
        elif summary.processes > 1:
            shared = f", {summary.processes} processes"
        if args.shard_sentences is not None:
            done = f", {summary.skipped_parts:,} done before and skipped" if summary.skipped_parts else ""
            shared += f"; {summary.parts:,} parts{done}"
        print(
            f"{summary.sentences:,} sentences ({summary.empty:,} empty), {summary.tokens:,} tokens "
            f"in {summary.seconds:.1f} s ({summary.tokens_per_second:,.0f} tokens/s, mode "
            f"{args.mode}{shared}) -> {summary.output}",
            file=sys.stderr,
        )
    return 0


def _add_embed_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit embed`'s parser."""
    p = sub.add_parser(
        "embed",
        help="embed a file of sentences into HDF5 or Parquet",
        description="Embed a file of sentences, one whitespace-tokenized sentence per line (or raw "
        'text with --tokenize), into HDF5 in the layout of `allennlp elmo`: dataset "i" holds line '
        "i's vectors, and sentence_to_index maps each sentence to its line number. A repeated line "
        "keeps only its last line number there, as in AllenNLP (-v says how many repeat). With "
        "--fasta FILE (and no INPUT), the proteins of a FASTA file into the files of bio_embeddings' "
        "embed stage (SeqVec). An OUTPUT named .parquet (or --format parquet) is a Parquet file instead: "
        "one row per line with its index, its tokens and one column of vectors per layer "
        "(docs/embedding.md).",
    )
    p.add_argument("input", nargs="?", help="one whitespace-tokenized sentence per line; - for stdin")
    p.add_argument(
        "output",
        help="HDF5 or Parquet file to write (the format from its suffix); with --shard-sentences a folder",
    )
    p.add_argument(
        "--format",
        choices=["hdf5", "parquet"],
        default=None,
        help="the output's format (default: parquet for a .parquet or .pq OUTPUT, else hdf5; "
        "parquet needs elmokit[parquet])",
    )
    _model_arguments(p)
    p.set_defaults(mode=None)  # warm for sentences, stateful for --fasta
    _add_fasta_arguments(p)
    p.add_argument(
        "--layers",
        choices=["all", "top", "average"],
        default="all",
        help="all: every layer, (3, n_tokens, dim) per line; top: the top biLSTM layer; average: "
        "the mean of the layers ((n_tokens, dim) per line)",
    )
    p.add_argument(
        "--pooling",
        choices=["mean", "max"],
        default=None,
        help="one vector per line: the mean or max over its tokens (dataset 'embedding', row i = line i)",
    )
    p.add_argument(
        "--max-tokens-per-batch",
        type=ranged(int, low=1),
        default=None,
        help="also cap each batch at this many tokens, so long lines make smaller batches (default: "
        "no cap, --batch-size lines)",
    )
    p.add_argument(
        "--tokenize", action="store_true", help="INPUT is raw text: tokenize it as the training corpus was"
    )
    p.add_argument(
        "--no-sentence-index", action="store_true", help="do not write the sentence_to_index dataset"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument(
        "--backend",
        choices=["torch", "onnxruntime"],
        default="torch",
        help="onnxruntime: run an ONNX export of the model on the CPU (needs elmokit[onnx])",
    )
    p.add_argument("--onnx", help="with --backend onnxruntime: the model's file from export-onnx")
    p.add_argument(
        "--shard-sentences",
        type=ranged(int, low=1),
        default=None,
        metavar="N",
        help="a resumable run: OUTPUT is a folder of part files of N lines each plus manifest.json; "
        "the same command after a crash skips the finished parts (docs/embedding.md)",
    )
    _nproc_argument(p)
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="ray: Ray Data's actors embed the lines, one model each, and this process writes the "
        "Parquet OUTPUT (needs elmokit[ray]; docs/ray.md)",
    )
    p.add_argument(
        "--address",
        default=None,
        help="with --engine ray: a running Ray cluster's address (default: a local one)",
    )
    p.add_argument(
        "--workers", type=ranged(int, low=1), default=None, help="with --engine ray: the actors (default: 2)"
    )
    p.set_defaults(func=embed_command)


def _add_fasta_arguments(p: argparse.ArgumentParser) -> None:
    """`elmokit embed --fasta`'s arguments: proteins into bio_embeddings' files."""
    fasta = p.add_argument_group("proteins (--fasta)")
    fasta.add_argument(
        "--fasta",
        metavar="FILE",
        help="embed the proteins of FILE (FASTA; - for stdin), one residue a token, as bio_embeddings' "
        "embed stage does with SeqVec: one dataset (3, L, dim) per protein in OUTPUT, named by the MD5 "
        "of its sequence, its FASTA id in attrs['original_id']; in mode stateful (bio_embeddings' "
        "numbers) unless --mode says otherwise",
    )
    fasta.add_argument(
        "--reduced-output",
        metavar="FILE",
        help="with --fasta: also write one vector (dim,) per protein, the sum over the layers averaged "
        "over the residues (bio_embeddings' reduced_embeddings_file)",
    )
    fasta.add_argument(
        "--max-amino-acids",
        type=ranged(int, low=1),
        default=15000,
        help="with --fasta: the residues of one batch stay below this (bio_embeddings' max_amino_acids; "
        "in stateful mode it decides which states each protein starts from; default 15000)",
    )
    fasta.add_argument(
        "--simple-remapping",
        action="store_true",
        help="with --fasta: name the datasets 0, 1, ... (longest protein first) instead of by MD5",
    )


def _embed_on_ray(args: argparse.Namespace) -> int:
    """``elmokit embed --engine ray``: the lines embedded by Ray Data's actors
    (``elmokit.integrations.ray.embed_file``)."""
    from ..integrations.ray import embed_file, require_ray

    require_ray()
    if args.nproc != 1:
        raise ValueError("--engine ray takes --workers N (Ray's actors), not --nproc")
    if args.options or args.weights or args.backend != "torch" or args.max_tokens_per_batch is not None:
        raise ValueError(
            "--engine ray takes --model (not --options/--weights), the torch backend and no "
            "--max-tokens-per-batch"
        )
    if args.dtype == "int8":
        raise ValueError("--engine ray runs float32 or bfloat16")
    summary = embed_file(
        args.input,
        args.output,
        model=args.model,
        layers=args.layers,
        pooling=args.pooling,
        mode=args.mode,
        dtype=args.dtype,
        device=args.device,
        batch_size=args.batch_size,
        tokenize=args.tokenize,
        overwrite=args.overwrite,
        workers=2 if args.workers is None else args.workers,
        address=args.address,
        progress=not args.quiet,
        format=args.format,
    )
    if not args.quiet:
        print(
            f"{summary.sentences:,} sentences ({summary.empty:,} empty), {summary.tokens:,} tokens "
            f"in {summary.seconds:.1f} s ({summary.tokens_per_second:,.0f} tokens/s, mode {args.mode}, "
            f"ray, {summary.processes} workers) -> {summary.output}",
            file=sys.stderr,
        )
    return 0


def _embed_fasta(args: argparse.Namespace) -> int:
    """embed --fasta: the proteins of a FASTA file into bio_embeddings' HDF5 files."""
    from ..base.atomic import check_output
    from ..embed.fasta import embed_fasta

    if args.fasta is None:
        raise ValueError("--reduced-output goes with --fasta FILE")
    if args.input is not None:
        raise ValueError(
            f"give the proteins' FASTA file as --fasta or the sentences {args.input} as INPUT, not both"
        )
    other = [
        name
        for name, given in (
            ("--layers", args.layers != "all"),
            ("--pooling", args.pooling is not None),
            ("--tokenize", args.tokenize),
            ("--no-sentence-index", args.no_sentence_index),
            ("--max-tokens-per-batch", args.max_tokens_per_batch is not None),
            ("--nproc", args.nproc != 1),
            ("--format parquet", args.format == "parquet" or str(args.output).endswith((".parquet", ".pq"))),
            ("--engine ray", args.engine != "local"),
            ("--shard-sentences", args.shard_sentences is not None),
        )
        if given
    ]
    if other:
        raise ValueError(
            f"{other[0]} does not go with --fasta (it writes bio_embeddings' layout, all layers)"
        )
    args.mode = args.mode or "stateful"
    inputs = [args.fasta]
    for path in (args.output, args.reduced_output):  # before the model is read
        if path is not None:
            check_output(path, args.overwrite, inputs)
    summary = embed_fasta(
        args.fasta,
        args.output,
        _embedder(args),
        reduced_output=args.reduced_output,
        max_amino_acids=args.max_amino_acids,
        simple_remapping=args.simple_remapping,
        overwrite=args.overwrite,
    )
    if not args.quiet:
        reduced = "" if summary.reduced_output is None else f" and {summary.reduced_output}"
        print(
            f"{summary.proteins:,} proteins, {summary.residues:,} residues in {summary.seconds:.1f} s "
            f"(mode {args.mode}) -> {summary.output}{reduced}",
            file=sys.stderr,
        )
    return 0


def tokens_command(args: argparse.Namespace) -> int:
    """Context-independent token vectors for every line of a vocabulary file (shared by the
    processes with --nproc N or under torchrun)."""
    from ..base.atomic import check_output
    from ..base.devices import this_process
    from ..base.textfiles import check_input

    check_input(args.vocab)  # before the model is read
    check_output(args.output, args.overwrite, [args.vocab])
    embedder = _embedder(args)
    n = embedder.embed_tokens_file(args.vocab, args.output, overwrite=args.overwrite, processes=args.nproc)
    if this_process().is_main:
        print(f"{n:,} token vectors -> {args.output} (dataset 'embedding')", file=sys.stderr)
    return 0


def _add_tokens_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit tokens`'s parser."""
    p = sub.add_parser("tokens", help="context-independent token vectors of a vocabulary file")
    p.add_argument("vocab", help="one token per line")
    p.add_argument("output", help="HDF5 file to write (dataset 'embedding')")
    _model_arguments(p)
    _nproc_argument(p)
    p.set_defaults(func=tokens_command)


def _model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--options", help="options.json (with --weights, instead of --model)")
    p.add_argument("--weights", help="weights HDF5 in the original layout")
    p.add_argument("--batch-size", type=ranged(int, low=1), default=64, help="sentences embedded together")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    p.add_argument(
        "--mode",
        choices=["warm", "zero", "stateful"],
        default="warm",
        help="warm: every sentence starts from the model's start state (default); "
        "zero: from zero states; stateful: states carried between batches (bilm-tf)",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "int8"],
        default="float32",
        help="bfloat16: 1.8-2.1x as fast at batch 64 on CPUs with AVX-512 bf16 (slower at batch 1), "
        "cosine 0.9999 to float32; int8: int8 matmuls on the CPU, approximate (cosine about 0.999 "
        "to float32), also with --backend onnxruntime (docs/export.md)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")


def _nproc_argument(p: argparse.ArgumentParser) -> None:
    """--nproc of the commands whose work the Embedder shares between processes."""
    p.add_argument(
        "--nproc",
        type=ranged(int, low=1),
        default=1,
        help="share the work between N processes on this machine (as torchrun --standalone "
        "--nproc-per-node N; each on cuda:LOCAL_RANK with CUDA)",
    )


def start_state_command(args: argparse.Namespace) -> int:
    """Estimate a model's canonical start state from running text; write it to a copy of the
    model (--out) or into a model folder of the user's (--write); compare the modes."""
    import torch

    from ..base.devices import resolve_device
    from ..hub.shipped import refuse_package_path
    from ..lm.start_state import estimate_start_state
    from ..model.bilm import BiLM
    from ..model.weights import write_start_state
    from ..training.data import read_sentences
    from ..training.export import check_new_folder, copy_with_start_state

    source = resolve_model(args.model_dir)  # every model embed takes
    if source.kind == "manylangs":
        raise ValueError(
            f"{args.model_dir} is an ELMoForManyLangs model: start-state writes the state into a "
            "weight file of bilm-tf's layout, which elmokit cannot write for it"
        )
    options, weights = source.files()
    device = resolve_device(args.device)
    if args.out:  # every output is checked before the work
        check_new_folder(args.out)
    if args.write:
        refuse_package_path(weights.parent, "model folder")
        if not os.access(weights.parent, os.W_OK | os.X_OK):
            raise PermissionError(f"cannot write {weights}: the folder {weights.parent} is not writable")
    bilm = BiLM.load(options, weights).to(device)
    sentences = read_sentences(args.text, args.sentences)
    with torch.no_grad():
        state = estimate_start_state(bilm, sentences, rows=args.rows, progress=not args.quiet)
    print(f"start state: mean boundary state over {len(sentences):,} sentences of {args.text}")
    if args.out:
        out = copy_with_start_state(options, weights, args.out, state)
        print(f"wrote {out}: a copy of {weights.parent} whose {weights.name} holds this start state")
    if args.write:
        write_start_state(weights, weights, state)
        print(f"written to {weights} (datasets start_state/h, start_state/c)")
    if args.heldout:
        from ..lm.language_model import LanguageModel
        from ..training.evaluate import compare_start_modes

        lm = LanguageModel.from_pretrained(args.model_dir, device=device)
        modes = compare_start_modes(lm, args.heldout, state, device=device, progress=not args.quiet)
        stream = modes.stream
        print(f"held-out {args.heldout}: perplexity forward / backward / average")
        print(
            f"  stateful stream ({stream.protocol.split(':')[0]}): {stream.forward:8.2f} "
            f"{stream.backward:8.2f} {stream.average:8.2f}"
        )
        for name, alone in (
            ("zero start, each sentence alone", modes.zero),
            ("warm start, each sentence alone", modes.warm),
        ):
            print(
                f"  {name}: {alone.forward:8.2f} {alone.backward:8.2f} {alone.average:8.2f} "
                f"({alone.tokens:,} predictions per direction)"
            )
    return 0


def _add_start_state_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit start-state`'s parser."""
    p = sub.add_parser("start-state", help="estimate a model's start state for warm mode")
    p.add_argument("model_dir", help=MODEL_HELP)
    p.add_argument("--text", required=True, help="glob of running text (not the test set)")
    p.add_argument(
        "--sentences", type=ranged(int, low=1), default=20000, help="at most this many sentences of --text"
    )
    p.add_argument("--rows", type=ranged(int, low=1), default=32, help="parallel streams")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--out", metavar="DIR", help="write a copy of the model, with this start state, to the new folder DIR"
    )
    where.add_argument(
        "--write",
        action="store_true",
        help="store it in MODEL_DIR's weights.hdf5 (a folder of your own; never the installed package)",
    )
    p.add_argument("--heldout", help="glob of held-out text: compare perplexity of the modes")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=start_state_command)


def score_command(args: argparse.Namespace) -> int:
    """Log-probability and perplexity of every sentence of a file, as JSON lines or TSV."""
    from ..base.textfiles import check_input
    from ..lm.language_model import LanguageModel
    from ..lm.scoring import score_file

    check_input(args.input)  # before the model is read
    try:
        model = LanguageModel.from_pretrained(args.model, device=args.device)
        summary = score_file(
            model,
            args.input,
            args.output,
            fmt=args.format,
            mode=args.mode,
            batch_size=args.batch_size,
            per_token=args.per_token,
            tokenize=args.tokenize,
            overwrite=args.overwrite,
            progress=not args.quiet and sys.stderr.isatty(),
        )
    except BrokenPipeError:  # the reader stopped early (e.g. `| head`): said as every command says it
        return _reader_gone()
    except OSError as err:  # e.g. an output that is a folder or not writable
        return _fail(err)
    if not args.quiet:
        rate = max(summary.seconds, 1e-9)
        perplexity = (
            f"perplexity over all sentences: forward {summary.forward_perplexity:.2f}, backward "
            f"{summary.backward_perplexity:.2f}, average {summary.perplexity:.2f}"
            if summary.sentences
            else "no sentence to score, so the perplexity is undefined"
        )
        print(
            f"scored {summary.sentences:,} sentences ({summary.empty:,} empty "
            f"line{'' if summary.empty == 1 else 's'} skipped), "
            f"{summary.tokens:,} tokens ({summary.oov:,} outside the vocabulary) in "
            f"{summary.seconds:.1f} s: {summary.sentences / rate:,.0f} sentences/s, "
            f"{summary.tokens / rate:,.0f} tokens/s (mode {args.mode}); {perplexity}"
            + (f" -> {args.output}" if args.output else ""),
            file=sys.stderr,
        )
    return 0


def _add_score_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit score`'s parser."""
    p = sub.add_parser(
        "score",
        help="log-probability and perplexity of each sentence (full softmax)",
        description="Score each sentence on its own: the forward LM predicts its tokens and </S> "
        "from <S>, the backward LM its tokens and <S> from </S> (full softmax, natural logs; "
        "tokens outside the vocabulary count as <UNK>). One output line per non-empty input line, "
        "with its line number; empty lines are skipped.",
    )
    p.add_argument("input", help="one whitespace-tokenized sentence per line; - for stdin")
    p.add_argument(
        "-o",
        "--output",
        help="file to write (atomically); a named pipe or /dev/stdout is written into; default: stdout",
    )
    p.add_argument(
        "--format", choices=["jsonl", "tsv"], default="jsonl", help="JSON lines (default: jsonl) or TSV"
    )
    p.add_argument(
        "--per-token", action="store_true", help="JSON lines: also each prediction's log-probability"
    )
    _scoring_model_arguments(p)
    p.add_argument("--batch-size", type=ranged(int, low=1), default=64, help="sentences scored together")
    p.add_argument(
        "--tokenize", action="store_true", help="INPUT is raw text: tokenize it as the training corpus was"
    )
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=score_command)


def _substitutes_table(result: Any) -> str:
    """A ``scoring.Substitutes`` as a readable table: rank, then word and probability per column."""
    tokens = list(result.tokens)
    tokens[result.position] = f"[{tokens[result.position]}]"
    names = {
        "forward": "left context (forward LM)",
        "backward": "right context (backward LM)",
        "both": "both (product, renormalised)",
    }
    which = f"'{result.word}'"
    if not result.in_vocabulary:
        which = f"<UNK> ({which} is outside the vocabulary)"
    lines = [
        " ".join(tokens),
        f"word {result.position} (0-based): P({which}) "
        + ", ".join(
            f"{names[k].split(' (')[0]} {result.probability[k]:.4f}"
            + (f" (rank {result.rank[k]})" if result.rank[k] is not None else "")
            for k in names
        ),
        "",
    ]
    width = max(len(n) for n in names.values())
    word_width = width - 8
    lines.append("rank  " + "  ".join(f"{n:<{width}}" for n in names.values()).rstrip())
    for i in range(len(result.both)):
        cells = []
        for k in names:
            word, p = getattr(result, k)[i]
            shown = word if len(word) <= word_width else word[: word_width - 3] + "..."
            cells.append(f"{shown:<{word_width}}{p:>8.4f}")
        lines.append(f"{i + 1:>4}  " + "  ".join(cells))
    lines.append("(<S>, </S> and <UNK> are left out of the lists; probabilities are of the full vocabulary)")
    return "\n".join(lines)


def substitutes_command(args: argparse.Namespace) -> int:
    """The words the model predicts at one position of a sentence."""
    from ..lm.language_model import LanguageModel
    from ..lm.scoring import substitutes

    tokens = " ".join(args.sentence).split()
    model = LanguageModel.from_pretrained(args.model, device=args.device)
    result = substitutes(model, tokens, args.word, k=args.k, mode=args.mode)
    print(json.dumps(result.to_dict(), ensure_ascii=False) if args.json else _substitutes_table(result))
    return 0


def _add_substitutes_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit substitutes`'s parser."""
    p = sub.add_parser(
        "substitutes",
        help="the words the model predicts at a position, from the left, the right and both",
        description="The k most probable words at one position of a tokenized sentence: from the "
        "left context (forward LM), the right context (backward LM) and both (the product of the "
        "two distributions, renormalised). <S>, </S> and <UNK> are left out of the lists.",
    )
    p.add_argument(
        "sentence", nargs="+", help="a whitespace-tokenized sentence (quoted, or one word per argument)"
    )
    p.add_argument(
        "--word", type=int, required=True, help="index of the token to predict, 0-based (the first is 0)"
    )
    p.add_argument("-k", type=ranged(int, low=1), default=10, help="words listed per column (default 10)")
    _scoring_model_arguments(p)
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.set_defaults(func=substitutes_command)


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


def _scoring_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="a model with its softmax (softmax.hdf5 and vocab.txt beside its weights): a training "
        f"save dir, or any form of --model elsewhere (default {DEFAULT_MODEL})",
    )
    p.add_argument(
        "--mode",
        choices=["warm", "zero"],
        default="warm",
        help="warm: every sentence starts from the model's start state (default); zero: from zero states",
    )
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")


def models_command(args: argparse.Namespace) -> int:
    """The models elmokit ships and can download, with their sources and whether they are cached."""
    from ..hub.registry import format_models, model_rows

    rows = model_rows()
    print(json.dumps(rows, indent=2, ensure_ascii=False) if args.json else format_models(rows))
    return 0


def _add_models_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit models`'s parser."""
    p = sub.add_parser(
        "models",
        help="list the models elmokit ships and can download (name, language, size, source, cached)",
        description="The shipped models and the public models elmokit downloads by name (AllenNLP, "
        "NLPL repository, SeqVec, ELMoForManyLangs), with their URLs and whether they are in the "
        "cache ($ELMOKIT_CACHE, else the user cache folder). Any --model also takes a folder, a "
        ".zip archive, a URL or hf://owner/name[@revision].",
    )
    p.add_argument("--json", action="store_true", help="everything known of each model, as JSON")
    p.set_defaults(func=models_command)


def download_command(args: argparse.Namespace) -> int:
    """Download a known model or a URL into the cache, verified; say where it went."""
    from ..hub import download_model
    from ..model.options import BiLMOptions
    from ..model.weights import open_hdf5

    lines, source = download_model(args.model, force=args.force, progress=False if args.quiet else None)
    if source is not None and source.kind == "bilm":  # what can be checked without building the model
        options, weights = source.files()
        BiLMOptions.from_file(options)
        open_hdf5(weights).close()
    for line in lines:
        print(line)
    return 0


def _add_download_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit download`'s parser."""
    p = sub.add_parser(
        "download",
        help="download a known model, a URL or an hf:// repository into the cache (verified) and print "
        "where it went",
    )
    p.add_argument(
        "model",
        metavar="NAME|URL|hf://owner/name[@revision]",
        help="a name from `elmokit models`, a URL, or a Hugging Face Hub repository",
    )
    p.add_argument("--force", action="store_true", help="download again even if it is cached")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=download_command)


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


def probe_command(args: argparse.Namespace) -> int:
    """What each layer holds: a linear probe per layer (elmokit.probe), a table and a JSON file."""
    from ..base.atomic import check_output
    from ..probe.tagging import ProbeSettings, probe_files

    if args.train is None or args.test is None or args.column is None:
        raise ValueError("probe needs --train, --test and --column (or: elmokit probe wsd ...)")
    inputs = [f for f in (args.train, args.dev, args.test) if f is not None]
    if args.json is not None or args.plot is not None:
        inputs += _model_inputs(args.model)
    for out in (args.json, args.plot):
        if out is not None:
            check_output(out, args.overwrite, inputs)
    if (
        args.json is not None
        and args.plot is not None
        and Path(args.json).resolve() == Path(args.plot).resolve()
    ):
        raise ValueError(f"--json and --plot name the same file: {args.json}")
    result, record = probe_files(
        args.model,
        args.train,
        args.test,
        args.format,
        args.column,
        dev=args.dev,
        layers=args.layers,
        seeds=args.seeds,
        max_sentences=args.max_sentences,
        settings=ProbeSettings(hidden=args.hidden),
    )
    print(result.table())
    if args.json is not None:
        write_json(args.json, record, overwrite=args.overwrite)
    if args.plot is not None:
        from ..probe.plot import plot_probes

        plot_probes([record], args.plot, overwrite=args.overwrite)
    return 0


def _add_probe_parser(sub: argparse._SubParsersAction) -> None:
    """`elmokit probe`'s parser."""
    p = sub.add_parser(
        "probe",
        help="what each layer holds: a linear classifier per layer on token labels (POS, chunks, NER)",
        description="Train a linear classifier on each layer's frozen vectors (0, 1, 2, their average, "
        "a learned scalar mix), one per seed, on the label column of a CoNLL or CoNLL-U file; print "
        "accuracy (and span F1 for IOB labels) per layer with the spread over seeds (docs/probe.md).",
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--train", help="training sentences (labelled)")
    p.add_argument("--dev", help="dev sentences: each probe keeps its epoch with the best dev score")
    p.add_argument("--test", help="test sentences (labelled)")
    p.add_argument("--format", choices=["conll", "conllu"], default="conll", help="default: conll")
    p.add_argument(
        "--column",
        type=ranged(int, low=0),
        help="label column, 0 = word: CoNLL-2000 1 POS, 2 chunk; CoNLL-2003 3 NER; CoNLL-U 3 UPOS",
    )
    p.add_argument("--seeds", type=ranged(int, low=1), default=3, help="probes per layer (default 3)")
    p.add_argument("--layers", default="0,1,2,average,mix", help="default: 0,1,2,average,mix")
    p.add_argument("--max-sentences", type=ranged(int, low=1), help="the first N training sentences")
    p.add_argument(
        "--hidden",
        type=ranged(int, low=0),
        default=0,
        metavar="N",
        help="0: a linear probe (default); N: an MLP with one hidden layer of N ReLU units",
    )
    p.add_argument("--json", metavar="OUT", help="write the scores, model, files and command as JSON")
    p.add_argument("--plot", metavar="PNG", help="draw the scores per layer (needs matplotlib)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT or PNG if it exists")
    p.set_defaults(func=probe_command)
    probe_tasks = p.add_subparsers(dest="probe_task", required=False, metavar="wsd|plot")
    plot = probe_tasks.add_parser(
        "plot",
        help="draw saved probe results (--json files), one panel each, into one PNG",
        description="Draw the records written by `elmokit probe --json`: one panel per file, a bar "
        "per layer (the mean test score) with a line from the lowest to the highest seed.",
    )
    plot.add_argument("records", nargs="+", metavar="JSON", help="files written by elmokit probe --json")
    plot.add_argument("--out", required=True, metavar="PNG", help="the figure to write")
    plot.add_argument("--titles", help="the panels' titles, comma-separated (default: data folder, column)")
    plot.add_argument("--overwrite", action="store_true", help="replace PNG if it exists")
    plot.set_defaults(func=probe_plot_command)
    wsd = probe_tasks.add_parser(
        "wsd",
        help="word senses by 1-nearest-neighbour per layer (the unified WSD framework's XML + gold keys)",
        description="A sense's vector is the mean of its training occurrences' vectors; a test word "
        "takes the nearest (cosine) sense of its lemma seen in training; an unseen lemma takes "
        "WordNet's first sense from --index-sense (docs/probe.md).",
    )
    wsd.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    wsd.add_argument("--train", required=True, help="NAME.data.xml with sense-tagged instances (SemCor)")
    wsd.add_argument("--train-key", help="its gold keys (default: NAME.gold.key.txt beside it)")
    wsd.add_argument("--test", required=True, help="NAME.data.xml to disambiguate")
    wsd.add_argument("--test-key", help="its gold keys (default: NAME.gold.key.txt beside it)")
    wsd.add_argument("--index-sense", help="WordNet 3.0's index.sense, for the first-sense fallback")
    wsd.add_argument("--layers", default="0,1,2,average", help="default: 0,1,2,average")
    wsd.add_argument("--json", metavar="OUT", help="write the scores, model, files and command as JSON")
    wsd.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    wsd.set_defaults(func=probe_wsd_command)


def probe_plot_command(args: argparse.Namespace) -> int:
    """Draw saved probe records (``elmokit probe --json``) into one PNG."""
    from ..base.atomic import check_output
    from ..base.jsonfiles import read_json
    from ..probe.plot import plot_probes

    check_output(args.out, args.overwrite, args.records)
    records = []
    for path in args.records:
        try:
            record = read_json(path)
        except ValueError as err:  # its one line names the file
            raise ValueError(f"a probe record is not JSON: {err}") from None
        if not isinstance(record, dict) or not {"layers", "metric"} <= record.keys():
            raise ValueError(f"{path} is not a record written by elmokit probe --json")
        records.append(record)
    titles = None if args.titles is None else [t.strip() for t in args.titles.split(",")]
    plot_probes(records, args.out, titles, overwrite=args.overwrite)
    print(f"wrote {args.out}")
    return 0


def probe_wsd_command(args: argparse.Namespace) -> int:
    """Word senses per layer by 1-NN (elmokit.probe.wsd), a table and a JSON file."""
    from ..base.atomic import check_output
    from ..probe.wsd import wsd_files, wsd_table

    files = [args.train, args.train_key, args.test, args.test_key, args.index_sense]
    if args.json is not None:
        inputs = [*(f for f in files if f is not None), *_model_inputs(args.model)]
        check_output(args.json, args.overwrite, inputs)
    record = wsd_files(
        args.model, args.train, args.test, args.index_sense, args.train_key, args.test_key, args.layers
    )
    print(wsd_table(record))
    if args.json is not None:
        write_json(args.json, record, overwrite=args.overwrite)
    return 0


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


def _reader_gone() -> int:
    """The reader of standard output stopped early (``elmokit models | head -3``): no message,
    and the exit status of a command that SIGPIPE ended, 141 (128 + 13), as coreutils and git
    give; what is left unwritten goes to /dev/null, so Python says nothing at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor
        pass
    return 128 + signal.SIGPIPE


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings in one line, as errors are."""
    say(f"elmokit: warning: {message}")


def _first_line(err: BaseException) -> str:
    """The first line of an error's message that says something (torch's run to many lines)."""
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)


def _fail(err: BaseException | str) -> int:
    """Report an error in one line, as every command does; returns the exit status."""
    say(f"elmokit: error: {error_text(err)}")
    return 2
