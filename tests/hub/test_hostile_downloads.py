"""Hostile downloads, cache entries and archives: a download is the publisher's file or nothing.

Every server here is an http.server on 127.0.0.1 started by the test; ELMOKIT_CACHE is a folder
of the test. Each case checks the exit status or the exception, the one-line message that names
the URL or archive and the cause, and what the cache holds afterwards."""

from __future__ import annotations

import errno
import gzip
import hashlib
import http.server
import io
import json
import os
import socket
import time
import zipfile
from collections.abc import Callable

import pytest

from elmokit import resolve_model
from elmokit.cli import main
from elmokit.hub import archives, file_kinds, http_client, registry
from elmokit.hub.archives import ArchiveError, unpack_zip
from elmokit.hub.entries import ChecksumError, DownloadError, entry_dir, is_cached
from elmokit.hub.transport import fetch

from ..conftest import TINY, LocalServer, running

OPTIONS = (TINY / "options.json").read_bytes()
WEIGHTS = (TINY / "lm_weights.hdf5").read_bytes()


def _zip(members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


MODEL_ZIP = _zip({"options.json": OPTIONS, "model.hdf5": WEIGHTS})
BIG = _zip({"x": os.urandom(299_900)}, zipfile.ZIP_STORED)  # 300,000 bytes, a readable zip
BIG2 = _zip({"x": os.urandom(299_900)}, zipfile.ZIP_STORED)  # the publisher's next version


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        srv = self.server
        srv.requests.append((self.path, self.headers.get("Range"), self.headers.get("If-Range")))
        route = srv.routes.get(self.path)
        if callable(route):
            route(self)
            return
        if route is None:
            self.send_error(404)
            return
        self.serve(route)

    def serve(
        self,
        data: bytes,
        *,
        length: int | None = None,
        ctype: str = "application/octet-stream",
        extra: dict[str, str] | None = None,
    ) -> None:
        """``data`` with Range support (If-Range as a server should) and, unless the server has
        no validators, an ETag; ``length``: the Content-Length to claim."""
        srv = self.server
        etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
        start = 0
        wanted = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        if wanted and (if_range is None or (srv.validators and if_range == etag) or srv.ignore_if_range):
            start = int(wanted.removeprefix("bytes=").rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        if srv.validators:
            self.send_header("ETag", etag)
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.path in srv.cut:
            body = body[: srv.cut[self.path]]
        self.wfile.write(body[: len(body) if length is None else length])
        self.close_connection = True


class _Server(LocalServer):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.routes: dict[str, bytes | Callable[[_Handler], None]] = {}
        self.cut: dict[str, int] = {}
        self.validators = True
        self.ignore_if_range = False
        self.requests: list[tuple[str, str | None, str | None]] = []


@pytest.fixture()
def server(network_allowed):
    srv = _Server()
    srv.routes.update({"/m/model.zip": MODEL_ZIP, "/big.zip": BIG, "/m/weights.hdf5": WEIGHTS})
    with running(srv):
        yield srv


def _entry_files(url: str) -> list[str]:
    entry = entry_dir(url)
    return sorted(p.name for p in entry.iterdir() if p.name != ".lock") if entry.exists() else []


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("elmokit: error: "), err
    return err.removeprefix("elmokit: error: ").rstrip("\n")


# -- what is cached is the publisher's file --------------------------------------------------------
def test_an_html_error_page_is_never_cached(server, capsys):
    page = b"<html><body>Service temporarily unavailable</body></html>"
    server.routes["/m/model.zip"] = lambda h: h.serve(page, ctype="text/html; charset=utf-8")
    url = server.url("/m/model.zip")
    assert main(["download", url]) == 2
    assert _error(capsys) == (
        f"{url}: the server sent an HTML page (Content-Type text/html), not the file: an error, login or "
        "captive-portal page; nothing was cached"
    )
    assert _entry_files(url) == [] and not is_cached(url)


def test_a_page_at_a_url_without_extension_is_not_cached_as_a_model(server, capsys):
    server.routes["/model"] = lambda h: h.serve(b"Please log in to continue.\n", ctype="text/plain")
    url = server.url("/model")
    assert main(["download", url]) == 2
    assert _error(capsys) == (
        f"{url}: not a zip archive, HDF5 file or JSON file (it begins b'Please log in to'); nothing was cached"
    )
    assert _entry_files(url) == []


def test_a_gzip_encoded_body_is_decoded_and_another_encoding_refused(server, capsys):
    server.routes["/m/model.zip"] = lambda h: h.serve(
        gzip.compress(MODEL_ZIP), extra={"Content-Encoding": "gzip"}
    )
    url = server.url("/m/model.zip")
    assert main(["download", url, "--quiet"]) == 0
    assert (entry_dir(url) / "model.zip").read_bytes() == MODEL_ZIP
    assert (
        json.loads((entry_dir(url) / "meta.json").read_text())["sha256"]
        == hashlib.sha256(MODEL_ZIP).hexdigest()
    )
    capsys.readouterr()
    server.routes["/other.zip"] = lambda h: h.serve(b"\x1b\x00br-bytes", extra={"Content-Encoding": "br"})
    other = server.url("/other.zip")
    assert main(["download", other]) == 2
    assert _error(capsys) == (
        f"{other}: the server sent the file encoded as 'br' (Content-Encoding), which elmokit does not "
        "decode; nothing was cached"
    )
    assert _entry_files(other) == []


@pytest.mark.parametrize("path", ["/m/model.zip", "/m/weights.hdf5"])
def test_a_body_cut_short_by_a_lying_content_length_is_refused(server, path):
    data = server.routes[path]
    server.routes[path] = lambda h: h.serve(data, length=len(data) - 700)
    url = server.url(path)
    with pytest.raises(ChecksumError) as err:
        fetch(url, progress=False)
    message = str(err.value)
    assert message.startswith(f"{url}: not a ") and message.endswith("; nothing was cached")
    assert "cut short" in message
    assert ("readable zip archive" if path.endswith(".zip") else "whole HDF5 file") in message
    assert _entry_files(url) == []
    server.routes[path] = data
    assert fetch(url, progress=False).read_bytes() == data


# -- resuming never splices -------------------------------------------------------------------------
def test_a_resume_without_a_validator_restarts_from_byte_0(server):
    server.validators = False  # no ETag, no Last-Modified: If-Range is impossible
    url = server.url("/big.zip")
    server.cut["/big.zip"] = 120_000
    with pytest.raises(DownloadError, match="cut short: 120,000 of 300,000 bytes"):
        fetch(url, progress=False)
    del server.cut["/big.zip"]
    server.routes["/big.zip"] = BIG2  # the file changed meanwhile
    assert fetch(url, progress=False).read_bytes() == BIG2
    assert server.requests[-1] == ("/big.zip", None, None)


def test_a_resume_of_a_changed_file_is_not_spliced_where_the_server_ignores_if_range(server):
    url = server.url("/big.zip")
    server.cut["/big.zip"] = 120_000
    with pytest.raises(DownloadError, match="cut short"):
        fetch(url, progress=False)
    del server.cut["/big.zip"]
    server.routes["/big.zip"] = BIG2
    server.ignore_if_range = True  # answers the Range of the new file: another ETag
    assert fetch(url, progress=False).read_bytes() == BIG2
    assert [r[1] for r in server.requests[-2:]] == ["bytes=120000-", None]


def test_a_gzip_bomb_body_is_refused(server, monkeypatch):
    monkeypatch.setattr(file_kinds, "MAX_GZIP_RATIO", 10, raising=False)
    body = gzip.compress(b"PK\x03\x04" + b"\0" * (8 << 20))
    server.routes["/bomb.zip"] = lambda h: h.serve(body, extra={"Content-Encoding": "gzip"})
    url = server.url("/bomb.zip")
    with pytest.raises(ChecksumError) as err:
        fetch(url, progress=False)
    assert str(err.value) == (
        f"{url}: the gzip-encoded body expands more than 10x (a gzip bomb); nothing was cached"
    )
    assert _entry_files(url) == []


def test_a_damaged_part_is_not_resumed_onto(server):
    url = server.url("/big.zip")
    server.cut["/big.zip"] = 120_000
    with pytest.raises(DownloadError, match="cut short"):
        fetch(url, progress=False)
    del server.cut["/big.zip"]
    part = entry_dir(url) / ".big.zip.part"
    part.write_bytes(b"\0" * part.stat().st_size)  # same size, other bytes
    assert fetch(url, progress=False).read_bytes() == BIG
    assert server.requests[-1] == ("/big.zip", None, None)


def test_a_resume_answered_with_the_files_start_is_never_cached(server):
    url = server.url("/big.zip")
    server.cut["/big.zip"] = 120_000
    with pytest.raises(DownloadError, match="cut short"):
        fetch(url, progress=False)
    del server.cut["/big.zip"]

    def from_byte_0(h: _Handler) -> None:  # says 206 from the asked byte, sends the file's start
        h.send_response(206)
        h.send_header("Content-Range", f"bytes 120000-{len(BIG) - 1}/{len(BIG)}")
        h.send_header("Content-Length", str(len(BIG) - 120_000))
        h.send_header("ETag", '"' + hashlib.sha256(BIG).hexdigest()[:16] + '"')
        h.end_headers()
        h.wfile.write(BIG[: len(BIG) - 120_000])

    server.routes["/big.zip"] = from_byte_0
    with pytest.raises(ChecksumError) as err:
        fetch(url, progress=False)
    assert str(err.value).startswith(f"{url}: not a readable zip archive (")
    assert str(err.value).endswith("; nothing was cached")
    assert _entry_files(url) == []
    server.routes["/big.zip"] = BIG
    assert fetch(url, progress=False).read_bytes() == BIG


def test_a_cached_file_that_does_not_open_says_to_download_it_again(server, monkeypatch):
    url = server.url("/m/model.zip")
    entry = entry_dir(url)
    entry.mkdir(parents=True)
    bad = MODEL_ZIP[:-50]  # as an elmokit that did not check it cached it
    (entry / "model.zip").write_bytes(bad)
    meta = {
        "url": url,
        "file": "model.zip",
        "size": len(bad),
        "sha256": hashlib.sha256(bad).hexdigest(),
        "first_sha256": hashlib.sha256(bad).hexdigest(),
        "mtime_ns": (entry / "model.zip").stat().st_mtime_ns,
    }
    (entry / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ChecksumError) as err:
        resolve_model(url)
    assert str(err.value).startswith(
        f"cached file {entry / 'model.zip'} of {url} is not a readable zip archive"
    )
    assert str(err.value).endswith(f"; run `elmokit download --force {url}` to download it again")
    # a known model's archive whose member is damaged (CRC) names the model in the advice
    damaged = bytearray(_zip({"options.json": OPTIONS, "model.hdf5": WEIGHTS}, zipfile.ZIP_STORED))
    at = bytes(damaged).index(WEIGHTS[100:140])
    damaged[at] ^= 0xFF
    server.routes["/m/damaged.zip"] = bytes(damaged)
    tiny = registry.KnownModel(
        name="tiny-test",
        language="en",
        description="tiny",
        publisher="tests",
        files=(registry.RemoteFile(server.url("/m/damaged.zip"), "archive"),),
        source="tests",
    )
    monkeypatch.setattr(registry, "KNOWN_MODELS", (tiny, *registry.KNOWN_MODELS))
    with pytest.raises(ArchiveError) as err:
        resolve_model("tiny-test")
    assert "damaged archive (Bad CRC-32 for file 'model.hdf5')" in str(err.value)
    assert str(err.value).endswith(
        "; it is in the download cache: run `elmokit download --force tiny-test` to download it again"
    )


# -- slow servers, redirects, URLs -------------------------------------------------------------------
def _drip(body: bytes, headers_too: bool = False) -> Callable[[_Handler], None]:
    def serve(h: _Handler) -> None:
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nContent-Type: application/json\r\n"
            "X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n"
        ).encode()
        data = head + body if headers_too else body
        if not headers_too:
            h.wfile.write(head)
        try:
            for i in range(len(data)):
                h.wfile.write(data[i : i + 1])
                h.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass
        h.close_connection = True

    return serve


@pytest.mark.parametrize("headers_too", [False, True])
def test_a_server_that_drips_bytes_is_cut(server, monkeypatch, capsys, headers_too):
    monkeypatch.setattr(http_client, "RATE_WINDOW", 0.5, raising=False)
    monkeypatch.setattr(http_client, "MIN_RATE", 1000, raising=False)
    monkeypatch.setattr(http_client, "HEADER_DEADLINE", 1.0, raising=False)
    body = b'{"lstm": {"dim": 16}, "padding": "' + b"p" * 100 + b'"}'
    server.routes["/slow/options.json"] = _drip(body, headers_too)
    url = server.url("/slow/options.json")
    started = time.monotonic()
    assert main(["download", url]) == 2
    assert time.monotonic() - started < 5
    message = _error(capsys)
    if headers_too:
        assert message == f"cannot download {url}: no complete answer from 127.0.0.1 within 1 s"
    else:
        assert message.startswith(f"download of {url} was too slow: ")
        assert "(under 1,000 bytes/s)" in message and message.endswith("run again to resume")
    assert "options.json" not in _entry_files(url)


def test_a_redirect_to_ftp_is_not_followed(server, capsys):
    with socket.socket() as probe:  # a port where nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    target = f"ftp://127.0.0.1:{port}/model.zip"

    def to_ftp(h: _Handler) -> None:
        h.send_response(302)
        h.send_header("Location", target)
        h.send_header("Content-Length", "0")
        h.end_headers()

    server.routes["/m/moved.zip"] = to_ftp
    url = server.url("/m/moved.zip")
    assert main(["download", url]) == 2
    assert _error(capsys) == (
        f"cannot download {url}: the server redirects to {target}, which is not an http or https URL; refused"
    )


def test_a_redirect_loop_is_one_line(server, capsys):
    def loop(h: _Handler) -> None:
        h.send_response(302)
        h.send_header("Location", "/loop.zip")
        h.send_header("Content-Length", "0")
        h.end_headers()

    server.routes["/loop.zip"] = loop
    url = server.url("/loop.zip")
    assert main(["download", url]) == 2
    assert _error(capsys) == (
        f"cannot download {url}: too many redirects or a redirect loop (the last: HTTP 302 to /loop.zip)"
    )


@pytest.mark.parametrize(
    ("url", "cause"),
    [
        ("http://[::1/x.zip", "Invalid IPv6 URL"),
        ("http://host:port/x.zip", "Port could not be cast to integer value as 'port'"),
    ],
)
def test_a_url_that_does_not_parse_is_one_line_naming_it(capsys, monkeypatch, url, cause):
    monkeypatch.delenv("ELMOKIT_OFFLINE", raising=False)
    assert main(["download", url]) == 2
    assert _error(capsys) == f"not a valid URL: {url} ({cause})"


# -- the cache entry --------------------------------------------------------------------------------
def test_meta_json_cannot_point_outside_its_entry(server, tmp_path):
    url = server.url("/big.zip")
    path = fetch(url, progress=False)
    entry = path.parent
    secret = tmp_path / "secret.zip"
    secret.write_bytes(MODEL_ZIP)
    meta = json.loads((entry / "meta.json").read_text())
    name = os.path.relpath(secret, entry)
    assert name.startswith("../")
    meta.update(
        file=name,
        size=len(MODEL_ZIP),
        sha256=hashlib.sha256(MODEL_ZIP).hexdigest(),
        mtime_ns=secret.stat().st_mtime_ns,
    )
    (entry / "meta.json").write_text(json.dumps(meta))
    assert not is_cached(url)
    got = fetch(url, progress=False)
    assert got == entry / "big.zip" and got.read_bytes() == BIG
    assert secret.read_bytes() == MODEL_ZIP


def test_a_full_disk_while_resuming_is_one_line(server, monkeypatch, capsys):
    url = server.url("/big.zip")
    server.cut["/big.zip"] = 120_000
    with pytest.raises(DownloadError, match="cut short"):
        fetch(url, progress=False)
    del server.cut["/big.zip"]

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(http_client, "write_json", full)
    assert main(["download", url]) == 2
    assert _error(capsys) == (
        f"disk full: no space left in {entry_dir(url)} for {url}; free some space or set ELMOKIT_CACHE "
        "to a folder on a larger disk"
    )
    assert "big.zip" not in _entry_files(url)


# -- archives ---------------------------------------------------------------------------------------
def test_many_small_members_of_zeros_are_refused_as_a_bomb(tmp_path):
    members = {"options.json": OPTIONS, "model.hdf5": WEIGHTS}
    members.update({f"pad/{i:02d}.bin": b"\0" * (1 << 20) for i in range(40)})
    path = tmp_path / "bomb.zip"
    path.write_bytes(_zip(members))
    assert path.stat().st_size < 500_000
    with pytest.raises(ArchiveError) as err:
        resolve_model(path)
    assert str(err.value).startswith(f"{path}: its members add up to 42,")
    assert str(err.value).endswith("(ratio over 20); refused as a zip bomb")
    assert not (tmp_path.parent / "elmokit-cache" / "archives").exists() or not any(
        (tmp_path.parent / "elmokit-cache" / "archives").rglob("*.bin")
    )


@pytest.mark.parametrize(
    ("names", "file_member", "folder_user"),
    [(("x", "x/y"), "x", "x/y"), (("x/y", "X"), "X", "x/y")],
)
def test_a_name_that_is_a_file_and_a_folder_is_refused(tmp_path, names, file_member, folder_user):
    path = tmp_path / "both.zip"
    path.write_bytes(_zip({name: b"data" for name in names}))
    with pytest.raises(ArchiveError) as err:
        unpack_zip(path, tmp_path / "out")
    assert str(err.value) == (
        f"{path}: member {file_member!r} is a file but {folder_user!r} uses it as a folder; refused"
    )
    assert not (tmp_path / "out").exists()


def test_a_full_disk_while_unpacking_is_one_line_naming_the_archive(tmp_path, monkeypatch):
    import builtins

    path = tmp_path / "model.zip"
    path.write_bytes(MODEL_ZIP)
    real_open = builtins.open

    class _Full(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fake_open(file, mode="r", *args, **kwargs):
        if mode == "xb":
            real_open(file, mode).close()
            return _Full()
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(archives, "open", fake_open, raising=False)
    with pytest.raises(OSError) as err:
        unpack_zip(path, tmp_path / "out")
    assert str(err.value) == (
        f"disk full: no space left in {tmp_path} to unpack {path} (No space left on device); free some "
        "space or set ELMOKIT_CACHE to a folder on a larger disk"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.zip"]  # no half-unpacked folder
    monkeypatch.undo()
    import shutil as real_shutil

    monkeypatch.setattr(
        archives.shutil, "disk_usage", lambda p: real_shutil._ntuple_diskusage(10**9, 10**9, 1000)
    )
    with pytest.raises(OSError) as err:
        unpack_zip(path, tmp_path / "out")
    needed = sum(i.file_size for i in zipfile.ZipFile(path).infolist())
    assert str(err.value) == (
        f"disk full: no space left in {tmp_path} to unpack {path} ({needed:,} bytes needed, 1,000 free); "
        "free some space or set ELMOKIT_CACHE to a folder on a larger disk"
    )
    assert not (tmp_path / "out").exists()
