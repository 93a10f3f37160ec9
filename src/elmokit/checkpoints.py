"""The checkpoints of a training run's save dir: their folders, pointers and rotation.

A save dir holds train_config.json, vocab.txt, metrics.csv and checkpoint folders
``checkpoint-<step>``, each with ``model.pt`` (model, optimizer, run counters, world size) and one
``rank<r>.pt`` per process (data position, LSTM state, random states). The file ``latest`` names
the newest complete checkpoint; ``best.json`` the one with the lowest held-out perplexity so far
({"folder", "step", "forward", "backward", "average"}; written only when the run has held-out
data). Kept are the best checkpoint and the newest ``keep`` up to the latest
(``--keep-checkpoints``, default 1: the latest alone), whose weights ``average_weights`` can
average. Checkpoint files are read with ``weights_only=True``: nothing but tensors and plain
containers is unpickled.

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
from .tensorfiles import load_tensors

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
    """Read a checkpoint file without unpickling arbitrary objects (``TensorFileError`` in one
    line for a damaged file or one that holds code)."""
    return load_tensors(path, map_location=device)


def save_checkpoint_file(value: dict[str, Any], path: Path) -> None:
    """Write a checkpoint file (tensors and plain containers) atomically."""
    with atomic_path(path) as tmp:
        torch.save(value, tmp)


def partial_folder(save_dir: Path, step: int) -> Path:
    """The hidden folder a checkpoint is written into until it is complete."""
    return save_dir / f".{checkpoint_name(step)}{PARTIAL_SUFFIX}"


def checkpoint_folders(save_dir: Path) -> list[Path]:
    """Every complete checkpoint folder of a save dir, oldest first."""
    return sorted(p for p in save_dir.glob("checkpoint-" + "[0-9]" * 9) if p.is_dir())


def kept_checkpoints(save_dir: Path, keep: int = 1) -> list[Path]:
    """The checkpoints a run with ``--keep-checkpoints keep`` holds, oldest first: the newest
    ``keep`` folders up to the latest, and the best. A folder newer than the latest (its pointer
    never written) or older than those is a leftover."""
    best = best_checkpoint(save_dir)
    return sorted(set(recent_checkpoints(save_dir, keep)) | ({best} if best is not None else set()))


def recent_checkpoints(save_dir: Path, keep: int) -> list[Path]:
    """The newest ``keep`` checkpoint folders up to the latest, oldest first (none without one)."""
    latest = latest_checkpoint(save_dir)
    if latest is None:
        return []
    return [p for p in checkpoint_folders(save_dir) if p.name <= latest.name][-keep:]


def prune_checkpoints(save_dir: Path, keep: int = 1) -> list[str]:
    """Delete the checkpoint folders that ``kept_checkpoints`` does not name; their names."""
    kept = set(kept_checkpoints(save_dir, keep))
    removed = []
    for path in checkpoint_folders(save_dir):
        if path not in kept:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def publish_checkpoint(save_dir: Path, partial: Path, step: int, keep: int = 1) -> Path:
    """Rename the complete ``partial`` folder to its checkpoint folder and point ``latest`` at
    it (``point_latest``); a folder of that name that the run does not keep (a crash's
    leftover) is replaced."""
    folder = save_dir / checkpoint_name(step)
    if folder.exists():
        if folder in kept_checkpoints(save_dir, keep):
            raise FileExistsError(f"{folder} is already a checkpoint of this run")
        shutil.rmtree(folder)
    os.replace(partial, folder)
    point_latest(save_dir, folder, keep)
    return folder


def remove_leftovers(save_dir: Path, keep: int = 1) -> list[str]:
    """Delete what an interrupted run can leave in its save dir: partial checkpoint folders,
    checkpoint folders the run does not keep (``kept_checkpoints``: a rotation cut short, or
    more than a smaller ``keep`` of a resumed run allows) and the temporary files of its killed
    atomic writes. Returns the names deleted."""
    removed = prune_checkpoints(save_dir, keep)
    for path in sorted(save_dir.glob(f".checkpoint-*{PARTIAL_SUFFIX}")):
        if path.is_dir():
            shutil.rmtree(path)
            removed.append(path.name)
    for name in (CHECKPOINT_POINTER, BEST_POINTER, CONFIG_FILE, VOCAB_FILE, *METRICS_FILES):
        removed += [path.name for path in remove_temporary_files(save_dir / name)]
    return removed


def point_latest(save_dir: Path, folder: Path, keep: int = 1) -> None:
    """Point ``latest`` at the complete checkpoint ``folder``, then delete the checkpoints the
    run no longer keeps (the oldest beyond ``keep``, unless it is the best)."""
    write_text(save_dir / CHECKPOINT_POINTER, folder.name + "\n")
    prune_checkpoints(save_dir, keep)


def keep_if_best(
    save_dir: Path, folder: Path, step: int, perplexity: dict[str, float], keep: int = 1
) -> bool:
    """Point best.json at ``folder`` if its held-out ``perplexity`` ({"forward", "backward",
    "average"}) is the lowest so far, and delete the checkpoint it replaces unless the run keeps
    it as one of its newest ``keep``. True if ``folder`` is now the best."""
    pointer = save_dir / BEST_POINTER
    best = json.loads(pointer.read_text(encoding="utf-8")) if pointer.is_file() else None
    if best is not None and perplexity["average"] >= best["average"]:
        return False
    write_json(pointer, {"folder": folder.name, "step": step, **perplexity})
    prune_checkpoints(save_dir, keep)
    return True


def newest_checkpoints(save_dir: Path, n: int) -> list[Path]:
    """The newest ``n`` of the checkpoints a run keeps up to its latest (its newest
    ``keep_checkpoints``, from train_config.json; an older best checkpoint is not one of them),
    oldest first; an error says how many it holds when it holds fewer."""
    if n < 1:
        raise ValueError(f"--average must be at least 1, got {n}")
    if latest_checkpoint(save_dir) is None:
        raise FileNotFoundError(f"{save_dir} has no checkpoint to average (no '{CHECKPOINT_POINTER}')")
    config = json.loads((save_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    keep = int(config.get("keep_checkpoints") or 1)
    folders = recent_checkpoints(save_dir, keep)[-n:]
    if len(folders) < n:
        raise ValueError(
            f"--average {n}: {save_dir} holds {len(folders)} recent checkpoint(s) "
            f"(steps {', '.join(str(checkpoint_step(p)) for p in folders)}; the run keeps {keep}); "
            f"train with --keep-checkpoints {n}"
        )
    return folders


def average_weights(save_dir: Path, n: int) -> tuple[dict[str, torch.Tensor], list[int]]:
    """The mean of the model weights of a save dir's newest ``n`` checkpoints up to the latest
    (a run trained with ``--keep-checkpoints n`` or more), and their steps, oldest first. Each
    floating-point tensor is averaged in float64 and stored in its own dtype; any other tensor
    must be equal in every checkpoint. A checkpoint average is often a better model than any one
    of them (Vaswani et al. 2017 averaged their last 5 checkpoints)."""
    folders = newest_checkpoints(save_dir, n)
    total: dict[str, torch.Tensor] = {}
    first: dict[str, torch.Tensor] = {}
    for folder in folders:
        weights = load_checkpoint_file(folder / "model.pt")["model"]
        if first and weights.keys() != first.keys():
            raise ValueError(f"{folder} holds other weights than {folders[0]}: not checkpoints of one model")
        for name, value in weights.items():
            if name not in first:
                first[name] = value
                total[name] = value.double() if value.is_floating_point() else value
            elif value.shape != first[name].shape:
                raise ValueError(
                    f"{folder}: {name} has shape {tuple(value.shape)}, not {tuple(first[name].shape)}"
                )
            elif value.is_floating_point():
                total[name] += value.double()
            elif not torch.equal(value, first[name]):
                raise ValueError(f"{folder}: {name} differs between checkpoints and cannot be averaged")
    mean = {
        name: (value / n).to(first[name].dtype) if first[name].is_floating_point() else value
        for name, value in total.items()
    }
    return mean, [checkpoint_step(p) for p in folders]


def checkpoint_step(folder: Path) -> int:
    """The step of a checkpoint folder, from its name."""
    return int(folder.name.rsplit("-", 1)[1])


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


def training_summary(
    save_dir: Path, checkpoint: str = "latest", averaged_steps: list[int] | None = None
) -> dict[str, Any] | None:
    """Steps, tokens, epochs and training time of a save dir's latest or best checkpoint, with
    the run's configuration (None for a folder without a checkpoint); ``averaged_steps``, the
    checkpoints whose mean the model is, are recorded with them."""
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
        **({"averaged_steps": averaged_steps} if averaged_steps else {}),
        "config": config,
    }
