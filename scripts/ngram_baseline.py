#!/usr/bin/env python
"""N-gram baseline for the biLM's held-out perplexity, scored with the biLM's own protocol.

Trains two interpolated modified Kneser-Ney n-gram models (Chen & Goodman 1999, the estimate
KenLM's ``lmplz`` and SRILM's ``-kndiscount -interpolate`` make) on the biLM's training files and
vocabulary: a forward one on ``<S> w1 .. wn </S>`` and a backward one on the reversed sentences
``</S> wn .. w1 <S>``. Held-out text is scored exactly as ``elmokit.training.evaluate.evaluate_perplexity``
scores the biLM:

* each non-blank line is a sentence, split on whitespace; tokens outside the vocabulary become
  ``<UNK>`` (in training and held-out text alike) and predictions of ``<UNK>`` are counted;
* forward predicts w1 .. wn, ``</S>``; backward predicts wn .. w1, ``<S>``; every model is a
  distribution over the vocabulary less its own start symbol, so perplexities are comparable;
* by default only the predictions the biLM's evaluation counts are counted: it reads the held-out
  sentences into 256 streams, one token per step, and drops the last incomplete batch with the
  unfinished sentence of every stream (``--streams 0`` counts every prediction);
* perplexity = exp(mean NLL); ``average`` = exp of the mean of the two directions' mean NLLs (the
  geometric mean of forward and backward perplexity, as the biLM reports).

Why not a library's smoothing: nltk.lm's ``KneserNeyInterpolated`` (3.10) neither normalizes (on a
toy corpus its probabilities over the vocabulary sum to 0.96-1.12 with discount 0.75) nor scales
(every lower-order query scans all higher-order contexts), and KenLM's estimator ``lmplz`` cannot
be installed from PyPI or Debian (the ``kenlm`` wheel only queries models). The estimate here is
vectorized numpy (seconds for a 5-gram on 3.4M tokens); tests/scripts/test_ngram_baseline.py checks it against
a direct transcription of the formulas and checks that it normalizes. On the news corpus it gave
the same discounts as ``lmplz`` built from source, and perplexities equal to 6 significant digits
(lmplz's uniform floor is over its own vocabulary, a few entries larger).

    python scripts/ngram_baseline.py --train '/data/train/*.txt' --vocab vocab.txt --order 3 \\
        heldout/valid.txt 'lm1b/news.en.heldout-*' --json baseline.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from elmokit.lm.vocabulary import Vocabulary
from elmokit.model.characters import BOS_TOKEN, EOS_TOKEN
from elmokit.training.data import corpus_files

BILM_STREAMS = 256  # evaluate_perplexity's default batch size


# ---------------------------------------------------------------------------------------------
# Text


def read_sentences(files: Iterable[str]) -> Iterator[list[str]]:
    """Whitespace-split non-blank lines of UTF-8 files, in the given order (as the biLM reads)."""
    for path in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                tokens = line.split()
                if tokens:
                    yield tokens


@dataclass
class Encoded:
    """Sentences of one direction as one id array: ``[start, t1 .. tn, end]`` per sentence."""

    ids: np.ndarray  # int64 (total,)
    starts: np.ndarray  # int64 (sentences,) index of each sentence's start symbol
    ends: np.ndarray  # int64 (sentences,) one past each sentence's end symbol


def encode(sentences: Iterable[Sequence[str]], vocab: Vocabulary, reverse: bool = False) -> Encoded:
    """Map tokens to vocabulary ids (``<UNK>`` outside it) with the direction's boundary symbols."""
    index, unk = vocab._index, vocab.unk
    bos, eos = vocab.token_to_id(BOS_TOKEN), vocab.token_to_id(EOS_TOKEN)
    start, end = (eos, bos) if reverse else (bos, eos)
    chunks, lengths = [], []
    for tokens in sentences:
        ids = [index.get(t, unk) for t in tokens]
        if reverse:
            ids.reverse()
        chunks.append([start, *ids, end])
        lengths.append(len(ids) + 2)
    if not chunks:
        raise ValueError("no sentences (all files empty or blank)")
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    flat = np.fromiter((i for chunk in chunks for i in chunk), dtype=np.int64, count=int(ends[-1]))
    return Encoded(ids=flat, starts=ends - np.asarray(lengths, dtype=np.int64), ends=ends)


# ---------------------------------------------------------------------------------------------
# Counting: n-gram ids by prefix, one sorted key table per order


def _sentence_end_per_position(enc: Encoded) -> np.ndarray:
    return np.repeat(enc.ends, enc.ends - enc.starts)


def ngram_ids(
    enc: Encoded, keys: Sequence[np.ndarray | None], order: int, vocab_size: int
) -> list[np.ndarray]:
    """``ids[k][i]`` = row of the k-gram starting at position i in table ``keys[k]``, or -1.

    ``keys[1]`` is None (unigram rows are word ids). A k-gram's key is
    ``row(its (k-1)-gram prefix) * vocab_size + last word``; absent n-grams (or n-grams crossing a
    sentence end) get -1.
    """
    n = len(enc.ids)
    end = _sentence_end_per_position(enc)
    pos = np.arange(n)
    ids: list[np.ndarray] = [np.empty(0, dtype=np.int64), enc.ids.copy()]
    for k in range(2, order + 1):
        prev = ids[k - 1]
        out = np.full(n, -1, dtype=np.int64)
        ok = pos + k <= end
        ok[ok] &= prev[pos[ok]] >= 0
        where = pos[ok]
        key = prev[where] * vocab_size + enc.ids[where + k - 1]
        table = keys[k]
        row = np.searchsorted(table, key)
        row = np.minimum(row, len(table) - 1)
        hit = table[row] == key
        out[where[hit]] = row[hit]
        ids.append(out)
    return ids


@dataclass
class Order:
    """The n-grams of one order: sorted keys, prefix and suffix rows, counts, probabilities."""

    keys: np.ndarray | None  # int64 sorted (None for unigrams: rows are word ids)
    prefix: np.ndarray  # row of the (k-1)-gram context (zeros for unigrams)
    suffix: np.ndarray  # row of the (k-1)-gram suffix (-1 for unigrams)
    raw: np.ndarray  # raw counts
    adjusted: np.ndarray = field(default_factory=lambda: np.empty(0))
    discounts: tuple[float, float, float] = (0.0, 0.0, 0.0)
    log_prob: np.ndarray = field(default_factory=lambda: np.empty(0))  # interpolated, natural log
    # Per context row of order k-1 (the single empty context for unigrams):
    log_backoff: np.ndarray = field(default_factory=lambda: np.empty(0))


def count_ngrams(enc: Encoded, order: int, vocab_size: int) -> list[Order | None]:
    n = len(enc.ids)
    end = _sentence_end_per_position(enc)
    pos = np.arange(n)
    tables: list[Order | None] = [None]
    raw1 = np.bincount(enc.ids, minlength=vocab_size).astype(np.int64)
    tables.append(
        Order(keys=None, prefix=np.zeros(vocab_size, np.int64), suffix=np.full(vocab_size, -1), raw=raw1)
    )
    ids_prev = enc.ids
    for k in range(2, order + 1):
        ok = pos + k <= end
        where = pos[ok]
        key = ids_prev[where] * vocab_size + enc.ids[where + k - 1]
        keys, first, inverse, raw = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        ids_k = np.full(n, -1, dtype=np.int64)
        ids_k[where] = inverse
        # The suffix (k-1)-gram starts one position later and fits in the sentence too.
        suffix = ids_prev[where[first] + 1]
        tables.append(Order(keys=keys, prefix=keys // vocab_size, suffix=suffix, raw=raw.astype(np.int64)))
        ids_prev = ids_k
    return tables


# ---------------------------------------------------------------------------------------------
# Interpolated modified Kneser-Ney


def modified_kn_discounts(adjusted: np.ndarray) -> tuple[float, float, float]:
    """D1, D2, D3+ from the count-of-counts of adjusted counts (Chen & Goodman 1999, eq. 26)."""
    n = [int(np.count_nonzero(adjusted == r)) for r in (1, 2, 3, 4)]
    if min(n) == 0:
        raise ValueError(
            f"cannot estimate modified Kneser-Ney discounts: counts-of-counts n1..n4 = {n} include a "
            "zero (corpus too small); pass --discounts"
        )
    y = n[0] / (n[0] + 2 * n[1])
    d = (1 - 2 * y * n[1] / n[0], 2 - 3 * y * n[2] / n[1], 3 - 4 * y * n[3] / n[2])
    if not all(0 < d_r <= r for r, d_r in enumerate(d, start=1)):
        shown = ", ".join(f"{d_r:.3f}" for d_r in d)
        raise ValueError(
            f"cannot estimate modified Kneser-Ney discounts: D1, D2, D3+ = {shown} from counts-of-counts "
            f"n1..n4 = {n} (each must lie in (0, r]); text counted more than once, such as a corpus "
            "repeated to weight it, has too few singletons: train on the distinct text or pass --discounts"
        )
    return d


class KneserNeyModel:
    """Interpolated modified Kneser-Ney n-gram model of one direction over a fixed vocabulary.

    ``start`` is the direction's start symbol id: a context, never predicted (probability 0).
    Lower orders use continuation counts (distinct left extensions) except for n-grams beginning
    with ``start``, which keep raw counts; the unigram level is interpolated with the uniform
    distribution over the vocabulary less ``start``. ``discounts`` (one (D1, D2, D3+) triple per
    order, unigrams first) overrides the count-of-counts estimate.
    """

    def __init__(
        self,
        enc: Encoded,
        order: int,
        vocab_size: int,
        start: int,
        discounts: Sequence[Sequence[float]] | None = None,
    ) -> None:
        if order < 1:
            raise ValueError(f"order must be at least 1, got {order}")
        self.order, self.vocab_size, self.start = order, vocab_size, start
        self.tables = count_ngrams(enc, order, vocab_size)
        self._adjust()
        for k in range(1, order + 1):
            t = self.tables[k]
            if discounts is not None:
                t.discounts = tuple(float(x) for x in discounts[k - 1])
            else:
                counted = t.adjusted if k > 1 else np.delete(t.adjusted, start)
                t.discounts = modified_kn_discounts(counted[counted > 0])
        self._probabilities()

    def _starts_with_start(self, k: int) -> np.ndarray:
        t = self.tables[k]
        if k == 1:
            return np.arange(self.vocab_size) == self.start
        first = t.prefix
        for j in range(k - 1, 1, -1):
            first = self.tables[j].prefix[first]
        return first == self.start

    def _adjust(self) -> None:
        top = self.tables[self.order]
        top.adjusted = top.raw.copy()
        for k in range(1, self.order):
            t, higher = self.tables[k], self.tables[k + 1]
            continuation = np.bincount(higher.suffix, minlength=len(t.raw)).astype(np.int64)
            t.adjusted = np.where(self._starts_with_start(k), t.raw, continuation)
        self.tables[1].adjusted[self.start] = 0

    def _probabilities(self) -> None:
        lower = None
        for k in range(1, self.order + 1):
            t = self.tables[k]
            a = t.adjusted
            d = np.zeros(len(a))
            for r, d_r in enumerate(t.discounts, start=1):
                d[a == r] = d_r
            d[a > 3] = t.discounts[2]
            n_contexts = 1 if k == 1 else len(self.tables[k - 1].raw)
            ctx = t.prefix
            total = np.bincount(ctx, weights=a, minlength=n_contexts)
            mass = np.bincount(ctx, weights=d, minlength=n_contexts)
            with np.errstate(divide="ignore", invalid="ignore"):
                gamma = np.where(total > 0, mass / np.where(total > 0, total, 1), 1.0)
                if k == 1:
                    n_words = self.vocab_size - 1
                    base = np.full(len(a), 1.0 / n_words)
                else:
                    base = np.exp(lower.log_prob[t.suffix])
                p = (a - d) / np.where(total[ctx] > 0, total[ctx], 1) + gamma[ctx] * base
                if k == 1:
                    p[self.start] = 0.0
                t.log_prob = np.log(p)
            t.log_backoff = np.log(gamma)
            lower = t

    # -- scoring --------------------------------------------------------------------------------

    def keys(self) -> list[np.ndarray | None]:
        return [None, None, *[self.tables[k].keys for k in range(2, self.order + 1)]]

    def log_probs(self, enc: Encoded) -> np.ndarray:
        """Natural-log probability of every prediction: position t (not a sentence start) given
        the sentence so far. Returns an array aligned with ``enc.ids`` (NaN at sentence starts)."""
        n = len(enc.ids)
        ids = ngram_ids(enc, self.keys(), self.order, self.vocab_size)
        sent_start = np.repeat(enc.starts, enc.ends - enc.starts)
        t = np.arange(n)
        is_target = t > sent_start
        result = np.full(n, np.nan)
        targets = t[is_target]
        history = targets - sent_start[is_target]  # tokens available as context
        done = np.zeros(len(targets), dtype=bool)
        logp = np.zeros(len(targets))
        # From the highest order down: the longest seen n-gram gives the interpolated probability;
        # every longer context that is seen contributes its backoff weight.
        for k in range(self.order, 0, -1):
            fits = history >= k - 1
            begin = targets - (k - 1)
            row = np.full(len(targets), -1, dtype=np.int64)
            row[fits] = ids[k][begin[fits]]
            found = (row >= 0) & ~done
            logp[found] += self.tables[k].log_prob[row[found]]
            done |= found
            if k > 1:
                # Context (k-1)-gram = positions begin .. t-1; it starts at `begin`.
                ctx = np.full(len(targets), -1, dtype=np.int64)
                ctx[fits] = ids[k - 1][begin[fits]]
                backoff = (~done) & (ctx >= 0)
                logp[backoff] += self.tables[k].log_backoff[ctx[backoff]]
        if not done.all():  # unigram rows always exist, so only the start symbol can get here
            raise ValueError("a held-out prediction has no probability (start symbol as target?)")
        result[targets] = logp
        return result

    def prob_distribution(self, context: Sequence[int]) -> np.ndarray:
        """p(w | context) for every vocabulary id (slow; for tests and inspection)."""
        ids = [*context]
        out = np.empty(self.vocab_size)
        for w in range(self.vocab_size):
            seq = np.asarray([*ids, w], dtype=np.int64)
            enc = Encoded(ids=seq, starts=np.array([0]), ends=np.array([len(seq)]))
            out[w] = math.exp(self.log_probs(enc)[-1]) if w != self.start else 0.0
        return out


# ---------------------------------------------------------------------------------------------
# The biLM's evaluation stream: which predictions it counts


def counted_predictions(lengths: Sequence[int], streams: int) -> np.ndarray:
    """How many of each sentence's predictions (n + 1 for n tokens) the biLM's evaluation counts.

    Mirrors ``heldout_batches(files, vocab, batch_size=streams, unroll_steps=1)``: ``streams`` rows
    each hold a sentence and yield one prediction per batch, a row takes the next sentence when its
    own is used up, and the batch in which the sentences run out is dropped whole. ``streams=0``
    counts every prediction.
    """
    total = np.asarray(lengths, dtype=np.int64) + 1
    if streams == 0:
        return total
    counted = np.zeros(len(total), dtype=np.int64)
    row_sentence = [-1] * streams
    row_left = [0] * streams
    next_sentence = 0
    while True:
        taken: list[int] = []
        for r in range(streams):
            if row_left[r] == 0:
                if next_sentence == len(total):
                    for s in taken:  # the incomplete batch is dropped
                        counted[s] -= 1
                    return counted
                row_sentence[r], row_left[r] = next_sentence, int(total[next_sentence])
                next_sentence += 1
            s = row_sentence[r]
            counted[s] += 1
            row_left[r] -= 1
            taken.append(s)


def counted_mask(enc: Encoded, counted: np.ndarray) -> np.ndarray:
    """Positions (aligned with ``enc.ids``) of the counted predictions: the first ``counted[s]``
    predictions of sentence s in this direction's reading order."""
    offset = np.arange(len(enc.ids)) - np.repeat(enc.starts, enc.ends - enc.starts)
    return (offset >= 1) & (offset <= np.repeat(counted, enc.ends - enc.starts))


# ---------------------------------------------------------------------------------------------
# Evaluation


@dataclass
class Result:
    name: str
    files: list[str]
    sentences: int
    predictions: int  # counted per direction
    all_predictions: int
    forward: float
    backward: float
    average: float
    forward_all: float
    backward_all: float
    average_all: float
    oov_rate: float
    seconds: float = 0.0


def evaluate(
    models: tuple[KneserNeyModel, KneserNeyModel],
    vocab: Vocabulary,
    name: str,
    files: list[str],
    streams: int = BILM_STREAMS,
) -> Result:
    sentences = list(read_sentences(files))
    lengths = [len(s) for s in sentences]
    counted = counted_predictions(lengths, streams)
    nll, nll_all = [], []
    for model, reverse in zip(models, (False, True)):
        enc = encode(sentences, vocab, reverse=reverse)
        logp = model.log_probs(enc)
        mask = counted_mask(enc, counted)
        every = counted_mask(enc, counted_predictions(lengths, 0))
        if not mask.any():
            raise ValueError(f"{name}: no prediction counted (fewer sentences than {streams} streams?)")
        nll.append(-float(logp[mask].mean()))
        nll_all.append(-float(logp[every].mean()))
    unk = vocab.unk
    n_tokens = sum(lengths)
    n_oov = sum(1 for s in sentences for tok in s if vocab._index.get(tok, unk) == unk)
    return Result(
        name=name,
        files=files,
        sentences=len(sentences),
        predictions=int(counted.sum()),
        all_predictions=int(sum(lengths) + len(lengths)),
        forward=math.exp(nll[0]),
        backward=math.exp(nll[1]),
        average=math.exp(0.5 * (nll[0] + nll[1])),
        forward_all=math.exp(nll_all[0]),
        backward_all=math.exp(nll_all[1]),
        average_all=math.exp(0.5 * (nll_all[0] + nll_all[1])),
        oov_rate=n_oov / max(n_tokens, 1),
    )


def train_models(
    train_files: list[str],
    vocab: Vocabulary,
    order: int,
    discounts: Sequence[Sequence[float]] | None = None,
) -> tuple[KneserNeyModel, KneserNeyModel]:
    sentences = list(read_sentences(train_files))
    models = []
    for reverse in (False, True):
        enc = encode(sentences, vocab, reverse=reverse)
        start = vocab.token_to_id(EOS_TOKEN if reverse else BOS_TOKEN)
        models.append(KneserNeyModel(enc, order, len(vocab), start, discounts))
    return models[0], models[1]


def _set_name(pattern: str) -> str:
    stem = Path(pattern).name
    for suffix in (".txt",):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    return stem


def parse_discounts(text: str | None, order: int) -> list[list[float]] | None:
    if text is None:
        return None
    values = [float(x) for x in text.split(",")]
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise argparse.ArgumentTypeError("--discounts takes D or D1,D2,D3")
    return [values] * order


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("heldout", nargs="+", help="held-out files or globs; each argument is one set")
    parser.add_argument("--train", required=True, help="training files (glob), as the biLM's --train")
    parser.add_argument("--vocab", required=True, help="the biLM's vocabulary file")
    parser.add_argument("--order", type=int, default=3, help="n-gram order (default 3)")
    parser.add_argument(
        "--streams",
        type=int,
        default=BILM_STREAMS,
        help="count only what the biLM's evaluation with this many streams counts (its default "
        f"{BILM_STREAMS}); 0 counts every prediction",
    )
    parser.add_argument(
        "--discounts", help="fixed discount(s) D or D1,D2,D3 for every order instead of estimates"
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (ValueError, OSError) as err:  # bad data or files: one line, never a traceback
        print(f"ngram_baseline: error: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    """Train both directions, score each held-out set, print the table (and write the JSON)."""
    t0 = time.monotonic()
    vocab = Vocabulary.from_file(args.vocab)
    train_files = corpus_files(args.train)
    models = train_models(train_files, vocab, args.order, parse_discounts(args.discounts, args.order))
    t_train = time.monotonic() - t0
    n_train = int(models[0].tables[1].raw.sum() - 2 * models[0].tables[1].raw[models[0].start])
    print(
        f"trained order-{args.order} interpolated modified Kneser-Ney, forward and backward, on "
        f"{len(train_files)} file(s), {n_train:,} tokens, vocabulary {len(vocab):,}: {t_train:.1f} s"
    )
    for direction, model in zip(("forward", "backward"), models):
        sizes = " ".join(f"{len(model.tables[k].raw):,}" for k in range(1, args.order + 1))
        disc = " | ".join(
            " ".join(f"{d:.3f}" for d in model.tables[k].discounts) for k in range(1, args.order + 1)
        )
        print(f"  {direction}: n-grams by order {sizes}; discounts D1 D2 D3+ by order {disc}")

    results = []
    for pattern in args.heldout:
        t1 = time.monotonic()
        results.append(evaluate(models, vocab, _set_name(pattern), corpus_files(pattern), args.streams))
        results[-1].seconds = time.monotonic() - t1

    counted = (
        "every prediction" if args.streams == 0 else f"the biLM's {args.streams}-stream evaluation subset"
    )
    print(f"\nheld-out perplexity, counting {counted} (exp mean NLL, <UNK> predictions included):")
    header = (
        f"{'set':<32} {'sentences':>9} {'predictions':>11} {'OOV %':>6} "
        f"{'forward':>9} {'backward':>9} {'average':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.name:<32} {r.sentences:>9,} {r.predictions:>11,} {100 * r.oov_rate:>6.2f} "
            f"{r.forward:>9.2f} {r.backward:>9.2f} {r.average:>9.2f}"
        )
    print(f"total time {time.monotonic() - t0:.1f} s")

    if args.json:
        payload = {
            "model": f"interpolated modified Kneser-Ney {args.order}-gram (scripts/ngram_baseline.py)",
            "order": args.order,
            "train": train_files,
            "train_tokens": n_train,
            "vocab": str(args.vocab),
            "vocab_size": len(vocab),
            "discounts": {
                direction: [list(model.tables[k].discounts) for k in range(1, args.order + 1)]
                for direction, model in zip(("forward", "backward"), models)
            },
            "protocol": (
                "biLM protocol: sentence = <S> w1..wn </S>, forward predicts w1..wn </S>, backward "
                "wn..w1 <S>, out-of-vocabulary tokens are <UNK> and counted; perplexity = exp(mean NLL); "
                + (
                    "every prediction counted"
                    if args.streams == 0
                    else f"only the predictions of the biLM's evaluation with {args.streams} streams "
                    "(last incomplete batch dropped); *_all fields count every prediction"
                )
            ),
            "streams": args.streams,
            "results": [{k: v for k, v in vars(r).items()} for r in results],
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
