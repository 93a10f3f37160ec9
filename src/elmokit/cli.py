"""The `elmokit` command line."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch

from .bilm import BiLM
from .characters import batch_to_ids
from .pretrained import TINY_REFERENCE, model_files

DEMO_SENTENCES = [
    "She went to the bank to withdraw money .",
    "They had a picnic on the bank of the river .",
    "The bank raised its interest rates on Tuesday .",
]


def _load_model(args: argparse.Namespace) -> BiLM:
    if args.options or args.weights:
        if not (args.options and args.weights):
            raise SystemExit("elmokit: give both --options and --weights (or --model DIR)")
        return BiLM.load(args.options, args.weights)
    return BiLM.load(*model_files(args.model))


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def demo(args: argparse.Namespace) -> int:
    """Embed example sentences and show how the layers treat one word in different contexts."""
    model = _load_model(args)
    sentences = [s.split() for s in DEMO_SENTENCES]
    start = time.perf_counter()
    with torch.no_grad():
        out = model(batch_to_ids(sentences))
    seconds = time.perf_counter() - start
    n_tokens = sum(map(len, sentences))
    lstm = model.options.lstm
    print(
        f"model: {args.options or args.model}: {lstm.n_layers} LSTM layers of {lstm.dim} cells, "
        f"projection {lstm.projection_dim}, {sum(p.numel() for p in model.parameters()):,} parameters"
    )
    print(
        f"embedded {len(sentences)} sentences ({n_tokens} tokens) in {seconds * 1000:.1f} ms: "
        f"layers tensor {tuple(out.layers.shape)} = (layers, sentences, tokens, dim)\n"
    )
    word = "bank"
    vectors = [out.layers[:, i, s.index(word)] for i, s in enumerate(sentences)]
    for i, s in enumerate(DEMO_SENTENCES):
        norms = ", ".join(f"{float(v.norm()):.2f}" for v in vectors[i])
        print(f"  [{i}] {s}\n      |{word}| per layer: {norms}")
    print(f"\ncosine similarity of '{word}' between contexts, per layer:")
    print(f"  {'layer':<16} " + "  ".join(f"{f'[{a}]-[{b}]':>9}" for a, b in [(0, 1), (0, 2), (1, 2)]))
    for layer in range(out.layers.shape[0]):
        sims = [_cosine(vectors[a][layer], vectors[b][layer]) for a, b in [(0, 1), (0, 2), (1, 2)]]
        name = "0 (char CNN)" if layer == 0 else f"{layer} (biLSTM)"
        print(f"  {name:<16} " + "  ".join(f"{s:9.4f}" for s in sims))
    print(
        "\nLayer 0 is context-independent: the same word gets the same vector everywhere "
        "(cosine 1).\nThe biLSTM layers depend on the whole sentence, so the same word differs "
        "between contexts."
    )
    if args.model == TINY_REFERENCE and not args.options:
        print(
            "(This is the tiny reference model of the original's tests: it shows the machinery, "
            "not linguistic quality.)"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elmokit", description="ELMo: deep contextualized word representations."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="embed example sentences and show what the layers do")
    p.add_argument("--model", default=TINY_REFERENCE, help="shipped model name or model folder")
    p.add_argument("--options", help="options.json (with --weights, instead of --model)")
    p.add_argument("--weights", help="weights HDF5 in the original layout")
    p.set_defaults(func=demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError) as err:
        print(f"elmokit: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
