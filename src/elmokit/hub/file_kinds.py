"""What kind of file a download is: a downloaded file must be the kind it should be before it
gets its final name in the cache, so that a captive portal's HTML page or an error page served
with status 200 is never cached as a model file.

The kind comes from the registry, else from the URL's name (``url_kind``): a ``.zip`` must be a
readable zip archive, an ``.hdf5``/``.h5`` an HDF5 file that is not cut short, a ``.json`` JSON
that parses, any other name one of the three ("model"); the data sets of ``elmokit.hub.datasets``
are "gzip" (a whole gzip file, bounded in how much it expands) or "text" (UTF-8, not an HTML
page). ``wrong_kind`` says in a few words why a file is not of its kind; ``sniff`` says which
of zip, HDF5 and JSON a file is.
"""

from __future__ import annotations

import codecs
import urllib.parse
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..base.jsonfiles import read_json

__all__: list[str] = []

MAX_GZIP_RATIO = 1000  # a gzip file or gzip-encoded body may expand this much (more is a gzip bomb)
CHUNK = 1 << 20
# What a downloaded file must look like before it gets its final name (a captive portal or an
# error page served with status 200 is never cached as a model file).
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06")


@dataclass(frozen=True)
class Expected:
    """What the publisher says of a file (any may be unknown), and what kind of file it is:
    ``kind`` "zip", "tar", "json", "hdf5", "model" (zip, JSON or HDF5), "gzip", "text" (UTF-8, not an
    HTML page; the data sets of ``elmokit.hub.datasets``) or None (from the URL's name, see
    ``url_kind``)."""

    size: int | None = None
    sha256: str | None = None
    md5: str | None = None
    kind: str | None = None


_KIND_BY_SUFFIX = {".zip": "zip", ".json": "json", ".hdf5": "hdf5", ".h5": "hdf5"} | dict.fromkeys(
    (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz"), "tar"
)
_KIND_NAMES = {
    "zip": "a zip archive",
    "tar": "a tar archive",
    "json": "a JSON file",
    "hdf5": "an HDF5 file",
    "model": "a zip archive, HDF5 file or JSON file",
    "gzip": "a gzip file",
    "text": "a UTF-8 text file",
}


def url_kind(url: str) -> str:
    """The kind of file ``url`` should hold, from its name: "zip", "tar" (.tar, .tar.gz, .tgz,
    .tar.bz2, .tar.xz), "json" or "hdf5"; "model" (a zip, HDF5 or JSON file) for another name or
    none (``http://host/model``)."""
    name = urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1].lower()
    return next((kind for suffix, kind in _KIND_BY_SUFFIX.items() if name.endswith(suffix)), "model")


def wrong_kind(path: Path, kind: str | None) -> str | None:
    """Why ``path`` is not a file of ``kind`` ("zip", "tar", "hdf5", "json", "model": a zip, HDF5
    or JSON file; None: not checked), as "not ..." (None if it is)."""
    if kind is None:
        return None
    if kind == "model":
        if sniff(path) is None:
            return f"not {_KIND_NAMES['model']} ({_begins(path)})"
        return None
    if kind == "zip":
        return _zip_problem(path)
    if kind == "tar":
        return _tar_problem(path)
    if kind == "hdf5":
        return _hdf5_problem(path)
    if kind == "json":
        size = path.stat().st_size
        if size > 1 << 24:
            return f"not a JSON options file ({size:,} bytes)"
        try:
            read_json(path)
        except ValueError:
            return f"not a JSON file ({_begins(path)})"
        return None
    if kind == "gzip":
        return _gzip_problem(path)
    if kind == "text":
        return _text_problem(path)
    raise ValueError(f"unknown kind of file {kind!r}")


def _begins(path: Path) -> str:
    with open(path, "rb") as f:
        head = f.read(16)
    return f"it begins {head!r}" if head else "it is empty"


def _zip_problem(path: Path) -> str | None:
    """Why ``path`` is not a readable zip archive (signature, central directory), or None."""
    with open(path, "rb") as f:
        head = f.read(4)
    if not head.startswith(_ZIP_SIGNATURES):
        return f"not a zip archive ({_begins(path)})"
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as err:
        return f"not a readable zip archive (cut short or damaged: {err})"
    end = max((m.header_offset for m in members), default=0)
    if end > path.stat().st_size:
        return "not a readable zip archive (its members lie beyond its end: cut short)"
    return None


def _gzip_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole gzip file (signature, streams that end, at most
    MAX_GZIP_RATIO times its size once decompressed), or None."""
    import gzip

    with open(path, "rb") as f:
        if f.read(2) != b"\x1f\x8b":
            return f"not a gzip file ({_begins(path)})"
    limit, out = MAX_GZIP_RATIO * path.stat().st_size + CHUNK, 0
    try:
        with gzip.open(path, "rb") as stream:
            for chunk in iter(lambda: stream.read(CHUNK), b""):
                out += len(chunk)
                if out > limit:
                    return f"not a gzip file this elmokit reads (it expands more than {MAX_GZIP_RATIO}x)"
    except EOFError:
        return "not a whole gzip file (cut short)"
    except (OSError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        return f"not a whole gzip file (damaged: {err})"
    return None


def _tar_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole tar archive (every header and the compressed stream read to
    its end: a cut download is found here), or None; unsafe members are ``check_tar``'s."""
    import tarfile

    from .archives import TAR_ERRORS

    try:
        with tarfile.open(path, "r|*") as archive:
            for _ in archive:
                pass
    except TAR_ERRORS as err:
        return f"not a readable tar archive ({err or type(err).__name__})"
    return None


def _text_problem(path: Path) -> str | None:
    """Why ``path`` is not UTF-8 text (or is an HTML page), or None."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        head = f.read(512).lstrip().lower()
        if head.startswith((b"<!doctype html", b"<html")):
            return "an HTML page, not a data file"
        f.seek(0)
        at = 0
        try:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                decoder.decode(chunk)
                at += len(chunk)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as err:
            return f"not a UTF-8 text file (near byte {at + err.start:,})"
    return None


def _hdf5_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole HDF5 file: no signature at 0, 512, 1024, ... (after a user
    block), or shorter than the end-of-file address its superblock records (cut short); else None."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        offset = 0
        while offset + 8 <= size and offset <= 1 << 20:
            f.seek(offset)
            if f.read(8) == _HDF5_SIGNATURE:
                break
            offset = 512 if offset == 0 else offset * 2
        else:
            return f"not an HDF5 file ({_begins(path)})"
        f.seek(offset)
        block = f.read(96)
    version = block[8] if len(block) > 8 else -1
    if version in (0, 1):
        width, fields = (block[13] if len(block) > 13 else 0), 24 + (4 if version == 1 else 0)
        eof_field = 2  # base address, free-space address, end-of-file address
    elif version in (2, 3):
        width, fields = (block[9] if len(block) > 9 else 0), 12
        eof_field = 2  # base address, superblock extension address, end-of-file address
    else:
        return f"not an HDF5 file this elmokit reads (superblock version {version})"
    if width not in (2, 4, 8) or fields + width * (eof_field + 1) > len(block):
        return "not a whole HDF5 file (its superblock is cut short or damaged)"
    at = fields + width * eof_field
    eof = int.from_bytes(block[at : at + width], "little")  # the library counts a user block in it
    if eof > size:
        return f"not a whole HDF5 file ({size:,} bytes, but its superblock says {eof:,}: cut short)"
    return None


def sniff(path: Path) -> str | None:
    """The kind of ``path``: "zip", "hdf5" or "json" (None if it is none of them)."""
    for kind in ("zip", "hdf5", "json"):
        if wrong_kind(path, kind) is None:
            return kind
    return None
