"""The `elmokit` command line."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from .atomic import write_json
from .bilm import BiLM
from .pretrained import DEFAULT_MODEL, TINY_REFERENCE, model_files

DEMO_WORD = "bank"
DEMO_QUERIES = [
    ("She went to the bank to withdraw money .", "money"),
    ("They had a picnic on the bank of the river .", "river"),
]


def _load_model(args: argparse.Namespace) -> BiLM:
    if args.options or args.weights:
        if not (args.options and args.weights):
            raise SystemExit("elmokit: give both --options and --weights (or --model DIR)")
        return BiLM.load(args.options, args.weights)
    return BiLM.load(*model_files(args.model))


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
    from .embed import Embedder
    from .senses import nearest_contexts, read_contexts

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
    if args.model == TINY_REFERENCE and not args.options:
        print(
            "(This is the tiny reference model of the original's tests: it shows the machinery, "
            "not linguistic quality.)"
        )
    return 0


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "45m", "2h" or "1.5h"."""
    units = {"s": 1, "m": 60, "h": 3600}
    text = text.strip().lower()
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90m, 2h)") from None


def _read_config(value: str) -> dict:
    from .options import PRESETS, preset

    if value in PRESETS:
        return preset(value)
    path = Path(value)
    if not path.is_file():
        raise FileNotFoundError(f"--config {value!r} is neither a preset ({', '.join(PRESETS)}) nor a file")
    return json.loads(path.read_text(encoding="utf-8"))


def vocab(args: argparse.Namespace) -> int:
    """Build a frequency-sorted vocabulary file from corpus files."""
    from .data import Vocabulary, corpus_files, count_tokens

    files = [f for pattern in args.corpus for f in corpus_files(pattern)]
    counts = count_tokens(files)
    if not counts:
        raise ValueError(f"empty corpus: {' '.join(args.corpus)} holds no tokens")
    built = Vocabulary.build(counts, min_count=args.min_count, max_size=args.max_size)
    built.save(args.output)
    total = sum(counts.values())
    print(
        f"{len(files)} files, {total:,} tokens, {len(counts):,} distinct; vocabulary of "
        f"{len(built):,} (with <S>, </S>, <UNK>) written to {args.output}; it covers "
        f"{built.coverage(counts):.2%} of the corpus tokens"
    )
    return 0


def train_command(args: argparse.Namespace) -> int:
    """Train a biLM (or resume, or fine-tune from --init-from)."""
    from .launch import TrainConfig, launch

    config = TrainConfig(
        train=args.train,
        vocab=args.vocab,
        save_dir=args.save_dir,
        options=_read_config(args.config) if not (args.resume or args.init_from) else {},
        heldout=args.heldout,
        epochs=args.epochs,
        max_steps=args.max_steps,
        max_time=args.max_time,
        batch_size=args.batch_size,
        unroll_steps=args.unroll_steps,
        n_negative_samples=args.n_negative_samples,
        lr=args.lr,
        dropout=args.dropout,
        seed=args.seed,
        device=args.device,
        checkpoint_minutes=args.checkpoint_minutes,
        init_from=args.init_from,
        precision=args.precision,
        state_reset=args.state_reset,
    )
    if config.epochs is None and config.max_steps is None and config.max_time is None:
        config.epochs = 10
    launch(config, resume=args.resume, processes=args.nproc, gpus=args.gpus)
    if os.environ.get("RANK", "0") == "0":  # once under torchrun
        print(
            f"checkpoint and metrics.csv in {args.save_dir}; "
            f"export with: elmokit export {args.save_dir} OUT_DIR"
        )
    return 0


def evaluate_command(args: argparse.Namespace) -> int:
    """Held-out perplexity with the full softmax, as bilm-tf's test."""
    from .data import corpus_files
    from .evaluate import evaluate_perplexity
    from .export import load_language_model

    model, vocabulary = load_language_model(args.model_dir, device=args.device)
    files = corpus_files(args.heldout)
    result = evaluate_perplexity(
        model,
        vocabulary,
        files,
        batch_size=args.batch_size,
        device=args.device,
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
        write_json(args.json, asdict(result))
    return 0


def export_command(args: argparse.Namespace) -> int:
    from .export import export_model

    out = export_model(args.model_dir, args.out_dir, checkpoint=args.checkpoint)
    print(
        f"wrote {out}/options.json, weights.hdf5 (original layout), vocab.txt, softmax.hdf5 "
        f"({args.checkpoint} checkpoint)"
    )
    return 0


def _embedder(args: argparse.Namespace):
    from .embed import Embedder

    model = _load_model(args) if (args.options or args.weights) else args.model
    return Embedder(
        model,
        batch_size=args.batch_size,
        device=args.device,
        mode=args.mode,
        max_tokens_per_batch=getattr(args, "max_tokens_per_batch", None),
        dtype=args.dtype,
    )


def embed_command(args: argparse.Namespace) -> int:
    """Embed a file of sentences into HDF5 (the layout of `allennlp elmo`)."""
    embedder = _embedder(args)
    summary = embedder.embed_file(
        args.input,
        args.output,
        layers=args.layers,
        overwrite=args.overwrite,
        sentence_index=not args.no_sentence_index,
        tokenize=args.tokenize,
        progress=not args.quiet,
    )
    if not args.quiet:
        print(
            f"{summary.sentences:,} sentences ({summary.empty:,} empty), {summary.tokens:,} tokens "
            f"in {summary.seconds:.1f} s ({summary.tokens_per_second:,.0f} tokens/s, mode "
            f"{args.mode}) -> {summary.output}",
            file=sys.stderr,
        )
    return 0


def tokens_command(args: argparse.Namespace) -> int:
    """Context-independent token vectors for every line of a vocabulary file."""
    n = _embedder(args).embed_tokens_file(args.vocab, args.output, overwrite=args.overwrite)
    print(f"{n:,} token vectors -> {args.output} (dataset 'embedding')", file=sys.stderr)
    return 0


def _model_arguments(p: argparse.ArgumentParser) -> None:
    from .pretrained import DEFAULT_MODEL

    p.add_argument("--model", default=DEFAULT_MODEL, help="model folder or shipped model name")
    p.add_argument("--options", help="options.json (with --weights, instead of --model)")
    p.add_argument("--weights", help="weights HDF5 in the original layout")
    p.add_argument("--batch-size", type=int, default=64)
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
        choices=["float32", "bfloat16"],
        default="float32",
        help="bfloat16: 1.8-2.1x as fast at batch 64 on CPUs with AVX-512 bf16 (slower at batch 1), "
        "cosine 0.9999 to float32",
    )
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")


def _read_sentences(pattern: str, limit: int | None) -> list[list[str]]:
    from .data import corpus_files

    out: list[list[str]] = []
    for path in corpus_files(pattern):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.split():
                    out.append(line.split())
                if limit is not None and len(out) >= limit:
                    return out
    return out


def start_state_command(args: argparse.Namespace) -> int:
    """Estimate a model's canonical start state from running text; compare the modes."""
    from .start_state import estimate_start_state, sentence_losses
    from .weights import save_weights

    options, weights = model_files(args.model_dir)
    bilm = BiLM.load(options, weights)
    sentences = _read_sentences(args.text, args.sentences)
    with torch.no_grad():
        state = estimate_start_state(bilm, sentences, rows=args.rows)
    print(f"start state: mean boundary state over {len(sentences):,} sentences of {args.text}")
    if args.write:
        bilm.start_state = state
        save_weights(bilm, weights)
        print(f"written to {weights} (datasets start_state/h, start_state/c)")
    if args.heldout:
        from .evaluate import evaluate_perplexity
        from .export import load_language_model

        lm, vocab = load_language_model(args.model_dir)
        held = _read_sentences(args.heldout, None)  # all of it, as the stream protocol
        stream = evaluate_perplexity(lm, vocab, args.heldout)
        print(f"held-out {args.heldout}: perplexity forward / backward / average")
        print(
            f"  stateful stream ({stream.protocol.split(':')[0]}): {stream.forward:8.2f} "
            f"{stream.backward:8.2f} {stream.average:8.2f}"
        )
        for name, start in (
            ("zero start, each sentence alone", None),
            ("warm start, each sentence alone", state),
        ):
            fwd, bwd, n = sentence_losses(lm, vocab, held, start)
            print(
                f"  {name}: {math.exp(fwd):8.2f} {math.exp(bwd):8.2f} "
                f"{math.exp(0.5 * (fwd + bwd)):8.2f} ({n:,} predictions per direction)"
            )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elmokit", description="ELMo: deep contextualized word representations."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="embed example sentences and show what the layers do")
    p.add_argument("--model", default=DEFAULT_MODEL, help="shipped model name or model folder")
    p.add_argument("--options", help="options.json (with --weights, instead of --model)")
    p.add_argument("--weights", help="weights HDF5 in the original layout")
    p.add_argument("-k", type=int, default=3, help="neighbours shown per layer")
    p.set_defaults(func=demo)

    p = sub.add_parser("embed", help="embed a file of sentences into HDF5")
    p.add_argument("input", help="one whitespace-tokenized sentence per line; - for stdin")
    p.add_argument("output", help="HDF5 file to write")
    _model_arguments(p)
    p.add_argument("--layers", choices=["all", "top", "average"], default="all")
    p.add_argument("--max-tokens-per-batch", type=int, default=None)
    p.add_argument(
        "--tokenize", action="store_true", help="INPUT is raw text: tokenize it as the training corpus was"
    )
    p.add_argument(
        "--no-sentence-index", action="store_true", help="do not write the sentence_to_index dataset"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=embed_command)

    p = sub.add_parser("tokens", help="context-independent token vectors of a vocabulary file")
    p.add_argument("vocab", help="one token per line")
    p.add_argument("output", help="HDF5 file to write (dataset 'embedding')")
    _model_arguments(p)
    p.set_defaults(func=tokens_command)

    p = sub.add_parser("start-state", help="estimate a model's start state for warm mode")
    p.add_argument("model_dir", help="exported model folder (options.json + weights.hdf5)")
    p.add_argument("--text", required=True, help="glob of running text (not the test set)")
    p.add_argument("--sentences", type=int, default=20000, help="at most this many sentences of --text")
    p.add_argument("--rows", type=int, default=32, help="parallel streams")
    p.add_argument("--write", action="store_true", help="store it in the model's weights.hdf5")
    p.add_argument("--heldout", help="glob of held-out text: compare perplexity of the modes")
    p.set_defaults(func=start_state_command)

    p = sub.add_parser("vocab", help="build a frequency-sorted vocabulary from corpus files")
    p.add_argument("corpus", nargs="+", help="corpus files or globs (one sentence per line)")
    p.add_argument("-o", "--output", required=True, help="vocabulary file to write")
    p.add_argument("--min-count", type=int, default=1)
    p.add_argument("--max-size", type=int, default=None, help="including <S>, </S>, <UNK>")
    p.set_defaults(func=vocab)

    p = sub.add_parser("train", help="train a biLM with the original recipe")
    p.add_argument("--train", required=True, help="glob of training text files")
    p.add_argument("--vocab", required=True, help="vocabulary file (elmokit vocab)")
    p.add_argument("--save-dir", required=True)
    p.add_argument(
        "--config",
        default="small",
        help="preset (tiny, small, medium, original) or a bilm-tf options .json",
    )
    p.add_argument("--heldout", help="glob of held-out files (evaluated at the end)")
    stop = p.add_argument_group("when to stop (default: 10 epochs)")
    stop.add_argument("--epochs", type=float)
    stop.add_argument("--max-steps", type=int)
    stop.add_argument("--max-time", type=parse_duration, help="e.g. 90m, 2h (this session)")
    p.add_argument("--batch-size", type=int, default=128, help="per process")
    p.add_argument("--unroll-steps", type=int, default=20)
    p.add_argument("--n-negative-samples", type=int, default=8192)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--gpus", help="start one process per listed GPU, e.g. 0,1,2 (NCCL DDP)")
    p.add_argument("--nproc", type=int, default=1, help="start this many CPU processes (gloo DDP)")
    p.add_argument("--checkpoint-minutes", type=float, default=10.0)
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16 autocasts the forward pass (GPUs and CPUs with bf16 support)",
    )
    p.add_argument(
        "--state-reset",
        type=float,
        default=0.0,
        help="probability of zeroing a row's carried LSTM state before a window "
        "(0 = original recipe; 0.01 teaches the model to start from zero)",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --save-dir")
    p.add_argument("--init-from", help="model folder to fine-tune from (new vocabulary allowed)")
    p.set_defaults(func=train_command)

    p = sub.add_parser("evaluate", help="held-out perplexity (full softmax, bilm-tf protocol)")
    p.add_argument("model_dir", help="training save dir or exported model folder")
    p.add_argument("--heldout", required=True, help="glob of held-out files")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", help="also write the figures to this JSON file")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=evaluate_command)

    p = sub.add_parser("export", help="write a trained model in the original layout")
    p.add_argument("model_dir")
    p.add_argument("out_dir")
    p.add_argument(
        "--checkpoint",
        choices=["latest", "best"],
        default="latest",
        help="of a training save dir: the latest, or the one with the lowest held-out perplexity",
    )
    p.set_defaults(func=export_command)

    from .tasks.cli import add_task_parser

    add_task_parser(sub)  # elmokit task ner|pos|sentiment ...
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, FileExistsError, ValueError, ImportError) as err:
        print(f"elmokit: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
