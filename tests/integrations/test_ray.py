"""elmokit on Ray Data (elmokit.integrations.ray, `elmokit embed --engine ray`) on real local
clusters started here: a two-node cluster on 127.0.0.1 (`ray start --head` and a second `ray
start --address`, stopped at the end), and one `ray.init(num_cpus=2)`. The vectors equal the
one-process Embedder's over all rows (warm mode does not depend on the batch; to float
rounding, as the actors run on one thread in other batches), also when an actor is killed
mid-run and Ray restarts it. Not in `make test` (ray is not in the lock): `make test-engines`."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from elmokit.cli import main
from elmokit.embed.embedder import Embedder

ray = pytest.importorskip("ray")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from elmokit.integrations.ray import EmbedBatches, embed_file  # noqa: E402

MODEL = "elmo-tiny-reference"
SRC = Path(__import__("elmokit").__file__).resolve().parents[1]
WORDS = "the cat sat on a mat dog ran far away hello world , .".split()
VECTORS = ["layer_0", "layer_1", "layer_2"]


def corpus(path: Path, lines: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    text = [" ".join(rng.choice(WORDS, size=int(rng.integers(0, 14)))) for _ in range(lines)]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def one_process(source: Path, out: Path, **options) -> Path:
    with pytest.warns(UserWarning, match="no start state"):
        embedder = Embedder(MODEL, device="cpu", mode="warm", batch_size=16)
    embedder.embed_file(source, out, progress=False, **options)
    return out


def assert_same_rows(ours: Path, reference: Path, columns=VECTORS) -> None:
    a, b = pq.read_table(ours), pq.read_table(reference)
    assert a.schema == b.schema and a.schema.metadata == b.schema.metadata
    assert a["index"].to_pylist() == b["index"].to_pylist() == list(range(b.num_rows))
    assert a["tokens"].to_pylist() == b["tokens"].to_pylist()
    for name in columns:
        x, y = _floats(a[name]), _floats(b[name])
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5, err_msg=name)


def _floats(column) -> np.ndarray:
    """Every float of a column of vectors (list<fixed_size_list> or fixed_size_list), in order."""
    values = column.combine_chunks()
    while hasattr(values, "flatten"):
        values = values.flatten()
    return values.to_numpy()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- first, before this process starts its own Ray: a two-node cluster ------------------------
def test_a_two_node_cluster_on_127_0_0_1_embeds_the_file_of_one_process(tmp_path):
    source = corpus(tmp_path / "in.txt", 600)
    reference = one_process(source, tmp_path / "one.parquet")
    port = _free_port()
    paths = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": paths, "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    bin_ray = shutil.which("ray", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    assert bin_ray is not None, "the ray command is not on PATH"
    common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--block", "--disable-usage-stats"]
    nodes = []
    try:  # --block: each node lives in its process, stopped below even on a failure
        head = [bin_ray, "start", "--head", "--port", str(port), "--include-dashboard=false", *common]
        nodes.append(subprocess.Popen(head, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(6)
        worker = [bin_ray, "start", "--address", f"127.0.0.1:{port}", *common]
        nodes.append(subprocess.Popen(worker, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(4)
        argv = [sys.executable, "-m", "elmokit", "embed", str(source), str(tmp_path / "ray.parquet")]
        argv += ["--engine", "ray", "--address", f"127.0.0.1:{port}", "--workers", "2", "--model", MODEL]
        argv += ["--batch-size", "16", "--quiet"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        check = [bin_ray, "status", "--address", f"127.0.0.1:{port}"]
        status = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60).stdout
        assert status.count("node_") >= 2 or "2.0 CPU" in status.replace("0.0/2.0", "2.0 CPU"), status
    finally:
        for node in reversed(nodes):
            node.send_signal(signal.SIGTERM)
        for node in nodes:
            try:
                node.wait(30)
            except subprocess.TimeoutExpired:
                node.kill()
        _forget_cluster(port)
    assert_same_rows(tmp_path / "ray.parquet", reference)


def _forget_cluster(port: int) -> None:
    """Remove the address file that `ray start --head` leaves (ray.init() would connect to it)."""
    import tempfile

    for folder in {Path(tempfile.gettempdir()), Path("/tmp")}:
        current = folder / "ray" / "ray_current_cluster"
        try:
            if current.read_text().strip().endswith(f":{port}"):
                current.unlink()
        except OSError:
            pass


# -- one ray.init with 2 CPUs for the rest ------------------------------------------------------
@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_two_actors_give_the_vectors_of_one_process(tmp_path, local_ray):
    source = corpus(tmp_path / "in.txt", 1500)
    reference = one_process(source, tmp_path / "one.parquet")
    summary = embed_file(source, tmp_path / "ray.parquet", model=MODEL, batch_size=16, workers=2, progress=False)
    assert summary.sentences == 1500 and summary.processes == 2
    assert_same_rows(tmp_path / "ray.parquet", reference)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "one.parquet", "ray.parquet"]


def test_embed_batches_in_a_users_pipeline_keeps_other_columns(tmp_path, local_ray):
    sentences = [["the", "cat"], [], ["hello", "world", "."]]
    ds = ray.data.from_items([{"id": f"s{i}", "tokens": s} for i, s in enumerate(sentences)])
    kwargs = {"model": MODEL, "layers": "top", "pooling": "mean", "mode": "zero"}
    out = ds.map_batches(EmbedBatches, fn_constructor_kwargs=kwargs, batch_format="pyarrow", concurrency=1)
    table = pa.concat_tables(out.iter_batches(batch_format="pyarrow", batch_size=None))
    assert table.column_names == ["id", "tokens", "top"]
    rows = sorted(zip(table["id"].to_pylist(), table["top"].to_pylist()))
    expected = list(Embedder(MODEL, device="cpu", mode="zero").embed_sentences(sentences, pooling="mean"))
    for (name, got), want in zip(rows, expected):
        np.testing.assert_allclose(np.asarray(got, np.float32), want[-1], rtol=0, atol=1e-5, err_msg=name)


def test_an_actor_killed_mid_run_is_restarted_and_the_output_is_complete(tmp_path, local_ray):
    import psutil

    source = corpus(tmp_path / "in.txt", 12000, seed=1)
    reference = one_process(source, tmp_path / "one.parquet")
    failure: list[BaseException] = []

    def run() -> None:
        try:
            embed_file(source, tmp_path / "ray.parquet", model=MODEL, batch_size=8, workers=2, progress=False)
        except BaseException as err:  # noqa: BLE001 (reported below)
            failure.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    killed = None
    deadline = time.monotonic() + 60
    while killed is None and time.monotonic() < deadline and thread.is_alive():
        alive = [p.pid for p in psutil.Process().children(recursive=True) if _is_embedding_actor(p)]
        if len(alive) == 2:
            time.sleep(0.5)  # the actors are embedding: kill one in the middle of its work
            if thread.is_alive():
                try:
                    os.kill(alive[0], signal.SIGKILL)
                    killed = alive[0]
                except ProcessLookupError:  # that actor ended meanwhile: look again
                    pass
        time.sleep(0.1)
    thread.join(300)
    assert killed is not None, "the run ended before an actor could be killed: give it more lines"
    assert not failure, failure
    assert_same_rows(tmp_path / "ray.parquet", reference)


def _is_embedding_actor(process) -> bool:
    """A worker process of this test's Ray whose title names the actor (ray::MapWorker(...EmbedBatches))."""
    try:
        return "EmbedBatches" in " ".join(process.cmdline())
    except Exception:  # noqa: BLE001 (gone meanwhile)
        return False


def test_the_command_runs_on_ray_and_refuses_with_one_line(tmp_path, local_ray, capsys):
    source = corpus(tmp_path / "in.txt", 200)
    reference = one_process(source, tmp_path / "one.parquet", layers="average", pooling="max")
    out = tmp_path / "ray.parquet"
    argv = ["embed", str(source), str(out), "--engine", "ray", "--model", MODEL, "--quiet"]
    assert main([*argv, "--layers", "average", "--pooling", "max", "--batch-size", "16"]) == 0
    assert_same_rows(out, reference, columns=["average"])
    capsys.readouterr()
    for extra, says in [
        (["--engine", "ray", "--mode", "stateful"], "carries states from batch to batch"),
        (["--workers", "2"], "--address and --workers go with --engine ray"),
        (["--engine", "ray", "--nproc", "2"], "takes --workers N"),
    ]:
        assert main(["embed", str(source), str(tmp_path / "x.parquet"), "--model", MODEL, *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("elmokit: error: ") and says in err and len(err.strip().splitlines()) == 1, err
    assert main(["embed", str(source), str(tmp_path / "x.hdf5"), "--engine", "ray", "--model", MODEL]) == 2
    assert "--engine ray writes Parquet" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "one.parquet", "ray.parquet"]
