"""The collectives of a training run: the process group each process joins, and the barrier
and all-reduces the loop takes part in (each a no-op when the run is one process)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..base.devices import Process, process_device, this_process
from .config import TrainConfig

__all__: list[str] = []


@dataclass(frozen=True)
class Distributed:
    """This process's place in the run: which process (``devices.Process``: rank, number of
    processes) on which device, and the collectives the loop takes part in (each a no-op when
    the run is one process)."""

    device: torch.device = torch.device("cpu")
    process: Process = Process()

    def barrier(self) -> None:
        if self.process.distributed:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on any of them."""
        return self.max(float(flag))[0] > 0

    def max(self, *values: float) -> list[float]:
        """Each value's maximum over the processes (one collective for all of them)."""
        if not self.process.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.tolist()

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the processes, in place; returns it."""
        if self.process.distributed:
            dist.all_reduce(tensor)
        return tensor

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` averaged over the processes, in place; returns it."""
        if self.process.distributed:
            dist.all_reduce(tensor)
            tensor /= self.process.world_size
        return tensor


def setup_distributed(config: TrainConfig, process: Process | None = None) -> Distributed:
    """This process's place in the run: its device (``devices.process_device`` of the
    configuration's device and GPU list: with several processes, ``cuda`` is the GPU of this
    process's local rank), joined to the process group that torchrun or ``elmokit train
    --gpus/--nproc`` set up (NCCL on GPUs, gloo on CPUs). ``process``: ``this_process()``."""
    process = this_process() if process is None else process
    device = process_device(config.device, config.gpus, process)
    if process.distributed and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=process.rank, world_size=process.world_size)
    return Distributed(device, process)
