"""Held-out perplexity with bilm-tf's test protocol (``bilm/training.py:test``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from .data import heldout_batches
from .language_model import LanguageModel, batch_tensors
from .lstm import LstmState

PERPLEXITY_PROTOCOL = (
    "bilm-tf test protocol: full softmax, batch {batch_size} streams, unroll_steps=1 with the LSTM "
    "state carried through the held-out stream (computed {window} steps at a time, which is "
    "identical), no shuffling, last partial batch dropped"
)


@dataclass
class Perplexity:
    forward: float
    backward: float
    average: float  # exp(mean of 0.5 * (L_fwd + L_bwd)): bilm-tf's figure, the geometric mean
    arithmetic_mean: float  # 0.5 * (forward + backward)
    tokens: int  # predictions per direction
    protocol: str


def _grouped(batches: Iterable[dict[str, np.ndarray]], window: int) -> Iterator[dict[str, np.ndarray]]:
    """Concatenate ``window`` consecutive batches along time (each row is one continuous stream,
    so this is the same stream in longer windows)."""
    group: list[dict[str, np.ndarray]] = []
    for batch in batches:
        group.append(batch)
        if len(group) == window:
            yield {k: np.concatenate([b[k] for b in group], axis=1) for k in group[0]}
            group = []
    if group:
        yield {k: np.concatenate([b[k] for b in group], axis=1) for k in group[0]}


@torch.no_grad()
def evaluate_perplexity(
    model: LanguageModel,
    vocab: Any,
    files: Any,
    batch_size: int = 256,
    window: int = 20,
    device: str | torch.device = "cpu",
    chunk_rows: int = 512,
    progress: bool = False,
) -> Perplexity:
    """Forward, backward and average perplexity of held-out text (a glob or files) with the full
    softmax; ``chunk_rows`` positions' logits over the vocabulary at a time."""
    model = model.to(device).eval()
    max_chars = model.bilm.options.char_cnn.max_characters_per_token
    data = heldout_batches(
        files, vocab, batch_size=batch_size, unroll_steps=1, max_characters_per_token=max_chars
    )
    totals = torch.zeros(2, dtype=torch.float64)
    count = 0
    state: LstmState | None = None
    for batch in tqdm(_grouped(data, window), disable=not progress, unit="window"):
        chars, targets = batch_tensors(batch, device)
        hidden, state = model.hidden_states(chars, state)
        totals += model.position_losses(hidden, targets, chunk_rows).double().flatten(1).sum(1).cpu()
        count += targets[0].numel()
    if count == 0:
        raise ValueError(f"held-out data too small: fewer sentences than one batch of {batch_size} streams")
    mean = totals / count
    return Perplexity(
        forward=math.exp(mean[0]),
        backward=math.exp(mean[1]),
        average=math.exp(0.5 * (mean[0] + mean[1])),
        arithmetic_mean=0.5 * (math.exp(mean[0]) + math.exp(mean[1])),
        tokens=count,
        protocol=PERPLEXITY_PROTOCOL.format(batch_size=batch_size, window=window),
    )
