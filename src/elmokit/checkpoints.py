"""The checkpoints of a training run's save dir: their folders, pointers and rotation.

A save dir holds train_config.json, vocab.txt, metrics.csv and checkpoint folders
``checkpoint-<step>``, each with ``model.pt`` (model, optimizer, run counters, world size) and one
``rank<r>.pt`` per process (data position, LSTM state, random states). The file ``latest`` names
the newest complete checkpoint; ``best.json`` the one with the lowest held-out perplexity so far
({"folder", "step", "forward", "backward", "average"}; written only when the run has held-out
data). Only those two checkpoints are kept. Checkpoint files are read with ``weights_only=True``:
nothing but tensors and plain containers is unpickled.

A checkpoint is written into a hidden folder ``.checkpoint-<step>.partial`` that is renamed to
its name only when every file is complete, and ``latest`` then switched to it, so a crash never
leaves a partial checkpoint under a checkpoint's name; ``remove_leftovers`` deletes what a crash
can leave (a partial folder, a checkpoint no pointer names, temporary files) when a run starts.
train_config.json holds the run's configuration without its save dir: a save dir may be moved.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .atomic import atomic_path, write_json, write_text
from .atomic import remove_leftovers as remove_temporary_files

CHECKPOINT_POINTER = "latest"
BEST_POINTER = "best.json"
CONFIG_FILE = "train_config.json"
PARTIAL_SUFFIX = ".partial"
VOCAB_FILE = "vocab.txt"
METRICS_FILES = ("metrics.csv", "heldout.csv")


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint after ``step`` steps."""
    return f"checkpoint-{step:09d}"


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


def save_checkpoint_file(value: dict[str, Any], path: Path) -> None:
    """Write a checkpoint file (tensors and plain containers) atomically."""
    with atomic_path(path) as tmp:
        torch.save(value, tmp)


def partial_folder(save_dir: Path, step: int) -> Path:
    """The hidden folder a checkpoint is written into until it is complete."""
    return save_dir / f".{checkpoint_name(step)}{PARTIAL_SUFFIX}"


def publish_checkpoint(save_dir: Path, partial: Path, step: int) -> Path:
    """Rename the complete ``partial`` folder to its checkpoint folder and point ``latest`` at
    it; a folder of that name that no pointer names (a crash's leftover) is replaced."""
    folder = save_dir / checkpoint_name(step)
    if folder.exists():
        if folder in (latest_checkpoint(save_dir), best_checkpoint(save_dir)):
            raise FileExistsError(f"{folder} is already a checkpoint of this run")
        shutil.rmtree(folder)
    os.replace(partial, folder)
    point_latest(save_dir, folder)
    return folder


def remove_leftovers(save_dir: Path) -> list[str]:
    """Delete what an interrupted run can leave in its save dir: partial checkpoint folders,
    checkpoint folders that neither ``latest`` nor ``best.json`` names (a rotation cut short)
    and the temporary files of its killed atomic writes. Returns the names deleted."""
    keep = {latest_checkpoint(save_dir), best_checkpoint(save_dir)}
    removed = []
    folders = sorted(save_dir.glob("checkpoint-" + "[0-9]" * 9))
    for path in folders + sorted(save_dir.glob(f".checkpoint-*{PARTIAL_SUFFIX}")):
        if path.is_dir() and path not in keep:
            shutil.rmtree(path)
            removed.append(path.name)
    for name in (CHECKPOINT_POINTER, BEST_POINTER, CONFIG_FILE, VOCAB_FILE, *METRICS_FILES):
        removed += [path.name for path in remove_temporary_files(save_dir / name)]
    return removed


def point_latest(save_dir: Path, folder: Path) -> None:
    """Point ``latest`` at the complete checkpoint ``folder``; the previous latest is deleted
    unless it is the best."""
    previous = latest_checkpoint(save_dir)
    write_text(save_dir / CHECKPOINT_POINTER, folder.name + "\n")
    if previous not in (None, folder, best_checkpoint(save_dir)):
        shutil.rmtree(previous, ignore_errors=True)


def keep_if_best(save_dir: Path, folder: Path, step: int, perplexity: dict[str, float]) -> bool:
    """Point best.json at ``folder`` if its held-out ``perplexity`` ({"forward", "backward",
    "average"}) is the lowest so far, and delete the checkpoint it replaces unless that one is
    the latest. True if ``folder`` is now the best."""
    pointer = save_dir / BEST_POINTER
    best = json.loads(pointer.read_text(encoding="utf-8")) if pointer.is_file() else None
    if best is not None and perplexity["average"] >= best["average"]:
        return False
    write_json(pointer, {"folder": folder.name, "step": step, **perplexity})
    latest = latest_checkpoint(save_dir)
    if best is not None and best["folder"] not in (folder.name, latest.name if latest else None):
        shutil.rmtree(save_dir / best["folder"], ignore_errors=True)
    return True


def rng_state() -> dict[str, Any]:
    """This process's random states (torch, Python, NumPy, CUDA) as tensors and plain values."""
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    np_state = np.random.get_state()
    state["numpy"] = {
        "keys": torch.from_numpy(np_state[1].astype(np.int64)),
        "pos": int(np_state[2]),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the random states that ``rng_state`` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    keys = state["numpy"]["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, state["numpy"]["pos"], 0, 0.0))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def training_summary(save_dir: Path, checkpoint: str = "latest") -> dict[str, Any] | None:
    """Steps, tokens, epochs and training time of a save dir's latest or best checkpoint, with
    the run's configuration (None for a folder without a checkpoint)."""
    folder = checkpoint_folder(save_dir, checkpoint)
    if folder is None:
        return None
    run = load_checkpoint_file(folder / "model.pt")["run"]
    config = json.loads((save_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    n_train = config.get("n_train_tokens")
    return {
        "steps": int(run["step"]),
        "tokens": int(run["tokens"]),
        "epochs": round(run["tokens"] / n_train, 3) if n_train else None,
        "training_hours": round(run["seconds"] / 3600, 2),
        "checkpoint": checkpoint,
        "config": config,
    }
