"""Task models: a BiLSTM-CRF sequence tagger and a BiLSTM sentence classifier, each with optional
word embeddings, a character CNN and ELMo.

ELMo comes in two ways: from precomputed biLM layers (``Batch.elmo_layers``, (num_layers, batch,
timesteps, dim)) weighted by the model's own layer weighting (the biLM is frozen and never run
during training), or from an ``Elmo`` module run on character ids (``Batch.elmo_char_ids``), which
can fine-tune the biLM.

Where ELMo enters (the paper's section 5.2, ``ModelConfig.elmo_at``): at the input of the task
BiLSTM (concatenated to the token features), at its output (concatenated to the BiLSTM's states
before the output layer; the classifier pools them together), or both, each site with its own
weighting. How the layers are weighted (section 5.1, ``ModelConfig.elmo_weighting``): ``mix``, the
learned softmax-normalised scalar mix times gamma, whose raw weights s are pulled to 0 (towards an
average) by ``mix_l2 * sum_j s_j^2`` added to the loss (bilm-tf's ``l2_coef``); ``average``, fixed
equal weights times a learned gamma; ``top``, the top layer alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..base._arguments import spec
from ..model.elmo import Elmo
from ..model.scalar_mix import ScalarMix
from .crf import ConditionalRandomField

__all__: list[str] = []

ELMO_SITES = ("input", "output", "both")
ELMO_WEIGHTINGS = ("mix", "average", "top")
N_CHAR_IDS = 261  # shifted char ids 1..260 (bytes, word/sentence markers); 0 = padding and PAD chars


@dataclass
class ModelConfig:
    """Sizes of a task model. ``word_dim`` or ``char_filters`` 0 turns that input off;
    ``elmo_layers``/``elmo_dim`` are set from the biLM when ELMo is used; ``elmo_at`` says where
    ELMo enters the BiLSTM and ``elmo_weighting``/``mix_l2`` how its layers are weighted (module
    docstring)."""

    word_dim: int = field(default=100, metadata=spec("0: no word embeddings", kind=int))
    char_dim: int = 16
    char_filters: int = field(default=50, metadata=spec("0: no char CNN", kind=int))
    char_width: int = 3
    hidden: int = field(default=128, metadata=spec("BiLSTM cells per direction", kind=int))
    lstm_layers: int = field(default=1, metadata=spec("BiLSTM layers of the task model", kind=int))
    dropout: float = field(default=0.5, metadata=spec("dropout rate of the task model", kind=float))
    elmo_layers: int = 0
    elmo_dim: int = 0
    elmo_layer_norm: bool = field(default=False, metadata=spec("layer-normalise the biLM layers in the mix"))
    fine_tune_elmo: bool = False
    elmo_at: str = field(
        default="input",
        metadata=spec(
            "where ELMo enters the task BiLSTM: its input (beside the token features), its output "
            "(beside its states, before the output layer) or both, each with its own layer weights "
            "(default {default})",
            choices=ELMO_SITES,
        ),
    )
    elmo_weighting: str = field(
        default="mix",
        metadata=spec(
            "how the biLM layers are weighted: mix (learned softmax weights and scale), average "
            "(equal weights, learned scale) or top (the top layer alone) (default {default})",
            choices=ELMO_WEIGHTINGS,
            option="--layers",
        ),
    )
    mix_l2: float = field(
        default=0.0,
        metadata=spec(
            "with --layers mix: add LAMBDA * sum(s_j^2) of the raw layer weights to the loss; large "
            "values pull the mix to an average (the paper's lambda: 1 or 0.001) (default {default:g})",
            kind=float,
            metavar="LAMBDA",
        ),
    )

    def __post_init__(self) -> None:
        if self.elmo_at not in ELMO_SITES:
            raise ValueError(f"elmo_at must be one of {', '.join(ELMO_SITES)}, got {self.elmo_at!r}")
        if self.elmo_weighting not in ELMO_WEIGHTINGS:
            raise ValueError(
                f"elmo_weighting must be one of {', '.join(ELMO_WEIGHTINGS)}, got {self.elmo_weighting!r}"
            )
        if not self.mix_l2 >= 0.0:
            raise ValueError(f"mix_l2 must be at least 0, got {self.mix_l2}")
        if self.mix_l2 > 0.0 and self.elmo_weighting != "mix":
            raise ValueError(f"mix_l2 applies to the 'mix' weighting, not {self.elmo_weighting!r}")
        if self.elmo_layer_norm and self.elmo_weighting == "top":
            raise ValueError("elmo_layer_norm applies to a mix of layers, not to the top layer alone")

    @property
    def elmo_sites(self) -> int:
        """How many places ELMo enters the model (0 without ELMo)."""
        if not (self.elmo_layers > 0 or self.fine_tune_elmo):
            return 0
        return 2 if self.elmo_at == "both" else 1

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


class LayerWeighting(nn.Module):
    """One site's weighting of the frozen biLM layers: (num_layers, B, T, D) -> (B, T, D).

    ``mix``: a ``ScalarMix`` (learned s and gamma); ``average``: a ``ScalarMix`` whose s is fixed
    at 0 (equal weights) with a learned gamma; ``top``: the top layer as it is (no parameters)."""

    def __init__(self, num_layers: int, weighting: str, layer_norm: bool = False) -> None:
        super().__init__()
        self.weighting = weighting
        self.scalar_mix = None
        if weighting != "top":
            self.scalar_mix = ScalarMix(num_layers, do_layer_norm=layer_norm, trainable=weighting == "mix")

    def forward(self, layers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.scalar_mix is None:
            return layers[-1]
        return self.scalar_mix(layers, mask)


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
        self.weighting: LayerWeighting | None = None
        self.elmo = elmo
        self.elmo_input = config.elmo_sites > 0 and config.elmo_at in ("input", "both")
        if config.fine_tune_elmo:
            if elmo is None:
                raise ValueError("fine_tune_elmo needs an Elmo module")
            if self.elmo_input:
                dim += elmo.output_dim
        elif self.elmo_input:
            self.weighting = LayerWeighting(config.elmo_layers, config.elmo_weighting, config.elmo_layer_norm)
            dim += config.elmo_dim
        if dim == 0:
            raise ValueError("the model has no input: enable word embeddings, char features or ELMo")
        self.dropout = nn.Dropout(config.dropout)
        self.output_dim = dim

    def forward(self, batch: Batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """-> the token features (B, T, output_dim) with dropout, and the fine-tuned ``Elmo``'s
        representations (each (B, T, dim); empty without one), whose first is used here when
        ELMo enters at the input."""
        parts = []
        if self.words is not None:
            parts.append(self.words(batch.words))
        if self.chars is not None:
            parts.append(self.chars(batch.chars))
        representations: list[torch.Tensor] = []
        if self.elmo is not None:
            representations = list(self.elmo(batch.elmo_char_ids).representations)
            if self.elmo_input:
                parts.append(representations[0])
        elif self.weighting is not None:
            parts.append(self.weighting(batch.elmo_layers, batch.mask))
        return self.dropout(torch.cat(parts, dim=-1)), representations


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
        self.elmo_output = config.elmo_sites > 0 and config.elmo_at in ("output", "both")
        self.output_weighting: LayerWeighting | None = None
        if self.elmo_output and not config.fine_tune_elmo:
            self.output_weighting = LayerWeighting(
                config.elmo_layers, config.elmo_weighting, config.elmo_layer_norm
            )
        self.encoded_dim = 2 * config.hidden + (config.elmo_dim if self.elmo_output else 0)

    def encode(self, batch: Batch) -> torch.Tensor:
        """(B, T, encoded_dim): the BiLSTM's states, with ELMo beside them when it enters at the
        output; zeros at padding."""
        x, representations = self.features(batch)
        lengths = batch.lengths.cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        if self.elmo_output:
            if representations:
                elmo = representations[-1]
            else:
                assert self.output_weighting is not None
                elmo = self.output_weighting(batch.elmo_layers, batch.mask)
            out = torch.cat([out, elmo * batch.mask.unsqueeze(-1)], dim=-1)
        return self.dropout(out)

    def add_weighting_penalty(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss + mix_l2 * sum_j s_j^2`` over every site's learned layer mix (``loss`` itself
        when ``mix_l2`` is 0)."""
        coef = self.features.config.mix_l2
        for site in (self.features.weighting, self.output_weighting):
            if coef > 0.0 and site is not None and site.scalar_mix is not None:
                loss = loss + coef * site.scalar_mix.l2_penalty()
        return loss


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
        self.output = nn.Linear(self.encoded_dim, n_tags)
        self.crf = ConditionalRandomField(n_tags, constraints)

    def emissions(self, batch: Batch) -> torch.Tensor:
        return self.output(self.encode(batch))

    def loss(self, batch: Batch) -> torch.Tensor:
        """Mean negative log-likelihood per sentence, plus the layer weighting's penalty."""
        nll = -self.crf(self.emissions(batch), batch.targets, batch.mask).mean()
        return self.add_weighting_penalty(nll)

    @torch.no_grad()
    def predict(self, batch: Batch) -> list[list[int]]:
        return self.crf.viterbi_decode(self.emissions(batch), batch.mask)


class Classifier(_Encoder):
    """features -> BiLSTM -> [max; mean] pooling over the tokens -> linear label scores."""

    def __init__(self, config: ModelConfig, n_words: int, n_labels: int, elmo: Elmo | None = None) -> None:
        super().__init__(config, n_words, elmo)
        self.output = nn.Linear(2 * self.encoded_dim, n_labels)

    def logits(self, batch: Batch) -> torch.Tensor:
        h = self.encode(batch)
        m = batch.mask.unsqueeze(-1)
        pooled_max = h.masked_fill(~m, float("-inf")).max(dim=1).values
        pooled_mean = (h * m).sum(1) / m.sum(1).clamp(min=1)
        return self.output(torch.cat([pooled_max, pooled_mean], dim=-1))

    def loss(self, batch: Batch) -> torch.Tensor:
        if batch.targets is None:
            raise ValueError("a batch without targets has no loss")
        return self.add_weighting_penalty(nn.functional.cross_entropy(self.logits(batch), batch.targets))

    @torch.no_grad()
    def predict(self, batch: Batch) -> list[int]:
        return self.logits(batch).argmax(dim=-1).tolist()
