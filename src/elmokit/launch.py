"""Starting a training run: its configuration, the save dir it may use, and its processes.

One way to start processes: torch's elastic launcher, which torchrun runs. ``elmokit train
--nproc N`` (CPU processes, gloo) and ``--gpus 0,1`` (one process per GPU, NCCL) start them
through it on this machine; ``torchrun --nproc-per-node N -m elmokit.cli train ...`` (or
``python -m torch.distributed.run``) starts them itself, and every process finds RANK,
WORLD_SIZE and LOCAL_RANK in its environment.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from .atomic import write_json
from .checkpoints import CONFIG_FILE, VOCAB_FILE, latest_checkpoint, read_json, resume_point
from .data import Vocabulary
from .devices import resolve_device
from .export import load_language_model
from .language_model import LanguageModel
from .options import BiLMOptions

if TYPE_CHECKING:
    from .train import Outcome


class TrainingError(RuntimeError):
    """A training run that cannot start or go on (bad data, non-finite loss, ...)."""


@dataclass(frozen=True)
class Range:
    """The values a numeric option allows: from ``low`` (``low`` itself when ``low_allowed``) up
    to ``high`` (inclusive; None = no bound)."""

    low: float
    low_allowed: bool = True
    high: float | None = None

    def problem(self, value: float) -> str | None:
        """Why ``value`` is outside the range, or None."""
        if value < self.low or (value == self.low and not self.low_allowed):
            bound = "at least" if self.low_allowed else "greater than"
            return f"must be {bound} {self.low:g}, got {value:g}"
        if self.high is not None and value > self.high:
            return f"must be at most {self.high:g}, got {value:g}"
        return None


# The range of every numeric option of a run (TrainConfig's fields, and the process count).
RANGES: dict[str, Range] = {
    "epochs": Range(0, low_allowed=False),
    "max_steps": Range(1),
    "max_time": Range(0, low_allowed=False),
    "batch_size": Range(1),
    "unroll_steps": Range(1),
    "n_negative_samples": Range(1),
    "lr": Range(0, low_allowed=False),
    "dropout": Range(0, high=1),
    "clip_norm": Range(0, low_allowed=False),
    "seed": Range(0),
    "checkpoint_minutes": Range(0),
    "log_every": Range(1),
    "state_reset": Range(0, high=1),
    "keep_checkpoints": Range(1),
    "nproc": Range(1),
}

# What a resumed run may change; everything else (the model, the data order, the optimizer)
# stays the run's. The three limits are replaced together when any of them is given.
RESUMABLE = (
    "train",
    "vocab",
    "heldout",
    "epochs",
    "max_steps",
    "max_time",
    "device",
    "checkpoint_minutes",
    "keep_checkpoints",
    "precision",
)
LIMITS = ("epochs", "max_steps", "max_time")
DATA_PATHS = ("train", "vocab", "heldout")
PRECISIONS = ("fp32", "bf16")


def option_name(field_name: str) -> str:
    """The command-line option of a TrainConfig field."""
    return "--config" if field_name == "options" else "--" + field_name.replace("_", "-")


@dataclass
class TrainConfig:
    """Everything a training run needs; saved as train_config.json in the save dir, without
    ``save_dir`` itself (a run dir can be moved or copied; it is always the one given). The data
    paths are stored absolute; a stored file may name none (null), and its resume gives them."""

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
    # How many of the newest checkpoints stay on disk (besides the best), e.g. to average them.
    keep_checkpoints: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Raise ValueError naming the first option outside its range, a batch that cannot fit
        in this machine's memory (``bounds.check_training_size``), an unknown precision or a
        device this machine does not have (``devices.resolve_device``)."""
        for name, allowed in RANGES.items():
            value = getattr(self, name, None)
            problem = None if value is None else allowed.problem(value)
            if problem:
                raise ValueError(f"{option_name(name)} {problem}")
        from .bounds import check_training_size

        if self.options:  # empty until --init-from's model is read
            check_training_size(
                BiLMOptions.from_dict(self.options, source="--config"),
                self.batch_size,
                self.unroll_steps,
                self.n_negative_samples,
            )
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        resolve_device(self.device)


def save_config(config: TrainConfig) -> None:
    """Write train_config.json into the run's save dir (all fields but ``save_dir``)."""
    stored = asdict(config)
    del stored["save_dir"]
    write_json(Path(config.save_dir) / CONFIG_FILE, stored)


def training_options(options: dict[str, Any], source: str = "--config") -> dict[str, Any]:
    """The options a run trains with and stores, checked; bilm-tf's training value of
    ``n_characters`` (261: char ids 0..260 without a padding row) is written as 262, elmokit's
    layout (ids shifted by 1, 0 = padding) and bilm-tf's own value for inference."""
    cnn = options.get("char_cnn") if isinstance(options, dict) else None
    if isinstance(cnn, dict) and cnn.get("n_characters") == 261:
        options = {**options, "char_cnn": {**cnn, "n_characters": 262}}
    BiLMOptions.from_dict(options, source=source)
    return options


def _resolved(path: str | None) -> str | None:
    """A data path or glob made absolute, so that the run can be resumed from anywhere."""
    return None if path is None else os.path.abspath(os.path.expanduser(path))


def _source_options(model_dir: str | Path) -> dict[str, Any]:
    """The options of a model to fine-tune from (a training save dir or an exported folder)."""
    folder = Path(model_dir)
    if latest_checkpoint(folder) is not None:
        return read_json(folder / CONFIG_FILE)["options"]
    return BiLMOptions.from_file(folder / "options.json").to_dict()


def resume_config(save_dir: str | Path, given: Mapping[str, Any]) -> TrainConfig:
    """The configuration of the run in ``save_dir`` (its train_config.json) with the changes
    ``given`` asks for (field name -> value; None, or ``{}`` for options, = not given).

    The fields in RESUMABLE are applied; a given value of any other field must equal the run's,
    else TrainingError names its option. A changed ``--train`` has its tokens counted again; a
    changed ``--vocab`` must hold the run's vocabulary (the run reads its own copy)."""
    folder = Path(save_dir)
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise TrainingError(f"--resume: {folder} holds no run (no {CONFIG_FILE}); start it without --resume")
    known = {f.name for f in fields(TrainConfig)}
    stored = read_json(path)
    if not isinstance(stored, dict):
        raise TrainingError(f"{path}: not a run's configuration (a JSON object)")
    stored = {k: v for k, v in stored.items() if k in known}
    stored["save_dir"] = str(folder)  # never the stored one: older versions wrote it
    config = TrainConfig(**stored)
    given = {k: v for k, v in given.items() if v is not None and v != {} and k != "save_dir"}
    for name in DATA_PATHS:
        if name in given:
            given[name] = _resolved(given[name])
    for name, value in given.items():
        if name in RESUMABLE or name == "n_train_tokens":  # the count follows --train
            continue
        ours = getattr(config, name)
        if name == "options":
            same = BiLMOptions.from_dict(training_options(value)) == BiLMOptions.from_dict(ours)
        else:
            same = value == ours
        if not same:
            shown = "" if name == "options" else f" (the run's is {ours!r}, given {value!r})"
            raise TrainingError(
                f"{option_name(name)} cannot change when resuming{shown}; a resumed run may change "
                f"only {', '.join(option_name(n) for n in RESUMABLE)}"
            )
    changes = {k: v for k, v in given.items() if k in RESUMABLE}
    if any(k in changes for k in LIMITS):
        changes = {**{k: None for k in LIMITS}, **changes}
    if changes.get("train", config.train) != config.train:
        changes["n_train_tokens"] = None
    own = folder / VOCAB_FILE
    if changes.get("vocab", config.vocab) != config.vocab and own.is_file():
        if Vocabulary.from_file(changes["vocab"]).tokens != Vocabulary.from_file(own).tokens:
            raise TrainingError(
                f"--vocab {changes['vocab']} is not the run's vocabulary ({own}); a resumed run keeps it"
            )
    config = replace(config, **changes)
    if config.train is None:
        raise TrainingError(f"{path} names no training data: pass --train")
    return config


def prepare_run(config: TrainConfig, resume: bool) -> TrainConfig:
    """The configuration to run with, checked, and the save dir checked (writable or makeable; no
    other run's checkpoint unless resuming). On resume: ``resume_config`` of the save dir with the
    given ``config`` as the changes. A save dir whose run stopped before its first checkpoint
    may be started afresh, or resumed from step 0 with its stored configuration."""
    save_dir = Path(config.save_dir)
    if resume:
        config = resume_config(save_dir, asdict(config))
    else:
        if latest_checkpoint(save_dir) is not None:
            raise TrainingError(
                f"{save_dir} holds another run; pass --resume to continue it or choose another --save-dir"
            )
        paths = {name: _resolved(getattr(config, name)) for name in DATA_PATHS}
        options = _source_options(config.init_from) if config.init_from else config.options
        config = replace(config, **paths, options=training_options(options))
    config.check()
    _check_writable(save_dir)
    return config


def _check_writable(save_dir: Path) -> None:
    """Raise TrainingError unless files can be written in ``save_dir``, or it can be made (it is
    not made here: a run that fails its checks leaves nothing behind)."""
    try:
        if save_dir.exists():
            with tempfile.TemporaryFile(dir=save_dir):
                pass
            return
        parent = save_dir.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        if not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as err:
        raise TrainingError(f"cannot write to --save-dir {save_dir}: {err.strerror or err}") from None


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
        with _quiet_launcher():
            return elastic_launch(config, _started_process)(entrypoint, args, nproc, gpus)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


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


def _pass_on(signum: int, frame: Any) -> None:
    """Send a signal that the launcher received on to the processes it started."""
    for process in multiprocessing.active_children():
        os.kill(process.pid, signum)


def _train_process(
    config: dict[str, Any], resume: bool, new_data: bool = False, resume_from: str | None = None
) -> Outcome:
    from .train import train  # here, not above: train.py imports this module

    return train(TrainConfig(**config), resume=resume, new_data=new_data, resume_from=resume_from)


def launch(
    config: TrainConfig,
    resume: bool,
    processes: int = 1,
    gpus: str | None = None,
    new_data: bool = False,
    resume_from: str | None = None,
) -> Outcome:
    """Train in this process, or start one process per GPU in ``gpus`` ("0,1") or ``processes``
    CPU processes (gloo) through ``run_processes``. Under torchrun (WORLD_SIZE set), this process
    is one of the run's; torchrun started the others. Returns how the run (its first process)
    ended; a failed process raises TrainingError with its message. ``new_data``, ``resume_from``:
    see ``train``. On resume the checkpoint to continue from is checked before any process
    starts (``checkpoints.resume_point``)."""
    config.check()  # before any process starts
    if new_data and not resume:
        raise ValueError("--new-data continues a run: give it with --resume")
    if resume_from is not None and not resume:
        raise ValueError("--resume-from continues a run: give it with --resume")
    if resume:
        resume_point(Path(config.save_dir), resume_from)
    started = int(os.environ.get("WORLD_SIZE", "1")) > 1
    count = len(gpus.split(",")) if gpus else processes
    problem = RANGES["nproc"].problem(count)
    if problem:
        raise ValueError(f"--nproc {problem}")
    if started and (gpus or count > 1):
        raise ValueError("under torchrun, leave out --nproc and --gpus: torchrun starts the processes")
    if gpus:
        config = replace(config, device="cuda" if count > 1 else f"cuda:{gpus.strip()}")
    if count == 1:
        return _in_process_group(_train_process, (asdict(config), resume, new_data, resume_from))
    try:
        return run_processes(_train_process, (asdict(config), resume, new_data, resume_from), count, gpus)[0]
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        message = failure.message if isinstance(failure.message, str) else failure.message.get("message", "")
        last = message.strip().splitlines()[-1] if message.strip() else f"exit code {failure.exitcode}"
        raise TrainingError(f"training process {rank} failed: {last}") from None
