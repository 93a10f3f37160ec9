"""The vocabulary of a language model's softmax: token <-> id, read from and written to a
vocabulary file (one token per line, as bilm-tf reads it)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from ..base.atomic import write_text
from ..base.textfiles import read_lines
from ..model.characters import BOS_TOKEN, EOS_TOKEN

UNK_TOKEN = "<UNK>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
_SKIPPED_VOCAB_LINE = "!!!MAXTERMID"  # marker line of lm_1b vocabulary files; bilm-tf skips it

PathLike = str | os.PathLike

__all__: list[str] = []


class Vocabulary:
    """Token <-> id map of the softmax; ids are line numbers of the vocabulary file.

    Must contain ``<S>``, ``</S>`` and ``<UNK>``. For sampled softmax the non-special tokens must
    be in descending frequency order (see :meth:`check_sorted_by_frequency`).
    """

    def __init__(self, tokens: Iterable[str], *, source: str = "<in memory>") -> None:
        self._tokens: list[str] = list(tokens)
        self._source = source
        self._index: dict[str, int] = {}
        for i, token in enumerate(self._tokens):
            if not isinstance(token, str) or token == "":
                raise ValueError(f"vocabulary {source}: token {i} is empty or not a str: {token!r}")
            if token in self._index:
                raise ValueError(
                    f"vocabulary {source}: token {token!r} appears twice (ids {self._index[token]} and {i})"
                )
            self._index[token] = i
        missing = [t for t in SPECIAL_TOKENS if t not in self._index]
        if missing:
            raise ValueError(
                f"vocabulary {source} is missing the special token(s) {', '.join(missing)}; a biLM "
                f"vocabulary must contain {', '.join(SPECIAL_TOKENS)} (one token per line)"
            )

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: PathLike) -> Vocabulary:
        """Read a vocabulary file: UTF-8, one token per line (surrounding whitespace stripped),
        as ``textfiles.read_lines`` reads text (a byte-order mark is dropped)."""
        tokens = []
        for line_no, line in enumerate(read_lines(path), start=1):
            token = line.strip()
            if token == _SKIPPED_VOCAB_LINE:
                continue
            if token == "":
                raise ValueError(f"vocabulary file {path}: line {line_no} is empty")
            tokens.append(token)
        return cls(tokens, source=str(path))

    @classmethod
    def build(cls, counts: Mapping[str, int], min_count: int = 1, max_size: int | None = None) -> Vocabulary:
        """``<S>, </S>, <UNK>`` then tokens with ``count >= min_count`` by descending count.

        Ties are broken by the token's code points (ascending). ``max_size`` bounds the total size,
        the three special tokens included. Special tokens found in ``counts`` are not repeated.
        """
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}")
        if max_size is not None and max_size < len(SPECIAL_TOKENS):
            raise ValueError(f"max_size must be at least {len(SPECIAL_TOKENS)}, got {max_size}")
        kept = [(t, c) for t, c in counts.items() if c >= min_count and t not in SPECIAL_TOKENS]
        kept.sort(key=lambda tc: (-tc[1], tc[0]))
        words = [t for t, _ in kept]
        if max_size is not None:
            words = words[: max_size - len(SPECIAL_TOKENS)]
        return cls([*SPECIAL_TOKENS, *words], source="<built from counts>")

    def save(self, path: PathLike, overwrite: bool = True) -> None:
        """Write one token per line (UTF-8), readable by :meth:`from_file` and by bilm-tf;
        ``overwrite=False`` never replaces a file (``atomic.atomic_path``)."""
        write_text(path, "".join(token + "\n" for token in self._tokens), overwrite)

    # -- lookups --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._index

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} tokens from {self._source})"

    @property
    def tokens(self) -> list[str]:
        """Tokens in id order (a copy)."""
        return list(self._tokens)

    @property
    def bos(self) -> int:
        return self._index[BOS_TOKEN]

    @property
    def eos(self) -> int:
        return self._index[EOS_TOKEN]

    @property
    def unk(self) -> int:
        return self._index[UNK_TOKEN]

    def token_to_id(self, token: str) -> int:
        """Id of ``token``; unknown tokens map to ``<UNK>``."""
        return self._index.get(token, self._index[UNK_TOKEN])

    def id_to_token(self, token_id: int) -> str:
        return self._tokens[token_id]

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Ids of a token list (no boundary tokens added); unknown tokens -> ``unk``."""
        if isinstance(tokens, str):
            raise TypeError("encode takes a list of tokens, not a str; split it first")
        get, unk = self._index.get, self.unk
        return [get(t, unk) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self._tokens[int(i)] for i in ids]

    # -- corpus statistics ----------------------------------------------------------------------

    def unsorted_position(self, counts: Mapping[str, int]) -> int | None:
        """First id whose corpus count exceeds that of the previous non-special token, else None."""
        previous_count = None
        for i, token in enumerate(self._tokens):
            if token in SPECIAL_TOKENS:
                continue
            count = counts.get(token, 0)
            if previous_count is not None and count > previous_count:
                return i
            previous_count = count
        return None

    def check_sorted_by_frequency(self, counts: Mapping[str, int]) -> None:
        """Raise ValueError unless non-special tokens are in non-increasing ``counts`` order.

        The log-uniform (Zipfian) sampler of the sampled softmax treats id order as frequency rank,
        so sampling with an unsorted vocabulary silently trains the wrong distribution.
        """
        pos = self.unsorted_position(counts)
        if pos is None:
            return
        prev = max(i for i in range(pos) if self._tokens[i] not in SPECIAL_TOKENS)
        tok, prev_tok = self._tokens[pos], self._tokens[prev]
        raise ValueError(
            f"vocabulary {self._source} is not sorted by descending frequency: {tok!r} (id {pos}, "
            f"count {counts.get(tok, 0)}) comes after {prev_tok!r} (id {prev}, count "
            f"{counts.get(prev_tok, 0)}); the sampled softmax's log-uniform sampler needs a "
            "frequency-sorted vocabulary. Rebuild it with Vocabulary.build(count_tokens(files))"
        )

    def coverage(self, counts: Mapping[str, int]) -> float:
        """Fraction of corpus tokens (weighted by ``counts``) that are in the vocabulary."""
        total = sum(counts.values())
        if total == 0:
            raise ValueError("coverage of an empty corpus: counts hold no tokens")
        return sum(c for t, c in counts.items() if t in self._index) / total
