"""Inference speed on a CUDA GPU, in the published model shapes (random weights), float32 and bfloat16.

    python benchmarks/bench_gpu.py --sentences FILE [--shapes small,original]
        [--batch-sizes 64,1] [--dtypes float32,bfloat16] [--n-sentences 1024] [--time-budget 8]
        [--device cuda] [--profile N] [--compare-kernel NAME [--repeats 2]] [--json OUT]

For each (shape, batch size, dtype) two figures over the first N non-empty lines of FILE
(whitespace tokens), after one untimed batch:

- ``embed``: ``Embedder(model, batch_size=B, mode="zero", dtype=...).embed_sentences`` (random
  weights have no start state; warm mode costs the same), the whole path a user calls: char
  ids, batching, the token cache, the LSTMs, the vectors copied back to numpy (which waits for
  the GPU).
- ``bilm``: ``BiLM.forward`` alone (the Embedder's copy of the model, in its dtype) on char ids
  already on the GPU, timed with ``torch.cuda.synchronize`` around each batch.

Also printed: the largest GPU memory allocated, and for float32 the relative error of the
embed path's vectors against the CPU's on the first 64 sentences (||gpu - cpu|| / ||cpu||, all
layers), for bfloat16 the minimum cosine of its vectors to float32 on the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch
from bench_bilm import read_sentences
from common import shown_command, synchronize

import elmokit
from elmokit.base import kernels
from elmokit.embed.embedder import Embedder
from elmokit.model.options import preset


def embed_rate(embedder: Embedder, sentences: list[list[str]], budget: float) -> tuple[float, int]:
    """tokens/s of embed_sentences over whole batches until ``budget`` s pass; sentences done."""
    size = embedder.batch_size
    list(embedder.embed_sentences(sentences[:size]))  # warm-up: kernels, cuBLAS handles
    tokens, done, start = 0, 0, time.perf_counter()
    for i in range(0, len(sentences), size):
        chunk = sentences[i : i + size]
        list(embedder.embed_sentences(chunk))
        tokens, done = tokens + sum(len(s) for s in chunk), done + len(chunk)
        if time.perf_counter() - start >= budget:
            break
    return tokens / (time.perf_counter() - start), done


@torch.inference_mode()
def bilm_rate(model: elmokit.BiLM, sentences: list[list[str]], size: int, budget: float) -> float:
    """tokens/s of BiLM.forward alone (weights in the Embedder's dtype), char ids already on the device."""
    device = next(model.parameters()).device
    batches = [sentences[i : i + size] for i in range(0, len(sentences), size)]
    ids = [elmokit.batch_to_ids(b).to(device) for b in batches]
    model(ids[0])  # warm-up
    synchronize(device)
    tokens, elapsed = 0, 0.0
    for batch, x in zip(batches, ids):
        start = time.perf_counter()
        model(x)
        synchronize(device)
        elapsed += time.perf_counter() - start
        tokens += sum(len(s) for s in batch)
        if elapsed >= budget:
            break
    return tokens / elapsed


def profile_embed(embedder: Embedder, sentences: list[list[str]], device: torch.device) -> None:
    """Print the ops of ``embed_sentences`` over these sentences that take the most self CPU
    time and the most self device time (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for i in range(0, len(sentences), embedder.batch_size):
            list(embedder.embed_sentences(sentences[i : i + embedder.batch_size]))
    print(f"profile: {len(sentences)} sentences in {time.perf_counter() - start:.3f} s (profiled)")
    columns = ["self_cpu_time_total"] + (["self_device_time_total"] if device.type == "cuda" else [])
    for column in columns:
        print(prof.key_averages().table(sort_by=column, row_limit=12, max_name_column_width=40))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sentences", required=True, help="text file, one tokenized sentence a line")
    p.add_argument("--shapes", default="small,original")
    p.add_argument("--batch-sizes", default="64,1")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--n-sentences", type=int, default=1024)
    p.add_argument("--time-budget", type=float, default=8.0, help="seconds per figure (default 8)")
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after timing, torch.profiler over N batches of the embed path: top ops",
    )
    p.add_argument(
        "--compare-kernel",
        metavar="NAME",
        help="also time the embed path with this kernel off, in turn with on (--repeats pairs)",
    )
    p.add_argument("--repeats", type=int, default=2, help="on/off pairs for --compare-kernel (default 2)")
    p.add_argument("--json", help="also write the results as JSON to this file")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_gpu: no CUDA GPU on this machine")
    command = shown_command("bench_gpu.py", sys.argv[1:] if argv is None else argv)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"command: {command}\n{name}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    sentences = read_sentences(args.sentences, args.n_sentences)
    results: list[dict[str, Any]] = []
    for shape in [s for s in args.shapes.split(",") if s]:
        torch.manual_seed(0)
        cpu_model = elmokit.BiLM(preset(shape))
        check = sentences[:64]
        reference = np.concatenate(list(Embedder(cpu_model, device="cpu").embed_sentences(check)), 1)
        for dtype in [d for d in args.dtypes.split(",") if d]:
            for size in [int(b) for b in args.batch_sizes.split(",")]:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                embedder = Embedder(cpu_model, batch_size=size, device=device, dtype=dtype, mode="zero")
                got = np.concatenate(list(embedder.embed_sentences(check)), 1)
                if dtype == "float32":
                    accuracy = {
                        "relative_error_to_cpu": float(
                            np.linalg.norm(got - reference) / np.linalg.norm(reference)
                        )
                    }
                else:
                    exact = Embedder(cpu_model, batch_size=size, device=device, mode="zero")
                    exact_vectors = np.concatenate(list(exact.embed_sentences(check)), 1)
                    cosine = torch.nn.functional.cosine_similarity(
                        torch.from_numpy(got), torch.from_numpy(exact_vectors), dim=-1
                    )
                    accuracy = {"min_cosine_to_fp32": float(cosine.min())}
                embed_tps, done = embed_rate(embedder, sentences, args.time_budget)
                comparison = {}
                if args.compare_kernel:  # on, off, on, off, ... in this process
                    rates: dict[str, list[float]] = {"on": [], "off": []}
                    for _ in range(args.repeats):
                        rates["on"].append(embed_rate(embedder, sentences, args.time_budget)[0])
                        with kernels.disabled(args.compare_kernel):
                            rates["off"].append(embed_rate(embedder, sentences, args.time_budget)[0])
                    on, off = (float(np.median(rates[k])) for k in ("on", "off"))
                    comparison = {"kernel": args.compare_kernel, "on": on, "off": off, "gain": on / off - 1}
                bilm_tps = bilm_rate(embedder.bilm, sentences, size, args.time_budget)
                result = {
                    "shape": shape,
                    "batch_size": size,
                    "dtype": dtype,
                    "embed_tokens_per_s": embed_tps,
                    "bilm_tokens_per_s": bilm_tps,
                    "sentences": done,
                    "peak_gpu_mb": torch.cuda.max_memory_allocated(device) / 2**20
                    if device.type == "cuda"
                    else 0,
                    **accuracy,
                    **comparison,
                }
                results.append(result)
                print(json.dumps(result), flush=True)
                if args.profile:
                    profile_embed(embedder, sentences[: args.profile * size], device)
                del embedder
    header = (
        f"{'shape':<9} {'batch':>5} {'dtype':<9} {'embed tok/s':>11} {'BiLM tok/s':>11} "
        f"{'GPU MB':>7}  accuracy"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        accuracy = (
            f"rel. error to CPU {r['relative_error_to_cpu']:.1e}"
            if "relative_error_to_cpu" in r
            else f"min cosine to fp32 {r['min_cosine_to_fp32']:.5f}"
        )
        print(
            f"{r['shape']:<9} {r['batch_size']:>5} {r['dtype']:<9} {r['embed_tokens_per_s']:>11.0f} "
            f"{r['bilm_tokens_per_s']:>11.0f} {r['peak_gpu_mb']:>7.0f}  {accuracy}"
        )
    if args.compare_kernel:
        print(f"\nembed tokens/s with {args.compare_kernel} on and off (medians of {args.repeats} in turn):")
        for r in results:
            print(
                f"{r['shape']:<9} {r['batch_size']:>5} {r['dtype']:<9} on {r['on']:>8.0f}  off "
                f"{r['off']:>8.0f}  gain {100 * r['gain']:+.1f}%"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {"command": command, "device": name, "torch": torch.__version__, "results": results},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
