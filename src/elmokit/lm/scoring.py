"""The language model as a product: how probable a sentence is, and which words fit a position.

A biLM is two language models sharing one softmax over the vocabulary: the forward LM gives
P(t_k | <S> t_1 .. t_{k-1}), the backward LM P(t_k | t_{k+1} .. t_n </S>). Everything here uses
the full softmax (never the sampled one of training), so the model needs its softmax.hdf5.

What ``score_sentences`` scores: every sentence on its own. For t_1 .. t_n the forward LM reads
``<S> t_1 .. t_n`` and predicts ``t_1 .. t_n </S>``; the backward LM reads ``</S> t_n .. t_1``
and predicts ``t_n .. t_1 <S>``: n + 1 predictions per direction, the predictions bilm-tf's
held-out protocol makes for that sentence. Each sentence starts from the same LSTM state, the
model's start state (``mode="warm"``, the default, as the Embedder's; zeros for a model without
one) or zeros (``mode="zero"``), so its score depends on nothing but the sentence: not on the
batch, its neighbours or the order. Log-probabilities are natural logs:

    forward_logprob  = sum_k log P_fwd(t_k | <S> t_<k)  + log P_fwd(</S> | <S> t_1..t_n)
    backward_logprob = sum_k log P_bwd(t_k | t_>k </S>) + log P_bwd(<S> | t_1..t_n </S>)
    logprob = (forward_logprob + backward_logprob) / 2
    perplexity = exp(-logprob / (n + 1)) = sqrt(forward_perplexity * backward_perplexity)

(``perplexity`` is the geometric mean of the two directions' perplexities, bilm-tf's
"average".) A token outside the vocabulary is predicted as ``<UNK>``, the class of all unknown
words together, and counted in ``oov``; the char CNN still reads its characters. So scores are
comparable between models only when they share a vocabulary.

What ``substitutes`` predicts at position i (0-based) of t_0 .. t_{n-1}: the forward LM's
distribution given the left context ``<S> t_0 .. t_{i-1}`` (its top layer at t_{i-1}, or at
``<S>``), the backward LM's given the right context ``t_{i+1} .. t_{n-1} </S>``, and both
combined as a product of experts, renormalised over the vocabulary:

    P_both(w) = P_fwd(w | left) * P_bwd(w | right) / sum_v P_fwd(v | left) * P_bwd(v | right)

If the left and right contexts are independent given the word, Bayes' rule gives
P(w | left, right) proportional to P(w | left) P(w | right) / P(w); the product is that posterior
with a uniform prior P(w) (the model has no unigram distribution of its own). It is an AND: a word
ranks high only if both sides find it likely, which is what a masked-word prediction from both
sides does; the average of the two probabilities would be an OR, ranking words that fit one side
only. (The mean of the two log-probabilities, renormalised, ranks words the same way, with flatter
probabilities.)
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
import torch.nn.functional as F

from ..base.atomic import atomic_path, check_output, is_stream
from ..base.textfiles import count_lines, line_splitter, read_lines
from ..embed.runners import evaluating
from ..model.characters import batch_to_ids, check_token_lists
from .language_model import NO_SOFTMAX, LanguageModel
from .softmax import Softmax
from .vocabulary import SPECIAL_TOKENS, Vocabulary

__all__ = [
    "SentenceScore",
    "Substitutes",
    "score_file",
    "score_sentences",
    "substitutes",
    "word_distributions",
]

MODES = ("warm", "zero")
FORMATS = ("jsonl", "tsv")
# Positions whose logits over the vocabulary exist at once: 4M logits (16 MB) ran 1.4x as fast as
# the softmax's own 32M-logit chunks on one core (the log-softmax stays in cache).
SOFTMAX_CHUNK_LOGITS = 1 << 22
# the fields of a score line, in the order of the TSV columns (the sentence comes last there)
FIELDS = (
    "line",
    "tokens",
    "oov",
    "forward_logprob",
    "backward_logprob",
    "logprob",
    "forward_perplexity",
    "backward_perplexity",
    "perplexity",
)


def _check_model(model: LanguageModel, vocab: Vocabulary | None, mode: str) -> tuple[Softmax, Vocabulary]:
    """The model's softmax and its vocabulary (``vocab``, or None: ``model.vocab``), checked
    against each other; also checks ``mode``."""
    if model.softmax is None:
        raise ValueError(NO_SOFTMAX.format(name="softmax"))
    if vocab is None:
        vocab = model.vocab
    if model.softmax.vocab_size != len(vocab):
        raise ValueError(
            f"the softmax has {model.softmax.vocab_size:,} rows but the vocabulary {len(vocab):,} tokens"
        )
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    return model.softmax, vocab


def _top_layer(
    model: LanguageModel, sentences: Sequence[Sequence[str]], mode: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top LSTM layer over ``<S> t_1 .. t_n </S>``: forward and backward, each
    (batch, max_n + 2, projection_dim), zero past each row's end. Call in eval and no-grad mode.

    Every row starts from the start state (warm) or zeros; the state is passed explicitly, so a
    ``StatefulBiLM`` carries nothing."""
    bilm = model.bilm
    like = next(bilm.parameters())
    ids = batch_to_ids(sentences, bilm.options.char_cnn.max_characters_per_token).to(like.device)
    state = (
        bilm.zero_state(len(sentences), like) if mode == "zero" else bilm.initial_state(len(sentences), like)
    )
    top = bilm(ids, state=state, keep_sentence_boundaries=True).layers[-1]
    dim = top.shape[-1] // 2
    return top[..., :dim], top[..., dim:]


# -- sentence scores ----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class SentenceScore:
    """The log-probability of one sentence of n tokens, per direction (natural logs).

    forward_logprobs (n + 1,): ``log P_fwd(t_k | <S> t_<k)`` for each token, then
    ``log P_fwd(</S> | ..)``; backward_logprobs (n + 1,): ``log P_bwd(t_k | t_>k </S>)`` for each
    token, then ``log P_bwd(<S> | ..)``. Both are aligned with the tokens; ``oov`` counts the tokens scored as
    ``<UNK>``."""

    tokens: list[str]
    oov: int
    forward_logprobs: np.ndarray
    backward_logprobs: np.ndarray

    @property
    def predictions(self) -> int:
        """Predictions per direction: n + 1."""
        return len(self.tokens) + 1

    @property
    def forward_logprob(self) -> float:
        return float(self.forward_logprobs.sum(dtype=np.float64))

    @property
    def backward_logprob(self) -> float:
        return float(self.backward_logprobs.sum(dtype=np.float64))

    @property
    def logprob(self) -> float:
        """The mean of the two directions' log-probabilities."""
        return 0.5 * (self.forward_logprob + self.backward_logprob)

    @property
    def forward_perplexity(self) -> float:
        return math.exp(-self.forward_logprob / self.predictions)

    @property
    def backward_perplexity(self) -> float:
        return math.exp(-self.backward_logprob / self.predictions)

    @property
    def perplexity(self) -> float:
        """exp(-logprob / (n + 1)): the geometric mean of the two perplexities."""
        return math.exp(-self.logprob / self.predictions)

    def to_dict(self, per_token: bool = False, digits: int = 4) -> dict:
        """The figures as a JSON-ready dict (``FIELDS`` without "line", floats rounded to
        ``digits`` decimals), with the per-token log-probabilities if ``per_token``."""
        out: dict = {"tokens": len(self.tokens), "oov": self.oov}
        for name in FIELDS[3:]:
            out[name] = round(getattr(self, name), digits)
        if per_token:
            out["forward_logprobs"] = [round(float(x), digits) for x in self.forward_logprobs]
            out["backward_logprobs"] = [round(float(x), digits) for x in self.backward_logprobs]
        return out


def _score_batch(
    model: LanguageModel, vocab: Vocabulary, sentences: Sequence[Sequence[str]], mode: str
) -> list[SentenceScore]:
    """Scores of a batch of non-empty sentences, in the given order."""
    softmax, vocab = _check_model(model, vocab, mode)
    with evaluating(model), torch.inference_mode():
        forward, backward = _top_layer(model, sentences, mode)
        steps, dim = forward.shape[1], forward.shape[2]
        # Rows of the flattened (batch * steps) top layer and their targets; positions count
        # <S> as 0. Forward: positions 0..n predict t_1..t_n, </S>. Backward: positions
        # 2..n+1 predict t_1..t_n and position 1 predicts <S>, so both align with the tokens.
        ids = [vocab.encode(s) for s in sentences]
        rows_f: list[int] = []
        rows_b: list[int] = []
        targets_f: list[int] = []
        targets_b: list[int] = []
        for r, (sentence, token_ids) in enumerate(zip(sentences, ids)):
            n, base = len(sentence), r * steps
            rows_f.extend(range(base, base + n + 1))
            rows_b.extend([*range(base + 2, base + n + 2), base + 1])
            targets_f.extend([*token_ids, vocab.eos])
            targets_b.extend([*token_ids, vocab.bos])
        device = forward.device
        hidden = torch.cat(
            [
                forward.reshape(-1, dim).index_select(0, torch.tensor(rows_f, device=device)),
                backward.reshape(-1, dim).index_select(0, torch.tensor(rows_b, device=device)),
            ]
        )
        targets = torch.tensor(targets_f + targets_b, device=device)
        rows = max(1, SOFTMAX_CHUNK_LOGITS // len(vocab))
        losses = [softmax.full_loss(h, t) for h, t in zip(hidden.split(rows), targets.split(rows))]
        logprobs = (-torch.cat(losses)).double().cpu().numpy()
    half = len(targets_f)
    scores, offset = [], 0
    for sentence, token_ids in zip(sentences, ids):
        end = offset + len(sentence) + 1
        scores.append(
            SentenceScore(
                tokens=list(sentence),
                oov=sum(i == vocab.unk for i in token_ids),
                forward_logprobs=logprobs[offset:end],
                backward_logprobs=logprobs[half + offset : half + end],
            )
        )
        offset = end
    return scores


def _length_sorted_batches(lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    """Indices 0..len-1 in batches of ``batch_size`` of similar length (shortest first)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


def score_sentences(
    model: LanguageModel,
    sentences: Iterable[Sequence[str]],
    mode: str = "warm",
    batch_size: int = 64,
    window: int | None = None,
    *,
    vocab: Vocabulary | None = None,
) -> Iterator[SentenceScore]:
    """Stream a ``SentenceScore`` per tokenized sentence, in input order. ``model``: a language
    model with a softmax (``LanguageModel.from_pretrained``); ``vocab``: its softmax's words,
    None for ``model.vocab`` (pass it for a model made without ``from_pretrained``).

    Reads ``window`` sentences at a time (default ``8 * batch_size``), sorts them by length and
    scores them in batches of ``batch_size`` (same results as one at a time, to float rounding).
    ``mode``: "warm" (the model's start state) or "zero". An empty sentence is a ValueError.
    The model is run in eval mode and without gradients, batch by batch; it is not changed."""
    _, vocab = _check_model(model, vocab, mode)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    window = window or 8 * batch_size
    chunk: list[Sequence[str]] = []
    seen = 0
    for sentence in sentences:
        try:
            check_token_lists([sentence])
        except TypeError as err:  # name the sentence by its place in the stream
            raise TypeError(str(err).replace("sentence 0", f"sentence {seen}", 1)) from None
        if len(sentence) == 0:
            raise ValueError(f"sentence {seen} is empty: there is nothing to score")
        if any(token == "" for token in sentence):
            raise ValueError(f"sentence {seen} has an empty token")
        chunk.append(sentence)
        seen += 1
        if len(chunk) == window:
            yield from _score_chunk(model, vocab, chunk, mode, batch_size)
            chunk = []
    if chunk:
        yield from _score_chunk(model, vocab, chunk, mode, batch_size)


def _score_chunk(
    model: LanguageModel, vocab: Vocabulary, chunk: list[Sequence[str]], mode: str, batch_size: int
) -> Iterator[SentenceScore]:
    results: list[SentenceScore | None] = [None] * len(chunk)
    for batch in _length_sorted_batches([len(s) for s in chunk], batch_size):
        for i, score in zip(batch, _score_batch(model, vocab, [chunk[i] for i in batch], mode)):
            results[i] = score
    for result in results:
        assert result is not None  # every index is in exactly one batch
        yield result


# -- files --------------------------------------------------------------------------------------
@dataclass
class ScoreSummary:
    """What a score_file run did; ``forward_logprob``/``backward_logprob`` are the totals over
    all sentences, ``predictions`` per direction. Without sentences (an empty or blank file) the
    perplexities are undefined: NaN."""

    sentences: int
    tokens: int
    oov: int
    empty: int
    predictions: int
    forward_logprob: float
    backward_logprob: float
    seconds: float

    @property
    def forward_perplexity(self) -> float:
        return self._perplexity(self.forward_logprob)

    @property
    def backward_perplexity(self) -> float:
        return self._perplexity(self.backward_logprob)

    @property
    def perplexity(self) -> float:
        """Over all sentences: exp of the mean loss of both directions (bilm-tf's average)."""
        return self._perplexity(0.5 * (self.forward_logprob + self.backward_logprob))

    def _perplexity(self, logprob: float) -> float:
        return math.exp(-logprob / self.predictions) if self.predictions else math.nan


def _format_line(number: int, text: str, score: SentenceScore, fmt: str, per_token: bool) -> str:
    figures = score.to_dict(per_token)
    if fmt == "tsv":
        fields = {"line": number, **figures}
        return "\t".join(str(fields[name]) for name in FIELDS) + "\t" + " ".join(score.tokens) + "\n"
    return json.dumps({"line": number, "sentence": text, **figures}, ensure_ascii=False) + "\n"


def score_file(
    model: LanguageModel,
    input_path: str | os.PathLike,
    output: str | os.PathLike | TextIO | None = None,
    fmt: str = "jsonl",
    mode: str = "warm",
    batch_size: int = 64,
    per_token: bool = False,
    tokenize: bool = False,
    overwrite: bool = False,
    progress: bool = False,
    *,
    vocab: Vocabulary | None = None,
) -> ScoreSummary:
    """Score a file of sentences (one whitespace-tokenized sentence per line, ``-`` = stdin) and
    write one line per non-empty input line, in input order, as JSON lines or TSV (with a header).

    Empty (or blank) lines are skipped and counted; every output line carries its input line
    number (1-based). ``output``: a path, written atomically (a temporary file beside it renamed
    when complete), an open text stream, or None for stdout; a path that is a named pipe, a
    character device or a socket (/dev/stdout, a FIFO) is written into directly, never replaced.
    The output policy is ``atomic.check_output``'s (no input, no file of the model, no link, no
    existing file unless ``overwrite``). Input and output are streamed. ``vocab``: as ``score_sentences``'."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if per_token and fmt != "jsonl":
        raise ValueError("per-token log-probabilities are written only in the jsonl format")
    _, vocab = _check_model(model, vocab, mode)
    total = count_lines(input_path)  # also checks that the input exists
    with _output_stream(output, [input_path, *model.source_files], overwrite) as stream:
        return _score_to(
            model, vocab, input_path, stream, fmt, mode, batch_size, per_token, tokenize, progress, total
        )


@contextmanager
def _output_stream(
    output: str | os.PathLike | TextIO | None, inputs: list[str | os.PathLike], overwrite: bool
) -> Iterator[TextIO]:
    """The text stream ``score_file`` writes: stdout (None, or a path that is standard output,
    e.g. /dev/stdout), an open stream, a named pipe or terminal written into, or else a file
    written atomically; checked by ``atomic.check_output`` before anything is read."""
    if output is None or hasattr(output, "write"):
        yield sys.stdout if output is None else output  # type: ignore[misc]
        return
    if _is_stdout(Path(output)):
        yield sys.stdout
        return
    target = check_output(output, overwrite, inputs, streaming=True)
    if is_stream(target):  # never renamed over
        with open(target, "w", encoding="utf-8", newline="\n") as stream:
            yield stream
        return
    with atomic_path(target, overwrite) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as stream:
        yield stream


def _is_stdout(path: Path) -> bool:
    """Whether ``path`` is this process's standard output (e.g. /dev/stdout)."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(sys.stdout.fileno()))
    except (OSError, AttributeError, ValueError):
        return False


def _score_to(
    model: LanguageModel,
    vocab: Vocabulary,
    input_path: str | os.PathLike,
    stream: TextIO,
    fmt: str,
    mode: str,
    batch_size: int,
    per_token: bool,
    tokenize: bool,
    progress: bool,
    total: int | None,
) -> ScoreSummary:
    from tqdm import tqdm

    split = line_splitter(tokenize)
    pending: deque[tuple[int, str]] = deque()  # (line number, text) of sentences read, not yet written
    summary = ScoreSummary(0, 0, 0, 0, 0, 0.0, 0.0, 0.0)
    start = time.perf_counter()

    def sentences() -> Iterator[list[str]]:
        for number, text in enumerate(read_lines(input_path), start=1):
            tokens = split(text)
            if not tokens:
                summary.empty += 1
                bar.update(1)
                continue
            pending.append((number, text))
            yield tokens

    if fmt == "tsv":
        stream.write("\t".join(FIELDS) + "\tsentence\n")
    with tqdm(total=total, unit="sent", disable=not progress, dynamic_ncols=True, file=sys.stderr) as bar:
        for score in score_sentences(model, sentences(), mode, batch_size, vocab=vocab):
            number, text = pending.popleft()
            stream.write(_format_line(number, text, score, fmt, per_token))
            summary.sentences += 1
            summary.tokens += len(score.tokens)
            summary.oov += score.oov
            summary.predictions += score.predictions
            summary.forward_logprob += score.forward_logprob
            summary.backward_logprob += score.backward_logprob
            bar.update(1)
    stream.flush()
    summary.seconds = time.perf_counter() - start
    return summary


# -- substitutes --------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class WordDistributions:
    """Log-probabilities over the vocabulary at one position, each (V,): ``forward`` given the
    left context, ``backward`` given the right context, ``both`` their renormalised product."""

    forward: torch.Tensor
    backward: torch.Tensor
    both: torch.Tensor


def _check_position(tokens: Sequence[str], position: int) -> None:
    check_token_lists([tokens])
    if len(tokens) == 0:
        raise ValueError("the sentence is empty: give at least one token")
    if not 0 <= position < len(tokens):
        raise ValueError(
            f"word index {position} is outside the sentence: it has {len(tokens)} tokens, "
            f"indices 0 to {len(tokens) - 1} (0-based)"
        )


def word_distributions(
    model: LanguageModel,
    tokens: Sequence[str],
    position: int,
    mode: str = "warm",
    *,
    vocab: Vocabulary | None = None,
) -> WordDistributions:
    """The model's distributions over the vocabulary for the word at ``position`` (0-based) of
    ``tokens``: forward (from ``<S>`` and the words before it), backward (from the words after it
    and ``</S>``), and both = log P_fwd + log P_bwd renormalised (a product of experts). ``vocab``: as
    ``score_sentences``'."""
    softmax, vocab = _check_model(model, vocab, mode)
    _check_position(tokens, position)
    with evaluating(model), torch.inference_mode():
        forward, backward = _top_layer(model, [tokens], mode)
        # with <S> at 0 the word is at position + 1: the forward LM predicts it from the step
        # before, the backward LM from the step after
        hidden = torch.stack([forward[0, position], backward[0, position + 2]])  # (2, dim)
        fwd, bwd = F.log_softmax(softmax.logits(hidden).double(), dim=-1).cpu()
        both = F.log_softmax(fwd + bwd, dim=-1)
    return WordDistributions(fwd, bwd, both)


@dataclass(frozen=True)
class Substitutes:
    """The k most probable words at ``position`` of ``tokens`` (``<S>``, ``</S>`` and ``<UNK>``
    left out), each list of (word, probability) from the full distribution; ``probability`` and
    ``rank`` give the word at the position itself (of ``<UNK>`` when it is outside the
    vocabulary; rank among the listed kind of words, None for ``<UNK>``), per direction."""

    tokens: list[str]
    position: int
    in_vocabulary: bool
    forward: list[tuple[str, float]]
    backward: list[tuple[str, float]]
    both: list[tuple[str, float]]
    probability: dict[str, float]
    rank: dict[str, int | None]

    @property
    def word(self) -> str:
        return self.tokens[self.position]

    def to_dict(self, digits: int = 6) -> dict:
        def listed(pairs: list[tuple[str, float]]) -> list[dict]:
            return [{"word": w, "probability": round(p, digits)} for w, p in pairs]

        return {
            "tokens": self.tokens,
            "position": self.position,
            "word": self.word,
            "in_vocabulary": self.in_vocabulary,
            "probability": {k: round(v, digits) for k, v in self.probability.items()},
            "rank": self.rank,
            "forward": listed(self.forward),
            "backward": listed(self.backward),
            "both": listed(self.both),
        }


def substitutes(
    model: LanguageModel,
    tokens: Sequence[str],
    position: int,
    k: int = 10,
    mode: str = "warm",
    *,
    vocab: Vocabulary | None = None,
) -> Substitutes:
    """The ``k`` words the model predicts at ``position`` (0-based) from the left context, the
    right context and both (see ``word_distributions``), without ``<S>``, ``</S>``, ``<UNK>``.
    ``vocab``: as ``score_sentences``'."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    _, vocab = _check_model(model, vocab, mode)
    dists = word_distributions(model, tokens, position, mode, vocab=vocab)
    special = torch.tensor([vocab.bos, vocab.eos, vocab.unk])
    word_id = vocab.token_to_id(tokens[position])
    in_vocabulary = tokens[position] in vocab and tokens[position] not in SPECIAL_TOKENS
    top: dict[str, list[tuple[str, float]]] = {}
    probability: dict[str, float] = {}
    rank: dict[str, int | None] = {}
    for name in ("forward", "backward", "both"):
        logp = getattr(dists, name).clone()
        probability[name] = math.exp(float(logp[word_id]))
        logp[special] = -math.inf
        rank[name] = int((logp > logp[word_id]).sum()) + 1 if in_vocabulary else None
        values, ids = logp.topk(min(k, len(vocab) - len(special)))
        top[name] = [(vocab.id_to_token(int(i)), math.exp(float(v))) for v, i in zip(values, ids)]
    return Substitutes(
        list(tokens), position, in_vocabulary, top["forward"], top["backward"], top["both"], probability, rank
    )
