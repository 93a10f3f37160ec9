#!/usr/bin/env python
"""Build the ELMo language-model corpus from the raw news text in shared/data/lm.

Output format: UTF-8 text files, one whitespace-tokenized sentence per line,
tokenized the way the 1 Billion Word Benchmark (lm1b) was tokenized, so that the
lm1b held-out shards can be used directly for perplexity.

    python scripts/prepare_lm_corpus.py \\
        --reuters ../shared/data/lm/reuters21578 \\
        --abc ../shared/data/lm/abc_news \\
        --heldout ../shared/data/lm/lm1b_heldout \\
        [--wikipedia ../shared/data/lm/wikipedia [--wikipedia-heldout 1]] \\
        --out runs/corpus [--shards 4] [--seed S]

writes

    OUT/train/train-00000-of-0000N.txt ...   (N shards, 0-based like lm1b's held-out shards)
    OUT/heldout/reuters-valid.txt            (reut2-020.sgm)
    OUT/heldout/reuters-test.txt             (reut2-021.sgm)

Pipeline, per source
--------------------
Reuters-21578 (``reut2-NNN.sgm``; 000-019 train, 020 valid, 021 test)
  1. read as Latin-1, take the text of every ``<BODY>...</BODY>``;
  2. strip the ``Reuter\\n&#3;`` trailer (and its variants: REUTER, REUTER..., REUTE,
     "REUTER 11:43/VB", a final "MORE" line, ...) and decode the SGML entities
     (``&lt;`` ``&amp;`` ``&#N;``); control characters left by ``&#5;``, ``&#127;``
     etc. are removed;
  3. stories whose cleaned body text is an exact duplicate of an earlier story in
     the same split are dropped (the collection has ~260 such duplicates);
  4. table rows are dropped: a line with a run of 3 or more blanks between two
     non-blank characters is a column-aligned table row (about 0.6% of lines,
     e.g. "Imports      26.21   26.27    27.08"), and so is a line with dot
     leaders ("ARAB LIGHT......18.49......18.52"; a run of 5+ dots or two runs
     of 4). Blanks after a sentence end and before a capital are first turned
     back into a paragraph break ("suppliers.     In 1986"), so such prose
     lines are not mistaken for tables. This is the only layout filter;
  5. the hard-wrapped lines are unwrapped: an indented line starts a new
     paragraph (Reuters indents every paragraph, so one-line items such as
     "Shr 17 cts vs 13 cts" stay separate), continuation lines are joined with a
     space, or with nothing after a word-final hyphen ("long-\\nterm");
  6. Reuters' company/ticker markers ``<Texaco Inc>``, ``<EFH>`` lose their angle
     brackets (the name is kept), as do the few unpaired ``<``/``>``: lm1b has no
     such markup. A literal "^M" (typed carriage return, 4 lines) is removed.
ABC (NLTK "abc": ``rural.txt``, ``science.txt``) - training only
  each line is decoded as UTF-8, falling back to Latin-1 for lines that are not
  valid UTF-8 (science.txt is Latin-1 in 27 lines), CR/LF normalised, HTML
  entities decoded; a few mojibake remnants (U+00C2 before C1 controls) removed.
  Each non-blank line is one "document" (it may hold several sentences).
Wikipedia (``--wikipedia``: wikiextractor output, ``wiki_NN`` files of ``<doc ...>`` articles)
  the ``<doc>``/``</doc>`` lines and each article's title line are stripped; every other
  non-blank line is a paragraph. Section headings ("Professional career.": at most 6 words
  ending in a full stop, with no other punctuation), table remnants (lines starting with
  ``!``/``|``/``{`` or holding ``colspan=``, ``rowspan=``, ``style=``) and lines that do not end
  like a sentence (list items, captions) are dropped. Each article is one document. The
  last ``--wikipedia-heldout`` files (default 1) are not trained on: their sentences form
  ``heldout/wikipedia-test.txt``.
lm1b held-out shards (``--heldout``, files or directories)
  already tokenized; only read, never rewritten, to remove overlap from train.

Then, for every paragraph/line:
  * punctuation normalisation with the character mappings of the lm1b
    benchmark's own (modified) ``normalize-punctuation.perl``: curly quotes to
    ASCII, en/em dash to ``--``, ``...`` for the ellipsis, ``'' `` `` to ``"``,
    and the English rule ``"," -> ,"`` (punctuation moved inside the quote);
  * sentence splitting with ``sentence-splitter`` (the Python port of Moses'
    ``split-sentences.perl``: same rule family and non-breaking-prefix idea as
    the tokenizer, ships its prefix lists, needs no download);
  * tokenization with ``sacremoses`` (Python port of Moses ``tokenizer.perl``)
    with ``escape=False`` (no ``&quot;``/``&apos;``/``&amp;``), no aggressive
    dash splitting, and three adjustments that reproduce the older WMT11
    tokenizer (v3) used for lm1b: month abbreviations are *not* non-breaking
    prefixes ("Feb . 26" as in lm1b), a sentence-initial/final apostrophe next to
    a letter is split off, and whitespace is normalised;
  * sentences without any letter (pure numbers/punctuation) are dropped.

Training sentences that also occur (exactly, after tokenization) in any
held-out set - Reuters valid/test, the Wikipedia slice or the ``--heldout`` files - are removed from
train. Exact duplicate sentences inside the running training text are kept
(repeated boilerplate is normal in news) but counted and reported.

All outputs are written to ``*.tmp`` files and renamed into place only when
everything succeeded; progress goes to stderr, the counts table to stdout.
"""

from __future__ import annotations

import argparse
import collections
import html
import os
import random
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

try:
    import regex

    from elmokit.base.tokenize import (  # noqa: F401  (re-exported for tests and callers)
        _SPACE_RE,
        normalize_punctuation,
        split_and_tokenize,
        split_sentences,
        tokenize_sentence,
    )
except ImportError as _err:  # pragma: no cover - depends on the environment
    sys.exit(f"prepare_lm_corpus: {_err}")

# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------

REUTERS_TRAIN = tuple(f"reut2-{i:03d}.sgm" for i in range(20))
REUTERS_VALID = "reut2-020.sgm"
REUTERS_TEST = "reut2-021.sgm"

_BODY_RE = re.compile(r"<BODY>(.*?)</BODY>", re.S)
# The story trailer: "Reuter" on its own line or after blanks at the end of the
# last line, with the variants found in the collection ("REUTER...", "REUTER^M",
# "REUTE", "REUITER", "REUTER 11:43/VB", "Reuter4"). "Reuters." with a single
# full stop ends a sentence ("... a bank official told\nReuters.") and is kept.
_TRAILER_RE = re.compile(
    r"(?:^|\n|[ \t])[ \t]*(?:reuters?|reute|reuiter|reueter)(?![a-z])(?!s?\.\s*$)[^\n]{0,20}$",
    re.I,
)
# Some paragraph breaks were lost in the wire copy: "...suppliers.     In 1986 the";
# blanks after a sentence end and before a capital are turned back into a break
# (before the table-row test, which would otherwise drop such lines).
_INLINE_PARA_RE = re.compile(r"""([.!?]["')]?)[ \t]{3,}(?=["(]?[A-Z])""")
# A final "MORE" means "story continues in the next item": not text.
_MORE_RE = re.compile(r"(?:\n[ \t]*(?:MORE|More|more)|[ \t]+MORE)[ \t]*$")
# C0 controls except \t \n, DEL, and C1 controls (the SGML has &#5; &#22; &#127; ...).
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_MOJIBAKE_RE = re.compile("\u00c2(?=[\u0080-\u009f\"'\\s]|$)")
_TABLE_LINE_RE = re.compile(r"\S[ \t]{3,}\S|\.{5,}|\.{4}.*\.{4}")
_COMPANY_RE = re.compile(r"<([^<>\n]{0,80})>")
_HAS_LETTER_RE = regex.compile(r"\p{L}")


def clean_chars(text: str) -> str:
    """Remove control characters and the few mojibake remnants; tabs become blanks."""
    text = text.replace("\t", " ").replace("\r", "")
    # U+0085 is cp1252's ellipsis (seen as "\u00c2\u0085" in rural.txt).
    text = _MOJIBAKE_RE.sub("", text).replace("\u0085", " ... ")
    return _CONTROL_RE.sub("", text)


def strip_reuters_trailer(body: str) -> str:
    """Remove the ``&#3;`` end mark and the "Reuter" sign-off at the end of a body."""
    body = body.replace("&#3;", "").rstrip()
    for _ in range(2):  # "REUTER" then "MORE", or the other way round
        new = _MORE_RE.sub("", _TRAILER_RE.sub("", body)).rstrip()
        if new == body:
            break
        body = new
    return body


def extract_reuters_bodies(path: str | os.PathLike) -> list[str]:
    """Return the cleaned ``<BODY>`` texts of one Reuters SGML file, in file order.

    The file is read as Latin-1. Each body has its trailer stripped, its SGML
    entities decoded and its control characters removed; the original hard-wrapped
    line structure is kept (see :func:`unwrap_paragraphs`).
    """
    with open(path, encoding="latin-1", newline="") as fh:
        data = fh.read()
    bodies = []
    for raw in _BODY_RE.findall(data):
        body = strip_reuters_trailer(raw.replace("\r\n", "\n"))
        # "^M" is a typed-out carriage return in a few stories
        body = clean_chars(html.unescape(body.replace("^M", "")))
        bodies.append(body)
    return bodies


def is_table_line(line: str) -> bool:
    """A table row: columns aligned with blanks (a run of >= 3 blanks between two
    non-blanks) or with dot leaders (a run of >= 5 dots, or two runs of 4)."""
    return bool(_TABLE_LINE_RE.search(line.strip()))


def unwrap_paragraphs(body: str) -> list[str]:
    """Undo Reuters' hard wrapping: return one string per paragraph.

    An indented line (or one after a blank line) starts a paragraph; table rows are
    dropped; a line ending in ``word-`` is joined to the next without a blank.
    """
    paras: list[list[str]] = []
    new_para = True
    for line in _INLINE_PARA_RE.sub("\\1\n    ", body).split("\n"):
        if not line.strip():
            new_para = True
            continue
        if is_table_line(line):
            new_para = True
            continue
        if new_para or line[:1] in (" ", "\t"):
            paras.append([])
        paras[-1].append(line.strip())
        new_para = False
    out = []
    for lines in paras:
        text = lines[0]
        for nxt in lines[1:]:
            if re.search(r"\w-$", text):
                text += nxt
            else:
                text += " " + nxt
        out.append(text)
    return out


def read_text_lines(path: str | os.PathLike) -> list[str]:
    """Read a text file line by line: UTF-8, falling back to Latin-1 per line.

    LF, CRLF and CR line endings are all accepted; line ends are not returned.
    """
    data = Path(path).read_bytes()
    data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    lines = []
    for raw in data.split(b"\n"):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            lines.append(raw.decode("latin-1"))
    if lines and lines[-1] == "":
        lines.pop()
    return lines


# --------------------------------------------------------------------------
# Normalisation, sentence splitting, tokenization
# --------------------------------------------------------------------------


def keep_sentence(tokenized: str) -> bool:
    """Drop empty sentences and those without any letter (pure number/punctuation rows)."""
    return bool(tokenized) and bool(_HAS_LETTER_RE.search(tokenized))


# --------------------------------------------------------------------------
# Corpus assembly
# --------------------------------------------------------------------------


@dataclass
class Stats:
    stories: int = 0
    duplicate_stories: int = 0
    dropped_table_lines: int = 0
    dropped_no_letter: int = 0


def _story_key(body: str) -> str:
    return _SPACE_RE.sub(" ", body).strip()


def reuters_story_sentences(body: str, stats: Stats | None = None) -> list[str]:
    """Tokenized sentences of one cleaned Reuters body (filters applied)."""
    if stats is not None:
        lines = _INLINE_PARA_RE.sub("\\1\n    ", body).split("\n")
        stats.dropped_table_lines += sum(1 for ln in lines if ln.strip() and is_table_line(ln))
    sents = []
    for para in unwrap_paragraphs(body):
        # <Texaco Inc> -> Texaco Inc; unpaired < > (typos such as "(SKFR ST>") go too
        para = _COMPANY_RE.sub(r" \1 ", para).replace("<", " ").replace(">", " ")
        for s in split_and_tokenize(para):
            if keep_sentence(s):
                sents.append(s)
            elif stats is not None:
                stats.dropped_no_letter += 1
    return sents


def reuters_documents(paths: Sequence[str | os.PathLike], stats: Stats, log=None) -> list[list[str]]:
    """Documents (lists of tokenized sentences) of a Reuters split; duplicate stories dropped."""
    seen: set[str] = set()
    docs = []
    for path in paths:
        t0 = time.time()
        bodies = extract_reuters_bodies(path)
        n_dup = 0
        for body in bodies:
            stats.stories += 1
            key = _story_key(body)
            if key in seen:
                stats.duplicate_stories += 1
                n_dup += 1
                continue
            seen.add(key)
            sents = reuters_story_sentences(body, stats)
            if sents:
                docs.append(sents)
        if log:
            log(
                f"  {Path(path).name}: {len(bodies)} bodies, {n_dup} duplicate stories, "
                f"{time.time() - t0:.1f}s"
            )
    return docs


def kept_sentences(paragraphs: Iterable[str], stats: Stats) -> list[str]:
    """The tokenized sentences of ``paragraphs`` that pass :func:`keep_sentence` (others counted)."""
    sents = []
    for para in paragraphs:
        for s in split_and_tokenize(para):
            if keep_sentence(s):
                sents.append(s)
            else:
                stats.dropped_no_letter += 1
    return sents


def abc_documents(paths: Sequence[str | os.PathLike], stats: Stats, log=None) -> list[list[str]]:
    """Documents of the ABC files: one per non-blank line."""
    docs = []
    for path in paths:
        t0 = time.time()
        n = 0
        for line in read_text_lines(path):
            line = clean_chars(html.unescape(line))
            if not line.strip():
                continue
            n += 1
            sents = kept_sentences([line], stats)
            if sents:
                docs.append(sents)
        if log:
            log(f"  {Path(path).name}: {n} lines, {time.time() - t0:.1f}s")
    return docs


_WIKI_MARKUP_RE = re.compile(r"^[!|{]|colspan=|rowspan=|style=")
_SENTENCE_END_RE = re.compile(r"""[.!?]["')\]]*$""")
_HEADING_RE = re.compile(r"^[^.!?;,:]+\.$")


def is_wikipedia_prose(line: str) -> bool:
    """A Wikipedia paragraph worth training on: not a heading, table remnant or list item."""
    line = line.strip()
    if not line or _WIKI_MARKUP_RE.search(line) or not _SENTENCE_END_RE.search(line):
        return False
    return not (len(line.split()) <= 6 and _HEADING_RE.match(line))


def wikipedia_paragraphs(path: str | os.PathLike) -> list[list[str]]:
    """The prose paragraphs of each article of one wikiextractor file (titles and headings dropped)."""
    articles: list[list[str]] = []
    title_pending = False
    for line in read_text_lines(path):
        if line.startswith("<doc "):
            articles.append([])
            title_pending = True
        elif line.startswith("</doc>"):
            title_pending = False
        elif line.strip() and articles:
            if title_pending:  # the first non-blank line repeats the title
                title_pending = False
            elif is_wikipedia_prose(line):
                articles[-1].append(clean_chars(line))
    return [a for a in articles if a]


def wikipedia_documents(paths: Sequence[str | os.PathLike], stats: Stats, log=None) -> list[list[str]]:
    """Documents (one per article) of tokenized sentences from wikiextractor files."""
    docs = []
    for path in paths:
        t0 = time.time()
        articles = wikipedia_paragraphs(path)
        for paragraphs in articles:
            sents = kept_sentences(paragraphs, stats)
            if sents:
                docs.append(sents)
        if log:
            log(f"  {Path(path).name}: {len(articles)} articles with prose, {time.time() - t0:.1f}s")
    return docs


def read_heldout_sentences(paths: Iterable[str | os.PathLike]) -> list[str]:
    """Already tokenized held-out sentences (one per line), whitespace-normalised."""
    out = []
    for path in paths:
        for line in read_text_lines(path):
            line = " ".join(line.split())
            if line:
                out.append(line)
    return out


def remove_heldout_overlap(docs: list[list[str]], heldout: set[str]) -> tuple[list[list[str]], int]:
    """Drop every training sentence that occurs in ``heldout``. Returns (docs, n_removed)."""
    removed = 0
    out = []
    for doc in docs:
        kept = [s for s in doc if s not in heldout]
        removed += len(doc) - len(kept)
        if kept:
            out.append(kept)
    return out, removed


def shard(sentences: Sequence[str], n: int) -> list[list[str]]:
    """Split a sequence into ``n`` contiguous, nearly equal parts (order kept)."""
    total = len(sentences)
    bounds = [round(i * total / n) for i in range(n + 1)]
    return [list(sentences[bounds[i] : bounds[i + 1]]) for i in range(n)]


def count(sentences: Iterable[str]) -> tuple[int, int, set[str]]:
    """(sentences, tokens, vocabulary) of a list of tokenized sentences."""
    n_sent = n_tok = 0
    vocab: set[str] = set()
    for s in sentences:
        toks = s.split()
        n_sent += 1
        n_tok += len(toks)
        vocab.update(toks)
    return n_sent, n_tok, vocab


def repeat_report(sentences: Sequence[str], top: int = 5) -> tuple[int, int, list[tuple[str, int]]]:
    """(distinct sentences seen more than once, extra occurrences, most common)."""
    c = collections.Counter(sentences)
    rep = [(s, k) for s, k in c.items() if k > 1]
    extra = sum(k - 1 for _, k in rep)
    rep.sort(key=lambda x: (-x[1], x[0]))
    return len(rep), extra, rep[:top]


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fail(msg: str) -> None:
    raise SystemExit(f"prepare_lm_corpus: error: {msg}")


def _heldout_files(args_heldout: Sequence[str]) -> list[Path]:
    files: list[Path] = []
    for item in args_heldout:
        p = Path(item)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
            if not found:
                _fail(f"--heldout directory has no files: {p}")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            _fail(f"--heldout path not found: {p}")
    return files


def _write_atomic_all(outputs: dict[Path, list[str]]) -> None:
    """Write every file to ``<name>.tmp`` first, then rename all of them into place."""
    tmps: list[tuple[Path, Path]] = []
    try:
        for path, lines in outputs.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
                for line in lines:
                    fh.write(line)
                    fh.write("\n")
            tmps.append((tmp, path))
    except BaseException:
        for tmp, _ in tmps:
            tmp.unlink(missing_ok=True)
        for path in outputs:
            path.with_name(path.name + ".tmp").unlink(missing_ok=True)
        raise
    for tmp, path in tmps:
        os.replace(tmp, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Turn raw Reuters-21578 SGML and ABC news text into the ELMo LM format "
        "(one 1B-Word-style tokenized sentence per line).",
    )
    p.add_argument(
        "--reuters",
        required=True,
        metavar="DIR",
        help="directory with reut2-000.sgm ... reut2-021.sgm",
    )
    p.add_argument(
        "--abc",
        metavar="DIR",
        help="directory with the NLTK abc corpus (rural.txt, science.txt); training only",
    )
    p.add_argument(
        "--wikipedia",
        metavar="DIR",
        help="directory of wikiextractor output files (wiki_00, wiki_01, ...): English Wikipedia, "
        "CC BY-SA; the last --wikipedia-heldout files become heldout/wikipedia-test.txt",
    )
    p.add_argument(
        "--wikipedia-heldout",
        type=int,
        default=1,
        metavar="N",
        help="number of Wikipedia files (the last in name order) held out for testing (default 1)",
    )
    p.add_argument(
        "--heldout",
        nargs="+",
        default=[],
        metavar="DIR",
        help="tokenized held-out files or directories of them (e.g. the lm1b held-out "
        "shards); training sentences found there are removed",
    )
    p.add_argument("--out", required=True, metavar="OUT_DIR", help="output directory")
    p.add_argument("--shards", type=int, default=1, metavar="N", help="number of training shards (default 1)")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="S",
        help="if given, shuffle the order of training documents (stories / ABC lines) with "
        "this seed before sharding; sentence order inside a document is always kept. "
        "Default: keep the input order",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    t_start = time.time()
    if args.shards < 1:
        _fail(f"--shards must be >= 1, got {args.shards}")

    reuters_dir = Path(args.reuters)
    if not reuters_dir.is_dir():
        _fail(f"--reuters directory not found: {reuters_dir}")
    needed = list(REUTERS_TRAIN) + [REUTERS_VALID, REUTERS_TEST]
    missing = [n for n in needed if not (reuters_dir / n).is_file()]
    if missing:
        _fail(f"--reuters {reuters_dir} lacks {len(missing)} file(s): {', '.join(missing)}")
    abc_files: list[Path] = []
    if args.abc is not None:
        abc_dir = Path(args.abc)
        if not abc_dir.is_dir():
            _fail(f"--abc directory not found: {abc_dir}")
        abc_files = [abc_dir / n for n in ("rural.txt", "science.txt") if (abc_dir / n).is_file()]
        if not abc_files:
            _fail(f"--abc {abc_dir} has neither rural.txt nor science.txt")
    if args.wikipedia_heldout < 1:
        _fail(f"--wikipedia-heldout must be >= 1, got {args.wikipedia_heldout}")
    wiki_files: list[Path] = []
    if args.wikipedia is not None:
        wiki_dir = Path(args.wikipedia)
        if not wiki_dir.is_dir():
            _fail(f"--wikipedia directory not found: {wiki_dir}")
        wiki_files = sorted(f for f in wiki_dir.iterdir() if f.is_file() and f.name.startswith("wiki_"))
        if len(wiki_files) <= args.wikipedia_heldout:
            _fail(f"--wikipedia {wiki_dir} has {len(wiki_files)} wiki_* file(s); more than "
                  f"--wikipedia-heldout {args.wikipedia_heldout} are needed")
    heldout_files = _heldout_files(args.heldout)
    out_dir = Path(args.out)

    stats = Stats()
    _log("Reuters train (reut2-000..019):")
    train_docs = reuters_documents([reuters_dir / n for n in REUTERS_TRAIN], stats, _log)
    n_reuters_train_docs = len(train_docs)
    _log("Reuters valid:")
    valid_docs = reuters_documents([reuters_dir / REUTERS_VALID], stats, _log)
    _log("Reuters test:")
    test_docs = reuters_documents([reuters_dir / REUTERS_TEST], stats, _log)
    if abc_files:
        _log("ABC:")
        train_docs += abc_documents(abc_files, stats, _log)
    wiki_test: list[str] = []
    if wiki_files:
        n_held = args.wikipedia_heldout
        _log("Wikipedia train:")
        train_docs += wikipedia_documents(wiki_files[:-n_held], stats, _log)
        _log("Wikipedia held out:")
        wiki_test = [s for d in wikipedia_documents(wiki_files[-n_held:], stats, _log) for s in d]

    valid = [s for d in valid_docs for s in d]
    test = [s for d in test_docs for s in d]
    _log(f"held-out files: {len(heldout_files)}")
    external = read_heldout_sentences(heldout_files)
    reuters_heldout = set(valid) | set(test) | set(wiki_test)
    external_set = set(external)

    n_before = sum(len(d) for d in train_docs)
    train_docs, removed_reuters = remove_heldout_overlap(train_docs, reuters_heldout)
    train_docs, removed_external = remove_heldout_overlap(train_docs, external_set)

    if args.seed is not None:
        random.Random(args.seed).shuffle(train_docs)
    train = [s for d in train_docs for s in d]
    shards = shard(train, args.shards)
    width = max(5, len(str(args.shards)))
    outputs: dict[Path, list[str]] = {}
    for i, part in enumerate(shards):
        outputs[out_dir / "train" / f"train-{i:0{width}d}-of-{args.shards:0{width}d}.txt"] = part
    outputs[out_dir / "heldout" / "reuters-valid.txt"] = valid
    outputs[out_dir / "heldout" / "reuters-test.txt"] = test
    if wiki_files:
        outputs[out_dir / "heldout" / "wikipedia-test.txt"] = wiki_test

    _log(f"writing {len(outputs)} files to {out_dir}")
    _write_atomic_all(outputs)
    # Remove train shards of an earlier run with a different shard count.
    keep = {p.name for p in outputs}
    for old in sorted((out_dir / "train").glob("train-*-of-*.txt")):
        if old.name not in keep:
            _log(f"removing stale shard {old}")
            old.unlink()

    # ---- report (stdout) ----
    rows = []
    vocab_train: set[str] = set()
    vocab_all: set[str] = set()
    tot = [0, 0]
    tr = [0, 0]
    for path, lines in outputs.items():
        n_s, n_t, v = count(lines)
        rows.append((str(path.relative_to(out_dir)), n_s, n_t, len(v)))
        vocab_all |= v
        tot[0] += n_s
        tot[1] += n_t
        if path.parent.name == "train":
            vocab_train |= v
            tr[0] += n_s
            tr[1] += n_t
    rows.append(("train (all shards)", tr[0], tr[1], len(vocab_train)))
    rows.append(("total (all files)", tot[0], tot[1], len(vocab_all)))
    w = max(len(r[0]) for r in rows)
    print(f"{'file':<{w}}  {'sentences':>10}  {'tokens':>11}  {'vocab':>8}")
    for name, n_s, n_t, n_v in rows:
        print(f"{name:<{w}}  {n_s:>10,}  {n_t:>11,}  {n_v:>8,}")

    n_rep, extra, top = repeat_report(train)
    print()
    print(
        f"Reuters stories read: {stats.stories:,} (bodies); exact duplicate stories dropped: "
        f"{stats.duplicate_stories:,}; Reuters training stories kept: {n_reuters_train_docs:,}"
    )
    print(
        f"table lines dropped: {stats.dropped_table_lines:,}; sentences without letters dropped: "
        f"{stats.dropped_no_letter:,}"
    )
    print(
        f"training sentences before held-out filtering: {n_before:,}; removed as also in Reuters "
        f"valid/test{' or the Wikipedia slice' if wiki_files else ''}: {removed_reuters:,}; "
        f"removed as also in --heldout files "
        f"({len(external):,} sentences, {len(heldout_files)} files): {removed_external:,}"
    )
    pct = 100.0 * extra / len(train) if train else 0.0
    print(
        f"repeated training sentences (kept): {n_rep:,} distinct sentences occur more than once, "
        f"{extra:,} extra occurrences ({pct:.2f}% of training sentences)"
    )
    for s, k in top:
        print(f"  {k:>5}x  {s[:100]}")
    print(f"elapsed: {time.time() - t_start:.1f}s")
    _log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
