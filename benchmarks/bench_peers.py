"""elmokit against other ELMo implementations, in one process, interleaved, on the same sentences.

    python benchmarks/bench_peers.py --sentences FILE --allennlp-wheel WHEEL [--peer allennlp]
    PEER_VENV/bin/python benchmarks/bench_peers.py --sentences FILE --peer elmoformanylangs
        [--cases batch,sentence] [--n-sentences 256] [--batch-size 64] [--rounds 5]
        [--time-budget T] [--threads 2] [--pause-pid PID] [--json OUT]

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
state), all layers, as numpy arrays like the peers' outputs. Each elmokit round uses a fresh
``Embedder``, so its token cache starts empty every round (it still reuses encodings within a
round). The peers run as their users call them: stateful (states carried between calls), and
ELMoForManyLangs with autograd on, as its ``Embedder`` does.

Before timing, each side embeds the first sentence from zero states and the script prints the
largest difference between the two (the same model gives about 1e-6), then warms up both on the
first batch (8 sentences for "sentence"). Then rounds alternate: peer, elmokit, peer, elmokit,
..., each round the whole list of sentences, until ``--rounds`` pairs or, after at least 2 pairs,
``--time-budget`` seconds per case (a round always runs to its end). Tokens are real tokens
only. "others" is the share of all CPUs that other processes used during a round. The ratio is
median elmokit tokens/s over median peer tokens/s; "pairs" gives the range of the per-pair ratios.
``--pause-pid PID`` stops that process (e.g. a training job on the same cores) during each round
and resumes it right after.

On cores that other processes keep busy use ``--threads 1``: with 2 threads on 2 busy cores each
parallel op waits until both threads run, and both sides ran 10-60x slower (batch 1 worst), so
such figures measure the scheduler. Batched peers run their char CNN on every padded position, so
their tokens/s (and the ratio) depend on how long the longest sentences of a batch are: compare
runs on the same ``--n-sentences``.
"""

from __future__ import annotations

import argparse
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
from common import Pauser, cpu_sample, matmul_rate, others_busy, shown_command, write_report

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
def interleave(
    case: str, peer: Embed, ours: Embed, sentences: list[list[str]], args: argparse.Namespace, pauser: Pauser
) -> dict[str, Any]:
    """Warm both up, then time rounds peer, elmokit, peer, ... over all ``sentences``."""
    warm = sentences[: args.batch_size if case == "batch" else 8]
    peer(warm)
    ours(warm)
    tokens = sum(len(s) for s in sentences)
    rounds: list[dict[str, Any]] = []
    start = time.perf_counter()
    for pair in range(args.rounds):
        for side, embed in (("peer", peer), ("elmokit", ours)):
            with pauser:
                before = cpu_sample()
                began = time.perf_counter()
                embed(sentences)
                seconds = time.perf_counter() - began
                busy = others_busy(before, cpu_sample())
            rounds.append(
                {
                    "pair": pair,
                    "side": side,
                    "seconds": seconds,
                    "tokens_per_s": tokens / seconds,
                    "others_cpu_busy": busy,
                }
            )
            print(
                f"    {case} round {pair + 1} {side:<7}: {tokens / seconds:7.0f} tokens/s "
                f"({seconds:.1f} s, others {busy:.0%})",
                flush=True,
            )
        if pair + 1 >= MIN_PAIRS and time.perf_counter() - start > args.time_budget:
            break
    rates = {side: [r["tokens_per_s"] for r in rounds if r["side"] == side] for side in ("peer", "elmokit")}
    pairs = [ours_rate / peer_rate for peer_rate, ours_rate in zip(rates["peer"], rates["elmokit"])]
    peer_median, ours_median = median(rates["peer"]), median(rates["elmokit"])
    return {
        "case": case,
        "sentences": len(sentences),
        "tokens": tokens,
        "rounds": rounds,
        "peer_median_tokens_per_s": peer_median,
        "elmokit_median_tokens_per_s": ours_median,
        "ratio": ours_median / peer_median,
        "pair_ratios": pairs,
    }


def same_model_check(peer_first: np.ndarray, ours_first: np.ndarray) -> float:
    """Largest absolute difference of the first sentence's vectors (num_layers, n_tokens, dim)."""
    if peer_first.shape != ours_first.shape:
        raise SystemExit(f"the peer gave shape {peer_first.shape}, elmokit {ours_first.shape}")
    return float(np.abs(peer_first - ours_first).max())


def elmokit_side(bilm: elmokit.BiLM, case: str, batch_size: int) -> Embed:
    """elmokit's call for a case; a fresh Embedder (empty token cache) for every round. The
    "-int8" cases run the int8 form (``elmokit.model.int8``), made once, its token cache emptied at the
    start of every round; the "-onnxruntime" cases one Embedder of backend onnxruntime (the model
    exported once; that backend keeps no token cache)."""
    if case.endswith("-onnxruntime"):
        embedder = elmokit.Embedder(bilm, batch_size=batch_size, backend="onnxruntime")
        if case == "batch-onnxruntime":
            return lambda sentences: list(embedder.embed_sentences(sentences))
        return lambda sentences: [embedder.embed_sentence(s) for s in sentences]
    if case.endswith("-int8"):
        from elmokit.model.int8 import quantize_bilm

        bilm = quantize_bilm(bilm)
        fresh = elmokit_side(bilm, case.removesuffix("-int8"), batch_size)

        def int8(sentences: list[list[str]]) -> object:
            bilm.token_encoder.clear_cache()
            return fresh(sentences)

        return int8
    if case == "batch":
        return lambda sentences: list(
            elmokit.Embedder(bilm, batch_size=batch_size).embed_sentences(sentences)
        )

    def one_at_a_time(sentences: list[list[str]]) -> list[np.ndarray]:
        embedder = elmokit.Embedder(bilm, batch_size=batch_size)
        return [embedder.embed_sentence(s) for s in sentences]

    return one_at_a_time


def run_cases(peers: dict[str, tuple[Embed, str]], bilm: elmokit.BiLM, sentences, args, pauser) -> list[dict]:
    """Each of ``args.cases`` measured interleaved: the peer's call against elmokit's on the same
    sentences; one result per case with both calls named."""
    results = []
    for case in args.cases:
        embed, what = peers[case.split("-")[0]]
        result = interleave(case, embed, elmokit_side(bilm, case, args.batch_size), sentences, args, pauser)
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
    "batch": "Embedder(model, batch_size={size}).embed_sentences(sentences), a fresh Embedder each round",
    "sentence": "Embedder.embed_sentence(sentence), one sentence per call, a fresh Embedder each round",
    "batch-int8": "Embedder(int8 form, batch_size={size}).embed_sentences(sentences), int8 matmuls",
    "sentence-int8": "Embedder(int8 form).embed_sentence(sentence), one sentence per call, int8 matmuls",
    "batch-onnxruntime": "Embedder(backend='onnxruntime', batch_size={size}).embed_sentences(sentences)",
    "sentence-onnxruntime": "Embedder(backend='onnxruntime').embed_sentence(sentence), one sentence per call",
}


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
    p.add_argument("--pause-pid", type=int, help="SIGSTOP this process during each round (SIGCONT after)")
    p.add_argument("--json", help="also write the results as JSON to this file")
    args = p.parse_args(argv)
    peers = PEERS if args.peer == "all" else tuple(s.strip() for s in args.peer.split(",") if s.strip())
    cases = tuple(s.strip() for s in args.cases.split(",") if s.strip())
    if not peers or set(peers) - set(PEERS):
        p.error(f"--peer: expected a comma list of {', '.join(PEERS)} or all, got {args.peer!r}")
    if not cases or set(cases) - set(CASES):
        p.error(f"--cases: expected a comma list of {', '.join(CASES)}, got {args.cases!r}")
    if args.allennlp_wheel is not None and not args.allennlp_wheel.is_file():
        p.error(f"--allennlp-wheel: no file {args.allennlp_wheel}")
    if not Path(args.sentences).is_file():
        p.error(f"--sentences: no file {args.sentences}")
    if args.n_sentences < 1 or args.batch_size < 1 or args.rounds < 1 or args.threads < 1:
        p.error("--n-sentences, --batch-size, --rounds and --threads must be at least 1")
    args.peers, args.cases = peers, cases
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
            f"{'peer':<17} {'case':<9} {'peer tok/s':>10} {'elmokit tok/s':>13} {'ratio':>6} "
            f"{'pairs':>11} {'rounds':>6}"
        )
        print("\n" + header + "\n" + "-" * len(header))
        for result in results:
            for c in result["comparisons"]:
                print(
                    f"{result['peer']:<17} {c['case']:<9} {c['peer_median_tokens_per_s']:>10.0f} "
                    f"{c['elmokit_median_tokens_per_s']:>13.0f} {c['ratio']:>5.2f}x "
                    f"{min(c['pair_ratios']):>5.2f}-{max(c['pair_ratios']):.2f} {len(c['pair_ratios']):>6}"
                )
        print(
            f"(medians over rounds; ratio = elmokit / peer; pairs = range of the per-pair ratios; "
            f"fp32, {args.threads} threads, batch {args.batch_size})"
        )
    print(pauser.summary())
    if args.json:
        write_report(
            args.json, command, pauser, rate, matmul_others,
            python=platform.python_version(), torch=torch.__version__, threads=args.threads,
            batch_size=args.batch_size, sentences_file=Path(args.sentences).name,
            sentences=len(sentences), tokens=tokens, skipped=skipped, results=results,
        )  # fmt: skip


if __name__ == "__main__":
    main()
