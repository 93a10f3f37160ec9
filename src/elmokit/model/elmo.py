"""ELMo for downstream models: a biLM plus one task-specific scalar mix per output."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from ..hub import resolve_model
from .bilm import BiLM, CarriedState, StatefulBiLM
from .scalar_mix import ScalarMix

__all__ = ["Elmo", "ElmoOutput"]


@dataclass
class ElmoOutput:
    """representations: num_output_representations tensors (batch, timesteps, 2 * projection_dim);
    mask: (batch, timesteps)."""

    representations: list[torch.Tensor]
    mask: torch.Tensor


class Elmo(nn.Module):
    """Compute ``num_output_representations`` learned mixes of the biLM layers, with dropout.

    Build it from a model in any form ``BiLM.from_pretrained`` takes (``Elmo("elmo-news-512",
    num_output_representations=n)``: a name, a folder, an archive, a URL, ``hf://``), from the
    original files (``Elmo(options_file, weight_file, num_output_representations=n)``; each a path
    or a URL, downloaded into elmokit's cache) or from a BiLM you already have
    (``Elmo(bilm=model, num_output_representations=n)``); each mix's weights and gamma are
    trained with the task model. Every argument after the model is keyword-only
    (``elmokit.compat.allennlp.Elmo`` keeps AllenNLP's positional order).

    ``requires_grad=False`` (default): no gradient reaches the biLM, because Elmo runs it under
    ``torch.no_grad()``. A biLM that Elmo loads itself is also frozen (its parameters get
    ``requires_grad=False``); a biLM you pass in is left exactly as it is.

    ``stateful``: None (default) follows the biLM (a ``StatefulBiLM`` carries states, a BiLM
    does not); True carries each row's states into the next call (Elmo keeps them, not the
    biLM); False starts every call from the biLM's start state.
    """

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | None = None,
        *,
        num_output_representations: int = 1,
        dropout: float = 0.5,
        requires_grad: bool = False,
        do_layer_norm: bool = False,
        keep_sentence_boundaries: bool = False,
        stateful: bool | None = None,
        bilm: BiLM | None = None,
        scalar_mix_parameters: list[float] | None = None,
    ) -> None:
        super().__init__()
        if bilm is None:
            if model is None:
                raise ValueError(
                    "give a model (a name, folder, archive, URL or hf:// spec; or options_file and "
                    "weight_file), or bilm="
                )
            if weight_file is None:
                bilm = BiLM.from_pretrained(model)
            else:  # an options file and a weight file, each a path or a URL
                bilm = BiLM.load(*resolve_model(model, weight_file).files())
            bilm.requires_grad_(requires_grad)  # Elmo's own biLM
        elif model is not None or weight_file is not None:
            raise ValueError("give either a model (or options_file and weight_file) or bilm=, not both")
        if num_output_representations < 1:
            raise ValueError(
                f"num_output_representations must be at least 1, got {num_output_representations}"
            )
        self.bilm = bilm
        self.requires_grad = requires_grad
        self.stateful = stateful
        self.carried = CarriedState() if stateful and not bilm.stateful else None
        self.keep_sentence_boundaries = keep_sentence_boundaries
        self.dropout = nn.Dropout(dropout)
        trainable = scalar_mix_parameters is None
        self.scalar_mixes = nn.ModuleList(
            ScalarMix(
                bilm.num_layers,
                do_layer_norm=do_layer_norm,
                initial_scalar_parameters=scalar_mix_parameters,
                trainable=trainable,
            )
            for _ in range(num_output_representations)
        )

    @property
    def output_dim(self) -> int:
        return self.bilm.output_dim

    def reset_states(self) -> None:
        """Forget carried states (stateful Elmo, or a StatefulBiLM)."""
        if self.carried is not None:
            self.carried.reset()
        if isinstance(self.bilm, StatefulBiLM):
            self.bilm.reset_states()

    def forward(self, char_ids: torch.Tensor) -> ElmoOutput:
        """char_ids (batch, timesteps, max_chars) from ``batch_to_ids`` -> ElmoOutput."""
        batch = char_ids.shape[0]
        state = None
        if self.carried is not None:
            state = self.carried.initial(self.bilm, batch, self.bilm.lstm.lstm_layers[0].weight_hidden)
        elif self.stateful is False and self.bilm.stateful:
            state = self.bilm.initial_state(batch, self.bilm.lstm.lstm_layers[0].weight_hidden)
        with torch.set_grad_enabled(self.requires_grad and torch.is_grad_enabled()):
            out = self.bilm(char_ids, state, keep_sentence_boundaries=self.keep_sentence_boundaries)
        if self.carried is not None:
            self.carried.update(out.state)
        representations = [self.dropout(mix(out.layers, out.mask)) for mix in self.scalar_mixes]
        return ElmoOutput(representations, out.mask)
