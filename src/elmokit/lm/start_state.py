"""The canonical start state: the LSTM states a model reaches at a sentence boundary in running text.

The biLM was trained on streams of sentences, so at training time a sentence never starts from
zero states. The forward stream is ``<S> a b c <S> d e ...`` (``</S>`` is only a target), so the
state in which the forward LSTM reads a sentence's ``<S>`` is the state after the previous
sentence's last word; the backward stream mirrors this with ``</S>``. ``estimate_start_state``
runs held-out sentences in that format, ``rows`` streams at a time, records the state before each
boundary token (after ``burn_in`` sentences per stream) and returns its mean: the single state
closest, in squared error, to the states the model actually starts sentences from. Each stream
begins from zero states inside the text (its first sentence without the boundary token), because
a model trained on streams only ever read a boundary token from zero states once, at its first
training step, and may respond to it badly.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
from tqdm import tqdm

from ..model.bilm import BiLM
from ..model.characters import BOS_TOKEN, EOS_TOKEN, tokens_to_ids
from ..model.lstm import LstmState
from .language_model import LanguageModel

__all__: list[str] = []


def _stream_inputs(
    lm: LanguageModel, sentences: Sequence[Sequence[str]], boundary: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training-format streams of one sentence per row: char ids (2, rows, steps, max_chars) on
    the model's device, lengths (rows,).

    Forward reads [<S>, w1..wn]; backward reads [</S>, wn..w1] (without the boundary token when
    ``boundary`` is False)."""
    max_chars = lm.bilm.options.char_cnn.max_characters_per_token
    first = 1 if boundary else 0
    steps = max(len(s) for s in sentences) + first
    ids = torch.zeros(2, len(sentences), steps, max_chars, dtype=torch.long)
    for row, sentence in enumerate(sentences):
        n = len(sentence) + first
        ids[0, row, :n] = tokens_to_ids([BOS_TOKEN, *sentence][1 - first :], max_chars)
        ids[1, row, :n] = tokens_to_ids([EOS_TOKEN, *reversed(sentence)][1 - first :], max_chars)
    lengths = torch.tensor([len(s) + first for s in sentences])
    return ids.to(next(lm.parameters()).device), lengths


def _start(lm: LanguageModel, rows: int, start: LstmState | None) -> LstmState:
    """``start`` (h (n_layers, 2, projection_dim), c (n_layers, 2, dim)) for every one of ``rows``
    rows; zeros when None."""
    state = lm.bilm.lstm.zero_state(rows, next(lm.parameters()).device)
    if start is None:
        return state
    return LstmState(
        start.h.to(state.h.device).unsqueeze(2).expand_as(state.h).contiguous(),
        start.c.to(state.c.device).unsqueeze(2).expand_as(state.c).contiguous(),
    )


@torch.no_grad()
def boundary_states(
    bilm: BiLM,
    sentences: Sequence[Sequence[str]],
    rows: int = 32,
    burn_in: int = 2,
    progress: bool = False,
) -> LstmState:
    """States before each sentence's first input, in running text: h (n, n_layers, 2, proj),
    c (n, n_layers, 2, dim), n = number of recorded boundaries. ``progress`` shows a bar."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows (parallel streams) must be an integer of at least 1, got {rows!r}")
    if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 0:
        raise ValueError(f"burn_in must be an integer of at least 0, got {burn_in!r}")
    lm = LanguageModel(bilm, dropout=0.0).eval()
    sentences = [s for s in sentences if len(s) > 0]
    per_row = len(sentences) // rows
    if per_row <= burn_in:
        raise ValueError(
            f"need more than {rows * (burn_in + 1)} non-empty sentences to estimate a start state "
            f"with {rows} streams, got {len(sentences)}"
        )
    state = _start(lm, rows, None)
    hs, cs = [], []
    bar = tqdm(total=per_row * rows, unit="sent", disable=not progress, desc="start state", file=sys.stderr)
    for k in range(per_row):
        batch = [sentences[r * per_row + k] for r in range(rows)]
        if k >= burn_in:
            hs.append(state.h.permute(2, 0, 1, 3).cpu())
            cs.append(state.c.permute(2, 0, 1, 3).cpu())
        # A stream starts inside running text: the first sentence is read without its boundary
        # token, since the model never saw a boundary token read from zero states in training.
        ids, lengths = _stream_inputs(lm, batch, boundary=k > 0)
        _, state = lm.hidden_states(ids, state, lengths)
        bar.update(rows)
    bar.close()
    return LstmState(torch.cat(hs), torch.cat(cs))


def estimate_start_state(
    bilm: BiLM,
    sentences: Sequence[Sequence[str]],
    rows: int = 32,
    burn_in: int = 2,
    progress: bool = False,
) -> LstmState:
    """The mean boundary state: h (n_layers, 2, projection_dim), c (n_layers, 2, dim)."""
    states = boundary_states(bilm, sentences, rows=rows, burn_in=burn_in, progress=progress)
    return LstmState(states.h.mean(0), states.c.mean(0))


@torch.no_grad()
def sentence_losses(
    lm: LanguageModel,
    vocab: Any,
    sentences: Sequence[Sequence[str]],
    start: LstmState | None,
    batch_size: int = 64,
    progress: bool = False,
) -> tuple[float, float, int]:
    """Mean forward and backward loss of each sentence on its own (full softmax), every sentence
    starting from ``start`` (None = zeros): forward reads [<S>, w1..wn] and predicts
    [w1..wn, </S>]; backward reads [</S>, wn..w1] and predicts [wn..w1, <S>].
    Returns (loss_fwd, loss_bwd, predictions per direction)."""
    lm = lm.eval()
    device = next(lm.parameters()).device
    sentences = [s for s in sentences if len(s) > 0]
    totals, count = torch.zeros(2, dtype=torch.float64), 0
    bar = tqdm(total=len(sentences), unit="sent", disable=not progress, file=sys.stderr)
    for i in range(0, len(sentences), batch_size):
        batch = sentences[i : i + batch_size]
        ids, lengths = _stream_inputs(lm, batch)
        rows, steps = len(batch), ids.shape[2]
        hidden, _ = lm.hidden_states(ids, _start(lm, rows, start), lengths)
        targets = torch.zeros(2, rows, steps, dtype=torch.long)
        for row, s in enumerate(batch):
            tokens = vocab.encode(list(s))
            targets[0, row, : len(s) + 1] = torch.tensor([*tokens, vocab.eos])
            targets[1, row, : len(s) + 1] = torch.tensor([*tokens[::-1], vocab.bos])
        mask = (torch.arange(steps).unsqueeze(0) < lengths.unsqueeze(1)).to(device)
        losses = lm.position_losses(hidden, targets.to(device))  # (2, rows, steps)
        totals += losses[:, mask].double().sum(1).cpu()
        count += int(mask.sum())
        bar.update(len(batch))
    bar.close()
    return float(totals[0] / count), float(totals[1] / count), count
