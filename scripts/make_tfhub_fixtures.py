"""Build the TF-Hub fixture modules of tests/fixtures/tfhub and TensorFlow's outputs for them.

Runs in its own environment, never in elmokit's: Python 3.11 with tensorflow-cpu 2.15,
tensorflow-hub 0.15.0 (0.16 dropped the TF1 module API) and h5py, plus a checkout of
allenai/bilm-tf (its ``bilm`` package, TF1 code, run through ``tf.compat.v1``).
The tests do not need it; they read what it wrote.

    python scripts/make_tfhub_fixtures.py --bilm-tf BILM_TF_CHECKOUT --out tests/fixtures/tfhub

It writes
- ``module/``: a TF-Hub module (hub.create_module_spec + Module.export) built from bilm-tf's
  graph (``BidirectionalLanguageModel``) and the weights of elmokit's shipped
  ``elmo-tiny-reference``, with google/elmo's signatures: ``default`` (a 1-D string tensor, each
  sentence split at spaces, padded with '') and ``tokens`` (``tokens`` 2-D strings +
  ``sequence_len``), each giving word_emb, lstm_outputs1, lstm_outputs2, elmo (the weighted sum
  with the module's ``aggregation/weights`` softmax-normalised, times ``aggregation/scaling``)
  and default (the mean of elmo over each sentence's tokens). Each signature is its own
  application of bilm-tf's graph, so each keeps its own LSTM states in variables;
- ``module-lstmcell/``: the same module whose checkpoint names the LSTM variables as TF 1.0/1.1
  did (``LSTMCell/W_0``, ``B``, ``W_P_0``), re-saved by tf.compat.v1.train.Saver (a checkpoint
  only: TensorFlow cannot run its graph, whose variables keep the ``lstm_cell/kernel`` names);
- ``checkpoint.npz`` / ``checkpoint-lstmcell.npz``: every variable as tf.train.load_checkpoint
  reads it, and its dtype and shape;
- ``outputs.npz``: the inputs and TensorFlow's five outputs of two consecutive calls of each
  signature (``default`` then ``tokens``) in one session.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

# TensorFlow is imported by main() (after --help), so this script's help needs no TensorFlow
tf: Any = None
tf1: Any = None
hub: Any = None

MAX_BATCH = 8  # bilm-tf's max_batch_size: rows of the LSTM state variables
AGG_WEIGHTS = np.array([0.4, -0.7, 1.2], dtype=np.float32)
AGG_SCALING = np.float32(1.7)
BOW, EOW, PAD, BOS, EOS = 258, 259, 260, 256, 257

DEFAULT_CALLS = [
    [
        "the cat sat on the mat",
        "dogs   bark",
        "a supercalifragilisticexpialidocious-and-longer-than-fifty-bytes word",
    ],
    ["héllo wörld again", "mat"],
]
TOKENS_CALLS = [
    (
        [
            ["the", "cat", "is", "on", "the", "mat"],
            ["dogs", "are", "in", "fog", "IGNORED", "x"],
            ["one", "", "", "", "", ""],
        ],
        [6, 4, 1],
    ),
    (
        [
            ["the", "cat", "is", "on", "the", "mat"],
            ["dogs", "are", "in", "fog", "IGNORED", "x"],
            ["one", "", "", "", "", ""],
        ],
        [6, 4, 1],
    ),
]


def char_ids(tokens: tf.Tensor, lengths: tf.Tensor, max_chars: int) -> tf.Tensor:
    """bilm-tf's Batcher in graph ops: (batch, T) strings + lengths -> (batch, T + 2, max_chars)
    shifted byte ids with <S> and </S>, rows past a sentence's end all 0."""
    batch, steps = tf.shape(tokens)[0], tf.shape(tokens)[1]
    flat = tf.reshape(tokens, [-1])
    cut = tf.strings.substr(flat, 0, max_chars - 2, unit="BYTE")
    n = tf.strings.length(cut, unit="BYTE")[:, None]
    raw = tf.cast(tf.io.decode_raw(cut, tf.uint8, fixed_length=max_chars - 2), tf.int32)
    at = tf.pad(raw, [[0, 0], [1, 1]])  # position j holds byte j - 1
    j = tf.range(max_chars)[None, :]
    # tf.equal, not ==: under TF1 behaviour == compares tensors by identity
    ids = tf.where(tf.equal(j, 0), BOW, tf.where(j <= n, at, tf.where(tf.equal(j, n + 1), EOW, PAD))) + 1
    ids = tf.reshape(ids, [batch, steps, max_chars])
    valid = tf.cast(tf.range(steps)[None, :] < lengths[:, None], tf.int32)
    ids = tf.pad(ids * valid[:, :, None], [[0, 0], [1, 1], [0, 0]])
    special = np.full((2, max_chars), PAD, dtype=np.int32)
    special[:, 0], special[:, 2] = BOW, EOW
    special[0, 1], special[1, 1] = BOS, EOS
    special = tf.constant(special + 1)
    t = tf.range(steps + 2)[None, :, None]
    ids = tf.where(tf.equal(t, 0), special[0][None, None, :], ids)
    return tf.where(tf.equal(t, lengths[:, None, None] + 1), special[1][None, None, :], ids)


def outputs(model, tokens, lengths, weights, scaling, options) -> dict[str, tf.Tensor]:
    ops = model(char_ids(tokens, lengths, options["char_cnn"]["max_characters_per_token"]))
    lm = ops["lm_embeddings"]  # (batch, 3, T, 2 * projection_dim)
    mask = tf.cast(ops["mask"], tf.float32)[:, :, None]
    mix = tf.nn.softmax(weights)
    elmo = scaling * tf.add_n([mix[k] * lm[:, k] for k in range(3)])
    return {
        "word_emb": lm[:, 0, :, : options["lstm"]["projection_dim"]],
        "lstm_outputs1": lm[:, 1],
        "lstm_outputs2": lm[:, 2],
        "elmo": elmo,
        "default": tf.reduce_sum(elmo * mask, 1) / tf.reduce_sum(mask, 1),
    }


def module_fn_for(options_file: Path, weight_file: Path, bilm):
    options = json.loads(options_file.read_text())

    def module_fn() -> None:
        model = bilm.BidirectionalLanguageModel(str(options_file), str(weight_file), max_batch_size=MAX_BATCH)
        with tf1.variable_scope("aggregation"):
            weights = tf1.get_variable("weights", initializer=tf.constant(AGG_WEIGHTS))
            scaling = tf1.get_variable("scaling", initializer=tf.constant(AGG_SCALING))
        sentences = tf1.placeholder(tf.string, [None])
        split = tf1.string_split(sentences)  # at ' ', empty pieces dropped
        tokens = tf1.sparse_tensor_to_dense(split, default_value="")
        lengths = tf.cast(
            tf.math.bincount(tf.cast(split.indices[:, 0], tf.int32), minlength=tf.shape(sentences)[0]),
            tf.int32,
        )
        hub.add_signature("default", sentences, outputs(model, tokens, lengths, weights, scaling, options))
        tok = tf1.placeholder(tf.string, [None, None])
        seq = tf1.placeholder(tf.int32, [None])
        hub.add_signature(
            "tokens",
            {"tokens": tok, "sequence_len": seq},
            outputs(model, tok, seq, weights, scaling, options),
        )

    return module_fn


def export(module_dir: Path, options_file: Path, weight_file: Path, bilm) -> None:
    spec = hub.create_module_spec(module_fn_for(options_file, weight_file, bilm))
    with tf.Graph().as_default():
        module = hub.Module(spec)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            module.export(str(module_dir), sess)


def run_module(module_dir: Path) -> dict[str, np.ndarray]:
    result: dict[str, np.ndarray] = {}
    with tf.Graph().as_default():
        module = hub.Module(str(module_dir))
        sentences = tf1.placeholder(tf.string, [None])
        tok = tf1.placeholder(tf.string, [None, None])
        seq = tf1.placeholder(tf.int32, [None])
        by_default = module(sentences, signature="default", as_dict=True)
        by_tokens = module({"tokens": tok, "sequence_len": seq}, signature="tokens", as_dict=True)
        with tf1.Session() as sess:
            sess.run([tf1.global_variables_initializer(), tf1.tables_initializer()])
            for k, batch in enumerate(DEFAULT_CALLS):
                for name, value in sess.run(by_default, {sentences: batch}).items():
                    result[f"default/{k}/{name}"] = value
            for k, (tokens, lengths) in enumerate(TOKENS_CALLS):
                for name, value in sess.run(by_tokens, {tok: tokens, seq: lengths}).items():
                    result[f"tokens/{k}/{name}"] = value
    for k, batch in enumerate(DEFAULT_CALLS):
        result[f"default/{k}/input"] = np.array(batch, dtype=object).astype(str)
    for k, (tokens, lengths) in enumerate(TOKENS_CALLS):
        result[f"tokens/{k}/input_tokens"] = np.array(tokens).astype(str)
        result[f"tokens/{k}/input_sequence_len"] = np.array(lengths, dtype=np.int32)
    return result


def save_checkpoint_values(prefix: Path, target: Path) -> None:
    reader = tf.train.load_checkpoint(str(prefix))
    values = {name: reader.get_tensor(name) for name in sorted(reader.get_variable_to_shape_map())}
    np.savez_compressed(
        target, names=np.array(list(values)), **{f"v{i}": v for i, v in enumerate(values.values())}
    )


def rename_lstm(name: str) -> str:
    for new, old in (
        ("rnn/lstm_cell/projection/kernel", "LSTMCell/W_P_0"),
        ("rnn/lstm_cell/kernel", "LSTMCell/W_0"),
        ("rnn/lstm_cell/bias", "LSTMCell/B"),
    ):
        if name.endswith(new):
            return name[: -len(new)] + old
    return name


def write_renamed(source: Path, target: Path) -> None:
    """``target``: ``source`` with the checkpoint re-saved under the LSTMCell names."""
    shutil.copytree(source, target)
    for old in (target / "variables").iterdir():
        old.unlink()
    reader = tf.train.load_checkpoint(str(source / "variables" / "variables"))
    names = sorted(reader.get_variable_to_shape_map())
    with tf.Graph().as_default():
        variables = {rename_lstm(n): tf1.Variable(reader.get_tensor(n), name="v") for n in names}
        saver = tf1.train.Saver(variables, write_version=tf1.train.SaverDef.V2)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            saver.save(sess, str(target / "variables" / "variables"), write_meta_graph=False)
    (target / "variables" / "checkpoint").unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bilm-tf", required=True, type=Path, help="a checkout of allenai/bilm-tf")
    parser.add_argument("--model", type=Path, default=Path("src/elmokit/models/elmo-tiny-reference"))
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/tfhub"))
    args = parser.parse_args()
    global tf, tf1, hub
    import tensorflow as tf  # noqa: PLC0415
    import tensorflow_hub as hub  # noqa: PLC0415

    tf1 = tf.compat.v1
    tf1.disable_v2_behavior()
    sys.path.insert(0, str(args.bilm_tf))
    real_tf = sys.modules["tensorflow"]
    sys.modules["tensorflow"] = tf1  # bilm-tf is TF1 code
    try:
        import bilm  # noqa: PLC0415
    finally:
        sys.modules["tensorflow"] = real_tf
    args.out.mkdir(parents=True, exist_ok=True)
    module_dir, renamed = args.out / "module", args.out / "module-lstmcell"
    for old in (module_dir, renamed):
        if old.exists():
            shutil.rmtree(old)
    export(module_dir, args.model / "options.json", args.model / "weights.hdf5", bilm)
    save_checkpoint_values(module_dir / "variables" / "variables", args.out / "checkpoint.npz")
    write_renamed(module_dir, renamed)
    save_checkpoint_values(renamed / "variables" / "variables", args.out / "checkpoint-lstmcell.npz")
    np.savez_compressed(args.out / "outputs.npz", **run_module(module_dir))


if __name__ == "__main__":
    main()
