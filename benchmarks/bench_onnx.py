"""The onnxruntime backend and its int8 graph against PyTorch, interleaved in one process.

    python benchmarks/bench_onnx.py --sentences FILE [--shape small] [--threads 2]
        [--n-sentences 200] [--rounds 5] [--cosine-model elmo-news-512] [--json OUT]

For a random model of a published shape (speed does not depend on the weights), three Embedders
on the same model: ``torch`` (float32, the default path), ``onnxruntime`` (float32, the exported
graph) and ``int8`` (the graph with int8 matmuls). Each round runs every variant once on the same
sentences, in turn, at batch 1 (one sentence per call, ``embed_sentence``) and at batch 64
(``embed_sentences``); the median over the rounds is reported in tokens/s, with the load average
before and after. With ``--cosine-model``, also the accuracy of int8 on a real model: per layer, the
mean and minimum cosine of each token's int8 vector to its float32 vector on the sentences.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from bench_bilm import read_sentences
from common import start_cold

from elmokit import Embedder
from elmokit.base import kernels
from elmokit.model.bilm import BiLM
from elmokit.model.options import preset

VARIANTS = {
    "torch": {},
    "onnxruntime": {"backend": "onnxruntime"},
    "int8": {"backend": "onnxruntime", "dtype": "int8"},
}


def _batch1(embedder: Embedder, sentences: list[list[str]]) -> Callable[[], None]:
    def run() -> None:
        for sentence in sentences:
            embedder.embed_sentence(sentence)

    return run


def _batch64(embedder: Embedder, sentences: list[list[str]]) -> Callable[[], None]:
    def run() -> None:
        for _ in embedder.embed_sentences(sentences):
            pass

    return run


def speed(
    bilm: BiLM, sentences: list[list[str]], rounds: int, variants: dict[str, dict[str, str]] = VARIANTS
) -> dict[str, dict[str, float]]:
    """Median tokens/s of every variant at batch 1 and batch 64, interleaved round by round.
    A variant is Embedder keyword arguments by name, and optionally ``disable`` (a comma list
    of kernels turned off while it runs). Every run starts with empty token caches (emptied and
    checked empty), so a cache serves only the repeats within one pass over the sentences."""
    tokens = sum(len(s) for s in sentences)
    embedders, disabled = {}, {}
    for name, options in variants.items():
        kw = {k: v for k, v in options.items() if k != "disable"}
        embedders[name] = Embedder(bilm, batch_size=64, mode="zero", **kw)
        disabled[name] = [k for k in options.get("disable", "").split(",") if k]
    runs = {
        (name, label): make(embedder, sentences)
        for name, embedder in embedders.items()
        for label, make in (("batch1", _batch1), ("batch64", _batch64))
    }

    def timed(name: str, run: Callable[[], None]) -> float:
        start_cold(embedders[name].bilm, f"a run of {name}")
        with kernels.disabled(*disabled[name]) if disabled[name] else contextlib.nullcontext():
            start = time.perf_counter()
            run()
            return time.perf_counter() - start

    for (name, _), run in runs.items():  # warm-up
        timed(name, run)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(rounds):
        for key, run in runs.items():
            times[key].append(timed(key[0], run))
    result: dict[str, dict[str, float]] = {}
    for (name, label), seconds in times.items():
        result.setdefault(name, {})[label] = tokens / statistics.median(seconds)
    return result


def token_cosines(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """(num_layers, tokens, dim) twice -> (num_layers, tokens): each token vector's cosine."""
    norms = np.linalg.norm(reference, axis=-1) * np.linalg.norm(other, axis=-1)
    return (reference * other).sum(-1) / norms


def cosines(model: str, sentences: list[list[str]]) -> dict[str, list[float]]:
    """Per layer, the mean and minimum cosine of int8 token vectors to float32 ones."""
    from elmokit import BiLM

    bilm = BiLM.from_pretrained(model)
    float32 = np.concatenate(list(Embedder(bilm).embed_sentences(sentences)), axis=1)
    int8 = Embedder(bilm, backend="onnxruntime", dtype="int8").embed_sentences(sentences)
    quantized = np.concatenate(list(int8), axis=1)
    cos = token_cosines(float32, quantized)
    return {"mean": cos.mean(axis=1).tolist(), "min": cos.min(axis=1).tolist(), "tokens": int(cos.shape[1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sentences", required=True, help="text file, one whitespace-tokenized sentence a line")
    p.add_argument("--shape", default="small", help="a preset: tiny, small, medium, original")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-sentences", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
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
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": os.getloadavg(),
    }
    torch.manual_seed(0)
    bilm = BiLM(preset(args.shape)).eval()
    report["tokens_per_second"] = speed(bilm, sentences, args.rounds)
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
