"""ELMo sentence vectors on Spark: ``make_predict_fn`` for ``pyspark.ml.functions.predict_batch_udf``
(the model is loaded once per Python worker of an executor, when the first batch arrives) and
``return_type``, the Spark type of its output. Needs pyspark 3.4+ (``pip install
'elmokit[spark]'``) with elmokit and the model available on the executors.

The recipe::

    from pyspark.ml.functions import predict_batch_udf
    from elmokit.integrations.spark import make_predict_fn, return_type

    vectors = predict_batch_udf(
        make_predict_fn(model="elmo-news-512", layers="top", pooling="mean"),
        return_type=return_type("top"),
        batch_size=512,
    )
    df = spark.read.text("corpus.txt").withColumn("top", vectors("value"))

Spark hands ``predict`` a batch of a string column; each row is a sentence (split on whitespace,
or with ``tokenize`` by the training corpus's tokenizer) and becomes one vector per chosen layer,
the mean or max over its tokens: an ``array<float>`` column, or with ``layers="all"`` a struct
of ``layer_0`` ... as in elmokit's Parquet files. In warm and zero mode a sentence's vector does
not depend on its batch, so it equals the one-process Embedder's however Spark partitions the rows.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..embed.embedder import Embedder
from ..embed.vectors_file import check_layers, output_array

__all__ = ["make_predict_fn", "return_type"]

EXTRA_HINT = "pip install 'elmokit[spark]'"
_log = logging.getLogger(__name__)

PredictFn = Callable[[np.ndarray], "np.ndarray | dict[str, np.ndarray]"]


def _require_pyspark() -> Any:
    try:
        import pyspark.sql.types as types
    except ImportError:
        raise ImportError(f"elmokit's Spark recipe needs the package pyspark: {EXTRA_HINT}") from None
    return types


def return_type(layers: str = "top", model: str | os.PathLike | None = None) -> Any:
    """The Spark type of ``make_predict_fn(layers=...)``'s output: ``array<float>`` for "top" and
    "average", for "all" a struct of one ``array<float>`` per model layer (``layer_0`` ...; the
    number of layers is read from ``model``, loaded once here)."""
    types = _require_pyspark()
    check_layers(layers, "mean")
    vector = types.ArrayType(types.FloatType(), containsNull=False)
    if layers != "all":
        return vector
    num_layers = Embedder(model, device="cpu").bilm.num_layers
    return types.StructType([types.StructField(f"layer_{k}", vector) for k in range(num_layers)])


class _MakePredictFn:
    """The zero-argument function predict_batch_udf calls on an executor: it loads the model
    (once per Python worker: Spark caches what it returns) and returns ``predict``."""

    def __init__(
        self, options: dict[str, Any], layers: str, pooling: str, tokenize: bool, threads: int | None
    ) -> None:
        self.options, self.layers, self.pooling = options, layers, pooling
        self.tokenize, self.threads = tokenize, threads

    def __call__(self) -> PredictFn:
        import torch

        from ..base.textfiles import line_splitter

        threads = self.threads if self.threads is not None else _task_cpus()
        if threads is not None:
            torch.set_num_threads(max(1, threads))
        embedder = Embedder(**self.options)
        split = line_splitter(self.tokenize, warn=False)
        layers, pooling = self.layers, self.pooling
        names = [f"layer_{k}" for k in range(embedder.bilm.num_layers)]
        _log.info("elmokit %s loaded on a Spark worker (%s threads)", embedder.model_name, threads)

        def predict(texts: np.ndarray) -> np.ndarray | dict[str, np.ndarray]:
            """(batch,) strings -> (batch, dim) float32, or for layers "all" {layer_k: (batch, dim)}."""
            if any(t is None for t in texts):
                raise ValueError("a row holds no text (null): filter it out first (df.where(c.isNotNull()))")
            tokens = [split(str(t)) for t in texts]
            rows = [output_array(a, layers, pooling) for a in embedder.embed_sentences(tokens)]
            empty = (0, len(names), embedder.dim) if layers == "all" else (0, embedder.dim)
            stacked = np.stack(rows).astype(np.float32, copy=False) if rows else np.zeros(empty, np.float32)
            if layers != "all":
                return stacked
            return {name: stacked[:, k] for k, name in enumerate(names)}

        return predict


def _task_cpus() -> int | None:
    """The CPUs of the Spark task this runs in (``spark.task.cpus``), if it runs in one."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        return None if context is None else max(1, int(context.cpus()))
    except Exception:  # noqa: BLE001 (not in a Spark task)
        return None


def make_predict_fn(
    model: str | os.PathLike | None = None,
    layers: str = "top",
    pooling: str = "mean",
    mode: str | None = None,
    dtype: str = "float32",
    device: str | None = None,
    batch_size: int = 64,
    tokenize: bool = False,
    threads: int | None = None,
) -> Callable[[], PredictFn]:
    """The ``make_predict_fn`` of ``predict_batch_udf``: sentences (a string column) -> their
    vectors, pooled over the tokens (``pooling`` "mean" or "max"; a sentence without tokens
    gives NaN) for the ``layers`` "top", "average" or "all" (give ``return_type(layers)`` as the
    UDF's return type). ``model``, ``mode``, ``dtype``, ``device`` and ``batch_size`` are the
    Embedder's; ``threads`` sets torch's threads on the worker (default: ``spark.task.cpus``).
    Stateful mode carries states between batches and is refused. Per-token vectors do not fit
    predict_batch_udf's flat arrays: write them with ``elmokit embed OUT.parquet`` and read
    that file with ``spark.read.parquet``."""
    if pooling is None:
        raise ValueError(
            "predict_batch_udf returns flat arrays: give pooling 'mean' or 'max' (per-token vectors: "
            "write a Parquet file with `elmokit embed` and read it with spark.read.parquet)"
        )
    check_layers(layers, pooling)
    if mode == "stateful":
        raise ValueError("stateful mode carries states from batch to batch; Spark runs warm or zero mode")
    options = {
        "model": None if model is None else os.fspath(model),
        "batch_size": batch_size,
        "device": device,
        "mode": mode,
        "dtype": dtype,
    }
    return _MakePredictFn(options, layers, pooling, tokenize, threads)
