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
from dataclasses import dataclass, field
from pathlib import Path

import torch

from elmokit import kernels
from elmokit.bilm import BiLM
from elmokit.lstm import BiLstmLayer
from elmokit.textfiles import read_lines

DIRECTIONS = ("forward", "backward")


@dataclass
class ClipCounts:
    """Per layer, per direction (2,): values and token steps seen, and those at each clip."""

    steps: list[torch.Tensor] = field(default_factory=list)
    cell_values: list[torch.Tensor] = field(default_factory=list)
    cell_at_clip: list[torch.Tensor] = field(default_factory=list)
    cell_steps_at_clip: list[torch.Tensor] = field(default_factory=list)
    cell_max: list[torch.Tensor] = field(default_factory=list)
    output_values: list[torch.Tensor] = field(default_factory=list)
    output_at_clip: list[torch.Tensor] = field(default_factory=list)
    output_steps_at_clip: list[torch.Tensor] = field(default_factory=list)
    output_max: list[torch.Tensor] = field(default_factory=list)


def _at(values: torch.Tensor, clip: float | None) -> torch.Tensor:
    """values (2, n, dim) -> (2, n, dim) bool: at the clip (never, without a clip)."""
    return values.abs() >= clip if clip is not None else torch.zeros_like(values, dtype=torch.bool)


@contextmanager
def counting(bilm: BiLM) -> Iterator[ClipCounts]:
    """Within the block, every plain LSTM step of ``bilm``'s layers is counted into the result;
    ``BiLstmLayer._step`` is restored after it."""
    layers = list(bilm.lstm.lstm_layers)
    index = {id(layer): k for k, layer in enumerate(layers)}
    counts = ClipCounts()
    for name in counts.__dataclass_fields__:
        getattr(counts, name).extend(torch.zeros(2, dtype=torch.float64) for _ in layers)
    original = BiLstmLayer._step

    def step(
        self: BiLstmLayer, projected: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, c = original(self, projected, h, c)
        k = index.get(id(self))
        if k is not None:
            cell, output = _at(c, self.cell_clip), _at(h, self.proj_clip)
            counts.steps[k] += c.shape[1]
            counts.cell_values[k] += c[0].numel()
            counts.cell_at_clip[k] += cell.sum(dim=(1, 2))
            counts.cell_steps_at_clip[k] += cell.any(dim=-1).sum(dim=-1)
            counts.cell_max[k] = torch.maximum(counts.cell_max[k], c.abs().amax(dim=(1, 2)).double())
            counts.output_values[k] += h[0].numel()
            counts.output_at_clip[k] += output.sum(dim=(1, 2))
            counts.output_steps_at_clip[k] += output.any(dim=-1).sum(dim=-1)
            counts.output_max[k] = torch.maximum(counts.output_max[k], h.abs().amax(dim=(1, 2)).double())
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
            steps, cells, outputs = counts.steps[k][d], counts.cell_values[k][d], counts.output_values[k][d]
            records.append(
                {
                    "layer": k + 1,
                    "direction": direction,
                    "token_steps": int(steps),
                    "cell_clip": layer.cell_clip,
                    "cell_values_at_clip": _share(counts.cell_at_clip[k][d], cells),
                    "cell_steps_at_clip": _share(counts.cell_steps_at_clip[k][d], steps),
                    "cell_max_abs": round(float(counts.cell_max[k][d]), 4),
                    "proj_clip": layer.proj_clip,
                    "output_values_at_clip": _share(counts.output_at_clip[k][d], outputs),
                    "output_steps_at_clip": _share(counts.output_steps_at_clip[k][d], steps),
                    "output_max_abs": round(float(counts.output_max[k][d]), 4),
                }
            )
    return records


def _share(count: torch.Tensor, total: torch.Tensor) -> float:
    return float(count) / max(float(total), 1.0)


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
