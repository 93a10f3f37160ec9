"""Reading text files: the one rule for what a line is, for every reader of the package.

A line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (Python's universal newlines, which is also
what ``allennlp elmo`` reads, so line i of an input is dataset "i" of both tools' output). Files
are UTF-8; a byte-order mark at the start is dropped; bytes that are not UTF-8 are an error that
names the file and the line. ``-`` reads standard input.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

__all__: list[str] = []

# what surrogateescape turns undecodable bytes into
_ESCAPED = re.compile("[\udc80-\udcff]")


def read_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of a UTF-8 text file (or stdin for ``-``) without their line ends."""
    stdin = str(path) == "-"
    raw: BinaryIO = standard_input() if stdin else open(path, "rb")  # noqa: SIM115
    text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline=None)
    try:
        for number, line in enumerate(text, start=1):
            line = line.rstrip("\n")  # universal newlines: every line end reads as "\n"
            if not line.isascii() and _ESCAPED.search(line):
                try:
                    line.encode("utf-8", "surrogateescape").decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ValueError(f"{path}: line {number} is not valid UTF-8 ({err.reason})") from None
            yield line
    finally:
        if stdin:
            text.detach()  # leave sys.stdin open
        else:
            text.close()


def standard_input() -> BinaryIO:
    """The bytes of standard input; a closed one (``<&-``) is a ValueError saying so."""
    if sys.stdin is None or sys.stdin.closed:
        raise ValueError("standard input is closed: there is nothing to read from '-'; give a file")
    return sys.stdin.buffer


def check_input(path: str | os.PathLike) -> bool:
    """Raise the one-line error of an input that cannot be read (missing, a folder, a closed
    standard input for ``-``), before any work; True for a regular file, False for stdin or a
    pipe (e.g. ``<(command)``, which can be read only once)."""
    if str(path) == "-":
        standard_input()
        return False
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input file not found: {path}")
    if path.is_dir():
        raise IsADirectoryError(f"input is a folder, not a file: {path}")
    return path.is_file()


def count_lines(path: str | os.PathLike) -> int | None:
    """The number of lines ``read_lines`` gives, counted on the bytes; None for stdin or a pipe
    (which can be read only once). A missing input or a folder is an error naming it."""
    if not check_input(path):  # stdin or a pipe
        return None
    path = Path(path)
    count, last = 0, b""
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                count += block.count(b"\n") + block.count(b"\r") - block.count(b"\r\n")
                if last == b"\r" and block[:1] == b"\n":  # a "\r\n" split between two blocks
                    count -= 1
                last = block[-1:]
    except OSError as err:  # e.g. /proc/self/mem: named, with the cause
        named = type(err)(f"cannot read the input file {path}: {err.strerror or err}")
        named.errno = err.errno
        raise named from None
    return count + (last not in (b"", b"\n", b"\r"))


# a word with punctuation glued after it ("world,") or an opening bracket or quote before it
# ('"Hello'): what whitespace-tokenized text does not hold, and raw text does
_GLUED = re.compile(r"^\w+[,;:!?)\"]+$|^[(\"]\w")
# a sentence's last word with its period ("mat."); not an abbreviation such as "Dr." or "U.S.",
# which tokenized text keeps whole
_FINAL_GLUED = re.compile(r"^[^\W\d_A-Z][^\W\d_]+[.!?]+[\")]*$")
CHECKED_LINES = 1000  # the lines (or requests' texts) a splitter looks at for raw text


class _WhitespaceSplitter:
    """``str.split``, which also looks at the first ``CHECKED_LINES`` texts for punctuation
    glued to a word and logs one warning on the first text that has it (the tokens are never
    changed)."""

    def __init__(self) -> None:
        self.left = CHECKED_LINES

    def __call__(self, text: str) -> list[str]:
        tokens = text.split()
        if self.left > 0 and tokens:
            self.left -= 1
            glued = next((t for t in tokens if _GLUED.match(t)), None)
            if glued is None and _FINAL_GLUED.match(tokens[-1]):
                glued = tokens[-1]
            if glued is not None:
                self.left = 0
                logging.getLogger(__name__).warning(
                    "the input looks like raw, untokenized text (%r has punctuation glued to it), but "
                    "it is split on whitespace only, so such words are tokens the model rarely saw; "
                    "give --tokenize (tokenize=True) to tokenize it as the training corpus was",
                    glued,
                )
        return tokens


def line_splitter(tokenize: bool, warn: bool = True) -> Callable[[str], list[str]]:
    """How a line of input becomes tokens: a split on whitespace, or with ``tokenize`` the
    tokenizer of the training corpus (``elmokit.base.tokenize``, the ``corpus`` extra: imported only
    then, so that whitespace input needs no extra). With ``warn``, the whitespace split warns
    once (logging) when its first texts look untokenized, e.g. "Hello, world."; the processes
    of a shared job but the first pass ``warn=False``, so that the warning is given once."""
    if not tokenize:
        return _WhitespaceSplitter() if warn else str.split
    from .tokenize import tokenize_line

    return tokenize_line
