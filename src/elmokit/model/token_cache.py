"""Caches of per-token results: one bounded LRU map, and on it a cache of token encodings that
stays true to the weights that computed them.

``LruCache`` keeps the most recently used entries (the character ids of tokens, the slot of an
encoding). ``EncodingCache`` keeps encodings computed from a module's weights; it is keyed by
what determines them: the token (its key) and the weights' values. Every lookup compares the
weights bit for bit with a copy taken when the cached encodings were computed, and empties the
cache if anything differs, so no way of changing the weights (any optimizer, fused or not, a loop
writing ``p.data``, ``load_state_dict``, ``.to(dtype)`` or ``.to(device)``) can leave it stale.
Under ``torch.compile`` the caches step aside (``caching_allowed``).

A model has one cache of token encodings: its ``TokenEncoder``'s ``EncodingCache``, keyed by each
token's input ids, switched by the kernel ``token_cache``. The Embedder, ``Elmo`` and every other
caller of ``BiLM.forward`` go through it. It was chosen over the Embedder's own cache (keyed by
the token's text) because ``Elmo`` over batches gains from it too (+7% to +14% at batch 64,
docs/benchmarks/kernels.md), and the Embedder lost nothing by the move once char ids were built
with array operations (``characters.tokens_to_ids``), which also made a cache of char ids pointless
(docs/benchmarks/kernels.md, "One token cache"). ``LruCache`` remains for other per-token maps
(``data``'s out-of-vocabulary char ids).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

import torch

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

__all__: list[str] = []


def caching_allowed() -> bool:
    """Whether a cache of per-token results may be used now: not while ``torch.compile`` traces
    the model (the cache's bookkeeping, keyed by each token's bytes in Python, cannot be traced),
    so compiled code computes every token, which gives the same numbers. Every cache of encodings
    asks this before computing its keys."""
    return not torch.compiler.is_compiling()


class LruCache(Generic[K, V]):
    """A map of at most ``capacity`` entries that drops the least recently used first.

    ``get`` counts ``hits`` and ``misses`` and makes a found entry the most recent."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recent entry), or None."""
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        try:
            self._entries.move_to_end(key)
        except KeyError:  # dropped meanwhile by another thread
            pass
        self.hits += 1
        return value

    def put(self, key: K, value: V) -> V | None:
        """Store ``value`` as the most recent entry; returns the value dropped to make room."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self.capacity:
            return self._entries.popitem(last=False)[1]
        return None

    def pop_oldest(self) -> V:
        """Remove the least recently used entry; returns its value."""
        return self._entries.popitem(last=False)[1]

    def clear(self) -> None:
        """Drop every entry and reset the counts."""
        self._entries.clear()
        self.hits = self.misses = 0


def _as_integers(tensor: torch.Tensor) -> torch.Tensor:
    """The bits of a tensor as one flat tensor of the widest integer type that fits them."""
    flat = tensor.detach().contiguous().view(-1)
    nbytes = flat.numel() * flat.element_size()
    for dtype in (torch.int64, torch.int32, torch.int16):
        if dtype.itemsize >= flat.element_size() and nbytes % dtype.itemsize == 0:
            try:
                return flat.view(dtype)
            except RuntimeError:  # a storage offset the wider type does not divide
                break
    return flat.view(torch.uint8)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b have the same dtype, device, shape and bits (so NaN equals NaN)."""
    if a.dtype != b.dtype or a.device != b.device or a.shape != b.shape:
        return False
    return torch.equal(_as_integers(a), _as_integers(b))


class WeightsCheck:
    """Tells whether tensors (a module's weights) still hold the values they held at the last
    check: a copy of them compared bit for bit (one read of the weights and of the copy)."""

    def __init__(self) -> None:
        self._copy: list[torch.Tensor] | None = None

    def unchanged(self, tensors: Iterable[torch.Tensor]) -> bool:
        """True if ``tensors`` equal the copy; otherwise copy them and return False."""
        tensors = list(tensors)
        copy = self._copy
        if copy is not None and len(copy) == len(tensors) and all(map(_same_bits, copy, tensors)):
            return True
        with torch.inference_mode(False), torch.no_grad():  # a copy usable in any mode
            self._copy = [t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]
        return False

    def forget(self) -> None:
        """Drop the copy (the next check says changed)."""
        self._copy = None


class EncodingCache(Generic[K]):
    """Encodings (rows of one tensor) of the last ``capacity`` distinct keys, least recently used
    dropped first, valid for the weights that computed them (see the module docstring).

    A lookup of fewer than ``min_keys`` keys computes them all and leaves the cache as it is:
    comparing the weights reads them twice, which costs more than the 40-60% of one sentence's
    tokens found from earlier calls saves (small shape, one sentence a call, 2 threads: the cache
    used from 32 distinct tokens was 5% slower than none, from 0 11% slower; from 64 it is
    never used at batch 1; benchmarks/results/kernels.md).
    ``hits`` and ``misses`` count keys found and computed since the cache was last emptied."""

    MIN_KEYS = 64

    def __init__(self, capacity: int, min_keys: int = MIN_KEYS) -> None:
        self.min_keys = min_keys
        self._slots: LruCache[K, int] = LruCache(capacity)
        self._free: list[int] = []  # unused rows of the store
        self._store: torch.Tensor | None = None
        self._weights = WeightsCheck()

    @property
    def capacity(self) -> int:
        return self._slots.capacity

    @property
    def hits(self) -> int:
        return self._slots.hits

    @property
    def misses(self) -> int:
        return self._slots.misses

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def rows(self) -> int:
        """Rows allocated for encodings (at most ``capacity``)."""
        return 0 if self._store is None else len(self._store)

    def clear(self) -> None:
        """Drop every encoding and the copy of the weights."""
        self._drop()
        self._weights.forget()

    def _drop(self) -> None:
        self._slots.clear()
        self._free, self._store = [], None

    def lookup(
        self,
        keys: Sequence[K],
        weights: Iterable[torch.Tensor],
        encode: Callable[[list[int]], torch.Tensor],
    ) -> torch.Tensor:
        """The encodings (len(keys), dim) of distinct ``keys``: those found here, the others
        from ``encode(positions)`` -> (len(positions), dim), the encodings of ``keys[p]`` for p
        in positions, which are then kept. ``weights``: every tensor the encodings depend on;
        if one differs from when the kept encodings were computed, they are dropped first."""
        if len(keys) < self.min_keys:
            return encode(list(range(len(keys))))
        if not self._weights.unchanged(weights):
            self._drop()
        slots = [self._slots.get(key) for key in keys]
        missing = [i for i, slot in enumerate(slots) if slot is None]
        store = self._store
        if not missing:
            assert store is not None  # a key has a slot only in a store
            return store[torch.tensor(slots, device=store.device)]
        encoded = encode(missing)
        if len(missing) == len(keys):
            out = encoded
        else:
            out = encoded.new_empty(len(keys), encoded.shape[1])
            found = [i for i, slot in enumerate(slots) if slot is not None]
            assert store is not None  # a key has a slot only in a store
            out[torch.tensor(found, device=out.device)] = store[
                torch.tensor([slots[i] for i in found], device=out.device)
            ]
            out[torch.tensor(missing, device=out.device)] = encoded
        self._add([keys[i] for i in missing], encoded)
        return out

    def _add(self, keys: list[K], encoded: torch.Tensor) -> None:
        """Keep the encodings (len(keys), dim) of new keys, dropping the least recent ones."""
        capacity = self.capacity
        if capacity <= 0:
            return
        if len(keys) > capacity:
            keys, encoded = keys[-capacity:], encoded[-capacity:]
        store = self._store
        rows = 0 if store is None else len(store)
        if len(self._free) < len(keys) and rows < capacity:  # grow, at least doubling
            size = min(capacity, max(2 * rows, len(self._slots) + len(keys), 256))
            with torch.inference_mode(False):  # a store writable in any mode
                grown = torch.empty(size, encoded.shape[1], dtype=encoded.dtype, device=encoded.device)
            if store is not None:
                grown[:rows] = store
            self._free.extend(range(size - 1, rows - 1, -1))
            self._store = store = grown
        assert store is not None  # grown above unless its free slots hold the keys
        slots = []
        for key in keys:
            slot = self._free.pop() if self._free else self._slots.pop_oldest()
            self._slots.put(key, slot)
            slots.append(slot)
        store[torch.tensor(slots, device=store.device)] = encoded
