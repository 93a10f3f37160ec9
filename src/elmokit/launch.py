"""Starting a training run: its configuration, the save dir it may use, and its processes.

One way to start processes: torch's elastic launcher, which torchrun runs. ``elmokit train
--nproc N`` (CPU processes, gloo) and ``--gpus 0,1`` (one process per GPU, NCCL) start them
through it on this machine; ``torchrun --nproc-per-node N -m elmokit.cli train ...`` (or
``python -m torch.distributed.run``) starts them itself, and every process finds RANK,
WORLD_SIZE and LOCAL_RANK in its environment.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from .atomic import write_json
from .checkpoints import CONFIG_FILE, latest_checkpoint
from .export import load_language_model
from .language_model import LanguageModel
from .options import BiLMOptions


class TrainingError(RuntimeError):
    """A training run that cannot start or go on (bad data, non-finite loss, ...)."""


@dataclass
class TrainConfig:
    """Everything a training run needs; saved as train_config.json in the save dir."""

    train: str
    vocab: str
    save_dir: str
    options: dict[str, Any]
    heldout: str | None = None
    epochs: float | None = None
    max_steps: int | None = None
    max_time: float | None = None  # seconds
    batch_size: int = 128  # per process
    unroll_steps: int = 20
    n_negative_samples: int = 8192
    lr: float = 0.2
    dropout: float = 0.1
    clip_norm: float = 10.0
    seed: int = 0
    device: str = "cpu"
    checkpoint_minutes: float = 10.0
    log_every: int = 10
    init_from: str | None = None
    n_train_tokens: int | None = None  # counted from the corpus when None
    precision: str = "fp32"  # or "bf16": autocast the forward pass (CUDA or CPU with bf16)
    # Probability that a row's carried LSTM state is zeroed before a window (0 = the original
    # recipe, which starts from zero only at step 0). A small value teaches the model to start
    # from the zero state, as stateless inference and bilm-tf's evaluation do.
    state_reset: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def save_config(config: TrainConfig) -> None:
    """Write train_config.json into the run's save dir."""
    write_json(Path(config.save_dir) / CONFIG_FILE, asdict(config))


def _source_options(model_dir: str | Path) -> dict[str, Any]:
    """The options of a model to fine-tune from (a training save dir or an exported folder)."""
    folder = Path(model_dir)
    if latest_checkpoint(folder) is not None:
        return json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))["options"]
    return BiLMOptions.from_file(folder / "options.json").to_dict()


def prepare_run(config: TrainConfig, resume: bool) -> TrainConfig:
    """Check the save dir; on resume, return the stored config with this call's stopping limits
    and device."""
    save_dir = Path(config.save_dir)
    existing = latest_checkpoint(save_dir)
    if resume:
        if existing is None:
            raise TrainingError(f"--resume: no checkpoint in {save_dir}")
        stored = TrainConfig(**json.loads((save_dir / CONFIG_FILE).read_text("utf-8")))
        stored.epochs, stored.max_steps, stored.max_time = config.epochs, config.max_steps, config.max_time
        stored.device = config.device
        return stored
    if existing is not None or (save_dir / CONFIG_FILE).exists():
        raise TrainingError(
            f"{save_dir} holds another run; pass --resume to continue it or choose another --save-dir"
        )
    if config.init_from:
        config.options = _source_options(config.init_from)
    BiLMOptions.from_dict(config.options, source="--config")
    return config


def initialize_from(model: LanguageModel, source_dir: str | Path, vocab: Any) -> int:
    """Start from a trained model (the original's restart for domain adaptation): copy the biLM
    and the softmax rows of every token that both vocabularies hold. Returns that count."""
    source, source_vocab = load_language_model(source_dir)
    model.bilm.load_state_dict(source.bilm.state_dict())
    new_ids, old_ids = [], []
    for token in vocab.tokens:
        if token in source_vocab:
            new_ids.append(vocab.token_to_id(token))
            old_ids.append(source_vocab.token_to_id(token))
    with torch.no_grad():
        model.softmax.weight[new_ids] = source.softmax.weight[old_ids]
        model.softmax.bias[new_ids] = source.softmax.bias[old_ids]
    return len(new_ids)


# ---------------------------------------------------------------------------------------------
# Processes


def _in_process_group(entrypoint: Callable[..., Any], args: tuple[Any, ...]) -> Any:
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
    entrypoint: Callable[..., Any], args: tuple[Any, ...], nproc: int, gpus: str | None
) -> Any:
    """The body of each process that ``run_processes`` starts."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # not ignored, as in the launcher
    if gpus:
        os.environ["ELMOKIT_GPUS"] = gpus  # LOCAL_RANK picks this process's GPU
    else:  # CPU processes share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    return _in_process_group(entrypoint, args)


def run_processes(
    entrypoint: Callable[..., Any], args: tuple[Any, ...], nproc: int, gpus: str | None = None
) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` in ``nproc`` new processes on this machine through torch's elastic
    launcher (as ``torchrun --standalone`` would); each finds RANK, WORLD_SIZE, LOCAL_RANK and
    the rendezvous in its environment. ``gpus`` ("0,1"): the GPU of each local rank. Returns
    each rank's return value; a failed process raises ChildFailedError.

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
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _pass_on)
    try:
        return elastic_launch(config, _started_process)(entrypoint, args, nproc, gpus)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _pass_on(signum: int, frame: Any) -> None:
    """Send a signal that the launcher received on to the processes it started."""
    for process in multiprocessing.active_children():
        os.kill(process.pid, signum)


def _train_process(config: dict[str, Any], resume: bool) -> None:
    from .train import train  # here, not above: train.py imports this module

    train(TrainConfig(**config), resume=resume)


def launch(config: TrainConfig, resume: bool, processes: int = 1, gpus: str | None = None) -> None:
    """Train in this process, or start one process per GPU in ``gpus`` ("0,1") or ``processes``
    CPU processes (gloo) through ``run_processes``. Under torchrun (WORLD_SIZE set), this process
    is one of the run's; torchrun started the others."""
    started = int(os.environ.get("WORLD_SIZE", "1")) > 1
    count = len(gpus.split(",")) if gpus else processes
    if started and (gpus or count > 1):
        raise ValueError("under torchrun, leave out --nproc and --gpus: torchrun starts the processes")
    if gpus:
        config.device = "cuda" if count > 1 else f"cuda:{gpus.strip()}"
    if count > 1:
        run_processes(_train_process, (asdict(config), resume), count, gpus)
    else:
        _in_process_group(_train_process, (asdict(config), resume))
