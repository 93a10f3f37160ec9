"""Task models: a BiLSTM-CRF sequence tagger and a BiLSTM sentence classifier, each with optional
word embeddings, a character CNN and ELMo.

ELMo comes in two ways: from precomputed biLM layers (``Batch.elmo_layers``, (num_layers, batch,
timesteps, dim)) mixed by the model's own ``ScalarMix`` (the biLM is frozen and never run during
training), or from an ``Elmo`` module run on character ids (``Batch.elmo_char_ids``), which can
fine-tune the biLM.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..elmo import Elmo
from ..scalar_mix import ScalarMix
from .crf import ConditionalRandomField

__all__ = ["Batch", "CharCNN", "Classifier", "ModelConfig", "Tagger", "TokenFeatures"]

N_CHAR_IDS = 261  # shifted char ids 1..260 (bytes, word/sentence markers); 0 = padding and PAD chars


@dataclass
class ModelConfig:
    """Sizes of a task model. ``word_dim`` or ``char_filters`` 0 turns that input off;
    ``elmo_layers``/``elmo_dim`` are set from the biLM when ELMo is used."""

    word_dim: int = 100
    char_dim: int = 16
    char_filters: int = 50
    char_width: int = 3
    hidden: int = 128
    lstm_layers: int = 1
    dropout: float = 0.5
    elmo_layers: int = 0
    elmo_dim: int = 0
    elmo_layer_norm: bool = False
    fine_tune_elmo: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Batch:
    """A padded batch. words (B, T) word ids; chars (B, T, C) char ids (0 = padding); mask (B, T);
    elmo_layers (L, B, T, D) or elmo_char_ids (B, T, 50); targets (B, T) tag ids or (B,) labels."""

    mask: torch.Tensor
    words: torch.Tensor | None = None
    chars: torch.Tensor | None = None
    elmo_layers: torch.Tensor | None = None
    elmo_char_ids: torch.Tensor | None = None
    targets: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.long().sum(1)


class CharCNN(nn.Module):
    """Char embedding -> conv1d -> max over the token's characters (padding never counts, so a
    token's vector does not depend on how wide its batch is)."""

    def __init__(self, char_dim: int, filters: int, width: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(N_CHAR_IDS, char_dim, padding_idx=0)
        self.conv = nn.Conv1d(char_dim, filters, width, padding=width // 2)
        self.output_dim = filters

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        """chars (B, T, C) -> (B, T, filters)."""
        b, t, c = chars.shape
        flat = chars.view(b * t, c)
        x = self.conv(self.embedding(flat).transpose(1, 2))[:, :, :c]  # (B*T, filters, C)
        real = (flat > 0).unsqueeze(1)
        x = torch.relu(x).masked_fill(~real, 0.0)  # relu >= 0, so 0 never beats a real position
        return x.max(dim=2).values.view(b, t, -1)


class TokenFeatures(nn.Module):
    """[word embedding; char CNN; ELMo] for every token, with dropout."""

    def __init__(self, config: ModelConfig, n_words: int, elmo: Elmo | None = None) -> None:
        super().__init__()
        self.config = config
        dim = 0
        self.words = None
        if config.word_dim > 0:
            self.words = nn.Embedding(n_words, config.word_dim, padding_idx=0)
            bound = (3.0 / config.word_dim) ** 0.5
            nn.init.uniform_(self.words.weight, -bound, bound)
            with torch.no_grad():
                self.words.weight[0].zero_()
            dim += config.word_dim
        self.chars = None
        if config.char_filters > 0:
            self.chars = CharCNN(config.char_dim, config.char_filters, config.char_width)
            dim += self.chars.output_dim
        self.scalar_mix = None
        self.elmo = elmo
        if config.fine_tune_elmo:
            if elmo is None:
                raise ValueError("fine_tune_elmo needs an Elmo module")
            dim += elmo.output_dim
        elif config.elmo_layers > 0:
            self.scalar_mix = ScalarMix(config.elmo_layers, do_layer_norm=config.elmo_layer_norm)
            dim += config.elmo_dim
        if dim == 0:
            raise ValueError("the model has no input: enable word embeddings, char features or ELMo")
        self.dropout = nn.Dropout(config.dropout)
        self.output_dim = dim

    def forward(self, batch: Batch) -> torch.Tensor:
        parts = []
        if self.words is not None:
            parts.append(self.words(batch.words))
        if self.chars is not None:
            parts.append(self.chars(batch.chars))
        if self.elmo is not None:
            out = self.elmo(batch.elmo_char_ids)
            parts.append(out.representations[0])
        elif self.scalar_mix is not None:
            parts.append(self.scalar_mix(batch.elmo_layers, batch.mask))
        return self.dropout(torch.cat(parts, dim=-1))


class _Encoder(nn.Module):
    def __init__(self, config: ModelConfig, n_words: int, elmo: Elmo | None) -> None:
        super().__init__()
        self.features = TokenFeatures(config, n_words, elmo)
        self.lstm = nn.LSTM(
            self.features.output_dim,
            config.hidden,
            num_layers=config.lstm_layers,
            bidirectional=True,
            batch_first=True,
            dropout=config.dropout if config.lstm_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(config.dropout)

    def encode(self, batch: Batch) -> torch.Tensor:
        """(B, T, 2 * hidden), zeros at padding."""
        x = self.features(batch)
        lengths = batch.lengths.cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return self.dropout(out)


class Tagger(_Encoder):
    """BiLSTM-CRF: features -> BiLSTM -> linear tag scores -> CRF."""

    def __init__(
        self,
        config: ModelConfig,
        n_words: int,
        n_tags: int,
        constraints: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        elmo: Elmo | None = None,
    ) -> None:
        super().__init__(config, n_words, elmo)
        self.output = nn.Linear(2 * config.hidden, n_tags)
        self.crf = ConditionalRandomField(n_tags, constraints)

    def emissions(self, batch: Batch) -> torch.Tensor:
        return self.output(self.encode(batch))

    def loss(self, batch: Batch) -> torch.Tensor:
        """Mean negative log-likelihood per sentence."""
        return -self.crf(self.emissions(batch), batch.targets, batch.mask).mean()

    @torch.no_grad()
    def predict(self, batch: Batch) -> list[list[int]]:
        return self.crf.viterbi_decode(self.emissions(batch), batch.mask)


class Classifier(_Encoder):
    """features -> BiLSTM -> [max; mean] pooling over the tokens -> linear label scores."""

    def __init__(self, config: ModelConfig, n_words: int, n_labels: int, elmo: Elmo | None = None) -> None:
        super().__init__(config, n_words, elmo)
        self.output = nn.Linear(4 * config.hidden, n_labels)

    def logits(self, batch: Batch) -> torch.Tensor:
        h = self.encode(batch)
        m = batch.mask.unsqueeze(-1)
        pooled_max = h.masked_fill(~m, float("-inf")).max(dim=1).values
        pooled_mean = (h * m).sum(1) / m.sum(1).clamp(min=1)
        return self.output(torch.cat([pooled_max, pooled_mean], dim=-1))

    def loss(self, batch: Batch) -> torch.Tensor:
        if batch.targets is None:
            raise ValueError("a batch without targets has no loss")
        return nn.functional.cross_entropy(self.logits(batch), batch.targets)

    @torch.no_grad()
    def predict(self, batch: Batch) -> list[int]:
        return self.logits(batch).argmax(dim=-1).tolist()
