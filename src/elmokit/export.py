"""Model folders of a trained language model: a training save dir (its checkpoints) or an exported
folder in the original layout (options.json, weights.hdf5, vocab.txt, softmax.hdf5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .atomic import write_json
from .checkpoints import (
    CHECKPOINT_POINTER,
    CONFIG_FILE,
    checkpoint_folder,
    latest_checkpoint,
    load_checkpoint_file,
    training_summary,
)
from .data import Vocabulary
from .language_model import LanguageModel
from .options import BiLMOptions
from .pretrained import available_models, model_files
from .weights import SOFTMAX_FILE, load_softmax, load_weights, save_options, save_softmax, save_weights

TRAINING_FILE = "training.json"


def load_language_model(
    model_dir: str | Path, device: str | torch.device = "cpu", checkpoint: str = "latest"
) -> tuple[LanguageModel, Vocabulary]:
    """(LanguageModel, Vocabulary) from a training save dir (its "latest" or "best" checkpoint),
    an exported model folder or a shipped model's name; the model is in eval mode."""
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
    if checkpoint == "best" and chosen is None and latest_checkpoint(folder) is not None:
        raise FileNotFoundError(f"{folder} has no best checkpoint: the run had no held-out data")
    if chosen is not None:
        config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
        model = LanguageModel(config["options"], len(vocab), dropout=0.0)
        model.load_state_dict(load_checkpoint_file(chosen / "model.pt")["model"])
    else:
        for name in ("options.json", "weights.hdf5", SOFTMAX_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(
                    f"model folder {folder} has neither a checkpoint ('{CHECKPOINT_POINTER}') nor {name}"
                )
        model = LanguageModel(BiLMOptions.from_file(folder / "options.json"), len(vocab), dropout=0.0)
        load_weights(model.bilm, folder / "weights.hdf5")
        load_softmax(model.softmax, folder / SOFTMAX_FILE)
    return model.to(device).eval(), vocab


def export_model(
    model_dir: str | Path,
    out_dir: str | Path,
    extra_options: dict[str, Any] | None = None,
    checkpoint: str = "latest",
) -> Path:
    """Write options.json + weights.hdf5 (original layout), vocab.txt, softmax.hdf5 and
    training.json of a save dir's "latest" or "best" (lowest held-out perplexity) checkpoint."""
    model, vocab = load_language_model(model_dir, checkpoint=checkpoint)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    extra = {"bidirectional": True, "n_tokens_vocab": len(vocab), **(extra_options or {})}
    save_options(model.bilm.options, out / "options.json", extra)
    save_weights(model.bilm, out / "weights.hdf5")
    vocab.save(out / "vocab.txt")
    save_softmax(model.softmax, out / SOFTMAX_FILE)
    history = training_summary(Path(model_dir), checkpoint)
    if history is not None:
        write_json(out / TRAINING_FILE, history)
    return out
