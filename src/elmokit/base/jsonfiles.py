"""Reading JSON files: the one reader of the package, whose every problem is one line naming
the file and the cause.

A JSON file is UTF-8 (a byte-order mark at the start is dropped). A file from anywhere (a
model's options.json, an ELMoForManyLangs config) is read with ``limits``, the ceilings of
``elmokit.base.bounds.read_json``: checked before it is parsed, so that a huge, binary or deeply
nested file is refused in one line instead of filling memory or the stack.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__: list[str] = []

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


@dataclass(frozen=True)
class JsonLimits:
    """The ceilings of a JSON file from anywhere: its size in bytes, how deep its arrays and
    objects nest, and the digits of its longest integer."""

    size: int
    depth: int
    digits: int


class _TooLong(Exception):
    def __init__(self, digits: int) -> None:
        self.digits = digits


def _int_parser(digits: int) -> Any:
    """``json.loads``' ``parse_int``: ``int``, refusing integers of more than ``digits`` digits."""

    def parse_int(text: str) -> int:
        found = len(text.lstrip("-"))
        if found > digits:
            raise _TooLong(found)
        return int(text)

    return parse_int


def _depth(text: str) -> int:
    """How deep arrays and objects nest in JSON ``text`` (brackets inside strings not counted)."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_STRING.sub('""', text)):
        depth += 1 if match.group() in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def read_json(
    path: str | os.PathLike,
    error: type[ValueError] = ValueError,
    what: str = "JSON file",
    limits: JsonLimits | None = None,
) -> Any:
    """The value of the JSON file ``path``. A missing file is a FileNotFoundError (``what``
    names it); bytes that are not UTF-8 or text that is not JSON are one ``error`` naming the
    file and the cause. With ``limits`` the file is checked before it is parsed: at most
    ``limits.size`` bytes, not an HDF5, UTF-16 or binary file, nested at most ``limits.depth``
    deep, no integer longer than ``limits.digits`` digits."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    with open(path, "rb") as f:
        data = f.read() if limits is None else f.read(limits.size + 1)
    if limits is not None:
        if len(data) > limits.size:
            raise error(f"{path}: larger than {limits.size:,} bytes; model settings in JSON are far smaller")
        if data.startswith(_HDF5_SIGNATURE):
            raise error(f"{path}: an HDF5 file (a weight file?), not JSON")
        if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data:
            raise error(f"{path}: UTF-16 or binary, not JSON in UTF-8")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise error(
            f"{path}: not UTF-8 (byte {err.start} is {data[err.start]:#04x}: Latin-1 or another "
            "encoding?); JSON files must be UTF-8"
        ) from None
    if limits is not None and _depth(text) > limits.depth:
        raise error(f"{path}: JSON nested more than {limits.depth} deep; model settings nest a few levels")
    try:
        return json.loads(text, parse_int=None if limits is None else _int_parser(limits.digits))
    except _TooLong as err:
        raise error(f"{path}: holds an integer of {err.digits:,} digits; no field takes one") from None
    except (json.JSONDecodeError, RecursionError) as err:
        raise error(f"{path}: not valid JSON ({err})") from None
