"""The character id scheme of ELMo's token encoder.

A token is its UTF-8 bytes (0..255) wrapped as [begin-of-word, bytes..., end-of-word] and padded to
``max_characters_per_token``. Sentence boundary tokens use the reserved ids 256 (<S>) and 257 (</S>).
At run time every id is shifted by +1 so that 0 means "no token" (padding).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .token_cache import LruCache

__all__ = [
    "BEGIN_OF_SENTENCE_CHAR",
    "BEGIN_OF_WORD_CHAR",
    "BOS_TOKEN",
    "END_OF_SENTENCE_CHAR",
    "END_OF_WORD_CHAR",
    "EOS_TOKEN",
    "EXPECTED_SENTENCES",
    "MAX_CHARACTERS_PER_TOKEN",
    "PADDING_CHAR",
    "batch_to_ids",
    "check_token_lists",
    "lengths_from_ids",
    "pad_batch",
    "token_to_ids",
    "tokens_to_ids",
]

MAX_CHARACTERS_PER_TOKEN = 50
BEGIN_OF_SENTENCE_CHAR = 256  # <S>
END_OF_SENTENCE_CHAR = 257  # </S>
BEGIN_OF_WORD_CHAR = 258
END_OF_WORD_CHAR = 259
PADDING_CHAR = 260
BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"


def _marker_ids(char: int, max_chars: int) -> tuple[int, ...]:
    ids = [PADDING_CHAR] * max_chars
    ids[:3] = [BEGIN_OF_WORD_CHAR, char, END_OF_WORD_CHAR]
    return tuple(ids)


# the ids of the most recently used tokens, by (token, max_chars)
_IDS: LruCache[tuple[str, int], tuple[int, ...]] = LruCache(200_000)


def token_to_ids(token: str, max_chars: int = MAX_CHARACTERS_PER_TOKEN) -> tuple[int, ...]:
    """Unshifted character ids (0..260) of one token, length ``max_chars``.

    ``<S>`` and ``</S>`` map to the sentence boundary ids. A token longer than ``max_chars - 2``
    bytes keeps its first ``max_chars - 2`` bytes.
    """
    if not isinstance(token, str):
        raise TypeError(f"a token must be a str, got {type(token).__name__}: {token!r}")
    key = (token, max_chars)
    ids = _IDS.get(key)
    if ids is None:
        ids = _token_to_ids(token, max_chars)
        _IDS.put(key, ids)
    return ids


def _token_to_ids(token: str, max_chars: int) -> tuple[int, ...]:
    """``token_to_ids`` of a str, without the cache."""
    if token == "":
        raise ValueError("empty token: every token must have at least one character")
    if max_chars < 3:
        raise ValueError(f"max_characters_per_token must be at least 3, got {max_chars}")
    if token == BOS_TOKEN:
        return _marker_ids(BEGIN_OF_SENTENCE_CHAR, max_chars)
    if token == EOS_TOKEN:
        return _marker_ids(END_OF_SENTENCE_CHAR, max_chars)
    body = list(token.encode("utf-8", "ignore")[: max_chars - 2])
    ids = [BEGIN_OF_WORD_CHAR, *body, END_OF_WORD_CHAR]
    return tuple(ids + [PADDING_CHAR] * (max_chars - len(ids)))


def tokens_to_ids(
    tokens: Sequence[str], max_chars: int = MAX_CHARACTERS_PER_TOKEN, cache: bool = True
) -> torch.Tensor:
    """Shifted character ids of a token list: LongTensor (n_tokens, max_chars), values 1..261.

    ``cache=False`` neither reads nor fills the cache of recent tokens' ids (for callers that
    keep their own per-token cache, whose misses are rarely in this one)."""
    if len(tokens) == 0:
        return torch.zeros((0, max_chars), dtype=torch.long)
    if cache:
        rows = [token_to_ids(t, max_chars) for t in tokens]
    else:
        rows = [_token_to_ids(_checked_token(t), max_chars) for t in tokens]
    return torch.tensor(rows, dtype=torch.long) + 1


def _checked_token(token: str) -> str:
    if not isinstance(token, str):
        raise TypeError(f"a token must be a str, got {type(token).__name__}: {token!r}")
    return token


EXPECTED_SENTENCES = "expected a list of sentences, each a list of str tokens, e.g. [['Hello', 'world']]"


def check_token_lists(sentences: Sequence[Sequence[str]]) -> None:
    """Raise a TypeError naming the first sentence or token that is not what tokenized input
    is: a list of sentences, each a list of str tokens."""
    if isinstance(sentences, str) or not isinstance(sentences, Sequence):
        raise TypeError(f"{EXPECTED_SENTENCES}; got {type(sentences).__name__}")
    for i, sentence in enumerate(sentences):
        if isinstance(sentence, str):
            raise TypeError(f"sentence {i} is a str, not a list of tokens; split it first, e.g. text.split()")
        if not isinstance(sentence, Sequence):
            raise TypeError(
                f"sentence {i} is {type(sentence).__name__}, not a list of tokens; {EXPECTED_SENTENCES}"
            )
        for j, token in enumerate(sentence):
            if not isinstance(token, str):
                raise TypeError(
                    f"sentence {i}, token {j} is {type(token).__name__}, not a str: {token!r:.60}; "
                    f"{EXPECTED_SENTENCES}"
                )


def batch_to_ids(
    sentences: Sequence[Sequence[str]], max_chars: int = MAX_CHARACTERS_PER_TOKEN
) -> torch.Tensor:
    """Character ids of pre-tokenized sentences: LongTensor (batch, timesteps, max_chars).

    No sentence boundary tokens are added (the biLM adds them). Ids are shifted by +1; rows past a
    sentence's end are all 0 (padding). ``timesteps`` is the longest sentence's length.
    """
    return pad_batch(sentences, lambda tokens: tokens_to_ids(tokens, max_chars), max_chars)


def pad_batch(
    sentences: Sequence[Sequence[str]],
    token_ids: Callable[[Sequence[str]], torch.Tensor],
    width: int,
) -> torch.Tensor:
    """Model inputs of pre-tokenized sentences: LongTensor (batch, timesteps, width), sentence i's
    rows from ``token_ids(sentence)`` (n_tokens, width), rows past its end all 0 (padding)."""
    check_token_lists(sentences)
    if len(sentences) == 0:
        raise ValueError("empty sentence list: give at least one sentence")
    timesteps = max(len(s) for s in sentences)
    out = torch.zeros((len(sentences), timesteps, width), dtype=torch.long)
    for i, sentence in enumerate(sentences):
        try:
            if len(sentence):
                out[i, : len(sentence)] = token_ids(sentence)
        except ValueError as err:
            raise ValueError(f"sentence {i}: {err}") from None
    return out


def lengths_from_ids(char_ids: torch.Tensor) -> torch.Tensor:
    """Number of real tokens per row of char ids (batch, timesteps, max_chars) -> (batch,)."""
    return (char_ids > 0).any(dim=-1).sum(dim=-1)
