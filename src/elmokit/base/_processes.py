"""Starting a group of processes on this machine, as ``torchrun --standalone`` would.

One way to start processes: torch's elastic launcher, which torchrun runs. ``elmokit train
--nproc N`` / ``--gpus 0,1`` and ``elmokit embed --nproc N`` start theirs through
``run_processes``; ``torchrun --nproc-per-node N -m elmokit.cli ...`` starts them itself. Either
way each process finds RANK, WORLD_SIZE and LOCAL_RANK in its environment
(``devices.this_process``). torch's launcher does the work; what is written here is only what it
leaves to its caller: the signals of an interactive run, and its log, which would tell a failed
process with a traceback of the launcher's own code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from .signals import installed, interrupt_on_sigint, pass_on

__all__ = ["first_failure", "in_process_group", "run_processes"]


def in_process_group(entrypoint: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``entrypoint(*args)`` in one process of a group; the processes meet at a barrier before
    leaving the group, so that none leaves while another still talks."""
    try:
        result = entrypoint(*args)
        if dist.is_initialized():
            dist.barrier()
        return result
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@record
def _started_process(
    entrypoint: Callable[..., Any], args: tuple[Any, ...], nproc: int, share_cores: bool
) -> Any:
    """The body of each process that ``run_processes`` starts."""
    interrupt_on_sigint()  # not ignored, as in the launcher
    if share_cores:  # CPU processes share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    return in_process_group(entrypoint, args)


def run_processes(
    entrypoint: Callable[..., Any], args: tuple[Any, ...], nproc: int, share_cores: bool = True
) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` in ``nproc`` new processes on this machine through torch's elastic
    launcher (as ``torchrun --standalone`` would); each finds RANK, WORLD_SIZE, LOCAL_RANK and
    the rendezvous in its environment. ``share_cores``: each process takes its share of this
    machine's cores as torch threads (for CPU processes). Returns each rank's return value; a
    failed process raises ChildFailedError.

    A training run stops after its step with a checkpoint on SIGINT or SIGTERM (a second signal
    stops it at once), and the launcher waits for it: Ctrl-C reaches every process from the
    terminal, so the launcher ignores SIGINT meanwhile; SIGTERM sent to the launcher is passed on."""
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"elmokit-{uuid.uuid4().hex}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        signals_to_handle="SIGHUP,SIGQUIT",  # SIGINT and SIGTERM: see below
    )
    with installed({signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: pass_on}), _quiet_launcher():
        return elastic_launch(config, _started_process)(entrypoint, args, nproc, share_cores)


def first_failure(error: ChildFailedError) -> tuple[int, int, str]:
    """The process of ``run_processes`` that failed first: its rank, its exit code (negative:
    killed by that signal) and its message (``"TypeName: text"`` of the exception it raised, or
    torch's words where it left none)."""
    rank, failure = error.get_first_failure()
    message = failure.message
    text = message if isinstance(message, str) else str(message.get("message", ""))
    return rank, failure.exitcode, text


# the loggers of torch's elastic launcher, whose report of a failed process (a traceback of the
# launcher's own code) would come before elmokit's one line naming the process and its cause
_LAUNCHER_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")


@contextlib.contextmanager
def _quiet_launcher() -> Iterator[None]:
    """Silence the elastic launcher's log in this process while it runs (set LOGLEVEL=DEBUG
    or INFO to keep it, as torch reads it)."""
    if os.environ.get("LOGLEVEL", "").upper() in ("DEBUG", "INFO"):
        yield
        return
    loggers = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name.startswith(_LAUNCHER_LOGGERS)
    ]
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, before):
            logger.disabled = disabled
