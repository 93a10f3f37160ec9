"""How stable are a sentence's vectors in each Embedder mode?

    python scripts/mode_stability.py MODEL TEXT [--sentences 500] [--seed 0] [--json OUT]

MODEL: a model folder or shipped model name; TEXT: one tokenized sentence per line.

For "warm" and "zero" the same sentences are embedded twice: in file order with batch size 64,
and shuffled with batch size 1. The vectors should not change at all (up to float rounding):
the script prints the largest absolute difference per layer.

For "stateful" (bilm-tf/AllenNLP behaviour) the same sentences are embedded in file order and in
a shuffled order, so each sentence follows different text: the script prints the mean and the
minimum cosine similarity, per layer, between a token's two vectors. It also prints how far each
mode's vectors are from the warm ones (mean cosine per layer).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

from elmokit import Embedder


def read_sentences(path: str, limit: int) -> list[list[str]]:
    sentences = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.split():
                sentences.append(line.split())
            if len(sentences) == limit:
                break
    return sentences


def embed(model: str, mode: str, sentences: list[list[str]], order: list[int], batch: int) -> list:
    """Vectors of ``sentences`` embedded in ``order``, returned in the original order."""
    embedder = Embedder(model, batch_size=batch, mode=mode)
    out: list = [None] * len(sentences)
    for i, array in zip(order, embedder.embed_sentences([sentences[i] for i in order])):
        out[i] = array
    return out


def cosines(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    """Per-token cosine similarity, (layers, tokens)."""
    x, y = np.concatenate(a, axis=1), np.concatenate(b, axis=1)
    dot = (x * y).sum(-1)
    return dot / np.maximum(np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1), 1e-12)


def max_difference(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    return np.abs(np.concatenate(a, axis=1) - np.concatenate(b, axis=1)).max(axis=(1, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("text")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args()

    sentences = read_sentences(args.text, args.sentences)
    in_order = list(range(len(sentences)))
    shuffled = in_order[:]
    random.Random(args.seed).shuffle(shuffled)
    n_tokens = sum(map(len, sentences))
    print(f"{len(sentences)} sentences, {n_tokens:,} tokens of {args.text}; model {args.model}")

    report: dict = {"model": args.model, "text": args.text, "sentences": len(sentences)}
    runs = {}
    for mode in ("warm", "zero"):
        runs[mode] = embed(args.model, mode, sentences, in_order, 64)
        again = embed(args.model, mode, sentences, shuffled, 1)
        diff = max_difference(runs[mode], again)
        report[f"{mode}_max_abs_difference"] = diff.tolist()
        print(f"{mode:>8}: order and batch size changed, max |difference| per layer: "
              + "  ".join(f"{d:.1e}" for d in diff))
    runs["stateful"] = embed(args.model, "stateful", sentences, in_order, 64)
    again = embed(args.model, "stateful", sentences, shuffled, 64)
    cos = cosines(runs["stateful"], again)
    report["stateful_cosine_mean"] = cos.mean(1).tolist()
    report["stateful_cosine_min"] = cos.min(1).tolist()
    print("stateful: order changed, cosine per layer, mean (min): "
          + "  ".join(f"{m:.4f} ({lo:.4f})" for m, lo in zip(cos.mean(1), cos.min(1))))
    for mode in ("zero", "stateful"):
        cos = cosines(runs[mode], runs["warm"])
        report[f"{mode}_vs_warm_cosine_mean"] = cos.mean(1).tolist()
        print(f"{mode:>8} vs warm: mean cosine per layer: " + "  ".join(f"{m:.4f}" for m in cos.mean(1)))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
