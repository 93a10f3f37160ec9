"""Training the biLM with the original recipe, the same loop on a CPU, one GPU or DDP processes.

The recipe (bilm-tf): each batch row is a stream of sentences cut into windows of
``unroll_steps`` tokens; LSTM states carry from one window to the next and back-propagation stops
at the window boundary; the loss is 0.5 * (mean forward + mean backward cross-entropy) with a
sampled softmax shared by both directions, multiplied by ``unroll_steps`` before the gradient;
Adagrad (lr 0.2, initial accumulator 1.0); gradients clipped to a global norm of 10; dropout 0.1
on each LSTM layer's input and on the top layer's output.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from .bilm import BiLM
from .lstm import LstmState
from .options import BiLMOptions
from .softmax import Softmax

CHECKPOINT_POINTER = "latest"
# The checkpoint with the lowest held-out perplexity so far: {"folder", "step", "forward",
# "backward", "average"} (written only when the run has held-out data).
BEST_POINTER = "best.json"


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


class LanguageModel(nn.Module):
    """The biLM with its training objective: a softmax over the vocabulary shared by both
    directions, predicting token t+1 (forward) and t-1 (backward)."""

    def __init__(self, options: dict[str, Any] | BiLMOptions, vocab_size: int, dropout: float = 0.1):
        super().__init__()
        self.bilm = BiLM(options)
        self.bilm.lstm.dropout = dropout
        self.dropout = dropout
        self.softmax = Softmax(vocab_size, self.bilm.options.lstm.projection_dim)

    def forward(
        self,
        char_ids: torch.Tensor,
        targets: torch.Tensor,
        state: LstmState | None,
        num_sampled: int | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, LstmState]:
        """char_ids (2, batch, steps, max_chars) shifted ids, forward and backward streams;
        targets (2, batch, steps). Returns the mean loss per direction (2,) and the final state.
        ``num_sampled=None`` uses the full softmax."""
        tokens = self.bilm.token_encoder(char_ids)  # (2, batch, steps, projection_dim)
        lengths = torch.full((tokens.shape[1],), tokens.shape[2], dtype=torch.long)
        outputs, state = self.bilm.lstm(tokens, lengths, state)
        top = F.dropout(outputs[-1], self.dropout, self.training)
        hiddens = [top[d].reshape(-1, top.shape[-1]) for d in range(2)]
        flat_targets = [targets[d].reshape(-1) for d in range(2)]
        if num_sampled is None:
            losses = [self.softmax.full_loss(h, t) for h, t in zip(hiddens, flat_targets)]
        else:  # each direction its own sample, as bilm-tf
            losses = self.softmax.sampled_losses(hiddens, flat_targets, num_sampled, generator)
        return torch.stack([loss.mean() for loss in losses]), state.detach()


# ---------------------------------------------------------------------------------------------
# Distributed setup


@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on any of them."""
        if not self.active:
            return flag
        value = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())


class StopRequest:
    """Turns SIGINT/SIGTERM into a request to stop after the current step (a second signal
    interrupts at once), so an interrupted run ends with a checkpoint like a finished one."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(f"\n{signal.Signals(signum).name}: stopping after this step with a checkpoint "
              "(send it again to stop at once)", flush=True)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def setup_distributed(device: str) -> Distributed:
    """Join the process group that torchrun or ``--gpus``/``--nproc`` set up through the
    environment (RANK, WORLD_SIZE, LOCAL_RANK); a single process otherwise."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Distributed(device=torch.device(device))
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        gpus = os.environ.get("ELMOKIT_GPUS")
        index = int(gpus.split(",")[local_rank]) if gpus else local_rank
        torch.cuda.set_device(index)
        torch_device, backend = torch.device("cuda", index), "nccl"
    else:
        torch_device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world_size)
    return Distributed(rank, world_size, torch_device)


# ---------------------------------------------------------------------------------------------
# Checkpoints


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    np_state = np.random.get_state()
    state["numpy"] = {
        "keys": torch.from_numpy(np_state[1].astype(np.int64)),
        "pos": int(np_state[2]),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    keys = state["numpy"]["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, state["numpy"]["pos"], 0, 0.0))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def _atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def latest_checkpoint(save_dir: Path) -> Path | None:
    """The folder of the newest complete checkpoint, or None."""
    pointer = save_dir / CHECKPOINT_POINTER
    if not pointer.is_file():
        return None
    folder = save_dir / pointer.read_text(encoding="utf-8").strip()
    return folder if folder.is_dir() else None


def best_checkpoint(save_dir: Path) -> Path | None:
    """The folder of the checkpoint with the lowest held-out perplexity so far, or None."""
    pointer = save_dir / BEST_POINTER
    if not pointer.is_file():
        return None
    folder = save_dir / json.loads(pointer.read_text(encoding="utf-8"))["folder"]
    return folder if folder.is_dir() else None


def checkpoint_folder(save_dir: Path, which: str = "latest") -> Path | None:
    """A save dir's "latest" or "best" checkpoint folder (None if it has none)."""
    if which not in ("latest", "best"):
        raise ValueError(f"checkpoint must be 'latest' or 'best', got {which!r}")
    return latest_checkpoint(save_dir) if which == "latest" else best_checkpoint(save_dir)


def load_checkpoint_file(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Read a checkpoint file without unpickling arbitrary objects."""
    return torch.load(path, map_location=device, weights_only=True)


# ---------------------------------------------------------------------------------------------
# The loop


@dataclass
class RunState:
    step: int = 0
    tokens: int = 0  # training tokens seen by all processes (each direction counted once)
    seconds: float = 0.0


class Trainer:
    """One process's share of a training run."""

    def __init__(self, config: TrainConfig, data: Any, vocab_size: int, env: Distributed):
        self.config, self.data, self.env = config, data, env
        self.save_dir = Path(config.save_dir)
        torch.manual_seed(config.seed)
        self.model = LanguageModel(config.options, vocab_size, config.dropout).to(env.device)
        self.module: nn.Module = self.model
        if env.active:
            self.module = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[env.device.index] if env.device.type == "cuda" else None
            )
        # the fused kernel (CPU only) makes one pass over each parameter instead of several
        self.optimizer = torch.optim.Adagrad(
            self.model.parameters(),
            lr=config.lr,
            initial_accumulator_value=1.0,
            eps=1e-10,
            fused=True if env.device.type == "cpu" else None,
        )
        self.generator = torch.Generator().manual_seed(config.seed * 1000 + env.rank)
        self.lstm_state: LstmState | None = None
        self.grad_norm = 0.0  # the last step's global gradient norm before clipping
        self.run = RunState()
        self.num_sampled: int | None = (
            config.n_negative_samples if vocab_size > config.n_negative_samples else None
        )

    # -- one step ------------------------------------------------------------------------------
    def step(self, batch: dict[str, np.ndarray]) -> tuple[float, float]:
        """One optimizer step on one batch; returns the forward and backward mean losses."""
        char_ids, targets = self._tensors(batch)
        self.module.train()
        self._reset_some_states()
        with torch.autocast(
            self.env.device.type, dtype=torch.bfloat16, enabled=self.config.precision == "bf16"
        ):
            losses, self.lstm_state = self.module(
                char_ids, targets, self.lstm_state, self.num_sampled, self.generator
            )
        losses = losses.float()
        self.lstm_state = LstmState(self.lstm_state.h.float(), self.lstm_state.c.float())
        loss = 0.5 * (losses[0] + losses[1])
        check = loss.detach().clone()
        if self.env.active:
            dist.all_reduce(check)
        if not torch.isfinite(check):
            raise TrainingError(
                f"non-finite loss ({float(check)}) at step {self.run.step + 1}; the last good "
                f"checkpoint in {self.save_dir} is kept"
            )
        self.optimizer.zero_grad(set_to_none=True)
        (loss * self.config.unroll_steps).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_norm)
        self.grad_norm = float(norm)
        self.optimizer.step()
        per_direction = losses.detach()
        if self.env.active:
            dist.all_reduce(per_direction)
            per_direction /= self.env.world_size
        self.run.step += 1
        self.run.tokens += char_ids.shape[1] * char_ids.shape[2] * self.env.world_size
        return float(per_direction[0]), float(per_direction[1])

    def _reset_some_states(self) -> None:
        """Zero each row's carried state with probability ``config.state_reset``."""
        if self.config.state_reset <= 0 or self.lstm_state is None:
            return
        batch = self.lstm_state.h.shape[2]
        keep = torch.rand(batch, generator=self.generator) >= self.config.state_reset
        keep = keep.to(self.env.device, self.lstm_state.h.dtype)[:, None]
        self.lstm_state = LstmState(self.lstm_state.h * keep, self.lstm_state.c * keep)

    def _tensors(self, batch: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """Stack both directions: char ids (2, B, T, C) shifted by +1, targets (2, B, T)."""
        chars = np.stack([batch["char_ids"], batch["char_ids_reverse"]])
        targets = np.stack([batch["next_token_id"], batch["next_token_id_reverse"]])
        device = self.env.device
        return (
            torch.from_numpy(chars).to(device, torch.long) + 1,
            torch.from_numpy(targets).to(device, torch.long),
        )

    # -- held-out perplexity --------------------------------------------------------------------
    def evaluate_heldout(self) -> Perplexity | None:
        """Full-softmax perplexity of ``config.heldout`` (main process), appended to heldout.csv."""
        result = None
        if self.config.heldout and self.env.is_main:
            from .data import Vocabulary

            vocab = Vocabulary.from_file(self.config.vocab)
            start = time.monotonic()
            result = evaluate_perplexity(self.model, vocab, self.config.heldout, device=self.env.device)
            path = self.save_dir / "heldout.csv"
            new = not path.exists()
            with path.open("a", newline="") as f:
                writer = csv.writer(f)
                if new:
                    writer.writerow(["step", "tokens", "forward", "backward", "average", "predictions"])
                writer.writerow(
                    [
                        self.run.step,
                        self.run.tokens,
                        round(result.forward, 3),
                        round(result.backward, 3),
                        round(result.average, 3),
                        result.tokens,
                    ]
                )
            tqdm.write(
                f"step {self.run.step}: held-out perplexity forward {result.forward:.2f} backward "
                f"{result.backward:.2f} average {result.average:.2f} ({time.monotonic() - start:.0f} s)"
            )
            self.model.train()
        self.env.barrier()
        return result

    # -- checkpoints ---------------------------------------------------------------------------
    def checkpoint_and_evaluate(self) -> None:
        """A checkpoint, then the held-out perplexity; the best checkpoint so far is kept."""
        folder = self.save_checkpoint()
        result = self.evaluate_heldout()
        if result is not None:
            self._keep_if_best(folder, result)
        self.env.barrier()

    def _keep_if_best(self, folder: Path, result: Perplexity) -> None:
        """Point best.json at ``folder`` if its held-out average is the lowest so far, and
        delete the checkpoint it replaces unless that one is the latest."""
        pointer = self.save_dir / BEST_POINTER
        best = json.loads(pointer.read_text(encoding="utf-8")) if pointer.is_file() else None
        if best is not None and result.average >= best["average"]:
            return
        figures = {"forward": result.forward, "backward": result.backward, "average": result.average}
        _atomic_write_text(
            json.dumps({"folder": folder.name, "step": self.run.step, **figures}, indent=2) + "\n", pointer
        )
        if best is not None and best["folder"] not in (folder.name, latest_checkpoint(self.save_dir).name):
            shutil.rmtree(self.save_dir / best["folder"], ignore_errors=True)

    def save_checkpoint(self) -> Path:
        """Write all processes' state into a new folder, then point ``latest`` at it; the
        previous latest is deleted unless it is the best so far."""
        folder = self.save_dir / f"checkpoint-{self.run.step:09d}"
        if self.env.is_main:
            folder.mkdir(parents=True, exist_ok=True)
        self.env.barrier()
        rank_state = {
            "data": self.data.state_dict(),
            "lstm_state": None if self.lstm_state is None else tuple(self.lstm_state),
            "rng": _rng_state(),
            "generator": self.generator.get_state(),
        }
        _atomic_save(rank_state, folder / f"rank{self.env.rank}.pt")
        if self.env.is_main:
            _atomic_save(
                {
                    "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "run": asdict(self.run),
                    "world_size": self.env.world_size,
                },
                folder / "model.pt",
            )
        self.env.barrier()
        if self.env.is_main:
            previous = latest_checkpoint(self.save_dir)
            _atomic_write_text(folder.name + "\n", self.save_dir / CHECKPOINT_POINTER)
            if previous not in (None, folder, best_checkpoint(self.save_dir)):
                shutil.rmtree(previous, ignore_errors=True)
        return folder

    def load_checkpoint(self, folder: Path) -> None:
        """Continue exactly where ``folder`` stopped."""
        shared = load_checkpoint_file(folder / "model.pt", self.env.device)
        if shared["world_size"] != self.env.world_size:
            raise TrainingError(
                f"{folder} was written by {shared['world_size']} processes; resume with as many "
                f"(now {self.env.world_size})"
            )
        self.model.load_state_dict(shared["model"])
        fused = [group["fused"] for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(shared["optimizer"])
        for group, flag in zip(self.optimizer.param_groups, fused):  # this device's choice
            group["fused"] = flag
        self.run = RunState(**shared["run"])
        mine = load_checkpoint_file(folder / f"rank{self.env.rank}.pt")
        self.data.load_state_dict(mine["data"])
        if mine["lstm_state"] is not None:
            self.lstm_state = LstmState(*(t.to(self.env.device) for t in mine["lstm_state"]))
        _set_rng_state(mine["rng"])
        self.generator.set_state(mine["generator"])


def batches_for_steps(data: Iterator[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    """The data source as an iterator (kept separate so tests can pass fixed batches)."""
    yield from data


def run_training(
    trainer: Trainer,
    max_steps: int | None,
    max_time: float | None,
    progress: bool = True,
) -> RunState:
    """Train until ``max_steps`` (total, counting resumed steps) or ``max_time`` seconds of this
    session, checkpointing every ``checkpoint_minutes`` and at the end."""
    env = trainer.env
    metrics = _MetricsLog(trainer.save_dir / "metrics.csv") if env.is_main else None
    bar = tqdm(
        total=max_steps,
        initial=trainer.run.step,
        unit="step",
        disable=not (progress and env.is_main),
        dynamic_ncols=True,
    )
    with StopRequest() as stop:
        try:
            _loop(trainer, metrics, bar, max_steps, max_time, stop)
        finally:
            bar.close()
    trainer.checkpoint_and_evaluate()
    return trainer.run


def _loop(
    trainer: Trainer,
    metrics: _MetricsLog | None,
    bar: tqdm,
    max_steps: int | None,
    max_time: float | None,
    stop: StopRequest,
) -> None:
    """Steps until the data, ``max_steps`` or ``max_time`` ends or a stop is requested."""
    config, env = trainer.config, trainer.env
    start = last_checkpoint = time.monotonic()
    window_tokens, window_start = 0, time.monotonic()
    base_seconds = trainer.run.seconds
    batches = iter(trainer.data)
    while max_steps is None or trainer.run.step < max_steps:
        batch = next(batches, None)
        if batch is None:
            break
        fwd, bwd = trainer.step(batch)
        window_tokens += batch["token_ids"].size * env.world_size
        trainer.run.seconds = base_seconds + time.monotonic() - start
        if trainer.run.step % config.log_every == 0 or trainer.run.step == 1:
            rate = window_tokens / max(time.monotonic() - window_start, 1e-9)
            window_tokens, window_start = 0, time.monotonic()
            _report(bar, metrics, trainer.run, fwd, bwd, rate, trainer.grad_norm)
        bar.update(1)
        out_of_time = max_time is not None and time.monotonic() - start >= max_time
        if env.any(out_of_time or stop.requested):  # every process stops at the same step
            break
        if env.any(time.monotonic() - last_checkpoint >= config.checkpoint_minutes * 60):
            trainer.checkpoint_and_evaluate()
            last_checkpoint = time.monotonic()


def _report(bar, metrics, run: RunState, fwd: float, bwd: float, rate: float, grad_norm: float) -> None:
    ppl = math.exp(min(0.5 * (fwd + bwd), 50.0))
    bar.set_postfix(loss=f"{0.5 * (fwd + bwd):.3f}", ppl=f"{ppl:.1f}", tok_s=f"{rate:.0f}")
    if metrics is not None:
        metrics.write(
            step=run.step,
            tokens=run.tokens,
            seconds=round(run.seconds, 1),
            loss_forward=round(fwd, 5),
            loss_backward=round(bwd, 5),
            perplexity=round(ppl, 3),
            tokens_per_second=round(rate, 1),
            grad_norm=round(grad_norm, 4),
        )


class _MetricsLog:
    """Append rows to metrics.csv (header written once; a file from an older version without
    some columns gets them, empty in its old rows)."""

    FIELDS = [
        "step",
        "tokens",
        "seconds",
        "loss_forward",
        "loss_backward",
        "perplexity",
        "tokens_per_second",
        "grad_norm",  # global gradient norm before clipping (of the logged step)
    ]

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.exists():
            with path.open("w", newline="") as f:
                csv.writer(f).writerow(self.FIELDS)
            return
        with path.open(newline="") as f:
            rows = list(csv.reader(f))
        if rows and rows[0] != self.FIELDS:
            old = rows[0]
            lines = [self.FIELDS] + [[dict(zip(old, r)).get(k, "") for k in self.FIELDS] for r in rows[1:]]
            tmp = path.with_name(path.name + ".tmp")
            with tmp.open("w", newline="") as f:
                csv.writer(f).writerows(lines)
            tmp.replace(path)

    def write(self, **row: Any) -> None:
        with self.path.open("a", newline="") as f:
            csv.writer(f).writerow([row[k] for k in self.FIELDS])


def save_config(config: TrainConfig) -> None:
    path = Path(config.save_dir) / "train_config.json"
    _atomic_write_text(json.dumps(asdict(config), indent=2) + "\n", path)


# ---------------------------------------------------------------------------------------------
# Model folders: a training save dir (checkpoints) or an exported folder (original layout)

SOFTMAX_FILE = "softmax.hdf5"


def load_language_model(
    model_dir: str | Path, device: str | torch.device = "cpu", checkpoint: str = "latest"
):
    """(LanguageModel, Vocabulary) from a training save dir (its "latest" or "best" checkpoint)
    or an exported model folder."""
    from .data import Vocabulary
    from .weights import load_weights

    folder = Path(model_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder not found: {folder}")
    vocab_file = folder / "vocab.txt"
    if not vocab_file.is_file():
        raise FileNotFoundError(f"model folder {folder} has no vocab.txt")
    vocab = Vocabulary.from_file(vocab_file)
    chosen = checkpoint_folder(folder, checkpoint)
    if checkpoint == "best" and chosen is None and latest_checkpoint(folder) is not None:
        raise FileNotFoundError(f"{folder} has no best checkpoint: the run had no held-out data")
    if chosen is not None:
        config = json.loads((folder / "train_config.json").read_text(encoding="utf-8"))
        model = LanguageModel(config["options"], len(vocab), dropout=0.0)
        state = load_checkpoint_file(chosen / "model.pt")["model"]
        model.load_state_dict(state)
    else:
        for name in ("options.json", "weights.hdf5", SOFTMAX_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(
                    f"model folder {folder} has neither a checkpoint ('{CHECKPOINT_POINTER}') nor {name}"
                )
        options = BiLMOptions.from_file(folder / "options.json")
        model = LanguageModel(options, len(vocab), dropout=0.0)
        load_weights(model.bilm, folder / "weights.hdf5")
        load_softmax(model.softmax, folder / SOFTMAX_FILE)
    return model.to(device).eval(), vocab


def save_softmax(softmax: Softmax, path: Path) -> None:
    """The softmax in its own HDF5 file: softmax/W (vocab, dim), softmax/b (vocab,)."""
    import h5py

    tmp = path.with_name(path.name + ".tmp")
    with h5py.File(tmp, "w") as f:
        f.create_dataset("softmax/W", data=softmax.weight.detach().cpu().float().numpy())
        f.create_dataset("softmax/b", data=softmax.bias.detach().cpu().float().numpy())
    tmp.replace(path)


def load_softmax(softmax: Softmax, path: Path) -> None:
    import h5py

    with h5py.File(path, "r") as f:
        for name, param in (("softmax/W", softmax.weight), ("softmax/b", softmax.bias)):
            if name not in f:
                raise ValueError(f"{path}: missing dataset {name!r}")
            if tuple(f[name].shape) != tuple(param.shape):
                raise ValueError(
                    f"{path}: dataset {name!r} has shape {tuple(f[name].shape)} but the "
                    f"vocabulary implies {tuple(param.shape)}"
                )
            with torch.no_grad():
                param.copy_(torch.from_numpy(f[name][...]))


def export_model(
    model_dir: str | Path, out_dir: str | Path, extra_options: dict | None = None, checkpoint: str = "latest"
) -> Path:
    """Write options.json + weights.hdf5 (original layout), vocab.txt and softmax.hdf5 of a
    save dir's "latest" or "best" (lowest held-out perplexity) checkpoint."""
    model, vocab = load_language_model(model_dir, checkpoint=checkpoint)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.bilm.save(out / "options.json", out / "weights.hdf5")
    options = json.loads((out / "options.json").read_text(encoding="utf-8"))
    options.update({"bidirectional": True, "n_tokens_vocab": len(vocab)}, **(extra_options or {}))
    _atomic_write_text(json.dumps(options, indent=2) + "\n", out / "options.json")
    vocab.save(out / "vocab.txt")
    save_softmax(model.softmax, out / SOFTMAX_FILE)
    history = training_summary(Path(model_dir), checkpoint)
    if history is not None:
        _atomic_write_text(json.dumps(history, indent=2) + "\n", out / TRAINING_FILE)
    return out


TRAINING_FILE = "training.json"


def training_summary(save_dir: Path, checkpoint: str = "latest") -> dict[str, Any] | None:
    """Steps, tokens, epochs and training time of a save dir's latest or best checkpoint, with
    the run's configuration (None for a folder without a checkpoint)."""
    folder = checkpoint_folder(save_dir, checkpoint)
    if folder is None:
        return None
    run = load_checkpoint_file(folder / "model.pt")["run"]
    config = json.loads((save_dir / "train_config.json").read_text(encoding="utf-8"))
    n_train = config.get("n_train_tokens")
    return {
        "steps": int(run["step"]),
        "tokens": int(run["tokens"]),
        "epochs": round(run["tokens"] / n_train, 3) if n_train else None,
        "training_hours": round(run["seconds"] / 3600, 2),
        "checkpoint": checkpoint,
        "config": config,
    }


# ---------------------------------------------------------------------------------------------
# Evaluation

PERPLEXITY_PROTOCOL = (
    "bilm-tf test protocol: full softmax, batch {batch_size} streams, unroll_steps=1 with the LSTM "
    "state carried through the held-out stream (computed {window} steps at a time, which is "
    "identical), no shuffling, last partial batch dropped"
)


@dataclass
class Perplexity:
    forward: float
    backward: float
    average: float  # exp(mean of 0.5 * (L_fwd + L_bwd)): bilm-tf's figure, the geometric mean
    arithmetic_mean: float  # 0.5 * (forward + backward)
    tokens: int  # predictions per direction
    protocol: str


def _grouped(batches: Iterator[dict[str, np.ndarray]], window: int) -> Iterator[dict[str, np.ndarray]]:
    """Concatenate ``window`` consecutive batches along time (each row is one continuous stream,
    so this is the same stream in longer windows)."""
    group: list[dict[str, np.ndarray]] = []
    for batch in batches:
        group.append(batch)
        if len(group) == window:
            yield {k: np.concatenate([b[k] for b in group], axis=1) for k in group[0]}
            group = []
    if group:
        yield {k: np.concatenate([b[k] for b in group], axis=1) for k in group[0]}


@torch.no_grad()
def evaluate_perplexity(
    model: LanguageModel,
    vocab: Any,
    files: Any,
    batch_size: int = 256,
    window: int = 20,
    device: str | torch.device = "cpu",
    chunk_rows: int = 512,
    progress: bool = False,
) -> Perplexity:
    """Forward, backward and average perplexity of held-out text with the full softmax."""
    from .data import heldout_batches

    model = model.to(device).eval()
    max_chars = model.bilm.options.char_cnn.max_characters_per_token
    data = heldout_batches(
        files, vocab, batch_size=batch_size, unroll_steps=1, max_characters_per_token=max_chars
    )
    totals = torch.zeros(2, dtype=torch.float64)
    count = 0
    state: LstmState | None = None
    for batch in tqdm(_grouped(iter(data), window), disable=not progress, unit="window"):
        chars = torch.from_numpy(np.stack([batch["char_ids"], batch["char_ids_reverse"]])) + 1
        targets = torch.from_numpy(np.stack([batch["next_token_id"], batch["next_token_id_reverse"]]))
        chars, targets = chars.to(device), targets.to(device)
        tokens = model.bilm.token_encoder(chars)
        lengths = torch.full((tokens.shape[1],), tokens.shape[2], dtype=torch.long)
        outputs, state = model.bilm.lstm(tokens, lengths, state)
        top = outputs[-1]
        for d in range(2):
            hidden, target = top[d].reshape(-1, top.shape[-1]), targets[d].reshape(-1)
            for start in range(0, hidden.shape[0], chunk_rows):
                rows = slice(start, start + chunk_rows)
                totals[d] += model.softmax.full_loss(hidden[rows], target[rows]).double().sum().cpu()
        count += targets[0].numel()
    if count == 0:
        raise ValueError(f"held-out data too small: fewer sentences than one batch of {batch_size} streams")
    mean = totals / count
    return Perplexity(
        forward=math.exp(mean[0]),
        backward=math.exp(mean[1]),
        average=math.exp(0.5 * (mean[0] + mean[1])),
        arithmetic_mean=0.5 * (math.exp(mean[0]) + math.exp(mean[1])),
        tokens=count,
        protocol=PERPLEXITY_PROTOCOL.format(batch_size=batch_size, window=window),
    )


# ---------------------------------------------------------------------------------------------
# A whole run


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


def _source_options(model_dir: str | Path) -> dict[str, Any]:
    folder = Path(model_dir)
    if latest_checkpoint(folder) is not None:
        return json.loads((folder / "train_config.json").read_text(encoding="utf-8"))["options"]
    return BiLMOptions.from_file(folder / "options.json").to_dict()


def prepare_run(config: TrainConfig, resume: bool) -> TrainConfig:
    """Check the save dir; on resume, return the stored config with this call's stopping limits."""
    save_dir = Path(config.save_dir)
    existing = latest_checkpoint(save_dir)
    if resume:
        if existing is None:
            raise TrainingError(f"--resume: no checkpoint in {save_dir}")
        stored = TrainConfig(**json.loads((save_dir / "train_config.json").read_text("utf-8")))
        stored.epochs, stored.max_steps, stored.max_time = (
            config.epochs,
            config.max_steps,
            config.max_time,
        )
        stored.device = config.device
        return stored
    if existing is not None or (save_dir / "train_config.json").exists():
        raise TrainingError(
            f"{save_dir} holds another run; pass --resume to continue it or choose another --save-dir"
        )
    if config.init_from:
        config.options = _source_options(config.init_from)
    BiLMOptions.from_dict(config.options, source="--config")
    return config


def total_steps(config: TrainConfig, n_train_tokens: int, world_size: int) -> int | None:
    """Steps for ``epochs`` passes (bilm-tf: n_train_tokens / (batch * unroll * processes))."""
    steps = config.max_steps
    if config.epochs is not None:
        per_epoch = max(1, n_train_tokens // (config.batch_size * config.unroll_steps * world_size))
        by_epochs = int(config.epochs * per_epoch)
        steps = by_epochs if steps is None else min(steps, by_epochs)
    return steps


def train(config: TrainConfig, resume: bool = False, progress: bool = True) -> RunState:
    """Run (or resume) training in this process; every DDP process calls this."""
    from .data import BidirectionalLMBatches, Vocabulary, corpus_files, count_tokens

    env = setup_distributed(config.device)
    config = prepare_run(config, resume)
    save_dir = Path(config.save_dir)
    vocab = Vocabulary.from_file(config.vocab)
    files = corpus_files(config.train)
    if config.n_train_tokens is None or (config.n_negative_samples < len(vocab) and not resume):
        counts = count_tokens(files)
        if not counts:
            raise TrainingError(f"empty corpus: {config.train} holds no tokens")
        config.n_train_tokens = sum(counts.values())
        if config.n_negative_samples < len(vocab):
            vocab.check_sorted_by_frequency(counts)
    max_chars = BiLMOptions.from_dict(config.options).char_cnn.max_characters_per_token
    data = BidirectionalLMBatches(
        files,
        vocab,
        config.batch_size,
        config.unroll_steps,
        seed=config.seed,
        rank=env.rank,
        world_size=env.world_size,
        max_characters_per_token=max_chars,
    )
    trainer = Trainer(config, data, len(vocab), env)
    if resume:
        trainer.load_checkpoint(latest_checkpoint(save_dir))
    else:
        if config.init_from:
            shared = initialize_from(trainer.model, config.init_from, vocab)
            if env.is_main:
                print(f"initialized from {config.init_from}: {shared}/{len(vocab)} softmax rows copied")
        if env.is_main:
            save_dir.mkdir(parents=True, exist_ok=True)
            vocab.save(save_dir / "vocab.txt")
            save_config(config)
        env.barrier()
    steps = total_steps(config, config.n_train_tokens, env.world_size)
    return run_training(trainer, steps, config.max_time, progress=progress)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned_worker(
    rank: int, config: dict[str, Any], resume: bool, world_size: int, port: int, gpus: str | None
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )
    if gpus:
        os.environ["ELMOKIT_GPUS"] = gpus
    else:  # CPU processes share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    try:
        train(TrainConfig(**config), resume=resume)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch(config: TrainConfig, resume: bool, processes: int = 1, gpus: str | None = None) -> None:
    """Train in this process, or spawn one process per GPU in ``gpus`` ("0,1") or ``processes``
    CPU processes (gloo); torchrun users call ``train`` directly in every process."""
    world_size = len(gpus.split(",")) if gpus else processes
    if world_size <= 1 and not gpus:
        train(config, resume=resume)
        return
    if gpus:
        config.device = "cuda"
    import torch.multiprocessing as mp

    mp.spawn(
        _spawned_worker,
        args=(asdict(config), resume, world_size, _free_port(), gpus),
        nprocs=world_size,
        join=True,
    )
