"""The biLM's output layer: one softmax (weight and bias) shared by both directions.

Training uses a sampled softmax that reproduces TensorFlow 1's ``tf.nn.sampled_softmax_loss`` with
the defaults bilm-tf relies on: a log-uniform (Zipfian) candidate sampler with ``unique=True``, the
log expected count ("log Q") subtracted from every logit, and accidental hits removed. Evaluation
(and training when the vocabulary is no larger than the number of samples) uses the full softmax.

Ids must be sorted by descending frequency for the log-uniform proposal to make sense.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..base import kernels

__all__: list[str] = []

# Rows of the full (N, V) logit matrix are processed in chunks of at most this many elements.
_MAX_FULL_LOGITS = 1 << 25


def log_uniform_probabilities(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """P(k) = (log(k + 2) - log(k + 1)) / log(V + 1) for every id: any shape -> same shape, float64.

    This is the distribution of TensorFlow's ``LogUniformSampler`` over ``0 .. vocab_size - 1``.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    k = ids.to(torch.float64)
    return torch.log1p(1.0 / (k + 1.0)) / math.log1p(vocab_size)


class LogUniformSampler:
    """Samples ``num_sampled`` distinct ids from the log-uniform distribution over ``vocab_size`` ids.

    Same semantics as TensorFlow's ``log_uniform_candidate_sampler(unique=True)``: draw with
    replacement until ``num_sampled`` distinct ids have been seen; ``num_tries`` is the number of
    draws made, and is used to approximate each id's expected count. The draws are vectorised: a
    block of uniforms large enough with overwhelming probability is drawn at once (another block is
    drawn in the rare case it was not), and the first ``num_sampled`` distinct ids are kept in order
    of first appearance.
    """

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = int(vocab_size)
        self._log_range = math.log1p(self.vocab_size)
        self._tries_estimate: dict[int, float] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"

    def probability(self, ids: torch.Tensor) -> torch.Tensor:
        """P(id) for each id: any shape -> same shape, float64."""
        return log_uniform_probabilities(ids, self.vocab_size)

    def expected_count(
        self, ids: torch.Tensor, num_tries: int, num_sampled: int | None = None
    ) -> torch.Tensor:
        """Expected number of times each id appears in a sample: any shape -> same shape, float32.

        ``1 - (1 - P(id)) ** num_tries``, computed as ``-expm1(num_tries * log1p(-P))`` in float32
        like TensorFlow's ``ExpectedCountHelper``. If ``num_sampled`` is given and equals
        ``num_tries`` (no draw was rejected), TensorFlow returns ``P(id) * num_sampled`` instead,
        and so does this.
        """
        p = self.probability(ids).to(torch.float32)
        if num_sampled is not None and num_tries == num_sampled:
            return p * float(num_sampled)
        return -torch.expm1(float(num_tries) * torch.log1p(-p))

    def expected_num_tries(self, num_sampled: int) -> float:
        """Expected number of draws needed to see ``num_sampled`` distinct ids (cached).

        Solves sum_k 1 - (1 - P(k))^n = num_sampled for n by Newton's method (the left side is
        concave and increasing in n, so the iteration increases monotonically to the root). Only
        used to size the block of draws, so ids beyond the first 4096 are grouped into buckets
        0.1% wide (each id in a bucket gets the bucket's mean probability), keeping this cheap
        for large vocabularies.
        """
        cached = self._tries_estimate.get(num_sampled)
        if cached is not None:
            return cached
        vocab_size = self.vocab_size
        head = min(vocab_size, 4096)
        edges = torch.arange(head + 1, dtype=torch.float64)  # bucket k = ids [edges[k], edges[k+1])
        if vocab_size > head:
            span = math.log(vocab_size / head)
            steps = int(span / math.log1p(1e-3)) + 2
            tail = (head * torch.exp(torch.linspace(0.0, span, steps, dtype=torch.float64))).round()
            tail[-1] = float(vocab_size)
            edges = torch.unique(torch.cat([edges, tail]))
        counts = edges[1:] - edges[:-1]
        mean_p = (torch.log1p(edges[1:]) - torch.log1p(edges[:-1])) / self._log_range / counts
        log_not_p = torch.log1p(-mean_p)
        n = float(num_sampled)
        for _ in range(100):
            not_seen = torch.exp(n * log_not_p)
            excess = float((counts * (1.0 - not_seen)).sum()) - num_sampled
            slope = float(-(counts * not_seen * log_not_p).sum())
            if excess > -0.5 or slope <= 0.0:
                break
            n -= excess / slope
        self._tries_estimate[num_sampled] = n
        return n

    def _block_size(self, num_sampled: int) -> int:
        """How many uniforms to draw in the first block: a deterministic function of (V, S)."""
        mean = self.expected_num_tries(num_sampled)
        size = 1.05 * mean + 8.0 * math.sqrt(mean) + 64.0
        # rounding up makes the size robust to last-bit differences in the estimate
        return math.ceil(size / 1024.0) * 1024

    def draw(
        self,
        num_draws: int,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """``num_draws`` independent log-uniform ids (with replacement): -> (num_draws,) int64.

        Inverse CDF as TensorFlow: k = floor(exp(u * log(V + 1))) - 1 with u ~ U[0, 1) in float64.
        ``device`` defaults to the generator's (CPU without a generator).
        """
        if device is None:
            device = generator.device if generator is not None else torch.device("cpu")
        u = torch.rand(num_draws, dtype=torch.float64, generator=generator, device=device)
        k = torch.exp(u * self._log_range).to(torch.int64) - 1
        # mathematically k < V; TensorFlow maps the floating point edge case with a modulo
        return torch.remainder(k, self.vocab_size)

    def sample(
        self, num_sampled: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Draw ``num_sampled`` distinct ids.

        Runs on ``generator``'s device (the default CPU generator if None). Returns
        ``(ids (S,) int64, expected_counts (S,) float32, num_tries)`` with ids in order of first
        appearance.
        """
        num_sampled = int(num_sampled)
        if num_sampled < 1:
            raise ValueError(f"num_sampled must be >= 1, got {num_sampled}")
        if num_sampled > self.vocab_size:
            raise ValueError(f"cannot draw {num_sampled} distinct ids from a vocabulary of {self.vocab_size}")
        device = generator.device if generator is not None else torch.device("cpu")
        draws = self.draw(self._block_size(num_sampled), generator, device)
        while True:
            distinct, inverse = torch.unique(draws, return_inverse=True)
            if distinct.numel() >= num_sampled:
                break
            # rare: draw as many again (doubling keeps the total work linear)
            draws = torch.cat([draws, self.draw(draws.numel(), generator, device)])
        n = draws.numel()
        positions = torch.arange(n, device=device)
        first_seen = torch.full((distinct.numel(),), n, dtype=torch.int64, device=device)
        first_seen.scatter_reduce_(0, inverse, positions, reduce="amin")
        first_seen = torch.sort(first_seen).values[:num_sampled]
        num_tries = int(first_seen[-1]) + 1
        ids = draws[first_seen]
        return ids, self.expected_count(ids, num_tries, num_sampled), num_tries


def _check_targets(targets: torch.Tensor, vocab_size: int) -> None:
    """Raise ValueError naming the first target id outside ``0 .. vocab_size - 1``."""
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        raise TypeError(f"targets must be an integer tensor, got {targets.dtype}")
    if targets.dim() != 1:
        raise ValueError(f"targets must have shape (N,), got {tuple(targets.shape)}")
    bad = (targets < 0) | (targets >= vocab_size)
    if bool(bad.any()):
        position = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"target id {int(targets[position])} (at position {position}) is out of range for "
            f"a vocabulary of size {vocab_size} (valid ids are 0..{vocab_size - 1})"
        )


def _check_hidden(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor) -> None:
    if hidden.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must have shape (N, {weight.shape[1]}), got {tuple(hidden.shape)}")
    if hidden.shape[0] != targets.shape[0]:
        raise ValueError(f"hidden has {hidden.shape[0]} rows but targets has {targets.shape[0]} entries")


def sampled_softmax_loss(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    sampled_ids: torch.Tensor,
    true_expected_counts: torch.Tensor,
    sampled_expected_counts: torch.Tensor,
    *,
    sparse_grad: bool = False,
) -> torch.Tensor:
    """Per-row sampled softmax loss, as TensorFlow's ``sampled_softmax_loss`` with given samples.

    Shapes: hidden (N, D), targets (N,), weight (V, D), bias (V,), sampled_ids (S,),
    true_expected_counts (N,) (or (N, 1)), sampled_expected_counts (S,) -> losses (N,).

    Row i's logits are ``[h_i.w_t + b_t - log Q(t), h_i.w_s + b_s - log Q(s) for s in sampled]``
    with ``t = targets[i]``; a sampled id equal to ``t`` (an accidental hit) is masked out. The loss
    is the cross entropy with the true class at index 0. ``sparse_grad`` makes the gradient of
    ``weight`` a sparse tensor (only the gathered rows).
    """
    return _sampled_softmax_losses(
        [(hidden, targets, sampled_ids, true_expected_counts, sampled_expected_counts)],
        weight,
        bias,
        sparse_grad,
    )[0]


def _sampled_softmax_losses(
    groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
    weight: torch.Tensor,
    bias: torch.Tensor,
    sparse_grad: bool,
) -> list[torch.Tensor]:
    """``sampled_softmax_loss`` for several (hidden, targets, sampled_ids, true_expected_counts,
    sampled_expected_counts) groups sharing ``weight`` and ``bias``, each with its own samples.
    The rows of all groups are gathered at once, so the gradient of ``weight`` is built once."""
    prepared, ids = [], []
    for hidden, targets, sampled_ids, true_expected_counts, sampled_expected_counts in groups:
        _check_targets(targets, weight.shape[0])
        _check_hidden(hidden, targets, weight)
        if sampled_ids.dim() != 1:
            raise ValueError(f"sampled_ids must have shape (S,), got {tuple(sampled_ids.shape)}")
        num_rows, num_sampled = targets.shape[0], sampled_ids.shape[0]
        device = hidden.device
        sampled_ids = sampled_ids.to(device=device, dtype=torch.int64)
        targets = targets.to(torch.int64)
        true_expected_counts = true_expected_counts.to(device).reshape(num_rows)
        sampled_expected_counts = sampled_expected_counts.to(device).reshape(num_sampled)
        prepared.append((hidden, targets, sampled_ids, true_expected_counts, sampled_expected_counts))
        ids += [targets, sampled_ids]

    # one gather for the true and sampled rows, as TensorFlow does (here for all groups)
    all_ids = torch.cat(ids)
    all_w = F.embedding(all_ids, weight, sparse=sparse_grad)
    all_b = bias[all_ids]
    sizes = [len(i) for i in ids]
    rows_w, rows_b = all_w.split(sizes), all_b.split(sizes)
    return [
        _sampled_loss_from_rows(*group, rows_w[2 * k], rows_w[2 * k + 1], rows_b[2 * k], rows_b[2 * k + 1])
        for k, group in enumerate(prepared)
    ]


def _sampled_loss_from_rows(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    sampled_ids: torch.Tensor,
    true_expected_counts: torch.Tensor,
    sampled_expected_counts: torch.Tensor,
    true_w: torch.Tensor,
    sampled_w: torch.Tensor,
    true_b: torch.Tensor,
    sampled_b: torch.Tensor,
) -> torch.Tensor:
    """The per-row losses of one group from its gathered softmax rows."""
    num_rows, device = targets.shape[0], hidden.device
    true_logits = (hidden * true_w).sum(dim=1) + true_b - torch.log(true_expected_counts)
    if (
        kernels.enabled("sampled_softmax")
        and not torch.is_autocast_enabled(device.type)
        and hidden.dtype == sampled_w.dtype
    ):
        sampled_bias = sampled_b - torch.log(sampled_expected_counts)
        log_z = kernels.sampled_log_partition(
            hidden, sampled_w, sampled_bias, true_logits, targets, sampled_ids
        )
        return log_z - true_logits
    sampled_logits = hidden @ sampled_w.t() + sampled_b - torch.log(sampled_expected_counts)
    # TensorFlow adds -FLT_MAX to accidental hits; masking to the dtype's lowest value is the same
    hits = targets.unsqueeze(1) == sampled_ids.unsqueeze(0)
    sampled_logits = sampled_logits.masked_fill(hits, torch.finfo(sampled_logits.dtype).min)

    logits = torch.cat([true_logits.unsqueeze(1).to(sampled_logits.dtype), sampled_logits], dim=1)
    zeros = torch.zeros(num_rows, dtype=torch.int64, device=device)
    return F.cross_entropy(logits, zeros, reduction="none")


def full_softmax_loss(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-row cross entropy over all V classes: hidden (N, D), targets (N,) -> (N,).

    Rows are processed in chunks so that no more than ~32M logits exist at a time. ``scratch``
    (2, rows, V), for use without autograd (evaluation), holds the logits and their log-softmax
    of ``rows`` rows at a time: the same values, without two fresh (rows, V) buffers per chunk,
    which the kernel maps page by page each time (a page fault per 4 KB)."""
    _check_targets(targets, weight.shape[0])
    _check_hidden(hidden, targets, weight)
    if scratch is not None:
        losses = []
        for h, t in zip(hidden.split(scratch.shape[1]), targets.split(scratch.shape[1])):
            logits = torch.addmm(bias, h, weight.t(), out=scratch[0, : len(h)])
            log_p = torch.log_softmax(logits, dim=1, out=scratch[1, : len(h)])
            losses.append(-log_p.gather(1, t.unsqueeze(1)).squeeze(1))
        return torch.cat(losses) if losses else hidden.new_zeros(0)
    rows = max(1, _MAX_FULL_LOGITS // weight.shape[0])
    losses = [
        F.cross_entropy(F.linear(h, weight, bias), t, reduction="none")
        for h, t in zip(hidden.split(rows), targets.split(rows))
    ]
    if not losses:
        return hidden.new_zeros(0)
    return losses[0] if len(losses) == 1 else torch.cat(losses)


class Softmax(nn.Module):
    """The softmax layer on top of the biLM: ``weight`` (V, dim), ``bias`` (V,).

    One instance is shared by the forward and backward directions, as in bilm-tf. Note that bilm-tf
    calls the sampled loss once per direction, so each direction gets its own set of samples.
    """

    def __init__(self, vocab_size: int, dim: int, *, sparse_grad: bool = False) -> None:
        super().__init__()
        if vocab_size < 1 or dim < 1:
            raise ValueError(f"vocab_size and dim must be >= 1, got {vocab_size} and {dim}")
        self.vocab_size = int(vocab_size)
        self.dim = int(dim)
        self.sparse_grad = sparse_grad
        self.weight = nn.Parameter(torch.empty(self.vocab_size, self.dim))
        self.bias = nn.Parameter(torch.empty(self.vocab_size))
        self.sampler = LogUniformSampler(self.vocab_size)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """bilm-tf's softmax_init: weight ~ normal(0, 1/sqrt(dim)), bias = 0."""
        nn.init.normal_(self.weight, mean=0.0, std=1.0 / math.sqrt(self.dim))
        nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, dim={self.dim}, sparse_grad={self.sparse_grad}"

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Unnormalised scores over the vocabulary: (..., dim) -> (..., V)."""
        return F.linear(hidden, self.weight, self.bias)

    def full_loss(
        self, hidden: torch.Tensor, targets: torch.Tensor, scratch: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Full softmax cross entropy: hidden (N, dim), targets (N,) -> (N,); ``scratch``
        (2, rows, vocab_size) reuses buffers without autograd (``full_softmax_loss``)."""
        return full_softmax_loss(hidden, targets, self.weight, self.bias, scratch)

    def sampled_loss(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        num_sampled: int,
        generator: torch.Generator | None = None,
        sampled_values: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Sampled softmax loss with one shared sample of ``num_sampled`` ids: (N, dim), (N,) -> (N,).

        Falls back to :meth:`full_loss` when ``vocab_size <= num_sampled``. ``sampled_values``,
        as in TensorFlow, is an optional precomputed ``(sampled_ids (S,), true_expected_counts
        (N,), sampled_expected_counts (S,))`` that replaces the sampler.
        """
        num_sampled = int(num_sampled)
        if num_sampled < 1:
            raise ValueError(f"num_sampled must be >= 1, got {num_sampled}")
        if sampled_values is None:
            return self.sampled_losses([hidden], [targets], num_sampled, generator)[0]
        sampled_ids, true_expected, sampled_expected = sampled_values
        return sampled_softmax_loss(
            hidden,
            targets,
            self.weight,
            self.bias,
            sampled_ids,
            true_expected,
            sampled_expected,
            sparse_grad=self.sparse_grad,
        )

    def sampled_losses(
        self,
        hiddens: list[torch.Tensor],
        targets: list[torch.Tensor],
        num_sampled: int,
        generator: torch.Generator | None = None,
    ) -> list[torch.Tensor]:
        """:meth:`sampled_loss` for several groups of rows (e.g. the two directions), each with
        its own sample, drawn in order: the same losses as one call per group, with the
        softmax rows of all groups gathered at once (one gradient of the weight, not one per
        group)."""
        num_sampled = int(num_sampled)
        if num_sampled < 1:
            raise ValueError(f"num_sampled must be >= 1, got {num_sampled}")
        if self.vocab_size <= num_sampled:
            return [self.full_loss(h, t) for h, t in zip(hiddens, targets)]
        groups = []
        for hidden, target in zip(hiddens, targets):
            sampled_ids, sampled_expected, num_tries = self.sampler.sample(num_sampled, generator)
            true_expected = self.sampler.expected_count(target, num_tries, num_sampled)
            groups.append((hidden, target, sampled_ids, true_expected, sampled_expected))
        return _sampled_softmax_losses(groups, self.weight, self.bias, self.sparse_grad)

    def forward(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        num_sampled: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Per-row loss (N,): sampled in training mode when ``num_sampled`` is given, else full."""
        if self.training and num_sampled is not None:
            return self.sampled_loss(hidden, targets, num_sampled, generator)
        return self.full_loss(hidden, targets)
