"""Model archives, checked and unpacked safely: .zip (as the NLPL repository publishes them) and
tar, plain or compressed with gzip, bzip2 or xz (.tar.gz, .tgz, .tar.bz2, .tar.xz: CLARIN.SI's
EMBEDDIA models, ELMoForManyLangs' simplified-Chinese model).

An archive is data from anywhere. Before anything is written, every member is checked: no
absolute path, drive letter or ``..`` (nothing lands outside the target folder), no link or
device, no encryption, no duplicate name, no name that is both a file and a folder (``x`` and
``x/y``), and sizes within bounds: per member and for the whole archive (a zip bomb declares
absurd sizes or compression ratios, or many members that each look harmless), and no more than
the disk holds. A tar member may also not be a hard link; a tar archive has no per-member
compressed size, so only the whole archive's ratio is checked. A full disk or another failure
while unpacking is one line naming the archive. While unpacking, no member may produce more
bytes than it declares, and zipfile checks each CRC (gzip, bzip2 and xz check their streams).
Members are unpacked into a fresh temporary folder beside the target that is renamed into place
only when complete, so a crash or Ctrl-C leaves no half-unpacked model; a leftover temporary
folder of a killed process is removed by the next unpack.
"""

from __future__ import annotations

import errno
import lzma
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO

from ..base.atomic import _alive

__all__: list[str] = []

MAX_MEMBERS = 10_000
MAX_TOTAL_BYTES = 64 * 2**30  # the largest ELMo archives are a few GB
MAX_RATIO = 200  # uncompressed / compressed; HDF5 weights compress ~1.1x, text ~4x, zip bombs >1000x
_RATIO_FLOOR = 1 << 20  # members smaller than this are not ratio-checked
MAX_TOTAL_RATIO = 20  # all members / the archive's size: model archives are under 2 (weights ~1.1x)
_TOTAL_RATIO_FLOOR = 16 << 20  # archives that unpack to less than this are not ratio-checked
_TEMP_PREFIX = ".unpacking-"
UNPACKED = "unpacked"  # the folder of the cache an archive is unpacked into (elmokit.hub.resolve; manylangs)


class ArchiveError(ValueError):
    """An archive that elmokit will not unpack; the message names the archive and the member."""


def check_zip(path: str | os.PathLike) -> list[zipfile.ZipInfo]:
    """The members of a zip archive, after checking that unpacking them is safe (see the module
    docstring); raises ArchiveError naming the first problem."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except zipfile.BadZipFile as err:
        raise ArchiveError(f"{path}: not a readable zip archive ({err})") from None
    if len(members) > MAX_MEMBERS:
        raise ArchiveError(f"{path}: {len(members):,} members, more than the {MAX_MEMBERS:,} allowed")
    seen: set[str] = set()
    total = 0
    for info in members:
        name = info.filename
        where = _check_name(path, name, seen)
        mode = info.external_attr >> 16
        kind = stat.S_IFMT(mode)
        if stat.S_ISLNK(mode):
            raise ArchiveError(f"{where} is a symbolic link; refused")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise ArchiveError(f"{where} is not a regular file or folder; refused")
        if info.flag_bits & 0x1:
            raise ArchiveError(f"{where} is encrypted; refused")
        total += info.file_size
        _check_total(path, total)
        if info.file_size > _RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise ArchiveError(
                f"{where} claims {info.file_size:,} bytes from {info.compress_size:,} compressed "
                f"(ratio over {MAX_RATIO}); refused as a zip bomb"
            )
    _check_total_ratio(path, total)
    _check_files_and_folders(path, [(m.filename, m.is_dir()) for m in members])
    return members


def check_tar(path: str | os.PathLike) -> list[tarfile.TarInfo]:
    """The members of a tar archive (plain, gzip, bzip2 or xz), after checking that unpacking
    them is safe (see the module docstring): a pass over the whole archive, which also finds
    one that is cut short. Raises ArchiveError naming the first problem."""
    path = Path(path)
    members: list[tarfile.TarInfo] = []
    seen: set[str] = set()
    total = 0
    try:
        with tarfile.open(path, "r|*") as archive:
            for info in archive:
                if len(members) == MAX_MEMBERS:
                    raise ArchiveError(f"{path}: more than the {MAX_MEMBERS:,} members allowed")
                where = _check_name(path, info.name, seen)
                if info.issym() or info.islnk():
                    raise ArchiveError(f"{where} is a {'symbolic' if info.issym() else 'hard'} link; refused")
                if not (info.isreg() or info.isdir()):
                    raise ArchiveError(f"{where} is not a regular file or folder; refused")
                total += info.size if info.isreg() else 0
                _check_total(path, total)
                members.append(info)
    except TAR_ERRORS as err:
        raise ArchiveError(f"{path}: not a readable tar archive ({err or type(err).__name__})") from None
    _check_total_ratio(path, total)
    _check_files_and_folders(path, [(m.name, m.isdir()) for m in members])
    return members


def is_tar(path: str | os.PathLike) -> bool:
    """Whether ``path`` begins as a tar archive (plain, gzip, bzip2 or xz): its first header
    reads; ``check_tar`` reads the rest."""
    try:
        return tarfile.is_tarfile(path)
    except (*TAR_ERRORS, ValueError):
        return False


# what reading a damaged or cut tar raises: tarfile's errors, a stream's end, and the
# decompressors' own (bz2 raises OSError)
TAR_ERRORS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError)


def _check_name(path: Path, name: str, seen: set[str]) -> str:
    """Refuse a member name that is absolute, leads outside (``..``), is empty or was seen
    before (``seen`` gets it); returns "ARCHIVE: member NAME" for the caller's messages."""
    parts = _parts(name)
    where = f"{path}: member {name!r}"
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise ArchiveError(f"{where} has an absolute path; refused")
    if ".." in parts:
        raise ArchiveError(f"{where} leads outside the archive's folder ('..'); refused")
    if not parts:
        raise ArchiveError(f"{where} has an empty name; refused")
    key = "/".join(parts).casefold()
    if key in seen:
        raise ArchiveError(f"{where} appears twice; refused")
    seen.add(key)
    return where


def _check_total(path: Path, total: int) -> None:
    if total > MAX_TOTAL_BYTES:
        raise ArchiveError(
            f"{path}: members add up to more than {MAX_TOTAL_BYTES / 2**30:.0f} GiB unpacked; refused"
        )


def _check_total_ratio(path: Path, total: int) -> None:
    if total > _TOTAL_RATIO_FLOOR and total > MAX_TOTAL_RATIO * max(path.stat().st_size, 1):
        raise ArchiveError(
            f"{path}: its members add up to {total:,} bytes from a {path.stat().st_size:,}-byte archive "
            f"(ratio over {MAX_TOTAL_RATIO}); refused as a zip bomb"
        )


def _check_files_and_folders(path: Path, members: list[tuple[str, bool]]) -> None:
    """Refuse a name that is a file member and also the folder of another member (``x`` and
    ``x/y``): unpacking one would fail on the other. ``members``: (name, is a folder)."""
    files = {"/".join(_parts(name)).casefold(): name for name, is_dir in members if not is_dir}
    for name, _ in members:
        parts = _parts(name)
        for depth in range(1, len(parts)):  # ("x" and "x/" are one name: refused as a duplicate)
            folder = "/".join(parts[:depth]).casefold()
            if folder in files:
                raise ArchiveError(
                    f"{path}: member {files[folder]!r} is a file but {name!r} uses it as a folder; refused"
                )


def unpack_archive(path: str | os.PathLike, target: str | os.PathLike) -> Path:
    """``unpack_zip`` or ``unpack_tar``, as ``path`` is a zip or a tar archive."""
    if zipfile.is_zipfile(path) or not is_tar(path):
        return unpack_zip(path, target)  # a file that is neither: zipfile says why
    return unpack_tar(path, target)


def unpack_zip(path: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Unpack the archive ``path`` into the folder ``target`` (which must not exist yet; if it
    does, it is taken as this archive's earlier unpacking and returned as it is). Atomic: the
    members go to a temporary folder beside ``target`` that is renamed to it when complete."""
    path, target = Path(path), Path(target)
    if target.is_dir():
        return target
    members = check_zip(path)

    def write(temp: Path) -> None:
        try:
            with zipfile.ZipFile(path) as archive:
                for info in members:
                    _unpack_zip_member(archive, info, temp, path)
        except zipfile.BadZipFile as err:
            raise ArchiveError(f"{path}: damaged archive ({err})") from None

    return _unpack(path, target, sum(m.file_size for m in members), write)


def unpack_tar(path: str | os.PathLike, target: str | os.PathLike) -> Path:
    """``unpack_zip`` for a tar archive (plain, gzip, bzip2 or xz): only its regular files and
    folders, checked by ``check_tar``, are written (no owners, modes or times are taken)."""
    path, target = Path(path), Path(target)
    if target.is_dir():
        return target
    members = check_tar(path)

    def write(temp: Path) -> None:
        try:
            with tarfile.open(path, "r|*") as archive:
                for index, info in enumerate(archive):
                    if index >= len(members) or (info.name, info.size, info.type) != (
                        members[index].name,
                        members[index].size,
                        members[index].type,
                    ):
                        raise ArchiveError(f"{path}: changed while it was unpacked; refused")
                    _unpack_tar_member(archive, info, temp, path)
        except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as err:
            raise ArchiveError(f"{path}: damaged archive ({err or type(err).__name__})") from None

    return _unpack(path, target, sum(m.size for m in members if m.isreg()), write)


def _unpack(path: Path, target: Path, needed: int, write: Callable[[Path], None]) -> Path:
    """Run ``write`` (the members of ``path`` into a folder) on a fresh temporary folder beside
    ``target``, then rename it to ``target``; ``needed``: the bytes the members take."""
    parent = target.parent
    temp: Path | None = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(parent)
        free = shutil.disk_usage(parent).free
        if needed > free:
            raise OSError(errno.ENOSPC, f"{needed:,} bytes needed, {free:,} free")
        temp = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-", dir=parent))
        write(temp)
        try:
            os.replace(temp, target)
        except OSError:
            if not target.is_dir():  # not another process that finished first
                raise
    except OSError as err:
        raise type(err)(_unpack_failure(path, parent, err)) from None
    finally:
        if temp is not None and temp.exists():
            shutil.rmtree(temp, ignore_errors=True)
    return target


def _unpack_failure(path: Path, parent: Path, err: OSError) -> str:
    """One line: why ``path`` could not be unpacked into ``parent``."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"disk full: no space left in {parent} to unpack {path} ({err.strerror}); free some space "
            "or set ELMOKIT_CACHE to a folder on a larger disk"
        )
    where = f" ({err.filename})" if err.filename else ""
    return f"cannot unpack {path} into {parent}: {err.strerror or err}{where}"


def _parts(name: str) -> list[str]:
    """The path components of a member name ("/" and "\\" both separate; "." dropped)."""
    return [p for p in PurePosixPath(name.replace("\\", "/")).parts if p not in ("", ".")]


def _unpack_member(
    name: str, is_dir: bool, size: int, open_member: Callable[[], IO[bytes]], root: Path, path: Path
) -> None:
    """Write the member ``name`` of the archive ``path`` (a folder, or a file of ``size`` bytes
    that ``open_member`` opens) under ``root``, never outside it."""
    out = root.joinpath(*_parts(name))
    if os.path.commonpath([root, out]) != str(root):  # checked by check_zip/check_tar; never outside
        raise ArchiveError(f"{path}: member {name!r} leads outside the archive's folder")
    if is_dir:
        out.mkdir(parents=True, exist_ok=True)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    _copy_bounded(open_member(), out, size, path, name)


def _unpack_zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, root: Path, path: Path) -> None:
    _unpack_member(info.filename, info.is_dir(), info.file_size, lambda: archive.open(info), root, path)


def _unpack_tar_member(archive: tarfile.TarFile, info: tarfile.TarInfo, root: Path, path: Path) -> None:
    def open_member() -> IO[bytes]:
        source = archive.extractfile(info)
        assert source is not None  # a regular file (check_tar)
        return source

    _unpack_member(info.name, info.isdir(), info.size, open_member, root, path)


def _copy_bounded(source, out: Path, size: int, path: Path, name: str) -> None:
    """Copy the member ``name`` of ``path`` from ``source`` to the new file ``out``; refused if it
    gives more than the ``size`` bytes it declares."""
    written = 0
    with source, open(out, "xb") as sink:
        for chunk in iter(lambda: source.read(1 << 20), b""):
            written += len(chunk)
            if written > size:
                raise ArchiveError(
                    f"{path}: member {name!r} unpacks to more than the {size:,} bytes it declares; refused"
                )
            sink.write(chunk)


def _remove_leftovers(parent: Path) -> None:
    """Remove temporary folders that unpacking processes, now gone, left in ``parent``."""
    for leftover in parent.glob(f"{_TEMP_PREFIX}*"):
        pid = leftover.name[len(_TEMP_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)
