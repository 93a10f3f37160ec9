"""ELMoForManyLangs' own API on elmokit: ``ManyLangsEmbedder`` is its ``Embedder``
(``elmokit.model.manylangs`` reads the model folders)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..base.devices import resolve_device
from ..model.bilm import StatefulBiLM
from ..model.characters import check_token_lists
from .files import load_bilm

__all__ = ["ManyLangsEmbedder"]


class ManyLangsEmbedder:
    """ELMoForManyLangs' ``Embedder(model_dir, batch_size=64)`` on elmokit, with its numbers.
    ``model_dir``: an ELMoForManyLangs model folder, a .zip of one (NLPL's downloads 136-179,
    ``efml-en``, ...), or any other model elmokit resolves (a name, a bilm-tf folder, a URL,
    ``hf://``). ``sents2elmo(sents, output_layer=-1)`` returns one float32 array per sentence, in input
    order: (num_layers, n_tokens, dim) for ``output_layer=-2``, their average (n_tokens, dim) for
    -1, layer k for k (0 = the token layer [x; x]).

    As ELMoForManyLangs does, each call sorts its sentences by length (longest first, stable),
    cuts them into batches of ``batch_size`` and carries each batch row's LSTM states into the
    next batch, from call to call (``reset_states()`` starts again from zeros); an empty
    sentence or token is embedded as it does (a sentence of ``<bos> <eos>`` gives an array of no
    tokens and still moves its row's state). ELMoForManyLangs runs a call's batches in an order
    drawn with ``random.shuffle``; here they run longest first, so a call of more than
    ``batch_size`` sentences gives its numbers for that batch order (one batch: always).
    """

    def __init__(
        self, model_dir: str | Path, batch_size: int = 64, device: str | torch.device | None = None
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        bilm = load_bilm(model_dir, None, stateful=True)
        assert isinstance(bilm, StatefulBiLM)
        self.bilm = bilm
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.bilm.to(resolve_device(device))
        self.batch_size = batch_size

    def reset_states(self) -> None:
        """Forget the carried states (the next batch starts from zeros)."""
        self.bilm.reset_states()

    @torch.inference_mode()
    def sents2elmo(self, sents: Sequence[Sequence[str]], output_layer: int = -1) -> list[np.ndarray]:
        check_token_lists(sents)
        if len(sents) == 0:
            raise ValueError("empty sentence list: give at least one sentence")
        n_layers = self.bilm.num_layers
        if (
            isinstance(output_layer, bool)
            or not isinstance(output_layer, int)
            or not -2 <= output_layer < n_layers
        ):
            raise ValueError(
                f"output_layer must be -2 (all layers), -1 (their average) or a layer 0..{n_layers - 1}, "
                f"got {output_layer!r}"
            )
        order = sorted(range(len(sents)), key=lambda i: -len(sents[i]))
        device = self.bilm._boundary_ids.device
        results: list[np.ndarray] = [np.empty(0)] * len(sents)
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            out = self.bilm(self.bilm.batch_to_ids([sents[i] for i in rows]).to(device))
            layers = out.layers.float().cpu().numpy()
            for row, i in enumerate(rows):
                data = layers[:, row, : len(sents[i])]
                if output_layer == -1:
                    data = data.mean(axis=0)  # what np.average(data, axis=0) computes
                elif output_layer >= 0:
                    data = data[output_layer]
                results[i] = np.ascontiguousarray(data)
        return results
