"""The language model: token encoder -> forward and backward LSTMs -> softmax over the vocabulary.

This is the one composition that training, perplexity evaluation and start-state estimation run.
Its inputs are *streams* in the training format: char ids (2, batch, steps, max_chars), shifted by
+1, direction 0 the forward stream and direction 1 the backward stream, each in its own reading
order; the forward stream predicts token t+1, the backward one token t-1. State is explicit: a
call takes the LSTM state to start from and returns the state it reached.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .bilm import BiLM
from .lstm import LstmState
from .options import BiLMOptions
from .softmax import Softmax


def batch_tensors(
    batch: dict[str, np.ndarray], device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both directions of a data batch: char ids (2, batch, steps, max_chars) shifted by +1 and
    targets (2, batch, steps), on ``device``."""
    chars = np.stack([batch["char_ids"], batch["char_ids_reverse"]])
    targets = np.stack([batch["next_token_id"], batch["next_token_id_reverse"]])
    return (
        torch.from_numpy(chars).to(device, torch.long) + 1,
        torch.from_numpy(targets).to(device, torch.long),
    )


class LanguageModel(nn.Module):
    """The biLM with its training objective: a softmax over the vocabulary shared by both
    directions, predicting token t+1 (forward) and t-1 (backward).

    ``options`` builds a fresh biLM; a ``BiLM`` is used as it is (its parameters shared).
    ``vocab_size=None`` makes no softmax: the model then gives hidden states and LSTM states only.
    ``dropout`` (training only) drops each LSTM layer's input (of a biLM built here) and the top
    layer's output.
    """

    def __init__(
        self,
        options: dict[str, Any] | BiLMOptions | BiLM,
        vocab_size: int | None = None,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if isinstance(options, BiLM):
            self.bilm = options
        else:
            self.bilm = BiLM(options)
            self.bilm.lstm.dropout = dropout
        self.dropout = dropout
        dim = self.bilm.options.lstm.projection_dim
        self.softmax: Softmax | None = None if vocab_size is None else Softmax(vocab_size, dim)

    def hidden_states(
        self, char_ids: torch.Tensor, state: LstmState | None = None, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, LstmState]:
        """The top LSTM layer over streams: char_ids (2, batch, steps, max_chars) -> hidden states
        (2, batch, steps, projection_dim), zero past each row's length, and the state reached
        (taken at each row's last step). ``lengths`` (batch,): all ``steps`` when None;
        ``state`` None starts from zeros."""
        tokens = self.bilm.token_encoder(char_ids)  # (2, batch, steps, projection_dim)
        if lengths is None:
            lengths = torch.full((tokens.shape[1],), tokens.shape[2], dtype=torch.long)
        outputs, state = self.bilm.lstm(tokens, lengths, state)
        return outputs[-1], state

    def position_losses(
        self, hidden: torch.Tensor, targets: torch.Tensor, chunk_rows: int | None = None
    ) -> torch.Tensor:
        """Full-softmax cross entropy at every position: hidden (2, batch, steps, dim), targets
        (2, batch, steps) -> (2, batch, steps). ``chunk_rows`` bounds how many positions' logits
        over the vocabulary exist at once."""
        softmax = self._softmax()
        per_direction = []
        for d in range(2):
            rows, target = hidden[d].reshape(-1, hidden.shape[-1]), targets[d].reshape(-1)
            size = chunk_rows or max(1, rows.shape[0])
            pieces = [softmax.full_loss(h, t) for h, t in zip(rows.split(size), target.split(size))]
            per_direction.append(torch.cat(pieces))
        return torch.stack(per_direction).view_as(targets)

    def forward(
        self,
        char_ids: torch.Tensor,
        targets: torch.Tensor,
        state: LstmState | None,
        num_sampled: int | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, LstmState]:
        """char_ids (2, batch, steps, max_chars), targets (2, batch, steps) -> the mean loss per
        direction (2,) and the final state (detached: back-propagation stops at the window).
        ``num_sampled=None`` uses the full softmax; otherwise each direction draws its own
        sample, as bilm-tf."""
        hidden, state = self.hidden_states(char_ids, state)
        hidden = F.dropout(hidden, self.dropout, self.training)
        if num_sampled is None:
            losses = list(self.position_losses(hidden, targets).flatten(1))
        else:
            losses = self._softmax().sampled_losses(
                list(hidden.flatten(1, 2)), list(targets.flatten(1)), num_sampled, generator
            )
        return torch.stack([loss.mean() for loss in losses]), state.detach()

    def _softmax(self) -> Softmax:
        if self.softmax is None:
            raise ValueError("this LanguageModel has no softmax (it was made without a vocab_size)")
        return self.softmax
