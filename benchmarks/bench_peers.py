"""elmokit against other ELMo implementations, in one process, interleaved, on the same sentences.

    python benchmarks/bench_peers.py --sentences FILE --allennlp-wheel WHEEL [--peer allennlp]
    PEER_VENV/bin/python benchmarks/bench_peers.py --sentences FILE --peer elmoformanylangs
        [--cases batch,sentence] [--cache cold,warm] [--n-sentences 256] [--batch-size 64] [--rounds 5]
        [--time-budget T] [--threads 2] [--wait-quiet 0.1] [--pause-pid PID] [--json OUT]

Each peer runs only where it is available; otherwise one line says "skipped: ..." and how to make
it available. Every comparison runs in this process with ``--threads`` intra-op threads, fp32, on
the first ``--n-sentences`` non-empty lines of FILE (whitespace tokens):

- ``allennlp``: AllenNLP 0.9.0's own ELMo files, unchanged, from its wheel (``pip download
  allennlp==0.9.0 --no-deps -d DIR``; it does not install on this Python), with the small
  stand-ins for unrelated imports of tests/fixtures/allennlp-0.9/make_reference.py (its
  ``build_allennlp`` and ``install_batch_to_ids``). One random-weight model in the published
  "small" shape is written with ``BiLM.save`` (options.json + weights.hdf5) and both load that
  file. Peer: ``ElmoEmbedder.embed_batch`` (its ``_ElmoBiLm``) fed length-sorted batches of
  ``--batch-size`` ("batch"), ``ElmoEmbedder.embed_sentence`` ("sentence"). The cases
  "batch-int8" and "sentence-int8" run the same peer call against elmokit's int8 form
  (``Embedder(dtype="int8")``, approximate: docs/export.md), "batch-onnxruntime" and
  "sentence-onnxruntime" against its onnxruntime backend (float32, exact to 1e-5).
- ``elmoformanylangs``: ELMoForManyLangs' ``Embedder(folder, batch_size).sents2elmo(sentences,
  output_layer=-2)`` ("batch"; it sorts by length itself) or one sentence per call ("sentence"),
  on a random-weight model in its published original-size config
  (cnn_50_100_512_4096_sample.json: char CNN with a 100-dim word embedding, 2 x 4096 / 512),
  built with its own classes and saved as its model folder (char.dic and word.dic hold the
  characters and words of the sentences only: a word's lookup costs the same in any table).
  elmokit loads the same folder (``elmokit.BiLM.from_pretrained``); where it cannot, it
  runs its own "original" preset with random weights, and says so. Run the script with the
  python of a venv that has ELMoForManyLangs (torch 2.13.0, ``elmoformanylangs==0.0.4.post2``
  installed with ``--no-deps``, ``overrides==3.1.0``, h5py, and elmokit: ``pip install -e .``).
- ``bilm-tf`` is a training peer: ``benchmarks/bench_train_peer.py`` measures it; here it prints
  a skip line that says so.

elmokit runs ``Embedder.embed_sentences`` (batch_size ``--batch-size``) or
``Embedder.embed_sentence``, default mode (warm: zero states, as the random models have no start
state), all layers, as numpy arrays like the peers' outputs, in two kinds of rounds
(``--cache``, default both):

- cold: a fresh ``Embedder`` and the model's token cache (its ``TokenEncoder``'s, the only cache
  of token encodings) emptied; the round checks that the cache is empty when it starts and stops
  with an AssertionError if not. Within the round, a token seen in an earlier batch is taken
  from the cache, as in any run of a new user.
- warm: one ``Embedder`` on its own copy of the model, whose cache is as the previous pass over
  the same sentences left it (the warm-up pass or the previous warm round): every token is found
  there, the most the cache can give. The round checks that the cache is not empty. A call with
  fewer than the cache's ``cache_min_tokens`` distinct tokens (64; one sentence a call, usually)
  skips the cache, so "sentence" gains little from it; where no call of a case uses it, the warm
  rounds are dropped.

The onnxruntime backend keeps no token cache: its cases have one elmokit side ("none"). The
peers keep no cache of token encodings either and run as their users call them: stateful
(states carried between calls), and ELMoForManyLangs with autograd on, as its ``Embedder`` does.

Before timing, each side embeds the first sentence from zero states and the script prints the
largest difference between the two (the same model gives about 1e-6), then warms up both on the
first batch (8 sentences for "sentence"; the warm side on all the sentences). Then rounds
alternate: peer, elmokit cold, elmokit warm, peer, ..., each round the whole list of sentences,
until ``--rounds`` such groups ("pairs") or, after at least 2, ``--time-budget`` seconds per case
(a round always runs to its end). Tokens are real tokens only. "others" is the share of all
CPUs that other processes used during a round; "cached" the share of the distinct tokens looked
up in the cache that it held. Each ratio is median elmokit tokens/s (cold or warm) over median
peer tokens/s of the same rounds; "pairs" gives the range of the per-pair ratios.
``--wait-quiet X`` waits (at most ``--wait-timeout`` s) before each group of rounds until other
processes use at most X of the CPUs. ``--pause-pid PID`` stops that process (e.g. a training
job on the same cores) during each round and resumes it right after.

On cores that other processes keep busy use ``--threads 1``: with 2 threads on 2 busy cores each
parallel op waits until both threads run, and both sides ran 10-60x slower (batch 1 worst), so
such figures measure the scheduler. Batched peers run their char CNN on every padded position, so
their tokens/s (and the ratio) depend on how long the longest sentences of a batch are: compare
runs on the same ``--n-sentences``.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import logging
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_bilm import median, read_sentences
from common import (
    Pauser,
    assert_warm,
    cpu_sample,
    matmul_rate,
    others_busy,
    shown_command,
    start_cold,
    token_cache_entries,
    wait_until_quiet,
    write_report,
)

import elmokit
from elmokit.model.options import preset

ROOT = Path(__file__).resolve().parents[1]
ALLENNLP_BUILDER = ROOT / "tests" / "fixtures" / "allennlp-0.9" / "make_reference.py"
PEERS = ("allennlp", "elmoformanylangs", "bilm-tf")
# -int8: elmokit's side in int8 (approximate); -onnxruntime: its onnxruntime backend (float32)
CASES = ("batch", "sentence", "batch-int8", "sentence-int8", "batch-onnxruntime", "sentence-onnxruntime")
EFML_CONFIG = "cnn_50_100_512_4096_sample.json"  # ELMoForManyLangs' published original size
MIN_PAIRS = 2

Embed = Callable[[list[list[str]]], object]


# -- the interleaved measurement ---------------------------------------------------------------
class Side:
    """One timed side of a case: the call, and the check made at the start of each of its rounds.

    ``cache``: "cold" (the model's token cache emptied and checked empty before every round, a
    fresh Embedder), "warm" (the cache as the previous pass over the same sentences left it,
    checked non-empty), "none" (a backend that keeps no token cache) or None (the peer)."""

    def __init__(self, name: str, embed: Embed, cache: str | None = None, model: Any = None) -> None:
        self.name, self.embed, self.cache, self.model = name, embed, cache, model

    def before_round(self) -> None:
        if self.cache == "cold":
            start_cold(self.model, f"the cold round of {self.name}")
        elif self.cache == "warm":
            assert_warm(self.model, f"the warm round of {self.name}")

    def cache_stats(self) -> tuple[int, int]:
        return (0, 0) if self.model is None else self.model.token_encoder.cache_stats


def interleave(
    case: str, sides: list[Side], sentences: list[list[str]], args: argparse.Namespace, pauser: Pauser
) -> dict[str, Any]:
    """Warm every side up, then time rounds in the order of ``sides`` (the peer first), each over
    all ``sentences``, pair after pair. A warm side's warm-up is one pass over all the sentences,
    which fills its token cache; if that leaves it empty (no call of the case reaches the cache's
    ``cache_min_tokens`` distinct tokens), the warm rounds would be cold ones: they are dropped."""
    warm_up = sentences[: args.batch_size if case.startswith("batch") else 8]
    for side in list(sides):
        side.embed(sentences if side.cache == "warm" else warm_up)
        if side.cache == "warm" and not token_cache_entries(side.model):
            print(
                f"    {case}: no call used the token cache (each has fewer than "
                f"{side.model.token_encoder.cache_min_tokens} distinct tokens): warm = cold, not timed",
                flush=True,
            )
            sides.remove(side)
    tokens = sum(len(s) for s in sentences)
    rounds: list[dict[str, Any]] = []
    start = time.perf_counter()
    for pair in range(args.rounds):
        wait_until_quiet(args.wait_quiet, args.wait_timeout, exclude_pid=args.pause_pid)
        for side in sides:
            with pauser:
                side.before_round()
                hits, misses = side.cache_stats()
                before = cpu_sample()
                began = time.perf_counter()
                side.embed(sentences)
                seconds = time.perf_counter() - began
                busy = others_busy(before, cpu_sample())
                after_hits, after_misses = side.cache_stats()
            looked_up = (after_hits - hits) + (after_misses - misses)
            cached = (after_hits - hits) / looked_up if looked_up else 0.0
            rounds.append(
                {
                    "pair": pair,
                    "side": side.name,
                    "cache": side.cache,
                    "seconds": seconds,
                    "tokens_per_s": tokens / seconds,
                    "cached_share": cached,
                    "others_cpu_busy": busy,
                }
            )
            share = "" if side.cache in (None, "none") else f", {cached:.0%} of the tokens looked up cached"
            print(
                f"    {case} round {pair + 1} {side.name:<13}: {tokens / seconds:7.0f} tokens/s "
                f"({seconds:.1f} s{share}, others {busy:.0%})",
                flush=True,
            )
        if pair + 1 >= MIN_PAIRS and time.perf_counter() - start > args.time_budget:
            break
    rates = {side.name: [r["tokens_per_s"] for r in rounds if r["side"] == side.name] for side in sides}
    peer_rates = rates["peer"]
    peer_median = median(peer_rates)
    elmokit: dict[str, dict[str, Any]] = {}
    for side in sides[1:]:
        ours = rates[side.name]
        elmokit[side.cache or "none"] = {
            "median_tokens_per_s": median(ours),
            "ratio": median(ours) / peer_median,
            "pair_ratios": [o / p for p, o in zip(peer_rates, ours)],
            "cached_share": median([r["cached_share"] for r in rounds if r["side"] == side.name]),
        }
    return {
        "case": case,
        "sentences": len(sentences),
        "tokens": tokens,
        "rounds": rounds,
        "peer_median_tokens_per_s": peer_median,
        "elmokit": elmokit,
    }


def same_model_check(peer_first: np.ndarray, ours_first: np.ndarray) -> float:
    """Largest absolute difference of the first sentence's vectors (num_layers, n_tokens, dim)."""
    if peer_first.shape != ours_first.shape:
        raise SystemExit(f"the peer gave shape {peer_first.shape}, elmokit {ours_first.shape}")
    return float(np.abs(peer_first - ours_first).max())


def elmokit_call(
    bilm: elmokit.BiLM, case: str, batch_size: int, fresh: bool, backend: str = "torch"
) -> Embed:
    """elmokit's call of a case ("batch": ``embed_sentences``; "sentence": ``embed_sentence``, one
    sentence a call) on ``bilm``: a new Embedder every round when ``fresh``, else one for all."""
    kept = None if fresh else elmokit.Embedder(bilm, batch_size=batch_size, backend=backend)

    def embedder() -> elmokit.Embedder:
        return kept if kept is not None else elmokit.Embedder(bilm, batch_size=batch_size, backend=backend)

    if case == "batch":
        return lambda sentences: list(embedder().embed_sentences(sentences))

    def one_at_a_time(sentences: list[list[str]]) -> list[np.ndarray]:
        once = embedder()
        return [once.embed_sentence(s) for s in sentences]

    return one_at_a_time


def elmokit_sides(bilm: elmokit.BiLM, case: str, batch_size: int, caches: tuple[str, ...]) -> list[Side]:
    """elmokit's sides of a case, one per ``caches`` entry: "cold" (a fresh Embedder, the token
    cache emptied and checked empty before every round), "warm" (one Embedder, the cache as the
    previous pass over the same sentences left it; a copy of the model, so that the cold rounds
    empty only their own cache). The "-int8" cases run the int8 form
    (``elmokit.model.int8``, made once); the "-onnxruntime" cases one Embedder of backend
    onnxruntime (the model exported once; that backend keeps no token cache: one side)."""
    base = case.split("-")[0]
    if case.endswith("-onnxruntime"):
        return [Side("elmokit", elmokit_call(bilm, base, batch_size, False, "onnxruntime"), "none")]
    if case.endswith("-int8"):
        from elmokit.model.int8 import quantize_bilm

        bilm = quantize_bilm(bilm)
    sides = []
    for cache in caches:  # each its own copy of the model: a cold round empties only its own cache
        model = bilm
        if cache == "warm":
            model = copy.deepcopy(bilm)
            model.token_encoder.clear_cache()  # filled by the warm-up pass over the sentences only
        embed = elmokit_call(model, base, batch_size, fresh=cache == "cold")
        sides.append(Side(f"elmokit {cache}", embed, cache, model))
    return sides


def run_cases(peers: dict[str, tuple[Embed, str]], bilm: elmokit.BiLM, sentences, args, pauser) -> list[dict]:
    """Each of ``args.cases`` measured interleaved: the peer's call against elmokit's (cold and
    warm) on the same sentences; one result per case with the calls named."""
    results = []
    for case in args.cases:
        embed, what = peers[case.split("-")[0]]
        sides = [Side("peer", embed), *elmokit_sides(bilm, case, args.batch_size, args.caches)]
        result = interleave(case, sides, sentences, args, pauser)
        results.append(
            {"peer_call": what, "elmokit_call": ELMOKIT_CALLS[case].format(size=args.batch_size), **result}
        )
    return results


def length_sorted_batches(sentences: list[list[str]], size: int) -> list[list[list[str]]]:
    ordered = sorted(sentences, key=len, reverse=True)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


# -- peers ---------------------------------------------------------------------------------------
def run_allennlp(
    args: argparse.Namespace, sentences: list[list[str]], pauser: Pauser, tmp: Path
) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("allennlp_make_reference", ALLENNLP_BUILDER)
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    root = tmp / "allennlp-src"
    builder.build_allennlp(args.allennlp_wheel, root)
    sys.path.insert(0, str(root))
    builder.install_batch_to_ids()
    from allennlp.commands.elmo import ElmoEmbedder

    options_file, weight_file = tmp / "small" / "options.json", tmp / "small" / "weights.hdf5"
    options_file.parent.mkdir()
    torch.manual_seed(args.seed)
    elmokit.BiLM(preset("small")).save(options_file, weight_file)
    bilm = elmokit.BiLM.load(options_file, weight_file)
    peer = ElmoEmbedder(str(options_file), str(weight_file))
    difference = same_model_check(
        peer.embed_sentence(sentences[0]),  # its first call starts from zero states
        elmokit.Embedder(bilm, mode="zero").embed_sentence(sentences[0]),
    )
    print(f"  same model: first sentence from zero states, max |AllenNLP - elmokit| = {difference:.2g}")
    size = args.batch_size
    peers: dict[str, tuple[Embed, str]] = {
        "batch": (
            lambda ss: [peer.embed_batch(b) for b in length_sorted_batches(ss, size)],
            f"ElmoEmbedder.embed_batch (_ElmoBiLm), length-sorted batches of {size}",
        ),
        "sentence": (
            lambda ss: [peer.embed_sentence(s) for s in ss],
            "ElmoEmbedder.embed_sentence (_ElmoBiLm), one sentence per call",
        ),
    }
    results = run_cases(peers, bilm, sentences, args, pauser)
    return {
        "peer": "allennlp",
        "peer_version": "0.9.0 (its ELMo files, unchanged, from the wheel)",
        "model": "random weights, elmokit preset 'small' (2x1024_128, 1 highway), one options.json + "
        "weights.hdf5 loaded by both",
        "same_model": True,
        "first_sentence_max_abs_diff": difference,
        "comparisons": results,
    }


def efml_folder(folder: Path, sentences: list[list[str]], seed: int) -> None:
    """A random-weight ELMoForManyLangs model folder in its original-size config, built with its
    own classes and saved as its trainer saves one (state dicts, dictionaries, config.json)."""
    import elmoformanylangs
    from elmoformanylangs.frontend import Model
    from elmoformanylangs.modules.embedding_layer import EmbeddingLayer

    config_text = (Path(elmoformanylangs.__file__).parent / "configs" / EFML_CONFIG).read_text()
    config = json.loads(config_text)
    words = dict.fromkeys(["<oov>", "<bos>", "<eos>", "<pad>", *(t for s in sentences for t in s)])
    chars = dict.fromkeys([*(c for s in sentences for t in s for c in t)])
    chars.update(dict.fromkeys(["<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"]))
    word_ids = {w: i for i, w in enumerate(words)}
    char_ids = {c: i for i, c in enumerate(chars)}
    embedder = config["token_embedder"]
    torch.manual_seed(seed)
    model = Model(
        config,
        EmbeddingLayer(embedder["word_dim"], word_ids, fix_emb=False),
        EmbeddingLayer(embedder["char_dim"], char_ids, fix_emb=False),
        use_cuda=False,
    )
    folder.mkdir()
    torch.save(model.token_embedder.state_dict(), folder / "token_embedder.pkl")
    torch.save(model.encoder.state_dict(), folder / "encoder.pkl")
    for name, ids in (("word.dic", word_ids), ("char.dic", char_ids)):
        (folder / name).write_text("".join(f"{k}\t{i}\n" for k, i in ids.items()), encoding="utf-8")
    (folder / EFML_CONFIG).write_text(config_text)
    (folder / "config.json").write_text(json.dumps({"config_path": EFML_CONFIG}) + "\n")


def run_elmoformanylangs(
    args: argparse.Namespace, sentences: list[list[str]], pauser: Pauser, tmp: Path
) -> dict[str, Any]:
    from importlib.metadata import version

    logging.getLogger("elmoformanylangs").setLevel(logging.WARNING)
    from elmoformanylangs import Embedder as EFMLEmbedder

    folder = tmp / "efml-original"
    efml_folder(folder, sentences, args.seed)
    random.seed(args.seed)  # sents2elmo shuffles its batches with `random`
    size = args.batch_size
    peer = EFMLEmbedder(str(folder), batch_size=size)
    try:
        bilm = elmokit.BiLM.from_pretrained(folder)
        same_model = True
        model = (
            f"random weights, ELMoForManyLangs {EFML_CONFIG} (built with its classes); "
            "elmokit loads the same folder"
        )
    except (ValueError, OSError) as err:  # elmokit cannot load this folder
        print(
            f"  elmokit cannot load ELMoForManyLangs folders ({str(err).replace(str(tmp), 'TMP')}): "
            "elmokit runs its own 'original' preset"
        )
        torch.manual_seed(args.seed)
        bilm, same_model = elmokit.BiLM(preset("original")).eval(), False
        model = (
            f"random weights: ELMoForManyLangs {EFML_CONFIG} for the peer, elmokit's preset 'original' "
            "(2x4096_512, 2 highway) for elmokit: the same LSTM, not the same model"
        )
    difference = None
    if same_model:
        difference = same_model_check(
            peer.sents2elmo([sentences[0]], output_layer=-2)[0],  # first call: zero states
            elmokit.Embedder(bilm, mode="zero").embed_sentence(sentences[0]),
        )
        print(
            "  same model: first sentence from zero states, "
            f"max |ELMoForManyLangs - elmokit| = {difference:.2g}"
        )
    peers: dict[str, tuple[Embed, str]] = {
        "batch": (
            lambda ss: peer.sents2elmo(ss, output_layer=-2),
            f"Embedder(folder, batch_size={size}).sents2elmo(sentences, output_layer=-2)",
        ),
        "sentence": (
            lambda ss: [peer.sents2elmo([s], output_layer=-2) for s in ss],
            "Embedder.sents2elmo([sentence], output_layer=-2), one sentence per call",
        ),
    }
    results = run_cases(peers, bilm, sentences, args, pauser)
    return {
        "peer": "elmoformanylangs",
        "peer_version": version("elmoformanylangs"),
        "model": model,
        "same_model": same_model,
        "first_sentence_max_abs_diff": difference,
        "comparisons": results,
    }


ELMOKIT_CALLS = {
    "batch": "Embedder(model, batch_size={size}).embed_sentences(sentences)",
    "sentence": "Embedder.embed_sentence(sentence), one sentence per call",
    "batch-int8": "Embedder(int8 form, batch_size={size}).embed_sentences(sentences), int8 matmuls",
    "sentence-int8": "Embedder(int8 form).embed_sentence(sentence), one sentence per call, int8 matmuls",
    "batch-onnxruntime": "Embedder(backend='onnxruntime', batch_size={size}).embed_sentences(sentences)",
    "sentence-onnxruntime": "Embedder(backend='onnxruntime').embed_sentence(sentence), one sentence per call",
}
CACHES = ("cold", "warm")


def unavailable(peer: str, args: argparse.Namespace) -> str | None:
    """Why ``peer`` cannot run here and how to make it available, or None when it can."""
    if peer == "allennlp":
        if args.allennlp_wheel is None:
            return (
                "AllenNLP 0.9: give --allennlp-wheel PATH, the wheel from "
                "`pip download allennlp==0.9.0 --no-deps -d DIR` (it cannot be installed on this Python)"
            )
        return None
    if peer == "elmoformanylangs":
        if importlib.util.find_spec("elmoformanylangs") is None:
            return (
                "ELMoForManyLangs is not importable by this python: run this script with a venv that "
                "has torch 2.13.0, elmoformanylangs==0.0.4.post2 (--no-deps), overrides==3.1.0, h5py and "
                "elmokit (pip install -e .): PEER_VENV/bin/python benchmarks/bench_peers.py --peer "
                "elmoformanylangs ..."
            )
        return None
    return (
        "bilm-tf is compared in training: python benchmarks/bench_train_peer.py --bilm-tf PATH "
        "(with TensorFlow installed)"
    )


RUNNERS = {"allennlp": run_allennlp, "elmoformanylangs": run_elmoformanylangs}


# -- command line --------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sentences", required=True, help="text file, one whitespace-tokenized sentence a line")
    p.add_argument("--peer", default="all", help=f"comma list of: {', '.join(PEERS)}; or all (default)")
    p.add_argument(
        "--cases",
        default="batch,sentence",
        help=f"comma list of: {', '.join(CASES)} (default batch,sentence)",
    )
    p.add_argument(
        "--cache",
        default="cold,warm",
        help="comma list of elmokit's rounds: cold (token cache emptied before each round), warm (the "
        "cache as the previous pass over the same sentences left it); default cold,warm",
    )
    p.add_argument("--allennlp-wheel", type=Path, help="allennlp-0.9.0-py3-none-any.whl (pip download)")
    p.add_argument("--n-sentences", type=int, default=256, help="the first N sentences of FILE (default 256)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5, help="at most this many peer/elmokit pairs (default 5)")
    p.add_argument(
        "--time-budget",
        type=float,
        default=120.0,
        help="start no further pair after T s of a case, once 2 pairs are done (default 120)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=1.0,
        help="before each group of rounds wait until other processes (but --pause-pid) use at most this "
        "share of the CPUs (e.g. 0.1; default 1 = do not wait)",
    )
    p.add_argument("--wait-timeout", type=float, default=60.0, help="wait at most T s (default 60)")
    p.add_argument("--pause-pid", type=int, help="SIGSTOP this process during each round (SIGCONT after)")
    p.add_argument("--json", help="also write the results as JSON to this file")
    args = p.parse_args(argv)
    peers = PEERS if args.peer == "all" else tuple(s.strip() for s in args.peer.split(",") if s.strip())
    cases = tuple(s.strip() for s in args.cases.split(",") if s.strip())
    caches = tuple(dict.fromkeys(s.strip() for s in args.cache.split(",") if s.strip()))
    if not peers or set(peers) - set(PEERS):
        p.error(f"--peer: expected a comma list of {', '.join(PEERS)} or all, got {args.peer!r}")
    if not cases or set(cases) - set(CASES):
        p.error(f"--cases: expected a comma list of {', '.join(CASES)}, got {args.cases!r}")
    if not caches or set(caches) - set(CACHES):
        p.error(f"--cache: expected a comma list of {', '.join(CACHES)}, got {args.cache!r}")
    if args.allennlp_wheel is not None and not args.allennlp_wheel.is_file():
        p.error(f"--allennlp-wheel: no file {args.allennlp_wheel}")
    if not Path(args.sentences).is_file():
        p.error(f"--sentences: no file {args.sentences}")
    if args.n_sentences < 1 or args.batch_size < 1 or args.rounds < 1 or args.threads < 1:
        p.error("--n-sentences, --batch-size, --rounds and --threads must be at least 1")
    args.peers, args.cases, args.caches = peers, cases, caches
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = shown_command("bench_peers.py", sys.argv[1:] if argv is None else argv)
    print(f"command: {command}", flush=True)
    torch.set_num_threads(args.threads)
    sentences = read_sentences(args.sentences, args.n_sentences)
    tokens = sum(len(s) for s in sentences)
    print(f"{len(sentences)} sentences, {tokens} tokens from {Path(args.sentences).name}", flush=True)
    pauser = Pauser(args.pause_pid)
    rate, matmul_others = matmul_rate(args.threads, pauser)
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, {args.threads} threads; fp32 "
        f"matmul (64x512)@(512x16384): {rate:.1f} GFLOP/s (other processes used {matmul_others:.0%} "
        "of the CPUs)",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench_peers.") as tmp:
        for peer in args.peers:
            reason = unavailable(peer, args)
            if reason is not None:
                print(f"{peer}: skipped: {reason}", flush=True)
                skipped[peer] = reason
                continue
            print(f"{peer}:", flush=True)
            results.append(RUNNERS[peer](args, sentences, pauser, Path(tmp)))

    if results:
        header = (
            f"{'peer':<17} {'case':<20} {'elmokit':<7} {'peer tok/s':>10} {'elmokit tok/s':>13} "
            f"{'cached':>6} {'ratio':>6} {'pairs':>11} {'rounds':>6}"
        )
        print("\n" + header + "\n" + "-" * len(header))
        for result in results:
            for c in result["comparisons"]:
                for cache, ours in c["elmokit"].items():
                    pairs = ours["pair_ratios"]
                    print(
                        f"{result['peer']:<17} {c['case']:<20} {cache:<7} "
                        f"{c['peer_median_tokens_per_s']:>10.0f} {ours['median_tokens_per_s']:>13.0f} "
                        f"{ours['cached_share']:>6.0%} {ours['ratio']:>5.2f}x "
                        f"{min(pairs):>5.2f}-{max(pairs):.2f} {len(pairs):>6}"
                    )
        print(
            "(medians over rounds; ratio = elmokit / peer; pairs = range of the per-pair ratios; "
            "elmokit cold: its token cache emptied before each round, warm: as the previous pass over "
            "the same sentences left it, none: a backend without one; cached = share of the distinct "
            f"tokens looked up that the cache held; fp32, {args.threads} threads, batch {args.batch_size})"
        )
    print(pauser.summary())
    if args.json:
        write_report(
            args.json, command, pauser, rate, matmul_others,
            python=platform.python_version(), torch=torch.__version__, threads=args.threads,
            batch_size=args.batch_size, caches=list(args.caches), sentences_file=Path(args.sentences).name,
            sentences=len(sentences), tokens=tokens, skipped=skipped, results=results,
        )  # fmt: skip


if __name__ == "__main__":
    main()
