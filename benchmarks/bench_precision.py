"""bfloat16 against float32 inference: speed and how far the vectors move, on real text.

    python benchmarks/bench_precision.py --sentences FILE [--model elmo-news-512]
        [--n-sentences 512] [--batch-sizes 64,1] [--threads 2] [--pause-pid PID] [--json OUT]

Runs ``Embedder(model, batch_size=B, mode="warm", dtype=...)`` over the first N non-empty lines
of FILE (whitespace tokens), in float32 and in bfloat16, after one untimed warm-up sentence
taken from further down the file. tokens/s counts the sentences' tokens (the whole Embedder
path: batching, token cache, LSTMs, copying the vectors out). The accuracy columns compare every
token's vector of each layer: mean and minimum cosine similarity to float32, and the largest
absolute difference next to the largest absolute float32 value of that layer.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
from bench_bilm import read_sentences
from common import Pauser

from elmokit.embed.embedder import Embedder
from elmokit.hub import DEFAULT_MODEL


def embed(model: str, dtype: str, batch_size: int, sentences, warm_up) -> tuple[float, np.ndarray]:
    """tokens/s and all vectors (layers, tokens, dim) in float32."""
    embedder = Embedder(model, batch_size=batch_size, mode="warm", dtype=dtype)
    list(embedder.embed_sentences([warm_up]))
    start = time.perf_counter()
    arrays = list(embedder.embed_sentences(sentences))
    seconds = time.perf_counter() - start
    return sum(len(s) for s in sentences) / seconds, np.concatenate(arrays, axis=1)


def compare(exact: np.ndarray, approx: np.ndarray) -> list[dict[str, float]]:
    """Per layer: mean and min cosine, max |difference|, max |float32 value|."""
    a, b = torch.from_numpy(exact).double(), torch.from_numpy(approx).double()
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    return [
        {
            "mean_cosine": float(cosine[k].mean()),
            "min_cosine": float(cosine[k].min()),
            "max_abs_error": float((a[k] - b[k]).abs().max()),
            "max_abs_value": float(a[k].abs().max()),
        }
        for k in range(a.shape[0])
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sentences", required=True, help="text file, one tokenized sentence a line")
    p.add_argument("--model", default=DEFAULT_MODEL, help="shipped model name or model folder")
    p.add_argument("--n-sentences", type=int, default=512)
    p.add_argument("--batch-sizes", default="64,1")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pause-pid", type=int, help="SIGSTOP this process while measuring")
    p.add_argument("--json", help="also write the results as JSON to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    *sentences, warm_up = read_sentences(args.sentences, args.n_sentences + 1)
    command = shlex.join(["python", *sys.argv])  # no machine path in the record
    print(f"command: {command}")
    print(
        f"torch {torch.__version__}, {args.threads} threads, model {args.model}, "
        f"{len(sentences)} sentences, {sum(map(len, sentences)):,} tokens"
    )
    pauser = Pauser(args.pause_pid)
    results = []
    for size in [int(b) for b in args.batch_sizes.split(",")]:
        with pauser:
            fp32_rate, exact = embed(args.model, "float32", size, sentences, warm_up)
            bf16_rate, approx = embed(args.model, "bfloat16", size, sentences, warm_up)
        layers = compare(exact, approx)
        results.append(
            {
                "batch_size": size,
                "fp32_tokens_per_s": fp32_rate,
                "bf16_tokens_per_s": bf16_rate,
                "layers": layers,
            }
        )
        print(
            f"\nbatch {size}: float32 {fp32_rate:,.0f} tokens/s, bfloat16 {bf16_rate:,.0f} "
            f"tokens/s ({bf16_rate / fp32_rate:.2f}x)"
        )
        print("layer  mean cosine  min cosine  max |error|  max |value|")
        for k, m in enumerate(layers):
            print(
                f"{k:>5}  {m['mean_cosine']:>11.6f}  {m['min_cosine']:>10.6f}  "
                f"{m['max_abs_error']:>11.4f}  {m['max_abs_value']:>11.3f}"
            )
    print(pauser.summary())
    if args.json:
        report = {
            "command": command,
            "torch": torch.__version__,
            "threads": args.threads,
            "model": args.model,
            "paused_seconds": pauser.total,
            "results": results,
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
