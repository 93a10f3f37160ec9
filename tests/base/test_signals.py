"""The signal policy (elmokit.base.signals): handlers set for a block, in the main thread only,
restored afterwards; and no other module sets one."""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

from elmokit.base.signals import STOP_SIGNALS, at_default, installed, noting

SRC = Path(__file__).resolve().parents[2] / "src" / "elmokit"


def test_installed_handles_the_signal_in_the_block_and_restores_the_previous_handlers():
    assert STOP_SIGNALS == (signal.SIGINT, signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    noted: list[int] = []
    with installed(dict.fromkeys(STOP_SIGNALS, noting(noted))) as done:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
    assert done is True and noted == [signal.SIGTERM, signal.SIGINT]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_installed_restores_the_handlers_when_the_block_raises():
    try:
        with installed({signal.SIGTERM: signal.SIG_IGN}):
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            raise RuntimeError("inside")
    except RuntimeError as err:
        assert str(err) == "inside"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_outside_the_main_thread_nothing_changes():
    seen = []

    def body() -> None:
        with installed({signal.SIGTERM: signal.SIG_IGN}) as done:
            seen.append((done, signal.getsignal(signal.SIGTERM)))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [(False, signal.SIG_DFL)]


def test_a_programs_own_handler_is_not_at_its_default():
    assert at_default(STOP_SIGNALS) == [signal.SIGINT, signal.SIGTERM]
    with installed({signal.SIGTERM: noting([])}):
        assert at_default(STOP_SIGNALS) == [signal.SIGINT]
    assert at_default(STOP_SIGNALS) == [signal.SIGINT, signal.SIGTERM]


def test_no_other_module_sets_a_signal_handler():
    setters = re.compile(r"\bsignal\.signal\(")
    found = sorted(
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if setters.search(path.read_text(encoding="utf-8"))
    )
    assert found == ["base/signals.py"]
