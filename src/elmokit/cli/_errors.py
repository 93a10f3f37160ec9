"""What ``run`` and the commands that answer their own errors (``train``, ``score``) share: an
error said in one line, and a reader of standard output that stopped early."""

from __future__ import annotations

import os
import signal
import sys

from ..base._console import error_text, say


def _reader_gone() -> int:
    """The reader of standard output stopped early (``elmokit models | head -3``): no message,
    and the exit status of a command that SIGPIPE ended, 141 (128 + 13), as coreutils and git
    give; what is left unwritten goes to /dev/null, so Python says nothing at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor
        pass
    return 128 + signal.SIGPIPE


def _fail(err: BaseException | str) -> int:
    """Report an error in one line, as every command does; returns the exit status."""
    say(f"elmokit: error: {error_text(err)}")
    return 2
