"""The checkpoints of a training run's save dir: their folders, pointers and rotation.

A save dir holds train_config.json, vocab.txt, metrics.csv and checkpoint folders
``checkpoint-<step>``, each with ``model.pt`` (model, optimizer, run counters, world size) and one
``rank<r>.pt`` per process (data position, LSTM state, random states). The file ``latest`` names
the newest complete checkpoint; ``best.json`` the one with the lowest held-out perplexity so far
({"folder", "step", "forward", "backward", "average"}; written only when the run has held-out
data). Only those two checkpoints are kept. Checkpoint files are read with ``weights_only=True``:
nothing but tensors and plain containers is unpickled.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .atomic import atomic_path, write_json, write_text

CHECKPOINT_POINTER = "latest"
BEST_POINTER = "best.json"
CONFIG_FILE = "train_config.json"


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
