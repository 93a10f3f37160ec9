"""What torch.compile gains: eager against compiled ``BiLM``, ``elmokit.Elmo`` and the
AllenNLP-compatible ``Elmo``, the same batches, the same process.

    python benchmarks/bench_compile.py [--model elmo-news-512] [--batch 32] [--threads 2]
        [--repeats 10] [--device cpu]

Each model is timed eager, then compiled (``torch.compile`` with its defaults; the token cache
steps aside while it traces, so the compiled model runs without it) on ``--batch`` sentences of
the fixed text below, cycled; the first compiled call (the compile itself) is reported apart,
and 3 more calls run untimed (a recompile on the second call is normal).
Prints milliseconds per batch (the fastest of ``--repeats`` calls), the speed-up, and the largest
difference between eager and compiled outputs. Compare runs only on the same machine.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import elmokit
from elmokit.compat import allennlp as compat

TEXT = (
    "The cat sat on the mat . She went to the bank to withdraw money . Prices rose sharply in "
    "the first quarter as demand for steel grew . He said the plan would be ready by Friday ."
).split(" . ")


def sentences(n: int) -> list[list[str]]:
    """``n`` tokenized sentences of 6 to 14 tokens, cycling through TEXT."""
    return [(TEXT[i % len(TEXT)] + " .").split() for i in range(n)]


def best_ms(fn: Callable[[], torch.Tensor], repeats: int, device: torch.device) -> float:
    """The fastest of ``repeats`` timed calls (the least disturbed by other processes on a
    shared machine), after 3 untimed ones (a compiled model may recompile on its second call)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="elmo-news-512")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ids = elmokit.batch_to_ids(sentences(args.batch)).to(device)

    bilm = elmokit.BiLM.from_pretrained(args.model).to(device)
    elmo = elmokit.Elmo(args.model, num_output_representations=1, dropout=0.0).to(device).eval()
    allen = compat.Elmo(args.model, None, 1, dropout=0.0).to(device).eval()
    allen._elmo_lstm._elmo_lstm.stateful = False  # the same input each call: the same numbers

    def outputs(model: Callable, pick: Callable) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            with torch.inference_mode():
                return pick(model(ids))

        return run

    print(
        f"model {args.model}, batch {args.batch} sentences ({tuple(ids.shape)}), {args.threads} threads, "
        f"{device}, torch {torch.__version__}"
    )
    header = ("model", "eager ms", "compiled ms", "speed-up", "compile s", "max |diff|")
    print(f"{header[0]:<14} " + " ".join(f"{h:>{w}}" for h, w in zip(header[1:], (9, 12, 9, 10, 11))))
    models = (
        ("BiLM", bilm, lambda out: out.layers),
        ("elmokit.Elmo", elmo, lambda out: out.representations[0]),
        ("compat.Elmo", allen, lambda out: out["elmo_representations"][0]),
    )
    for name, model, pick in models:
        eager = outputs(model, pick)
        reference = eager()
        eager_ms = best_ms(eager, args.repeats, device)
        torch._dynamo.reset()
        compiled = outputs(torch.compile(model), pick)
        start = time.perf_counter()
        first = compiled()
        compile_s = time.perf_counter() - start
        compiled_ms = best_ms(compiled, args.repeats, device)
        diff = (first - reference).abs().max().item()
        print(
            f"{name:<14} {eager_ms:>9.1f} {compiled_ms:>12.1f} {eager_ms / compiled_ms:>8.2f}x "
            f"{compile_s:>10.1f} {diff:>11.1e}"
        )


if __name__ == "__main__":
    main()
