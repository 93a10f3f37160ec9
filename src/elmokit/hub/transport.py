"""Downloads of plain URLs into elmokit's cache: one entry per URL, atomic, resumable, verified,
offline-aware.

Why this transport is written by hand: huggingface_hub downloads only from a Hub (its
``hf://`` specs go through it, see ``elmokit.hub.hf``), and pooch, the one well-kept library
for plain URLs, neither resumes a cut download (no Range/If-Range), nor checks that a file is
the kind it should be (a captive portal's HTML page saved as weights), nor bounds a server that
drips bytes, a gzip bomb or a redirect loop, nor says each failure in one line. The published
ELMo models are plain URLs of several GB on slow academic servers, so those are kept here.

The cache is ``elmokit.hub.cache.cache_dir()``. Each URL has its own folder
``downloads/<sha256(url)[:16]>-<file name>`` holding

- the file, under its final name only once it is complete and verified;
- ``.NAME.part`` (+ ``.NAME.part.json``: the server's ETag/Last-Modified, the size and a
  checkpoint: the sha256 of the part's first bytes) while it downloads: a killed or cut download
  leaves only these, and the next attempt resumes them with an HTTP Range request (``If-Range``
  makes a changed file restart) or restarts from byte 0: where the server has no ranges, gave no
  validator (a Range without If-Range could splice two versions of the file), answers from
  another byte, or the part no longer matches its checkpoint;
- ``meta.json``: url, size, sha256 (and md5), date, and the sha256 of the first download, so a
  later use notices a cached file that changed and a forced download notices a changed publisher
  file;
- ``unpacked/``: an archive's members (elmokit.hub.resolve), removed when the archive is downloaded
  again;
- ``.lock``: two processes fetching the same URL take turns (the second finds the file done).

A download is the publisher's file or nothing: before it gets its final name it must be the
kind of file it should be (from the registry, else from the URL's name: a ``.zip`` a readable zip
archive, an ``.hdf5``/``.h5`` an HDF5 file that is not cut short, a ``.json`` JSON that parses,
any other name one of the three), of the size the server announced (Content-Length,
Content-Range) and the publisher gives, with the publisher's checksum where one is known. An
HTML page (Content-Type text/html: an error, login or captive-portal page) is refused, a
gzip-encoded body is decoded (another encoding is refused), a server that sends under
``MIN_RATE`` bytes/s for ``RATE_WINDOW`` s or no complete answer within ``HEADER_DEADLINE`` s is
given up, and a redirect is followed only to http or https, at most ``MAX_REDIRECTS`` times.

The transport is the standard library's urllib (it keeps proxies and certificates as Python
configures them), with three handlers of its own: the redirect rules above, a one-line error
for a loop, and connections that hand their socket to a watchdog, since urllib's timeout is per
read and a server that drips one byte every few seconds would otherwise never be cut.

Every failure is one line naming the URL and the cause: no network or unknown host, HTTP status,
a body cut short, a size or checksum other than the publisher's, a full disk. With
``ELMOKIT_OFFLINE=1`` nothing touches the network: a URL that is not cached is an error that
names it and says what to do.
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._version import __version__
from ..base.atomic import write_json
from ..base.digests import file_digest
from .cache import ENV_CACHE, ENV_OFFLINE, cache_dir, offline

__all__ = ["DownloadError"]

logger = logging.getLogger(__name__)

URL_SCHEMES = ("http://", "https://", "s3://")
TIMEOUT = 30.0  # seconds without an answer (connect or read) before a download is given up
HEADER_DEADLINE = 60.0  # seconds from the request to the end of the response's headers
MIN_RATE = 1024  # bytes/s: a body that arrives slower than this for RATE_WINDOW seconds is given up
RATE_WINDOW = 60.0
MAX_REDIRECTS = 10
MAX_GZIP_RATIO = 1000  # a gzip-encoded body may expand this much (more is a gzip bomb)
CHECKPOINT_BYTES = 64 << 20  # the part's checkpoint (sha256 of its first bytes) is renewed this often,
CHECKPOINT_SECONDS = 2.0  # or after this many seconds
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
    ``kind`` "zip", "json", "hdf5", "model" (any of the three), "gzip", "text" (UTF-8, not an
    HTML page; the data sets of ``elmokit.hub.datasets``) or None (from the URL's name, see
    ``url_kind``)."""

    size: int | None = None
    sha256: str | None = None
    md5: str | None = None
    kind: str | None = None


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


_KIND_BY_SUFFIX = {".zip": "zip", ".json": "json", ".hdf5": "hdf5", ".h5": "hdf5"}
_KIND_NAMES = {
    "zip": "a zip archive",
    "json": "a JSON file",
    "hdf5": "an HDF5 file",
    "model": "a zip archive, HDF5 file or JSON file",
    "gzip": "a gzip file",
    "text": "a UTF-8 text file",
}


def url_kind(url: str) -> str:
    """The kind of file ``url`` should hold, from its name: "zip", "json" or "hdf5"; "model"
    (any of the three) for another name or none (``http://host/model``)."""
    name = urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1].lower()
    return next((kind for suffix, kind in _KIND_BY_SUFFIX.items() if name.endswith(suffix)), "model")


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
        meta = json.loads((entry_dir(url) / META).read_text(encoding="utf-8"))
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
    problem = _wrong_kind(path, (expected.kind if expected else None) or url_kind(url))
    if problem is not None:  # e.g. cached by an elmokit that did not check it
        raise ChecksumError(f"cached file {path} of {url} is {problem}{again}")
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
    if expected.kind is None:
        expected = replace(expected, kind=url_kind(url))
    if not force:
        hit = cached_file(url, expected, name)
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
            hit = cached_file(url, expected, name)
            if hit is not None:
                return hit
        try:
            return _download(url, entry, expected, progress)
        except DownloadError:
            raise
        except OSError as err:  # the cache's disk: full, read-only, ...
            raise DownloadError(_disk_failure(url, entry, err)) from None


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
        resume = _resume_point(part, state, url)
        try:
            return _transfer(url, entry, final, part, state, resume, expected, progress)
        except _RangeRefused:
            part.unlink(missing_ok=True)  # the part is not a prefix of the file: start over
            state.unlink(missing_ok=True)
            if attempt:
                raise DownloadError(
                    f"cannot download {url}: the server answered a request for the whole file with "
                    "a part of it (HTTP 206 or 416)"
                ) from None
    raise AssertionError("unreachable")


class _RangeRefused(Exception):
    pass


@dataclass
class _Resume:
    """An earlier attempt's part that can be resumed: its size, digests and saved state."""

    have: int
    sha256: Any
    md5: Any
    saved: dict[str, Any]


def _strong_etag(value: Any) -> str | None:
    return value if isinstance(value, str) and value.startswith('"') else None


def _resume_point(part: Path, state: Path, url: str) -> _Resume | None:
    """The earlier attempt to resume, or None (its files removed) where it cannot be: of
    another URL, no validator from the server for If-Range (resuming could splice two versions
    of the file), or a part that is shorter than its checkpoint or no longer matches it."""
    try:
        saved = json.loads(state.read_text(encoding="utf-8"))
        # the bytes after the checkpoint (those of the last seconds before a kill) are unchecked
        checked = (saved.get("checked") if isinstance(saved, dict) else None) or [0, None]
        usable = (
            saved.get("url") == url
            and (_strong_etag(saved.get("etag")) or isinstance(saved.get("last_modified"), str))
            and isinstance(checked, list)
            and len(checked) == 2
            and isinstance(checked[0], int)
            and part.is_file()
            and 0 <= checked[0] <= part.stat().st_size
            and part.stat().st_size > 0
        )
        if usable:
            sha256, md5 = hashlib.sha256(), hashlib.md5()
            have = 0
            with open(part, "rb") as f:
                for chunk in iter(lambda: f.read(CHUNK), b""):
                    if have < checked[0] <= have + len(chunk):
                        head = chunk[: checked[0] - have]
                        probe = sha256.copy()
                        probe.update(head)
                        if probe.hexdigest() != checked[1]:
                            break  # damaged: start over
                    sha256.update(chunk)
                    md5.update(chunk)
                    have += len(chunk)
                else:
                    return _Resume(have, sha256, md5, saved)
            logger.warning("%s does not match its checkpoint; downloading %s from the start", part, url)
    except (OSError, ValueError):
        pass
    part.unlink(missing_ok=True)
    state.unlink(missing_ok=True)
    return None


class _Watch:
    """A watchdog for one request: when armed time runs out it shuts the connection's socket
    down, so a read blocked on a server that drips bytes (or headers) returns."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.fired: str | None = None
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float, why: str) -> None:
        self.disarm()
        self._timer = threading.Timer(seconds, self._fire, (why,))
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self, why: str) -> None:
        self.fired = why
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Watched:
    """urllib handler mixin: the connections it opens hand their socket to the watch."""

    watch: _Watch

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        watch = self.watch

        def make(*args: Any, **kw: Any) -> Any:
            conn = http_class(*args, **kw)
            connect = conn.connect

            def watched_connect() -> None:
                connect()
                watch.sock = conn.sock

            conn.connect = watched_connect
            return conn

        return super().do_open(make, req, **kwargs)  # type: ignore[misc]


class _HTTP(_Watched, urllib.request.HTTPHandler):
    pass


class _HTTPS(_Watched, urllib.request.HTTPSHandler):
    pass


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to http or https, at most MAX_REDIRECTS times."""

    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if urllib.parse.urlsplit(newurl).scheme.lower() not in ("http", "https"):
            raise DownloadError(
                f"cannot download {req.full_url}: the server redirects to {newurl}, which is not an "
                "http or https URL; refused"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _open(url: str, headers: dict[str, str], watch: _Watch) -> Any:
    """The response to a GET of ``url``, its headers complete within HEADER_DEADLINE seconds."""
    handlers = (_Redirects(), _HTTP(), _HTTPS())
    for handler in handlers:
        if isinstance(handler, _Watched):
            handler.watch = watch
    opener = urllib.request.build_opener(*handlers)
    host = urllib.parse.urlsplit(url).hostname or url
    watch.arm(HEADER_DEADLINE, f"no complete answer from {host} within {HEADER_DEADLINE:.0f} s")
    try:
        response = opener.open(urllib.request.Request(url, headers=headers), timeout=TIMEOUT)
        watch.disarm()
        if watch.fired:  # http.client takes headers cut by the watchdog as complete
            response.close()
            raise DownloadError(f"cannot download {url}: {watch.fired}")
        return response
    except DownloadError:
        raise
    except urllib.error.HTTPError as err:
        err.close()
        if 300 <= err.code < 400:
            where = err.headers.get("Location") if err.headers else None
            raise DownloadError(
                f"cannot download {url}: too many redirects or a redirect loop (the last: HTTP "
                f"{err.code} to {where})"
            ) from None
        raise
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        if watch.fired:
            raise DownloadError(f"cannot download {url}: {watch.fired}") from None
        raise DownloadError(_network_failure(url, err)) from None
    finally:
        watch.disarm()


def _transfer(
    url: str,
    entry: Path,
    final: Path,
    part: Path,
    state: Path,
    resume: _Resume | None,
    expected: Expected,
    progress: bool,
) -> Path:
    have = resume.have if resume else 0
    headers = {"User-Agent": f"elmokit/{__version__}", "Accept-Encoding": "identity"}
    if resume:
        headers["Range"] = f"bytes={have}-"
        headers["If-Range"] = _strong_etag(resume.saved.get("etag")) or resume.saved["last_modified"]
    watch = _Watch()
    try:
        response = _open(url, headers, watch)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:
            raise _RangeRefused() from None
        raise DownloadError(f"HTTP {err.code} {' '.join(str(err.reason).split())} for {url}") from None
    with response:
        have, resume, total, sent, decoder = _checked_answer(url, response, resume, expected, part, state)
        validators = {
            "etag": response.headers.get("ETag"),
            "last_modified": response.headers.get("Last-Modified"),
        }
        if decoder is not None:  # a decoded body is not resumable (ranges count encoded bytes)
            validators = {"etag": None, "last_modified": None}
        saved_state = {"url": url, **validators, "total": total}
        # the part as resumed was checked and hashed just now: a checkpoint of all of it
        write_json(state, {**saved_state, "checked": [have, resume.sha256.hexdigest()] if resume else None})
        if total is not None:
            _check_space(url, entry, total - have)
        received, digests = _receive(
            url, response, (entry, final, part, state), saved_state, resume, (total, sent), decoder, progress
        )
    _verify(url, part, state, received, digests, expected)
    shutil.rmtree(entry / "unpacked", ignore_errors=True)  # made from the file this one replaces
    os.replace(part, final)
    _fsync_folder(entry)
    state.unlink(missing_ok=True)
    _record(url, entry, final, received, digests)
    return final


def _checked_answer(
    url: str, response: Any, resume: _Resume | None, expected: Expected, part: Path, state: Path
) -> tuple[int, _Resume | None, int | None, int | None, Any]:
    """What an answer's headers say, checked: the bytes already held (0 and no resume when the
    server sends the whole file again), the file's total size and the body's size on the wire
    (None when not said), and the gzip decoder of an encoded body (None for identity). An HTML
    page, an unknown encoding or a size other than the publisher's is a ChecksumError; a range
    answer that does not continue the part is _RangeRefused."""
    have = resume.have if resume else 0
    answer = response.headers
    length = answer.get("Content-Length", "").strip()
    sent = int(length) if length.isdigit() else None  # bytes on the wire
    ctype = answer.get_content_type()
    if ctype in ("text/html", "application/xhtml+xml"):
        raise ChecksumError(
            f"{url}: the server sent an HTML page (Content-Type {ctype}), not the file: an error, "
            "login or captive-portal page; nothing was cached"
        )
    encoding = (answer.get("Content-Encoding") or "identity").strip().lower()
    if encoding not in ("identity", "gzip", "x-gzip"):
        raise ChecksumError(
            f"{url}: the server sent the file encoded as {encoding!r} (Content-Encoding), which "
            "elmokit does not decode; nothing was cached"
        )
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding != "identity" else None
    if response.status == 206:
        start, total = _content_range(answer.get("Content-Range"))
        saved = resume.saved if resume else {}
        if (
            start != have
            or decoder is not None
            or (sent is not None and total is not None and start + sent != total)
            or (saved.get("total") is not None and total != saved["total"])
            or (_strong_etag(saved.get("etag")) and answer.get("ETag") not in (None, saved["etag"]))
        ):
            raise _RangeRefused()
    else:
        have, resume = 0, None
        total = sent if decoder is None else None
    if expected.size is not None and total is not None and total != expected.size:
        part.unlink(missing_ok=True)
        state.unlink(missing_ok=True)
        raise ChecksumError(
            f"{url}: the server sends {total:,} bytes but the publisher gives {expected.size:,}; "
            "nothing was cached"
        )
    return have, resume, total, sent, decoder


def _receive(
    url: str,
    response: Any,
    paths: tuple[Path, Path, Path, Path],
    saved_state: dict[str, Any],
    resume: _Resume | None,
    sizes: tuple[int | None, int | None],
    decoder: Any,
    progress: bool,
) -> tuple[int, dict[str, str]]:
    """Append the body to the part file as it arrives, hashing it and checkpointing what was
    received (so a killed process resumes), within the rate and gzip bounds; returns the bytes
    of the file received and its digests. ``paths``: the cache entry, the final file, the part
    and its state file; ``sizes``: the file's total and the body's size on the wire."""
    entry, final, part, state = paths
    total, sent = sizes
    have = resume.have if resume else 0
    sha256 = resume.sha256 if resume else hashlib.sha256()
    md5 = resume.md5 if resume else hashlib.md5()
    received, wire = have, 0
    checkpoint = have

    def save_checkpoint() -> None:
        if received:
            write_json(state, {**saved_state, "checked": [received, sha256.hexdigest()]})

    # unbuffered, and read1 hands over what has arrived: the part file on disk follows the
    # download, so a killed process leaves all it received for the next attempt to resume
    window_start, window_bytes = time.monotonic(), 0
    saved_at = window_start
    with (
        open(part, "ab" if have else "wb", buffering=0) as out,
        _bar(final.name, total, have, progress) as bar,
    ):
        try:
            while True:
                chunk = response.read1(CHUNK)
                if not chunk:
                    break
                wire += len(chunk)
                window_bytes += len(chunk)
                if decoder is not None:
                    chunk = decoder.decompress(chunk)
                    if received + len(chunk) > MAX_GZIP_RATIO * wire + CHUNK:
                        raise _Refused(
                            f"the gzip-encoded body expands more than {MAX_GZIP_RATIO}x (a gzip bomb)"
                        )
                out.write(chunk)
                sha256.update(chunk)
                md5.update(chunk)
                received += len(chunk)
                bar.update(len(chunk))
                now = time.monotonic()
                if decoder is None and (
                    received - checkpoint >= CHECKPOINT_BYTES or now - saved_at >= CHECKPOINT_SECONDS
                ):
                    save_checkpoint()
                    checkpoint, saved_at = received, now
                if now - window_start >= RATE_WINDOW:
                    if window_bytes < MIN_RATE * (now - window_start):
                        raise _TooSlow(window_bytes, now - window_start)
                    window_start, window_bytes = now, 0
            if decoder is not None:
                rest = decoder.flush()
                if not decoder.eof:
                    raise _Refused("the gzip-encoded body is cut short or damaged")
                out.write(rest)
                sha256.update(rest)
                md5.update(rest)
                received += len(rest)
            out.flush()
            os.fsync(out.fileno())
        except (_Refused, zlib.error, _TooSlow, OSError, http.client.HTTPException) as err:
            if isinstance(err, (_Refused, zlib.error)):  # nothing of it is kept
                part.unlink(missing_ok=True)
                state.unlink(missing_ok=True)
            else:  # what arrived is kept for the next attempt
                _quietly(save_checkpoint)
            raise _receive_error(url, err, entry, received, total) from None
    if (sent is not None and wire != sent) or (total is not None and received != total):
        _quietly(save_checkpoint)
        raise DownloadError(_cut_short(url, received, total if total is not None else sent, None))
    return received, {"sha256": sha256.hexdigest(), "md5": md5.hexdigest()}


def _receive_error(url: str, err: Exception, entry: Path, received: int, total: int | None) -> Exception:
    """The one-line error of a body that failed while it was received."""
    if isinstance(err, _Refused):
        return ChecksumError(f"{url}: {err}; nothing was cached")
    if isinstance(err, zlib.error):
        return ChecksumError(f"{url}: the gzip-encoded body is damaged ({err}); nothing was cached")
    if isinstance(err, _TooSlow):
        return DownloadError(
            f"download of {url} was too slow: {err.count:,} bytes in {err.seconds:.0f} s "
            f"(under {MIN_RATE:,} bytes/s); {received:,} bytes received, the partial download "
            "is kept, run again to resume"
        )
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return DownloadError(
            f"disk full: no space left in {entry} for {url} ({received:,}"
            f"{f' of {total:,}' if total is not None else ''} bytes written; the partial "
            "download is kept and resumes once there is space)"
        )
    return DownloadError(_cut_short(url, received, total, err))


class _Refused(Exception):
    """The body is not one to cache (the message says why)."""


class _TooSlow(Exception):
    def __init__(self, count: int, seconds: float) -> None:
        super().__init__(count, seconds)
        self.count, self.seconds = count, seconds


def _quietly(action: Any) -> None:
    """Run ``action``, ignoring an OSError (a checkpoint on a full disk is not worth a second error)."""
    try:
        action()
    except OSError:
        pass


def _disk_failure(url: str, entry: Path, err: OSError) -> str:
    """One line: why the download of ``url`` could not be written into ``entry``."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"disk full: no space left in {entry} for {url}; free some space or set {ENV_CACHE} "
            "to a folder on a larger disk"
        )
    return f"cannot write the download of {url} into {entry}: {err.strerror or err}"


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


def _wrong_kind(path: Path, kind: str | None) -> str | None:
    """Why ``path`` is not a file of ``kind`` ("zip", "hdf5", "json", "model": any of them; None:
    not checked), as "not ..." (None if it is)."""
    if kind is None:
        return None
    if kind == "model":
        if sniff(path) is None:
            return f"not {_KIND_NAMES['model']} ({_begins(path)})"
        return None
    if kind == "zip":
        return _zip_problem(path)
    if kind == "hdf5":
        return _hdf5_problem(path)
    if kind == "json":
        size = path.stat().st_size
        if size > 1 << 24:
            return f"not a JSON options file ({size:,} bytes)"
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError):
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
