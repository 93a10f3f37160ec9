"""Atomic writes under signals: a write never completes once SIGTERM or Ctrl-C has arrived, even
where Python dropped the exception that the signal handler raised; the handlers are installed
only where the program opted in (``handle_signals``, as the command line does), never by a
library write by itself."""

from __future__ import annotations

import os
import signal
import sys

import pytest

import elmokit.base.atomic
from elmokit.base.atomic import (
    Terminated,
    atomic_path,
    handle_signals,
    make_folders,
    raise_if_signalled,
    remove_made_folders,
    terminate_raises,
)
from elmokit.cli import main


class _SignalInFinalizer:
    """Sends ``signum`` to this process from ``__del__``: the handler's exception is raised inside
    the finalizer, where Python prints "Exception ignored in ..." and goes on."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        total = 0
        for i in range(10_000):  # the handler runs between these bytecodes
            total += i


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_whose_exception_python_dropped_still_stops_the_write(tmp_path, monkeypatch, signum):
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: dropped.append(info.exc_type))
    target = tmp_path / "out.bin"
    expected = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    with pytest.raises(expected), handle_signals():
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"complete as far as the writer knows")
            bomb = _SignalInFinalizer(signum)
            del bomb
            assert dropped == [expected]  # Python swallowed the handler's exception
    assert sorted(tmp_path.iterdir()) == []  # neither the output nor the temporary file
    raise_if_signalled()  # the record ends with the write: nothing is raised after it
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_write_without_signal_completes_and_restores_the_handlers(tmp_path):
    target = tmp_path / "out.txt"
    with handle_signals(), atomic_path(target) as tmp:
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        with terminate_raises():  # nested: the outer handlers stay
            raise_if_signalled()
        tmp.write_text("done")
    assert target.read_text() == "done"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_library_write_leaves_the_signal_handlers_alone(tmp_path):
    """Without the program's opt-in an atomic write installs no handler (nor inside a
    ``handle_signals(False)`` block within an opted-in one): SIGTERM keeps killing the process."""
    targets = [tmp_path / "a.txt", tmp_path / "b.txt"]
    with atomic_path(targets[0]) as tmp:
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        tmp.write_text("a")
    with handle_signals(), handle_signals(False), atomic_path(targets[1]) as tmp:
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        tmp.write_text("b")
    assert [t.read_text() for t in targets] == ["a", "b"]


def test_sigterm_during_a_commands_write_leaves_no_partial_file(tmp_path, monkeypatch, capsys):
    """The command line opts in: SIGTERM that arrives while `elmokit embed` writes its output
    raises inside the write, the temporary file is removed, and the command exits 143 with one
    line; afterwards the process's handlers are what they were."""
    source = tmp_path / "in.txt"
    source.write_text("the bank raised rates .\n")
    real_check = elmokit.base.atomic.raise_if_signalled

    def sigterm_before_the_commit() -> None:  # the output is complete, not yet renamed
        os.kill(os.getpid(), signal.SIGTERM)  # the handler raises Terminated here
        real_check()

    monkeypatch.setattr(elmokit.base.atomic, "raise_if_signalled", sigterm_before_the_commit)
    code = main(
        ["embed", str(source), str(tmp_path / "out.hdf5"), "--model", "elmo-tiny-reference", "--quiet"]
    )
    assert code == 128 + signal.SIGTERM
    assert capsys.readouterr().err.splitlines()[-1] == (
        "elmokit: error: interrupted by SIGTERM; no partial output was left"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_programs_own_handler_is_kept(tmp_path):
    seen = []

    def own(signum, frame):
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, own)
    try:
        with handle_signals(), atomic_path(tmp_path / "out.txt") as tmp:
            assert signal.getsignal(signal.SIGTERM) is own
            os.kill(os.getpid(), signal.SIGTERM)
            total = 0
            for i in range(10_000):
                total += i
            tmp.write_text("written")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [signal.SIGTERM]
    assert (tmp_path / "out.txt").read_text() == "written"  # the program decided, not elmokit


def test_made_folders_are_removed_innermost_first_and_only_while_empty(tmp_path):
    (tmp_path / "there").mkdir()
    made = make_folders(tmp_path / "there" / "a" / "b" / "c")
    assert made == [
        tmp_path / "there" / "a",
        tmp_path / "there" / "a" / "b",
        tmp_path / "there" / "a" / "b" / "c",
    ]
    assert make_folders(tmp_path / "there" / "a") == []  # nothing new
    (tmp_path / "there" / "a" / "mine.txt").write_text("put there meanwhile", encoding="utf-8")
    remove_made_folders(made)
    assert sorted(p.name for p in (tmp_path / "there" / "a").iterdir()) == ["mine.txt"]  # a stays
    (tmp_path / "there" / "a" / "mine.txt").unlink()
    remove_made_folders(make_folders(tmp_path / "there" / "a" / "x"))
    assert not (tmp_path / "there" / "a" / "x").exists() and (tmp_path / "there" / "a").is_dir()
    remove_made_folders(made)
    assert list((tmp_path / "there").iterdir()) == []  # "there" was not made by either call
