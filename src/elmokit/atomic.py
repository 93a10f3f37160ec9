"""Atomic file writes: the one way elmokit writes a file that someone may read.

A file is written under a temporary name made exclusively in the target folder (never through a
planted link), given the permissions the umask allows, and renamed to its final name only when it
is complete; on any error, or when the writer is interrupted, the temporary file is removed. So
a reader never sees a partial file under the final name.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``path``; when the block ends without an error, the
    file written there becomes ``path``.

    ``overwrite=False`` never replaces a file that appeared at ``path`` meanwhile: it raises
    FileExistsError instead (the final step links the new file in, which fails if the name is
    taken). The temporary file is created empty with O_EXCL, so the writer may reopen it by name
    (h5py, torch.save) or write it through the yielded path.
    """
    target = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        if overwrite:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)
            except FileExistsError:
                raise FileExistsError(
                    f"{target} appeared while it was being written; the new result was not saved "
                    "over it (pass overwrite to replace it)"
                ) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: str | os.PathLike, data: bytes, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path, overwrite) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str, overwrite: bool = True) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    write_bytes(path, text.encode("utf-8"), overwrite)


def write_json(path: str | os.PathLike, value: Any, overwrite: bool = True) -> None:
    """Write ``value`` as indented JSON (UTF-8, newline at the end) to ``path`` atomically."""
    write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n", overwrite)
