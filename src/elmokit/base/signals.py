"""The signal policy, in one place: which signals stop elmokit's work, what each kind of work
does with them, and for how long a handler stays.

SIGINT (Ctrl-C) and SIGTERM (``kill``, a scheduler, a container's stop) both ask to stop
(``STOP_SIGNALS``). What each kind of work does with them:

- a training run (``training.loop.run_training``, through its ``StopRequest``) stops after the
  current step with a checkpoint; a second signal stops it at once;
- ``elmokit serve`` (``serve.app.serve``) lets uvicorn stop accepting, drain and shut down, and
  then notes the signal (``noting``), so that a drained stop returns instead of dying by it;
- the process launcher (``_processes.run_processes``) ignores SIGINT, which the terminal sends to
  every process of the group, and passes SIGTERM on to the processes it started (``pass_on``);
  each process it starts has SIGINT raise KeyboardInterrupt again (``interrupt_on_sigint``);
- an atomic write, inside a program's opt-in (``atomic.handle_signals``), has SIGTERM raise
  ``atomic.Terminated`` and SIGINT KeyboardInterrupt, so that its temporary file is removed; it
  takes only a signal still at Python's default (``at_default``): a program's own handler stays.

The rules, which ``installed`` keeps for every handler elmokit sets: a handler is installed only
by a call whose documented purpose is to have it (never as a side effect of a library call),
only in the main thread (Python runs handlers there, and ``signal.signal`` refuses any other
thread: elsewhere nothing changes), and only for the block: the handlers it found are restored
afterwards.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeAlias

__all__: list[str] = []

# what signal.signal takes: a function of (signum, frame), SIG_DFL or SIG_IGN
Handler: TypeAlias = "Callable[[int, FrameType | None], Any] | int | signal.Handlers"

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# Python's own handlers, which a program that set none of its own has
_DEFAULTS: dict[int, Any] = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


def in_main_thread() -> bool:
    """Whether this is the main thread, the only one that may set signal handlers."""
    return threading.current_thread() is threading.main_thread()


@contextmanager
def installed(handlers: Mapping[int, Handler]) -> Iterator[bool]:
    """While the block runs, ``handlers`` ({signal number: handler}) handle their signals; the
    handlers found are restored afterwards (one that Python did not install: SIG_DFL). Outside
    the main thread nothing changes. Yields whether the handlers were installed."""
    if not in_main_thread():
        yield False
        return
    previous: dict[int, Any] = {}
    try:
        for signum, handler in handlers.items():
            previous[signum] = signal.signal(signum, handler)
        yield True
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def at_default(signals: Iterable[int]) -> list[int]:
    """Those of ``signals`` whose handler is still Python's default (SIGINT: KeyboardInterrupt,
    SIGTERM: SIG_DFL); a program's own handler, or an outer block's, is not."""
    found = []
    for signum in signals:
        try:
            if signal.getsignal(signum) is _DEFAULTS.get(signum, signal.SIG_DFL):
                found.append(signum)
        except ValueError:  # not a signal of this platform
            pass
    return found


def noting(into: list[int]) -> Callable[[int, FrameType | None], None]:
    """A handler that appends the signal's number to ``into`` and does nothing else."""

    def note(signum: int, frame: FrameType | None) -> None:
        into.append(signum)

    return note


def pass_on(signum: int, frame: FrameType | None) -> None:
    """A handler that sends the signal on to this process's child processes (those
    ``multiprocessing`` started, as torch's launcher does)."""
    for process in multiprocessing.active_children():
        if process.pid is not None:
            os.kill(process.pid, signum)


def interrupt_on_sigint() -> None:
    """For the rest of this process, SIGINT raises KeyboardInterrupt (Python's default), though
    the process inherited it ignored: for the body of a process that ``_processes.run_processes``
    started (its launcher ignores SIGINT). Outside the main thread nothing changes."""
    if in_main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
