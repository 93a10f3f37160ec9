"""The language model's commands: ``evaluate`` (held-out perplexity), ``start-state``, ``score``
and ``substitutes``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import Any

from ..base._arguments import ranged
from ..base.atomic import write_json
from ..hub import DEFAULT_MODEL, resolve_model
from ._errors import _fail, _reader_gone
from ._options import MODEL_HELP, _add_checkpoint_choice, _model_inputs


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
