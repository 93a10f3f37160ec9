"""Downloads into elmokit's cache: one entry per URL, atomic, resumable, verified, offline-aware.

The cache is ``$ELMOKIT_CACHE``, else the platform's user cache folder (``~/.cache/elmokit`` on
Linux, ``~/Library/Caches/elmokit`` on macOS, ``%LOCALAPPDATA%\\elmokit\\Cache`` on Windows).
Each URL has its own folder ``downloads/<sha256(url)[:16]>-<file name>`` holding

- the file, under its final name only once it is complete and verified;
- ``.NAME.part`` (+ ``.NAME.part.json``: the server's ETag/Last-Modified) while it downloads: a
  killed or cut download leaves only these, and the next attempt resumes them with an HTTP Range
  request (``If-Range`` makes a changed file restart) or restarts where the server has no ranges;
- ``meta.json``: url, size, sha256 (and md5), date, and the sha256 of the first download, so a
  later use notices a cached file that changed and a forced download notices a changed publisher
  file;
- ``unpacked/``: an archive's members (elmokit.sources), removed when the archive is downloaded
  again;
- ``.lock``: two processes fetching the same URL take turns (the second finds the file done).

Every failure is one line naming the URL and the cause: no network or unknown host, HTTP status,
a body cut short, a size or checksum other than the publisher's, a full disk. With
``ELMOKIT_OFFLINE=1`` nothing touches the network: a URL that is not cached is an error that
names it and says what to do.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .atomic import write_json

ENV_CACHE = "ELMOKIT_CACHE"
ENV_OFFLINE = "ELMOKIT_OFFLINE"
URL_SCHEMES = ("http://", "https://", "s3://")
TIMEOUT = 30.0  # seconds without an answer (connect or read) before a download is given up
CHUNK = 1 << 20
META = "meta.json"

# What a downloaded file must look like before it gets its final name (a captive portal or an
# error page served with status 200 is never cached as a model file).
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06")


class DownloadError(OSError):
    """A download failed; the message (one line) names the URL and the cause."""


class OfflineError(DownloadError):
    """ELMOKIT_OFFLINE=1 and the URL is not in the cache."""


class ChecksumError(DownloadError):
    """The file's size or checksum is not the publisher's (or no longer the cached one's)."""


@dataclass(frozen=True)
class Expected:
    """What the publisher says of a file (any may be unknown), and what kind of file it is:
    ``kind`` "zip", "json", "hdf5" or None (not checked)."""

    size: int | None = None
    sha256: str | None = None
    md5: str | None = None
    kind: str | None = None


def cache_dir() -> Path:
    """The cache folder: ``$ELMOKIT_CACHE``, else the platform's user cache folder for elmokit."""
    given = os.environ.get(ENV_CACHE, "").strip()
    if given:
        return Path(given).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("elmokit", appauthor=False))


def offline() -> bool:
    """Whether ``ELMOKIT_OFFLINE`` forbids the network (1, true, yes or on)."""
    return os.environ.get(ENV_OFFLINE, "").strip().lower() in ("1", "true", "yes", "on")


def is_url(text: str | os.PathLike) -> bool:
    """Whether ``text`` is an http(s) or s3 URL (as AllenNLP and flair pass published files)."""
    return isinstance(text, str) and text.lower().startswith(URL_SCHEMES)


def normalize_url(url: str) -> str:
    """``s3://BUCKET/KEY`` as the public HTTPS address of the object; other URLs unchanged."""
    if url.lower().startswith("s3://"):
        bucket, _, key = url[5:].partition("/")
        if not bucket or not key:
            raise ValueError(f"not an s3 object URL (s3://BUCKET/KEY): {url}")
        return f"https://{bucket}.s3.amazonaws.com/{key}"
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


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in chunks."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_meta(url: str) -> dict[str, Any] | None:
    """The cache entry's record of ``url`` (None if there is no complete download)."""
    try:
        meta = json.loads((entry_dir(url) / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or cache_key(str(meta.get("url"))) != cache_key(url):
        return None
    return meta


def is_cached(url: str) -> bool:
    """Whether ``url`` has a complete download in the cache (a quick look: nothing is hashed)."""
    meta = read_meta(url)
    return meta is not None and (entry_dir(url) / str(meta.get("file"))).is_file()


def cached_file(url: str, expected: Expected | None = None) -> Path | None:
    """The cached file of ``url``, or None if it has none. The file is checked against what was
    recorded when it was downloaded (size; sha256 again when its time stamp changed) and against
    ``expected``; a file that changed raises ChecksumError saying how to fetch it again."""
    url = normalize_url(url)
    meta = read_meta(url)
    if meta is None:
        return None
    entry = entry_dir(url)
    path = entry / str(meta["file"])
    if not path.is_file():
        return None
    stat = path.stat()
    again = f"; fetch it again with: elmokit download {url} --force"
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
    return path


def fetch(
    url: str,
    expected: Expected | None = None,
    *,
    force: bool = False,
    progress: bool | None = None,
    name: str | None = None,
) -> Path:
    """The local file of ``url``: from the cache, else downloaded into it (resumed if an earlier
    attempt was cut, verified against ``expected``). ``force`` downloads again even if cached.
    ``progress``: a progress bar on stderr (None: when stderr is a terminal). ``name``: the
    known model the file belongs to (for messages). Raises DownloadError (OfflineError,
    ChecksumError) with a one-line message."""
    url = normalize_url(url)
    expected = expected or Expected()
    if not force:
        hit = cached_file(url, expected)
        if hit is not None:
            return hit
    entry = entry_dir(url)
    if offline():
        raise OfflineError(
            f"{url} is not in the download cache and {ENV_OFFLINE}=1 forbids downloading it: unset "
            f"{ENV_OFFLINE} to download it, or run `elmokit download {name or url}` on a machine with a "
            f"network and copy the cache folder {entry} to the same place here"
        )
    if progress is None:
        progress = sys.stderr.isatty()
    try:
        entry.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DownloadError(
            f"cannot make the cache folder {entry} ({err.strerror or err}); set {ENV_CACHE} to a "
            "writable folder"
        ) from None
    with _entry_lock(entry, url, progress):
        if not force:  # another process may have finished it while this one waited
            hit = cached_file(url, expected)
            if hit is not None:
                return hit
        return _download(url, entry, expected, progress)


@contextmanager
def _entry_lock(entry: Path, url: str, progress: bool) -> Iterator[None]:
    from filelock import FileLock, Timeout

    lock = FileLock(str(entry / ".lock"))
    try:
        lock.acquire(timeout=0.5)
    except Timeout:
        if progress:
            print(f"elmokit: waiting for another process that downloads {url}", file=sys.stderr)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _download(url: str, entry: Path, expected: Expected, progress: bool) -> Path:
    name = file_name(url)
    final, part, state = entry / name, entry / f".{name}.part", entry / f".{name}.part.json"
    for attempt in range(2):
        have = _resumable_bytes(part, state, url)
        try:
            return _transfer(url, entry, final, part, state, have, expected, progress)
        except _RangeRefused:
            part.unlink(missing_ok=True)  # the part is not a prefix of the file: start over
            if attempt:
                raise DownloadError(f"HTTP 416 (range not satisfiable) for {url}") from None
    raise AssertionError("unreachable")


class _RangeRefused(Exception):
    pass


def _resumable_bytes(part: Path, state: Path, url: str) -> int:
    """Bytes of an earlier attempt that can be resumed (0 if none, or if they are of another URL)."""
    try:
        saved = json.loads(state.read_text(encoding="utf-8"))
        if saved.get("url") == url and part.is_file():
            return part.stat().st_size
    except (OSError, ValueError):
        pass
    part.unlink(missing_ok=True)
    return 0


def _transfer(
    url: str,
    entry: Path,
    final: Path,
    part: Path,
    state: Path,
    have: int,
    expected: Expected,
    progress: bool,
) -> Path:
    from . import __version__

    headers = {"User-Agent": f"elmokit/{__version__}", "Accept-Encoding": "identity"}
    if have:
        saved = json.loads(state.read_text(encoding="utf-8"))
        headers["Range"] = f"bytes={have}-"
        validator = saved.get("etag") or saved.get("last_modified")
        if validator:
            headers["If-Range"] = validator
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT)
    except urllib.error.HTTPError as err:
        err.close()
        if err.code == 416 and have:
            raise _RangeRefused() from None
        raise DownloadError(f"HTTP {err.code} {err.reason} for {url}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        raise DownloadError(_network_failure(url, err)) from None
    with response:
        if response.status == 206:
            start, total = _content_range(response.headers.get("Content-Range"))
            if start != have:
                raise _RangeRefused()
        else:
            have = 0
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
        if expected.size is not None and total is not None and total != expected.size:
            part.unlink(missing_ok=True)
            raise ChecksumError(
                f"{url}: the server sends {total:,} bytes but the publisher gives {expected.size:,}; "
                "nothing was cached"
            )
        write_json(
            state,
            {
                "url": url,
                "etag": response.headers.get("ETag"),
                "last_modified": response.headers.get("Last-Modified"),
            },
        )
        if total is not None:
            _check_space(url, entry, total - have)
        sha256, md5 = hashlib.sha256(), hashlib.md5()
        if have:
            with open(part, "rb") as f:
                for chunk in iter(lambda: f.read(CHUNK), b""):
                    sha256.update(chunk)
                    md5.update(chunk)
        received = have
        # unbuffered, and read1 hands over what has arrived: the part file on disk follows the
        # download, so a killed process leaves all it received for the next attempt to resume
        with (
            open(part, "ab" if have else "wb", buffering=0) as out,
            _bar(final.name, total, have, progress) as bar,
        ):
            try:
                while True:
                    chunk = response.read1(CHUNK)
                    if not chunk:
                        break
                    out.write(chunk)
                    sha256.update(chunk)
                    md5.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
                out.flush()
                os.fsync(out.fileno())
            except OSError as err:
                if err.errno == errno.ENOSPC:
                    raise DownloadError(
                        f"disk full: no space left in {entry} for {url} ({received:,}"
                        f"{f' of {total:,}' if total is not None else ''} bytes written; the partial "
                        "download is kept and resumes once there is space)"
                    ) from None
                raise DownloadError(_cut_short(url, received, total, err)) from None
            except http.client.HTTPException as err:
                raise DownloadError(_cut_short(url, received, total, err)) from None
    if total is not None and received != total:
        raise DownloadError(_cut_short(url, received, total, None))
    digests = {"sha256": sha256.hexdigest(), "md5": md5.hexdigest()}
    _verify(url, part, state, received, digests, expected)
    shutil.rmtree(entry / "unpacked", ignore_errors=True)  # made from the file this one replaces
    os.replace(part, final)
    _fsync_folder(entry)
    state.unlink(missing_ok=True)
    _record(url, entry, final, received, digests)
    return final


def _content_range(value: str | None) -> tuple[int, int | None]:
    match = re.fullmatch(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", value or "")
    if not match:
        return -1, None
    return int(match.group(1)), None if match.group(3) == "*" else int(match.group(3))


def _check_space(url: str, entry: Path, needed: int) -> None:
    free = shutil.disk_usage(entry).free
    if needed > free:
        raise DownloadError(
            f"disk full: {url} needs {needed:,} more bytes but {entry} has {free:,} free; free some "
            f"space or set {ENV_CACHE} to a folder on a larger disk"
        )


def _verify(url: str, part: Path, state: Path, size: int, digests: dict, expected: Expected) -> None:
    """Refuse a download whose size, checksum or kind is not what it should be: the file is
    removed (nothing is cached)."""
    problem = None
    if expected.size is not None and size != expected.size:
        problem = f"size {size:,} bytes but the publisher gives {expected.size:,}"
    for key in ("sha256", "md5"):
        want = getattr(expected, key)
        if problem is None and want is not None and digests[key] != want.lower():
            problem = f"checksum mismatch: {key} {digests[key]} but the publisher gives {want.lower()}"
    if problem is None and expected.kind is not None:
        problem = _wrong_kind(part, expected.kind)
    if problem is not None:
        part.unlink(missing_ok=True)
        state.unlink(missing_ok=True)
        raise ChecksumError(f"{url}: {problem}; nothing was cached")


def _wrong_kind(path: Path, kind: str) -> str | None:
    """Why ``path`` is not a file of ``kind`` (None if it is)."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if kind == "zip" and not head.startswith(_ZIP_SIGNATURES):
        return f"not a zip archive (it begins {head[:16]!r})"
    if kind == "hdf5" and not _is_hdf5(path):
        return f"not an HDF5 file (it begins {head[:16]!r})"
    if kind == "json":
        if path.stat().st_size > 1 << 24:
            return f"not a JSON options file ({path.stat().st_size:,} bytes)"
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError):
            return f"not a JSON file (it begins {head[:16]!r})"
    return None


def _is_hdf5(path: Path) -> bool:
    """HDF5's signature at offset 0, 512, 1024, 2048, ... (after a user block)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        offset = 0
        while offset + 8 <= size and offset <= 1 << 20:
            f.seek(offset)
            if f.read(8) == _HDF5_SIGNATURE:
                return True
            offset = 512 if offset == 0 else offset * 2
    return False


def sniff(path: Path) -> str | None:
    """The kind of ``path``: "zip", "hdf5" or "json" (None if it is none of them)."""
    for kind in ("zip", "hdf5", "json"):
        if _wrong_kind(path, kind) is None:
            return kind
    return None


def _record(url: str, entry: Path, final: Path, size: int, digests: dict) -> None:
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


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not possible on every platform (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _network_failure(url: str, err: BaseException) -> str:
    """One line: why ``url`` could not be opened."""
    host = urllib.parse.urlsplit(url).hostname or url
    reason = getattr(err, "reason", err)
    if isinstance(reason, socket.gaierror):
        return f"cannot download {url}: no network, or no such host {host} ({reason.strerror or reason})"
    if isinstance(reason, ConnectionRefusedError):
        return f"cannot download {url}: {host} refused the connection"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"cannot download {url}: no answer from {host} within {TIMEOUT:.0f} s"
    text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
    return f"cannot download {url}: {' '.join(str(text).split())}"


def _cut_short(url: str, received: int, total: int | None, err: BaseException | None) -> str:
    of = f" of {total:,}" if total is not None else ""
    why = "the server closed the connection early" if err is None else " ".join(str(err).split())
    return (
        f"download of {url} was cut short: {received:,}{of} bytes received ({why}); the partial "
        "download is kept, run again to resume"
    )


@contextmanager
def _bar(name: str, total: int | None, initial: int, enabled: bool) -> Iterator[Any]:
    from tqdm import tqdm

    with tqdm(
        total=total,
        initial=initial,
        desc=name,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not enabled,
        dynamic_ncols=True,
        file=sys.stderr,
        mininterval=0.5,
    ) as bar:
        yield bar
