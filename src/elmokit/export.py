"""Model folders of a trained language model: a training save dir (its checkpoints) or an exported
folder in the original layout (options.json, weights.hdf5, vocab.txt, softmax.hdf5)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from .atomic import raise_if_signalled, terminate_raises, write_json
from .checkpoints import (
    CHECKPOINT_POINTER,
    CONFIG_FILE,
    average_weights,
    checkpoint_folder,
    checkpoint_step,
    latest_checkpoint,
    load_checkpoint_file,
    newest_checkpoints,
    read_json,
    training_summary,
)
from .data import Vocabulary
from .language_model import LanguageModel
from .lstm import LstmState
from .options import BiLMOptions
from .pretrained import available_models, model_files, refuse_package_path
from .weights import (
    SOFTMAX_FILE,
    load_softmax,
    load_weights,
    save_options,
    save_softmax,
    save_weights,
    write_start_state,
)

__all__ = [
    "TRAINING_FILE",
    "check_new_folder",
    "copy_with_start_state",
    "export_model",
    "load_language_model",
]

TRAINING_FILE = "training.json"


def load_language_model(
    model_dir: str | Path,
    device: str | torch.device = "cpu",
    checkpoint: str = "latest",
    average: int | None = None,
) -> tuple[LanguageModel, Vocabulary]:
    """(LanguageModel, Vocabulary) from a training save dir (its "latest" or "best" checkpoint,
    or with ``average`` the mean of its newest ``average`` checkpoints: ``average_weights``), an
    exported model folder or a shipped model's name; the model is in eval mode. ``checkpoint``
    may also name a checkpoint folder of the save dir (``checkpoint-<step>``). Every checkpoint
    file read is checked against its manifest (``checkpoints.load_checkpoint_file``)."""
    folder = Path(model_dir)
    if not folder.is_dir() and str(model_dir) in available_models():
        folder = model_files(model_dir)[0].parent  # a shipped model by name
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder not found: {folder}")
    vocab_file = folder / "vocab.txt"
    if not vocab_file.is_file():
        raise FileNotFoundError(f"model folder {folder} has no vocab.txt")
    vocab = Vocabulary.from_file(vocab_file)
    chosen = checkpoint_folder(folder, checkpoint)
    if average is not None and (chosen is None or checkpoint != "latest"):
        raise ValueError(
            f"--average needs a training save dir and its latest checkpoints; {folder} "
            + ("is not one" if chosen is None else "was asked for its best checkpoint")
        )
    if checkpoint == "best" and chosen is None and latest_checkpoint(folder) is not None:
        raise FileNotFoundError(f"{folder} has no best checkpoint: the run had no held-out data")
    if chosen is not None:
        config = read_json(folder / CONFIG_FILE)
        model = LanguageModel(config["options"], len(vocab), dropout=0.0)
        if average is None:
            weights = load_checkpoint_file(chosen / "model.pt")["model"]
        else:
            weights = average_weights(folder, average)[0]
        model.load_state_dict(weights)
    else:
        for name in ("options.json", "weights.hdf5", SOFTMAX_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(
                    f"model folder {folder} has neither a checkpoint ('{CHECKPOINT_POINTER}') nor {name}"
                )
        model = LanguageModel(BiLMOptions.from_file(folder / "options.json"), len(vocab), dropout=0.0)
        load_weights(model.bilm, folder / "weights.hdf5")
        assert model.softmax is not None  # made with a vocabulary
        load_softmax(model.softmax, folder / SOFTMAX_FILE)
    return model.to(device).eval(), vocab


def export_model(
    model_dir: str | Path,
    out_dir: str | Path,
    extra_options: dict[str, Any] | None = None,
    checkpoint: str = "latest",
    average: int | None = None,
) -> Path:
    """Write options.json + weights.hdf5 (original layout), vocab.txt, softmax.hdf5 and
    training.json of a save dir's "latest" or "best" (lowest held-out perplexity) checkpoint, or
    of the mean of its newest ``average`` checkpoints."""
    out = _output_folder(out_dir)
    model, vocab = load_language_model(model_dir, checkpoint=checkpoint, average=average)
    extra = {"bidirectional": True, "n_tokens_vocab": len(vocab), **(extra_options or {})}
    save_options(model.bilm.options, out / "options.json", extra)
    save_weights(model.bilm, out / "weights.hdf5")
    vocab.save(out / "vocab.txt")
    assert model.softmax is not None  # load_language_model makes it with the vocabulary
    save_softmax(model.softmax, out / SOFTMAX_FILE)
    steps = None
    if average is not None:
        steps = [checkpoint_step(p) for p in newest_checkpoints(Path(model_dir), average)]
    history = training_summary(Path(model_dir), checkpoint, steps)
    if history is not None:
        write_json(out / TRAINING_FILE, history)
    return out


def _output_folder(path: str | Path) -> Path:
    """The folder ``path``, made if missing, checked writable and outside the installed package
    before any work; errors name the problem."""
    out = Path(path)
    refuse_package_path(out, "output folder")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output {out} is a file; give a folder to write the model into")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except PermissionError:
        raise PermissionError(f"cannot make the output folder {out}: its parent is not writable") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write into {out}: the folder is not writable")
    return out


def check_new_folder(path: str | Path) -> Path:
    """Check, before any work, that a new model folder can be written at ``path``: outside the
    installed package, not an existing file or non-empty folder (nothing is replaced), in a
    writable folder."""
    out = Path(path)
    refuse_package_path(out, "output folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; give a new folder")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise FileNotFoundError(f"folder does not exist: {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot make {out}: the folder {parent} is not writable")
    return out


def copy_with_start_state(folder: str | Path, out_dir: str | Path, state: LstmState) -> Path:
    """Write a copy of the model folder ``folder`` (every file) to the new folder ``out_dir``,
    its weights.hdf5 holding ``state`` as the start state. The copy is made in a hidden folder
    beside ``out_dir`` and renamed when complete: ``out_dir`` appears whole or not at all."""
    folder, out = Path(folder), check_new_folder(out_dir)
    with terminate_raises():
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.absolute().parent))
        try:
            for item in sorted(folder.iterdir()):
                if item.name == "weights.hdf5":
                    write_start_state(item, tmp / item.name, state)
                elif item.is_file():
                    shutil.copyfile(item, tmp / item.name)
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, 0o777 & ~mask)
            raise_if_signalled()
            os.rename(tmp, out)  # replaces an empty folder
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out
