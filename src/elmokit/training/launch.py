"""Launching a training run: this process, or one process per GPU of the configuration, or N CPU
processes, each running the loop (``loop.train``). A front end: only the command line imports it.

``elmokit train --nproc N`` (CPU processes, gloo) and ``--gpus 0,1`` (one process per GPU, NCCL)
start the processes through ``_processes.run_processes`` on this machine; the GPU list travels
in the configuration to each process, whose device ``collectives.setup_distributed`` takes from it.
``torchrun --nproc-per-node N -m elmokit.cli train ...`` starts the processes itself.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import TextIO

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from ..base._processes import first_failure, in_process_group, run_processes
from ..base.devices import this_process
from .config import TrainConfig, TrainingError, prepare_run
from .loop import Outcome, train

__all__: list[str] = []


class _Forward(logging.Handler):
    """Hands each record on to another logger, which passes it to its handlers and its parents'."""

    def __init__(self, to: logging.Logger, level: int) -> None:
        super().__init__(level)
        self.to = to

    def emit(self, record: logging.LogRecord) -> None:
        self.to.handle(record)


@contextlib.contextmanager
def messages_to(stream: TextIO) -> Iterator[None]:
    """While the block runs, the training loop's messages (logger ``elmokit.training``) are the
    run's output: each INFO record one line on ``stream``, and only there (not also through the
    ``elmokit`` logger's handlers, which the command line puts on stderr); warnings and errors go
    on to the ``elmokit`` logger as before (without a handler there: Python's last resort, stderr)."""
    logger = logging.getLogger("elmokit.training")
    lines = logging.StreamHandler(stream)
    lines.setFormatter(logging.Formatter("%(message)s"))
    lines.addFilter(lambda record: record.levelno < logging.WARNING)
    forward = _Forward(logging.getLogger("elmokit"), logging.WARNING)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(lines)
    logger.addHandler(forward)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(lines)
        logger.removeHandler(forward)
        logger.setLevel(level)
        logger.propagate = propagate


def _train_process(config: TrainConfig, resume: bool, new_data: bool, resume_from: str | None) -> Outcome:
    """The body of each process that ``launch`` starts."""
    with messages_to(sys.stdout):
        return train(config, resume=resume, new_data=new_data, resume_from=resume_from)


def launch(
    config: TrainConfig,
    resume: bool,
    processes: int = 1,
    new_data: bool = False,
    resume_from: str | None = None,
) -> Outcome:
    """Check the run once (``config.prepare_run``), then train in this process, or start one
    process per GPU of ``config.gpus`` or ``processes`` CPU processes (gloo). Under torchrun,
    this process is one of the run's; torchrun started the others. ``config``: a new run's, or
    ``config.resume_config``'s for a resumed one. Returns how the run (its first process) ended;
    a failed process raises TrainingError with its message. ``new_data``, ``resume_from``: see
    ``loop.train``."""
    if processes < 1:
        raise ValueError(f"--nproc must be at least 1, got {processes}")
    if config.gpus and processes > 1:
        raise ValueError("give --gpus or --nproc, not both: --gpus starts one process per GPU")
    count = len(config.gpus) or processes
    if this_process().distributed and (config.gpus or count > 1):
        raise ValueError("under torchrun, leave out --nproc and --gpus: torchrun starts the processes")
    config = prepare_run(config, resume, new_data=new_data, resume_from=resume_from)
    args = (config, resume, new_data, resume_from)
    if count == 1:
        return in_process_group(_train_process, args)
    try:
        return run_processes(_train_process, args, count, share_cores=not config.gpus)[0]
    except ChildFailedError as err:
        rank, code, message = first_failure(err)
        last = message.strip().splitlines()[-1] if message.strip() else f"exit code {code}"
        raise TrainingError(f"training process {rank} failed: {last}") from None
