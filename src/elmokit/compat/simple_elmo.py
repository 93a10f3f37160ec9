"""simple_elmo 0.9.2's ``ElmoModel`` on elmokit (NLPL's loader for the models of its vector
repository), so that switching is one import::

    from elmokit.compat.simple_elmo import ElmoModel   # was: from simple_elmo import ElmoModel

    model = ElmoModel()
    model.load("209.zip")                  # an NLPL zip, a model folder, a name or a URL
    vectors = model.get_elmo_vectors(texts, layers="average")
    sentence_vectors = model.get_elmo_vector_average(texts)

or, for code that cannot change its imports, ``elmokit.compat.install_simple_elmo_module()``
before ``import simple_elmo``.

What simple_elmo computes, and so what this computes (its code, read line by line):

- Shapes and dtypes: ``get_elmo_vectors`` gives float64 (len(texts), longest text, 2 *
  projection_dim), or (len(texts), layers, longest text, dim) with ``layers="all"``; positions
  past the end of a text in its batch hold the vectors bilm-tf computes for padding (for the
  token layer: the char CNN of an all-padding token, nonzero; zeros for the LSTM layers), positions
  past the longest text of its batch are zeros. ``get_elmo_vector_average`` gives float64
  (len(texts), dim) or (len(texts), layers, dim): the sum of a text's rows up to its batch's longest
  text (padding rows included), divided by that length, then scaled to unit length (with
  ``layers="all"``: the (layers, dim) matrix to unit Frobenius norm, after simple_elmo's
  ``reshape`` of (layers, tokens, dim) into (tokens, layers, dim), which reorders the values
  without transposing; kept as it is).
- ``layers``: ``"average"`` is the mean of the layers (its weights are softmax(0 + 1/L), equal),
  ``"top"`` the top layer, ``"all"`` every layer.
- Batches: texts in order, ``max_batch_size`` at a time. bilm-tf's LSTMs are stateful: row r of a
  batch starts from the states row r reached at the end of the previous batch (rows beyond a
  smaller batch keep theirs); each call starts from zeros (simple_elmo opens a new TensorFlow
  session per call).
- Warm-up (``warmup=True``, the default): the first batch (the first ``max_batch_size`` texts)
  is run once and thrown away before the pass whose vectors are returned (simple_elmo's
  ``warmup`` loop ends in ``break``), so that pass starts from the states the first batch left,
  not from zeros: the same texts give different numbers with ``warmup=False``, and a text's
  vectors depend on the texts before it and on the first batch.
- Character ids: bilm-tf's ``Batcher`` with the model's ``vocab.txt`` (``limit`` first words
  cached): a cached word at the index of ``<S>`` / ``</S>`` (the last cached word when either is
  not among them) is read as that sentence boundary; no vocabulary means ``<S>`` and ``</S>``
  only. A text given as a str is a sequence of one-character tokens, as in simple_elmo.

- ``get_elmo_substitutes(raw_sentences, topn=3, nodelimiters=True)`` (after ``load(...,
  full=True)``): the language model reads the sentences as bilm-tf's training batches of one
  step: ``max_batch_size`` rows, each row a stream of ``<S> w_1 .. w_n </S>`` (and the reverse
  stream) taking the next sentence when its own ends. simple_elmo feeds the initial zero LSTM
  state at every step (it never feeds back the state reached), so each prediction comes from one
  token: the forward LM's from the word before (``<S>`` for the first), the backward LM's from
  the word after (``</S>`` for the last). Per word: the ``topn`` ids of
  ``numpy.argpartition`` (in its order, not sorted; among equal scores, which are kept and their
  order are unspecified: numpy versions differ), their words and their *logits* rounded to 4
  decimals (``"logp"``, unnormalized scores, as simple_elmo returns them); ``nodelimiters`` sets
  the scores of vocabulary ids 0 and 1 to 0 (normally ``<S>`` and ``</S>``; a score of 0 can still
  rank high). Sentences come out in the order they finish, not the input order, and the
  sentences still running when a row finds no sentence left are dropped (bilm-tf drops that last,
  incomplete batch); fewer sentences than ``max_batch_size`` is an error, as in simple_elmo.

Not run against simple_elmo itself: it needs TensorFlow 1-style graphs, which cannot run here.
The reference numbers of the tests are simple_elmo's algorithm above applied to bilm-tf's biLM
(elmokit's, tested exact to bilm-tf's outputs, and a float64 reimplementation of bilm-tf, LSTM
steps and softmax included).

Different: errors are one line (ValueError, FileNotFoundError) instead of ``SystemExit`` and
``SystemError``; ``vocab.txt.gz`` is read as gzip; ``session=`` (a TensorFlow session) is refused;
``load(full=True)`` reads the model's ``softmax.hdf5`` and ``vocab.txt`` (``elmokit export``
writes them from a training run) instead of a TensorFlow checkpoint, takes every model spec
(simple_elmo: a folder only) and leaves the vectors working too (simple_elmo's then fail);
``get_elmo_substitutes`` also takes sentences as lists of tokens.
"""

from __future__ import annotations

import gzip
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..base.jsonfiles import read_json
from ..embed.runners import evaluating
from ..hub import resolve_model
from ..lm.language_model import LanguageModel
from ..model.bilm import BiLM, CarriedState
from ..model.characters import (
    BEGIN_OF_SENTENCE_CHAR,
    BEGIN_OF_WORD_CHAR,
    END_OF_SENTENCE_CHAR,
    END_OF_WORD_CHAR,
    PADDING_CHAR,
)

logger = logging.getLogger(__name__)

__all__ = ["Batcher", "ElmoModel", "divide_chunks"]

# What ``simple_elmo`` and ``simple_elmo.elmo_helpers`` hold under install_simple_elmo_module().
SIMPLE_ELMO_NAMES = ("Batcher", "ElmoModel", "divide_chunks")

LAYERS = ("average", "top", "all")


def divide_chunks(data: Sequence, n: int) -> Iterator[Sequence]:
    """``data`` in slices of ``n``, in order (simple_elmo's helper)."""
    for i in range(0, len(data), n):
        yield data[i : i + n]


class _Characters:
    """bilm-tf's ``Batcher`` / ``UnicodeCharsVocabulary``: the character ids of a token, with the
    first ``limit`` words of the vocabulary cached (which only matters for the two boundary
    tokens: see the module docstring)."""

    def __init__(self, vocabulary: list[str] | None, max_chars: int, limit: int | None) -> None:
        if max_chars < 3:
            raise ValueError(f"max_characters_per_token must be at least 3, got {max_chars}")
        self.max_chars = max_chars
        lines = vocabulary if vocabulary is not None else ["<S>", "</S>", "<UNK>"]
        words: list[str] = []
        index: dict[str, int] = {}
        bos = eos = -1
        for line in lines:
            word = line.strip()
            if word == "<S>":
                bos = len(words)
            elif word == "</S>":
                eos = len(words)
            if word == "!!!MAXTERMID":
                continue
            index[word] = len(words)
            words.append(word)
            if len(words) == limit:
                break
        self._special: dict[str, tuple[int, ...]] = {}
        if words:
            rows = {bos % len(words): BEGIN_OF_SENTENCE_CHAR}
            rows[eos % len(words)] = END_OF_SENTENCE_CHAR  # after <S>'s: the later write wins
            for word, row in index.items():
                if row in rows:
                    self._special[word] = self._marker(rows[row])

    def _marker(self, char: int) -> tuple[int, ...]:
        ids = [PADDING_CHAR] * self.max_chars
        ids[:3] = [BEGIN_OF_WORD_CHAR, char, END_OF_WORD_CHAR]
        return tuple(ids)

    def token_ids(self, token: str) -> tuple[int, ...]:
        """Unshifted ids of one token (its UTF-8 bytes, cut to max_chars - 2, between the word
        markers; an empty token is the two markers)."""
        special = self._special.get(token)
        if special is not None:
            return special
        body = list(token.encode("utf-8", "ignore")[: self.max_chars - 2])
        ids = [BEGIN_OF_WORD_CHAR, *body, END_OF_WORD_CHAR]
        return tuple(ids + [PADDING_CHAR] * (self.max_chars - len(ids)))

    def batch(self, texts: Sequence[Sequence[str]]) -> torch.Tensor:
        """(len(texts), longest, max_chars) shifted ids, all-zero rows past each text (the biLM
        adds <S> and </S>)."""
        longest = max(len(text) for text in texts)
        out = torch.zeros(len(texts), longest, self.max_chars, dtype=torch.long)
        for i, text in enumerate(texts):
            for j, token in enumerate(text):
                if not isinstance(token, str):
                    raise TypeError(
                        f"text {i}, token {j} is a {type(token).__name__}, not a str: {token!r:.60}"
                    )
                out[i, j] = torch.tensor(self.token_ids(token)) + 1
        return out


class Batcher:
    """simple_elmo's (bilm-tf's) ``Batcher``: tokenized sentences -> character ids, int64
    (n_sentences, longest + 2, max_token_length), ``<S>`` and ``</S>`` added, shifted by one so
    that 0 is padding. ``lm_vocab_file``: the model's vocab.txt (or .gz; None: only ``<S>``, ``</S>``,
    ``<UNK>``), its first ``limit`` words cached (all with None), as ``ElmoModel`` reads it."""

    def __init__(
        self, lm_vocab_file: str | os.PathLike | None, max_token_length: int, limit: int | None = None
    ) -> None:
        vocabulary = None if lm_vocab_file is None else _read_vocabulary(Path(lm_vocab_file), limit)
        self._characters = _Characters(vocabulary, max_token_length, limit)
        self._max_token_length = max_token_length

    def batch_sentences(self, sentences: Sequence[Sequence[str]]) -> np.ndarray:
        if isinstance(sentences, str) or not isinstance(sentences, Sequence) or len(sentences) == 0:
            raise ValueError(
                "sentences must be a non-empty list of tokenized sentences, e.g. [['Hello', 'world']]"
            )
        characters = self._characters
        longest = max(len(sentence) for sentence in sentences) + 2
        out = np.zeros((len(sentences), longest, self._max_token_length), dtype=np.int64)
        begin, end = (
            np.array(characters._marker(c)) + 1 for c in (BEGIN_OF_SENTENCE_CHAR, END_OF_SENTENCE_CHAR)
        )
        for k, sentence in enumerate(sentences):
            out[k, 0], out[k, len(sentence) + 1] = begin, end
            for j, token in enumerate(sentence):
                if not isinstance(token, str):
                    raise TypeError(
                        f"sentence {k}, token {j} is a {type(token).__name__}, not a str: {token!r:.60}"
                    )
                out[k, j + 1] = np.array(characters.token_ids(token)) + 1
        return out


# -- get_elmo_substitutes' batches -----------------------------------------------------------
_LM_ROWS = 512  # steps run through the language model at once
# One step of one batch row: (row, (forward input token, its target), (backward input, target))
_Step = tuple[int, tuple[str, str], tuple[str, str]]


def _words(sentence: str | Sequence[str]) -> list[str]:
    return sentence.split() if isinstance(sentence, str) else [str(token) for token in sentence]


def _lm_steps(sentences: list[list[str]], batch_size: int) -> list[_Step]:
    """simple_elmo's ``pack_encoded`` with one step per batch (bilm-tf's ``_get_batch``): each
    of ``batch_size`` rows reads ``<S> w_1 .. w_n </S>`` and its reverse stream ``</S> w_n ..
    w_1 <S>`` one token per batch, taking the next sentence when its own is done; the first
    batch that finds no sentence left for a row is dropped with all later ones. Returns the
    steps of the batches kept, batch by batch, row by row."""
    pending = iter(sentences)
    streams: list[tuple[list[str], list[str]] | None] = [None] * batch_size
    steps: list[_Step] = []
    while True:
        batch: list[_Step] = []
        exhausted = False
        for row in range(batch_size):
            stream = streams[row]
            if stream is None or len(stream[0]) <= 1:
                sentence = next(pending, None)
                if sentence is None:
                    exhausted = True
                    continue
                stream = (["<S>", *sentence, "</S>"], ["</S>", *reversed(sentence), "<S>"])
            forward, backward = stream
            batch.append((row, (forward[0], forward[1]), (backward[0], backward[1])))
            streams[row] = (forward[1:], backward[1:])
        if exhausted:
            return steps
        steps.extend(batch)


def _without_word(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in entry.items() if key != "word"}


MAX_VOCABULARY_CHARS = 256 << 20  # of vocab.txt (decompressed): NLPL's are a few MB


def _read_vocabulary(path: Path | None, limit: int | None = None) -> list[str] | None:
    """The lines of a vocabulary file (``vocab.txt.gz`` decompressed as it is read), up to the
    ``limit`` words ``_Characters`` keeps; at most ``MAX_VOCABULARY_CHARS`` characters are
    read, so a small file that expands to gigabytes is refused before it fills the memory."""
    if path is None:
        return None
    opener = gzip.open if path.name.endswith(".gz") else open
    lines: list[str] = []
    words = read = 0
    limit = limit if limit is not None and limit > 0 else None  # as _Characters counts
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            while limit is None or words < limit:
                line = handle.readline(MAX_VOCABULARY_CHARS - read + 1)
                if not line:
                    break
                read += len(line)
                if read > MAX_VOCABULARY_CHARS:
                    raise ValueError(
                        f"{path}: more than {MAX_VOCABULARY_CHARS >> 20} MiB of text"
                        f"{' once decompressed' if path.name.endswith('.gz') else ''}: not a vocabulary "
                        "file (one word per line)"
                    )
                for part in line.splitlines():
                    lines.append(part)
                    words += part.strip() != "!!!MAXTERMID"
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise ValueError(f"{path}: not a UTF-8 vocabulary file ({err})") from None
    return lines


def _tensorflow_checkpoint(directory: str | os.PathLike) -> str | None:
    """The name of the TensorFlow checkpoint in a model folder (simple_elmo's full model: the
    ``checkpoint`` file and ``model.ckpt-N.index`` / ``.data-*``), or None."""
    folder = Path(os.fspath(directory)).expanduser()
    try:
        if not folder.is_dir():
            return None
        index = sorted(p.name for p in folder.iterdir() if p.name.endswith(".index") and ".ckpt" in p.name)
    except OSError:
        return None
    if index:
        return index[-1][: -len(".index")]
    return "checkpoint" if (folder / "checkpoint").is_file() and (folder / "options.json").is_file() else None


def _has_hdf5_weights(directory: str | os.PathLike, softmax: bool) -> bool:
    """Whether a folder holds HDF5 weights beside its checkpoint (and ``softmax.hdf5`` too)."""
    folder = Path(os.fspath(directory)).expanduser()
    names = {p.name for p in folder.iterdir() if p.suffix == ".hdf5"}
    return bool(names - {"softmax.hdf5"}) and (not softmax or "softmax.hdf5" in names)


class ElmoModel:
    """simple_elmo's ``ElmoModel``: ``load`` a model, then ``get_elmo_vectors`` /
    ``get_elmo_vector_average`` of tokenized texts, with simple_elmo's shapes, dtypes and
    numbers (see the module docstring)."""

    def __init__(self) -> None:
        self.bilm: BiLM | None = None
        self.batcher: _Characters | None = None
        self.batch_size: int | None = None
        self.max_chars: int | None = None
        self.vector_size: int | None = None
        self.n_layers: int | None = None
        self.lm: LanguageModel | None = None  # with load(full=True)
        self.logger = logger

    def load(
        self,
        directory: str | os.PathLike,
        max_batch_size: int = 32,
        limit: int | None = 100,
        full: bool = False,
        *,
        device: str | torch.device | None = None,
    ) -> str:
        """Load a model: an NLPL zip (``options.json``, ``model.hdf5``, ``vocab.txt``), a folder
        of those, or anything else elmokit takes as a model (a name, a URL, ``hf://``).
        ``max_batch_size``: texts per batch; ``limit``: vocabulary words cached. ``full=True``:
        also the language model (the model's ``softmax.hdf5`` and ``vocab.txt``, read by
        ``elmokit.LanguageModel``), for ``get_elmo_substitutes``; the vectors work as well.
        ``device``: where to run (default the CPU; an elmokit addition)."""
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
        checkpoint = _tensorflow_checkpoint(directory)
        if checkpoint is not None and not _has_hdf5_weights(directory, softmax=full):
            raise ValueError(
                f"{directory} holds a TensorFlow checkpoint ({checkpoint}), which elmokit does not read "
                "(it runs without TensorFlow): convert it where TensorFlow runs, the biLM with bilm-tf's "
                "dump_weights to weights.hdf5 and, for full=True, the checkpoint's lm/softmax/W and "
                "lm/softmax/b to softmax.hdf5 as softmax/W and softmax/b (docs/migrating-simple-elmo.md)"
            )
        source = resolve_model(directory)
        options_file, weight_file = source.files()
        self.lm = None
        vocabulary: list[str] | None
        if full:  # the language model: biLM, softmax.hdf5 and vocab.txt (simple_elmo: a checkpoint)
            lm = LanguageModel.from_pretrained(directory, device=device or "cpu")
            bilm, vocabulary = lm.bilm, lm.vocab.tokens
            self.lm = lm
        else:
            try:  # what simple_elmo checks in the file itself (elmokit reads 261 as 262)
                n_characters = read_json(options_file, what="options file")["char_cnn"]["n_characters"]
            except (ValueError, KeyError, TypeError):
                n_characters = None  # BiLM.load names what is wrong
            if n_characters == 261:
                raise ValueError(
                    f"{options_file}: invalid number of characters: 261; set n_characters to 262 for "
                    "inference"
                )
            bilm = BiLM.load(options_file, weight_file)
            bilm = bilm.to(device) if device is not None else bilm
            vocabulary = _read_vocabulary(source.extras.get("vocab"), limit)
        self.bilm = bilm
        self.max_chars = bilm.options.char_cnn.max_characters_per_token
        self.batcher = _Characters(vocabulary, self.max_chars, limit)
        self.batch_size = max_batch_size
        self.vector_size = bilm.output_dim
        self.n_layers = bilm.options.lstm.n_layers + 1
        logger.info("Loaded ELMo model from %s", source.spec)
        return "The model is now loaded."

    # -- the biLM, as simple_elmo's graph runs it ----------------------------------------------
    def _check(self, texts: Sequence[Sequence[str]], layers: str, session: object) -> BiLM:
        if self.bilm is None:
            raise ValueError("no model loaded: call load(directory) first")
        if session is not None:
            raise ValueError("session= takes a TensorFlow session; elmokit runs without TensorFlow: omit it")
        if layers not in LAYERS:
            raise ValueError(f"layers must be one of {', '.join(LAYERS)}, got {layers!r}")
        if isinstance(texts, str) or not isinstance(texts, Sequence) or len(texts) == 0:
            raise ValueError("texts must be a non-empty list of tokenized texts, e.g. [['Hello', 'world']]")
        return self.bilm

    def _batches(self, texts: Sequence[Sequence[str]], layers: str, warmup: bool) -> Iterator[np.ndarray]:
        """simple_elmo's ``weighted_op`` for each batch of the returned pass, float32 numpy:
        (batch, longest, dim), or (batch, layers, longest, dim) for ``"all"``."""
        bilm = self.bilm
        assert bilm is not None and self.batcher is not None and self.batch_size is not None
        carried = CarriedState()  # a new session: zeros
        chunks = [list(map(list, chunk)) for chunk in divide_chunks(texts, self.batch_size)]
        like = bilm.lstm.lstm_layers[0].weight_hidden
        with torch.no_grad():
            padding = bilm.token_encoder.encode_unique(
                torch.zeros(1, bilm.token_encoder.input_width, dtype=torch.long, device=like.device)
            )[0]
            # simple_elmo's warmup(): the first batch once, thrown away (its loop ends in `break`)
            passes = [(False, chunks[:1]), (True, chunks)] if warmup else [(True, chunks)]
            for final, batches in passes:
                for chunk in batches:
                    ids = self.batcher.batch(chunk).to(like.device)
                    state = carried.initial(bilm, len(chunk), like)
                    out = bilm(ids, state, keep_sentence_boundaries=False)
                    carried.update(out.state)
                    if final:
                        yield self._weighted(out.layers, out.mask, padding, layers).cpu().numpy()

    @staticmethod
    def _weighted(layers: torch.Tensor, mask: torch.Tensor, padding: torch.Tensor, use: str) -> torch.Tensor:
        """bilm-tf's layers (the token layer at padding positions is the padding token's
        vector) and simple_elmo's ``weight_layers`` without layer norm, gamma 1."""
        token_layer = torch.where(mask.unsqueeze(-1), layers[0], padding.repeat(2))
        layers = torch.cat([token_layer.unsqueeze(0), layers[1:]])
        n = layers.shape[0]
        if use == "all":
            return layers.transpose(0, 1)
        if use == "top":
            return layers[-1]
        weights = torch.softmax(torch.full((n,), 1.0 / n, dtype=layers.dtype, device=layers.device), 0)
        return sum(w * layer for w, layer in zip(weights, layers))

    def get_elmo_vectors(
        self,
        texts: Sequence[Sequence[str]],
        warmup: bool = True,
        layers: str = "average",
        session: object = None,
    ) -> np.ndarray:
        """float64 (len(texts), longest text, dim), or (len(texts), layers, longest, dim) for
        ``layers="all"``: each token's vector (see the module docstring for warm-up)."""
        bilm = self._check(texts, layers, session)
        longest, dim = max(len(text) for text in texts), bilm.output_dim  # dim: self.vector_size
        shape = (len(texts), bilm.num_layers, longest, dim) if layers == "all" else (len(texts), longest, dim)
        out = np.zeros(shape)
        first = 0
        for vectors in self._batches(texts, layers, warmup):
            last = first + vectors.shape[0]
            if layers == "all":
                out[first:last, :, : vectors.shape[2], :] = vectors
            else:
                out[first:last, : vectors.shape[1], :] = vectors
            first = last
        return out

    def get_elmo_vector_average(
        self,
        texts: Sequence[Sequence[str]],
        warmup: bool = True,
        layers: str = "average",
        session: object = None,
    ) -> np.ndarray:
        """float64 (len(texts), dim), or (len(texts), layers, dim) for ``layers="all"``: each
        text's mean vector scaled to unit length, as simple_elmo computes it (module docstring)."""
        bilm = self._check(texts, layers, session)
        n_layers, dim = bilm.num_layers, bilm.output_dim  # dim: self.vector_size
        shape = (len(texts), n_layers, dim) if layers == "all" else (len(texts), dim)
        out = np.zeros(shape)
        row = 0
        for vectors in self._batches(texts, layers, warmup):
            if layers == "all":  # simple_elmo's reshape, not a transpose
                vectors = vectors.reshape(vectors.shape[0], vectors.shape[2], n_layers, dim)
            for sentence in vectors:
                sentence = sentence.astype(np.float64)
                mean = sentence.sum(axis=0) / sentence.shape[0]
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[row] = mean / np.linalg.norm(mean)
                row += 1
        return out

    def get_elmo_substitutes(
        self, data: Sequence[str], topn: int = 3, nodelimiters: bool = True
    ) -> list[list[dict[str, Any]]]:
        """simple_elmo's language-model predictions for each word of each sentence (raw strings,
        split on whitespace; a list of tokens is taken as it is): a list per sentence of
        ``{"word", "forward": {"candidates", "candidate_words", "logp"}, "backward": {...}}``,
        ``topn`` candidates each. Needs ``load(..., full=True)``. What simple_elmo computes, kept
        as it is (see the module docstring): sentences in the order they finish, the last ones
        left out, each prediction from one token and zero LSTM states, ``logp`` the rounded
        logits."""
        lm = self.lm
        if lm is None or self.batch_size is None:
            raise ValueError("get_elmo_substitutes needs the language model: load the model with full=True")
        if isinstance(data, str) or not isinstance(data, Sequence):
            raise TypeError("data must be a list of sentences (strings), e.g. ['The cat sat .']")
        if isinstance(topn, bool) or not isinstance(topn, int) or topn < 1:
            raise ValueError(f"topn must be a positive integer, got {topn!r}")
        if len(data) < self.batch_size:
            raise ValueError(
                f"get_elmo_substitutes needs at least max_batch_size ({self.batch_size}) sentences, got "
                f"{len(data)}: load with a smaller max_batch_size"
            )
        vocab = lm.vocab
        if topn > len(vocab):
            raise ValueError(f"topn must be at most the vocabulary size {len(vocab)}, got {topn}")
        characters = _Characters(vocab.tokens, lm.bilm.options.char_cnn.max_characters_per_token, None)
        steps = _lm_steps([_words(sentence) for sentence in data], self.batch_size)
        predictions: list[list[dict[str, Any]]] = []
        storage: list[tuple[list[dict], list[dict]]] = [([], []) for _ in range(self.batch_size)]
        for start in range(0, len(steps), _LM_ROWS):
            rows = steps[start : start + _LM_ROWS]
            scores = self._lm_scores(lm, characters, rows)  # (2, rows, V) float32
            if nodelimiters:
                scores[:, :, :2] = 0  # simple_elmo zeroes the scores of ids 0 and 1
            top = np.argpartition(scores, -topn, axis=-1)[..., -topn:]
            logp = np.round(np.take_along_axis(scores, top, -1).astype(float), 4)
            for k, (row, (_, target), (_, target_back)) in enumerate(rows):
                word = vocab.id_to_token(vocab.token_to_id(target))  # <UNK> outside the vocabulary
                word_back = vocab.id_to_token(vocab.token_to_id(target_back))
                if word == "</S>" and word_back == "<S>":  # the sentence's last step
                    forward, backward = storage[row]
                    predictions.append(
                        [
                            {"word": f["word"], "forward": _without_word(f), "backward": _without_word(b)}
                            for f, b in zip(forward, reversed(backward))
                        ]
                    )
                    storage[row] = ([], [])
                    continue
                for direction, (name, entries) in enumerate(zip((word, word_back), storage[row])):
                    entries.append(
                        {
                            "word": name,
                            "candidates": top[direction, k].tolist(),
                            "candidate_words": [vocab.id_to_token(int(i)) for i in top[direction, k]],
                            "logp": logp[direction, k].tolist(),
                        }
                    )
        return predictions

    @staticmethod
    def _lm_scores(lm: LanguageModel, characters: _Characters, rows: list[_Step]) -> np.ndarray:
        """The softmax's logits (2, len(rows), V), float32, for each step's forward and
        backward input token, each run one step from zero LSTM states (simple_elmo feeds the
        initial zero state at every step)."""
        softmax = lm.softmax
        assert softmax is not None  # from_pretrained gives a model with its softmax
        like = next(lm.parameters())
        inputs = [[forward for _, (forward, _), _ in rows], [backward for _, _, (backward, _) in rows]]
        ids = characters.batch(inputs)  # (2, rows, max_chars), shifted by +1
        with torch.inference_mode(), evaluating(lm):
            hidden, _ = lm.hidden_states(ids.unsqueeze(2).to(like.device))  # (2, rows, 1, dim)
            return softmax.logits(hidden[:, :, 0]).float().cpu().numpy()
