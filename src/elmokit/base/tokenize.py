"""Tokenization the way the 1B Word Benchmark (and so elmokit's training corpus) was tokenized.

Moses sentence splitting and the Moses/WMT tokenizer (via ``sacremoses`` and
``sentence-splitter``, the ``corpus`` extra: ``pip install elmokit[corpus]``) with the lm1b
benchmark's punctuation normalisation and the details in which its old tokenizer differs.
"""

from __future__ import annotations

import re

try:
    import regex
    from sacremoses import MosesTokenizer
    from sentence_splitter import SentenceSplitter
except ImportError as _err:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"tokenization needs the corpus extra ({_err}); install it with: pip install 'elmokit[corpus]'"
    ) from None

__all__: list[str] = []

# Character mappings of the lm1b benchmark's normalize-punctuation.perl (the
# spacing rules there only move blanks around punctuation that the tokenizer
# splits anyway, so they are not needed).
# Its other rules repair UTF-8-read-as-cp1252 mojibake ("â€œ" ...), which this
# input does not have; real guillemets are left alone, as in lm1b ("« You").
# "`" -> "'" and "''" -> '"' are steps of the lm1b tokenizer that sacremoses lacks.
_PUNCT_MAP = [
    ("\u2019", "'"),
    ("\u2018", "'"),
    ("\u2014", "--"),
    ("\u2013", "--"),
    ("\u2026", "... "),
    ("\u201e", '"'),
    ("\u2033", '"'),
    ("\u201c", '"'),
    ("\u201d", '"'),
    ("``", '"'),
    ("''", '"'),
    ("`", "'"),
]
_QUOTE_PUNCT_RE = re.compile(r'"([,.]+)')
_SPACE_RE = re.compile(r"\s+")

# lm1b used the WMT11 tokenizer, whose English non-breaking prefix list had no
# month abbreviations: "Feb. 26" -> "Feb . 26" there.
_MONTHS = {"Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec"}
_LEAD_APOS_RE = regex.compile(r"^'(?=\p{L})")
_TRAIL_APOS_RE = regex.compile(r"(?<=\p{L})'$")

_tokenizer: MosesTokenizer | None = None
_splitter: SentenceSplitter | None = None


def _get_tokenizer() -> MosesTokenizer:
    global _tokenizer
    if _tokenizer is None:
        tok = MosesTokenizer(lang="en")
        tok.NONBREAKING_PREFIXES = [p for p in tok.NONBREAKING_PREFIXES if p not in _MONTHS]
        _tokenizer = tok
    return _tokenizer


def _get_splitter() -> SentenceSplitter:
    global _splitter
    if _splitter is None:
        _splitter = SentenceSplitter(language="en")
    return _splitter


def normalize_punctuation(text: str) -> str:
    """lm1b-style punctuation normalisation; also collapses whitespace."""
    for src, dst in _PUNCT_MAP:
        if src in text:
            text = text.replace(src, dst)
    text = _QUOTE_PUNCT_RE.sub(r'\1"', text)
    return _SPACE_RE.sub(" ", text).strip()


def tokenize_sentence(sentence: str) -> str:
    """Tokenize one (normalised) sentence in the lm1b style; returns tokens joined by blanks."""
    s = _LEAD_APOS_RE.sub("' ", sentence.strip())
    s = _TRAIL_APOS_RE.sub(" '", s)
    out = _get_tokenizer().tokenize(s, escape=False, aggressive_dash_splits=False, return_str=True)
    return " ".join(out.split())


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences (Moses rules, via ``sentence-splitter``)."""
    text = _SPACE_RE.sub(" ", text).strip()
    if not text:
        return []
    return [s.strip() for s in _get_splitter().split(text) if s.strip()]


def split_and_tokenize(text: str) -> list[str]:
    """Normalise, sentence-split and tokenize a paragraph of running text.

    Returns one tokenized sentence per list item (tokens separated by single
    blanks). No filtering is done here; see :func:`keep_sentence`.
    """
    out = []
    for sent in split_sentences(normalize_punctuation(text)):
        tok = tokenize_sentence(sent)
        if tok:
            out.append(tok)
    return out


def tokenize_line(line: str) -> list[str]:
    """Tokens of one line of raw text (treated as one sentence, never split)."""
    text = normalize_punctuation(line)
    return tokenize_sentence(text).split() if text else []
