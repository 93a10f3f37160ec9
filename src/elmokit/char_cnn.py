"""The context-independent token encoder: character CNN -> highway layers -> projection."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .highway import Highway
from .lstm import full_precision, needs_autograd
from .options import CharCNNOptions


class CharCNN(nn.Module):
    """Character embedding and max-pooled convolutions: (n_tokens, max_chars) -> (n_tokens, n_filters).

    Char ids are shifted (0 = no token, whose embedding row stays zero). As in the original, every
    one of the ``max_chars`` positions, padding characters included, takes part in the max-pool.
    """

    def __init__(self, options: CharCNNOptions) -> None:
        super().__init__()
        self.max_chars = options.max_characters_per_token
        self.embedding = nn.Embedding(options.n_characters, options.embedding_dim, padding_idx=0)
        self.convolutions = nn.ModuleList(
            nn.Conv1d(options.embedding_dim, n_filters, kernel_size=width)
            for width, n_filters in options.filters
        )
        self.activation = torch.tanh if options.activation == "tanh" else torch.relu
        self._tanh = options.activation == "tanh"
        self.reset_parameters()

    @property
    def output_dim(self) -> int:
        return sum(conv.out_channels for conv in self.convolutions)

    def reset_parameters(self) -> None:
        """The original's initialisation (uniform +-1 embeddings; Kim et al. or Glorot filters)."""
        nn.init.uniform_(self.embedding.weight, -1.0, 1.0)
        with torch.no_grad():
            self.embedding.weight[0].zero_()
        for conv in self.convolutions:
            if self._tanh:
                fan_in = conv.kernel_size[0] * conv.in_channels
                nn.init.normal_(conv.weight, std=(1.0 / fan_in) ** 0.5)
            else:
                nn.init.uniform_(conv.weight, -0.05, 0.05)
            nn.init.zeros_(conv.bias)

    # Tokens are grouped by length so that each group is convolved over a shorter prefix.
    LENGTH_BUCKETS = (8, 12, 20)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(n_tokens, max_chars) shifted ids -> (n_tokens, n_filters).

        Exact speed-up: a window made only of padding characters gives the same value for every
        token, so a token of ``L`` real characters (begin/end of word included) needs only the
        first ``L + max_width`` positions: that prefix holds every window touching a real
        character and, where the full width has one, a window of padding only.
        """
        lengths = self._real_lengths(char_ids)
        max_width = max(conv.kernel_size[0] for conv in self.convolutions)
        order = torch.argsort(lengths)
        lengths, ids = lengths[order], char_ids[order]
        bounds = torch.bucketize(
            torch.tensor(self.LENGTH_BUCKETS, device=lengths.device), lengths, right=True
        ).tolist()
        pieces, start = [], 0
        for end, limit in zip([*bounds, len(ids)], [*self.LENGTH_BUCKETS, self.max_chars]):
            if end > start:
                pieces.append(self._convolve(ids[start:end, : min(self.max_chars, limit + max_width)]))
                start = end
        out = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        return out[torch.argsort(order)]

    def _real_lengths(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Number of non-padding characters per token (all max_chars for an all-zero row)."""
        from .characters import PADDING_CHAR

        lengths = (char_ids != PADDING_CHAR + 1).sum(dim=-1)
        return torch.where((char_ids == 0).all(dim=-1), self.max_chars, lengths)

    def _convolve(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(n, width) -> (n, n_filters): embedding, convolutions, max over positions, activation."""
        weight = self.embedding.weight
        if needs_autograd(self, weight) and full_precision(weight):
            params = [t for conv in self.convolutions for t in (conv.weight, conv.bias)]
            return self.activation(
                _PooledConvolutions.apply(char_ids, weight, self.embedding.padding_idx, *params)
            )
        x = self.embedding(char_ids).transpose(1, 2)  # (n, char_dim, width)
        pooled = [max_over_windows(x, conv.weight, conv.bias) for conv in self.convolutions]
        return self.activation(torch.cat(pooled, dim=-1))


# Inputs up to this many character positions are convolved as a matmul (see max_over_windows).
MATMUL_MAX_WIDTH = 20


def max_over_windows(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, positions: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One convolution and its max over positions: x (n, char_dim, width), weight (n_filters,
    char_dim, filter_width), bias (n_filters,) -> (n, n_filters) [and the argmax positions].

    ``max(conv1d(x, weight, bias), dim=-1)``. Up to ``MATMUL_MAX_WIDTH`` characters (the short
    length buckets, most tokens) it is one matmul of the unfolded windows (n * positions,
    char_dim * filter_width) with the weight: 20-50% faster than ``conv1d`` on the CPU, equal up
    to float rounding; over wider inputs ``conv1d`` is faster."""
    if x.shape[-1] > MATMUL_MAX_WIDTH:
        out = F.conv1d(x, weight, bias)
        return out.max(dim=-1) if positions else out.amax(dim=-1)
    n, char_dim, _ = x.shape
    n_filters, _, filter_width = weight.shape
    windows = x.unfold(2, filter_width, 1).permute(0, 2, 1, 3).reshape(-1, char_dim * filter_width)
    out = torch.addmm(bias, windows, weight.view(n_filters, -1).t()).view(n, -1, n_filters)
    return out.max(dim=1) if positions else out.amax(dim=1)


class _PooledConvolutions(torch.autograd.Function):
    """Character embedding, convolutions and max over positions as one autograd node (training).

    ids (n, width), embedding (n_characters, char_dim), then each convolution's weight
    (n_filters, char_dim, filter_width) and bias -> (n, total filters) before the activation.

    The forward values are those of ``CharCNN._convolve``. The backward pass uses that only
    the window at each filter's maximum gets a gradient, and that a window is made of embedding
    rows: per filter and offset k in the window, the output gradients are summed by the
    character at that offset (a histogram ``(n_filters, n_characters)``), from which the
    gradients of the filters and of the embedding are two small matmuls. This replaces the
    convolution backward pass over every position. Windows tied for the maximum (identical
    padding windows) have the same content, so the gradient does not depend on which is taken.
    """

    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, embedding: torch.Tensor, padding_idx: int | None, *params):  # type: ignore[override]
        x = F.embedding(ids, embedding, padding_idx).transpose(1, 2)  # (n, char_dim, width)
        weights, biases = params[0::2], params[1::2]
        pooled, positions = [], []
        for weight, bias in zip(weights, biases):
            values, index = max_over_windows(x, weight, bias, positions=True)
            pooled.append(values)
            positions.append(index)
        ctx.padding_idx = padding_idx
        ctx.save_for_backward(ids, embedding, *weights, *positions)
        return torch.cat(pooled, dim=-1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        ids, embedding, *rest = ctx.saved_tensors
        weights, positions = rest[: len(rest) // 2], rest[len(rest) // 2 :]
        n, width = ids.shape
        n_chars = embedding.shape[0]
        # int32 indices where they fit: index_select and index_add_ run several times faster
        largest = max(n * width, max(w.shape[0] for w in weights) * n_chars)
        itype = torch.int32 if largest < 2**31 else torch.int64
        flat_ids = ids.reshape(-1).to(itype)
        row_starts = (torch.arange(n, device=ids.device, dtype=itype) * width).unsqueeze(1)
        d_embedding = torch.zeros_like(embedding)
        d_params: list[torch.Tensor] = []
        start = 0
        for weight, index in zip(weights, positions):
            n_filters, _, filter_width = weight.shape
            g = grad[:, start : start + n_filters]
            start += n_filters
            g_flat = g.reshape(-1)
            window = (index.to(itype) + row_starts).reshape(-1)  # flat start of each max window
            offsets = torch.arange(n_filters, device=ids.device, dtype=itype).mul_(n_chars).repeat(n)
            histogram = grad.new_zeros(filter_width, n_filters * n_chars)
            for k in range(filter_width):
                keys = flat_ids.index_select(0, window + k).add_(offsets)
                histogram[k].index_add_(0, keys, g_flat)
            histogram = histogram.view(filter_width, n_filters, n_chars)
            # d_weight[f, c, k] = sum_a histogram[k, f, a] * embedding[a, c]
            d_weight = torch.matmul(histogram, embedding).permute(1, 2, 0)
            # d_embedding[a, c] += sum_k sum_f histogram[k, f, a] * weight[f, c, k]
            d_embedding += torch.bmm(histogram.transpose(1, 2), weight.permute(2, 0, 1)).sum(dim=0)
            # in the weight's own strides (for width 1 ``contiguous()`` would keep a stride that
            # DDP's gradient buckets do not match)
            d_params += [weight.new_empty(weight.shape).copy_(d_weight), g.sum(dim=0)]
        if ctx.padding_idx is not None:
            d_embedding[ctx.padding_idx] = 0.0
        return (None, d_embedding, None, *d_params)


class TokenEncoder(nn.Module):
    """Char CNN, highway layers and projection: char ids (..., max_chars) -> (..., projection_dim).

    The CNN runs once per distinct token of the input; the result is identical to running it on
    every position. Without autograd, the encodings of the last ``cache_size`` distinct tokens
    are kept across calls (LRU; ``cache_size = 0`` turns it off), so a stream of batches encodes
    each token once. The cache empties itself when a parameter changes through a PyTorch op
    (optimizer step, ``load_state_dict``, in-place copy) or the module moves to another device
    or dtype, and when calls switch between ``torch.inference_mode`` and ``torch.no_grad``;
    after writing to ``param.data`` directly, call ``clear_cache()``.
    """

    DEFAULT_CACHE_SIZE = 20_000

    def __init__(self, options: CharCNNOptions, projection_dim: int) -> None:
        super().__init__()
        self.cache_size = self.DEFAULT_CACHE_SIZE
        self._cache: _EncodingCache | None = None
        self.char_cnn = CharCNN(options)
        n_filters = self.char_cnn.output_dim
        self.highway = Highway(n_filters, options.n_highway)
        self.projection: nn.Linear | None = None
        if n_filters != projection_dim:
            self.projection = nn.Linear(n_filters, projection_dim)
            nn.init.normal_(self.projection.weight, std=(1.0 / n_filters) ** 0.5)
            nn.init.zeros_(self.projection.bias)
        self.output_dim = projection_dim

    def encode_unique(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(n_tokens, max_chars) -> (n_tokens, projection_dim), one CNN pass per row."""
        x = self.highway(self.char_cnn(char_ids))
        return x if self.projection is None else self.projection(x)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(..., max_chars) -> (..., projection_dim); the CNN runs once per distinct token."""
        flat = char_ids.reshape(-1, char_ids.shape[-1])
        unique, inverse = distinct_rows(flat, self.char_cnn.embedding.num_embeddings)
        if self.cache_size > 0 and len(unique) and not needs_autograd(self, self.char_cnn.embedding.weight):
            encoded = self._encode_cached(unique)
        else:
            encoded = self.encode_unique(unique)
        return encoded[inverse].reshape(*char_ids.shape[:-1], self.output_dim)

    @property
    def cache_stats(self) -> tuple[int, int]:
        """(hits, misses) in distinct tokens since the cache was last emptied."""
        return (0, 0) if self._cache is None else (self._cache.hits, self._cache.misses)

    def clear_cache(self) -> None:
        self._cache = None

    def _encode_cached(self, unique: torch.Tensor) -> torch.Tensor:
        """encode_unique through the cache: (n, max_chars) distinct rows -> (n, projection_dim)."""
        weight = self.char_cnn.embedding.weight
        versions = tuple((id(p), p._version) for p in self.parameters())
        # a store made under inference_mode cannot be written outside it: one cache per mode
        inference = torch.is_inference_mode_enabled()
        version = (weight.device, weight.dtype, self.cache_size, inference, versions)
        if self._cache is None or self._cache.version != version:
            self._cache = _EncodingCache(self.cache_size, self.output_dim, weight, version)
        cache = self._cache
        keys = _row_keys(unique, self.char_cnn.embedding.num_embeddings)
        slots = cache.find(keys)
        missing = [i for i, slot in enumerate(slots) if slot < 0]
        out = cache.store.new_empty(len(keys), self.output_dim)
        if len(missing) < len(keys):
            found = [i for i, slot in enumerate(slots) if slot >= 0]
            index = torch.tensor(found, device=out.device)
            out[index] = cache.store[torch.tensor([slots[i] for i in found], device=out.device)]
        if missing:
            index = torch.tensor(missing, device=out.device)
            encoded = self.encode_unique(unique[index])
            out[index] = encoded
            cache.add([keys[i] for i in missing], encoded)
        return out


def _row_keys(rows: torch.Tensor, n_values: int) -> list[bytes]:
    """One bytes key per row of char ids (n, max_chars) with values in 0 .. n_values - 1."""
    array = rows.to(torch.int16 if n_values <= 2**15 else torch.int32).cpu().numpy()
    return array.view(np.dtype((np.void, array.shape[1] * array.itemsize))).ravel().tolist()


class _EncodingCache:
    """Token encodings in one (capacity, dim) tensor, found by key (LRU order)."""

    def __init__(self, capacity: int, dim: int, like: torch.Tensor, version: tuple) -> None:
        self.capacity, self.version = capacity, version
        self.store = like.new_empty(0, dim)
        self.slots: OrderedDict[bytes, int] = OrderedDict()
        self.free: list[int] = []  # unused slots of store
        self.hits = self.misses = 0

    def find(self, keys: list[bytes]) -> list[int]:
        """The slot of each key, -1 where absent; found keys become the most recent."""
        out = []
        for key in keys:
            slot = self.slots.get(key, -1)
            if slot >= 0:
                self.slots.move_to_end(key)
            out.append(slot)
        found = sum(slot >= 0 for slot in out)
        self.hits += found
        self.misses += len(keys) - found
        return out

    def add(self, keys: list[bytes], encoded: torch.Tensor) -> None:
        """Store the encodings (len(keys), dim) of new keys, evicting the least recent ones."""
        keys, encoded = keys[-self.capacity :], encoded[-self.capacity :]
        if len(self.free) < len(keys) and len(self.store) < self.capacity:  # grow, at least doubling
            size = min(self.capacity, max(2 * len(self.store), len(self.slots) + len(keys), 256))
            grown = self.store.new_empty(size, self.store.shape[1])
            grown[: len(self.store)] = self.store
            self.free.extend(range(size - 1, len(self.store) - 1, -1))
            self.store = grown
        slots = []
        for key in keys:
            slot = self.free.pop() if self.free else self.slots.popitem(last=False)[1]
            self.slots[key] = slot
            slots.append(slot)
        self.store[torch.tensor(slots, device=self.store.device)] = encoded


_HASH_SEED = 0x5EED
_hash_cache: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _hash_weights(width: int, bound: int, device: torch.device) -> torch.Tensor:
    key = (width, bound, device)
    if key not in _hash_cache:
        generator = torch.Generator().manual_seed(_HASH_SEED)
        weights = torch.randint(1, max(bound, 2), (width,), generator=generator)
        _hash_cache[key] = weights.to(device)
    return _hash_cache[key]


def distinct_rows(ids: torch.Tensor, n_values: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of ids (n, width), values in 0 .. n_values - 1, and for each row the
    index of its distinct row: what ``torch.unique(ids, dim=0, return_inverse=True)`` gives,
    in another row order, at a fraction of the cost.

    Each row is hashed to one int64 (a weighted sum that cannot overflow) and the keys are
    deduplicated; the result is checked against the input, and a collision (rows with the same
    key that differ) falls back to ``torch.unique``, so it is always exact."""
    n, width = ids.shape
    if n == 0:
        return ids, torch.zeros(0, dtype=torch.long, device=ids.device)
    bound = (1 << 62) // max(n_values * width, 1)
    weights = _hash_weights(width, bound, ids.device)
    keys = (ids * weights).sum(dim=-1)
    unique_keys, inverse = torch.unique(keys, return_inverse=True)
    first = torch.empty(len(unique_keys), dtype=torch.long, device=ids.device)
    first.scatter_(0, inverse, torch.arange(n, device=ids.device))
    rows = ids[first]
    if bound < 2 or not torch.equal(rows[inverse], ids):
        return torch.unique(ids, dim=0, return_inverse=True)
    return rows, inverse
