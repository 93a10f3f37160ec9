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
- Warm-up (``warmup=True``, the default): every batch is run once and thrown away before the
  pass whose vectors are returned, so those vectors start from the states the whole input left,
  not from zeros: the same texts give different numbers with ``warmup=False``, and a text's
  vectors depend on the texts before it.
- Character ids: bilm-tf's ``Batcher`` with the model's ``vocab.txt`` (``limit`` first words
  cached): a cached word at the index of ``<S>`` / ``</S>`` (the last cached word when either is
  not among them) is read as that sentence boundary; no vocabulary means ``<S>`` and ``</S>``
  only. A text given as a str is a sequence of one-character tokens, as in simple_elmo.

Not run against simple_elmo itself: it needs TensorFlow 1-style graphs, which cannot run here.
The reference numbers of the tests are simple_elmo's algorithm above applied to bilm-tf's biLM
(elmokit's, tested exact to bilm-tf's outputs, and a float64 reimplementation of bilm-tf).

Different: errors are one line (ValueError, FileNotFoundError) instead of ``SystemExit``;
``vocab.txt.gz`` is read as gzip; ``session=`` (a TensorFlow session) is refused;
``get_elmo_substitutes`` and ``load(full=True)`` (TensorFlow checkpoints) are not provided.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from ..bilm import BiLM, CarriedState
from ..characters import (
    BEGIN_OF_SENTENCE_CHAR,
    BEGIN_OF_WORD_CHAR,
    END_OF_SENTENCE_CHAR,
    END_OF_WORD_CHAR,
    PADDING_CHAR,
)
from ..hub import resolve_model

logger = logging.getLogger(__name__)

__all__ = ["ElmoModel", "divide_chunks"]

# What ``simple_elmo`` and ``simple_elmo.elmo_helpers`` hold under install_simple_elmo_module().
SIMPLE_ELMO_NAMES = ("ElmoModel", "divide_chunks")

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


def _read_vocabulary(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            return handle.read().splitlines()
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise ValueError(f"{path}: not a UTF-8 vocabulary file ({err})") from None


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
        of those, or anything else elmokit takes as a model (a name, a URL). ``max_batch_size``:
        texts per batch; ``limit``: vocabulary words cached. ``device``: where to run (default
        the CPU; an elmokit addition)."""
        if full:
            raise ValueError(
                "load(full=True) reads TensorFlow checkpoints, which elmokit cannot: load the HDF5 "
                "model (full=False)"
            )
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
        source = resolve_model(directory)
        options_file, weight_file = source.files()
        try:  # what simple_elmo checks in the file itself (elmokit reads 261 as 262)
            n_characters = json.loads(Path(options_file).read_text(encoding="utf-8"))["char_cnn"][
                "n_characters"
            ]
        except (ValueError, KeyError, TypeError):
            n_characters = None  # BiLM.load names what is wrong
        if n_characters == 261:
            raise ValueError(
                f"{options_file}: invalid number of characters: 261; set n_characters to 262 for inference"
            )
        bilm = BiLM.load(options_file, weight_file)
        self.bilm = bilm.to(device) if device is not None else bilm
        self.max_chars = bilm.options.char_cnn.max_characters_per_token
        self.batcher = _Characters(_read_vocabulary(source.extras.get("vocab")), self.max_chars, limit)
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
            for final in [False, True] if warmup else [True]:
                for chunk in chunks:
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
        self, data: Sequence[Sequence[str]], topn: int = 3, nodelimiters: bool = True
    ) -> list:
        """Not provided: simple_elmo computes it with a TensorFlow checkpoint (``load(full=True)``)."""
        raise NotImplementedError(
            "get_elmo_substitutes needs simple_elmo's TensorFlow checkpoint (load(full=True)), which "
            "elmokit cannot read; for language-model scores use elmokit's LanguageModel"
        )
