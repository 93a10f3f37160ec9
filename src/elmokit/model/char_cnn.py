"""The context-independent token encoder: character CNN -> highway layers -> projection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import torch
from torch import nn

from ..base import kernels
from ..base.kernels import max_over_windows, needs_autograd
from .characters import PADDING_CHAR
from .highway import Highway
from .options import CharCNNOptions
from .token_cache import EncodingCache, caching_allowed

__all__: list[str] = []


class CharCNN(nn.Module):
    """Character embedding and max-pooled convolutions: (n_tokens, max_chars) -> (n_tokens, n_filters).

    Char ids are shifted (0 = no token, whose embedding row stays zero). As in the original, every
    one of the ``max_chars`` positions, padding characters included, takes part in the max-pool.
    ``padding_id`` is the (shifted) id that pads a token to ``max_chars``: bilm-tf's 261, or the
    ``<pad>`` of ELMoForManyLangs' char.dic.
    """

    def __init__(self, options: CharCNNOptions, padding_id: int = PADDING_CHAR + 1) -> None:
        super().__init__()
        self.max_chars = options.max_characters_per_token
        self.padding_id = padding_id
        self.embedding = nn.Embedding(options.n_characters, options.embedding_dim, padding_idx=0)
        self.convolutions = nn.ModuleList(
            nn.Conv1d(options.embedding_dim, n_filters, kernel_size=width)
            for width, n_filters in options.filters
        )
        self.activation = torch.tanh if options.activation == "tanh" else torch.relu
        self._tanh = options.activation == "tanh"
        self.reset_parameters()

    @property
    def filter_convolutions(self) -> Sequence[nn.Conv1d]:
        """The convolutions, one per filter width (``self.convolutions``, typed as what it holds)."""
        return cast("Sequence[nn.Conv1d]", self.convolutions)

    @property
    def output_dim(self) -> int:
        return sum(conv.out_channels for conv in self.filter_convolutions)

    def reset_parameters(self) -> None:
        """The original's initialisation (uniform +-1 embeddings; Kim et al. or Glorot filters)."""
        nn.init.uniform_(self.embedding.weight, -1.0, 1.0)
        with torch.no_grad():
            self.embedding.weight[0].zero_()
        for conv in self.filter_convolutions:
            if self._tanh:
                fan_in = conv.kernel_size[0] * conv.in_channels
                nn.init.normal_(conv.weight, std=(1.0 / fan_in) ** 0.5)
            else:
                nn.init.uniform_(conv.weight, -0.05, 0.05)
            nn.init.zeros_(cast(torch.Tensor, conv.bias))  # made with a bias

    # Tokens are grouped by length so that each group is convolved over a shorter prefix.
    LENGTH_BUCKETS = (8, 12, 20)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(n_tokens, max_chars) shifted ids -> (n_tokens, n_filters).

        Exact speed-up: a window made only of padding characters gives the same value for every
        token, so a token whose last character that is not padding is at position ``L - 1``
        (begin/end of word included) needs only the first ``L + max_width`` positions: that
        prefix holds every window touching a real character and, where the full width has one, a
        window of padding only.
        """
        lengths = self._real_lengths(char_ids)
        max_width = max(conv.kernel_size[0] for conv in self.filter_convolutions)
        order = torch.argsort(lengths)
        lengths, ids = lengths[order], char_ids[order]
        bounds = torch.bucketize(
            torch.tensor(self.LENGTH_BUCKETS, device=lengths.device), lengths, right=True
        ).tolist()
        pieces, start = [], 0
        for end, limit in zip([*bounds, len(ids)], [*self.LENGTH_BUCKETS, self.max_chars]):
            if end > start:
                width = min(self.max_chars, limit + max_width)
                # whether the last max_width positions of every row are padding characters
                padded_tail = limit + max_width <= self.max_chars
                pieces.append(self._convolve(ids[start:end, :width], padded_tail))
                start = end
        out = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        return out[torch.argsort(order)]

    def _real_lengths(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Per token, 1 + the position of its last character that is not padding (max_chars for
        an all-zero row): a padding id between real characters does not shorten it."""
        positions = torch.arange(1, char_ids.shape[-1] + 1, device=char_ids.device)
        return ((char_ids != self.padding_id) * positions).amax(dim=-1)

    def _convolve(self, char_ids: torch.Tensor, padded_tail: bool = False) -> torch.Tensor:
        """(n, width) -> (n, n_filters): embedding, convolutions, max over positions, activation.
        ``padded_tail``: the last ``max_width`` positions of every row are padding characters
        (unused here; a subclass may take a shortcut then, as ``int8.Int8CharCNN`` does)."""
        x = self.embedding(char_ids).transpose(1, 2)  # (n, char_dim, width)
        convs = self.filter_convolutions  # each made with a bias
        pooled = [max_over_windows(x, conv.weight, cast(torch.Tensor, conv.bias)) for conv in convs]
        return self.activation(torch.cat(pooled, dim=-1))


class TokenEncoder(nn.Module):
    """Char CNN, highway layers and projection: char ids (..., max_chars) -> (..., projection_dim).

    ELMoForManyLangs' variant (``manylangs``): ``padding_id`` its ``<pad>`` character (shifted);
    ``word_embedding`` = (rows, dim) adds a word embedding, read from one more input column after
    the characters (the shifted word id, 0 = no token), whose vector comes before the highway
    output in the projection's input ([word; chars]); ``always_project`` keeps the projection
    when the sizes already agree. Input rows are then (..., max_chars + 1).

    The CNN runs once per distinct token of the input; the result is identical to running it on
    every position. Without autograd, the encodings of the last ``cache_size`` distinct tokens
    are kept across calls (LRU; ``cache_size = 0`` turns it off; the kernel ``token_cache``), so
    a stream of batches encodes each token once. This is the model's one token-encoding cache:
    the Embedder, ``Elmo`` and every other caller of ``BiLM.forward`` go through it, and no
    other cache of tokens' encodings or char ids exists (docs/benchmarks/kernels.md, "One token
    cache", has the measurements behind that choice). A call with fewer than ``cache_min_tokens``
    distinct tokens (about one sentence) does not use the cache: checking the weights would cost
    more than it saves. Each call that does first compares the weights with a copy of those that
    computed the kept encodings and empties the cache if they differ
    (``token_cache.EncodingCache``): however the weights change, results equal the uncached
    computation.
    """

    DEFAULT_CACHE_SIZE = 100_000  # what the Embedder's own cache kept before it used this one

    def __init__(
        self,
        options: CharCNNOptions,
        projection_dim: int,
        *,
        padding_id: int = PADDING_CHAR + 1,
        word_embedding: tuple[int, int] | None = None,
        always_project: bool = False,
    ) -> None:
        super().__init__()
        self.cache_size = self.DEFAULT_CACHE_SIZE
        self.cache_min_tokens = EncodingCache.MIN_KEYS
        self._cache: EncodingCache[bytes] | None = None
        self.char_cnn = CharCNN(options, padding_id)
        n_filters = self.char_cnn.output_dim
        self.highway = Highway(n_filters, options.n_highway)
        self.word_embedding: nn.Embedding | None = None
        limits = [options.n_characters] * options.max_characters_per_token
        n_features = n_filters
        if word_embedding is not None:
            self.word_embedding = nn.Embedding(*word_embedding, padding_idx=0)
            limits.append(word_embedding[0])
            n_features += word_embedding[1]
        self.projection: nn.Linear | None = None
        if always_project or n_features != projection_dim:
            self.projection = nn.Linear(n_features, projection_dim)
            nn.init.normal_(self.projection.weight, std=(1.0 / n_features) ** 0.5)
            nn.init.zeros_(self.projection.bias)
        self.output_dim = projection_dim
        self.input_width = len(limits)  # ids per token
        self.n_id_values = max(limits)
        # the ids each input column may hold: 0 .. limit - 1
        self.id_limits: torch.Tensor  # (input_width,)
        self.register_buffer("id_limits", torch.tensor(limits), persistent=False)
        # the weights that hash each input row to one int64 key (distinct_rows)
        self.row_hash_weights: torch.Tensor  # (input_width,)
        hash_weights = row_hash_weights(len(limits), self.n_id_values)
        self.register_buffer("row_hash_weights", hash_weights, persistent=False)

    def encode_unique(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(n_tokens, input_width) -> (n_tokens, projection_dim), one CNN pass per row."""
        if self.word_embedding is None:
            x = self.highway(self.char_cnn(char_ids))
        else:
            chars = self.highway(self.char_cnn(char_ids[:, : self.char_cnn.max_chars]))
            x = torch.cat([self.word_embedding(char_ids[:, -1]), chars], dim=-1)
        return x if self.projection is None else self.projection(x)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(..., input_width) -> (..., projection_dim); the CNN runs once per distinct token."""
        flat = char_ids.reshape(-1, char_ids.shape[-1])
        unique, inverse = distinct_rows(flat, self.n_id_values, self.row_hash_weights)
        if (
            self.cache_size > 0
            and len(unique)
            and kernels.enabled("token_cache")
            and caching_allowed()
            and not needs_autograd(self, self.char_cnn.embedding.weight)
        ):
            if self._cache is None or self._cache.capacity != self.cache_size:
                self._cache = EncodingCache(self.cache_size)
            self._cache.min_keys = self.cache_min_tokens
            keys = _row_keys(unique, self.n_id_values)
            encoded = self._cache.lookup(
                keys, self.parameters(), lambda rows: self.encode_unique(unique[rows])
            )
        else:
            encoded = self.encode_unique(unique)
        return encoded[inverse].reshape(*char_ids.shape[:-1], self.output_dim)

    @property
    def cache_stats(self) -> tuple[int, int]:
        """(hits, misses) in distinct tokens since the cache was last emptied."""
        return (0, 0) if self._cache is None else (self._cache.hits, self._cache.misses)

    def clear_cache(self) -> None:
        """Drop the kept encodings (never needed for correctness; frees their memory)."""
        self._cache = None


def _row_keys(rows: torch.Tensor, n_values: int) -> list[bytes]:
    """One bytes key per row of char ids (n, max_chars) with values in 0 .. n_values - 1."""
    array = rows.to(torch.int16 if n_values <= 2**15 else torch.int32).cpu().numpy()
    keys: list[bytes] = array.view(np.dtype((np.void, array.shape[1] * array.itemsize))).ravel().tolist()
    return keys


_HASH_SEED = 0x5EED


def _hash_bound(width: int, n_values: int) -> int:
    """The largest hash weight for which a row's weighted sum cannot overflow an int64."""
    return (1 << 62) // max(n_values * width, 1)


def row_hash_weights(width: int, n_values: int) -> torch.Tensor:
    """(width,) int64: fixed random weights that hash a row of ``width`` values in
    0 .. n_values - 1 to one int64 (``distinct_rows``); a ``TokenEncoder`` keeps them as a buffer."""
    generator = torch.Generator().manual_seed(_HASH_SEED)
    return torch.randint(1, max(_hash_bound(width, n_values), 2), (width,), generator=generator)


def distinct_rows(
    ids: torch.Tensor, n_values: int, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of ids (n, width), values in 0 .. n_values - 1, and for each row the
    index of its distinct row: what ``torch.unique(ids, dim=0, return_inverse=True)`` gives,
    in another row order, at a fraction of the cost. ``weights``: ``row_hash_weights(width,
    n_values)`` on ids' device (made here when None).

    Each row is hashed to one int64 (a weighted sum that cannot overflow) and the keys are
    deduplicated; the result is checked against the input, and a collision (rows with the same
    key that differ) falls back to ``torch.unique``, so it is always exact."""
    n, width = ids.shape
    if n == 0:
        return ids, torch.zeros(0, dtype=torch.long, device=ids.device)
    bound = _hash_bound(width, n_values)
    if weights is None:
        weights = row_hash_weights(width, n_values).to(ids.device)
    keys = (ids * weights).sum(dim=-1)
    unique_keys, inverse = torch.unique(keys, return_inverse=True)
    first = torch.empty(len(unique_keys), dtype=torch.long, device=ids.device)
    first.scatter_(0, inverse, torch.arange(n, device=ids.device))
    rows = ids[first]
    if bound < 2 or not torch.equal(rows[inverse], ids):
        return torch.unique(ids, dim=0, return_inverse=True)
    return rows, inverse
