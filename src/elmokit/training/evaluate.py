"""Held-out perplexity with bilm-tf's test protocol (``bilm/training.py:test``), and what a start
state does for it (``compare_start_modes``: the stream, and each sentence alone from zero states
or from the start state)."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ..base.devices import resolve_device
from ..base.textfiles import read_lines
from ..lm.language_model import LanguageModel, batch_tensors
from ..lm.start_state import sentence_losses
from ..model.lstm import LstmState
from .data import corpus_files, heldout_batches, read_sentences

__all__: list[str] = []

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


def _positions(files: Any) -> int:
    """About how many positions each direction's stream of held-out text has (one per token and
    one per sentence boundary), read quickly: the total of the progress bar."""
    paths = corpus_files(files) if isinstance(files, (str, os.PathLike)) else [str(f) for f in files]
    count = 0
    for path in paths:
        for line in read_lines(path):
            n = len(line.split())
            count += n + 1 if n else 0
    return count


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
    softmax; ``chunk_rows`` positions' logits over the vocabulary at a time, computed in one
    scratch buffer that every chunk reuses. ``progress`` shows a bar of predictions per
    direction with its total (estimated from the text) and time left."""
    for name, value in (("batch_size", batch_size), ("window", window), ("chunk_rows", chunk_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")
    device = resolve_device(device)
    model = model.to(device).eval()
    max_chars = model.bilm.options.char_cnn.max_characters_per_token
    data = heldout_batches(
        files, vocab, batch_size=batch_size, unroll_steps=1, max_characters_per_token=max_chars
    )
    softmax = model.softmax
    if softmax is None:
        raise ValueError("this LanguageModel has no softmax (it was made without a vocab_size)")
    weight = softmax.weight
    scratch = weight.new_empty(2, min(chunk_rows, batch_size * window), weight.shape[0])
    totals = torch.zeros(2, dtype=torch.float64)
    count = 0
    state: LstmState | None = None
    total = _positions(files) if progress else None
    with tqdm(total=total, disable=not progress, unit="tok", unit_scale=True, file=sys.stderr) as bar:
        for batch in _grouped(data, window):
            chars, targets = batch_tensors(batch, device)
            hidden, state = model.hidden_states(chars, state)
            for d in range(2):  # (batch, steps, dim) -> losses of every position
                rows = hidden[d].reshape(-1, hidden.shape[-1])
                totals[d] += softmax.full_loss(rows, targets[d].reshape(-1), scratch).double().sum().cpu()
            count += targets[0].numel()
            bar.update(targets[0].numel())
        bar.total = bar.n  # the last partial batch is dropped: the estimate was a little high
        bar.refresh()
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


@dataclass(frozen=True)
class SentencePerplexity:
    """Perplexity of held-out sentences each scored on its own from one start state
    (``lm.start_state.sentence_losses``)."""

    forward: float
    backward: float
    average: float  # exp(mean of 0.5 * (L_fwd + L_bwd)), as Perplexity.average
    tokens: int  # predictions per direction


@dataclass(frozen=True)
class StartModes:
    """Held-out perplexity in each way a sentence can start: the stateful stream (bilm-tf's
    protocol, ``evaluate_perplexity``), and each sentence alone from zero states (zero mode)
    and from the start state (warm mode)."""

    stream: Perplexity
    zero: SentencePerplexity
    warm: SentencePerplexity


def compare_start_modes(
    model: LanguageModel,
    heldout: Any,
    start: LstmState,
    device: str | torch.device = "cpu",
    batch_size: int = 256,
    progress: bool = False,
) -> StartModes:
    """The perplexity of the held-out text ``heldout`` (a glob; all of it) in the stream and
    each sentence alone from zero states and from ``start`` (the model's start state, as
    ``lm.start_state.estimate_start_state`` gives it; ``batch_size``: the stream's), as
    ``elmokit start-state --heldout`` shows it."""
    sentences = read_sentences(heldout)
    stream = evaluate_perplexity(
        model, model.vocab, heldout, batch_size=batch_size, device=device, progress=progress
    )
    alone = []
    for state in (None, start):
        forward, backward, n = sentence_losses(model, model.vocab, sentences, state, progress=progress)
        alone.append(
            SentencePerplexity(math.exp(forward), math.exp(backward), math.exp(0.5 * (forward + backward)), n)
        )
    return StartModes(stream, alone[0], alone[1])
