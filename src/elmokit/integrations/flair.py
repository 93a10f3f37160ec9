"""flair token embeddings computed by elmokit: ``elmokit.integrations.flair.ELMoEmbeddings``.

For flair code you can edit, change one import::

    from elmokit.integrations.flair import ELMoEmbeddings   # was: from flair.embeddings import ELMoEmbeddings

The options are flair's (``model``, ``options_file``, ``weight_file``, ``embedding_mode``) plus
``mode``. The default, ``mode="stateful"``, gives the numbers flair's own ELMoEmbeddings gives
with AllenNLP 0.9 (states carried from batch to batch, and the constructor's dummy sentence);
``"warm"`` and ``"zero"`` are deterministic: every sentence starts from the model's start state or
from zeros, so a sentence gets the same vectors in any batch and after any other.

Taggers that use it save and load with flair (``to_params``/``from_params``): the saved model
holds the options and flair's state dict holds the weights, so it needs no files to load, and
``SequenceTagger.load`` needs no import of this module: the saved parameters name this class,
so unpickling the model imports it (flair has no entry points for embeddings).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

try:
    import flair
    from flair.data import Sentence
    from flair.embeddings import TokenEmbeddings
    from flair.embeddings.base import register_embeddings
except ImportError as err:  # pragma: no cover - the module is only usable with flair
    raise ImportError("elmokit.integrations.flair needs flair: pip install 'elmokit[flair]'") from err

from ..compat.allennlp import DEFAULT_OPTIONS_FILE, DEFAULT_WEIGHT_FILE, batch_to_ids
from ..compat.files import load_bilm
from ..embed.runners import evaluating
from ..model.bilm import BiLM, CarriedState
from ..model.lstm import LstmState

__all__ = ["ELMoEmbeddings"]

_S3 = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/"
# flair's model names: AllenNLP's published files (downloaded into elmokit's cache on first use).
FLAIR_MODELS = {
    "original": (DEFAULT_OPTIONS_FILE, DEFAULT_WEIGHT_FILE),
    "small": (
        _S3 + "2x1024_128_2048cnn_1xhighway/elmo_2x1024_128_2048cnn_1xhighway_options.json",
        _S3 + "2x1024_128_2048cnn_1xhighway/elmo_2x1024_128_2048cnn_1xhighway_weights.hdf5",
    ),
    "medium": (
        _S3 + "2x2048_256_2048cnn_1xhighway/elmo_2x2048_256_2048cnn_1xhighway_options.json",
        _S3 + "2x2048_256_2048cnn_1xhighway/elmo_2x2048_256_2048cnn_1xhighway_weights.hdf5",
    ),
    "large": (
        _S3 + "2x4096_512_2048cnn_2xhighway_5.5B/elmo_2x4096_512_2048cnn_2xhighway_5.5B_options.json",
        _S3 + "2x4096_512_2048cnn_2xhighway_5.5B/elmo_2x4096_512_2048cnn_2xhighway_5.5B_weights.hdf5",
    ),
    "pt": (_S3 + "contributed/pt/elmo_pt_options.json", _S3 + "contributed/pt/elmo_pt_weights.hdf5"),
    "pubmed": (
        _S3 + "contributed/pubmed/elmo_2x4096_512_2048cnn_2xhighway_options.json",
        _S3 + "contributed/pubmed/elmo_2x4096_512_2048cnn_2xhighway_weights_PubMed_only.hdf5",
    ),
}
FLAIR_MODELS["5.5B"] = FLAIR_MODELS["large"]
FLAIR_MODELS["portuguese"] = FLAIR_MODELS["pt"]

EMBEDDING_MODES = ("all", "top", "average")
MODES = ("stateful", "warm", "zero")


def _load_bilm(
    model: str, options_file: str | os.PathLike | None, weight_file: str | os.PathLike | None
) -> BiLM:
    if options_file:  # both files, as flair takes them, or one elmokit spec
        return load_bilm(options_file, weight_file or None)
    if model in FLAIR_MODELS:
        return load_bilm(*FLAIR_MODELS[model])
    return load_bilm(model, None)  # any form elmokit.hub.resolve_model takes


@register_embeddings("elmokit.ELMoEmbeddings")
class ELMoEmbeddings(TokenEmbeddings):
    """ELMo vectors for flair tokens: (3 * dim,) per token for ``embedding_mode="all"`` (the
    three layers concatenated), (dim,) for ``"top"`` and ``"average"``; dim = 2 * projection_dim.

    ``model``: flair's names ("original", "small", "medium", "large"/"5.5B", "pt", "pubmed":
    AllenNLP's published files, downloaded into elmokit's cache on first use), or any model
    elmokit.resolve_model takes (a shipped or known model's name, a model folder, a .zip archive,
    a URL, ``hf://owner/name``); ``options_file`` and ``weight_file`` (paths or URLs), when
    both are given, are used instead, as in flair, and ``options_file`` alone may be any such
    model. ``mode``: "stateful" (flair's and AllenNLP's
    numbers), "warm" or "zero" (deterministic). ``bilm``: use this elmokit BiLM instead of files.
    """

    def __init__(
        self,
        model: str = "original",
        options_file: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | None = None,
        embedding_mode: str = "all",
        mode: str = "stateful",
        bilm: BiLM | None = None,
    ) -> None:
        super().__init__()
        if embedding_mode not in EMBEDDING_MODES:
            raise ValueError(
                f"embedding_mode must be one of {', '.join(EMBEDDING_MODES)}, got {embedding_mode!r}"
            )
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if bilm is None:
            bilm = _load_bilm(model, options_file, weight_file).requires_grad_(False)
        elif next(bilm.parameters()).device != torch.device(flair.device):
            bilm = copy.deepcopy(bilm)  # a model handed in is never changed
        self.instance_parameters = {"model": model, "embedding_mode": embedding_mode, "mode": mode}
        self.name = f"elmo-{model}-{embedding_mode}"
        self.static_embeddings = True
        self.model, self.embedding_mode, self.mode = model, embedding_mode, mode
        self.bilm = bilm.to(flair.device)
        self.carried = CarriedState()
        # flair's ELMoEmbeddings embeds a dummy sentence at construction, which sets the carried
        # state of row 0; here it runs just before the first batch (with the weights flair
        # restores when it loads a model), which gives the same numbers
        self._dummy_pending = mode == "stateful"
        layers = 1 if embedding_mode != "all" else bilm.num_layers
        self.__embedding_length = layers * bilm.output_dim

    @property
    def embedding_length(self) -> int:
        return self.__embedding_length

    def _add_embeddings_internal(self, sentences: list[Sentence]) -> list[Sentence]:
        words = [[token.text for token in sentence] for sentence in sentences]
        if self._dummy_pending:
            self._dummy_pending = False
            self._layers([["hello"]])
        if not any(words):
            return sentences
        layers = self._layers(words)  # (num_layers, batch, timesteps, dim)
        for i, sentence in enumerate(sentences):
            n = len(words[i])
            if n == 0:
                continue
            vectors = layers[:, i, :n]
            if self.embedding_mode == "all":
                per_token = vectors.transpose(0, 1).reshape(n, -1)
            elif self.embedding_mode == "top":
                per_token = vectors[-1]
            else:
                per_token = vectors.mean(dim=0)
            for token, vector in zip(sentence.tokens, per_token):
                token.set_embedding(self.name, vector)
        return sentences

    def _layers(self, words: list[list[str]]) -> torch.Tensor:
        bilm = self.bilm
        weight = bilm.lstm.lstm_layers[0].weight_hidden
        char_ids = batch_to_ids(words).to(weight.device)
        if self.mode == "stateful":
            state: Any = self.carried.initial(bilm, len(words), weight)
        else:
            state = "zero" if self.mode == "zero" else None
        with torch.no_grad(), evaluating(bilm):
            out = bilm(char_ids, state)
        if self.mode == "stateful":
            self.carried.update(out.state)
        return out.layers

    def reset_states(self) -> None:
        """Stateful mode: forget the carried states (the next batch starts from zeros)."""
        self.carried.reset()
        self._dummy_pending = False

    def extra_repr(self) -> str:
        return f"model={self.name}, mode={self.mode}"

    def __str__(self) -> str:
        return self.name

    def to_params(self) -> dict[str, Any]:
        start = self.bilm.start_state
        return {
            "model": self.model,
            "embedding_mode": self.embedding_mode,
            "mode": self.mode,
            "options": self.bilm.options.to_dict(),
            "start_state": None if start is None else [t.detach().cpu() for t in start],
            # the class itself, pickled by reference into the saved model: loading the model
            # imports this module, which registers the class with flair before flair looks it up
            "embeddings_class": ELMoEmbeddings,
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ELMoEmbeddings:
        """Rebuild from ``to_params``: a BiLM of the saved options (flair's state dict then
        restores its weights)."""
        bilm = BiLM(params["options"]).requires_grad_(False)
        if params.get("start_state") is not None:
            bilm.set_start_state(LstmState(*params["start_state"]))
        return cls(params["model"], embedding_mode=params["embedding_mode"], mode=params["mode"], bilm=bilm)
