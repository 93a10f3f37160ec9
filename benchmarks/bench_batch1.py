"""Where one sentence per call goes: the call against the matmuls it cannot avoid.

    python benchmarks/bench_batch1.py --sentences FILE [--shape small] [--n-sentences 200]
        [--threads 2] [--repeats 300]

With random weights in a published shape, times (each repeated in a loop, so with warm caches
as in a stream of calls):
- the token encoder (char CNN, highway, projection) on as many distinct tokens as the mean
  sentence has (``BiLM.token_encoder.encode_unique``);
- one LSTM step of each layer: the recurrent matmul of both directions and the projection, with
  the layer's own weights (at batch 1 these read the layer's weights once per step);
- ``Embedder.embed_sentence`` on the sentences, one call each.
and prints the time per sentence of each part, the rest (elementwise work, the input side of the
gates, Python), and the tokens/s the matmuls alone would allow.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from bench_bilm import read_sentences

import elmokit
from elmokit.model.options import preset


def per_call(fn: Callable[[], object], repeats: int) -> float:
    """Seconds per call of ``fn`` after a warm-up."""
    for _ in range(max(repeats // 10, 3)):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def layer_step(layer: torch.nn.Module) -> Callable[[], None]:
    """One batch-1 step's matmuls of a ``BiLstmLayer``, both directions: the recurrent one
    (h -> gates) and the projection, with the layer's own weights."""
    w_hidden, w_proj = layer.weight_hidden, layer.weight_projection
    h = torch.randn(2, 1, w_hidden.shape[1])
    gates_in = torch.randn(2, 1, w_hidden.shape[2])
    gates = torch.empty_like(gates_in)
    m = torch.randn(2, 1, w_hidden.shape[2] // 4)
    h_out = torch.empty(2, 1, w_hidden.shape[1])

    def step() -> None:
        torch.baddbmm(gates_in, h, w_hidden, out=gates)
        if w_proj is not None:
            torch.bmm(m, w_proj, out=h_out)

    return step


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sentences", required=True, help="text file, one whitespace-tokenized sentence a line")
    p.add_argument("--shape", default="small", help="preset: small, medium or original (default small)")
    p.add_argument("--n-sentences", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=300, help="calls per timed part (default 300)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    bilm = elmokit.BiLM(preset(args.shape)).eval()
    sentences = read_sentences(args.sentences, args.n_sentences)
    tokens = sum(len(s) for s in sentences)
    mean_len = tokens / len(sentences)
    mean_distinct = sum(len(set(s)) for s in sentences) / len(sentences)

    embedder = elmokit.Embedder(bilm)
    for s in sentences[:10]:
        embedder.embed_sentence(s)
    start = time.perf_counter()
    for s in sentences:
        embedder.embed_sentence(s)
    call = (time.perf_counter() - start) / len(sentences)

    distinct = sorted({t for s in sentences for t in s})[: round(mean_distinct)]
    ids = bilm.token_ids(distinct)
    with torch.inference_mode():
        encoder = per_call(lambda: bilm.token_encoder.encode_unique(ids), max(args.repeats // 10, 10))
        steps = [per_call(layer_step(layer), args.repeats) for layer in bilm.lstm.layers]
    # <S> and </S> make each direction run len + 1 steps
    lstm = sum(steps) * (mean_len + 1)
    matrices = [w for lay in bilm.lstm.layers for w in (lay.weight_hidden, lay.weight_projection)]
    weights_mb = sum(w.numel() * w.element_size() for w in matrices if w is not None) / 2**20
    print(
        f"{args.shape}, {args.threads} threads, {len(sentences)} sentences, {mean_len:.1f} tokens "
        f"({mean_distinct:.1f} distinct) a sentence"
    )
    rate = mean_len / call
    print(f"embed_sentence:                  {1000 * call:7.2f} ms a sentence ({rate:,.0f} tok/s)")
    print(f"token encoder, distinct tokens:  {1000 * encoder:7.2f} ms")
    print(
        f"LSTM matmuls, {len(steps)} layers x {mean_len + 1:.1f} steps: {1000 * lstm:7.2f} ms "
        f"({', '.join(f'{1e6 * s:.0f}' for s in steps)} us a step; {weights_mb:.1f} MB of recurrent "
        "and projection weights read each step)"
    )
    rest = call - encoder - lstm
    print(f"rest (elementwise, input side, Python): {1000 * rest:7.2f} ms")
    print(f"matmuls alone would allow {mean_len / (encoder + lstm):,.0f} tok/s")


if __name__ == "__main__":
    main()
