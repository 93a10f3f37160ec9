"""Readers for the downstream data sets, and the NER tag-scheme conversions.

- CoNLL-2003 (``word POS chunk NER`` columns, IOB1 tags, ``-DOCSTART-`` document separators)
- CoNLL-U (Universal Dependencies; UPOS by default; multiword ranges and empty nodes skipped)
- Stanford Sentiment Treebank PTB trees (root label 0-4, or the binary variant)

Tagged readers return ``TaggedSentence(tokens, tags)``; the SST reader ``LabeledSentence(tokens,
label)``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__: list[str] = []


@dataclass
class TaggedSentence:
    tokens: list[str]
    tags: list[str]


@dataclass
class LabeledSentence:
    tokens: list[str]
    label: str


def _lines(path: str | os.PathLike) -> list[str]:
    """The file's lines without line ends (a UTF-8 byte-order mark is dropped)."""
    with open(path, encoding="utf-8-sig") as f:
        return [line.rstrip("\r\n") for line in f]


def _other_format(line: str) -> str | None:
    """The name of the data format a line of a wrong file belongs to, if it is recognisable."""
    fields = line.split("\t")
    conllu_row = len(fields) == 10 and re.fullmatch(r"\d+([-.]\d+)?", fields[0])
    if re.match(r"#\s*[\w.-]+\s*=", line) or conllu_row:
        return "CoNLL-U (use it with task pos)"
    if re.match(r"\s*\(\d", line):
        return "SST trees (use it with task sentiment)"
    return None


_NER_TAG = re.compile(r"O|[BIES]-\S+")


def read_conll2003(path: str | os.PathLike, column: int = -1) -> list[TaggedSentence]:
    """Sentences of a CoNLL-2003 file: tokens (column 0) and tags (``column``, default the last,
    NER) exactly as written: IOB1 as in the original files, or IOB2/BIOES. ``-DOCSTART-`` lines
    are skipped. A line of another format (CoNLL-U, SST) or a last column that is not an NER tag
    is an error naming the file and line."""
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []

    def flush() -> None:
        if tokens:
            sentences.append(TaggedSentence(list(tokens), list(tags)))
            tokens.clear()
            tags.clear()

    for number, line in enumerate(_lines(path), start=1):
        fields = line.split()
        if not fields:
            flush()
            continue
        if fields[0] == "-DOCSTART-":
            flush()
            continue
        other = _other_format(line)
        if other:
            raise ValueError(f"{path}: line {number}: this is not a CoNLL-2003 file; it looks like {other}")
        if len(fields) < 2:
            raise ValueError(f"{path}: line {number}: expected 'word ... TAG', got {line!r}")
        if column == -1 and not _NER_TAG.fullmatch(fields[-1]):
            raise ValueError(
                f"{path}: line {number}: {fields[-1]!r} is not an NER tag (O, B-X, I-X, E-X or S-X)"
            )
        tokens.append(fields[0])
        tags.append(fields[column])
    flush()
    return sentences


UPOS, XPOS = 3, 4


def read_conllu(path: str | os.PathLike, column: int = UPOS) -> list[TaggedSentence]:
    """Sentences of a CoNLL-U file: FORM and (by default) UPOS of every syntactic word.

    Comment lines, multiword-token ranges (``3-4``) and empty nodes (``8.1``) are skipped."""
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    for number, line in enumerate(_lines(path), start=1):
        if not line.strip():
            if tokens:
                sentences.append(TaggedSentence(tokens, tags))
                tokens, tags = [], []
            continue
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 10:
            hint = " (an SST tree file? use it with task sentiment)" if re.match(r"\s*\(\d", line) else ""
            raise ValueError(
                f"{path}: line {number}: expected 10 tab-separated CoNLL-U columns, got {len(fields)}{hint}"
            )
        if "-" in fields[0] or "." in fields[0]:
            continue
        if not fields[1]:
            raise ValueError(f"{path}: line {number}: empty FORM (column 2)")
        tokens.append(fields[1])
        tags.append(fields[column])
    if tokens:
        sentences.append(TaggedSentence(tokens, tags))
    return sentences


# Only ASCII blanks separate atoms: SST has leaves with a no-break space inside ("8\u00a01\\/2").
_TREE_TOKEN = re.compile(r"\(|\)|[^ \t\r\n()]+")
_PTB_ESCAPES = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}
SST_BINARY = {"0": "negative", "1": "negative", "3": "positive", "4": "positive"}


def parse_sst_tree(line: str) -> tuple[str, list[str]]:
    """(root label, leaf tokens) of one bracketed SST tree. PTB escapes (-LRB-, ``\\/``, ``\\*``)
    are turned back into the characters they stand for."""
    parts = _TREE_TOKEN.findall(line)
    if len(parts) < 4 or parts[0] != "(":
        raise ValueError(f"not a bracketed tree: {line[:60]!r}")
    root = parts[1]
    words: list[str] = []
    depth = 0
    for i, part in enumerate(parts):
        if part == "(":
            depth += 1
        elif part == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets: {line[:60]!r}")
            if depth == 0 and i < len(parts) - 1:
                raise ValueError(f"more than one tree on the line: {line[:60]!r}")
        elif parts[i - 1] != "(":  # an atom right after "(" is a node label, any other is a word
            word = _PTB_ESCAPES.get(part, part).replace("\\/", "/").replace("\\*", "*")
            words.append(word)
    if depth != 0:
        raise ValueError(f"unbalanced brackets: {line[:60]!r}")
    if not words:
        raise ValueError(f"tree without words: {line[:60]!r}")
    return root, words


def read_sst(path: str | os.PathLike, binary: bool = False) -> list[LabeledSentence]:
    """Sentences of an SST tree file with their root label ("0".."4").

    ``binary``: drop neutral sentences (root 2) and map 0, 1 -> "negative", 3, 4 -> "positive"."""
    out: list[LabeledSentence] = []
    for number, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            label, words = parse_sst_tree(line)
        except ValueError as err:
            raise ValueError(f"{path}: line {number}: {err}") from None
        if label not in {"0", "1", "2", "3", "4"}:
            raise ValueError(f"{path}: line {number}: root label {label!r} is not 0-4")
        if binary:
            if label == "2":
                continue
            label = SST_BINARY[label]
        out.append(LabeledSentence(words, label))
    return out


# -- tag schemes ------------------------------------------------------------------------------
def _split(tag: str) -> tuple[str, str]:
    if tag == "O" or "-" not in tag:
        return "O", ""
    prefix, kind = tag.split("-", 1)
    return prefix, kind


def spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """Chunks (type, first, last) of a tag sequence, read as seqeval's default mode reads them
    (``seqeval.metrics.sequence_labeling.get_entities``): for IOB1 and IOB2 that is exactly how
    conlleval reads chunks; E and S (BIOES) also close and open chunks. A chunk starts at B/S, at
    I/E after O, E or S, and at any change of type; it ends before B/S, O or a change of type,
    and after E/S. Used to convert between IOB1 (the files) and BIOES (what the tagger learns)."""
    out: list[tuple[str, int, int]] = []
    start: int | None = None
    prev_prefix, prev_kind = "O", ""
    for i, tag in enumerate([*tags, "O"]):
        prefix, kind = _split(tag)
        # conlleval's endOfChunk(prev, cur) and startOfChunk(prev, cur)
        end = (
            prev_prefix in ("E", "S")
            or (prev_prefix != "O" and prefix in ("B", "S", "O"))
            or (prev_prefix != "O" and prev_kind != kind)
        )
        begin = (
            prefix in ("B", "S")
            or (prefix in ("I", "E") and prev_prefix in ("O", "E", "S"))
            or (prefix != "O" and prev_kind != kind)
        )
        if end and start is not None:
            out.append((prev_kind, start, i - 1))
            start = None
        if begin and prefix != "O":
            start = i
        prev_prefix, prev_kind = prefix, kind
    return out


def spans_to_iob1(chunks: Sequence[tuple[str, int, int]], length: int) -> list[str]:
    """IOB1 tags: I-X everywhere in a chunk; B-X only on the first token of a chunk that
    directly follows a chunk of the same type."""
    tags = ["O"] * length
    last_end, last_kind = -2, ""
    for kind, first, last in chunks:
        for i in range(first, last + 1):
            tags[i] = f"I-{kind}"
        if first == last_end + 1 and kind == last_kind:
            tags[first] = f"B-{kind}"
        last_end, last_kind = last, kind
    return tags


def spans_to_bioes(chunks: Sequence[tuple[str, int, int]], length: int) -> list[str]:
    tags = ["O"] * length
    for kind, first, last in chunks:
        if first == last:
            tags[first] = f"S-{kind}"
            continue
        tags[first] = f"B-{kind}"
        for i in range(first + 1, last):
            tags[i] = f"I-{kind}"
        tags[last] = f"E-{kind}"
    return tags


def spans_to_iob2(chunks: Sequence[tuple[str, int, int]], length: int) -> list[str]:
    """IOB2 tags: B-X on the first token of every chunk, I-X on the others."""
    tags = ["O"] * length
    for kind, first, last in chunks:
        tags[first] = f"B-{kind}"
        for i in range(first + 1, last + 1):
            tags[i] = f"I-{kind}"
    return tags


TAG_SCHEMES = ("IOB1", "IOB2", "BIOES")


def tag_scheme(tag_lists: Sequence[Sequence[str]]) -> str:
    """The scheme a data set's NER tags are written in: BIOES if any E-/S- tag, IOB2 if a B- tag
    starts a chunk after O or at a sentence start (IOB1 writes I- there), else IOB1."""
    iob2 = False
    for tags in tag_lists:
        previous = "O"
        for tag in tags:
            prefix = _split(tag)[0]
            if prefix in ("E", "S"):
                return "BIOES"
            iob2 = iob2 or (prefix == "B" and previous == "O")
            previous = prefix
    return "IOB2" if iob2 else "IOB1"


def from_bioes(tags: Sequence[str], scheme: str) -> list[str]:
    """The chunks of a (possibly ill-formed) BIOES sequence written in ``scheme``."""
    chunks = spans(tags)
    if scheme == "BIOES":
        return spans_to_bioes(chunks, len(tags))
    return (spans_to_iob2 if scheme == "IOB2" else spans_to_iob1)(chunks, len(tags))


def iob1_to_bioes(tags: Sequence[str]) -> list[str]:
    """The same chunks (as conlleval reads them) in BIOES."""
    return spans_to_bioes(spans(tags), len(tags))


def bioes_to_iob1(tags: Sequence[str]) -> list[str]:
    """The chunks a (possibly ill-formed) BIOES sequence means to conlleval, in IOB1."""
    return spans_to_iob1(spans(tags), len(tags))
