"""elmokit on Spark (elmokit.integrations.spark: make_predict_fn for predict_batch_udf) in Spark's
local mode (local[2]: two Python workers), and docs/spark.md run as a reader runs it. The sentence
vectors equal the one-process Embedder's (warm and zero mode do not depend on the batch; to float
rounding) whatever the partitions and batches. Needs pyspark and a Java runtime (`java` on PATH):
not in `make test` (pyspark is not in the lock), run by `make test-engines`."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from elmokit.embed.embedder import Embedder

pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime (java on PATH)", allow_module_level=True)

from pyspark.ml.functions import predict_batch_udf  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from elmokit.integrations.spark import make_predict_fn, return_type  # noqa: E402

MODEL = "elmo-tiny-reference"
SRC = Path(__import__("elmokit").__file__).resolve().parents[1]
DOCS = Path(__file__).resolve().parents[2] / "docs"
WORDS = "the cat sat on a mat dog ran far away hello world , .".split()


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """One local[2] session for the module; its workers run this Python and this elmokit. It
    starts in a folder of its own: Spark resolves relative paths against the folder it started in."""
    given = os.environ.get("PYTHONPATH", "").split(os.pathsep)  # absolute: the session starts elsewhere
    paths = os.pathsep.join([str(SRC), *(os.path.abspath(p) for p in given if p)])
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYSPARK_PYTHON", sys.executable)
        env.setenv("PYTHONPATH", paths)
        env.setenv("OMP_NUM_THREADS", "1")
        env.setenv("ELMOKIT_OFFLINE", "1")
        env.setenv("ELMOKIT_CACHE", str(tmp_path_factory.mktemp("spark-cache")))
        env.chdir(tmp_path_factory.mktemp("spark-home"))
        session = (
            SparkSession.builder.master("local[2]")
            .appName("elmokit-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield session
        finally:
            session.stop()


def sentences(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(0, 14)))) for _ in range(count)]


def by_id(spark, texts: list[str], udf, partitions: int = 3) -> list:
    df = spark.createDataFrame(list(enumerate(texts)), "id long, text string").repartition(partitions)
    return [row["v"] for row in df.withColumn("v", udf("text")).orderBy("id").collect()]


def reference(texts: list[str], pooling: str, mode: str | None = None) -> list[np.ndarray]:
    embedder = Embedder(MODEL, device="cpu", mode=mode)  # warm: the model has no start state, as zero
    return list(embedder.embed_sentences([t.split() for t in texts], pooling=pooling))


def test_mean_of_the_top_layer_in_two_workers_equals_the_embedder(spark):
    texts = sentences(60)
    assert "" in texts  # an empty line gives NaN, as in one process
    udf = predict_batch_udf(
        make_predict_fn(model=MODEL, layers="top", pooling="mean", batch_size=4),
        return_type=return_type("top"),
        batch_size=7,
    )
    got = by_id(spark, texts, udf)
    expected = reference(texts, "mean")
    assert len(got) == len(expected) == 60
    for text, vector, want in zip(texts, got, expected):
        assert len(vector) == want.shape[-1] == 32
        np.testing.assert_allclose(np.asarray(vector, np.float32), want[-1], rtol=0, atol=1e-5, err_msg=text)
        assert np.isnan(vector).all() == (text == "")


def test_every_layer_as_a_struct_with_max_pooling_in_zero_mode(spark):
    texts = sentences(25, seed=1)
    assert return_type("all", model=MODEL).fieldNames() == ["layer_0", "layer_1", "layer_2"]
    udf = predict_batch_udf(
        make_predict_fn(model=MODEL, layers="all", pooling="max", mode="zero"),
        return_type=return_type("all", model=MODEL),
        batch_size=10,
    )
    got = by_id(spark, texts, udf, partitions=2)
    expected = list(Embedder(MODEL, device="cpu", mode="zero").embed_sentences([t.split() for t in texts], "max"))
    for text, row, want in zip(texts, got, expected):
        for k in range(3):
            np.testing.assert_allclose(np.asarray(row[f"layer_{k}"], np.float32), want[k], atol=1e-5, err_msg=text)


def test_the_predict_function_and_its_refusals():
    predict = make_predict_fn(model=MODEL, layers="average", pooling="mean", mode="zero", threads=1)()
    texts = np.array(["the cat sat", "hello world ."], dtype=object)
    out = predict(texts)
    expected = Embedder(MODEL, device="cpu", mode="zero").embed_sentences([t.split() for t in texts], "mean")
    assert out.shape == (2, 32) and out.dtype == np.float32
    np.testing.assert_allclose(out, np.stack([e.mean(axis=0) for e in expected]), atol=1e-6)
    assert predict(np.array([], dtype=object)).shape == (0, 32)
    with pytest.raises(ValueError, match="a row holds no text"):
        predict(np.array(["the cat", None], dtype=object))
    with pytest.raises(ValueError, match="give pooling 'mean' or 'max'"):
        make_predict_fn(model=MODEL, pooling=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stateful mode carries states"):
        make_predict_fn(model=MODEL, mode="stateful")
    with pytest.raises(ValueError, match="layers must be one of"):
        make_predict_fn(model=MODEL, layers="bottom")
    assert return_type("top").simpleString() == "array<float>"


def test_the_docs_page_runs_and_gives_the_embedders_vectors(spark, monkeypatch):
    spec = importlib.util.spec_from_file_location("docs_runner", Path(__file__).parents[1] / "test_docs.py")
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)  # how tests/test_docs.py runs a page: every block, in order
    home = Path(spark.sparkContext._jvm.java.lang.System.getProperty("user.dir"))
    assert not any(home.iterdir())
    monkeypatch.chdir(home)  # where the session started, as for a reader's script
    runner._run_page(DOCS / "spark.md")  # the page's getOrCreate() finds this module's session
    table = pq.read_table(home / "corpus-vectors")
    assert table.num_rows == 200
    got = dict(zip(table["value"].to_pylist(), table["top"].to_pylist()))
    lines = (home / "corpus.txt").read_text().splitlines()
    assert sorted(got) == sorted(lines)
    expected = Embedder("elmo-news-512", device="cpu").embed_sentences([t.split() for t in lines], "mean")
    for line, want in zip(lines, expected):
        np.testing.assert_allclose(np.asarray(got[line], np.float32), want[-1], rtol=0, atol=1e-5, err_msg=line)
    assert sorted(p.name for p in home.iterdir()) == ["corpus-vectors", "corpus.parquet", "corpus.txt"]
