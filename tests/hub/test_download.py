"""Downloads and the cache against a local HTTP server on 127.0.0.1 (started here, serving files
made from the tiny fixture): cache hits without a network, resume after a cut or a killed
download, HTTP errors, short bodies, checksums, ELMOKIT_OFFLINE, zips that try to escape, and the
same vectors from a folder, a zip, a URL and an options + weights pair of URLs."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch

from elmokit import BiLM, batch_to_ids, resolve_model
from elmokit.cli import main
from elmokit.hub.archives import ArchiveError
from elmokit.hub.entries import ChecksumError, DownloadError, OfflineError, cached_file, entry_dir
from elmokit.hub.file_kinds import Expected
from elmokit.hub.transport import fetch

from ..conftest import TINY, LocalServer, running

OPTIONS = (TINY / "options.json").read_bytes()
WEIGHTS = (TINY / "lm_weights.hdf5").read_bytes()
VOCAB = (TINY / "vocab_test.txt").read_bytes()
SENTENCES = [["The", "cat", "sat", "."], ["Ein", "Satz", "über", "nichts"]]


def _zip(members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


NLPL_ZIP = _zip({"options.json": OPTIONS, "model.hdf5": WEIGHTS, "vocab.txt": VOCAB})
BIG = _zip({"x": os.urandom(299_900)}, zipfile.ZIP_STORED)  # 300,000 bytes that do not compress
assert len(BIG) == 300_000


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        srv = self.server
        srv.requests.append((self.path, self.headers.get("Range")))
        if self.path in srv.status:
            self.send_error(srv.status[self.path])
            return
        data = srv.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
        start = 0
        wanted = self.headers.get("Range")
        if wanted and srv.ranges and self.headers.get("If-Range") in (None, etag):
            start = int(wanted.removeprefix("bytes=").rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("ETag", etag)
        self.end_headers()
        body = data[start:]
        if self.path in srv.cut:  # send part of the body, then close: Content-Length is not met
            body = body[: srv.cut[self.path]]
        if self.path in srv.stall:  # send half, then wait (the test kills the client meanwhile)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            srv.stall[self.path].wait(20)
            self.close_connection = True
            return
        self.wfile.write(body)
        self.close_connection = True


class _Server(LocalServer):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.files: dict[str, bytes] = {}
        self.status: dict[str, int] = {}
        self.cut: dict[str, int] = {}
        self.stall: dict[str, threading.Event] = {}
        self.ranges = True
        self.requests: list[tuple[str, str | None]] = []


@pytest.fixture()
def server(network_allowed):
    """A served tiny model, a private cache, and the network allowed (127.0.0.1 only)."""
    srv = _Server()
    srv.files.update(
        {
            "/m/209.zip": NLPL_ZIP,
            "/m/options.json": OPTIONS,
            "/m/weights.hdf5": WEIGHTS,
            "/big.zip": BIG,
        }
    )
    with running(srv):
        yield srv
        for event in srv.stall.values():  # a stalled answer ends, so the server can stop
            event.set()


def _layers(bilm) -> torch.Tensor:
    with torch.no_grad():
        return bilm(batch_to_ids(SENTENCES)).layers


def _leftovers(url: str) -> list[str]:
    """The files of ``url``'s cache entry but its lock file (which old filelock versions delete)."""
    entry = entry_dir(url)
    return sorted(p.name for p in entry.iterdir() if p.name != ".lock") if entry.exists() else []


# -- downloads -----------------------------------------------------------------------------------
def test_download_then_cache_hit_without_the_server(server):
    url = server.url("/big.zip")
    path = fetch(url, progress=False)
    assert path.read_bytes() == server.files["/big.zip"]
    meta = json.loads((path.parent / "meta.json").read_text())
    assert meta["url"] == url and meta["size"] == 300_000
    assert meta["sha256"] == meta["first_sha256"] == hashlib.sha256(server.files["/big.zip"]).hexdigest()
    assert _leftovers(url) == ["big.zip", "meta.json"]  # no partial file
    server.shutdown()
    server.server_close()  # no network from here on
    assert fetch(url, progress=False) == path
    assert len(server.requests) == 1


def test_a_cut_body_is_refused_then_resumed_with_a_range_request(server):
    url, data = server.url("/big.zip"), server.files["/big.zip"]
    server.cut["/big.zip"] = 120_000
    with pytest.raises(DownloadError) as err:
        fetch(url, progress=False)
    assert str(err.value) == (
        f"download of {url} was cut short: 120,000 of 300,000 bytes received (the server closed the "
        "connection early); the partial download is kept, run again to resume"
    )
    assert "big.zip" not in _leftovers(url) and (entry_dir(url) / ".big.zip.part").stat().st_size == 120_000
    del server.cut["/big.zip"]
    assert fetch(url, progress=False).read_bytes() == data
    assert server.requests[-1] == ("/big.zip", "bytes=120000-")
    assert _leftovers(url) == ["big.zip", "meta.json"]


def test_a_server_without_ranges_restarts_the_download(server):
    url, data = server.url("/big.zip"), server.files["/big.zip"]
    server.cut["/big.zip"] = 50_000
    with pytest.raises(DownloadError, match="cut short: 50,000 of 300,000 bytes"):
        fetch(url, progress=False)
    del server.cut["/big.zip"]
    server.ranges = False
    assert fetch(url, progress=False).read_bytes() == data  # 200 to the Range request: from byte 0
    assert server.requests[-1] == ("/big.zip", "bytes=50000-")


def test_a_killed_download_leaves_no_file_under_its_name_and_resumes(server):
    url, data = server.url("/big.zip"), server.files["/big.zip"]
    release = server.stall["/big.zip"] = threading.Event()
    part = entry_dir(url) / ".big.zip.part"
    child = subprocess.Popen(
        [sys.executable, "-c", f"from elmokit.hub.transport import fetch; fetch({url!r}, progress=False)"],
        env={**os.environ},
    )
    try:
        deadline = time.monotonic() + 60
        while not (part.is_file() and part.stat().st_size == 150_000) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert part.stat().st_size == 150_000
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    release.set()
    del server.stall["/big.zip"]
    assert not (entry_dir(url) / "big.zip").exists() and not (entry_dir(url) / "meta.json").exists()
    assert fetch(url, progress=False).read_bytes() == data
    assert server.requests[-1] == ("/big.zip", "bytes=150000-")


@pytest.mark.parametrize(("status", "reason"), [(404, "Not Found"), (500, "Internal Server Error")])
def test_http_errors_are_one_line_with_status_and_url(server, status, reason):
    server.status["/m/options.json"] = status
    url = server.url("/m/options.json")
    with pytest.raises(DownloadError) as err:
        fetch(url, progress=False)
    assert str(err.value) == f"HTTP {status} {reason} for {url}"
    assert main(["download", url]) == 2


def test_no_network_is_one_line(server, capsys):
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    url = f"http://127.0.0.1:{port}/m/options.json"
    assert main(["download", url]) == 2
    assert (
        capsys.readouterr().err
        == f"elmokit: error: cannot download {url}: 127.0.0.1 refused the connection\n"
    )


def test_checksum_and_size_mismatches_are_refused_and_nothing_is_cached(server):
    url = server.url("/m/weights.hdf5")
    good = hashlib.sha256(WEIGHTS).hexdigest()
    with pytest.raises(ChecksumError) as err:
        fetch(url, Expected(sha256="0" * 64), progress=False)
    assert str(err.value) == (
        f"{url}: checksum mismatch: sha256 {good} but the publisher gives {'0' * 64}; nothing was cached"
    )
    assert _leftovers(url) == []
    with pytest.raises(
        ChecksumError, match=f"the server sends {len(WEIGHTS):,} bytes but the publisher gives 10"
    ):
        fetch(url, Expected(size=10), progress=False)
    with pytest.raises(ChecksumError, match=r"not a JSON file \(it begins b'\\x89HDF"):
        fetch(url, Expected(kind="json"), progress=False)  # e.g. a weight file given as options
    assert _leftovers(url) == []
    md5 = hashlib.md5(WEIGHTS).hexdigest()
    assert fetch(
        url, Expected(sha256=good, md5=md5, size=len(WEIGHTS), kind="hdf5"), progress=False
    ).is_file()


def test_a_cached_file_that_changed_is_noticed(server):
    url = server.url("/m/options.json")
    path = fetch(url, progress=False)
    path.write_bytes(OPTIONS.replace(b"2", b"3"))  # same size, other bytes
    with pytest.raises(ChecksumError, match=f"cached file {path} changed since it was downloaded from {url}"):
        fetch(url, progress=False)
    assert fetch(url, force=True, progress=False).read_bytes() == OPTIONS
    assert cached_file(url) == path


def test_a_full_disk_is_one_line(server, monkeypatch):
    import shutil as real_shutil

    from elmokit.hub import http_client

    url = server.url("/big.zip")
    monkeypatch.setattr(
        http_client.shutil, "disk_usage", lambda path: real_shutil._ntuple_diskusage(10**9, 10**9, 1000)
    )
    with pytest.raises(
        DownloadError, match=rf"^disk full: {url} needs 300,000 more bytes but \S+ has 1,000 free"
    ):
        fetch(url, progress=False)
    assert "big.zip" not in _leftovers(url)


def test_offline_uses_the_cache_and_names_what_is_missing(server, monkeypatch):
    url, missing = server.url("/m/options.json"), server.url("/m/weights.hdf5")
    path = fetch(url, progress=False)
    monkeypatch.setenv("ELMOKIT_OFFLINE", "1")
    before = len(server.requests)
    assert fetch(url, progress=False) == path
    with pytest.raises(OfflineError) as err:
        fetch(missing, progress=False)
    assert str(err.value).startswith(f"{missing} is not in the download cache and ELMOKIT_OFFLINE=1 forbids")
    assert f"copy the cache folder {entry_dir(missing)} to the same place here" in str(err.value)
    assert len(server.requests) == before  # nothing was asked of the network


def test_two_threads_fetching_one_url_download_it_once(server):
    url = server.url("/big.zip")
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(fetch(url, progress=False))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and results[0].read_bytes() == server.files["/big.zip"]
    assert [r for r in server.requests if r[0] == "/big.zip"] == [("/big.zip", None)]


def test_progress_bar_shows_size_and_speed(server, capsys):
    fetch(server.url("/big.zip"), progress=True)
    err = capsys.readouterr().err
    assert "big.zip" in err and "293k/293k" in err and "B/s" in err


# -- models from archives and URLs ---------------------------------------------------------------
def test_a_model_from_zip_url_and_url_pair_gives_the_folders_vectors(server, tmp_path):
    folder = _layers(BiLM.from_pretrained(TINY))
    archive = tmp_path / "209.zip"
    archive.write_bytes(NLPL_ZIP)
    source = resolve_model(archive)
    assert (source.origin, source.kind, source.weight_file.name) == ("archive", "bilm", "model.hdf5")
    assert source.extras == {"vocab": source.folder / "vocab.txt"}
    assert torch.equal(_layers(BiLM.from_pretrained(archive)), folder)
    url = server.url("/m/209.zip")
    assert torch.equal(_layers(BiLM.from_pretrained(url)), folder)
    assert resolve_model(url).folder == entry_dir(url) / "unpacked"
    pair = BiLM.load(*resolve_model(server.url("/m/options.json"), server.url("/m/weights.hdf5")).files())
    assert torch.equal(_layers(pair), folder)
    requests = len(server.requests)
    assert torch.equal(_layers(BiLM.from_pretrained(url)), folder) and len(server.requests) == requests  # cached


def test_a_forced_download_of_a_changed_archive_replaces_what_was_unpacked(server, capsys):
    url = server.url("/m/209.zip")
    first = resolve_model(url)
    assert first.extras["vocab"].read_bytes() == VOCAB
    server.files["/m/209.zip"] = _zip(
        {"options.json": OPTIONS, "model.hdf5": WEIGHTS, "vocab.txt": b"<S>\n</S>\n"}
    )
    assert main(["download", url, "--force", "--quiet"]) == 0
    assert f"elmokit: warning: {url} changed since its first download (sha256 " in capsys.readouterr().err
    assert resolve_model(url).extras["vocab"].read_bytes() == b"<S>\n</S>\n"
    meta = json.loads((entry_dir(url) / "meta.json").read_text())
    assert meta["first_sha256"] == hashlib.sha256(NLPL_ZIP).hexdigest() != meta["sha256"]


def test_cli_embeds_with_a_model_url(server, tmp_path):
    import h5py

    text = tmp_path / "in.txt"
    text.write_text("The cat sat .\n", encoding="utf-8")
    outputs = []
    for model in (str(TINY), server.url("/m/209.zip")):
        out = tmp_path / f"out{len(outputs)}.hdf5"
        assert main(["embed", str(text), str(out), "--model", model, "--quiet", "--device", "cpu"]) == 0
        with h5py.File(out, "r") as f:
            outputs.append(f["0"][()])
    assert (outputs[0] == outputs[1]).all()


def _bad_zip(tmp_path: Path, name: str, **attrs) -> Path:
    path = tmp_path / f"bad{len(list(tmp_path.glob('bad*')))}.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("options.json", OPTIONS)
        info = zipfile.ZipInfo(name)
        for key, value in attrs.items():
            setattr(info, key, value)
        archive.writestr(info, b"x" * 10)
    return path


@pytest.mark.parametrize(
    ("member", "attrs", "message"),
    [
        ("../evil", {}, "leads outside the archive's folder ('..'); refused"),
        ("a/../../evil", {}, "leads outside the archive's folder ('..'); refused"),
        ("/abs/evil", {}, "has an absolute path; refused"),
        ("C:/evil", {}, "has an absolute path; refused"),
        ("link", {"external_attr": (stat.S_IFLNK | 0o777) << 16}, "is a symbolic link; refused"),
        ("options.json", {}, "appears twice; refused"),
    ],
)
def test_zips_that_escape_or_deceive_are_refused(tmp_path, monkeypatch, member, attrs, message):
    import warnings

    cache = tmp_path / "cache"
    monkeypatch.setenv("ELMOKIT_CACHE", str(cache))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name
        archive = _bad_zip(tmp_path, member, **attrs)
    with pytest.raises(ArchiveError) as err:
        resolve_model(archive)
    assert str(err.value) == f"{archive}: member {member!r} {message}"
    assert not list(tmp_path.parent.rglob("*evil*")) and not cache.exists()  # nothing was unpacked


def test_a_zip_bomb_is_refused(tmp_path):
    path = tmp_path / "bomb.zip"
    path.write_bytes(_zip({"options.json": OPTIONS, "model.hdf5": b"\0" * (8 << 20)}))
    with pytest.raises(
        ArchiveError, match=r"member 'model.hdf5' claims 8,388,608 bytes from [\d,]+ compressed"
    ):
        resolve_model(path)


def _bad_tar(tmp_path: Path, name: str, kind: bytes, mode: str = "w:gz") -> Path:
    path = tmp_path / f"bad{len(list(tmp_path.glob('bad*')))}.tar.gz"
    with tarfile.open(path, mode) as archive:
        info = tarfile.TarInfo("options.json")
        info.size = len(OPTIONS)
        archive.addfile(info, io.BytesIO(OPTIONS))
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = "options.json" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
        info.size = 10 if kind == tarfile.REGTYPE else 0
        archive.addfile(info, io.BytesIO(b"x" * 10) if kind == tarfile.REGTYPE else None)
    return path


@pytest.mark.parametrize(
    ("member", "kind", "message"),
    [
        ("../evil", tarfile.REGTYPE, "leads outside the archive's folder ('..'); refused"),
        ("/abs/evil", tarfile.REGTYPE, "has an absolute path; refused"),
        ("link", tarfile.SYMTYPE, "is a symbolic link; refused"),
        ("link", tarfile.LNKTYPE, "is a hard link; refused"),
        ("dev", tarfile.CHRTYPE, "is not a regular file or folder; refused"),
        ("fifo", tarfile.FIFOTYPE, "is not a regular file or folder; refused"),
        ("options.json", tarfile.REGTYPE, "appears twice; refused"),
        ("options.json/x", tarfile.REGTYPE, None),
    ],
)
def test_tars_that_escape_or_deceive_are_refused(tmp_path, monkeypatch, member, kind, message):
    cache = tmp_path / "cache"
    monkeypatch.setenv("ELMOKIT_CACHE", str(cache))
    archive = _bad_tar(tmp_path, member, kind)
    with pytest.raises(ArchiveError) as err:
        resolve_model(archive)
    if message is None:  # a file used as a folder
        assert str(err.value) == (
            f"{archive}: member 'options.json' is a file but {member!r} uses it as a folder; refused"
        )
    else:
        assert str(err.value) == f"{archive}: member {member!r} {message}"
    assert not list(tmp_path.parent.rglob("*evil*")) and not cache.exists()  # nothing was unpacked


def test_tar_archives_of_each_compression_load_and_a_cut_one_is_refused(server, tmp_path):
    members = {"slovenian/options.json": OPTIONS, "slovenian/slovenian-elmo-weights.hdf5": WEIGHTS}
    expected = _layers(BiLM.from_pretrained(TINY))
    for suffix, mode in ((".tar", "w"), (".tar.gz", "w:gz"), (".tar.bz2", "w:bz2"), (".tar.xz", "w:xz")):
        path = tmp_path / f"model{suffix}"
        with tarfile.open(path, mode) as archive:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        assert torch.equal(_layers(BiLM.from_pretrained(path)), expected), suffix
        server.files[f"/m/model{suffix}"] = path.read_bytes()
        assert torch.equal(_layers(BiLM.from_pretrained(server.url(f"/m/model{suffix}"))), expected), suffix
    server.files["/m/cut.tar.gz"] = server.files["/m/model.tar.gz"][:-100]
    cut = r"/m/cut.tar.gz: not a readable tar archive .*; nothing was cached"
    with pytest.raises(ChecksumError, match=cut):
        resolve_model(server.url("/m/cut.tar.gz"))


def test_a_zip_of_a_folder_without_vocab_loads(tmp_path):
    """SeqVec's zip holds a folder (uniref50_v2/); NLPL archives may lack vocab.txt (simple_elmo#9)."""
    path = tmp_path / "seqvec.zip"
    path.write_bytes(_zip({"uniref50_v2/options.json": OPTIONS, "uniref50_v2/weights.hdf5": WEIGHTS}))
    source = resolve_model(path)
    assert source.folder.name == "uniref50_v2" and source.extras == {}
    assert torch.equal(_layers(BiLM.from_pretrained(path)), _layers(BiLM.from_pretrained(TINY)))


# -- the CLI -------------------------------------------------------------------------------------
def test_cli_download_of_a_known_model_and_models_listing(server, monkeypatch, capsys):
    from elmokit.hub import registry

    tiny = registry.KnownModel(
        name="tiny-test",
        language="en",
        description="the tiny fixture, served locally",
        publisher="tests",
        files=(
            registry.RemoteFile(
                server.url("/m/209.zip"), "archive", sha256=hashlib.sha256(NLPL_ZIP).hexdigest()
            ),
        ),
        source="tests",
        dims=32,
    )
    monkeypatch.setattr(registry, "KNOWN_MODELS", (tiny, *registry.KNOWN_MODELS))
    assert main(["models"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NAME", "LANG", "DIM", "SIZE", "PUBLISHER", "LICENCE", "CACHED", "URL"]
    assert out[3].split() == ["tiny-test", "en", "32", "-", "tests", "-", "no", server.url("/m/209.zip")]
    assert main(["download", "tiny-test", "--quiet"]) == 0
    folder = entry_dir(server.url("/m/209.zip")) / "unpacked"
    assert capsys.readouterr().out == f"tiny-test -> {folder}\n"
    assert main(["models", "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["name"] == "tiny-test")
    assert row["cached"] == "yes" and row["size"] == len(NLPL_ZIP)
    assert main(["download", server.url("/m/options.json")]) == 0
    assert (
        capsys.readouterr().out
        == f"{server.url('/m/options.json')} -> {entry_dir(server.url('/m/options.json')) / 'options.json'}\n"
    )
    assert main(["download", "no-such-model"]) == 2
    assert capsys.readouterr().err == (
        "elmokit: error: 'no-such-model' is neither a known model, a URL nor hf://owner/name; "
        "`elmokit models` lists the known models\n"
    )
