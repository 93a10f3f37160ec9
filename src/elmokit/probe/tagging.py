"""Per-layer probes on token-labelled data: how much of a labelling each biLM layer holds.

The paper's section 5.3 (Table 6: POS accuracy of a linear classifier on each layer's frozen
vectors). ``run_probe`` reads a train and test file (and optionally a dev file) in CoNLL columns or
CoNLL-U, computes every layer's vectors once per sentence set (``Embedder``, warm mode), and trains,
for each asked layer (0, 1, 2, their average, a learned scalar mix) and each seed, a softmax
regression on the frozen features. Scores: token accuracy, and span F1 for IOB/BIOES labels
(chunks, NER), read as conlleval reads them.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..base.bounds import available_memory_bytes
from ..base.task_data import TaggedSentence, read_conll2003, read_conllu, spans
from ..embed.embedder import Embedder
from ..model.scalar_mix import ScalarMix

__all__ = ["ProbeResult", "read_tagged", "run_probe"]

logger = logging.getLogger(__name__)

FORMATS = ("conll", "conllu")
_SPAN_LABEL = re.compile(r"O|[BIES]-\S+")


def read_tagged(path: str | os.PathLike, fmt: str, column: int) -> list[TaggedSentence]:
    """The sentences of a CoNLL-columns (``conll``: word first, whitespace-separated columns) or
    CoNLL-U file, with the labels of ``column`` (0-based: in CoNLL-2000, 1 is POS and 2 chunks; in
    CoNLL-U, 3 is UPOS and 7 the dependency relation). A missing file, a column the lines lack or a
    file without sentences is an error naming the file."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if column < 0:
        raise ValueError(f"column must be 0 or more, got {column}")
    width = _columns(path, fmt)
    if width == 0:
        raise ValueError(f"{path}: no sentences")
    if column >= width:
        raise ValueError(
            f"{path}: column {column} is out of range: its lines have {width} columns (0 to {width - 1})"
        )
    reader = read_conllu if fmt == "conllu" else read_conll2003
    try:
        sentences = reader(path, column=column)
    except IndexError:  # a later line with fewer columns than the first
        raise ValueError(f"{path}: some lines have no column {column}") from None
    if not sentences:
        raise ValueError(f"{path}: no sentences")
    return sentences


def _columns(path: str | os.PathLike, fmt: str) -> int:
    """The number of columns of the file's first data line (0 if it has none)."""
    with open(path, encoding="utf-8-sig") as f:
        for line in f:
            if not line.strip() or line.startswith("#") or line.startswith("-DOCSTART-"):
                continue
            return len(line.rstrip("\r\n").split("\t") if fmt == "conllu" else line.split())
    return 0


@dataclass
class Features:
    """Every layer's vectors of a sentence set: ``vectors`` (n_tokens, num_layers, dim), float32,
    the sentences' tokens one after another; ``lengths`` the sentences' lengths in that order."""

    vectors: np.ndarray
    lengths: list[int]


def _check_size(tokens: int, num_layers: int, dim: int, max_bytes: int | None) -> None:
    """Refuse features that would not fit: ``max_bytes``, or 80% of the free memory when None."""
    need = tokens * num_layers * dim * 4
    limit = max_bytes
    if limit is None:
        free = available_memory_bytes()
        limit = None if free is None else int(0.8 * free)
    if limit is not None and need > limit:
        raise ValueError(
            f"the features of {tokens:,} tokens x {num_layers} layers x {dim} values need "
            f"{need / 2**30:.2f} GiB, more than the {limit / 2**30:.2f} GiB available; "
            "use fewer sentences (--max-sentences)"
        )


def compute_features(embedder: Embedder, sentences: Sequence[Sequence[str]]) -> Features:
    """Every layer's vectors of ``sentences`` (batched by the Embedder), one array."""
    lengths = [len(s) for s in sentences]
    vectors = np.empty((sum(lengths), embedder.bilm.num_layers, embedder.dim), dtype=np.float32)
    offset = 0
    for array, n in zip(embedder.embed_sentences(sentences), lengths):
        vectors[offset : offset + n] = array.transpose(1, 0, 2)
        offset += n
    return Features(vectors, lengths)


def parse_layers(text: str, num_layers: int = 3) -> list[str]:
    """``"0,1,2,average,mix"`` -> the layer names, checked against the model's layers."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError("no layers given (e.g. 0,1,2,average,mix)")
    for name in names:
        if name in ("average", "mix"):
            continue
        if not name.isdigit() or int(name) >= num_layers:
            raise ValueError(
                f"layer {name!r} is not one of 0 to {num_layers - 1}, average or mix (the model has "
                f"{num_layers} layers)"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"a layer is named twice in {text!r}")
    return names


@dataclass(frozen=True)
class ProbeSettings:
    """How each probe is trained: Adam on minibatches of ``batch_size`` tokens for ``epochs``
    passes (with a dev set, the epoch with the best dev score is kept), features standardised
    with the training set's mean and spread per layer. ``hidden`` 0 is a linear classifier
    (softmax regression); N > 0 a small MLP, one hidden layer of N ReLU units."""

    epochs: int = 10
    batch_size: int = 256
    lr: float = 3e-3
    weight_decay: float = 0.0
    hidden: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(f"epochs and batch_size must be 1 or more: {self.epochs}, {self.batch_size}")
        if self.hidden < 0:
            raise ValueError(f"hidden must be 0 (a linear probe) or more, got {self.hidden}")
        if not self.lr > 0 or self.weight_decay < 0:
            raise ValueError(f"lr must be > 0, weight_decay >= 0: {self.lr}, {self.weight_decay}")


class _Probe(nn.Module):
    """A softmax regression (or, with ``hidden`` > 0, an MLP of one hidden ReLU layer) on one
    layer, the layers' average or a scalar mix of the layers.

    x (batch, num_layers, dim) -> logits (batch, num_labels)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self, layer: str, mean: torch.Tensor, std: torch.Tensor, num_labels: int, hidden: int = 0
    ) -> None:
        super().__init__()
        self.layer = layer
        self.register_buffer("mean", mean)  # (num_layers + 1, dim): each layer's, then the average's
        self.register_buffer("std", std)
        num_layers, dim = mean.shape[0] - 1, mean.shape[1]
        self.mix = ScalarMix(num_layers) if layer == "mix" else None
        self.classifier: nn.Module = (
            nn.Linear(dim, num_labels)
            if hidden == 0
            else nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, num_labels))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer == "average":
            h = (x.mean(dim=1) - self.mean[-1]) / self.std[-1]
        elif self.mix is not None:
            h = self.mix(((x - self.mean[:-1]) / self.std[:-1]).transpose(0, 1))
        else:
            i = int(self.layer)
            h = (x[:, i] - self.mean[i]) / self.std[i]
        return self.classifier(h)


def _statistics(x: torch.Tensor, rows: int = 65536) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation per value of each layer and of the layers' average:
    (num_layers + 1, dim) each, accumulated in float64 over chunks of ``rows`` tokens."""
    total = torch.zeros(x.shape[1] + 1, x.shape[2], dtype=torch.float64)
    squares = torch.zeros_like(total)
    for start in range(0, x.shape[0], rows):
        chunk = x[start : start + rows].double()
        chunk = torch.cat([chunk, chunk.mean(dim=1, keepdim=True)], dim=1)
        total += chunk.sum(dim=0)
        squares += (chunk**2).sum(dim=0)
    n = x.shape[0]
    mean = total / n
    std = (squares / n - mean**2).clamp_min(0).sqrt()
    return mean.float(), std.clamp_min(1e-6).float()


@torch.no_grad()
def _predict(model: _Probe, x: torch.Tensor, rows: int = 8192) -> np.ndarray:
    model.eval()
    out = [model(x[start : start + rows]).argmax(dim=1) for start in range(0, x.shape[0], rows)]
    return torch.cat(out).numpy()


def _scores(
    predicted: np.ndarray, gold: np.ndarray, labels: list[str], lengths: list[int], spans_too: bool
) -> dict[str, float]:
    """Token accuracy (a label unseen in training, -1 in ``gold``, is always wrong), and with
    ``spans_too`` span precision, recall and F1 (in %)."""
    out = {"accuracy": 100.0 * float((predicted == gold).mean())}
    if spans_too:
        gold_spans: set[tuple[int, str, int, int]] = set()
        found_spans: set[tuple[int, str, int, int]] = set()
        offset = 0
        for s, n in enumerate(lengths):
            gold_tags = [labels[i] if i >= 0 else "O" for i in gold[offset : offset + n]]
            found_tags = [labels[i] for i in predicted[offset : offset + n]]
            gold_spans.update((s, *chunk) for chunk in spans(gold_tags))
            found_spans.update((s, *chunk) for chunk in spans(found_tags))
            offset += n
        right = len(gold_spans & found_spans)
        precision = right / len(found_spans) if found_spans else 0.0
        recall = right / len(gold_spans) if gold_spans else 0.0
        f1 = 2 * precision * recall / (precision + recall) if right else 0.0
        out.update(precision=100.0 * precision, recall=100.0 * recall, f1=100.0 * f1)
    return out


@dataclass
class _Split:
    x: torch.Tensor  # (n_tokens, num_layers, dim)
    y: np.ndarray  # label index per token, -1 for a label unseen in training
    lengths: list[int]


def _train_probe(
    layer: str,
    seed: int,
    train: _Split,
    stats: tuple[torch.Tensor, torch.Tensor],
    num_labels: int,
    settings: ProbeSettings,
    dev: _Split | None,
    score_dev,
) -> _Probe:
    """One probe, trained from ``seed`` (its initial weights and the order of the minibatches)."""
    generator = torch.Generator().manual_seed(seed)
    model = _Probe(layer, stats[0], stats[1], num_labels, settings.hidden)
    with torch.no_grad():  # nn.Linear's default initialisation, drawn from the seed's generator
        for linear in model.classifier.modules():
            if isinstance(linear, nn.Linear):
                bound = 1 / math.sqrt(linear.in_features)
                linear.weight.uniform_(-bound, bound, generator=generator)
                linear.bias.uniform_(-bound, bound, generator=generator)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    y = torch.from_numpy(train.y)
    best: tuple[float, dict[str, torch.Tensor]] | None = None
    for _ in range(settings.epochs):
        model.train()
        order = torch.randperm(train.x.shape[0], generator=generator)
        for start in range(0, len(order), settings.batch_size):
            rows = order[start : start + settings.batch_size]
            loss = nn.functional.cross_entropy(model(train.x[rows]), y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if dev is not None:
            score = score_dev(_predict(model, dev.x))
            if best is None or score > best[0]:
                best = (score, {k: v.clone() for k, v in model.state_dict().items()})
    if best is not None:
        model.load_state_dict(best[1])
    return model


@dataclass
class LayerScores:
    """One layer's scores: per seed, on the test set (and the dev set when one was given)."""

    test: list[dict[str, float]] = field(default_factory=list)
    dev: list[dict[str, float]] = field(default_factory=list)
    mix_weights: list[list[float]] = field(default_factory=list)  # layer "mix": softmax(s) per seed

    def summary(self, metric: str, split: str = "test") -> dict[str, Any]:
        """Mean, sample standard deviation (0 for one seed), min, max and the per-seed values."""
        values = [s[metric] for s in (self.test if split == "test" else self.dev)]
        return {
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values),
            "max": max(values),
            "per_seed": values,
        }


@dataclass
class ProbeResult:
    """What ``run_probe`` found: per layer name, its scores; ``metric`` the headline one
    ("f1" for span labels, else "accuracy")."""

    metric: str
    seeds: list[int]
    layers: dict[str, LayerScores]
    labels: list[str]
    sizes: dict[str, dict[str, int]]
    seconds: dict[str, float]
    settings: ProbeSettings

    def to_json(self) -> dict[str, Any]:
        """The result as JSON-ready data: per layer, mean and spread over seeds and per-seed values."""
        metrics = ["accuracy", "f1"] if self.metric == "f1" else ["accuracy"]
        layers: dict[str, Any] = {}
        for name, scores in self.layers.items():
            entry: dict[str, Any] = {"test": {m: scores.summary(m) for m in metrics}}
            if scores.dev:
                entry["dev"] = {m: scores.summary(m, "dev") for m in metrics}
            if scores.mix_weights:
                entry["mix_weights"] = scores.mix_weights
            layers[name] = entry
        return {
            "metric": self.metric,
            "seeds": self.seeds,
            "layers": layers,
            "labels": len(self.labels),
            "sizes": self.sizes,
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
            "settings": {
                "classifier": (
                    "softmax regression on standardised frozen features"
                    if self.settings.hidden == 0
                    else f"MLP (one hidden layer of {self.settings.hidden} ReLU units) on "
                    "standardised frozen features"
                ),
                "optimizer": "Adam",
                **vars(self.settings),
            },
        }

    def table(self) -> str:
        """A plain-text table: a row per layer, the headline metric's mean +- std over seeds."""
        has_dev = any(s.dev for s in self.layers.values())
        header = f"{'layer':<8} {'test ' + self.metric:>18}"
        if self.metric == "f1":
            header += f" {'test accuracy':>18}"
        if has_dev:
            header += f" {'dev ' + self.metric:>18}"
        lines = [header]
        for name, scores in self.layers.items():
            row = f"{name:<8} {_cell(scores.summary(self.metric)):>18}"
            if self.metric == "f1":
                row += f" {_cell(scores.summary('accuracy')):>18}"
            if has_dev:
                row += f" {_cell(scores.summary(self.metric, 'dev')):>18}"
            lines.append(row)
        lines.append(f"({len(self.seeds)} seeds: mean +- sample standard deviation, in %)")
        return "\n".join(lines)


def _cell(summary: dict[str, Any]) -> str:
    return f"{summary['mean']:.2f} +- {summary['std']:.2f}"


def run_probe(
    model: str | os.PathLike | Embedder,
    train: Sequence[TaggedSentence],
    test: Sequence[TaggedSentence],
    dev: Sequence[TaggedSentence] | None = None,
    layers: Sequence[str] = ("0", "1", "2", "average", "mix"),
    seeds: Sequence[int] = (0, 1, 2),
    settings: ProbeSettings = ProbeSettings(),
    metric: str = "auto",
    batch_size: int = 64,
    max_feature_bytes: int | None = None,
) -> ProbeResult:
    """Probe each of ``layers`` of ``model`` (an ``Embedder``, or a spec as ``Embedder`` takes
    it, run in warm mode) with one classifier per seed (linear, or the MLP of
    ``settings.hidden``), trained on ``train``'s frozen vectors and scored on ``test`` (and
    ``dev``). ``metric`` "auto" is span F1 when every training label is O or B-/I-/E-/S-X, else
    accuracy. Features of all sets are computed once; sets whose features would not fit in
    ``max_feature_bytes`` (default: 80% of the free memory) are refused
    before any work."""
    if metric not in ("auto", "accuracy", "f1"):
        raise ValueError(f"metric must be auto, accuracy or f1, got {metric!r}")
    if not seeds:
        raise ValueError("no seeds given")
    sets = {"train": train, "test": test} | ({"dev": dev} if dev is not None else {})
    for name, sentences in sets.items():
        if not sentences or not any(s.tokens for s in sentences):
            raise ValueError(f"the {name} set has no tokens")
    embedder = model if isinstance(model, Embedder) else Embedder(model, batch_size=batch_size)
    num_layers, dim = embedder.bilm.num_layers, embedder.dim
    layers = parse_layers(",".join(layers), num_layers)
    tokens = sum(len(s.tokens) for sentences in sets.values() for s in sentences)
    _check_size(tokens, num_layers, dim, max_feature_bytes)

    labels = sorted({tag for s in train for tag in s.tags})
    index = {label: i for i, label in enumerate(labels)}
    if metric == "auto":
        spanned = all(_SPAN_LABEL.fullmatch(label) for label in labels) and labels != ["O"]
        metric = "f1" if spanned else "accuracy"
    seconds: dict[str, float] = {}
    splits: dict[str, _Split] = {}
    started = time.perf_counter()
    for name, sentences in sets.items():
        features = compute_features(embedder, [s.tokens for s in sentences])
        gold = np.array([index.get(tag, -1) for s in sentences for tag in s.tags], dtype=np.int64)
        splits[name] = _Split(torch.from_numpy(features.vectors), gold, features.lengths)
        logger.info("%s: %d sentences, %d tokens embedded", name, len(sentences), len(gold))
    seconds["features"] = time.perf_counter() - started

    def score(split: _Split, predicted: np.ndarray) -> dict[str, float]:
        return _scores(predicted, split.y, labels, split.lengths, metric == "f1")

    stats = _statistics(splits["train"].x)
    dev_split = splits.get("dev")
    results: dict[str, LayerScores] = {}
    started = time.perf_counter()
    for layer in layers:
        scores = results[layer] = LayerScores()
        for seed in seeds:
            probe = _train_probe(
                layer,
                seed,
                splits["train"],
                stats,
                len(labels),
                settings,
                dev_split,
                None if dev_split is None else (lambda p: score(dev_split, p)[metric]),
            )
            scores.test.append(score(splits["test"], _predict(probe, splits["test"].x)))
            if dev_split is not None:
                scores.dev.append(score(dev_split, _predict(probe, dev_split.x)))
            if probe.mix is not None:
                scores.mix_weights.append(torch.softmax(probe.mix.scalar_parameters, 0).tolist())
            logger.info("layer %s seed %d: test %s %.2f", layer, seed, metric, scores.test[-1][metric])
    seconds["probes"] = time.perf_counter() - started
    sizes = {name: {"sentences": len(s.lengths), "tokens": len(s.y)} for name, s in splits.items()}
    return ProbeResult(metric, list(seeds), results, labels, sizes, seconds, settings)


def probe_files(
    model: str,
    train: str | os.PathLike,
    test: str | os.PathLike,
    fmt: str,
    column: int,
    dev: str | os.PathLike | None = None,
    layers: str = "0,1,2,average,mix",
    seeds: int = 3,
    max_sentences: int | None = None,
    settings: ProbeSettings = ProbeSettings(),
) -> tuple[ProbeResult, dict[str, Any]]:
    """``run_probe`` on files (``read_tagged``; the first ``max_sentences`` training sentences
    when given) with seeds 0 to ``seeds`` - 1. Returns the result and its JSON record: the scores,
    the model, the data files and the command that reproduces it."""
    if seeds < 1:
        raise ValueError(f"seeds must be 1 or more, got {seeds}")
    if max_sentences is not None and max_sentences < 1:
        raise ValueError(f"max_sentences must be 1 or more, got {max_sentences}")
    names = [name.strip() for name in layers.split(",") if name.strip()]
    train_set = read_tagged(train, fmt, column)[:max_sentences]
    test_set = read_tagged(test, fmt, column)
    dev_set = None if dev is None else read_tagged(dev, fmt, column)
    result = run_probe(model, train_set, test_set, dev_set, names, list(range(seeds)), settings)
    command = ["elmokit", "probe", "--model", str(model), "--train", os.fspath(train)]
    if dev is not None:
        command += ["--dev", os.fspath(dev)]
    command += ["--test", os.fspath(test), "--format", fmt, "--column", str(column)]
    command += ["--seeds", str(seeds), "--layers", ",".join(names)]
    if max_sentences is not None:
        command += ["--max-sentences", str(max_sentences)]
    if settings.hidden:
        command += ["--hidden", str(settings.hidden)]
    record = {
        "model": str(model),
        "data": {
            "train": os.fspath(train),
            "dev": None if dev is None else os.fspath(dev),
            "test": os.fspath(test),
        },
        "format": fmt,
        "column": column,
        "max_sentences": max_sentences,
        "command": shlex.join(command),
        **result.to_json(),
    }
    return result, record
