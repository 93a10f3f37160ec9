"""Model folders of a trained language model: a training save dir (its checkpoints) or an exported
folder in the original layout (options.json, weights.hdf5, vocab.txt, softmax.hdf5)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..base.atomic import (
    disk_full,
    make_folders,
    raise_if_signalled,
    remove_made_folders,
    terminate_raises,
    write_json,
)
from ..hub.shipped import refuse_package_path
from ..lm.checkpoints import SaveFolder, checkpoint_step
from ..lm.language_model import LanguageModel
from ..model.lstm import LstmState
from ..model.weights import (
    SOFTMAX_FILE,
    save_options,
    save_softmax,
    save_weights,
    write_start_state,
)

__all__: list[str] = []

TRAINING_FILE = "training.json"


def export_model(
    model_dir: str | Path,
    out_dir: str | Path,
    extra_options: dict[str, Any] | None = None,
    checkpoint: str = "latest",
    average: int | None = None,
) -> Path:
    """Write options.json + weights.hdf5 (original layout), vocab.txt, softmax.hdf5 and
    training.json of a save dir's "latest" or "best" (lowest held-out perplexity) checkpoint, or
    of the mean of its newest ``average`` checkpoints.

    The files are written into a hidden folder inside ``out_dir`` and moved into place only when
    all of them are complete: after a failure (a full disk, a damaged checkpoint, Ctrl-C)
    ``out_dir`` is as it was, and removed (with the parents this call made) if this call made it."""
    out, made = _output_folder(out_dir)
    with terminate_raises():
        stage: Path | None = None
        try:
            model = LanguageModel.from_pretrained(
                model_dir, device="cpu", checkpoint=checkpoint, average=average
            )
            vocab = model.vocab
            extra = {"bidirectional": True, "n_tokens_vocab": len(vocab), **(extra_options or {})}
            steps = None
            if average is not None:
                steps = [checkpoint_step(p) for p in SaveFolder(model_dir).newest_checkpoints(average)]
            history = SaveFolder(model_dir).training_summary(checkpoint, steps)
            assert model.softmax is not None  # from_pretrained makes it with the vocabulary
            softmax = model.softmax
            writers: list[tuple[str, Callable[[Path], None]]] = [
                ("options.json", lambda path: save_options(model.bilm.options, path, extra)),
                ("weights.hdf5", lambda path: save_weights(model.bilm, path)),
                ("vocab.txt", vocab.save),
                (SOFTMAX_FILE, lambda path: save_softmax(softmax, path)),
            ]
            if history is not None:
                writers.append((TRAINING_FILE, lambda path: write_json(path, history)))
            stage = Path(tempfile.mkdtemp(prefix=".export.", suffix=".partial", dir=out))
            for name, write in writers:
                try:
                    write(stage / name)
                except OSError as err:  # a full disk: named by the file it was to be
                    full = disk_full(err, out / name)
                    if full is None:
                        raise
                    raise full from None
            raise_if_signalled()
            for name, _ in writers:
                os.replace(stage / name, out / name)
        except BaseException:
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
            remove_made_folders(made)
            raise
        finally:
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
    return out


def _output_folder(path: str | Path) -> tuple[Path, list[Path]]:
    """The folder ``path``, made if missing (and the folders made here, for
    ``remove_made_folders``), checked writable and outside the installed package before any
    work; errors name the problem."""
    out = Path(path)
    refuse_package_path(out, "output folder")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output {out} is a file; give a folder to write the model into")
    try:
        made = make_folders(out)
    except PermissionError:
        raise PermissionError(f"cannot make the output folder {out}: its parent is not writable") from None
    if not os.access(out, os.W_OK | os.X_OK):
        remove_made_folders(made)
        raise PermissionError(f"cannot write into {out}: the folder is not writable")
    return out, made


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


def copy_with_start_state(
    options_file: str | Path, weight_file: str | Path, out_dir: str | Path, state: LstmState
) -> Path:
    """Write a copy of a model to the new folder ``out_dir``: every file of the weight file's
    folder (and the options file as options.json when it lies elsewhere), the weight file
    holding ``state`` as the start state. The copy is made in a hidden folder beside ``out_dir``
    and renamed when complete: ``out_dir`` appears whole or not at all."""
    options, weights, out = Path(options_file), Path(weight_file), check_new_folder(out_dir)
    with terminate_raises():
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.absolute().parent))
        try:
            for item in sorted(weights.parent.iterdir()):
                if item.name == weights.name:
                    write_start_state(item, tmp / item.name, state)
                elif item.is_file():
                    shutil.copyfile(item, tmp / item.name)
            if options.parent != weights.parent:
                shutil.copyfile(options, tmp / "options.json")
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, 0o777 & ~mask)
            raise_if_signalled()
            os.rename(tmp, out)  # replaces an empty folder
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out
