"""Data for biLM training: corpus streaming and bilm-tf style batches (the vocabulary they map
tokens with is ``elmokit.lm.vocabulary``).

Independent of the model. The semantics follow the original bilm-tf (``bilm/data.py``):

* A corpus is a glob of text files ("shards"), one whitespace-tokenized sentence per line, read
  as UTF-8 (blank lines are skipped). Training reads the shards in a random order, shuffles the
  sentences within each shard and repeats forever (a new shard order each epoch).
* Each of the ``batch_size`` rows of a batch is a continuous stream of sentences
  ``[<S>, tokens..., </S>]``. A row takes ``min(len(sentence) - 1, unroll_steps - position)``
  tokens of its current sentence as inputs and the tokens one step later as targets, so ``</S>``
  is only ever a target, and a long sentence continues in the same row of the next batch
  (parity trap 7).
* The backward direction is an independent stream of reversed sentences
  ``[</S>, t_n, ..., t_1, <S>]`` with its own shuffle: within a batch the two directions see
  different text (parity trap 12).
* Character ids are the unshifted ids of :func:`elmokit.model.characters.token_to_ids` (0..260), which
  is what bilm-tf feeds at training time (``n_characters`` 261). Pass ``char_id_offset=1`` for the
  shifted ids (1..261) that a model with a padding row 0 (``n_characters`` 262) expects.

Distributed training (``rank`` / ``world_size``): with at least ``world_size`` shards, the sorted
shard list is dealt round-robin (rank ``r`` reads shards ``r, r + world_size, ...``); otherwise
every rank reads every shard and keeps the non-blank lines whose index within the shard is
``r (mod world_size)``. Either way the ranks' sentences partition the corpus. Ranks may see
different amounts of text, so a single pass (``loop=False``) may give each rank a different
number of batches: reduce totals after the loop, not per batch.

Resumability: shard and sentence orders are derived from ``(seed, direction, rank, epoch, shard)``
by counter-based seeding, so a generator's position is a few integers plus the unfinished sentence
of each batch row. ``state_dict()`` returns that as JSON-serializable data; ``load_state_dict()``
on a fresh instance continues with exactly the batches the original would have produced. It
checks the shards by file name, not path, so a corpus may be moved between the two.
"""

from __future__ import annotations

import glob
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..base.textfiles import read_lines
from ..lm.vocabulary import Vocabulary
from ..model.characters import BOS_TOKEN, EOS_TOKEN, MAX_CHARACTERS_PER_TOKEN, token_to_ids
from ..model.token_cache import LruCache

_STATE_VERSION = 1
_OOV_CACHE = 100_000  # out-of-vocabulary tokens whose char ids are kept (the most recent)
HELDOUT_BATCH_SIZE = 256  # streams of bilm-tf's evaluation protocol

PathLike = str | os.PathLike
Files = PathLike | Sequence[PathLike]

__all__: list[str] = []


def count_tokens(paths: PathLike | Iterable[PathLike]) -> Counter[str]:
    """Token counts over text files (one whitespace-tokenized sentence per line), streaming.

    ``paths``: a list of files, or one str / Path taken as a glob (see :func:`corpus_files`).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = corpus_files(paths)
    counts: Counter[str] = Counter()
    for path in paths:
        for line in _read_lines(path):
            counts.update(line.split())
    return counts


# ----------------------------------------------------------------------------------------------
# Corpus streaming
# ----------------------------------------------------------------------------------------------


def corpus_files(pattern: PathLike) -> list[str]:
    """Sorted regular files matching a glob (``~`` expanded, ``**`` recursive)."""
    expanded = os.path.expanduser(str(pattern))
    files = sorted(p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
    if not files:
        raise FileNotFoundError(f"no files match the corpus glob {str(pattern)!r}")
    return files


def read_sentences(pattern: PathLike, limit: int | None = None) -> list[list[str]]:
    """The sentences of the files a glob names: each non-empty line split on whitespace, in
    file order, the first ``limit`` of them (None: all)."""
    out: list[list[str]] = []
    for path in corpus_files(pattern):
        for line in read_lines(path):
            if line.split():
                out.append(line.split())
            if limit is not None and len(out) >= limit:
                return out
    return out


def _resolve_files(files: Files) -> list[str]:
    if isinstance(files, (str, os.PathLike)):
        return corpus_files(files)
    resolved = [str(f) for f in files]
    if not resolved:
        raise FileNotFoundError("empty list of corpus files")
    for f in resolved:
        if not os.path.isfile(f):
            raise FileNotFoundError(f"corpus file {f!r} does not exist")
    return resolved


def _read_lines(path: PathLike) -> Iterator[str]:
    """Non-blank lines of a UTF-8 file, stripped (``textfiles.read_lines``: the package's one
    rule for lines, byte-order marks and bytes that are not UTF-8)."""
    for line in read_lines(path):
        line = line.strip()
        if line:
            yield line


def _names(files: Sequence[str]) -> list[str]:
    """The file names (without folders) of a list of shards."""
    return [os.path.basename(f) for f in files]


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([int(k) for k in key])


class SentenceStream:
    """Sentences (token lists, no boundary tokens) of a corpus in bilm-tf order.

    ``shuffle``: shards in a random order per epoch and sentences shuffled within each shard;
    otherwise sorted shard order and file order. ``loop``: repeat forever (training) or stop after
    one pass. ``stream_id`` separates the random orders of independent streams (0 forward,
    1 backward). See the module docstring for ``rank`` / ``world_size``.
    """

    def __init__(
        self,
        files: Files,
        *,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        loop: bool = True,
        seed: int = 0,
        stream_id: int = 0,
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got {rank=} {world_size=}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        all_files = _resolve_files(files)
        if len(all_files) >= world_size:
            self._files, self._stride, self._offset = all_files[rank::world_size], 1, 0
        else:
            self._files, self._stride, self._offset = all_files, world_size, rank
        self._config: dict[str, Any] = {
            "files": list(self._files),
            "rank": rank,
            "world_size": world_size,
            "shuffle": shuffle,
            "loop": loop,
            "seed": seed,
            "stream_id": stream_id,
        }
        self._shuffle, self._loop, self._seed, self._stream_id, self._rank = (
            shuffle,
            loop,
            seed,
            stream_id,
            rank,
        )
        self._epoch = 0
        self._shard_pos = 0
        self._sent_pos = 0
        self._seen_in_epoch = False
        self._exhausted = False
        self._order_cache: tuple[int, list[int]] | None = None
        self._shard_cache: tuple[tuple[int, int], list[str]] | None = None

    @property
    def files(self) -> list[str]:
        """The shards this rank reads."""
        return list(self._files)

    @property
    def epoch(self) -> int:
        """Number of completed passes over this rank's shards."""
        return self._epoch

    def _shard_order(self) -> list[int]:
        if self._order_cache is None or self._order_cache[0] != self._epoch:
            n = len(self._files)
            if self._shuffle:
                key = (self._seed, self._stream_id, self._rank, self._epoch, 0, 0)
                order = [int(i) for i in _rng(*key).permutation(n)]
            else:
                order = list(range(n))
            self._order_cache = (self._epoch, order)
        return self._order_cache[1]

    def _shard(self) -> list[str]:
        key = (self._epoch, self._shard_pos)
        if self._shard_cache is None or self._shard_cache[0] != key:
            shard = self._shard_order()[self._shard_pos]
            lines = list(_read_lines(self._files[shard]))[self._offset :: self._stride]
            if self._shuffle:
                rng_key = (self._seed, self._stream_id, self._rank, self._epoch, 1, shard)
                lines = [lines[i] for i in _rng(*rng_key).permutation(len(lines))]
            self._shard_cache = (key, lines)
        return self._shard_cache[1]

    def __iter__(self) -> SentenceStream:
        return self

    def __next__(self) -> list[str]:
        if self._exhausted:
            raise StopIteration
        while True:
            sentences = self._shard()
            if self._sent_pos < len(sentences):
                line = sentences[self._sent_pos]
                self._sent_pos += 1
                self._seen_in_epoch = True
                return line.split()
            self._shard_pos += 1
            self._sent_pos = 0
            if self._shard_pos == len(self._files):
                if not self._seen_in_epoch:
                    raise ValueError(
                        f"empty corpus: no sentences for rank {self._config['rank']} of "
                        f"{self._config['world_size']} in {self._files} (all files empty or blank)"
                    )
                if not self._loop:
                    self._exhausted = True
                    raise StopIteration
                self._epoch += 1
                self._shard_pos = 0
                self._seen_in_epoch = False

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable position: configuration (checked on load) and counters. The shards
        are recorded by file name, as ``load_state_dict`` compares them (no machine path in a
        checkpoint)."""
        return {
            **self._config,
            "files": _names(self._config["files"]),
            "epoch": self._epoch,
            "shard_pos": self._shard_pos,
            "sent_pos": self._sent_pos,
            "seen_in_epoch": self._seen_in_epoch,
            "exhausted": self._exhausted,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at ``state``'s position. The shards are compared by file name (in order),
        not by path: a corpus may be moved between a checkpoint and its resumption."""
        for name, value in self._config.items():
            if name == "files":
                ours, theirs = _names(value), _names(state.get(name) or [])
                if ours != theirs:
                    raise ValueError(
                        f"the data position is for the shards {', '.join(theirs)}, but the corpus "
                        f"glob matches {', '.join(ours)}; resume with the same shards (they may be "
                        "moved), or add --new-data to read the new ones from their beginning"
                    )
            elif state.get(name) != value:
                raise ValueError(
                    f"sentence stream state does not match this stream: {name} is "
                    f"{state.get(name)!r} in the state, {value!r} here"
                )
        self._epoch = int(state["epoch"])
        self._shard_pos = int(state["shard_pos"])
        self._sent_pos = int(state["sent_pos"])
        self._seen_in_epoch = bool(state["seen_in_epoch"])
        self._exhausted = bool(state["exhausted"])
        self._order_cache = self._shard_cache = None


# ----------------------------------------------------------------------------------------------
# Batches
# ----------------------------------------------------------------------------------------------


class _TokenEncoder:
    """Token ids and char ids of token lists, with char ids cached per vocabulary id.

    In-vocabulary tokens read their char ids from a table filled on first use (one
    ``token_to_ids`` call per vocabulary entry); out-of-vocabulary tokens get the ``<UNK>`` token id
    but their own characters, as bilm-tf's ``UnicodeCharsVocabulary.word_to_char_ids``.
    """

    def __init__(self, vocab: Vocabulary, max_chars: int, char_id_offset: int) -> None:
        self.vocab = vocab
        self.max_chars = max_chars
        self.char_id_offset = char_id_offset
        self._index = vocab._index
        self._unk = vocab.unk
        # Zero-filled pages are only committed when written: cost grows with the tokens seen.
        self._table = np.zeros((len(vocab), max_chars), dtype=np.int16)
        self._filled = np.zeros(len(vocab), dtype=bool)
        self._oov_chars: LruCache[str, np.ndarray] = LruCache(_OOV_CACHE)

    def _chars(self, token: str) -> np.ndarray:
        return np.asarray(token_to_ids(token, self.max_chars), dtype=np.int16) + self.char_id_offset

    def encode(self, tokens: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """tokens (n,) -> token ids int64 (n,), char ids int16 (n, max_chars)."""
        get = self._index.get
        ids = np.array([get(t, -1) for t in tokens], dtype=np.int64)
        oov = ids < 0
        if oov.any():
            ids[oov] = self._unk
        unfilled = ids[~self._filled[ids]]
        if unfilled.size:
            tokens_of = self.vocab._tokens
            for i in np.unique(unfilled).tolist():
                self._table[i] = self._chars(tokens_of[i])
                self._filled[i] = True
        chars = self._table[ids]
        if oov.any():
            cache = self._oov_chars
            for j in np.flatnonzero(oov).tolist():
                row = cache.get(tokens[j])
                if row is None:
                    row = self._chars(tokens[j])
                    cache.put(tokens[j], row)
                chars[j] = row
        return ids, chars


class _Row:
    """The sentence a batch row is in the middle of; ``offset`` = next token to feed."""

    __slots__ = ("tokens", "ids", "chars", "offset")

    def __init__(self, tokens: list[str], encoder: _TokenEncoder) -> None:
        self.tokens = tokens
        self.ids, self.chars = encoder.encode(tokens)
        self.offset = 0

    @property
    def remaining(self) -> int:
        return len(self.tokens) - self.offset


class LMBatches:
    """Batches for one direction of the biLM, as bilm-tf's ``LMDataset.iter_batches``.

    Yields dicts of int64 numpy arrays: ``token_ids`` (B, T) inputs, ``char_ids`` (B, T, max_chars) their
    char ids, ``next_token_id`` (B, T) targets, with B = ``batch_size`` and T = ``unroll_steps``.
    ``reverse=True`` streams reversed sentences ``[</S>, t_n, ..., t_1, <S>]``. With ``loop=False``
    it stops when the corpus runs out; the last, incomplete batch is dropped (as bilm-tf).
    """

    def __init__(
        self,
        files: Files,
        vocab: Vocabulary,
        batch_size: int,
        unroll_steps: int = 20,
        *,
        reverse: bool = False,
        shuffle: bool = True,
        loop: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        max_characters_per_token: int = MAX_CHARACTERS_PER_TOKEN,
        char_id_offset: int = 0,
        _encoder: _TokenEncoder | None = None,
    ) -> None:
        if batch_size < 1 or unroll_steps < 1:
            raise ValueError(
                f"batch_size and unroll_steps must be positive, got {batch_size}, {unroll_steps}"
            )
        self._stream = SentenceStream(
            files,
            rank=rank,
            world_size=world_size,
            shuffle=shuffle,
            loop=loop,
            seed=seed,
            stream_id=1 if reverse else 0,
        )
        self._encoder = _encoder or _TokenEncoder(vocab, max_characters_per_token, char_id_offset)
        self.batch_size, self.unroll_steps, self.reverse = batch_size, unroll_steps, reverse
        self._rows: list[_Row | None] = [None] * batch_size
        self._batches = 0
        self._done = False

    @property
    def stream(self) -> SentenceStream:
        return self._stream

    @property
    def batches(self) -> int:
        """Number of batches yielded so far."""
        return self._batches

    def _next_sentence(self) -> list[str]:
        tokens = next(self._stream)
        if self.reverse:
            tokens.reverse()
            return [EOS_TOKEN, *tokens, BOS_TOKEN]
        return [BOS_TOKEN, *tokens, EOS_TOKEN]

    def __iter__(self) -> LMBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._done:
            raise StopIteration
        b, t, c = self.batch_size, self.unroll_steps, self._encoder.max_chars
        inputs = np.zeros((b, t), dtype=np.int64)
        targets = np.zeros((b, t), dtype=np.int64)
        chars = np.zeros((b, t, c), dtype=np.int64)
        no_more_data = False
        for i in range(b):
            pos = 0
            while pos < t:
                row = self._rows[i]
                if row is None or row.remaining <= 1:
                    try:
                        row = _Row(self._next_sentence(), self._encoder)
                    except StopIteration:
                        no_more_data = True
                        break
                    self._rows[i] = row
                how_many = min(row.remaining - 1, t - pos)
                o = row.offset
                inputs[i, pos : pos + how_many] = row.ids[o : o + how_many]
                chars[i, pos : pos + how_many] = row.chars[o : o + how_many]
                targets[i, pos : pos + how_many] = row.ids[o + 1 : o + how_many + 1]
                row.offset += how_many
                pos += how_many
        if no_more_data:
            self._done = True
            raise StopIteration
        self._batches += 1
        return {"token_ids": inputs, "char_ids": chars, "next_token_id": targets}

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable: stream position and each row's unfinished sentence (tokens)."""
        return {
            "version": _STATE_VERSION,
            "batch_size": self.batch_size,
            "unroll_steps": self.unroll_steps,
            "reverse": self.reverse,
            "batches": self._batches,
            "done": self._done,
            "stream": self._stream.state_dict(),
            "rows": [None if r is None else r.tokens[r.offset :] for r in self._rows],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unknown batch state version {state.get('version')!r}")
        for name in ("batch_size", "unroll_steps", "reverse"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"batch state does not match: {name} is {state[name]!r} in the state, "
                    f"{getattr(self, name)!r} here"
                )
        self._stream.load_state_dict(state["stream"])
        self._rows = [None if r is None else _Row(list(r), self._encoder) for r in state["rows"]]
        self._batches = int(state["batches"])
        self._done = bool(state["done"])


class BidirectionalLMBatches:
    """Forward and backward batches from two independent streams (bilm-tf BidirectionalLMDataset).

    Yields dicts of int64 numpy arrays: ``token_ids``, ``next_token_id`` (B, T), ``char_ids``
    (B, T, max_chars), and the same keys with ``_reverse`` for the backward direction, whose rows
    hold reversed sentences from its own shuffle. The two directions share one char-id cache.
    """

    def __init__(
        self,
        files: Files,
        vocab: Vocabulary,
        batch_size: int,
        unroll_steps: int = 20,
        *,
        shuffle: bool = True,
        loop: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        max_characters_per_token: int = MAX_CHARACTERS_PER_TOKEN,
        char_id_offset: int = 0,
    ) -> None:
        if not isinstance(files, (str, os.PathLike)):
            files = list(files)
        encoder = _TokenEncoder(vocab, max_characters_per_token, char_id_offset)

        def direction(reverse: bool) -> LMBatches:
            return LMBatches(
                files,
                vocab,
                batch_size,
                unroll_steps,
                reverse=reverse,
                shuffle=shuffle,
                loop=loop,
                seed=seed,
                rank=rank,
                world_size=world_size,
                max_characters_per_token=max_characters_per_token,
                char_id_offset=char_id_offset,
                _encoder=encoder,
            )

        self.forward = direction(reverse=False)
        self.backward = direction(reverse=True)

    @property
    def batches(self) -> int:
        return self.forward.batches

    def __iter__(self) -> BidirectionalLMBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self.forward)
        for key, value in next(self.backward).items():
            batch[key + "_reverse"] = value
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"forward": self.forward.state_dict(), "backward": self.backward.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.forward.load_state_dict(state["forward"])
        self.backward.load_state_dict(state["backward"])


def heldout_batches(
    files: Files,
    vocab: Vocabulary,
    batch_size: int = HELDOUT_BATCH_SIZE,
    unroll_steps: int = 1,
    *,
    rank: int = 0,
    world_size: int = 1,
    max_characters_per_token: int = MAX_CHARACTERS_PER_TOKEN,
    char_id_offset: int = 0,
) -> BidirectionalLMBatches:
    """Evaluation batches with bilm-tf's test protocol (``bilm/training.py:test``, ``run_test.py``).

    Batch 256, ``unroll_steps`` 1, no shuffling (sorted shard order, file order of sentences), one
    pass, the final incomplete batch dropped (with each row's unfinished sentence). Carry the LSTM
    state from batch to batch. There is no padding: every batch has ``batch_size * unroll_steps``
    targets per direction, so the mean of per-batch mean losses is the per-token mean. Both
    directions read the same sentences in the same rows (reversed in the backward one).
    """
    return BidirectionalLMBatches(
        files,
        vocab,
        batch_size,
        unroll_steps,
        shuffle=False,
        loop=False,
        rank=rank,
        world_size=world_size,
        max_characters_per_token=max_characters_per_token,
        char_id_offset=char_id_offset,
    )
