"""The HTTP client of the download cache: one URL's bytes into its entry's part file, resumed,
bounded and verified, every failure one line.

Why it is written by hand: huggingface_hub downloads only from a Hub (its ``hf://`` specs go
through it, see ``elmokit.hub.hf``), and pooch, the one well-kept library for plain URLs,
neither resumes a cut download (no Range/If-Range), nor checks that a file is the kind it should
be (a captive portal's HTML page saved as weights), nor bounds a server that drips bytes, a gzip
bomb or a redirect loop, nor says each failure in one line. The published ELMo models are plain
URLs of several GB on slow academic servers, so those are kept here.

While a file downloads, its entry (``elmokit.hub.entries``) holds ``.NAME.part`` and
``.NAME.part.json`` (the server's ETag/Last-Modified, the size and a checkpoint: the sha256 of
the part's first bytes): a killed or cut download leaves only these, and the next attempt
resumes them with an HTTP Range request (``If-Range`` makes a changed file restart) or restarts
from byte 0: where the server has no ranges, gave no validator (a Range without If-Range could
splice two versions of the file), answers from another byte, or the part no longer matches its
checkpoint.

A download is the publisher's file or nothing: before it gets its final name it must be of its
kind (``elmokit.hub.file_kinds``), of the size the server announced (Content-Length,
Content-Range) and the publisher gives, with the publisher's checksum where one is known. An
HTML page (Content-Type text/html: an error, login or captive-portal page) is refused, a
gzip-encoded body is decoded (another encoding is refused), a server that sends under
``MIN_RATE`` bytes/s for ``RATE_WINDOW`` s or no complete answer within ``HEADER_DEADLINE`` s is
given up, and a redirect is followed only to http or https, at most ``MAX_REDIRECTS`` times.

The client is the standard library's urllib (it keeps proxies and certificates as Python
configures them), with three handlers of its own: the redirect rules above, a one-line error
for a loop, and connections that hand their socket to a watchdog, since urllib's timeout is per
read and a server that drips one byte every few seconds would otherwise never be cut.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._version import __version__
from ..base.atomic import write_json
from ..base.jsonfiles import read_json
from . import file_kinds
from .cache import ENV_CACHE
from .entries import ChecksumError, DownloadError, file_name, record
from .file_kinds import CHUNK, Expected, wrong_kind

__all__: list[str] = []

logger = logging.getLogger(__name__)

TIMEOUT = 30.0  # seconds without an answer (connect or read) before a download is given up
HEADER_DEADLINE = 60.0  # seconds from the request to the end of the response's headers
MIN_RATE = 1024  # bytes/s: a body that arrives slower than this for RATE_WINDOW seconds is given up
RATE_WINDOW = 60.0
MAX_REDIRECTS = 10
CHECKPOINT_BYTES = 64 << 20  # the part's checkpoint (sha256 of its first bytes) is renewed this often,
CHECKPOINT_SECONDS = 2.0  # or after this many seconds


def download(url: str, entry: Path, expected: Expected, progress: bool) -> Path:
    """Download ``url`` into its cache ``entry`` (resumed where an earlier attempt left a part),
    verified against ``expected`` and recorded in the entry's meta.json: the final file. Raises
    DownloadError (ChecksumError) with a one-line message, or an OSError of the cache's disk."""
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
        saved = read_json(state)
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
    record(url, entry, final, received, digests)
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
                    ratio = file_kinds.MAX_GZIP_RATIO
                    if received + len(chunk) > ratio * wire + CHUNK:
                        raise _Refused(f"the gzip-encoded body expands more than {ratio}x (a gzip bomb)")
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
        problem = wrong_kind(part, expected.kind)
    if problem is not None:
        part.unlink(missing_ok=True)
        state.unlink(missing_ok=True)
        raise ChecksumError(f"{url}: {problem}; nothing was cached")


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
