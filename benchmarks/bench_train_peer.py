"""Training speed against bilm-tf, in one process, interleaved, on the same text and shapes.

    python benchmarks/bench_train_peer.py --bilm-tf PATH [--train GLOB] [--preset small]
        [--batch-size 32] [--unroll-steps 20] [--n-negative-samples 8192] [--threads 2]
        [--rounds 5] [--steps 8] [--warmup 3] [--pause-pid PID] [--json OUT]

PATH is a folder holding bilm-tf's ``bilm`` package (github.com/allenai/bilm-tf), importable with
the TensorFlow installed beside elmokit. TensorFlow 2 runs it through ``tensorflow.compat.v1``:
``import tensorflow`` inside ``bilm`` is given the compat.v1 module, and v2 behaviour is off.

Both sides get the vocabulary built from ``--train`` (elmokit's ``Vocabulary.build``, a file
bilm-tf reads), the preset's options (bilm-tf's training options say 261 characters, elmokit's
262: one row more in the character embedding), the same batch, unroll and negatives, and their
own data pipeline over the same files. bilm-tf's graph is built the way its ``training.train``
builds it for one device (placed on the CPU): Adagrad (initial
accumulator 1.0, learning rate 0.2), the loss times ``unroll_steps``, its ``average_gradients``
and ``clip_grads``, each step feeding the previous step's final LSTM states as ``train`` does.
elmokit runs ``Trainer.step`` (the same recipe). Each round times ``--steps`` steps of one
then of the other (the first to go alternates); positions/s = batch * unroll / step time (data
time included on both sides). Prints the median ratio over rounds and each round's ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_bilm import median
from bench_train import build_trainer
from common import LM1B_SHARDS, Pauser, cpu_sample, matmul_rate, others_busy, shown_command, write_report


def import_bilm_tf(path: Path) -> tuple[Any, Any, Any]:
    """tf (compat.v1), bilm.training and bilm.data from ``path``."""
    try:
        import tensorflow
    except ImportError:
        raise SystemExit(
            "bench_train_peer: TensorFlow is not installed (pip install tensorflow-cpu)"
        ) from None
    tf = tensorflow.compat.v1 if hasattr(tensorflow, "compat") else tensorflow
    if hasattr(tf, "disable_v2_behavior"):
        tf.disable_v2_behavior()
        sys.modules["tensorflow"] = tf  # ``import tensorflow as tf`` in bilm gets compat.v1
    if not (path / "bilm" / "training.py").is_file():
        raise SystemExit(f"bench_train_peer: {path} has no bilm/training.py (a bilm-tf checkout)")
    sys.path.insert(0, str(path))
    from bilm import data as bilm_data
    from bilm import training as bilm_training

    return tf, bilm_training, bilm_data


def bilm_tf_side(
    tf: Any, training: Any, data: Any, options: dict, vocab_file: str, train_glob: str, threads: int
) -> Callable[[], float]:
    """A function that runs one bilm-tf training step and returns its loss."""
    vocab = data.UnicodeCharsVocabulary(vocab_file, options["char_cnn"]["max_characters_per_token"])
    dataset = data.BidirectionalLMDataset(train_glob, vocab, test=False, shuffle_on_load=True)
    batch_size, unroll = options["batch_size"], options["unroll_steps"]
    batches = dataset.iter_batches(batch_size, unroll)
    graph = tf.Graph()
    with graph.as_default(), tf.device("/cpu:0"):
        global_step = tf.get_variable(
            "global_step", [], initializer=tf.constant_initializer(0), trainable=False
        )
        opt = tf.train.AdagradOptimizer(
            learning_rate=options.get("learning_rate", 0.2), initial_accumulator_value=1.0
        )
        with tf.variable_scope("lm"):
            model = training.LanguageModel(options, True)
            loss = model.total_loss
        grads = opt.compute_gradients(
            loss * unroll, aggregation_method=tf.AggregationMethod.EXPERIMENTAL_TREE
        )
        grads = training.average_gradients([grads], batch_size, options)
        grads, _ = training.clip_grads(grads, options, True, global_step)
        train_op = opt.apply_gradients(grads, global_step=global_step)
        init = tf.global_variables_initializer()
    config = tf.ConfigProto(
        allow_soft_placement=True,
        intra_op_parallelism_threads=threads,
        inter_op_parallelism_threads=threads,
    )
    session = tf.Session(graph=graph, config=config)
    session.run(init)
    init_state_tensors = model.init_lstm_state
    final_state_tensors = model.final_lstm_state
    state = session.run(init_state_tensors, feed_dict=_feed(training, next(batches), model, batch_size))

    def step() -> float:
        nonlocal state
        feed = _feed(training, next(batches), model, batch_size)
        for tensor, value in zip(init_state_tensors, state):
            feed[tensor] = value
        out = session.run([train_op, loss] + final_state_tensors, feed_dict=feed)
        state = out[2:]
        return float(out[1])

    return step


def _feed(training: Any, X: dict, model: Any, batch_size: int) -> dict:
    """bilm-tf's own feed of a batch (character inputs, bidirectional)."""
    return training._get_feed_dict_from_X(X, 0, batch_size, model, True, True)


def elmokit_side(options: dict, vocab_file: str, args: argparse.Namespace) -> Callable[[], float]:
    """A function that runs one elmokit Trainer step (data included) and returns its loss."""
    trainer, data, _ = build_trainer(
        vocab_file, args.train, options, args.batch_size, args.unroll_steps, args.n_negative_samples
    )
    batches = iter(data)

    def step() -> float:
        forward, backward = trainer.step(next(batches))
        return 0.5 * (forward + backward)

    return step


def timed(step: Callable[[], float], n: int) -> tuple[float, float]:
    """Seconds per step over ``n`` steps, and the last loss."""
    start = time.perf_counter()
    for _ in range(n):
        loss = step()
    return (time.perf_counter() - start) / n, loss


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bilm-tf", type=Path, required=True, help="folder holding bilm-tf's bilm package")
    p.add_argument("--train", default=LM1B_SHARDS, help="glob of training text (default: lm1b shards)")
    p.add_argument("--preset", default="small")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--unroll-steps", type=int, default=20)
    p.add_argument("--n-negative-samples", type=int, default=8192)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=8, help="timed steps of each side per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each side first")
    p.add_argument("--pause-pid", type=int, help="SIGSTOP this process during each round (SIGCONT after)")
    p.add_argument("--json", help="also write the results as JSON to this file")
    args = p.parse_args(argv)

    from elmokit.lm.vocabulary import Vocabulary
    from elmokit.model.options import preset
    from elmokit.training.data import corpus_files, count_tokens

    command = shown_command("bench_train_peer.py", sys.argv[1:] if argv is None else argv)
    print(f"command: {command}", flush=True)
    torch.set_num_threads(args.threads)
    pauser = Pauser(args.pause_pid)
    rate, matmul_others = matmul_rate(args.threads, pauser)
    print(
        f"torch {torch.__version__}, {args.threads} threads; fp32 matmul {rate:.1f} GFLOP/s "
        f"(other processes used {matmul_others:.0%} of the CPUs)",
        flush=True,
    )
    tf, training, data = import_bilm_tf(args.bilm_tf)
    options = preset(args.preset)
    files = corpus_files(args.train)
    with tempfile.TemporaryDirectory() as folder:
        vocab_file = str(Path(folder) / "vocab.txt")
        vocabulary = Vocabulary.build(count_tokens(files))
        vocabulary.save(vocab_file)
        n_vocab = len(vocabulary)
        tf_options = json.loads(json.dumps(options))
        tf_options["char_cnn"]["n_characters"] = 261  # bilm-tf trains with 261 character ids
        tf_options.update(
            bidirectional=True,
            dropout=0.1,
            all_clip_norm_val=10.0,
            n_epochs=10,
            n_train_tokens=10**9,
            batch_size=args.batch_size,
            unroll_steps=args.unroll_steps,
            n_tokens_vocab=n_vocab,
            n_negative_samples_batch=args.n_negative_samples,
        )
        sides = {
            "bilm-tf": bilm_tf_side(tf, training, data, tf_options, vocab_file, args.train, args.threads),
            "elmokit": elmokit_side(options, vocab_file, args),
        }
        for step in sides.values():
            timed(step, args.warmup)
        rounds = []
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            figures = {}
            with pauser:
                before = cpu_sample()
                for name in order:
                    figures[name] = timed(sides[name], args.steps)
                others = others_busy(before, cpu_sample())
            positions = args.batch_size * args.unroll_steps
            row = {
                name: {"positions_per_s": positions / s, "ms_per_step": 1000 * s, "loss": loss}
                for name, (s, loss) in figures.items()
            }
            row["ratio"] = row["elmokit"]["positions_per_s"] / row["bilm-tf"]["positions_per_s"]
            row["others_cpu_busy"] = others
            rounds.append(row)
            print(
                f"round {r + 1}: bilm-tf {row['bilm-tf']['positions_per_s']:.0f} positions/s "
                f"(loss {row['bilm-tf']['loss']:.3f}), elmokit {row['elmokit']['positions_per_s']:.0f} "
                f"(loss {row['elmokit']['loss']:.3f}), ratio {row['ratio']:.2f}, others busy {others:.0%}",
                flush=True,
            )
    summary = {
        "preset": args.preset,
        "batch_size": args.batch_size,
        "unroll_steps": args.unroll_steps,
        "negatives": args.n_negative_samples,
        "threads": args.threads,
        "vocab_size": n_vocab,
        "tensorflow": tf.__version__ if hasattr(tf, "__version__") else None,
        "torch": torch.__version__,
        "bilm_tf_positions_per_s": median([r["bilm-tf"]["positions_per_s"] for r in rounds]),
        "elmokit_positions_per_s": median([r["elmokit"]["positions_per_s"] for r in rounds]),
        "ratio_median": median([r["ratio"] for r in rounds]),
        "ratio_range": [min(r["ratio"] for r in rounds), max(r["ratio"] for r in rounds)],
        "rounds": rounds,
    }
    print(
        f"median: bilm-tf {summary['bilm_tf_positions_per_s']:.0f} positions/s, elmokit "
        f"{summary['elmokit_positions_per_s']:.0f}, ratio {summary['ratio_median']:.2f} "
        f"(rounds {summary['ratio_range'][0]:.2f}-{summary['ratio_range'][1]:.2f})"
    )
    if args.json:
        write_report(args.json, command, pauser, rate, matmul_others, **summary)


if __name__ == "__main__":
    main()
