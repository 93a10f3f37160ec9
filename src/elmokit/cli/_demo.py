"""``elmokit demo``: what context does to a word's vectors, layer by layer, on held-out news."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from ..base._arguments import ranged
from ..hub import DEFAULT_MODEL
from ..hub.shipped import TINY_REFERENCE
from ._options import MODEL_HELP, _load_model

DEMO_WORD = "bank"


DEMO_QUERIES = [
    ("She went to the bank to withdraw money .", "money"),
    ("They had a picnic on the bank of the river .", "river"),
]


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
