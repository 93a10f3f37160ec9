"""Atomic file writes: the one way elmokit writes a file that someone may read.

A file is written under a temporary name made exclusively in the target folder (never through a
planted link), given the permissions the umask allows, and renamed to its final name only when it
is complete; on any error or on Ctrl-C the temporary file is removed. So a reader never sees a
partial file under the final name, and nothing is left behind.

SIGTERM kills a Python process at once by default, leaving the temporary file for the next write
to remove. A program opts in, once, to having SIGTERM raise ``Terminated`` while a write is open
(so the temporary file is removed too): ``with handle_signals(): ...`` (the command line does).
A library call by itself never changes the process's signal handlers (``signals`` holds the
rules).

The temporary name ``.NAME.PID@HOST.XXXXXXXX.tmp`` says which process writes it: a process that
cannot clean up (SIGKILL, a power cut) leaves one, and the next write of the same file on that
host removes the leftovers whose process no longer exists.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import signal
import socket
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from .signals import at_default, in_main_thread, installed

__all__: list[str] = []


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while an atomic write was open (raised like Ctrl-C's KeyboardInterrupt)."""

    signum = signal.SIGTERM


_signalled: list[int] = []  # signals that arrived while terminate_raises' handlers were installed
_handling: list[bool] = [False]  # the innermost handle_signals' choice; off unless a program opts in


@contextmanager
def handle_signals(enabled: bool = True) -> Iterator[None]:
    """For the block, whether atomic writes (``terminate_raises``) install their SIGTERM/SIGINT
    handlers while they are open: a program's opt-in (``elmokit.cli`` enters it once per command).
    Outside such a block a write leaves the process's handlers alone: SIGTERM then kills the
    process as the program arranged, and the next write of the file removes what it left."""
    _handling.append(enabled)
    try:
        yield
    finally:
        _handling.pop()


def _interrupt(signum: int) -> KeyboardInterrupt:
    if signum == signal.SIGTERM:
        return Terminated("terminated by SIGTERM")
    return KeyboardInterrupt()


def raise_if_signalled() -> None:
    """Raise the interrupt of a signal that arrived while ``terminate_raises`` was open, if one
    did: its handler raised already, but Python drops an exception raised inside a finalizer
    (``__del__``, a generator closed by the garbage collector), so long writes call this before
    they commit anything."""
    if _signalled:
        raise _interrupt(_signalled[0])


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "", socket.gethostname().split(".")[0])[:16] or "host"


def _owner() -> str:
    return f"{os.getpid()}@{_host()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_leftovers(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary files that writers of ``path`` on this host left when they were
    killed (their process no longer exists); returns them. Files of live processes, of other
    hosts and of older versions (no owner in the name) are kept."""
    target = Path(path)
    prefix, host = f".{target.name}.", _host()
    removed: list[Path] = []
    try:
        candidates = list(target.parent.glob(f"{glob.escape(prefix)}*@*.tmp"))
    except OSError:
        return removed
    for leftover in candidates:
        owner = leftover.name[len(prefix) : -len(".tmp")].rpartition(".")[0]
        pid, _, owner_host = owner.partition("@")
        if owner_host != host or not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            leftover.unlink()
            removed.append(leftover)
        except OSError:
            pass
    return removed


def _kind(mode: int) -> str | None:
    """What a file of ``st_mode`` is, in words, when it is not a regular file; None if it is."""
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def is_stream(path: str | os.PathLike) -> bool:
    """Whether ``path`` (its links followed) is a named pipe, a character device or a socket:
    something a streaming output is written into directly, never renamed over."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def _refuse_non_regular(target: Path) -> None:
    """Raise if ``target`` exists and is not a regular file (a folder, a link, a device, a
    pipe, a socket): renaming a new file over it would replace it."""
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return
    kind = _kind(mode)
    if kind == "a folder":
        raise IsADirectoryError(f"output {target} is a folder; give the path of a file to write")
    if kind is not None:
        raise FileExistsError(
            f"output {target} is {kind}, not a regular file; elmokit writes a new file and renames "
            "it into place, which would replace it: give the path of a regular file"
        )


def _input_ids(inputs: Iterable[str | os.PathLike]) -> Iterator[tuple[tuple[int, int], str]]:
    """(st_dev, st_ino) and name of every input file; ``-`` (standard input) and missing
    inputs are skipped."""
    for item in inputs:
        if str(item) == "-":
            continue
        try:
            info = os.stat(item)
        except OSError:
            continue
        yield (info.st_dev, info.st_ino), str(item)


def check_output(
    path: str | os.PathLike,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    streaming: bool = False,
) -> Path:
    """The one output policy of every command that writes a file, checked before its work.

    Refused: a folder; a symbolic link, a device, a named pipe or a socket (renaming a new
    file over it would replace it; with ``streaming``, a pipe, a character device or a socket,
    its links followed, is accepted: the caller writes straight into it, see ``is_stream``); an
    existing file unless ``overwrite``; the same file as any of ``inputs`` under any name (hard
    links included), even with ``overwrite``; a missing or unwritable folder. Raises OSError or
    ValueError naming the output and the cause; returns the output's path."""
    target = Path(path)
    _refuse_input(target, inputs)
    if streaming and is_stream(target):
        return target
    _refuse_non_regular(target)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True (--overwrite) to replace it")
    folder = target.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"output folder does not exist: {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write {target}: the folder {folder} is not writable")
    return target


def check_outputs_in(
    folder: str | os.PathLike,
    names: Iterable[str],
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
) -> None:
    """``check_output`` for each file ``names`` that a command writes into ``folder`` and that
    is already there (a model folder, a run's --out), before the work."""
    inputs = list(inputs)
    for name in names:
        path = Path(folder) / name
        if os.path.lexists(path):
            check_output(path, overwrite, inputs)


def make_folders(path: str | os.PathLike) -> list[Path]:
    """Make the folder ``path`` and its missing parents; the folders this call made, outermost
    first, for ``remove_made_folders`` when the command that wanted them fails."""
    target = Path(path)
    missing = []
    folder = target
    while not os.path.lexists(folder) and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    target.mkdir(parents=True, exist_ok=True)
    return missing[::-1]


def remove_made_folders(made: Iterable[Path]) -> None:
    """Remove the folders ``make_folders`` made, innermost first, as long as each is empty:
    one that holds something (put there meanwhile) stays, and so do its parents; one already
    gone is passed over."""
    for folder in reversed(list(made)):
        try:
            folder.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            return


def _refuse_input(target: Path, inputs: Iterable[str | os.PathLike]) -> None:
    """Raise ValueError if ``target`` is one of ``inputs`` (the same file under any name)."""
    try:
        info = os.stat(target)
    except OSError:
        return  # nothing there: it cannot be an input
    for key, name in _input_ids(inputs):
        if key == (info.st_dev, info.st_ino):
            raise ValueError(f"output {target} is the input file {name}; write to another file")


@contextmanager
def terminate_raises() -> Iterator[None]:
    """Inside ``handle_signals``: while open, SIGTERM raises ``Terminated`` (so ``finally``
    blocks run) and Ctrl-C KeyboardInterrupt as usual, and both are recorded for
    ``raise_if_signalled``; a signal that has a handler of the program's own keeps it, and
    outside the main thread, or without the program's opt-in, nothing changes."""
    if not _handling[-1] or not in_main_thread():
        yield
        return
    ours = at_default((signal.SIGTERM, signal.SIGINT))
    if not ours:  # the program's own handlers, or an outer terminate_raises, are in place
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        _signalled.append(signum)
        raise _interrupt(signum)

    _signalled.clear()
    try:
        with installed(dict.fromkeys(ours, handler)):
            yield
    finally:
        _signalled.clear()


_FULL = {
    errno.ENOSPC: "the disk is full (no space left on device)",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file is larger than this process may write (File too large)",
}


def disk_full_reason(err: BaseException) -> str | None:
    """What ``err`` says in words when it says that the disk (or the quota, or the process's
    file size limit) is full; None for any other error."""
    return _FULL.get(getattr(err, "errno", None) or 0) if isinstance(err, OSError) else None


def disk_full(err: BaseException, target: str | os.PathLike) -> OSError | None:
    """``err`` in one line naming ``target`` when it says that the disk (or the quota, or the
    process's file size limit) is full; None for any other error."""
    why = disk_full_reason(err)
    if why is None:
        return None
    full = OSError(f"{target} was not written: {why}; no partial file was left")
    full.errno = getattr(err, "errno", None)
    return full


@contextmanager
def atomic_path(path: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``path``; when the block ends without an error, the
    file written there becomes ``path``.

    ``overwrite=False`` never replaces a file that appeared at ``path`` meanwhile: it raises
    FileExistsError instead (the final step links the new file in, which fails if the name is
    taken). The temporary file is created empty with O_EXCL, so the writer may reopen it by name
    (h5py, torch.save) or write it through the yielded path. Whatever ``overwrite``, a ``path``
    that is not a regular file (a folder, a link, a device, a pipe, a socket) is never renamed
    over: it raises before the block and again before the rename.
    """
    target = Path(path)
    _refuse_non_regular(target)
    remove_leftovers(target)
    with terminate_raises():
        tmp = _temporary(target)
        try:
            yield tmp
            raise_if_signalled()
            os.chmod(tmp, 0o666 & ~_umask())
            _refuse_non_regular(target)  # what appeared meanwhile is not renamed over either
            if overwrite:
                os.replace(tmp, target)
            else:
                try:
                    os.link(tmp, target)
                except FileExistsError:
                    raise FileExistsError(
                        f"{target} appeared while it was being written; the new result was not saved "
                        "over it (pass overwrite to replace it)"
                    ) from None
        except OSError as err:  # a full disk: one line naming the file, not the temporary name
            full = disk_full(err, target)
            if full is None:
                raise
            raise full from None
        finally:
            tmp.unlink(missing_ok=True)


def _temporary(target: Path, label: str = "") -> Path:
    """A new empty file beside ``target`` named ``.NAME.PID@HOST.LABELXXXXXXXX.tmp`` (made with
    O_EXCL, so never through a planted link)."""
    folder = target.parent
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.{_owner()}.{label}", suffix=".tmp", dir=folder)
    except PermissionError:
        raise PermissionError(f"cannot write {target}: the folder {folder} is not writable") from None
    except FileNotFoundError:
        raise FileNotFoundError(f"output folder does not exist: {folder}") from None
    os.close(fd)
    return Path(name)


@contextmanager
def scratch_path(path: str | os.PathLike, label: str = "") -> Iterator[Path]:
    """Yield a new temporary file beside ``path``, named as ``atomic_path``'s (so that
    ``remove_leftovers(path)`` removes it once its process is gone) with ``label`` (letters,
    digits, ``-``) in it; it is removed when the block ends, whatever happens, and never
    becomes ``path``: scratch work on the way to ``path`` (e.g. one process's part of it)."""
    if not re.fullmatch(r"[A-Za-z0-9-]*", label):
        raise ValueError(f"a scratch file's label is letters, digits and '-', got {label!r}")
    with terminate_raises():
        tmp = _temporary(Path(path), label)
        try:
            yield tmp
        except OSError as err:
            full = disk_full(err, path)
            if full is None:
                raise
            raise full from None
        finally:
            tmp.unlink(missing_ok=True)


def write_bytes(path: str | os.PathLike, data: bytes, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path, overwrite) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str, overwrite: bool = True) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    write_bytes(path, text.encode("utf-8"), overwrite)


def write_json(path: str | os.PathLike, value: Any, overwrite: bool = True) -> None:
    """Write ``value`` as indented JSON (UTF-8, newline at the end) to ``path`` atomically."""
    write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n", overwrite)
