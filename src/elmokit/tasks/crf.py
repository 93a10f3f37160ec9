"""A linear-chain conditional random field: log-likelihood (forward algorithm) and Viterbi decoding,
vectorised over the batch.

score(y) = start[y_0] + sum_t emissions[t, y_t] + sum_{t>0} transitions[y_{t-1}, y_t] + end[y_last];
log p(y | x) = score(y) - log sum_{y'} exp(score(y')).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__: list[str] = []

# Score given to a forbidden transition: exp(-1e4) is 0 in float32, and it stays finite.
FORBIDDEN = -1e4


class ConditionalRandomField(nn.Module):
    """CRF over ``num_tags`` tags with learned transition, start and end scores.

    ``constraints``: optional (allowed (K, K), allowed_start (K,), allowed_end (K,)) boolean
    tensors, e.g. from ``bioes_constraints``; forbidden moves get a fixed score of -1e4 both in
    training and in decoding, so the model only ever scores well-formed tag sequences.
    """

    allowed: torch.Tensor  # buffers (num_tags, num_tags), (num_tags,), (num_tags,)
    allowed_start: torch.Tensor
    allowed_end: torch.Tensor

    def __init__(
        self,
        num_tags: int,
        constraints: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        if num_tags < 1:
            raise ValueError(f"num_tags must be at least 1, got {num_tags}")
        self.num_tags = num_tags
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags).normal_(0.0, 0.1))
        self.start_transitions = nn.Parameter(torch.empty(num_tags).normal_(0.0, 0.1))
        self.end_transitions = nn.Parameter(torch.empty(num_tags).normal_(0.0, 0.1))
        if constraints is None:
            allowed = torch.ones(num_tags, num_tags, dtype=torch.bool)
            allowed_start = allowed_end = torch.ones(num_tags, dtype=torch.bool)
        else:
            allowed, allowed_start, allowed_end = (c.to(torch.bool) for c in constraints)
            if allowed.shape != (num_tags, num_tags) or allowed_start.shape != (num_tags,):
                raise ValueError("constraints do not match num_tags")
        self.register_buffer("allowed", allowed.clone())
        self.register_buffer("allowed_start", allowed_start.clone())
        self.register_buffer("allowed_end", allowed_end.clone())

    def _scores(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        forbidden = torch.tensor(FORBIDDEN, dtype=self.transitions.dtype, device=self.transitions.device)
        return (
            torch.where(self.allowed, self.transitions, forbidden),
            torch.where(self.allowed_start, self.start_transitions, forbidden),
            torch.where(self.allowed_end, self.end_transitions, forbidden),
        )

    @staticmethod
    def _check(emissions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if emissions.dim() != 3:
            raise ValueError(f"emissions must be (batch, timesteps, num_tags), got {tuple(emissions.shape)}")
        if mask is None:
            mask = emissions.new_ones(emissions.shape[:2], dtype=torch.bool)
        mask = mask.to(torch.bool)
        if not bool(mask[:, 0].all()):
            raise ValueError("every sequence needs at least one step (mask[:, 0] must be true)")
        return mask

    def sequence_score(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """score(tags) per sequence: (batch,)."""
        transitions, start, end = self._scores()
        mask_f = mask.to(emissions.dtype)
        emitted = emissions.gather(2, tags.unsqueeze(2)).squeeze(2)  # (batch, timesteps)
        score = start[tags[:, 0]] + (emitted * mask_f).sum(1)
        if tags.shape[1] > 1:
            moves = transitions[tags[:, :-1], tags[:, 1:]]  # (batch, timesteps - 1)
            score = score + (moves * mask_f[:, 1:]).sum(1)
        lengths = mask.long().sum(1)
        last = tags.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)
        return score + end[last]

    def log_partition(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log sum over all tag sequences of exp(score): (batch,)."""
        transitions, start, end = self._scores()
        alpha = start + emissions[:, 0]  # (batch, num_tags)
        for t in range(1, emissions.shape[1]):
            step = torch.logsumexp(alpha.unsqueeze(2) + transitions, dim=1) + emissions[:, t]
            alpha = torch.where(mask[:, t].unsqueeze(1), step, alpha)
        return torch.logsumexp(alpha + end, dim=1)

    def forward(
        self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """log p(tags | emissions) per sequence: (batch,). emissions (batch, timesteps, num_tags),
        tags (batch, timesteps), mask (batch, timesteps), true on each sequence's first steps."""
        mask = self._check(emissions, mask)
        return self.sequence_score(emissions, tags, mask) - self.log_partition(emissions, mask)

    @torch.no_grad()
    def viterbi_decode(self, emissions: torch.Tensor, mask: torch.Tensor | None = None) -> list[list[int]]:
        """The best tag sequence of each row (cut to its length)."""
        mask = self._check(emissions, mask)
        transitions, start, end = self._scores()
        batch, steps, num_tags = emissions.shape
        score = start + emissions[:, 0]
        identity = torch.arange(num_tags, device=emissions.device).expand(batch, num_tags)
        pointers = []
        for t in range(1, steps):
            best, index = (score.unsqueeze(2) + transitions).max(dim=1)
            on = mask[:, t].unsqueeze(1)
            score = torch.where(on, best + emissions[:, t], score)
            pointers.append(torch.where(on, index, identity))  # padding steps keep the tag
        tag = (score + end).argmax(dim=1)
        path = [tag]
        for index in reversed(pointers):
            tag = index.gather(1, tag.unsqueeze(1)).squeeze(1)
            path.append(tag)
        path.reverse()
        tags = torch.stack(path, dim=1).tolist()
        lengths = mask.long().sum(1).tolist()
        return [row[:n] for row, n in zip(tags, lengths)]


def bioes_constraints(tags: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(allowed, allowed_start, allowed_end) for BIOES tags: B-x and I-x continue with I-x or
    E-x; O, E and S are followed by O, B-y or S-y; sequences start like after O and end after
    O, E or S. Tags that are not BIOES (e.g. POS tags) are unconstrained."""
    parts = [(t, "") if t == "O" else tuple(t.split("-", 1)) for t in tags]
    k = len(tags)
    allowed = torch.ones(k, k, dtype=torch.bool)
    start = torch.ones(k, dtype=torch.bool)
    end = torch.ones(k, dtype=torch.bool)

    def opens(prefix: str) -> bool:
        return prefix in ("O", "B", "S")

    for j, (p, _) in enumerate(parts):
        start[j] = opens(p)
        end[j] = p in ("O", "E", "S")
        for i, (q, kind) in enumerate(parts):
            if q in ("B", "I"):
                allowed[i, j] = p in ("I", "E") and parts[j][1] == kind
            else:
                allowed[i, j] = opens(p)
    return allowed, start, end
