"""The one place that turns a device name (``--device``) into a checked ``torch.device``."""

from __future__ import annotations

import os

import torch

SUPPORTED = "cpu, cuda or cuda:N"


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


def process_device(device: str | torch.device | None = None) -> torch.device:
    """The device of this process among several (torchrun's LOCAL_RANK in the environment):
    for ``cuda`` or None on a machine with a GPU, ``cuda:LOCAL_RANK``, or the LOCAL_RANK-th GPU
    of ELMOKIT_GPUS ("0,2"); anything else as ``resolve_device`` gives it (None without a GPU:
    cpu). The GPU is made this process's current device."""
    cuda = torch.cuda.is_available()
    hint = ""
    if (device is None and cuda) or str(device) == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        gpus = os.environ.get("ELMOKIT_GPUS")
        index = int(gpus.split(",")[local_rank]) if gpus else local_rank
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
