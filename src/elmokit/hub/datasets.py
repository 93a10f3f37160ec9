"""The labelled data sets of the probes and the downstream tasks: what they are, where their
publishers keep them, and how elmokit gives them to a reader.

``DATA_SETS`` is the one table: for each data set its files, the publisher's URLs (pinned to a
release or a commit where the publisher has them), the checksums that are known, the licence
and the small sample shipped in the package (``examples/data/NAME/``, with a ``SOURCE.md``
note on where it comes from and its licence).

- ``copy_sample(name, folder)`` copies the shipped sample into ``folder``;
- ``fetch_data(name, folder)`` downloads the full files through ``elmokit.hub.transport`` (the
  download cache, resumable, each download checked against the checksums known before it is
  cached), makes the data files from them (as they are, decompressed from ``.gz``, or the
  member of a ``.zip``), checks each against its SHA-256 where it is known, and only then gives
  them their names in ``folder``: all of them, or none.

Neither replaces a file in ``folder`` unless ``overwrite`` is given. CoNLL-2003 is in the table
but cannot be downloaded or shipped: its text is Reuters' (research use under an agreement with
NIST), so ``fetch_data`` says how to obtain it instead.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..base.atomic import atomic_path, check_outputs_in
from .archives import ArchiveError, check_zip
from .cache import ENV_OFFLINE, offline
from .entries import ChecksumError, OfflineError, cached_file, entry_dir, normalize_url
from .file_kinds import Expected
from .shipped import PACKAGE_DIR, refuse_package_path
from .transport import fetch

__all__: list[str] = []

SAMPLES_DIR = PACKAGE_DIR / "examples" / "data"
SOURCE_NOTE = "SOURCE.md"  # the provenance and licence note beside each sample's files
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Download:
    """A file as its publisher serves it, and what is known of it before it is downloaded:
    ``kind`` is what ``elmokit.hub.file_kinds`` checks it to be ("text", "gzip" or "zip")."""

    url: str
    kind: str
    sha256: str | None = None
    md5: str | None = None
    size: int | None = None

    @property
    def expected(self) -> Expected:
        return Expected(size=self.size, sha256=self.sha256, md5=self.md5, kind=self.kind)


@dataclass(frozen=True)
class DataFile:
    """A file that ``fetch_data`` writes: ``name`` in the folder, made from ``download`` as it
    is, decompressed (``gunzip``) or as the zip archive's ``member``; it must have ``sha256``
    where that is known (None: the download's own checksum is all there is). ``size`` in bytes
    and ``sentences`` are what ``elmokit data list`` shows."""

    name: str
    download: Download
    size: int
    sentences: int
    sha256: str | None = None
    gunzip: bool = False
    member: str | None = None


@dataclass(frozen=True)
class DataSet:
    """One data set: its short ``name`` (``elmokit data fetch NAME``), what it is and what
    elmokit uses it for, its publisher's page, licence, how the download is verified, and its
    files (none: it cannot be downloaded; ``obtain`` says how to get it)."""

    name: str
    title: str
    use: str
    homepage: str
    licence: str
    files: tuple[DataFile, ...]
    verified: str
    obtain: str = ""
    sample: tuple[str, ...] = field(default=())  # the file names of the shipped sample
    one_per_line: bool = False  # a sentence per line (SST's trees), else blank-line-separated blocks

    @property
    def sample_dir(self) -> Path:
        return SAMPLES_DIR / self.name


_UD_COMMIT = "15d613d8447b3478787d4c278730a1e48a945efb"  # r2.16 + 7 commits (git describe)
_UD = f"https://raw.githubusercontent.com/UniversalDependencies/UD_English-EWT/{_UD_COMMIT}"
_CONLL2000 = "https://www.clips.uantwerpen.be/conll2000/chunking"
_SST_ZIP = Download(
    "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip",
    "zip",
    sha256="5c613a4f673fc74097d523a2c83f38e0cc462984d847b82c7aaf36b01cbbbfcc",
    size=789_539,
)


def _ud_file(name: str, sha256: str, size: int, sentences: int) -> DataFile:
    return DataFile(
        name, Download(f"{_UD}/{name}", "text", sha256=sha256, size=size), size, sentences, sha256
    )


DATA_SETS: tuple[DataSet, ...] = (
    DataSet(
        name="conll2000",
        title="CoNLL-2000 chunking (WSJ sections 15-18 and 20; word POS chunk)",
        use="elmokit probe: POS (--column 1) and chunks (--column 2)",
        homepage=f"{_CONLL2000}/",
        licence="none stated",
        files=(
            DataFile(
                "train.txt",
                Download(f"{_CONLL2000}/train.txt.gz", "gzip", md5="6969c2903a1f19a83569db643e43dcc8"),
                2_842_164,
                8_936,
                "82033cd7a72b209923a98007793e8f9de3abc1c8b79d646c50648eb949b87cea",
                gunzip=True,
            ),
            DataFile(
                "test.txt",
                Download(f"{_CONLL2000}/test.txt.gz", "gzip", md5="a916e1c2d83eb3004b38fc6fcd628939"),
                639_396,
                2_012,
                "73b7b1e565fa75a1e22fe52ecdf41b6624d6f59dacb591d44252bf4d692b1628",
                gunzip=True,
            ),
        ),
        verified="the publisher gives no checksum: each .gz is checked against the MD5 that torchtext "
        "records for it, and the decompressed file against the SHA-256 of NLTK's copy (whose MD5 "
        "torchtext records for the decompressed file)",
        sample=("train.txt", "test.txt"),
    ),
    DataSet(
        name="ud-ewt",
        title="Universal Dependencies English Web Treebank (CoNLL-U)",
        use="elmokit probe (UPOS: --format conllu --column 3) and elmokit task pos",
        homepage="https://github.com/UniversalDependencies/UD_English-EWT",
        licence="CC BY-SA 4.0",
        files=(
            _ud_file(
                "en_ewt-ud-train.conllu",
                "3fb78e2b55482c8ee00caa653af436c88c9e5bc9a73ce26e4ae3ddc79d2b7e7b",
                14_203_025,
                12_544,
            ),
            _ud_file(
                "en_ewt-ud-dev.conllu",
                "531a54ff90d6ab12201c5a50c3e78e6ddac4de69abc4bce5d275d3cd29efe2b6",
                1_805_545,
                2_001,
            ),
            _ud_file(
                "en_ewt-ud-test.conllu",
                "e266e515a0a7547657ed3d90d9ba46487d6bd251f27ad4269d4e8a427c8555cd",
                1_804_515,
                2_077,
            ),
            _ud_file(
                "LICENSE.txt", "b3d1b0f4c6ae151f7eb78738f46ebd5ee140f8a7f76501ba26af123140d35ae7", 20_014, 0
            ),
        ),
        verified=f"the files of the repository's commit {_UD_COMMIT[:12]} (r2.16 and 7 commits), each "
        "checked against its SHA-256",
        sample=("en_ewt-ud-train.conllu", "en_ewt-ud-dev.conllu", "en_ewt-ud-test.conllu"),
    ),
    DataSet(
        name="sst",
        title="Stanford Sentiment Treebank, fine-grained PTB trees (SST-5)",
        use="elmokit task sentiment (--binary: SST-2)",
        homepage="https://nlp.stanford.edu/sentiment/",
        licence="none stated",
        files=(
            DataFile("train.txt", _SST_ZIP, 2_160_058, 8_544, member="trees/train.txt"),
            DataFile("dev.txt", _SST_ZIP, 280_825, 1_101, member="trees/dev.txt"),
            DataFile("test.txt", _SST_ZIP, 559_614, 2_210, member="trees/test.txt"),
        ),
        verified="the publisher gives no checksum: trainDevTestTrees_PTB.zip is checked against the "
        "size and SHA-256 that two other projects record for it (Flux's model zoo and a pinned "
        "benchmark adapter), then its trees/ files are unpacked",
        sample=("train.txt", "dev.txt", "test.txt"),
        one_per_line=True,
    ),
    DataSet(
        name="conll2003",
        title="CoNLL-2003 English NER (eng.train, eng.testa, eng.testb; word POS chunk NER, IOB1)",
        use="elmokit probe (NER: --column 3) and elmokit task ner",
        homepage="https://www.clips.uantwerpen.be/conll2003/ner/",
        licence="research use (Reuters RCV1 text)",
        files=(),
        verified="",
        obtain="its text is the Reuters Corpus (RCV1), which Reuters licenses for research use "
        "through NIST, so elmokit neither ships nor downloads it: ask NIST for RCV1 "
        "(https://trec.nist.gov/data/reuters/reuters.html), then build eng.train, eng.testa and "
        "eng.testb with the shared task's annotations and scripts "
        "(https://www.clips.uantwerpen.be/conll2003/ner/); elmokit reads those three files as they are",
    ),
)


def find_data_set(name: str) -> DataSet:
    """The data set called ``name``; a ValueError lists the names there are."""
    for data_set in DATA_SETS:
        if data_set.name == name:
            return data_set
    names = ", ".join(d.name for d in DATA_SETS)
    raise ValueError(f"no data set {name!r}: the data sets are {names} (`elmokit data list`)")


def _check_folder(folder: Path, names: tuple[str, ...], overwrite: bool) -> None:
    """Refuse a ``folder`` that ``names`` may not be written into: the package or the download
    cache, a file, or one that holds any of them already (unless ``overwrite``)."""
    refuse_package_path(folder, "data folder")
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder")
    if folder.is_dir():
        check_outputs_in(folder, names, overwrite)


def copy_sample(name: str, folder: str | os.PathLike, *, overwrite: bool = False) -> list[Path]:
    """Copy the shipped sample of data set ``name`` (its files and ``SOURCE.md``) into
    ``folder`` (made if missing); returns the files written. An existing file is kept (a
    FileExistsError) unless ``overwrite``, and then nothing is written."""
    data_set = find_data_set(name)
    if not data_set.sample:
        raise ValueError(f"no sample of {name} is shipped: {data_set.obtain}")
    names = (*data_set.sample, SOURCE_NOTE)
    target = Path(folder)
    _check_folder(target, names, overwrite)
    target.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:  # every file is written beside its name, then all get their names
        for file_name in names:
            tmp = stack.enter_context(atomic_path(target / file_name, overwrite))
            shutil.copyfile(data_set.sample_dir / file_name, tmp)
    return [target / file_name for file_name in names]


def fetch_data(
    name: str,
    folder: str | os.PathLike,
    *,
    overwrite: bool = False,
    force: bool = False,
    progress: bool | None = None,
) -> list[Path]:
    """Download data set ``name`` from its publisher into ``folder`` (made if missing), verified
    (see the module docstring); returns the files written. ``force`` downloads again what is in
    the download cache. Raises ValueError (an unknown name, a data set elmokit cannot download),
    FileExistsError (a file in ``folder`` without ``overwrite``) or
    ``elmokit.hub.entries.DownloadError``, each with a one-line message; on any error no file
    in ``folder`` is written or changed."""
    data_set = find_data_set(name)
    if not data_set.files:
        raise ValueError(f"{name} cannot be downloaded: {data_set.obtain}")
    names = tuple(f.name for f in data_set.files)
    target = Path(folder)
    _check_folder(target, names, overwrite)
    downloads: dict[str, Path] = {}
    for data_file in data_set.files:  # SST's three files are members of one archive
        if data_file.download.url not in downloads:
            downloads[data_file.download.url] = _download(data_set, data_file.download, force, progress)
    target.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        for data_file in data_set.files:
            tmp = stack.enter_context(atomic_path(target / data_file.name, overwrite))
            _make(data_set, data_file, downloads[data_file.download.url], tmp)
    return [target / file_name for file_name in names]


def _download(data_set: DataSet, download: Download, force: bool, progress: bool | None) -> Path:
    """The cached file of ``download``, downloaded (verified) if needed; the messages name the
    command that fixes what went wrong."""
    again = f"run `elmokit data fetch {data_set.name} DIR --force` to download it again"
    if not force:
        try:
            cached = cached_file(download.url, download.expected)
        except ChecksumError as err:
            raise ChecksumError(str(err).split("; run `", 1)[0] + f"; {again}") from None
        if cached is not None:
            return cached
    if offline():
        where = "again" if force else "(it is not in the download cache)"
        raise OfflineError(
            f"{ENV_OFFLINE}=1 forbids downloading {download.url} {where}: unset {ENV_OFFLINE}, or "
            f"take the shipped sample (`elmokit data sample {data_set.name} DIR`)"
        )
    return fetch(download.url, download.expected, force=force, progress=progress)


def _make(data_set: DataSet, data_file: DataFile, source: Path, out: Path) -> None:
    """Write ``data_file`` from the downloaded ``source`` into ``out``, checking its SHA-256
    where it is known; a file that is not what it should be is a ChecksumError, and the
    download it came from is removed from the cache (the next fetch downloads it again)."""
    url = data_file.download.url
    digest = hashlib.sha256()
    try:
        with open(out, "wb") as sink:
            for chunk in _chunks(source, data_file):
                digest.update(chunk)
                sink.write(chunk)
    except _Damaged as err:
        _forget(url)
        raise ChecksumError(
            f"{url}: cannot make {data_file.name} from it ({err}); it was removed from the download "
            "cache, and nothing was written"
        ) from None
    if data_file.sha256 is not None and digest.hexdigest() != data_file.sha256:
        _forget(url)
        raise ChecksumError(
            f"{url}: {data_file.name} made from it has sha256 {digest.hexdigest()}, not "
            f"{data_file.sha256} ({data_set.verified}); it was removed from the download cache, "
            "and nothing was written"
        )


class _Damaged(Exception):
    """A downloaded file from which a data file cannot be made (the message says why)."""


def _chunks(source: Path, data_file: DataFile) -> Iterator[bytes]:
    """The bytes of ``data_file``, read from ``source`` as it is, decompressed or unpacked; a
    source that cannot be read so raises _Damaged."""
    try:
        with ExitStack() as stack:
            stream: IO[bytes] | gzip.GzipFile
            if data_file.gunzip:
                stream = stack.enter_context(gzip.open(source, "rb"))
            elif data_file.member is not None:
                check_zip(source)
                archive = stack.enter_context(zipfile.ZipFile(source))
                stream = stack.enter_context(archive.open(data_file.member))
            else:
                stream = stack.enter_context(open(source, "rb"))
            while chunk := stream.read(_CHUNK):
                yield chunk
    except KeyError:
        raise _Damaged(f"the archive has no member {data_file.member}") from None
    except (OSError, EOFError, zlib.error, zipfile.BadZipFile, ArchiveError) as err:
        raise _Damaged(" ".join(str(err).split()) or type(err).__name__) from None


def _forget(url: str) -> None:
    """Remove ``url``'s entry from the download cache."""
    shutil.rmtree(entry_dir(normalize_url(url)), ignore_errors=True)


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.0f} KB"


def data_rows() -> list[dict[str, Any]]:
    """Everything ``DATA_SETS`` says of each data set, as plain data (``elmokit data list --json``),
    with the size of the files ``fetch_data`` writes and of the shipped sample."""
    rows = []
    for d in DATA_SETS:
        sample = [d.sample_dir / n for n in (*d.sample, SOURCE_NOTE)] if d.sample else []
        rows.append(
            {
                "name": d.name,
                "title": d.title,
                "use": d.use,
                "homepage": d.homepage,
                "licence": d.licence,
                "size": sum(f.size for f in d.files) or None,
                "sample_size": sum(p.stat().st_size for p in sample) or None,
                "verified": d.verified or None,
                "obtain": d.obtain or None,
                "files": [
                    {
                        "name": f.name,
                        "url": f.download.url,
                        "from": "gunzip" if f.gunzip else (f"member {f.member}" if f.member else "as it is"),
                        "size": f.size,
                        "sentences": f.sentences or None,
                        "sha256": f.sha256,
                        "download": {
                            k: v for k, v in vars(f.download).items() if k != "url" and v is not None
                        },
                    }
                    for f in d.files
                ],
                "sample": {n: _sentences(d.sample_dir / n, d.one_per_line) for n in d.sample},
            }
        )
    return rows


def _sentences(path: Path, one_per_line: bool) -> int:
    """Sentences in a sample file: lines, or blank-line-separated blocks."""
    text = path.read_text(encoding="utf-8")
    if one_per_line:
        return sum(1 for line in text.splitlines() if line.strip())
    return sum(1 for block in text.split("\n\n") if block.strip() and not block.startswith("-DOCSTART-"))


def format_data_sets(rows: list[dict[str, Any]]) -> str:
    """The table ``elmokit data list`` prints."""
    table = [("NAME", "SIZE", "SAMPLE", "LICENCE", "URL")]
    for row in rows:
        table.append(
            (
                row["name"],
                _size(row["size"]) if row["size"] else "-",
                _size(row["sample_size"]) if row["sample_size"] else "-",
                row["licence"],
                row["homepage"],
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in table]
    lines.append("")
    lines += [f"{row['name']}: {row['title']}; {row['use']}" for row in rows]
    lines.append(
        "`elmokit data sample NAME DIR` copies the shipped sample, `elmokit data fetch NAME DIR` "
        "downloads the full data set from its publisher (verified)"
    )
    return "\n".join(lines)
