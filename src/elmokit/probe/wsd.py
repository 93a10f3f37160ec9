"""Word sense disambiguation by 1-nearest-neighbour per biLM layer (the paper's section 5.3, Table 5).

A sense's vector is the mean of its training occurrences' vectors (one layer, or the layers'
average); a test word takes the sense, among those of its lemma (and part of speech) seen in
training, whose vector is nearest by cosine; a lemma never seen in training takes WordNet's first
sense (``index.sense`` of WordNet 3.0). Data in the unified evaluation framework's format
(Raganato et al. 2017): ``NAME.data.xml`` (``<sentence>`` of ``<wf>`` and ``<instance>`` tokens)
and ``NAME.gold.key.txt`` (an instance id and its sense keys per line), so SemCor and the
Senseval/SemEval sets drop in. Scored as the framework's scorer does: precision over the answered
instances, recall over all, F1.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..embed.embedder import Embedder
from .tagging import parse_layers

__all__ = ["first_senses", "read_gold_keys", "read_wsd_xml", "run_wsd"]

logger = logging.getLogger(__name__)

# The unified framework's coarse parts of speech -> WordNet's synset types in a sense key
# (lemma%TYPE:...): 1 noun, 2 verb, 3 adjective, 4 adverb, 5 adjective satellite.
_SYNSET_TYPES = {"NOUN": ("1",), "VERB": ("2",), "ADJ": ("3", "5"), "ADV": ("4",)}


@dataclass(frozen=True)
class Instance:
    """A word to disambiguate: tokens ``start`` to ``end`` (exclusive) of its sentence."""

    id: str
    lemma: str
    pos: str
    start: int
    end: int


@dataclass
class WsdSentence:
    tokens: list[str]
    instances: list[Instance] = field(default_factory=list)


def read_wsd_xml(path: str | os.PathLike) -> list[WsdSentence]:
    """The sentences of a ``*.data.xml`` file: every ``<wf>`` and ``<instance>``'s text split at
    blanks (a multiword instance covers several tokens), and the instances with their lemma and
    part of speech. A file that is not such XML is an error naming it."""
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as err:
        raise ValueError(f"{path}: not XML: {err}") from None
    sentences = []
    for element in root.iter("sentence"):
        sentence = WsdSentence([])
        for token in element:
            words = (token.text or "").split()
            if token.tag == "instance":
                for attribute in ("id", "lemma", "pos"):
                    if not token.get(attribute):
                        raise ValueError(f"{path}: an <instance> without the attribute {attribute!r}")
                if not words:
                    raise ValueError(f"{path}: instance {token.get('id')} has no text")
                start = len(sentence.tokens)
                sentence.instances.append(
                    Instance(
                        token.get("id", ""),
                        token.get("lemma", ""),
                        token.get("pos", ""),
                        start,
                        start + len(words),
                    )
                )
            elif token.tag != "wf":
                continue
            sentence.tokens.extend(words)
        if sentence.tokens:
            sentences.append(sentence)
    if not sentences:
        raise ValueError(f"{path}: no <sentence> with words (expected the unified WSD framework's XML)")
    return sentences


def gold_key_path(xml_path: str | os.PathLike) -> Path:
    """The gold key file beside ``NAME.data.xml``: ``NAME.gold.key.txt``."""
    path = Path(xml_path)
    name = path.name.removesuffix(".data.xml").removesuffix(".xml")
    return path.with_name(f"{name}.gold.key.txt")


def read_gold_keys(path: str | os.PathLike) -> dict[str, list[str]]:
    """``instance_id key [key ...]`` per line -> the sense keys of each instance."""
    keys: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 2:
                raise ValueError(
                    f"{path}: line {number}: expected 'INSTANCE_ID SENSE_KEY ...', got {line.strip()!r}"
                )
            keys[fields[0]] = fields[1:]
    return keys


def first_senses(path: str | os.PathLike) -> dict[tuple[str, str], str]:
    """WordNet's first sense per (lemma, synset type) from an ``index.sense`` file (lines
    ``sense_key synset_offset sense_number tag_cnt``, WordNet 3.0's format): the key whose sense
    number is 1."""
    first: dict[tuple[str, str], str] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 4 or "%" not in fields[0] or not fields[2].isdigit():
                raise ValueError(
                    f"{path}: line {number}: expected 'SENSE_KEY OFFSET SENSE_NUMBER TAG_COUNT' "
                    f"(WordNet's index.sense), got {line.strip()!r}"
                )
            if fields[2] == "1":
                lemma, rest = fields[0].split("%", 1)
                first.setdefault((lemma.lower(), rest[:1]), fields[0])
    return first


def _first_sense(first: dict[tuple[str, str], str], instance: Instance) -> str | None:
    lemma = instance.lemma.lower().replace(" ", "_")
    for synset_type in _SYNSET_TYPES.get(instance.pos, ()):
        if (lemma, synset_type) in first:
            return first[(lemma, synset_type)]
    return None


def _instance_vectors(
    embedder: Embedder, sentences: Sequence[WsdSentence], layers: Sequence[str]
) -> Iterable[tuple[Instance, np.ndarray]]:
    """Each instance with its vector per asked layer: (len(layers), dim), the mean over its tokens."""
    arrays = embedder.embed_sentences([s.tokens for s in sentences])
    for sentence, array in zip(sentences, arrays):  # array (num_layers, n_tokens, dim)
        for instance in sentence.instances:
            span = array[:, instance.start : instance.end].mean(axis=1)
            yield instance, np.stack([span.mean(axis=0) if n == "average" else span[int(n)] for n in layers])


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _score(answers: dict[str, str], gold: dict[str, list[str]], total: int) -> dict[str, float]:
    right = sum(answer in gold.get(i, ()) for i, answer in answers.items())
    precision = right / len(answers) if answers else 0.0
    recall = right / total if total else 0.0
    f1 = 2 * precision * recall / (precision + recall) if right else 0.0
    return {"precision": 100 * precision, "recall": 100 * recall, "f1": 100 * f1, "answered": len(answers)}


def run_wsd(
    model: str | os.PathLike | Embedder,
    train: Sequence[WsdSentence],
    train_keys: dict[str, list[str]],
    test: Sequence[WsdSentence],
    test_keys: dict[str, list[str]],
    first: dict[tuple[str, str], str] | None = None,
    layers: Sequence[str] = ("0", "1", "2", "average"),
    batch_size: int = 64,
) -> dict[str, Any]:
    """1-NN WSD per layer (see the module). A training instance adds its vector to the centroid of
    each of its gold senses; a test lemma (with its part of speech) without training senses takes
    ``first``'s first sense, or stays unanswered without ``first``. Returns per layer the scores
    (precision, recall, F1 in %, answered) and how many answers came from the first sense; with
    ``first``, also the first-sense baseline's scores under "first-sense"."""
    embedder = model if isinstance(model, Embedder) else Embedder(model, batch_size=batch_size)
    layers = parse_layers(",".join(layers), embedder.bilm.num_layers)
    if "mix" in layers:
        raise ValueError("the WSD probe has no trained weights, so no mix: choose layers and average")
    started = time.perf_counter()
    sums: dict[str, np.ndarray] = {}  # sense key -> (len(layers), dim) sum of its occurrences
    counts: dict[str, int] = {}
    senses: dict[tuple[str, str], set[str]] = {}  # (lemma, pos) -> senses seen in training
    missing = 0
    for instance, vectors in _instance_vectors(embedder, train, layers):
        if instance.id not in train_keys:
            missing += 1
            continue
        for key in train_keys[instance.id]:
            sums[key] = sums[key] + vectors if key in sums else vectors.astype(np.float64)
            counts[key] = counts.get(key, 0) + 1
            senses.setdefault((instance.lemma.lower(), instance.pos), set()).add(key)
    if not sums:
        raise ValueError("no training instance has a gold key (are the XML and key files a pair?)")
    if missing:
        logger.warning("%d training instances have no gold key and were left out", missing)
    centroids = {key: _unit(total / counts[key]) for key, total in sums.items()}
    answers: list[dict[str, str]] = [{} for _ in layers]
    fallback, unanswered, total = 0, 0, 0
    baseline: dict[str, str] = {}
    for instance, vectors in _instance_vectors(embedder, test, layers):
        total += 1
        first_sense = None if first is None else _first_sense(first, instance)
        if first_sense is not None:
            baseline[instance.id] = first_sense
        candidates = sorted(senses.get((instance.lemma.lower(), instance.pos), ()))
        if not candidates:
            if first_sense is None:
                unanswered += 1
                continue
            fallback += 1
            for per_layer in answers:
                per_layer[instance.id] = first_sense
            continue
        matrix = np.stack([centroids[key] for key in candidates])  # (senses, len(layers), dim)
        similarity = np.einsum("sld,ld->ls", matrix, _unit(vectors))
        for i, per_layer in enumerate(answers):
            per_layer[instance.id] = candidates[int(similarity[i].argmax())]
    if total == 0:
        raise ValueError("the test data has no <instance> to disambiguate")
    result: dict[str, Any] = {
        "layers": {name: _score(a, test_keys, total) for name, a in zip(layers, answers)},
        "test_instances": total,
        "first_sense_answers": fallback,
        "unanswered": unanswered,
        "training_senses": len(centroids),
        "training_lemmas": len(senses),
        "seconds": round(time.perf_counter() - started, 1),
    }
    if first is not None:
        result["first-sense"] = _score(baseline, test_keys, total)
    return result


def wsd_table(result: dict[str, Any]) -> str:
    """A plain-text table: precision, recall and F1 per layer (and of the first-sense baseline)."""
    rows = dict(result["layers"])
    if "first-sense" in result:
        rows["first-sense"] = result["first-sense"]
    lines = [f"{'layer':<12} {'precision':>9} {'recall':>9} {'F1':>9}"]
    for name, s in rows.items():
        lines.append(f"{name:<12} {s['precision']:>9.2f} {s['recall']:>9.2f} {s['f1']:>9.2f}")
    lines.append(
        f"({result['test_instances']} test instances, {result['first_sense_answers']} answered by the "
        f"first sense, {result['unanswered']} unanswered)"
    )
    return "\n".join(lines)


def wsd_files(
    model: str,
    train: str | os.PathLike,
    test: str | os.PathLike,
    index_sense: str | os.PathLike | None = None,
    train_key: str | os.PathLike | None = None,
    test_key: str | os.PathLike | None = None,
    layers: str = "0,1,2,average",
) -> dict[str, Any]:
    """``run_wsd`` on files: ``*.data.xml`` with their gold keys (by default the
    ``*.gold.key.txt`` beside each) and WordNet's ``index.sense`` for the fallback. Returns the
    JSON record: the scores, the model, the data files and the command that reproduces it."""
    train_key = gold_key_path(train) if train_key is None else train_key
    test_key = gold_key_path(test) if test_key is None else test_key
    names = [name.strip() for name in layers.split(",") if name.strip()]
    first = None if index_sense is None else first_senses(index_sense)
    result = run_wsd(
        model,
        read_wsd_xml(train),
        read_gold_keys(train_key),
        read_wsd_xml(test),
        read_gold_keys(test_key),
        first,
        names,
    )
    command = ["elmokit", "probe", "wsd", "--model", str(model), "--train", os.fspath(train)]
    command += [
        "--train-key",
        os.fspath(train_key),
        "--test",
        os.fspath(test),
        "--test-key",
        os.fspath(test_key),
    ]
    if index_sense is not None:
        command += ["--index-sense", os.fspath(index_sense)]
    command += ["--layers", ",".join(names)]
    files = {
        "train": train,
        "train_key": train_key,
        "test": test,
        "test_key": test_key,
        "index_sense": index_sense,
    }
    return {
        "model": str(model),
        "data": {k: None if v is None else os.fspath(v) for k, v in files.items()},
        "command": shlex.join(command),
        **result,
    }
