"""The language model: token encoder -> forward and backward LSTMs -> softmax over the vocabulary.

This is the one composition that training, perplexity evaluation and start-state estimation run.
Its inputs are *streams* in the training format: char ids (2, batch, steps, max_chars), shifted by
+1, direction 0 the forward stream and direction 1 the backward stream, each in its own reading
order; the forward stream predicts token t+1, the backward one token t-1. State is explicit: a
call takes the LSTM state to start from and returns the state it reached.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..base.devices import resolve_device
from ..hub import resolve_model
from ..model.bilm import BiLM
from ..model.lstm import LstmState
from ..model.options import BiLMOptions
from ..model.weights import SOFTMAX_FILE, load_softmax, load_weights
from .checkpoints import (
    CHECKPOINT_POINTER,
    CONFIG_FILE,
    SaveFolder,
    load_checkpoint_file,
    read_json,
)
from .softmax import Softmax
from .vocabulary import Vocabulary

__all__ = ["LanguageModel"]

NO_SOFTMAX = (
    "this model ships no {name}: scoring needs one; export it from a training run with `elmokit export`"
)


def batch_tensors(
    batch: dict[str, np.ndarray], device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both directions of a data batch: char ids (2, batch, steps, max_chars) shifted by +1 and
    targets (2, batch, steps), on ``device``."""
    chars = np.stack([batch["char_ids"], batch["char_ids_reverse"]])
    targets = np.stack([batch["next_token_id"], batch["next_token_id_reverse"]])
    return (
        torch.from_numpy(chars).to(device, torch.long) + 1,
        torch.from_numpy(targets).to(device, torch.long),
    )


class LanguageModel(nn.Module):
    """The biLM with its training objective: a softmax over the vocabulary shared by both
    directions, predicting token t+1 (forward) and t-1 (backward).

    ``options`` builds a fresh biLM; a ``BiLM`` is used as it is (its parameters shared).
    ``vocab_size=None`` makes no softmax: the model then gives hidden states and LSTM states only.
    ``dropout`` (training only) drops each LSTM layer's input (of a biLM built here) and the top
    layer's output.
    """

    def __init__(
        self,
        options: dict[str, Any] | BiLMOptions | BiLM,
        vocab_size: int | None = None,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if isinstance(options, BiLM):
            self.bilm = options
        else:
            self.bilm = BiLM(options)
            self.bilm.lstm.dropout = dropout
        self.dropout = dropout
        dim = self.bilm.options.lstm.projection_dim
        self.softmax: Softmax | None = None if vocab_size is None else Softmax(vocab_size, dim)
        self._vocab: Vocabulary | None = None  # the softmax's words, set by from_pretrained
        self._source_files: tuple[Path, ...] = ()  # set by from_pretrained

    @property
    def source_files(self) -> tuple[Path, ...]:
        """The files the model was read from (``from_pretrained``: its weights, vocabulary,
        softmax, archive, checkpoints), else its biLM's: outputs never replace them."""
        return self._source_files or self.bilm.source_files

    @property
    def vocab(self) -> Vocabulary:
        """The softmax's vocabulary, of a model from ``from_pretrained``; a ValueError otherwise."""
        if self._vocab is None:
            raise ValueError(
                "this language model has no vocabulary: load one with LanguageModel.from_pretrained, "
                "or pass its softmax's Vocabulary as vocab="
            )
        return self._vocab

    @classmethod
    def from_pretrained(
        cls,
        spec: str | os.PathLike | None = None,
        *,
        device: str | torch.device | None = None,
        checkpoint: str = "latest",
        average: int | None = None,
        progress: bool | None = None,
    ) -> LanguageModel:
        """The biLM with its softmax and ``vocab``, in eval mode on ``device`` (None: cuda if
        present): from a training
        save dir (its "latest" or "best" checkpoint, one named ``checkpoint-<step>``, or with
        ``average`` the mean of its newest ``average`` checkpoints), or from a model in any form
        ``elmokit.hub.resolve_model`` takes (None: the default shipped model) that holds
        vocab.txt and softmax.hdf5 beside its weights, or a known model whose publisher gives
        them (``elmo-original-5.5b``: downloaded too); one line when it has none. Every
        checkpoint file read is checked against its manifest."""
        folder = None if spec is None else Path(os.fspath(spec)).expanduser()
        if folder is not None and folder.is_dir() and _is_save_dir(folder):
            model, vocab = cls._from_save_dir(folder, checkpoint, average)
        else:
            if average is not None:
                raise ValueError(
                    f"--average needs a training save dir and its latest checkpoints; {spec} is not one"
                )
            if checkpoint not in ("latest", "best"):  # a model folder has one set of weights: both
                raise ValueError(f"--checkpoint {checkpoint} needs a training save dir; {spec} is not one")
            model, vocab = cls._from_model_files(spec, progress)
        model._vocab = vocab
        model.bilm.source_files = model._source_files
        return model.to(resolve_device(device)).eval()

    @classmethod
    def _from_model_files(
        cls, spec: str | os.PathLike | None, progress: bool | None
    ) -> tuple[LanguageModel, Vocabulary]:
        source = resolve_model(spec, progress=progress, softmax=True)
        where = f"({source.spec})" if source.folder is None else f"(model folder {source.folder})"
        softmax, vocab_file = source.extras.get("softmax"), source.extras.get("vocab")
        if source.kind != "bilm" or softmax is None:
            raise FileNotFoundError(NO_SOFTMAX.format(name=SOFTMAX_FILE) + f" {where}")
        if vocab_file is None:
            raise FileNotFoundError(f"{SOFTMAX_FILE} needs its vocab.txt beside it {where}")
        vocab = Vocabulary.from_file(vocab_file)
        options, weights = source.files()
        model = cls(BiLMOptions.from_file(options), len(vocab), dropout=0.0)
        load_weights(model.bilm, weights)
        assert model.softmax is not None
        load_softmax(model.softmax, softmax)
        model._source_files = source.input_files()
        return model, vocab

    @classmethod
    def _from_save_dir(
        cls, folder: Path, checkpoint: str, average: int | None
    ) -> tuple[LanguageModel, Vocabulary]:
        vocab_file = folder / "vocab.txt"
        if not vocab_file.is_file():
            raise FileNotFoundError(f"model folder {folder} has no vocab.txt")
        vocab = Vocabulary.from_file(vocab_file)
        save = SaveFolder(folder)
        chosen = save.checkpoint_folder(checkpoint)
        if average is not None and checkpoint != "latest":
            raise ValueError(
                f"--average needs a training save dir and its latest checkpoints; {folder} was asked "
                "for its best checkpoint"
            )
        if chosen is None:
            if checkpoint == "best" and save.latest_checkpoint() is not None:
                raise FileNotFoundError(f"{folder} has no best checkpoint: the run had no held-out data")
            raise FileNotFoundError(f"{folder} has no {checkpoint} checkpoint")
        config = read_json(folder / CONFIG_FILE)
        model = cls(config["options"], len(vocab), dropout=0.0)
        if average is None:
            weights = load_checkpoint_file(chosen / "model.pt")["model"]
        else:
            weights = save.average_weights(average)[0]
        model.load_state_dict(weights)
        files = [vocab_file, folder / CONFIG_FILE]
        for checkpoint_dir in save.checkpoint_folders():
            files += sorted(p for p in checkpoint_dir.iterdir() if p.is_file())
        model._source_files = tuple(files)
        return model, vocab

    def hidden_states(
        self, char_ids: torch.Tensor, state: LstmState | None = None, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, LstmState]:
        """The top LSTM layer over streams: char_ids (2, batch, steps, max_chars) -> hidden states
        (2, batch, steps, projection_dim), zero past each row's length, and the state reached
        (taken at each row's last step). ``lengths`` (batch,): all ``steps`` when None;
        ``state`` None starts from zeros."""
        tokens = self.bilm.token_encoder(char_ids)  # (2, batch, steps, projection_dim)
        if lengths is None:
            lengths = torch.full((tokens.shape[1],), tokens.shape[2], dtype=torch.long)
        outputs, state = self.bilm.lstm(tokens, lengths, state)
        return outputs[-1], state

    def position_losses(
        self, hidden: torch.Tensor, targets: torch.Tensor, chunk_rows: int | None = None
    ) -> torch.Tensor:
        """Full-softmax cross entropy at every position: hidden (2, batch, steps, dim), targets
        (2, batch, steps) -> (2, batch, steps). ``chunk_rows`` bounds how many positions' logits
        over the vocabulary exist at once."""
        softmax = self._softmax()
        per_direction = []
        for d in range(2):
            rows, target = hidden[d].reshape(-1, hidden.shape[-1]), targets[d].reshape(-1)
            size = chunk_rows or max(1, rows.shape[0])
            pieces = [softmax.full_loss(h, t) for h, t in zip(rows.split(size), target.split(size))]
            per_direction.append(torch.cat(pieces))
        return torch.stack(per_direction).view_as(targets)

    def forward(
        self,
        char_ids: torch.Tensor,
        targets: torch.Tensor,
        state: LstmState | None,
        num_sampled: int | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, LstmState]:
        """char_ids (2, batch, steps, max_chars), targets (2, batch, steps) -> the mean loss per
        direction (2,) and the final state (detached: back-propagation stops at the window).
        ``num_sampled=None`` uses the full softmax; otherwise each direction draws its own
        sample, as bilm-tf."""
        hidden, state = self.hidden_states(char_ids, state)
        hidden = F.dropout(hidden, self.dropout, self.training)
        if num_sampled is None:
            losses = list(self.position_losses(hidden, targets).flatten(1))
        else:
            losses = self._softmax().sampled_losses(
                list(hidden.flatten(1, 2)), list(targets.flatten(1)), num_sampled, generator
            )
        return torch.stack([loss.mean() for loss in losses]), state.detach()

    def _softmax(self) -> Softmax:
        if self.softmax is None:
            raise ValueError("this LanguageModel has no softmax (it was made without a vocab_size)")
        return self.softmax


def _is_save_dir(folder: Path) -> bool:
    """Whether ``folder`` is a training save dir: its ``latest`` pointer or checkpoint folders."""
    pointer = folder / CHECKPOINT_POINTER
    return pointer.exists() or pointer.is_symlink() or bool(SaveFolder(folder).checkpoint_folders())
