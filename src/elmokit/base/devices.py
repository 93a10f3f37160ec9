"""Which process, which rank, which device: the one place that reads torchrun's environment
(``this_process``) and turns a device name (``--device``) into a checked ``torch.device``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

__all__: list[str] = []

SUPPORTED = "cpu, cuda or cuda:N"


@dataclass(frozen=True)
class Process:
    """This process among the processes that share a job (torchrun's RANK, LOCAL_RANK,
    WORLD_SIZE; ``restart``: TORCHELASTIC_RESTART_COUNT, how often the group was restarted)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    restart: int = 0

    @property
    def is_main(self) -> bool:
        """Whether this is process 0, the one that speaks and merges."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether other processes share the job."""
        return self.world_size > 1


def this_process(environ: Mapping[str, str] | None = None) -> Process:
    """Which process this is, read from the environment torchrun (or ``elmokit train --gpus``)
    gives each process; a single process (rank 0 of 1) without it. A value that is not a
    number is a ValueError naming the variable."""
    env = os.environ if environ is None else environ

    def number(name: str, default: int) -> int:
        text = env.get(name)
        if text is None or text.strip() == "":
            return default
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"environment variable {name}={text!r} is not a whole number") from None

    world_size = number("WORLD_SIZE", 1)
    rank = number("RANK", 0)
    local_rank = number("LOCAL_RANK", 0)
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        raise ValueError(f"RANK={rank}, LOCAL_RANK={local_rank}, WORLD_SIZE={world_size} do not fit together")
    return Process(rank, local_rank, world_size, number("TORCHELASTIC_RESTART_COUNT", 0))


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` as a ``torch.device`` this machine has: cpu, cuda, cuda:N with N below the
    number of GPUs, or mps where available; None gives cuda when a GPU is there, else cpu.
    Anything else raises a ValueError that names the device and what this machine offers."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"unknown device {str(device)!r}: use {SUPPORTED}") from None
    if resolved.type == "cpu":
        return resolved
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch has no CUDA support" if torch.version.cuda is None else "no CUDA GPU was found"
            raise ValueError(f"device {str(device)!r} is not available: {why}; use --device cpu")
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise ValueError(
                f"device {str(device)!r} does not exist: this machine has {count} CUDA GPU(s), "
                f"cuda:0 to cuda:{count - 1}"
            )
        return resolved
    if resolved.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device {str(device)!r} is not available on this machine; use --device cpu")
        return resolved
    raise ValueError(f"device {str(device)!r} is not supported: use {SUPPORTED}")


def process_device(
    device: str | torch.device | None = None,
    gpus: Sequence[int] | None = None,
    process: Process | None = None,
) -> torch.device:
    """The device of this process among several: for ``cuda`` or None on a machine with a GPU,
    ``cuda:LOCAL_RANK``, or the LOCAL_RANK-th GPU of ``gpus`` ((0, 2): local rank 1 takes
    cuda:2); anything else as ``resolve_device`` gives it (None without a GPU: cpu). The GPU is
    made this process's current device. ``process``: by default ``this_process()``."""
    cuda = torch.cuda.is_available()
    hint = ""
    if (device is None and cuda) or str(device) == "cuda":
        local_rank = (this_process() if process is None else process).local_rank
        if gpus:
            if local_rank >= len(gpus):
                raise ValueError(
                    f"the process of local rank {local_rank} has no GPU in the list {list(gpus)}: "
                    "start as many processes per machine as the list has GPUs"
                )
            index = int(gpus[local_rank])
        else:
            index = local_rank
        device = f"cuda:{index}"
        hint = (
            f" (the GPU of the process of local rank {local_rank}: start as many processes per "
            "machine as it has GPUs, or pass --device cpu)"
        )
    try:
        resolved = resolve_device(device)
    except ValueError as error:
        raise ValueError(f"{error}{hint}") from None
    if resolved.type == "cuda" and resolved.index is not None:
        torch.cuda.set_device(resolved)
    return resolved
