"""This checkout against an older elmokit, in one process, interleaved: inference and training.

    git worktree add ../elmokit-before 1215ffd      # the version to compare with
    python benchmarks/bench_before_after.py --before ../elmokit-before/src \\
        --sentences FILE [--batch-sizes 1,64] [--n-sentences 256] [--rounds 7] [--shipped | --int8] \\
        [--train GLOB [--vocab FILE] [--train-steps 20]] [--shape small] [--threads 2] [--json OUT]

The package under ``--before`` (a ``src`` folder holding ``elmokit/``) is copied to a temporary
folder as ``elmokit_before`` and imported beside this checkout's ``elmokit`` (its imports are
relative), so both run in the same process on the same machine state.

Inference: a model of the shape (random weights, seed 0) is written once with this checkout's
``BiLM.save`` and read by both versions' ``BiLM.load``; the first N non-empty lines of FILE are
batched in file order (whitespace tokens, char ids made before timing). One round times one pass
over the batches with each version (``model(char_ids)`` under ``torch.no_grad``, stateless, the
token cache emptied before the pass), in alternating order (before first in odd rounds). Printed:
median tokens/s of each and the median of the per-round ratios after/before, and the largest
difference between the two versions' outputs.

With ``--int8``, each version's int8 form of that model (``elmokit.model.int8.quantize_bilm``; the
older checkout must have one).

With ``--shipped``, the shipped model (``elmo-news-512``, each version's own copy) instead, the
way users run it: ``Embedder(...).embed_sentences(sentences)`` at each batch size (warm mode,
CPU), and ``Elmo(...)(batch_to_ids(batch))`` over the same batches in file order (one output
representation, no dropout, ``torch.no_grad``; the char ids are made in the timed loop, as a
user's loop makes them). Every cache of either version (token encodings, char ids) is emptied
before each pass, so each pass meets the text as new; its repeats within the pass are what a
cache can serve.

Training (with ``--train``; the vocabulary is ``--vocab`` or every token of the text): each
version builds its ``Trainer`` from the same ``TrainConfig`` (preset of the shape, batch 32 x 20,
8192 negatives, fp32, CPU, seed 0) and its own data stream of the same seed; after 3 warm-up
steps each, the versions take steps in turn (before, after, after, before, ...) and the time of
each ``Trainer.step`` is recorded. Printed: median ms per step of each, the median of the
per-pair speed ratios, and the losses of the first steps (the versions may draw their initial
weights in another order, so these need not be equal).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from bench_bilm import read_sentences
from common import assert_cold

import elmokit


def import_before(src: Path, into: Path) -> ModuleType:
    """Import ``src/elmokit`` under the name ``elmokit_before`` (a copy in ``into``)."""
    package = src / "elmokit"
    if not (package / "__init__.py").is_file():
        sys.exit(f"error: {src} has no elmokit/__init__.py (pass the src folder of a checkout)")
    shutil.copytree(package, into / "elmokit_before", ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(into))
    return importlib.import_module("elmokit_before")


def submodule(package: str, *names: str) -> ModuleType:
    """The first module ``package.<name>`` of ``names`` that exists: where a module sits in this
    layout (packages by layer, e.g. ``model.characters``) or in an older one (``characters``)."""
    for name in names:
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{package}.{name}" and not f"{package}.{name}".startswith(f"{err.name}."):
                raise
    raise ModuleNotFoundError(f"{package} has none of the modules {', '.join(names)}")


def check_cold(model: Any) -> None:
    """Raise AssertionError unless the token cache of ``model`` (either version's BiLM or int8
    form) is empty, where the version keeps it as this checkout does (``common.assert_cold``)."""
    if hasattr(model.token_encoder, "_cache"):
        assert_cold(model, "a timed pass")


def time_pass(model: Any, char_ids: list[torch.Tensor]) -> float:
    """Seconds for one pass over the batches, the token cache emptied (and checked empty) first."""
    model.token_encoder.clear_cache()
    check_cold(model)
    start = time.perf_counter()
    for ids in char_ids:
        model(ids)
    return time.perf_counter() - start


def interleaved(passes: dict[str, Callable[[], float]], rounds: int, tokens: int) -> dict[str, Any]:
    """Rates (tokens/s) of ``passes["before"]`` and ``passes["after"]`` (each returns the seconds
    of one pass over ``tokens`` tokens): 2 warm-up passes each, then ``rounds`` rounds in
    alternating order (before first in even rounds)."""
    for _ in range(2):
        for run in passes.values():
            run()
    rates: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(rounds):
        for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
            rates[name].append(tokens / passes[name]())
    ratios = [a / b for a, b in zip(rates["after"], rates["before"])]
    return {
        "unit": "tokens/s",
        "before": statistics.median(rates["before"]),
        "after": statistics.median(rates["after"]),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
    }


def empty_caches(package: ModuleType, model: Any, embedder: Any = None) -> None:
    """Empty every per-token cache of ``model`` (a BiLM), of ``embedder`` and of their package."""
    model.token_encoder.clear_cache()
    characters = submodule(package.__name__, "model.characters", "characters")
    ids = getattr(characters, "_IDS", None)  # the char-id cache of versions that had one
    if ids is not None:
        ids.clear()
    own = getattr(embedder, "cache", None)  # the Embedder's own encoding cache of versions that had one
    if own is not None:
        own._cache.clear()
    check_cold(model)


def embed_pass(package: ModuleType, embedder: Any, sentences: list[list[str]]) -> float:
    """Seconds of ``embedder.embed_sentences(sentences)``, its caches emptied first."""
    empty_caches(package, embedder.bilm, embedder)
    start = time.perf_counter()
    for _ in embedder.embed_sentences(sentences):
        pass
    return time.perf_counter() - start


def elmo_pass(package: ModuleType, elmo: Any, batches: list[list[list[str]]]) -> float:
    """Seconds of ``elmo(package.batch_to_ids(batch))`` over the batches, caches emptied first."""
    empty_caches(package, next(m for m in elmo.modules() if hasattr(m, "token_encoder")))
    start = time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            elmo(package.batch_to_ids(batch))
    return time.perf_counter() - start


def shipped(before: ModuleType, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--shipped``: Embedder.embed_sentences and Elmo on the shipped model, before and after."""
    packages = {"before": before, "after": elmokit}
    sentences = read_sentences(args.sentences, args.n_sentences)
    tokens = sum(len(s) for s in sentences)
    results = []
    elmos: dict[str, Any] = {}
    for name, package in packages.items():
        elmos[name] = package.Elmo("elmo-news-512", dropout=0.0).eval()
    for size in args.batch_sizes:
        batches = [sentences[i : i + size] for i in range(0, len(sentences), size)]
        embedders = {
            name: package.Embedder("elmo-news-512", batch_size=size, device="cpu")
            for name, package in packages.items()
        }
        first = [list(e.embed_sentences(sentences[:size])) for e in embedders.values()]
        diff = max(float(abs(a - b).max()) for a, b in zip(*first))
        cases = {
            "Embedder.embed_sentences": {
                n: functools.partial(embed_pass, p, embedders[n], sentences) for n, p in packages.items()
            },
            "Elmo(batch_to_ids(batch))": {
                n: functools.partial(elmo_pass, p, elmos[n], batches) for n, p in packages.items()
            },
        }
        for case, passes in cases.items():
            result = interleaved(passes, args.rounds, tokens)
            result["case"] = f"{case}, elmo-news-512, batch {size}"
            if case.startswith("Embedder"):
                result["max_abs_diff"] = diff
            results.append(result)
            print_result(result)
    return results


def inference(before: ModuleType, args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    from elmokit.model.options import preset

    torch.manual_seed(0)
    options_file, weight_file = folder / "options.json", folder / "weights.hdf5"
    elmokit.BiLM(preset(args.shape)).save(options_file, weight_file)
    models = {
        "before": before.BiLM.load(options_file, weight_file),
        "after": elmokit.BiLM.load(options_file, weight_file),
    }
    if args.int8:  # each version's int8 form of the same model
        models = {
            "before": submodule(before.__name__, "model.int8", "int8").quantize_bilm(models["before"]),
            "after": importlib.import_module("elmokit.model.int8").quantize_bilm(models["after"]),
        }
    sentences = read_sentences(args.sentences, args.n_sentences)
    tokens = sum(len(s) for s in sentences)
    results = []
    for size in args.batch_sizes:
        batches = [sentences[i : i + size] for i in range(0, len(sentences), size)]
        char_ids = [elmokit.batch_to_ids(b) for b in batches]
        with torch.no_grad():
            diff = (models["before"](char_ids[0]).layers - models["after"](char_ids[0]).layers).abs().max()
            rates: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(2):  # warm-up
                for model in models.values():
                    time_pass(model, char_ids[:2])
            for r in range(args.rounds):
                order = ("before", "after") if r % 2 == 0 else ("after", "before")
                for name in order:
                    rates[name].append(tokens / time_pass(models[name], char_ids))
        ratios = [a / b for a, b in zip(rates["after"], rates["before"])]
        results.append(
            {
                "case": f"inference, {args.shape} shape{', int8' if args.int8 else ''}, batch {size}",
                "unit": "tokens/s",
                "before": statistics.median(rates["before"]),
                "after": statistics.median(rates["after"]),
                "ratio": statistics.median(ratios),
                "ratios": ratios,
                "max_abs_diff": float(diff),
            }
        )
        print_result(results[-1])
    return results


def training(before: ModuleType, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    from elmokit.lm.vocabulary import Vocabulary
    from elmokit.model.options import BiLMOptions, preset
    from elmokit.training.data import corpus_files, count_tokens

    if not args.vocab:  # every token of the training text
        args.vocab = str(folder / "vocab.txt")
        Vocabulary.build(count_tokens(corpus_files(args.train))).save(args.vocab)

    trainers, streams = {}, {}
    for name, package in (("before", "elmokit_before"), ("after", "elmokit")):
        # older versions: data.py (with the vocabulary) and, as d119d49, one module train.py
        data_mod = submodule(package, "training.data", "data")
        vocab_mod = submodule(package, "lm.vocabulary", "data")
        config_mod = submodule(package, "training.config", "train")
        train_mod = submodule(package, "training.loop", "train")
        vocab = vocab_mod.Vocabulary.from_file(args.vocab)
        options = preset(args.shape)
        max_chars = BiLMOptions.from_dict(options).char_cnn.max_characters_per_token
        data = data_mod.BidirectionalLMBatches(
            data_mod.corpus_files(args.train), vocab, 32, 20, seed=0, max_characters_per_token=max_chars
        )
        config = config_mod.TrainConfig(
            train=args.train,
            vocab=args.vocab,
            save_dir=str(folder / f"train-{name}"),
            options=options,
            batch_size=32,
            unroll_steps=20,
            n_negative_samples=8192,
            device="cpu",
            seed=0,
        )
        cpu = train_mod.Distributed(device=torch.device("cpu"))
        trainers[name] = train_mod.Trainer(config, data, len(vocab), cpu)
        streams[name] = iter(data)
    for _ in range(3):  # warm-up
        for name in trainers:
            trainers[name].step(next(streams[name]))
    times: dict[str, list[float]] = {"before": [], "after": []}
    losses: dict[str, list[float]] = {"before": [], "after": []}
    for i in range(args.train_steps):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        for name in order:
            batch = next(streams[name])
            start = time.perf_counter()
            forward, backward = trainers[name].step(batch)
            times[name].append(time.perf_counter() - start)
            losses[name].append(0.5 * (forward + backward))
    ratios = [b / a for a, b in zip(times["after"], times["before"])]  # speed ratio after/before
    result = {
        "case": f"training, {args.shape} preset, batch 32 x 20, 8192 negatives",
        "unit": "ms/step",
        "before": 1000 * statistics.median(times["before"]),
        "after": 1000 * statistics.median(times["after"]),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "losses_before": losses["before"][:5],
        "losses_after": losses["after"][:5],
    }
    print_result(result)
    return result


def print_result(r: dict[str, Any]) -> None:
    extra = f"  max |after - before| = {r['max_abs_diff']:.2e}" if "max_abs_diff" in r else ""
    if "losses_before" in r:
        extra = "  first losses before " + " ".join(f"{x:.5f}" for x in r["losses_before"][:3])
        extra += " after " + " ".join(f"{x:.5f}" for x in r["losses_after"][:3])
    print(
        f"{r['case']}: before {r['before']:,.0f} {r['unit']}, after {r['after']:,.0f}, "
        f"speed after/before {r['ratio']:.3f} (rounds {min(r['ratios']):.3f}-{max(r['ratios']):.3f}){extra}",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, type=Path, help="src folder of the older checkout")
    p.add_argument("--sentences", help="text file, one whitespace-tokenized sentence per line")
    p.add_argument("--shape", default="small", choices=["small", "original"])
    p.add_argument("--batch-sizes", default="1,64", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--n-sentences", type=int, default=256)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--shipped", action="store_true", help="Embedder and Elmo on the shipped model")
    p.add_argument(
        "--int8", action="store_true", help="inference: each version's int8 form (elmokit.model.int8)"
    )
    p.add_argument("--train", help="training corpus glob (enables the training comparison)")
    p.add_argument("--vocab", help="vocabulary file for --train (default: every token of it)")
    p.add_argument("--train-steps", type=int, default=20, help="timed steps per version")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    if not args.sentences and not args.train:
        p.error("give --sentences (inference), --train (training), or both")
    if args.vocab and not args.train:
        p.error("--vocab goes with --train")
    if args.int8 and (args.shipped or not args.sentences):
        p.error("--int8 goes with --sentences, without --shipped")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; before = {args.before}")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        before = import_before(args.before, folder)
        if args.sentences:
            results += shipped(before, args) if args.shipped else inference(before, args, folder)
        if args.train:
            results.append(training(before, args, folder))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
