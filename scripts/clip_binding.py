"""How often a model's LSTM clips bind on real text: the cell clip and the projection clip.

    python scripts/clip_binding.py --model MODEL --sentences FILE [--n-sentences 1000]
        [--batch-size 64] [--mode warm] [--json OUT]

MODEL: a shipped model's name or a model folder; FILE: one whitespace-tokenized sentence a line.
The model runs its plain LSTM steps (``BiLstmLayer._step``: the kernel ``lstm_inplace`` off,
float32, CPU) over the first N non-empty lines of FILE in batches of ``--batch-size``, in file
order, from its start state (``--mode warm``) or from zeros (``--mode zero``). After every step
each cell value and each projected output is compared with its clip: a value past a clip becomes
the clip, so ``|value| == clip`` is the clip binding. Printed for each layer and direction:

- the share of values at the clip;
- the share of token steps (a sentence's step, ``<S>`` and ``</S>`` included) with at least one
  value at the clip;
- the largest ``|value|`` seen, which is the clip where it binds.

Why: cuDNN's LSTM (``torch.nn.LSTM`` with ``proj_size``) has neither clip. On text where neither
binds, it computes what the clipped cell computes; where one binds, it does not.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from elmokit.base import kernels
from elmokit.base.textfiles import read_lines
from elmokit.model.bilm import BiLM
from elmokit.model.lstm import BiLstmLayer

DIRECTIONS = ("forward", "backward")


class Tally:
    """One clip's counts, per layer and direction (layers, 2): values seen, values at the clip,
    token steps with at least one value at it, and the largest |value|."""

    def __init__(self, n_layers: int) -> None:
        self.values, self.at_clip, self.steps_at_clip, self.max_abs = (
            torch.zeros(n_layers, 2, dtype=torch.float64) for _ in range(4)
        )

    def add(self, k: int, values: torch.Tensor, clip: float | None) -> None:
        """Count one step's values (2, n, dim) of layer ``k``."""
        at = values.abs() >= clip if clip is not None else torch.zeros_like(values, dtype=torch.bool)
        self.values[k] += values[0].numel()
        self.at_clip[k] += at.sum(dim=(1, 2))
        self.steps_at_clip[k] += at.any(dim=-1).sum(dim=-1)
        self.max_abs[k] = torch.maximum(self.max_abs[k], values.abs().amax(dim=(1, 2)).double())

    def record(self, name: str, k: int, d: int, steps: float) -> dict[str, float]:
        """The shares and the largest |value| of layer ``k``, direction ``d``, keys ``name_...``."""
        return {
            f"{name}_values_at_clip": float(self.at_clip[k, d]) / max(float(self.values[k, d]), 1.0),
            f"{name}_steps_at_clip": float(self.steps_at_clip[k, d]) / max(steps, 1.0),
            f"{name}_max_abs": round(float(self.max_abs[k, d]), 4),
        }


@dataclass
class ClipCounts:
    """Token steps seen per layer and direction (layers, 2), and a tally of each clip."""

    steps: torch.Tensor
    cell: Tally
    output: Tally


@contextmanager
def counting(bilm: BiLM) -> Iterator[ClipCounts]:
    """Within the block, every plain LSTM step of ``bilm``'s layers is counted into the result;
    ``BiLstmLayer._step`` is restored after it."""
    layers = list(bilm.lstm.lstm_layers)
    index = {id(layer): k for k, layer in enumerate(layers)}
    counts = ClipCounts(
        torch.zeros(len(layers), 2, dtype=torch.float64), Tally(len(layers)), Tally(len(layers))
    )
    original = BiLstmLayer._step

    def step(
        self: BiLstmLayer, projected: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, c = original(self, projected, h, c)
        k = index.get(id(self))
        if k is not None:
            counts.steps[k] += c.shape[1]
            counts.cell.add(k, c, self.cell_clip)
            counts.output.add(k, h, self.proj_clip)
        return h, c

    BiLstmLayer._step = step  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        BiLstmLayer._step = original  # type: ignore[method-assign]


def clip_binding(bilm: BiLM, sentences: list[list[str]], batch_size: int, mode: str) -> list[dict]:
    """One record per layer and direction (see the module docstring)."""
    model = bilm.to(device="cpu", dtype=torch.float32).eval()
    with counting(model) as counts, kernels.disabled("lstm_inplace"), torch.inference_mode():
        for start in range(0, len(sentences), batch_size):
            batch = sentences[start : start + batch_size]
            model(model.batch_to_ids(batch), None if mode == "warm" else "zero")
    records = []
    for k, layer in enumerate(model.lstm.lstm_layers):
        for d, direction in enumerate(DIRECTIONS):
            steps = float(counts.steps[k, d])
            records.append(
                {
                    "layer": k + 1,
                    "direction": direction,
                    "token_steps": int(steps),
                    "cell_clip": layer.cell_clip,
                    **counts.cell.record("cell", k, d, steps),
                    "proj_clip": layer.proj_clip,
                    **counts.output.record("output", k, d, steps),
                }
            )
    return records


def read_sentences(path: str, limit: int) -> list[list[str]]:
    """The first ``limit`` non-empty lines of ``path``, split on whitespace."""
    lines = (line.split() for line in read_lines(path))
    return list(itertools.islice((tokens for tokens in lines if tokens), limit))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a shipped model's name or a model folder")
    p.add_argument("--sentences", required=True, help="text file, one whitespace-tokenized sentence a line")
    p.add_argument("--n-sentences", type=int, default=1000, help="the first N non-empty lines")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--mode", choices=("warm", "zero"), default="warm", help="start state, or zeros")
    p.add_argument("--json", help="also write the records to this file")
    args = p.parse_args(argv)
    if args.n_sentences < 1 or args.batch_size < 1:
        print("clip_binding.py: error: --n-sentences and --batch-size must be at least 1", file=sys.stderr)
        return 2
    try:
        sentences = read_sentences(args.sentences, args.n_sentences)
        bilm = BiLM.from_pretrained(args.model)
    except (OSError, ValueError) as error:
        print(f"clip_binding.py: error: {error}", file=sys.stderr)
        return 2
    if not sentences:
        print(f"clip_binding.py: error: {args.sentences} has no sentence", file=sys.stderr)
        return 2
    records = clip_binding(bilm, sentences, args.batch_size, args.mode)
    tokens = sum(len(s) for s in sentences)
    print(f"{args.model}: {len(sentences)} sentences, {tokens} tokens, mode {args.mode}")
    print("layer direction   cell clip: values / steps at it, max |c|", end="")
    print("   projection clip: values / steps at it, max |h|")
    for r in records:
        print(
            f"{r['layer']:>5} {r['direction']:<9}   {r['cell_clip']}: {r['cell_values_at_clip']:.2e} / "
            f"{r['cell_steps_at_clip']:.2e}, {r['cell_max_abs']}   {r['proj_clip']}: "
            f"{r['output_values_at_clip']:.2e} / {r['output_steps_at_clip']:.2e}, {r['output_max_abs']}"
        )
    if args.json:
        report = {
            "model": args.model,
            "sentences_file": Path(args.sentences).name,
            "sentences": len(sentences),
            "tokens": tokens,
            "mode": args.mode,
            "batch_size": args.batch_size,
            "torch": torch.__version__,
            "layers": records,
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
