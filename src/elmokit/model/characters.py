"""The character id scheme of ELMo's token encoder.

A token is its UTF-8 bytes (0..255) wrapped as [begin-of-word, bytes..., end-of-word] and padded to
``max_characters_per_token``. Sentence boundary tokens use the reserved ids 256 (<S>) and 257 (</S>).
At run time every id is shifted by +1 so that 0 means "no token" (padding).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

__all__ = ["batch_to_ids"]

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


def token_to_ids(token: str, max_chars: int = MAX_CHARACTERS_PER_TOKEN) -> tuple[int, ...]:
    """Unshifted character ids (0..260) of one token, length ``max_chars``.

    ``<S>`` and ``</S>`` map to the sentence boundary ids. A token longer than ``max_chars - 2``
    bytes keeps its first ``max_chars - 2`` bytes. (``tokens_to_ids`` gives the same for a list,
    faster from a few tokens on.)
    """
    if not isinstance(token, str):
        raise TypeError(f"a token must be a str, got {type(token).__name__}: {token!r}")
    if token == "":
        raise ValueError("empty token: every token must have at least one character")
    if max_chars < 3:
        raise ValueError(f"max_characters_per_token must be at least 3, got {max_chars}")
    if token in (BOS_TOKEN, EOS_TOKEN):
        return _marker_ids(BEGIN_OF_SENTENCE_CHAR if token == BOS_TOKEN else END_OF_SENTENCE_CHAR, max_chars)
    body = list(token.encode("utf-8", "ignore")[: max_chars - 2])
    ids = [BEGIN_OF_WORD_CHAR, *body, END_OF_WORD_CHAR]
    return tuple(ids + [PADDING_CHAR] * (max_chars - len(ids)))


def tokens_to_ids(tokens: Sequence[str], max_chars: int = MAX_CHARACTERS_PER_TOKEN) -> torch.Tensor:
    """Shifted character ids of a token list: LongTensor (n_tokens, max_chars), values 1..261:
    ``token_to_ids`` + 1 of each token.

    Built with array operations from the tokens' joined bytes, so a batch's ids cost well under a
    microsecond a token and no cache of recent tokens' ids is worth keeping
    (docs/benchmarks/kernels.md, "One token cache")."""
    if max_chars < 3:
        raise ValueError(f"max_characters_per_token must be at least 3, got {max_chars}")
    try:
        bodies = [token.encode("utf-8", "ignore")[: max_chars - 2] for token in tokens]
    except AttributeError:
        bad = next(t for t in tokens if not isinstance(t, str))
        raise TypeError(f"a token must be a str, got {type(bad).__name__}: {bad!r}") from None
    n = len(bodies)
    lengths = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    ids = np.full((n, max_chars), PADDING_CHAR + 1, dtype=np.int64)
    ids[:, 0] = BEGIN_OF_WORD_CHAR + 1
    chars = np.frombuffer(b"".join(bodies), dtype=np.uint8)
    rows = np.repeat(np.arange(n), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    ids[rows, np.arange(len(chars)) - starts + 1] = chars.astype(np.int64) + 1
    ids[np.arange(n), lengths + 1] = END_OF_WORD_CHAR + 1
    for i in np.flatnonzero(lengths <= len(EOS_TOKEN)).tolist():  # the empty token, <S>, </S>
        token = tokens[i]
        if token == "":
            raise ValueError("empty token: every token must have at least one character")
        if token in (BOS_TOKEN, EOS_TOKEN):
            ids[i] = np.asarray(token_to_ids(token, max_chars)) + 1
    return torch.from_numpy(ids)


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
    try:
        ids = token_ids([token for sentence in sentences for token in sentence])  # one call: faster
    except ValueError:
        for i, sentence in enumerate(sentences):  # find the sentence to name
            try:
                token_ids(sentence)
            except ValueError as err:
                raise ValueError(f"sentence {i}: {err}") from None
        raise
    lengths = torch.tensor([len(s) for s in sentences])
    out[torch.arange(timesteps) < lengths.unsqueeze(1)] = ids
    return out


def lengths_from_ids(char_ids: torch.Tensor) -> torch.Tensor:
    """Number of real tokens per row of char ids (batch, timesteps, max_chars) -> (batch,)."""
    return (char_ids > 0).any(dim=-1).sum(dim=-1)
