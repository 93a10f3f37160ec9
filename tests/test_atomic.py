"""Atomic writes under signals: a write never completes once SIGTERM or Ctrl-C has arrived, even
where Python dropped the exception that the signal handler raised."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from elmokit.atomic import Terminated, atomic_path, raise_if_signalled, terminate_raises


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
    with pytest.raises(expected):
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
    with atomic_path(target) as tmp:
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        with terminate_raises():  # nested: the outer handlers stay
            raise_if_signalled()
        tmp.write_text("done")
    assert target.read_text() == "done"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_programs_own_handler_is_kept(tmp_path):
    seen = []

    def own(signum, frame):
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, own)
    try:
        with atomic_path(tmp_path / "out.txt") as tmp:
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
