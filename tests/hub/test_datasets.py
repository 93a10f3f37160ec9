"""`elmokit data list|sample|fetch` and elmokit.hub.datasets: the shipped samples (real, parseable,
packaged, each with its provenance note), the table of data sets, and downloads from a local
HTTP server on 127.0.0.1 (the one of tests/hub/test_download.py): a good data set, wrong checksums
(refused, nothing left in the folder or the cache), existing files (refused without --overwrite),
offline mode."""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from elmokit.base.task_data import read_conllu, read_sst
from elmokit.cli import main
from elmokit.hub import datasets, entries, file_kinds
from elmokit.hub.datasets import DATA_SETS, SAMPLES_DIR, SOURCE_NOTE, DataFile, DataSet, Download
from elmokit.probe import read_tagged

from ..conftest import running
from .test_download import _Server

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the table and the shipped samples -----------------------------------------------------------
def test_every_download_is_pinned_and_verified_before_it_is_used():
    for data_set in DATA_SETS:
        for data_file in data_set.files:
            download = data_file.download
            assert download.url.startswith("https://"), download.url
            # a checksum of the download itself, known before it is cached
            assert download.sha256 or download.md5, (data_set.name, data_file.name)
            assert download.kind in ("text", "gzip", "zip")
    ud = datasets.find_data_set("ud-ewt")
    assert all("/15d613d8447b3478787d4c278730a1e48a945efb/" in f.download.url for f in ud.files)
    assert all(f.sha256 == f.download.sha256 for f in ud.files)  # the publisher's own files
    conll2003 = datasets.find_data_set("conll2003")
    assert conll2003.files == () and conll2003.sample == ()  # Reuters text: neither shipped nor fetched
    assert "NIST" in conll2003.obtain and "eng.testb" in conll2003.obtain


def test_the_samples_are_small_real_parseable_and_packaged():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = project["tool"]["setuptools"]["package-data"]["elmokit"]
    package = SAMPLES_DIR.parent.parent
    total = 0
    for data_set in DATA_SETS:
        if not data_set.sample:
            assert not data_set.sample_dir.exists()
            continue
        assert set(data_set.sample) <= {f.name for f in data_set.files}  # the full set's file names
        for name in (*data_set.sample, SOURCE_NOTE):
            path = data_set.sample_dir / name
            total += path.stat().st_size
            relative = path.relative_to(package).as_posix()
            assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} is not package data"
            assert "/work/" not in path.read_text(encoding="utf-8")
        note = (data_set.sample_dir / SOURCE_NOTE).read_text(encoding="utf-8")
        assert data_set.homepage.rstrip("/") in note and f"elmokit data fetch {data_set.name}" in note
    assert total < 200_000
    conll = SAMPLES_DIR / "conll2000"
    pos = read_tagged(conll / "train.txt", "conll", 1)
    chunks = read_tagged(conll / "test.txt", "conll", 2)
    assert len(pos) == 80 and pos[0].tokens[:3] == ["Confidence", "in", "the"] and pos[0].tags[0] == "NN"
    assert len(chunks) == 30 and chunks[0].tags[0] == "B-NP"
    ud = SAMPLES_DIR / "ud-ewt"
    assert [len(read_conllu(ud / f"en_ewt-ud-{s}.conllu")) for s in ("train", "dev", "test")] == [25, 10, 10]
    assert read_conllu(ud / "en_ewt-ud-train.conllu")[0].tokens[:3] == ["Al", "-", "Zaman"]
    assert "CC BY-SA 4.0" in (ud / SOURCE_NOTE).read_text(encoding="utf-8")
    sst = SAMPLES_DIR / "sst"
    assert [len(read_sst(sst / f"{s}.txt")) for s in ("train", "dev", "test")] == [80, 25, 25]
    rows = {row["name"]: row for row in datasets.data_rows()}
    assert rows["sst"]["sample"] == {"train.txt": 80, "dev.txt": 25, "test.txt": 25}
    assert rows["ud-ewt"]["sample"]["en_ewt-ud-train.conllu"] == 25


def test_list_shows_names_sizes_licences_and_urls(capsys):
    assert main(["data", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "SAMPLE", "LICENCE", "URL"]
    rows = {line.split()[0]: line for line in lines[1:5]}
    assert set(rows) == {"conll2000", "ud-ewt", "sst", "conll2003"}
    assert "17.8 MB" in rows["ud-ewt"] and "CC BY-SA 4.0" in rows["ud-ewt"]
    assert rows["ud-ewt"].endswith("https://github.com/UniversalDependencies/UD_English-EWT")
    assert rows["sst"].split()[1:3] == ["3.0", "MB"]
    assert rows["conll2003"].split()[1:3] == ["-", "-"]
    assert main(["data", "list", "--json"]) == 0
    listed = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert [f["url"] for f in listed["conll2000"]["files"]] == [
        "https://www.clips.uantwerpen.be/conll2000/chunking/train.txt.gz",
        "https://www.clips.uantwerpen.be/conll2000/chunking/test.txt.gz",
    ]
    assert (
        listed["sst"]["files"][0]["download"]["sha256"]
        == datasets.find_data_set("sst").files[0].download.sha256
    )
    assert listed["conll2003"]["files"] == [] and "NIST" in listed["conll2003"]["obtain"]


def test_sample_copies_the_shipped_files_and_keeps_existing_ones(tmp_path, capsys):
    folder = tmp_path / "data" / "ud"  # made, with its parent
    assert main(["data", "sample", "ud-ewt", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == [str(folder / n) for n in (*datasets.find_data_set("ud-ewt").sample, SOURCE_NOTE)]
    assert "CC BY-SA 4.0" in out[-1]
    for name in ("en_ewt-ud-train.conllu", "en_ewt-ud-dev.conllu", "en_ewt-ud-test.conllu", SOURCE_NOTE):
        assert (folder / name).read_bytes() == (SAMPLES_DIR / "ud-ewt" / name).read_bytes()
    (folder / "en_ewt-ud-dev.conllu").write_text("mine\n")
    assert main(["data", "sample", "ud-ewt", str(folder)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"elmokit: error: {folder / 'en_ewt-ud-train.conllu'} exists; pass overwrite=True (--overwrite) to replace it\n"
    )
    assert (folder / "en_ewt-ud-dev.conllu").read_text() == "mine\n"  # kept
    assert main(["data", "sample", "ud-ewt", str(folder), "--overwrite"]) == 0
    assert (folder / "en_ewt-ud-dev.conllu").read_bytes() == (
        SAMPLES_DIR / "ud-ewt" / "en_ewt-ud-dev.conllu"
    ).read_bytes()
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*datasets.find_data_set("ud-ewt").sample, SOURCE_NOTE]
    )


def test_conll2003_and_unknown_names_are_one_line_errors(tmp_path, capsys):
    for command in ("sample", "fetch"):
        assert main(["data", command, "conll2003", str(tmp_path / "ner")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("elmokit: error: ") and err.count("\n") == 1
        assert "Reuters" in err and "https://trec.nist.gov/data/reuters/reuters.html" in err
    assert not (tmp_path / "ner").exists()
    with pytest.raises(SystemExit) as exit_:
        main(["data", "sample", "conll2001", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("elmokit: error: argument NAME: invalid choice: 'conll2001'") and err.count("\n") == 1
    )
    with pytest.raises(ValueError, match="no data set 'conll2001': the data sets are conll2000, ud-ewt, sst"):
        datasets.find_data_set("conll2001")


# -- fetch, against a local server ---------------------------------------------------------------
TEXT = b"Hello NN B-NP\nworld NN I-NP\n\n"
GZ_CONTENT = b"Gz NN B-NP\n\n"
GZ = gzip.compress(GZ_CONTENT, mtime=0)
MEMBER = b"(3 (2 Good) (3 film))\n"


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


ZIP = _zip({"trees/train.txt": MEMBER, "trees/other.txt": b"x\n"})


@pytest.fixture()
def server(network_allowed):
    """The files of a toy data set served from 127.0.0.1, a private cache, the network allowed."""
    srv = _Server()
    srv.files.update({"/d/a.txt": TEXT, "/d/b.txt.gz": GZ, "/d/trees.zip": ZIP})
    with running(srv):
        yield srv


def _toy(srv: _Server, **changes: str) -> DataSet:
    """A data set of a file as it is, a decompressed .gz and a zip member, served by ``srv``;
    ``changes`` replaces a file's expected SHA-256 (a: the download's, b: the decompressed one's)."""
    zipped = Download(srv.url("/d/trees.zip"), "zip", sha256=_sha256(ZIP), size=len(ZIP))
    return DataSet(
        name="toy",
        title="a toy data set",
        use="tests",
        homepage=srv.url("/d/"),
        licence="CC0",
        verified="the test's checksums",
        files=(
            DataFile(
                "a.txt",
                Download(srv.url("/d/a.txt"), "text", sha256=changes.get("a", _sha256(TEXT))),
                len(TEXT),
                1,
                changes.get("a", _sha256(TEXT)),
            ),
            DataFile(
                "b.txt",
                Download(srv.url("/d/b.txt.gz"), "gzip", md5=hashlib.md5(GZ).hexdigest()),
                len(GZ_CONTENT),
                1,
                changes.get("b", _sha256(GZ_CONTENT)),
                gunzip=True,
            ),
            DataFile("train.txt", zipped, len(MEMBER), 1, member="trees/train.txt"),
        ),
    )


def _use(monkeypatch, data_set: DataSet) -> None:
    monkeypatch.setattr(datasets, "DATA_SETS", (*DATA_SETS, data_set))


def _cached(srv: _Server, path: str) -> list[str]:
    entry = entries.entry_dir(srv.url(path))
    return sorted(p.name for p in entry.iterdir() if p.name != ".lock") if entry.exists() else []


def test_fetch_writes_the_verified_files_then_uses_the_cache(server, monkeypatch, tmp_path, capsys):
    _use(monkeypatch, _toy(server))
    folder = tmp_path / "toy"
    assert main(["data", "fetch", "toy", str(folder), "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [str(folder / n) for n in ("a.txt", "b.txt", "train.txt")] + [
        f"toy: a toy data set; licence: CC0; see {server.url('/d/')}"
    ]
    assert (folder / "a.txt").read_bytes() == TEXT
    assert (folder / "b.txt").read_bytes() == GZ_CONTENT  # decompressed
    assert (folder / "train.txt").read_bytes() == MEMBER  # the archive's member
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt", "b.txt", "train.txt"]  # no temporary file
    assert _cached(server, "/d/b.txt.gz") == ["b.txt.gz", "meta.json"]
    assert sorted(path for path, _ in server.requests) == ["/d/a.txt", "/d/b.txt.gz", "/d/trees.zip"]

    # an existing file is refused before any download, and kept
    (folder / "b.txt").write_text("mine\n")
    server.requests.clear()
    assert main(["data", "fetch", "toy", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"elmokit: error: {folder / 'a.txt'} exists; pass overwrite=True (--overwrite) to replace it\n"
    )
    assert (folder / "b.txt").read_text() == "mine\n" and server.requests == []

    # --overwrite: from the cache, without the network
    server.shutdown()
    assert main(["data", "fetch", "toy", str(folder), "--overwrite"]) == 0
    assert (folder / "b.txt").read_bytes() == GZ_CONTENT and server.requests == []


def test_a_download_with_the_wrong_checksum_is_refused_and_nothing_is_left(
    server, monkeypatch, tmp_path, capsys
):
    _use(monkeypatch, _toy(server, a="0" * 64))
    folder = tmp_path / "toy"
    assert main(["data", "fetch", "toy", str(folder), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"elmokit: error: {server.url('/d/a.txt')}: checksum mismatch: sha256 {_sha256(TEXT)} but the "
        f"publisher gives {'0' * 64}; nothing was cached\n"
    )
    assert not folder.exists()  # nothing written, not even the folder
    assert _cached(server, "/d/a.txt") == []


def test_a_decompressed_file_with_the_wrong_checksum_is_refused_and_forgotten(
    server, monkeypatch, tmp_path, capsys
):
    _use(monkeypatch, _toy(server, b="1" * 64))
    folder = tmp_path / "toy"
    folder.mkdir()
    assert main(["data", "fetch", "toy", str(folder), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"elmokit: error: {server.url('/d/b.txt.gz')}: b.txt made from it has sha256 ")
    assert err.endswith("it was removed from the download cache, and nothing was written\n")
    assert list(folder.iterdir()) == []  # a.txt, which was right, was not written either
    assert _cached(server, "/d/b.txt.gz") == []  # the next fetch downloads it again
    assert _cached(server, "/d/a.txt") == ["a.txt", "meta.json"]


def test_a_cut_gzip_download_is_refused(server, monkeypatch, tmp_path, capsys):
    server.files["/d/b.txt.gz"] = GZ[:-12]  # cut short: its md5 is given as that of the cut file
    data_set = _toy(server)
    cut = Download(server.url("/d/b.txt.gz"), "gzip", md5=hashlib.md5(GZ[:-12]).hexdigest())
    data_set = DataSet(**{**vars(data_set), "files": (DataFile("b.txt", cut, 1, 1, gunzip=True),)})
    _use(monkeypatch, data_set)
    assert main(["data", "fetch", "toy", str(tmp_path / "toy"), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"elmokit: error: {server.url('/d/b.txt.gz')}: not a whole gzip file (cut short); nothing was cached\n"
    )
    assert not (tmp_path / "toy").exists()


def test_a_cached_download_that_changed_is_noticed_and_fetched_again_with_force(
    server, monkeypatch, tmp_path, capsys
):
    _use(monkeypatch, _toy(server))
    folder = tmp_path / "toy"
    assert main(["data", "fetch", "toy", str(folder), "--quiet"]) == 0
    cached = entries.entry_dir(server.url("/d/a.txt")) / "a.txt"
    cached.write_bytes(TEXT.upper())  # the same size, other bytes
    capsys.readouterr()
    assert main(["data", "fetch", "toy", str(folder), "--overwrite", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"elmokit: error: cached file {cached} changed since it was downloaded from ")
    assert err.endswith("; run `elmokit data fetch toy DIR --force` to download it again\n")
    assert (folder / "a.txt").read_bytes() == TEXT  # the earlier, good files are kept
    assert main(["data", "fetch", "toy", str(folder), "--overwrite", "--force", "--quiet"]) == 0
    assert cached.read_bytes() == TEXT and (folder / "a.txt").read_bytes() == TEXT


def test_offline_fetch_says_what_to_do(server, monkeypatch, tmp_path, capsys):
    _use(monkeypatch, _toy(server))
    monkeypatch.setenv("ELMOKIT_OFFLINE", "1")
    assert main(["data", "fetch", "toy", str(tmp_path / "toy")]) == 2
    assert capsys.readouterr().err == (
        f"elmokit: error: ELMOKIT_OFFLINE=1 forbids downloading {server.url('/d/a.txt')} (it is not in "
        "the download cache): unset ELMOKIT_OFFLINE, or take the shipped sample (`elmokit data sample "
        "toy DIR`)\n"
    )
    assert server.requests == []


def test_the_data_file_kinds_of_the_transport(tmp_path):
    """gzip: whole and not cut; text: UTF-8 and not an HTML page."""
    check = file_kinds.wrong_kind
    path = tmp_path / "f"
    path.write_bytes(GZ)
    assert check(path, "gzip") is None
    path.write_bytes(GZ[:-12])
    assert check(path, "gzip") == "not a whole gzip file (cut short)"
    path.write_bytes(TEXT)
    assert check(path, "gzip") == "not a gzip file (it begins b'Hello NN B-NP\\nwo')"
    assert check(path, "text") is None
    path.write_bytes(b"  <!DOCTYPE html><html>Sign in</html>")
    assert check(path, "text") == "an HTML page, not a data file"
    path.write_bytes("caf\u00e9\n".encode("latin-1"))
    assert check(path, "text") == "not a UTF-8 text file (near byte 3)"
