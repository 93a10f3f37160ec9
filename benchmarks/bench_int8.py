"""int8 on the PyTorch path (``Embedder(dtype="int8")``) against float32, interleaved in one process.

    python benchmarks/bench_int8.py --sentences FILE [--shape small] [--threads 2]
        [--n-sentences 200] [--rounds 5] [--onnx] [--json OUT]
    python benchmarks/bench_int8.py --sentences FILE --cosine-model elmo-news-512 \\
        --n-sentences 1000 --rounds 0

Speed: for a random model of a published shape (speed does not depend on the weights), Embedders
on the same model: ``float32`` (the default path), ``int8`` (``elmokit.model.int8``), the int8 form
with its LSTM steps run by Python (the kernel ``lstm_scripted`` off) and, with ``--onnx``,
onnxruntime's float32 and int8 graphs. Each round runs every variant once on the same sentences, in turn, at
batch 1 (one sentence per call, ``embed_sentence``) and at batch 64 (``embed_sentences``), each
pass with empty token caches; the median over the rounds is reported in tokens/s, with the load
average before and after, and the ratios of int8 to the others. ``--rounds 0`` skips the speed
part.

Accuracy, with ``--cosine-model``: per layer, the mean and minimum cosine of each token's int8
vector to its float32 vector on the sentences (warm mode, batches of 64, as ``embed`` runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
import torch
from bench_bilm import read_sentences
from bench_onnx import speed, token_cosines

from elmokit import Embedder
from elmokit.model.bilm import BiLM
from elmokit.model.options import preset

VARIANTS: dict[str, dict[str, str]] = {
    "float32": {},
    "int8": {"dtype": "int8"},
    # the int8 model with its LSTM steps run by Python: what the kernel lstm_scripted gives
    "int8, steps in Python": {"dtype": "int8", "disable": "lstm_scripted"},
}
ONNX_VARIANTS = {
    "onnxruntime float32": {"backend": "onnxruntime"},
    "onnxruntime int8": {"backend": "onnxruntime", "dtype": "int8"},
}


def cosines(model: str, sentences: list[list[str]]) -> dict[str, object]:
    """Per layer, the mean and minimum cosine of int8 token vectors to float32 ones, with the
    sentences in batches of 64 (as ``embed`` runs) and one per call (activations are quantized
    per call, so int8 vectors depend slightly on the batch)."""
    bilm = BiLM.from_pretrained(model)
    float32 = np.concatenate(list(Embedder(bilm, device="cpu").embed_sentences(sentences)), axis=1)
    result: dict[str, object] = {"model": model, "tokens": int(float32.shape[1])}
    for batch_size in (64, 1):
        embedder = Embedder(bilm, dtype="int8", batch_size=batch_size)
        int8 = np.concatenate(list(embedder.embed_sentences(sentences)), axis=1)
        cos = token_cosines(float32, int8)
        result[f"batch {batch_size}"] = {
            "mean": [round(float(x), 5) for x in cos.mean(axis=1)],
            "min": [round(float(x), 4) for x in cos.min(axis=1)],
        }
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sentences", required=True, help="text file, one whitespace-tokenized sentence a line")
    p.add_argument("--shape", default="small", help="a preset: tiny, small, medium, original")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-sentences", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5, help="0: no speed measurement")
    p.add_argument("--onnx", action="store_true", help="also onnxruntime's float32 and int8 graphs")
    p.add_argument("--cosine-model", help="also measure int8's cosine to float32 on this model")
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    sentences = read_sentences(args.sentences, args.n_sentences)
    report: dict = {
        "shape": args.shape,
        "threads": args.threads,
        "sentences": len(sentences),
        "tokens": sum(len(s) for s in sentences),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "torch": torch.__version__,
        "quantized_engine": torch.backends.quantized.engine,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": os.getloadavg(),
    }
    if args.rounds > 0:
        torch.manual_seed(0)
        bilm = BiLM(preset(args.shape)).eval()
        variants = {**VARIANTS, **(ONNX_VARIANTS if args.onnx else {})}
        result = speed(bilm, sentences, args.rounds, variants)
        result = {name: {k: round(v, 1) for k, v in rates.items()} for name, rates in result.items()}
        labels = ("batch1", "batch64")
        for other in ("float32", "int8, steps in Python"):
            result[f"int8 / {other}"] = {x: round(result["int8"][x] / result[other][x], 3) for x in labels}
        report["tokens_per_second"] = result
        report["load_after"] = os.getloadavg()
    if args.cosine_model:
        report["int8_cosine"] = cosines(args.cosine_model, sentences)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
