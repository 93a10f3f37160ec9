"""Hex digests of files (SHA-256 by default), read in blocks: the one reader of a file's digest
for downloads, checkpoint manifests and cache keys."""

from __future__ import annotations

import hashlib
import os

__all__: list[str] = []

BLOCK = 1 << 20


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """The hex digest of a file's bytes, read ``BLOCK`` bytes at a time."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()
