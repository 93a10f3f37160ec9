"""Train and evaluate a task model: read the data, (optionally) get the biLM layers from the cache,
train with Adam and early stopping on dev, score dev and test, write metrics.json and the model.

A run's folder holds ``metrics.json``, the model as ``model.safetensors`` (weights) plus
``model.json`` (config, vocabularies, the biLM's identity), and ``dev.predictions.txt`` /
``test.predictions.txt`` (NER: ``token gold predicted`` lines, conlleval's input). Nothing is
pickled; ``TrainedTask.load(folder)`` reads a model back.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import math
import os
import random
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..base._arguments import spec
from ..base.atomic import (
    atomic_path,
    check_outputs_in,
    disk_full_reason,
    make_folders,
    remove_made_folders,
    write_bytes,
    write_json,
)
from ..base.jsonfiles import read_json
from ..base.task_data import (
    from_bioes,
    iob1_to_bioes,
    read_conll2003,
    read_conllu,
    read_sst,
    tag_scheme,
)
from ..hub import DEFAULT_MODEL, model_files
from ..hub.shipped import TINY_REFERENCE
from ..model.bilm import BiLM
from ..model.characters import batch_to_ids, token_to_ids
from ..model.elmo import Elmo
from .cache import CachedLayers, LayerCache, file_sha256
from .crf import bioes_constraints
from .models import Batch, Classifier, ModelConfig, Tagger

if TYPE_CHECKING:
    from ..embed.embedder import Embedder

__all__ = ["TaskConfig", "TrainedTask", "run_task"]

logger = logging.getLogger(__name__)

MODEL_FORMAT = "elmokit-task-model-v2"

TASKS = ("ner", "pos", "sentiment")
ELMO_DTYPES = ("float32", "int8")  # the frozen biLM's features (elmokit.model.int8)
_ROUND_UPDATES = 100  # the default of TaskConfig.round_updates, which --rounds' help names
METRICS = {"ner": "f1", "pos": "accuracy", "sentiment": "accuracy"}
PAD, UNK = "<pad>", "<unk>"
PAD_CHAR = 261  # the shifted id of elmokit's padding character


def _fraction(text: str) -> float:
    """An argparse type: a share of the training sentences, in (0, 1]."""
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], e.g. 0.01, 0.1 or 1; got {text}")
    return value


@dataclass
class TaskConfig:
    """Everything a run depends on (written into metrics.json and the saved model).

    Training goes in rounds of whole epochs with at least ``round_updates`` optimizer steps each
    (one epoch of the full CoNLL-2003, EWT or SST training set; many epochs of a 1% sample, so
    that small samples are trained as long as they need). The dev set is scored after each round;
    a run stops after ``rounds`` rounds, or ``patience`` rounds without a dev gain, or ``epochs``
    epochs if that is given. The model of the best round is kept.
    """

    task: str = field(metadata=spec(f"the task: {', '.join(TASKS)}", choices=TASKS, option="task"))
    train: str = field(metadata=spec("training file", required=True))
    dev: str = field(metadata=spec("development file (early stopping)", required=True))
    test: str = field(metadata=spec("test file", required=True))
    out: str = field(metadata=spec("output folder", required=True))
    elmo: str | None = field(  # None: the baseline without ELMo
        default=DEFAULT_MODEL,
        metadata=spec(
            "a model in any form elmokit takes: a shipped or known name, a model folder, a .zip "
            "archive, a URL or hf://owner/name (default {default}; not ELMoForManyLangs)",
            metavar="MODEL",
        ),
    )
    fine_tune_elmo: bool = field(
        default=False, metadata=spec("train the biLM too (runs it every step; slow)")
    )
    train_fraction: float = field(
        default=1.0, metadata=spec("use this share of the training sentences", kind=_fraction)
    )
    seed: int = field(
        default=0, metadata=spec("random seed: initial weights, batches, --train-fraction's share", kind=int)
    )
    rounds: int = field(
        default=30,
        metadata=spec(
            f"at most this many rounds; a round is the fewest whole epochs with at least "
            f"{_ROUND_UPDATES} updates (--round-updates), and dev is scored after each",
            kind=int,
        ),
    )
    patience: int = field(
        default=5, metadata=spec("stop after this many rounds without a dev gain", kind=int)
    )
    round_updates: int = field(
        default=_ROUND_UPDATES, metadata=spec("the fewest updates in a round", kind=int)
    )
    epochs: int | None = field(  # None: only rounds and patience stop
        default=None,
        metadata=spec("at most this many epochs (default: rounds and patience decide)", kind=int),
    )
    batch_size: int = field(default=32, metadata=spec("sentences per update", kind=int))
    lr: float = field(default=1e-3, metadata=spec("learning rate (Adam)", kind=float))
    elmo_lr: float | None = field(  # the biLM's learning rate when fine-tuning (None: lr)
        default=None,
        metadata=spec("with --fine-tune-elmo: the biLM's learning rate (default: --lr)", kind=float),
    )
    weight_decay: float = 0.0
    clip_norm: float = 5.0
    binary: bool = field(  # sentiment: SST-2 instead of SST-5
        default=False, metadata=spec("sentiment: SST-2 (drop neutral, negative/positive)")
    )
    model: ModelConfig = field(default_factory=ModelConfig)
    cache_dir: str | None = field(
        default=None, metadata=spec("where the biLM layers are cached (default ~/.cache/elmokit/task-layers)")
    )
    elmo_batch_size: int = field(
        default=64,
        metadata=spec("sentences per batch when the biLM's layers are computed for the cache", kind=int),
    )
    elmo_dtype: str = field(  # the frozen biLM's features (elmokit.model.int8)
        default="float32",
        metadata=spec(
            "the frozen biLM's features: {default} (default) or int8 matmuls (approximate; "
            "docs/export.md); cached under their own key",
            choices=ELMO_DTYPES,
        ),
    )
    threads: int | None = field(  # torch CPU threads during the run (None: leave torch's setting)
        default=1,
        metadata=spec(
            "torch CPU threads (default {default}: these small models run fastest on one; 0 = "
            "torch's default)",
            kind=int,
        ),
    )
    word_dropout: float = 0.5  # chance of replacing a training-set singleton by <unk>
    progress: bool = field(default=True, metadata=spec("no progress output", option="--quiet", invert=True))
    overwrite: bool = field(  # replace the output files of an earlier run in ``out``
        default=False, metadata=spec("replace the files of an earlier run in --out")
    )
    tag_scheme: str = "IOB1"  # NER: the training file's scheme, which predictions are written in

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if not 0.0 < self.train_fraction <= 1.0:
            raise ValueError(f"train_fraction must be in (0, 1], got {self.train_fraction}")
        if self.fine_tune_elmo and self.elmo is None:
            raise ValueError("--fine-tune-elmo needs ELMo (drop --no-elmo)")
        if self.elmo is None and (
            self.model.elmo_at != "input" or self.model.elmo_weighting != "mix" or self.model.mix_l2 > 0.0
        ):
            raise ValueError("--elmo-at, --layers and --mix-l2 need ELMo (drop --no-elmo)")
        if self.fine_tune_elmo and (self.model.elmo_weighting != "mix" or self.model.mix_l2 > 0.0):
            raise ValueError(
                "--fine-tune-elmo uses the Elmo module's own scalar mixes: --layers and --mix-l2 "
                "apply to the frozen biLM's cached layers only"
            )
        if self.elmo_dtype not in ELMO_DTYPES:
            raise ValueError(f"elmo_dtype must be float32 or int8, got {self.elmo_dtype!r}")
        if self.elmo_dtype != "float32" and (self.elmo is None or self.fine_tune_elmo):
            raise ValueError(
                "--elmo-dtype int8 applies to a frozen biLM's features (drop --no-elmo or --fine-tune-elmo)"
            )
        for name in ("rounds", "patience", "round_updates", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs must be at least 1, got {self.epochs}")
        if self.threads is not None and self.threads < 0:
            raise ValueError(f"threads must be at least 0 (0: torch's default), got {self.threads}")


# -- data ---------------------------------------------------------------------------------------
@dataclass
class Example:
    tokens: list[str]
    target: list[str] | str  # tags (training scheme) or a label
    gold: list[str] | str  # as in the file (NER: IOB1)


def read_task_data(task: str, path: str, binary: bool = False) -> list[Example]:
    if task == "ner":
        return [Example(s.tokens, iob1_to_bioes(s.tags), s.tags) for s in read_conll2003(path)]
    if task == "pos":
        return [Example(s.tokens, s.tags, s.tags) for s in read_conllu(path)]
    return [Example(s.tokens, s.label, s.label) for s in read_sst(path, binary=binary)]


_DIGITS = re.compile(r"\d")


def normalize_word(token: str) -> str:
    """The key of the word-embedding vocabulary: lowercased, digits as 0 (the char CNN still sees
    the raw token)."""
    return _DIGITS.sub("0", token.lower())


def subsample(n: int, fraction: float, seed: int) -> list[int]:
    """A seeded random subset of round(fraction * n) >= 1 indices, in file order."""
    if fraction >= 1.0:
        return list(range(n))
    k = max(1, round(fraction * n))
    return sorted(random.Random(seed).sample(range(n), k))


@dataclass
class Encoded:
    """One data split as tensors: per sentence word ids, char ids, targets; and the ELMo layers."""

    examples: list[Example]
    words: list[torch.Tensor]
    chars: list[torch.Tensor]
    targets: list[torch.Tensor] | torch.Tensor
    counts: list[torch.Tensor]  # training-set count of each token's word (for word dropout)
    layers: CachedLayers | None = None
    layer_index: list[int] | None = None  # sentence i of this split is entry layer_index[i] of layers


def _char_ids(tokens: Sequence[str]) -> torch.Tensor:
    width = min(50, max(len(t.encode("utf-8")) for t in tokens) + 2)
    ids = torch.tensor([token_to_ids(t, width) for t in tokens], dtype=torch.long) + 1
    ids[ids == PAD_CHAR] = 0
    return ids


def encode(
    examples: list[Example],
    words: dict[str, int],
    labels: dict[str, int],
    counts: Counter,
    tagging: bool,
) -> Encoded:
    unk = words[UNK]
    word_ids, char_ids, tags, freq = [], [], [], []
    for ex in examples:
        keys = [normalize_word(t) for t in ex.tokens]
        word_ids.append(torch.tensor([words.get(k, unk) for k in keys], dtype=torch.long))
        freq.append(torch.tensor([counts.get(k, 0) for k in keys], dtype=torch.long))
        char_ids.append(_char_ids(ex.tokens))
        if tagging:
            tags.append(torch.tensor([labels.get(t, 0) for t in ex.target], dtype=torch.long))
    if tagging:
        return Encoded(examples, word_ids, char_ids, tags, freq)
    targets = torch.tensor([labels.get(_label(ex), 0) for ex in examples], dtype=torch.long)
    return Encoded(examples, word_ids, char_ids, targets, freq)


def _label(example: Example) -> str:
    """The label of a sentence of a classification task (its ``target``; tagging tasks have tags)."""
    if not isinstance(example.target, str):
        raise ValueError(f"a classification example has one label, not tags: {example.tokens[:5]}")
    return example.target


def make_batch(
    data: Encoded,
    index: Sequence[int],
    tagging: bool,
    fine_tune: bool,
    word_dropout: float = 0.0,
    rng: torch.Generator | None = None,
) -> Batch:
    lengths = [len(data.words[i]) for i in index]
    b, t = len(index), max(lengths)
    width = max(data.chars[i].shape[1] for i in index)
    mask = torch.zeros(b, t, dtype=torch.bool)
    words = torch.zeros(b, t, dtype=torch.long)
    chars = torch.zeros(b, t, width, dtype=torch.long)
    if tagging:
        targets = torch.zeros(b, t, dtype=torch.long)
    else:
        assert isinstance(data.targets, torch.Tensor)  # one label per sentence: encode()'s tensor
        targets = data.targets[list(index)]
    for row, i in enumerate(index):
        n = lengths[row]
        mask[row, :n] = True
        w = data.words[i]
        if word_dropout > 0:
            singletons = data.counts[i] == 1
            drop = singletons & (torch.rand(n, generator=rng) < word_dropout)
            w = w.masked_fill(drop, 1)  # 1 = <unk>
        words[row, :n] = w
        chars[row, :n, : data.chars[i].shape[1]] = data.chars[i]
        if tagging:
            targets[row, :n] = data.targets[i]
    batch = Batch(mask=mask, words=words, chars=chars, targets=targets)
    if fine_tune:
        batch.elmo_char_ids = batch_to_ids([data.examples[i].tokens for i in index])
    elif data.layers is not None and data.layer_index is not None:
        first = data.layers.token_major(data.layer_index[index[0]])
        layers = np.zeros((b, t, first.shape[1], first.shape[2]), dtype=np.float32)
        for row, i in enumerate(index):
            layers[row, : lengths[row]] = data.layers.token_major(data.layer_index[i])
        batch.elmo_layers = torch.from_numpy(layers).permute(2, 0, 1, 3)
    return batch


def length_batches(lengths: Sequence[int], batch_size: int, rng: random.Random | None) -> list[list[int]]:
    """Batches of sentences of similar length; with ``rng`` the order inside a length and the
    batch order are shuffled."""
    order = list(range(len(lengths)))
    if rng is not None:
        rng.shuffle(order)
    order.sort(key=lambda i: lengths[i])  # stable: ties keep the shuffled order
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if rng is not None:
        rng.shuffle(batches)
    return batches


# -- scoring ------------------------------------------------------------------------------------
def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict:
    """conlleval's entity-level precision, recall and F1 (in %) over whole data sets (micro
    average over chunks, sentence ends close chunks), computed by seqeval in its default mode,
    which reads IOB1/IOB2 chunks exactly as conlleval does. Give IOB tags (``run_task`` turns
    its BIOES predictions back into IOB1 first)."""
    try:
        from seqeval.metrics import f1_score, precision_score, recall_score
    except ImportError:
        raise ImportError("NER scoring needs seqeval: pip install 'elmokit[tasks]'") from None

    gold, predicted = [list(s) for s in gold], [list(s) for s in predicted]
    return {
        "f1": 100.0 * float(f1_score(gold, predicted, zero_division=0)),
        "precision": 100.0 * float(precision_score(gold, predicted, zero_division=0)),
        "recall": 100.0 * float(recall_score(gold, predicted, zero_division=0)),
    }


def score(task: str, examples: Sequence[Example], predictions: Sequence) -> dict:
    if task == "ner":
        return entity_scores([ex.gold for ex in examples], predictions)
    if task == "pos":
        pairs = [(g, p) for ex, pred in zip(examples, predictions) for g, p in zip(ex.gold, pred)]
        return {"accuracy": 100.0 * sum(g == p for g, p in pairs) / max(1, len(pairs))}
    correct = sum(ex.gold == p for ex, p in zip(examples, predictions))
    return {"accuracy": 100.0 * correct / max(1, len(examples))}


# -- the run ------------------------------------------------------------------------------------
def _log(config: TaskConfig, message: str) -> None:
    """A line of the run's progress (``config.progress``), logged at INFO."""
    if config.progress:
        logger.info(message)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _param_groups(
    model: torch.nn.Module, trainable: Sequence[torch.Tensor], config: TaskConfig
) -> list[dict]:
    """Adam's parameter groups: the fine-tuned biLM at ``elmo_lr`` (if given), the rest at ``lr``."""
    elmo = next((m for m in model.modules() if isinstance(m, Elmo)), None)
    if not config.fine_tune_elmo or config.elmo_lr is None or elmo is None:
        return [{"params": trainable}]
    bilm = {id(p) for p in elmo.bilm.parameters()}
    return [
        {"params": [p for p in trainable if id(p) not in bilm]},
        {"params": [p for p in trainable if id(p) in bilm], "lr": config.elmo_lr},
    ]


def build_model(
    config: TaskConfig, n_words: int, labels: list[str], elmo_model: str | None
) -> Tagger | Classifier:
    elmo = None
    if config.fine_tune_elmo:
        if elmo_model is None:
            raise ValueError("fine_tune_elmo needs an ELMo model; elmo is None")
        bilm = BiLM.load(*model_files(elmo_model))
        config.model.elmo_layers, config.model.elmo_dim = bilm.num_layers, bilm.output_dim
        config.model.fine_tune_elmo = True
        elmo = Elmo(
            bilm=bilm,
            num_output_representations=config.model.elmo_sites,  # one mix per place ELMo enters
            dropout=0.0,  # the task model applies its own dropout to all its inputs
            requires_grad=True,
            do_layer_norm=config.model.elmo_layer_norm,
        )
    if config.task in ("ner", "pos"):
        constraints = bioes_constraints(labels) if config.task == "ner" else None
        return Tagger(config.model, n_words, len(labels), constraints, elmo)
    return Classifier(config.model, n_words, len(labels), elmo)


def _cached_layers(
    config: TaskConfig, splits: dict[str, list[Example]], log: Callable[[str], None]
) -> dict[str, CachedLayers]:
    if config.elmo is None:
        raise ValueError("no ELMo model in this config")
    cache = LayerCache(
        config.elmo,
        config.cache_dir,
        batch_size=config.elmo_batch_size,
        progress=config.progress,
        dtype=config.elmo_dtype,
    )
    out = {}
    for name, examples in splits.items():
        file_name = Path(getattr(config, name)).name
        layers = cache.layers([ex.tokens for ex in examples], name=f"{config.task}-{file_name}")
        log(f"biLM layers of {name}: {'computed' if layers.created else 'read'} {layers.path}")
        out[name] = layers
    return out


def cache_layers(config: TaskConfig) -> dict[str, CachedLayers]:
    """Compute (or find) the cached biLM layers of a run's train, dev and test files, as
    ``run_task`` would; e.g. to fill the cache once before starting several runs in parallel."""
    if config.elmo is None:
        raise ValueError("no ELMo model in this config")
    splits = {
        name: read_task_data(config.task, getattr(config, name), config.binary)
        for name in ("train", "dev", "test")
    }
    with _threads(config.threads):
        return _cached_layers(config, splits, lambda message: _log(config, message))


def _predict(model, data: Encoded, labels: list[str], config: TaskConfig, batch_size: int = 128) -> list:
    tagging = config.task != "sentiment"
    model.eval()
    out: list = [None] * len(data.examples)
    lengths = [len(w) for w in data.words]
    with torch.no_grad():
        for index in length_batches(lengths, batch_size, None):
            batch = make_batch(data, index, tagging, config.fine_tune_elmo)
            for i, pred in zip(index, model.predict(batch)):
                out[i] = [labels[j] for j in pred] if tagging else labels[pred]
    if config.task == "ner":  # the chunks as conlleval reads them, in the data's scheme
        out = [from_bioes(tags, config.tag_scheme) for tags in out]
    return out


def _write_predictions(path: Path, data: Encoded, predictions: list, task: str, overwrite: bool) -> None:
    with atomic_path(path, overwrite) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for ex, pred in zip(data.examples, predictions):
            if task == "sentiment":
                f.write(f"{ex.gold}\t{pred}\t{' '.join(ex.tokens)}\n")
                continue
            for token, gold, p in zip(ex.tokens, ex.gold, pred):
                f.write(f"{token} {gold} {p}\n")  # conlleval input: token gold predicted
            f.write("\n")


def run_task(
    config: TaskConfig, log: Callable[[str], None] | None = None, command: str | None = None
) -> dict:
    """Train, early-stop on dev, score dev and test; write ``out/metrics.json``, the model
    (``out/model.safetensors`` + ``out/model.json``) and the dev/test predictions; return the
    metrics. ``command``: the command line to record."""
    with _threads(config.threads), _whole_or_nothing(config) as out:
        return _run_task(config, out, log, command)


def _stage(out: Path) -> Path:
    """The hidden folder in ``out`` where this process writes a run's results, which are moved
    into ``out`` only when all of them are complete."""
    return out / f".results.{os.getpid()}.partial"


@contextlib.contextmanager
def _whole_or_nothing(config: TaskConfig):
    """The output folder ``config.out``, checked and made (``check_task_outputs``), for a run
    that, if it fails (a full disk, bad data, Ctrl-C), leaves it as it was: its staged results
    are removed, and the folder too, with its parents, if the run made them."""
    out = Path(config.out)
    made: list[Path] = []
    try:
        out, made = check_task_outputs(config)
        yield out
    except BaseException as err:
        shutil.rmtree(_stage(out), ignore_errors=True)
        remove_made_folders(made)
        why = disk_full_reason(err)
        if why is not None:
            left = "nothing was left" if made else f"{out} is as it was"
            raise OSError(f"the results in {out} were not written: {why}; {left}") from None
        raise


def _commit(stage: Path, out: Path, overwrite: bool) -> None:
    """Move the complete results from ``stage`` into ``out``."""
    for name in OUTPUT_FILES:
        if not (stage / name).exists():
            continue
        if overwrite:
            os.replace(stage / name, out / name)
        else:
            os.link(stage / name, out / name)  # a file that appeared meanwhile is not replaced
            (stage / name).unlink()
    stage.rmdir()


@contextlib.contextmanager
def _threads(n: int | None):
    """Run with ``n`` torch CPU threads (None or 0: leave torch's setting)."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# the files a run writes in its --out folder
OUTPUT_FILES = (
    "metrics.json",
    "model.safetensors",
    "model.json",
    "dev.predictions.txt",
    "test.predictions.txt",
)


def check_task_outputs(config: TaskConfig) -> tuple[Path, list[Path]]:
    """The output folder ``config.out``, made if missing (and the folders made, for
    ``remove_made_folders``), after checking every file a run writes there by the output policy
    of every command (``atomic.check_output``: no earlier run's file without ``overwrite``,
    never a data file, a link, a device or a pipe)."""
    out = Path(config.out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file; give a folder to write the results into")
    check_outputs_in(out, OUTPUT_FILES, config.overwrite, [config.train, config.dev, config.test])
    try:
        made = make_folders(out)
    except PermissionError:
        raise PermissionError(f"cannot make the output folder {out}: its parent is not writable") from None
    return out, made


def _run_task(config: TaskConfig, out: Path, log: Callable[[str], None] | None, command: str | None) -> dict:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    config = copy.deepcopy(config)  # the ELMo sizes get filled in below; the caller's copy stays
    log = log or (lambda message: _log(config, message))
    _seed_everything(config.seed)
    task, tagging = config.task, config.task != "sentiment"

    train_all = read_task_data(task, config.train, config.binary)
    if task == "ner":
        config.tag_scheme = tag_scheme([ex.gold for ex in train_all])
    dev = read_task_data(task, config.dev, config.binary)
    test = read_task_data(task, config.test, config.binary)
    if not train_all or not dev or not test:
        raise ValueError("train, dev and test must each hold at least one sentence")
    keep = subsample(len(train_all), config.train_fraction, config.seed)
    train = [train_all[i] for i in keep]
    log(
        f"{task}: {len(train)} of {len(train_all)} training sentences ({config.train_fraction:g}), "
        f"dev {len(dev)}, test {len(test)}"
    )

    counts, words = _words(train)
    labels = _labels(task, train_all + dev, test, log)
    label_ids = {label: i for i, label in enumerate(labels)}
    splits = {
        name: encode(examples, words, label_ids, counts, tagging)
        for name, examples in (("train", train), ("dev", dev), ("test", test))
    }

    elmo_info, cache_cpu, cache_wall = _elmo_inputs(config, splits, train_all, dev, test, keep, log)

    _seed_everything(config.seed)
    model = build_model(config, len(words), labels, config.elmo)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in trainable)
    log(f"model: {type(model).__name__}, {n_params:,} trained parameters")
    fit = _fit(model, trainable, splits, dev, labels, config, log)
    metric = METRICS[task]

    if fit.best_state is not None:  # None: no round improved on -inf (dev scores of NaN)
        model.load_state_dict(fit.best_state)
    dev_pred = _predict(model, splits["dev"], labels, config)
    test_pred = _predict(model, splits["test"], labels, config)
    dev_scores, test_scores = score(task, dev, dev_pred), score(task, test, test_pred)
    stage = _stage(out)  # the results appear together, or none of them
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    _write_predictions(stage / "dev.predictions.txt", splits["dev"], dev_pred, task, config.overwrite)
    _write_predictions(stage / "test.predictions.txt", splits["test"], test_pred, task, config.overwrite)

    config_dict = asdict(config)
    save_model(stage, model, config_dict, list(words), labels, elmo_info, config.overwrite)
    metrics = {
        "task": task,
        "metric": metric,
        "dev": dev_scores[metric],
        "test": test_scores[metric],
        "dev_scores": dev_scores,
        "test_scores": test_scores,
        "seed": config.seed,
        "train_fraction": config.train_fraction,
        "train_sentences": len(train),
        "train_tokens": sum(len(ex.tokens) for ex in train),
        "elmo": elmo_info["model"],
        "elmo_details": elmo_info,
        "fine_tune_elmo": config.fine_tune_elmo,
        "elmo_dtype": config.elmo_dtype if config.elmo is not None else None,
        "binary": config.binary if task == "sentiment" else None,
        "epochs": fit.epochs,
        "best_epoch": fit.best_epoch,
        "rounds": len(fit.history),
        "epochs_per_round": fit.epochs_per_round,
        "updates": fit.epochs * fit.batches_per_epoch,
        "trained_parameters": n_params,
        "labels": labels,
        "history": fit.history,
        "cpu_seconds": time.process_time() - cpu0,
        "wall_seconds": time.perf_counter() - wall0,
        "elmo_cache_cpu_seconds": cache_cpu,
        "elmo_cache_wall_seconds": cache_wall,
        "threads": torch.get_num_threads(),
        "config": config_dict,
        "command": command,
    }
    write_json(stage / "metrics.json", metrics, config.overwrite)
    _commit(stage, out, config.overwrite)
    log(
        f"{task} {metric}: dev {metrics['dev']:.2f}, test {metrics['test']:.2f} "
        f"(best epoch {fit.best_epoch});"
        f" {metrics['cpu_seconds']:.0f} CPU s, {metrics['wall_seconds']:.0f} wall s -> {out / 'metrics.json'}"
    )
    return metrics


def _words(train: list) -> tuple[Counter, dict[str, int]]:
    """The training sentences' word counts and the word vocabulary (padding, unknown, then by
    frequency)."""
    counts = Counter(normalize_word(t) for ex in train for t in ex.tokens)
    words = {PAD: 0, UNK: 1}
    for w in sorted(counts, key=lambda w: (-counts[w], w)):
        words[w] = len(words)
    return counts, words


def _labels(task: str, seen: list, test: list, log: Callable[[str], None]) -> list[str]:
    """The labels of the train and dev sentences (for NER, every BIES form of each type), sorted;
    a note names the test labels among none of them."""
    tagging = task != "sentiment"
    if tagging:
        label_set = {t for ex in seen for t in ex.target}
        if task == "ner":
            label_set |= {
                f"{p}-{k}" for t in label_set if t != "O" for k in [t.split("-", 1)[1]] for p in "BIES"
            }
    else:
        label_set = {_label(ex) for ex in seen}
    unknown = sorted({t for ex in test for t in (ex.target if tagging else [_label(ex)])} - label_set)
    if unknown:
        log(f"note: test labels never seen in train or dev (always counted wrong): {', '.join(unknown)}")
    return sorted(label_set)


def _elmo_inputs(
    config: TaskConfig, splits: dict, train_all: list, dev: list, test: list, keep: list[int], log
) -> tuple[dict, float, float]:
    """The ELMo model's record for the results, with its layers cached and attached to
    ``splits`` when it is not fine-tuned (``config``'s ELMo sizes filled in); also the CPU and
    wall seconds the cache took."""
    elmo_info: dict = {"model": None}
    cache_cpu = cache_wall = 0.0
    if config.elmo is not None:
        given = str(config.elmo)
        options_file, weights_file = model_files(given)
        if Path(given).is_dir():  # a folder: saved as an absolute path, so the model loads anywhere
            config.elmo = str(options_file.parent.resolve())
        elmo_info = {
            "model": given,
            "fine_tuned": config.fine_tune_elmo,
            "options_sha256": file_sha256(options_file),
            "weights_sha256": file_sha256(weights_file),
        }
        if config.elmo == TINY_REFERENCE or Path(str(config.elmo)).name == TINY_REFERENCE:
            log("note: elmo-tiny-reference is a random-quality test model; its scores mean nothing")
        if not config.fine_tune_elmo:
            c0, w0 = time.process_time(), time.perf_counter()
            cached = _cached_layers(config, {"train": train_all, "dev": dev, "test": test}, log)
            for name, layers in cached.items():
                splits[name].layers = layers
                splits[name].layer_index = keep if name == "train" else list(range(len(layers)))
                elmo_info[f"{name}_cache"] = str(layers.path)
            config.model.elmo_layers = cached["train"].num_layers
            config.model.elmo_dim = cached["train"].dim
            cache_cpu, cache_wall = time.process_time() - c0, time.perf_counter() - w0
    return elmo_info, cache_cpu, cache_wall


@dataclass
class _Fit:
    """What training a task model did: its rounds and the best dev round's weights."""

    best_state: dict | None
    best_epoch: int
    history: list[dict]
    epochs: int
    epochs_per_round: int
    batches_per_epoch: int


def _fit(
    model: Tagger | Classifier,
    trainable: list,
    splits: dict,
    dev: list,
    labels: list[str],
    config: TaskConfig,
    log,
) -> _Fit:
    """Train with Adam in rounds of ``round_updates`` updates, scoring dev after each round and
    stopping after ``patience`` rounds without a gain."""
    task, tagging = config.task, config.task != "sentiment"
    optimizer = torch.optim.Adam(
        _param_groups(model, trainable, config), lr=config.lr, weight_decay=config.weight_decay
    )
    metric = METRICS[task]
    rng = random.Random(config.seed)
    drop_rng = torch.Generator().manual_seed(config.seed)
    train_lengths = [len(w) for w in splits["train"].words]
    batches_per_epoch = math.ceil(len(train_lengths) / config.batch_size)
    epochs_per_round = math.ceil(config.round_updates / batches_per_epoch)
    max_epochs = config.rounds * epochs_per_round
    if config.epochs is not None:
        max_epochs = min(max_epochs, config.epochs)
    log(
        f"{batches_per_epoch} updates per epoch; dev scored every {epochs_per_round} epoch(s), "
        f"at most {max_epochs} epochs, patience {config.patience} rounds"
    )
    best_score, best_epoch, best_state = -math.inf, 0, None
    history = []
    stale = 0
    epoch = 0
    while epoch < max_epochs:
        r0 = time.perf_counter()
        model.train()
        total, updates = 0.0, 0
        for _ in range(min(epochs_per_round, max_epochs - epoch)):
            epoch += 1
            for index in length_batches(train_lengths, config.batch_size, rng):
                batch = make_batch(
                    splits["train"], index, tagging, config.fine_tune_elmo, config.word_dropout, drop_rng
                )
                loss = model.loss(batch)
                optimizer.zero_grad()
                loss.backward()
                if config.clip_norm:
                    torch.nn.utils.clip_grad_norm_(trainable, config.clip_norm)
                optimizer.step()
                total += loss.item()
                updates += 1
        dev_score = score(task, dev, _predict(model, splits["dev"], labels, config))[metric]
        improved = dev_score > best_score
        if improved:
            best_score, best_epoch, stale = dev_score, epoch, 0
            best_state = copy.deepcopy(model.state_dict())
        else:
            stale += 1
        seconds = time.perf_counter() - r0
        history.append(
            {"epoch": epoch, "train_loss": total / updates, f"dev_{metric}": dev_score, "seconds": seconds}
        )
        log(
            f"epoch {epoch}: train loss {total / updates:.4f}, dev {metric} {dev_score:.2f}"
            f"{' *' if improved else ''} ({seconds:.1f} s)"
        )
        if stale >= config.patience:
            log(f"early stop: no dev gain for {config.patience} rounds")
            break
    return _Fit(best_state, best_epoch, history, epoch, epochs_per_round, batches_per_epoch)


# -- model files ------------------------------------------------------------------------------
def save_model(
    out: Path,
    model: torch.nn.Module,
    config: dict,
    words: list[str],
    labels: list[str],
    elmo: dict,
    overwrite: bool = True,
) -> None:
    """``model.safetensors`` (every tensor of the state dict) and ``model.json`` (what rebuilds
    the model: config, word list, labels, and the biLM files' SHA-256)."""
    from safetensors.torch import save

    state = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    write_bytes(out / "model.safetensors", save(state, metadata={"format": MODEL_FORMAT}), overwrite)
    write_json(
        out / "model.json",
        {"format": MODEL_FORMAT, "config": config, "words": words, "labels": labels, "elmo": elmo},
        overwrite,
    )


class TrainedTask:
    """A model written by ``run_task``: ``TrainedTask.load(out_dir).predict(token_lists)``.

    Tags come back in the training data's scheme (NER: IOB1, IOB2 or BIOES); sentiment gives one
    label per sentence.
    A model trained with ELMo needs its biLM: the folder it was trained with, or ``elmo=`` another
    path to the same files (checked by SHA-256). With a frozen biLM the layers are computed on
    the fly (no cache)."""

    def __init__(self, model, config: TaskConfig, words: list[str], labels: list[str]) -> None:
        self.model, self.config = model.eval(), config
        self.words = {w: i for i, w in enumerate(words)}
        self.labels = labels
        self._embedder: Embedder | None = None

    @classmethod
    def load(cls, out_dir: str | os.PathLike, elmo: str | os.PathLike | None = None) -> TrainedTask:
        from safetensors.torch import load_file

        folder = Path(out_dir)
        saved = read_json(folder / "model.json", what="task model file")
        if saved.get("format") == "elmokit-task-model-v1":
            raise ValueError(
                f"{folder / 'model.json'} is a task model of an earlier elmokit "
                f"(elmokit-task-model-v1, before --elmo-at); retrain it"
            )
        if saved.get("format") != MODEL_FORMAT:
            raise ValueError(f"{folder / 'model.json'} is not an {MODEL_FORMAT} file")
        raw = dict(saved["config"])
        raw["model"] = ModelConfig(**raw["model"])
        config = TaskConfig(**raw)
        if config.elmo is not None:
            if elmo is not None:
                config.elmo = str(elmo)
            options_file, weights_file = model_files(config.elmo)
            expected = saved.get("elmo", {}).get("weights_sha256")
            if not expected:
                raise ValueError(
                    f"{folder / 'model.json'} does not record the SHA-256 of its biLM's weights, so "
                    "the biLM cannot be checked; retrain or add elmo.weights_sha256"
                )
            if file_sha256(weights_file) != expected:
                raise ValueError(
                    f"{weights_file} is not the biLM this model was trained with (SHA-256 differs)"
                )
        model = build_model(config, len(saved["words"]), saved["labels"], config.elmo)
        model.load_state_dict(load_file(str(folder / "model.safetensors")))
        return cls(model, config, saved["words"], saved["labels"])

    def predict(self, sentences: Sequence[Sequence[str]], batch_size: int = 64) -> list:
        from ..embed.embedder import Embedder

        config, tagging = self.config, self.config.task != "sentiment"
        examples = [Example(list(s), "", "") for s in sentences]
        if any(len(ex.tokens) == 0 for ex in examples):
            raise ValueError("every sentence needs at least one token")
        data = encode(examples, self.words, {}, Counter(), tagging=False)  # no targets needed
        if config.elmo is not None and not config.fine_tune_elmo:
            if self._embedder is None:
                self._embedder = Embedder(
                    config.elmo, batch_size=batch_size, mode="warm", dtype=config.elmo_dtype
                )
            data.layers = CachedLayers.from_arrays(
                list(self._embedder.embed_sentences([ex.tokens for ex in examples]))
            )
            data.layer_index = list(range(len(examples)))
        out: list = [None] * len(examples)
        with torch.no_grad():
            for index in length_batches([len(ex.tokens) for ex in examples], batch_size, None):
                batch = make_batch(data, index, False, config.fine_tune_elmo)
                for i, pred in zip(index, self.model.predict(batch)):
                    out[i] = [self.labels[j] for j in pred] if tagging else self.labels[pred]
        if config.task == "ner":
            out = [from_bioes(tags, self.config.tag_scheme) for tags in out]
        return out
