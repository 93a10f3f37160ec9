"""Training the biLM with the original recipe, the same loop on a CPU, one GPU or DDP processes.

The recipe (bilm-tf): each batch row is a stream of sentences cut into windows of
``unroll_steps`` tokens; LSTM states carry from one window to the next and back-propagation stops
at the window boundary; the loss is 0.5 * (mean forward + mean backward cross-entropy) with a
sampled softmax shared by both directions, multiplied by ``unroll_steps`` before the gradient;
Adagrad (lr 0.2, initial accumulator 1.0); gradients clipped to a global norm of 10; dropout 0.1
on each LSTM layer's input and on the top layer's output.

The loop is here; the model is in lm/language_model.py, the save dir's checkpoints in
lm/checkpoints.py, its CSV logs in training/metrics.py, the collectives of a multi-process run
in training/collectives.py, held-out perplexity in training/evaluate.py, model folders in
training/export.py, the run's configuration in training/config.py. Each process of a run calls
``train`` with the configuration ``config.prepare_run`` gave; the processes are started by the command line
(training/launch.py) or by torchrun.
"""

from __future__ import annotations

import errno
import logging
import math
import shutil
import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from ..base.atomic import write_text
from ..base.devices import Process
from ..base.signals import STOP_SIGNALS, installed
from ..lm.checkpoints import (
    CHECKPOINT_POINTER,
    VOCAB_FILE,
    SaveFolder,
    checkpoint_name,
    load_checkpoint_file,
    rng_state,
    save_checkpoint_file,
    set_rng_state,
)
from ..lm.language_model import LanguageModel, batch_tensors
from ..lm.vocabulary import Vocabulary
from ..model.lstm import LstmState
from ..model.options import BiLMOptions
from .collectives import Distributed, setup_distributed
from .config import TrainConfig, TrainingError, save_config
from .data import (
    HELDOUT_BATCH_SIZE,
    BidirectionalLMBatches,
    corpus_files,
    count_tokens,
    heldout_batches,
)
from .evaluate import Perplexity, evaluate_perplexity
from .metrics import MetricsLog, append_heldout, check_logs, truncate_log

__all__ = ["train"]

logger = logging.getLogger(__name__)


class Interrupted(KeyboardInterrupt):
    """A run stopped at once by a second SIGINT/SIGTERM: the steps since its last checkpoint are
    lost (that checkpoint is kept)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopRequest:
    """While the block runs, turns SIGINT/SIGTERM into a request to stop after the current step
    (a second signal interrupts at once with ``Interrupted``), so an interrupted run ends with a
    checkpoint; in the main thread only, and the handlers found are restored afterwards
    (``signals.installed``).

    A repeat within ``REPEAT_SECONDS`` is the same request: a process of a multi-process run may
    get one Ctrl-C both from the terminal and from its launcher, which passes it on."""

    REPEAT_SECONDS = 1.0

    def __init__(self) -> None:
        self.signum = 0  # the signal that requested the stop (0: none)
        self._since = 0.0
        self._handlers = ExitStack()

    @property
    def requested(self) -> bool:
        return self.signum != 0

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            if time.monotonic() - self._since >= self.REPEAT_SECONDS:
                raise Interrupted(signum)
            return
        self.signum, self._since = signum, time.monotonic()
        logger.warning(
            "%s: stopping after this step with a checkpoint (send it again to stop at once)",
            signal.Signals(signum).name,
        )

    def __enter__(self) -> StopRequest:
        self._handlers.enter_context(installed(dict.fromkeys(STOP_SIGNALS, self._handle)))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handlers.close()


@dataclass
class RunState:
    """How far the run is: optimizer steps, training tokens, seconds of training."""

    step: int = 0
    tokens: int = 0  # training tokens seen by all processes (each direction counted once)
    seconds: float = 0.0


@dataclass
class Outcome:
    """How a training session ended: the run's state, and the limit that ended it (e.g.
    "--max-steps 6") or the signal that stopped it early."""

    run: RunState
    ended_by: str
    signal: int | None = None  # set when a signal stopped the run before its limits

    @property
    def finished(self) -> bool:
        """False when a signal stopped the run early (it can be resumed)."""
        return self.signal is None


class Trainer:
    """One process's share of a training run."""

    def __init__(
        self,
        config: TrainConfig,
        data: Any,
        vocab_size: int,
        env: Distributed,
        vocab: Vocabulary | None = None,
    ):
        self.config, self.data, self.env = config, data, env
        self.vocab = vocab  # for held-out evaluation (read from config.vocab when None)
        self.save_dir = Path(config.save_dir)
        self.save_folder = SaveFolder(self.save_dir)
        torch.manual_seed(config.seed)
        self.model = LanguageModel(config.options, vocab_size, config.dropout).to(env.device)
        self.module: nn.Module = self.model
        if env.process.distributed:
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
        self.generator = torch.Generator().manual_seed(config.seed * 1000 + env.process.rank)
        self.lstm_state: LstmState | None = None
        self.grad_norm = 0.0  # the last step's global gradient norm before clipping
        self.run = RunState()
        self.saved_step: int | None = None  # the step of the last checkpoint written or loaded
        self.num_sampled: int | None = (
            config.n_negative_samples if vocab_size > config.n_negative_samples else None
        )

    # -- one step ------------------------------------------------------------------------------
    def step(self, batch: dict[str, np.ndarray]) -> tuple[float, float]:
        """One optimizer step on one batch; returns the forward and backward mean losses."""
        char_ids, targets = batch_tensors(batch, self.env.device)
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
        check = self.env.sum(loss.detach().clone())
        if not torch.isfinite(check):
            kept = (
                f"its last checkpoint, step {self.saved_step}, is kept in {self.save_dir}"
                if self.saved_step is not None
                else "it had not written a checkpoint yet"
            )
            raise TrainingError(
                f"non-finite loss ({float(check)}) at step {self.run.step + 1}; the run stopped; {kept}"
            )
        self.optimizer.zero_grad(set_to_none=True)
        (loss * self.config.unroll_steps).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_norm)
        self.grad_norm = float(norm)
        self.optimizer.step()
        per_direction = self.env.mean(losses.detach())
        self.run.step += 1
        self.run.tokens += char_ids.shape[1] * char_ids.shape[2] * self.env.process.world_size
        return float(per_direction[0]), float(per_direction[1])

    def _reset_some_states(self) -> None:
        """Zero each row's carried state with probability ``config.state_reset``."""
        if self.config.state_reset <= 0 or self.lstm_state is None:
            return
        batch = self.lstm_state.h.shape[2]
        keep = torch.rand(batch, generator=self.generator) >= self.config.state_reset
        keep = keep.to(self.env.device, self.lstm_state.h.dtype)[:, None]
        self.lstm_state = LstmState(self.lstm_state.h * keep, self.lstm_state.c * keep)

    # -- held-out perplexity --------------------------------------------------------------------
    def evaluate_heldout(self) -> Perplexity | None:
        """Full-softmax perplexity of ``config.heldout`` (main process), appended to heldout.csv."""
        result = None
        if self.config.heldout and self.env.process.is_main:
            vocab = self.vocab
            if vocab is None:
                if self.config.vocab is None:
                    raise TrainingError("--heldout needs the run's vocabulary: pass --vocab")
                vocab = Vocabulary.from_file(self.config.vocab)
            start = time.monotonic()
            result = evaluate_perplexity(self.model, vocab, self.config.heldout, device=self.env.device)
            append_heldout(self.save_dir / "heldout.csv", self.run.step, self.run.tokens, result)
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
            figures = {"forward": result.forward, "backward": result.backward, "average": result.average}
            self.save_folder.keep_if_best(folder, self.run.step, figures, self.config.keep_checkpoints)
        self.env.barrier()

    def save_checkpoint(self) -> Path:
        """Write all processes' state into a partial folder, rename it to the checkpoint's name
        and point ``latest`` at it; the previous latest is deleted unless it is the best so far.
        A failed write (a full disk, ...) removes the partial folder and raises TrainingError:
        the previous checkpoint stays the latest."""
        partial = self.save_folder.partial_folder(self.run.step)

        def make_folder() -> None:
            if self.env.process.is_main:
                shutil.rmtree(partial, ignore_errors=True)
                partial.mkdir()

        def write_files() -> None:
            rank_state = {
                "data": self.data.state_dict(),
                "lstm_state": None if self.lstm_state is None else tuple(self.lstm_state),
                "rng": rng_state(),
                "generator": self.generator.get_state(),
            }
            save_checkpoint_file(rank_state, partial / f"rank{self.env.process.rank}.pt")
            if self.env.process.is_main:
                shared = {
                    "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "run": asdict(self.run),
                    "world_size": self.env.process.world_size,
                }
                save_checkpoint_file(shared, partial / "model.pt")

        def publish() -> None:
            if self.env.process.is_main:
                self.save_folder.publish_checkpoint(partial, self.run.step, self.config.keep_checkpoints)

        for action in (make_folder, write_files, publish):
            self._on_every_process(action, partial)
        self.saved_step = self.run.step
        return self.save_dir / checkpoint_name(self.run.step)

    def _on_every_process(self, action: Callable[[], None], partial: Path) -> None:
        """Run one part of writing a checkpoint on every process; when it fails on any of them,
        every process raises TrainingError (after the main one deleted ``partial``)."""
        error: BaseException | None = None
        try:
            action()
        except (OSError, RuntimeError) as err:
            error = err
        if not self.env.any(error is not None):
            return
        cause = _write_failure(error, self.save_dir)  # before the partial folder frees its space
        if self.env.process.is_main:
            shutil.rmtree(partial, ignore_errors=True)
        previous = (
            f"the previous checkpoint (step {self.saved_step}) is still the latest"
            if self.saved_step is not None
            else "no earlier checkpoint exists"
        )
        raise TrainingError(
            f"writing the checkpoint of step {self.run.step} in {self.save_dir} failed: {cause}; {previous}"
        ) from None

    def load_checkpoint(self, folder: Path, data: bool = True) -> None:
        """Continue exactly where ``folder`` stopped; ``data=False``: except for the position in the
        corpus, which starts at the beginning of this trainer's (new) corpus."""
        try:
            shared = load_checkpoint_file(folder / "model.pt", self.env.device)
            mine = load_checkpoint_file(folder / f"rank{self.env.process.rank}.pt")
        except (OSError, RuntimeError) as err:
            raise TrainingError(f"cannot read the checkpoint {folder}: {err}") from None
        if shared["world_size"] != self.env.process.world_size:
            raise TrainingError(
                f"{folder} was written by {shared['world_size']} processes; resume with as many "
                f"(now {self.env.process.world_size})"
            )
        self.model.load_state_dict(shared["model"])
        fused = [group["fused"] for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(shared["optimizer"])
        for group, flag in zip(self.optimizer.param_groups, fused):  # this device's choice
            group["fused"] = flag
        self.run = RunState(**shared["run"])
        if data:
            self.data.load_state_dict(mine["data"])
        if mine["lstm_state"] is not None:
            self.lstm_state = LstmState(*(t.to(self.env.device) for t in mine["lstm_state"]))
        set_rng_state(mine["rng"])
        self.generator.set_state(mine["generator"])
        self.saved_step = self.run.step


def _write_failure(error: BaseException | None, folder: Path) -> str:
    """What went wrong writing into ``folder``, in words (a full disk said so)."""
    if error is None:
        return "another process could not write its part"
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    # torch's own writer says only "unexpected pos A vs B" when the disk took fewer bytes
    short_write = isinstance(error, RuntimeError) and "unexpected pos" in str(error)
    if getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or free == 0 or short_write:
        return "the disk is full (no space left on device)"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def run_training(
    trainer: Trainer,
    max_steps: int | None,
    max_time: float | None,
    progress: bool = True,
    step_limit: str | None = None,
) -> Outcome:
    """Train until ``max_steps`` (total, counting resumed steps) or ``max_time`` seconds of this
    session, checkpointing every ``checkpoint_minutes`` and at the end (unless the last step has
    its checkpoint already). ``step_limit`` names the step limit in the outcome (default
    "--max-steps N"). metrics.csv and heldout.csv lose any rows past the step the run starts
    from (steps a crash made the run repeat). While it runs, SIGINT and SIGTERM ask it to stop
    after the current step with a checkpoint (``StopRequest``: in the main thread, the handlers
    found restored when it returns)."""
    env = trainer.env
    metrics = None
    if env.process.is_main:
        metrics = MetricsLog(trainer.save_dir / "metrics.csv", after=trainer.run.step)
        truncate_log(trainer.save_dir / "heldout.csv", trainer.run.step)
    bar = tqdm(
        total=max_steps,
        initial=trainer.run.step,
        unit="step",
        disable=not (progress and env.process.is_main),
        dynamic_ncols=True,
    )
    with StopRequest() as stop:  # also through the last checkpoint: a stop request waits for it
        try:
            reason = _loop(trainer, metrics, bar, max_steps, max_time, stop)
        finally:
            bar.close()
        if trainer.run.step != trainer.saved_step:
            trainer.checkpoint_and_evaluate()
    if reason == "signal":
        return Outcome(trainer.run, signal.Signals(stop.signum).name, signal=stop.signum)
    if reason == "time":
        return Outcome(trainer.run, f"--max-time {max_time:g} s")
    if reason == "steps":
        return Outcome(trainer.run, step_limit or f"--max-steps {max_steps}")
    return Outcome(trainer.run, "the end of the data")


def _loop(
    trainer: Trainer,
    metrics: MetricsLog | None,
    bar: tqdm,
    max_steps: int | None,
    max_time: float | None,
    stop: StopRequest,
) -> str:
    """Steps until ``max_steps`` ("steps"), ``max_time`` ("time") or the data ("data") ends or
    a signal asks to stop ("signal"); returns which."""
    config, env = trainer.config, trainer.env
    start = last_checkpoint = time.monotonic()
    window_tokens, window_start = 0, time.monotonic()
    base_seconds = trainer.run.seconds
    batches = iter(trainer.data)
    while True:
        if max_steps is not None and trainer.run.step >= max_steps:
            return "steps"
        batch = next(batches, None)
        if batch is None:
            return "data"
        fwd, bwd = trainer.step(batch)
        window_tokens += batch["token_ids"].size * env.process.world_size
        trainer.run.seconds = base_seconds + time.monotonic() - start
        if trainer.run.step % config.log_every == 0 or trainer.run.step == 1:
            rate = window_tokens / max(time.monotonic() - window_start, 1e-9)
            window_tokens, window_start = 0, time.monotonic()
            _report(bar, metrics, trainer.run, fwd, bwd, rate, trainer.grad_norm)
        bar.update(1)
        now = time.monotonic()
        # one collective a step: every process stops (or checkpoints) at the same step
        signum, out_of_time, due = env.max(
            float(stop.signum),
            float(max_time is not None and now - start >= max_time),
            float(now - last_checkpoint >= config.checkpoint_minutes * 60),
        )
        if signum:
            stop.signum = int(signum)  # the same on every process
            return "signal"
        if out_of_time:
            return "time"
        if due:
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


def total_steps(config: TrainConfig, n_train_tokens: int, world_size: int) -> int | None:
    """Steps for ``epochs`` passes (bilm-tf: n_train_tokens / (batch * unroll * processes))."""
    steps = config.max_steps
    if config.epochs is not None:
        per_epoch = max(1, n_train_tokens // (config.batch_size * config.unroll_steps * world_size))
        by_epochs = int(config.epochs * per_epoch)
        steps = by_epochs if steps is None else min(steps, by_epochs)
    return steps


def check_heldout(pattern: str, vocab: Vocabulary, max_chars: int) -> None:
    """Raise TrainingError now, not at the first checkpoint, when the held-out text cannot be
    evaluated: no files match, they hold no text, or less than bilm-tf's protocol needs."""
    try:
        first = next(heldout_batches(pattern, vocab, max_characters_per_token=max_chars), None)
    except (OSError, ValueError) as err:
        raise TrainingError(f"--heldout {pattern}: {err}") from None
    if first is None:
        raise TrainingError(
            f"--heldout {pattern}: too little text for bilm-tf's evaluation protocol, which needs "
            f"at least {HELDOUT_BATCH_SIZE} sentences (one batch of {HELDOUT_BATCH_SIZE} streams)"
        )


def train(
    config: TrainConfig,
    resume: bool = False,
    progress: bool = True,
    new_data: bool = False,
    resume_from: str | None = None,
    process: Process | None = None,
) -> Outcome:
    """Run (or resume) training in this process; every process of a run calls this, with the
    configuration ``config.prepare_run`` gave (for a resumed run: of ``config.resume_config``).
    A resumed run continues from the checkpoint ``latest`` names, or the one ``resume_from``
    names (``checkpoint-<step>`` of the save dir; ``latest`` then names it); a save dir without
    any checkpoint starts from step 0. ``new_data`` (with ``resume``): the corpus changed (more
    or other text); weights, optimizer state and step continue, the corpus is read from its
    beginning and its size is counted again. ``process``: ``devices.this_process()``. Returns
    how the session ended; SIGINT or SIGTERM stop it after the current step (``run_training``)."""
    env = setup_distributed(config, process)
    save_dir = Path(config.save_dir)
    save_folder = SaveFolder(save_dir)
    latest = save_folder.resume_point(resume_from) if resume else None
    if env.process.is_main:
        removed = save_folder.remove_leftovers()
        if removed:
            logger.info("removed what an interrupted run left in %s: %s", save_dir, ", ".join(removed))
    own_vocab = save_dir / VOCAB_FILE
    if resume and own_vocab.is_file():
        vocab = Vocabulary.from_file(own_vocab)
    elif config.vocab is None:
        raise TrainingError(f"{save_dir} has no {VOCAB_FILE} and its configuration names none: pass --vocab")
    else:
        vocab = Vocabulary.from_file(config.vocab)
    files = corpus_files(config.train)
    n_tokens = config.n_train_tokens
    if new_data or n_tokens is None or (config.n_negative_samples < len(vocab) and not resume):
        counts = count_tokens(files)
        if not counts:
            raise TrainingError(f"empty corpus: {config.train} holds no tokens")
        n_tokens = sum(counts.values())
        config = replace(config, n_train_tokens=n_tokens)
        if config.n_negative_samples < len(vocab) and not resume:
            vocab.check_sorted_by_frequency(counts)
    max_chars = BiLMOptions.from_dict(config.options).char_cnn.max_characters_per_token
    if config.heldout:
        check_heldout(config.heldout, vocab, max_chars)
    data = BidirectionalLMBatches(
        files,
        vocab,
        config.batch_size,
        config.unroll_steps,
        seed=config.seed,
        rank=env.process.rank,
        world_size=env.process.world_size,
        max_characters_per_token=max_chars,
    )
    trainer = Trainer(config, data, len(vocab), env, vocab=vocab)
    if latest is not None:
        trainer.load_checkpoint(latest, data=not new_data)
        newer = [p.name for p in save_folder.checkpoint_folders() if p.name > latest.name]
        if newer and env.process.is_main:
            logger.info(
                "resuming from %s; %s, written after it by a run that stopped before pointing "
                "'latest' at it, will be replaced at its step",
                latest.name,
                ", ".join(newer),
            )
        if new_data and env.process.is_main:
            logger.info(
                "continuing step %s on a new corpus (%s tokens), from its beginning",
                f"{trainer.run.step:,}",
                f"{n_tokens:,}",
            )
    else:
        if resume and env.process.is_main:
            logger.info(
                "%s has no checkpoint (its run stopped before the first): starting at step 0", save_dir
            )
        if config.init_from:
            shared = initialize_from(trainer.model, config.init_from, vocab)
            if env.process.is_main:
                logger.info(
                    "initialized from %s: %d/%d softmax rows copied", config.init_from, shared, len(vocab)
                )
    if env.process.is_main:
        check_logs(save_dir)  # a log the run cannot read stops it before it writes anything
    if env.process.is_main:  # every check passed: the save dir is made and written from here on
        save_dir.mkdir(parents=True, exist_ok=True)
        if latest is None:
            vocab.save(own_vocab)
        elif resume_from is not None:  # the run goes on from here: a plain --resume finds it
            write_text(save_dir / CHECKPOINT_POINTER, latest.name + "\n")
        save_config(config)  # with the changes of this session
    env.barrier()
    steps = total_steps(config, n_tokens, env.process.world_size)
    by_epochs = steps is not None and config.epochs is not None and steps != config.max_steps
    limit = f"--epochs {config.epochs:g} ({steps:,} steps)" if by_epochs else None
    return run_training(trainer, steps, config.max_time, progress=progress, step_limit=limit)


def initialize_from(model: LanguageModel, source_dir: str | Path, vocab: Vocabulary) -> int:
    """Start from a trained model (the original's restart for domain adaptation): copy the biLM
    and the softmax rows of every token that both vocabularies hold. Returns that count."""
    source = LanguageModel.from_pretrained(source_dir, device="cpu")
    source_vocab = source.vocab
    model.bilm.load_state_dict(source.bilm.state_dict())
    new_ids, old_ids = [], []
    for token in vocab.tokens:
        if token in source_vocab:
            new_ids.append(vocab.token_to_id(token))
            old_ids.append(source_vocab.token_to_id(token))
    softmax, source_softmax = model.softmax, source.softmax
    if softmax is None or source_softmax is None:
        raise TrainingError(f"--init-from {source_dir}: the model has no softmax to start from")
    with torch.no_grad():
        softmax.weight[new_ids] = source_softmax.weight[old_ids]
        softmax.bias[new_ids] = source_softmax.bias[old_ids]
    return len(new_ids)
