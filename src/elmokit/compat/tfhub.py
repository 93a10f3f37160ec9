"""TF-Hub's ELMo module (``hub.Module("https://tfhub.dev/google/elmo/3")``) made of elmokit, without
TensorFlow: code written for it ports by changing the import and the session run.

    elmo = Module("path/to/module")          # was: hub.Module("https://tfhub.dev/google/elmo/3")
    out = elmo(["the cat sat"], signature="default", as_dict=True)
    out["elmo"]                             # numpy (batch, max_len, 2 * projection_dim)

The module's call contract, as its graph (bilm-tf's, under the module's layer mix) computes it:

- ``signature="default"``: a 1-D sequence of sentences (str or UTF-8 bytes), each split at
  spaces (runs of spaces give no empty tokens), padded with '' to the longest;
  ``signature="tokens"``: ``{"tokens": (batch, max_len) strings, "sequence_len": (batch,) ints}``;
  tokens at and past a row's ``sequence_len`` are ignored, whatever they hold.
- Outputs (numpy float32): ``word_emb`` (batch, max_len, projection_dim), the char CNN's token
  vectors; ``lstm_outputs1``, ``lstm_outputs2`` (batch, max_len, 2 * projection_dim), each LSTM
  layer's forward and backward outputs; ``elmo``, ``aggregation/scaling`` times the sum of the
  three layers (the token layer doubled) weighted by the softmax of ``aggregation/weights``;
  ``default`` (batch, 2 * projection_dim), the mean of ``elmo`` over each sentence's tokens.
  ``as_dict=False`` gives ``default`` alone, as TF-Hub does.
- Rows past a sentence's end: ``lstm_outputs1`` and ``lstm_outputs2`` are zero; ``word_emb`` is
  the char CNN's vector of an all-padding token (bilm-tf runs the CNN over every position), so
  ``elmo`` there is the token layer's share of the mix, not zero.
- State: bilm-tf's graph keeps each batch row's LSTM states in variables, so a call starts
  every row from the state the row ended in at the module's previous call (of the same
  signature: each signature applies its own copy of the graph); rows beyond a smaller batch keep
  theirs; the first call starts from zeros. ``reset_states()`` starts again.

A module is any model ``elmokit.resolve_model`` takes; a TF-Hub module folder brings its own
``aggregation/weights`` and ``aggregation/scaling``, another model gets bilm-tf's initial mix
(equal weights, scaling 1).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..hub import resolve_model
from ..model.bilm import BiLM, CarriedState, StatefulBiLM
from ..model.tfhub import read_tfhub
from ..model.weights import load_weight_arrays

__all__ = ["Module"]

SIGNATURES = ("default", "tokens")
OUTPUTS = ("word_emb", "lstm_outputs1", "lstm_outputs2", "elmo", "default")


class Module:
    """A TF-Hub ELMo module: ``Module(spec)``, called as ``m(sentences, signature="default",
    as_dict=True)`` or ``m({"tokens": ..., "sequence_len": ...}, signature="tokens",
    as_dict=True)``. ``trainable`` is accepted and ignored (nothing is trained here)."""

    def __init__(
        self,
        spec: str | os.PathLike,
        trainable: bool = False,
        name: str = "module",
        *,
        device: str | torch.device = "cpu",
    ) -> None:
        source = resolve_model(spec)
        self.spec = str(spec)
        self.name = name
        self.trainable = trainable
        weights: np.ndarray | None = None
        scaling = 1.0
        if source.kind == "tfhub":
            assert source.folder is not None
            module = read_tfhub(source.folder, require_aggregation=True)
            bilm: BiLM = StatefulBiLM(module.options)
            load_weight_arrays(bilm, module.arrays, f"{module.folder} (TF-Hub module)")
            weights, scaling = module.aggregation_weights, float(module.aggregation_scaling or 0.0)
        else:
            bilm = BiLM.from_pretrained(spec, stateful=True)
        assert isinstance(bilm, StatefulBiLM)
        self.bilm = bilm.to(device).eval()
        n = self.bilm.num_layers
        self.aggregation_weights = np.zeros(n, np.float32) if weights is None else weights.astype(np.float32)
        self.aggregation_scaling = np.float32(scaling)
        self._states = {signature: CarriedState() for signature in SIGNATURES}
        with torch.no_grad():  # the char CNN's vector of an all-padding token: (projection_dim,)
            width = self.bilm.token_encoder.input_width
            zero = torch.zeros(1, width, dtype=torch.long, device=self._device)
            self._padding_vector = self.bilm.token_encoder(zero.unsqueeze(0))[0, 0].cpu().numpy()

    @property
    def _device(self) -> torch.device:
        return next(self.bilm.parameters()).device

    def get_signature_names(self) -> list[str]:
        return list(SIGNATURES)

    def get_output_info_dict(self, signature: str = "default") -> dict[str, tuple[int | None, ...]]:
        """Each output's shape (None: the batch or the length), as TF-Hub's method names them."""
        self._check_signature(signature)
        dim = self.bilm.output_dim
        half = self.bilm.options.lstm.projection_dim
        return {
            "word_emb": (None, None, half),
            "lstm_outputs1": (None, None, dim),
            "lstm_outputs2": (None, None, dim),
            "elmo": (None, None, dim),
            "default": (None, dim),
        }

    def reset_states(self) -> None:
        """Forget the carried LSTM states of every signature (the next call starts from zeros)."""
        for state in self._states.values():
            state.reset()

    def __call__(
        self, inputs: Any, signature: str | None = None, as_dict: bool | None = None
    ) -> dict[str, np.ndarray] | np.ndarray:
        signature = signature or "default"
        self._check_signature(signature)
        if signature == "default":
            sentences, width = _split_sentences(inputs)
        else:
            sentences, width = _token_rows(inputs)
        outputs = self._run(sentences, width, signature)
        return outputs if as_dict else outputs["default"]

    def _check_signature(self, signature: str) -> None:
        if signature not in SIGNATURES:
            raise ValueError(f"signature must be one of {', '.join(SIGNATURES)}, got {signature!r}")

    def _run(self, sentences: list[list[str]], width: int, signature: str) -> dict[str, np.ndarray]:
        batch, half = len(sentences), self.bilm.options.lstm.projection_dim
        dim = 2 * half
        lengths = np.array([len(s) for s in sentences], dtype=np.int64)
        layers = np.zeros((self.bilm.num_layers, batch, width, dim), np.float32)
        self.bilm.carried = self._states[signature]
        with torch.no_grad():
            ids = self.bilm.batch_to_ids(sentences).to(self._device)
            out = self.bilm(ids)
        steps = out.layers.shape[2]
        layers[:, :, :steps] = out.layers.cpu().numpy()
        past = np.arange(width)[None, :] >= lengths[:, None]  # (batch, width)
        layers[0][past] = np.concatenate([self._padding_vector, self._padding_vector])
        mix = np.exp(self.aggregation_weights - self.aggregation_weights.max())
        mix = (mix / mix.sum()).astype(np.float32)
        elmo = self.aggregation_scaling * sum(mix[k] * layers[k] for k in range(len(mix)))
        real = (~past).astype(np.float32)[:, :, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            default = (elmo * real).sum(axis=1) / real.sum(axis=1)
        result = {"word_emb": layers[0][:, :, :half]}
        result.update({f"lstm_outputs{k}": layers[k] for k in range(1, len(layers))})
        result.update({"elmo": elmo.astype(np.float32), "default": default.astype(np.float32)})
        return result


def _text(value: Any, what: str) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what} is not UTF-8: {value[:40]!r}") from None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _split_sentences(inputs: Any) -> tuple[list[list[str]], int]:
    """The default signature's input: sentences split at spaces (no empty tokens)."""
    if isinstance(inputs, Mapping):
        inputs = inputs.get("default", inputs.get("strings"))
    if isinstance(inputs, (str, bytes)):
        raise TypeError("the default signature takes a 1-D list of sentences, not one string")
    array = np.asarray(inputs, dtype=object)
    if array.ndim != 1:
        raise ValueError(f"the default signature takes a 1-D list of sentences, got shape {array.shape}")
    if array.size == 0:
        raise ValueError("the default signature needs at least one sentence")
    sentences = [[t for t in _text(s, f"sentence {i}").split(" ") if t] for i, s in enumerate(array)]
    return sentences, max(len(s) for s in sentences)


def _token_rows(inputs: Any) -> tuple[list[list[str]], int]:
    """The tokens signature's input: each row's tokens before its ``sequence_len``."""
    if not isinstance(inputs, Mapping) or set(inputs) != {"tokens", "sequence_len"}:
        raise ValueError(
            'the tokens signature takes {"tokens": (batch, max_len) strings, "sequence_len": (batch,)}'
        )
    tokens = np.asarray(inputs["tokens"], dtype=object)
    lengths = np.asarray(inputs["sequence_len"])
    if tokens.ndim != 2 or tokens.shape[0] == 0:
        raise ValueError(f"tokens must be a non-empty 2-D (batch, max_len) array, got shape {tokens.shape}")
    if lengths.shape != (tokens.shape[0],) or lengths.dtype.kind not in "iu":
        raise ValueError(
            f"sequence_len must be ({tokens.shape[0]},) integers, got {lengths.dtype} {lengths.shape}"
        )
    width = tokens.shape[1]
    if ((lengths < 0) | (lengths > width)).any():
        raise ValueError(f"sequence_len must lie in 0..{width} (the tokens' max_len), got {lengths.tolist()}")
    rows = [
        [_text(t, f"tokens[{i}][{j}]") for j, t in enumerate(row[: int(n)])]
        for i, (row, n) in enumerate(zip(tokens, lengths))
    ]
    return rows, width
