"""The download cache's entries: one folder per URL under ``elmokit.hub.cache.cache_dir()``, what
it holds and the errors of a download.

Each URL has its own folder ``downloads/<sha256(url)[:16]>-<file name>`` (one per S3 object: its
addresses share one key, see ``cache_key``) holding

- the file, under its final name only once it is complete and verified;
- ``.NAME.part`` (+ ``.NAME.part.json``) while it downloads (``elmokit.hub.http_client``
  resumes them);
- ``meta.json``: url, size, sha256 (and md5), date, and the sha256 of the first download, so a
  later use notices a cached file that changed and a forced download notices a changed publisher
  file;
- ``unpacked/``: an archive's members (elmokit.hub.resolve), removed when the archive is downloaded
  again;
- ``.lock``: two processes fetching the same URL take turns (the second finds the file done).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..base.atomic import write_json
from ..base.digests import file_digest
from ..base.jsonfiles import read_json
from .cache import cache_dir
from .file_kinds import Expected, url_kind, wrong_kind

__all__ = ["DownloadError"]

logger = logging.getLogger(__name__)

URL_SCHEMES = ("http://", "https://", "s3://")
META = "meta.json"


class DownloadError(OSError):
    """A download failed; the message (one line) names the URL and the cause."""


class OfflineError(DownloadError):
    """ELMOKIT_OFFLINE=1 and the URL is not in the cache."""


class ChecksumError(DownloadError):
    """The file's size or checksum is not the publisher's (or no longer the cached one's)."""


def is_url(text: str | os.PathLike) -> bool:
    """Whether ``text`` is an http(s) or s3 URL (as AllenNLP and flair pass published files)."""
    return isinstance(text, str) and text.lower().startswith(URL_SCHEMES)


def normalize_url(url: str) -> str:
    """``s3://BUCKET/KEY`` as the public HTTPS address of the object; other URLs unchanged. A URL
    that cannot be parsed (``http://[::1/x.zip``, a port that is not a number, no host) is a
    ValueError that names it."""
    if url.lower().startswith("s3://"):
        bucket, _, key = url[5:].partition("/")
        if not bucket or not key:
            raise ValueError(f"not an s3 object URL (s3://BUCKET/KEY): {url}")
        url = f"https://{bucket}.s3.amazonaws.com/{key}"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as err:
        raise ValueError(f"not a valid URL: {url} ({err})") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a valid URL: {url} (an http or https URL with a host is needed)")
    if any(ord(c) <= 32 or ord(c) == 127 for c in url):
        raise ValueError(f"not a valid URL: {url!r} (it holds spaces or control characters)")
    return url


_S3_PATH_STYLE = re.compile(r"^https?://s3(?:[.-][a-z0-9-]+)?\.amazonaws\.com/([^/?#]+)/([^?#]+)$", re.I)
_S3_HOST_STYLE = re.compile(r"^https?://([^./]+)\.s3(?:[.-][a-z0-9-]+)?\.amazonaws\.com/([^?#]+)$", re.I)


def cache_key(url: str) -> str:
    """What identifies ``url``'s file in the cache: the URL, except that the addresses of one S3
    object (``s3://B/K``, ``https://B.s3.amazonaws.com/K``, ``https://s3-REGION.amazonaws.com/B/K``,
    as AllenNLP 0.9 and its website write them) are one key, ``s3://B/K``."""
    if url.lower().startswith("s3://"):
        return "s3://" + url[5:]
    match = _S3_PATH_STYLE.match(url) or _S3_HOST_STYLE.match(url)
    return f"s3://{match.group(1)}/{match.group(2)}" if match else url


def file_name(url: str) -> str:
    """A safe local name for the file at ``url`` (its last path part, else "download")."""
    name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")[:80]
    return name or "download"


def entry_dir(url: str) -> Path:
    """The cache folder of ``url``: one per URL (one per S3 object, see ``cache_key``)."""
    key = cache_key(url)
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    return cache_dir() / "downloads" / f"{digest}-{file_name(key)}"


def read_meta(url: str) -> dict[str, Any] | None:
    """The cache entry's record of ``url`` (None if there is no complete download, or if the
    record is not one elmokit wrote: another URL's, or a ``file`` that is not a plain name in
    the entry, such as ``../../secret.zip``)."""
    try:
        meta = read_json(entry_dir(url) / META)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or cache_key(str(meta.get("url"))) != cache_key(url):
        return None
    name = meta.get("file")
    if not isinstance(name, str) or name != file_name(name) or name.startswith("."):
        logger.warning("ignoring %s: its file %r is not a name in its folder", entry_dir(url) / META, name)
        return None
    if not isinstance(meta.get("size"), int):
        return None
    return meta


def is_cached(url: str) -> bool:
    """Whether ``url`` has a complete download in the cache (a quick look: nothing is hashed)."""
    meta = read_meta(url)
    return meta is not None and (entry_dir(url) / str(meta.get("file"))).is_file()


def again_hint(url: str, name: str | None = None) -> str:
    """What to run to replace the cached file of ``url`` (``name``: the known model's name)."""
    return f"run `elmokit download --force {name or url}` to download it again"


def cached_file(url: str, expected: Expected | None = None, name: str | None = None) -> Path | None:
    """The cached file of ``url``, or None if it has none. The file is checked against what was
    recorded when it was downloaded (size; sha256 again when its time stamp changed), against
    ``expected`` and to be of its kind; a file that changed or is damaged raises ChecksumError
    saying how to fetch it again (``name``: the known model's name, for that advice)."""
    url = normalize_url(url)
    meta = read_meta(url)
    if meta is None:
        return None
    entry = entry_dir(url)
    path = entry / str(meta["file"])
    if not path.is_file():
        return None
    stat = path.stat()
    again = f"; {again_hint(url, name)}"
    if stat.st_size != meta.get("size"):
        raise ChecksumError(
            f"cached file {path} changed since it was downloaded from {url} "
            f"({stat.st_size:,} bytes, {meta.get('size'):,} when downloaded){again}"
        )
    if stat.st_mtime_ns != meta.get("mtime_ns"):
        digest = file_digest(path)
        if digest != meta.get("sha256"):
            raise ChecksumError(
                f"cached file {path} changed since it was downloaded from {url} "
                f"(sha256 {digest}, {meta.get('sha256')} when downloaded){again}"
            )
        write_json(entry / META, {**meta, "mtime_ns": stat.st_mtime_ns})
    if expected is not None:
        for key in ("size", "sha256", "md5"):
            want = getattr(expected, key)
            if want is not None and meta.get(key) is not None and meta[key] != want:
                raise ChecksumError(
                    f"cached file {path} does not match the publisher's {key} ({meta[key]} != {want}){again}"
                )
    problem = wrong_kind(path, (expected.kind if expected else None) or url_kind(url))
    if problem is not None:  # e.g. cached by an elmokit that did not check it
        raise ChecksumError(f"cached file {path} of {url} is {problem}{again}")
    return path


@contextmanager
def entry_lock(entry: Path, url: str, progress: bool) -> Iterator[None]:
    """The entry's ``.lock`` held: two processes fetching one URL take turns (``progress``: say
    on stderr when this one waits for another)."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(entry / ".lock"))
    try:
        lock.acquire(timeout=0.5)
    except Timeout:
        if progress:
            logger.warning("waiting for another process that downloads %s", url)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def record(url: str, entry: Path, final: Path, size: int, digests: dict) -> None:
    """Write the entry's ``meta.json`` for the complete download ``final`` (``size`` bytes, its
    sha256 and md5); a file whose sha256 differs from the first download's is a warning."""
    old = read_meta(url) or {}
    first = old.get("first_sha256") or digests["sha256"]
    if first != digests["sha256"]:
        import warnings

        warnings.warn(
            f"{url} changed since its first download (sha256 {first}, now {digests['sha256']}); "
            "the new file is cached",
            stacklevel=4,
        )
    write_json(
        entry / META,
        {
            "url": url,
            "file": final.name,
            "size": size,
            "sha256": digests["sha256"],
            "md5": digests["md5"],
            "first_sha256": first,
            "downloaded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "mtime_ns": final.stat().st_mtime_ns,
        },
    )
