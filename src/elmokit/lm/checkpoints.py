"""The checkpoints of a training run's save dir (``SaveFolder``): their folders, pointers and
rotation, and the checkpoint files themselves.

A save dir holds train_config.json, vocab.txt, metrics.csv and checkpoint folders
``checkpoint-<step>``, each with ``model.pt`` (model, optimizer, run counters, world size) and one
``rank<r>.pt`` per process (data position, LSTM state, random states). The file ``latest`` names
the newest complete checkpoint; ``best.json`` the one with the lowest held-out perplexity so far
({"folder", "step", "forward", "backward", "average"}; written only when the run has held-out
data). Kept are the best checkpoint and the newest ``keep`` up to the latest
(``--keep-checkpoints``, default 1: the latest alone), whose weights ``SaveFolder.average_weights``
can average. Checkpoint files are read with ``weights_only=True``: nothing but tensors and plain
containers is unpickled.

A checkpoint is written into a hidden folder ``.checkpoint-<step>.partial``; when every file is
complete, ``manifest.json`` (each file's size and SHA-256) is written last and the folder renamed
to its name, and ``latest`` then switched to it: a folder under a checkpoint's name is complete,
and reading one of its files checks it against the manifest (torch's zip reader does not check
its CRCs). A checkpoint written before manifests existed has its files' zip CRCs checked instead.

Nothing but a crash's provable leftovers is deleted when a run starts: ``.partial`` folders and
the temporary files of killed atomic writes. A complete checkpoint is deleted only by the rotation
of a run whose pointers are sound (``SaveFolder.prune_checkpoints``: older than the latest, beyond ``keep``,
not the best). A pointer (``latest``, best.json's folder, ``--resume-from``) must name a
``checkpoint-<step>`` folder directly inside the save dir; a missing, dangling or outside one is an
error that lists the checkpoints the save dir holds and how to name one.
train_config.json holds the run's configuration without its save dir: a save dir may be moved.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ..base import jsonfiles
from ..base.atomic import atomic_path, write_json, write_text
from ..base.atomic import remove_leftovers as remove_temporary_files
from ..base.digests import file_digest
from ..base.tensorfiles import load_tensors

__all__ = ["SaveFolder"]

CHECKPOINT_POINTER = "latest"
BEST_POINTER = "best.json"
CONFIG_FILE = "train_config.json"
PARTIAL_SUFFIX = ".partial"
VOCAB_FILE = "vocab.txt"
METRICS_FILES = ("metrics.csv", "heldout.csv")
MANIFEST_FILE = "manifest.json"
CHECKPOINT_NAME = re.compile(r"checkpoint-[0-9]{9}")

logger = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A save dir whose pointers or checkpoint files cannot be trusted: a missing, dangling or
    outside pointer, a damaged record, a file that differs from its manifest."""


def read_json(path: Path) -> Any:
    """The JSON value of a save dir's file (``elmokit.base.jsonfiles.read_json``); a file that
    is not JSON is a CheckpointError that names it and the cause."""
    return jsonfiles.read_json(path, CheckpointError, path.name)


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint after ``step`` steps."""
    return f"checkpoint-{step:09d}"


class SaveFolder:
    """A training run's save dir (``path``): its checkpoint folders, their pointers and their
    rotation, as the module's docstring describes them."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"SaveFolder({str(self.path)!r})"

    def checkpoint_choices(self) -> str:
        """What an error about a save dir's pointers adds: the checkpoints it holds and how to name
        one instead of the pointer."""
        found = self.checkpoint_folders()
        if not found:
            return f"{self.path} holds no checkpoint folder"
        names = ", ".join(p.name for p in found)
        return (
            f"{self.path} holds {names}; name one: --resume-from {found[-1].name} (train) or "
            f"--checkpoint {found[-1].name} (export, evaluate)"
        )

    def named_checkpoint(self, name: str, source: str) -> Path:
        """The checkpoint folder ``name`` (``checkpoint-<step>``) directly inside the save dir, which
        ``source`` (a pointer file, an option) names; anything else is a CheckpointError."""
        name = name.strip()
        if not CHECKPOINT_NAME.fullmatch(name):
            raise CheckpointError(
                f"{source} names {name[:80]!r}, which is not a checkpoint folder of the save dir "
                f"(checkpoint-<9 digits>, inside it); {self.checkpoint_choices()}"
            )
        folder = self.path / name
        if folder.is_symlink():
            raise CheckpointError(
                f"{source} names {name}, which is a link; a checkpoint folder must be inside the save dir"
            )
        if not folder.is_dir():
            raise CheckpointError(f"{source} names {name}, which does not exist; {self.checkpoint_choices()}")
        return folder

    def latest_checkpoint(self) -> Path | None:
        """The folder of the newest complete checkpoint; None when the save dir has no ``latest`` and
        no checkpoint folder (a run that stopped before its first checkpoint, or no run). A missing
        ``latest`` beside checkpoint folders, or one that names anything but a checkpoint folder of
        the save dir, is a CheckpointError."""
        pointer = self.path / CHECKPOINT_POINTER
        if not (pointer.exists() or pointer.is_symlink()):
            if self.checkpoint_folders():
                raise CheckpointError(
                    f"{pointer} is missing, so which checkpoint is the latest is unknown; "
                    f"{self.checkpoint_choices()}"
                )
            return None
        if not pointer.is_file():
            raise CheckpointError(f"{pointer} is not a file; {self.checkpoint_choices()}")
        try:
            text = pointer.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            text = "(not text)"
        return self.named_checkpoint(text, str(pointer))

    def read_best(self) -> dict[str, Any] | None:
        """best.json's record ({"folder", "step", "forward", "backward", "average"}), or None when
        the run has none; a record that is not one (or names anything but a checkpoint folder
        name) is a CheckpointError."""
        pointer = self.path / BEST_POINTER
        if not pointer.exists():
            return None
        best = read_json(pointer)
        folder = best.get("folder") if isinstance(best, dict) else None
        average = best.get("average") if isinstance(best, dict) else None
        if not isinstance(folder, str) or not CHECKPOINT_NAME.fullmatch(folder):
            raise CheckpointError(
                f"{pointer}: its 'folder' is {folder!r}, not a checkpoint folder of the save dir "
                f"(checkpoint-<9 digits>); {self.checkpoint_choices()}"
            )
        if isinstance(average, bool) or not isinstance(average, (int, float)):
            raise CheckpointError(f"{pointer}: its 'average' perplexity is {average!r}, not a number")
        return best

    def best_checkpoint(self) -> Path | None:
        """The folder of the checkpoint with the lowest held-out perplexity so far; None when the run
        has none, or when it is gone (deleted by hand: its perplexity stays the one to beat)."""
        best = self.read_best()
        if best is None:
            return None
        folder = self.path / best["folder"]
        return folder if folder.is_dir() else None

    def checkpoint_folder(self, which: str = "latest") -> Path | None:
        """A save dir's "latest" or "best" checkpoint folder, or the one named ``checkpoint-<step>``
        (None when it has no latest, or no best.json)."""
        if which == "latest":
            return self.latest_checkpoint()
        if which == "best":
            best = self.read_best()
            if best is None:
                return None
            return self.named_checkpoint(best["folder"], str(self.path / BEST_POINTER))
        if CHECKPOINT_NAME.fullmatch(which):
            return self.named_checkpoint(which, "--checkpoint")
        raise ValueError(
            f"checkpoint must be 'latest', 'best' or a checkpoint-<step> folder name, got {which!r}"
        )

    def resume_point(self, name: str | None = None) -> Path | None:
        """The checkpoint a resumed run continues from: ``name`` (``--resume-from``; refused while
        newer checkpoints exist, which the run would replace), else the one ``latest`` names; None
        when the run has no checkpoint yet. Checks best.json too, so that a
        damaged one stops the run before it trains, not at its first checkpoint."""
        self.read_best()
        if name is None:
            return self.latest_checkpoint()
        folder = self.named_checkpoint(name, "--resume-from")
        newer = [p.name for p in self.checkpoint_folders() if p.name > folder.name]
        if newer:
            raise CheckpointError(
                f"--resume-from {folder.name}: {self.path} holds newer checkpoints ({', '.join(newer)}), "
                "which the resumed run would replace when it reaches their steps; move them out of the "
                "save dir first (or resume from the newest)"
            )
        return folder

    def partial_folder(self, step: int) -> Path:
        """The hidden folder a checkpoint is written into until it is complete."""
        return self.path / f".{checkpoint_name(step)}{PARTIAL_SUFFIX}"

    def checkpoint_folders(self) -> list[Path]:
        """Every complete checkpoint folder of a save dir, oldest first."""
        return sorted(p for p in self.path.glob("checkpoint-" + "[0-9]" * 9) if p.is_dir())

    def kept_checkpoints(self, keep: int = 1) -> list[Path]:
        """The checkpoints a run with ``--keep-checkpoints keep`` holds, oldest first: the newest
        ``keep`` folders up to the latest, and the best."""
        best = self.best_checkpoint()
        return sorted(set(self.recent_checkpoints(keep)) | ({best} if best is not None else set()))

    def recent_checkpoints(self, keep: int) -> list[Path]:
        """The newest ``keep`` checkpoint folders up to the latest, oldest first (none without one)."""
        latest = self.latest_checkpoint()
        if latest is None:
            return []
        return [p for p in self.checkpoint_folders() if p.name <= latest.name][-keep:]

    def prune_checkpoints(self, keep: int = 1) -> list[str]:
        """The rotation of a run whose pointers are sound: delete the checkpoint folders older than
        the latest that ``kept_checkpoints`` does not name; their names. A folder newer than the
        latest is never deleted here."""
        latest = self.latest_checkpoint()
        if latest is None:
            return []
        kept = set(self.kept_checkpoints(keep))
        removed = []
        for path in self.checkpoint_folders():
            if path not in kept and path.name < latest.name:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
        return removed

    def publish_checkpoint(self, partial: Path, step: int, keep: int = 1) -> Path:
        """Write the manifest of the complete ``partial`` folder, rename it to its checkpoint folder
        and point ``latest`` at it (``point_latest``). A folder of that name newer than the latest
        (this run's own step, written before a crash or before the checkpoint the run resumed from)
        is replaced, and said so."""
        write_manifest(partial, step)
        folder = self.path / checkpoint_name(step)
        if folder.exists():
            if folder in self.kept_checkpoints(keep):
                raise FileExistsError(f"{folder} is already a checkpoint of this run")
            logger.warning("replacing %s with this run's checkpoint of the same step", folder)
            shutil.rmtree(folder)
        os.replace(partial, folder)
        self.point_latest(folder, keep)
        return folder

    def remove_leftovers(self) -> list[str]:
        """Delete what an interrupted run provably left in its save dir: its partial checkpoint
        folders and the temporary files of its killed atomic writes (never a complete checkpoint,
        even one no pointer names). Returns the names deleted."""
        removed = []
        for path in sorted(self.path.glob(f".checkpoint-*{PARTIAL_SUFFIX}")):
            if path.is_dir() and re.fullmatch(
                rf"\.checkpoint-[0-9]{{9}}{re.escape(PARTIAL_SUFFIX)}", path.name
            ):
                shutil.rmtree(path)
                removed.append(path.name)
        for name in (CHECKPOINT_POINTER, BEST_POINTER, CONFIG_FILE, VOCAB_FILE, *METRICS_FILES):
            removed += [path.name for path in remove_temporary_files(self.path / name)]
        return removed

    def point_latest(self, folder: Path, keep: int = 1) -> None:
        """Point ``latest`` at the complete checkpoint ``folder``, then delete the checkpoints the
        run no longer keeps (the oldest beyond ``keep``, unless it is the best)."""
        write_text(self.path / CHECKPOINT_POINTER, folder.name + "\n")
        self.prune_checkpoints(keep)

    def keep_if_best(self, folder: Path, step: int, perplexity: dict[str, float], keep: int = 1) -> bool:
        """Point best.json at ``folder`` if its held-out ``perplexity`` ({"forward", "backward",
        "average"}) is the lowest so far, and delete the checkpoint it replaces unless the run keeps
        it as one of its newest ``keep``. True if ``folder`` is now the best."""
        pointer = self.path / BEST_POINTER
        best = self.read_best()
        if best is not None and perplexity["average"] >= best["average"]:
            return False
        write_json(pointer, {"folder": folder.name, "step": step, **perplexity})
        self.prune_checkpoints(keep)
        return True

    def newest_checkpoints(self, n: int) -> list[Path]:
        """The newest ``n`` of the checkpoints a run keeps up to its latest (its newest
        ``keep_checkpoints``, from train_config.json; an older best checkpoint is not one of them),
        oldest first; an error says how many it holds when it holds fewer."""
        if n < 1:
            raise ValueError(f"--average must be at least 1, got {n}")
        if self.latest_checkpoint() is None:
            raise FileNotFoundError(f"{self.path} has no checkpoint to average (no '{CHECKPOINT_POINTER}')")
        config = read_json(self.path / CONFIG_FILE)
        keep = int(config.get("keep_checkpoints") or 1)
        folders = self.recent_checkpoints(keep)[-n:]
        if len(folders) < n:
            raise ValueError(
                f"--average {n}: {self.path} holds {len(folders)} recent checkpoint(s) "
                f"(steps {', '.join(str(checkpoint_step(p)) for p in folders)}; the run keeps {keep}); "
                f"train with --keep-checkpoints {n}"
            )
        return folders

    def average_weights(self, n: int) -> tuple[dict[str, torch.Tensor], list[int]]:
        """The mean of the model weights of a save dir's newest ``n`` checkpoints up to the latest
        (a run trained with ``--keep-checkpoints n`` or more), and their steps, oldest first. Each
        floating-point tensor is averaged in float64 and stored in its own dtype; any other tensor
        must be equal in every checkpoint. A checkpoint average is often a better model than any one
        of them (Vaswani et al. 2017 averaged their last 5 checkpoints)."""
        folders = self.newest_checkpoints(n)
        total: dict[str, torch.Tensor] = {}
        first: dict[str, torch.Tensor] = {}
        for folder in folders:
            weights = load_checkpoint_file(folder / "model.pt")["model"]
            if first and weights.keys() != first.keys():
                raise ValueError(
                    f"{folder} holds other weights than {folders[0]}: not checkpoints of one model"
                )
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

    def training_summary(
        self, checkpoint: str = "latest", averaged_steps: list[int] | None = None
    ) -> dict[str, Any] | None:
        """Steps, tokens, epochs and training time of a save dir's latest or best checkpoint, with
        the run's configuration (None for a folder without a checkpoint); ``averaged_steps``, the
        checkpoints whose mean the model is, are recorded with them."""
        folder = self.checkpoint_folder(checkpoint)
        if folder is None:
            return None
        run = load_checkpoint_file(folder / "model.pt")["run"]
        config = read_json(self.path / CONFIG_FILE)
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


def load_checkpoint_file(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Read a checkpoint file, checked against its folder's manifest (``verify_checkpoint_file``),
    without unpickling arbitrary objects (``TensorFileError`` in one line for a damaged file or
    one that holds code)."""
    verify_checkpoint_file(Path(path))
    return load_tensors(path, map_location=device)


def save_checkpoint_file(value: dict[str, Any], path: Path) -> None:
    """Write a checkpoint file (tensors and plain containers) atomically, through a Python file
    so that a full disk raises OSError (ENOSPC), not torch's "unexpected pos"."""
    with atomic_path(path) as tmp, tmp.open("wb") as f:
        torch.save(value, f)


def write_manifest(folder: Path, step: int) -> None:
    """Record the name, size and SHA-256 of every file of a complete checkpoint folder in its
    manifest.json (the last file written into it)."""
    files = {
        p.name: {"size": p.stat().st_size, "sha256": file_digest(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST_FILE and not p.name.startswith(".")
    }
    write_json(folder / MANIFEST_FILE, {"step": step, "files": files})


_verified: set[tuple[str, int, int, int]] = set()  # files checked in this process, unchanged since


def verify_checkpoint_file(path: Path) -> None:
    """Check a checkpoint file against its folder's manifest (size and SHA-256); a checkpoint
    written before manifests existed has its zip CRCs checked. A CheckpointError names the file
    and what differs."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: the checkpoint {path.parent} is incomplete") from None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if key in _verified:
        return
    manifest_path = path.parent / MANIFEST_FILE
    if not manifest_path.exists():
        _check_zip_crcs(path)
        logger.info("%s has no %s (an older elmokit's): checked its zip CRCs", path.parent, MANIFEST_FILE)
    else:
        manifest = read_json(manifest_path)
        files = manifest.get("files") if isinstance(manifest, dict) else None
        if not isinstance(files, dict):
            raise CheckpointError(f"{manifest_path}: not a checkpoint manifest (no 'files')")
        entry = files.get(path.name)
        if not isinstance(entry, dict):
            raise CheckpointError(f"{path}: not one of the files that {manifest_path} records")
        if stat.st_size != entry.get("size"):
            raise CheckpointError(
                f"{path}: damaged: it has {stat.st_size} bytes, {manifest_path} recorded {entry.get('size')}"
            )
        if file_digest(path) != entry.get("sha256"):
            raise CheckpointError(
                f"{path}: damaged: its SHA-256 differs from the one {manifest_path} recorded when "
                "the checkpoint was written"
            )
    _verified.add(key)


def _check_zip_crcs(path: Path) -> None:
    """Check the CRC of every record of a torch zip file (a file in another format is left to
    the reader, which names what it is)."""
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: damaged: its zip records cannot be read ({err})") from None
    if bad is not None:
        raise CheckpointError(f"{path}: damaged: the CRC of its record {bad} does not match its bytes")


def checkpoint_step(folder: Path) -> int:
    """The step of a checkpoint folder, from its name."""
    return int(folder.name.rsplit("-", 1)[1])


def rng_state() -> dict[str, Any]:
    """This process's random states (torch, Python, NumPy, CUDA) as tensors and plain values."""
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    # the legacy global generator is MT19937, whose state is this tuple (numpy's stub says "or a dict")
    np_state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
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
