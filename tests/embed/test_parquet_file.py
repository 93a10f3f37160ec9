"""Parquet output of `elmokit embed` and ``Embedder.embed_file(format="parquet")``
(elmokit.embed.parquet_file): the same vectors as the HDF5 file's for every --layers and
--pooling, the layout (columns, Arrow types, metadata), bounded row groups, one-line errors, atomic
writes, and two processes writing one process's file."""

from __future__ import annotations

import sys

import h5py
import numpy as np
import pytest
import torch

from elmokit.base import kernels
from elmokit.cli import main
from elmokit.embed.embedder import Embedder
from elmokit.embed.parquet_file import ParquetLayout, output_format, read_metadata, write_parquet

from .test_hostile_outputs import _elmokit_limited, _error_line, _listing
from .test_multiprocess_embed import corpus_lines, write_lines

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

MODEL = "elmo-tiny-reference"
LINES = ["the cat sat on the mat .", "", "a dog", "   ", "hello world , this is a longer sentence than the others ."]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(MODEL, device="cpu", mode="zero", batch_size=2)


def _hdf5_rows(path, n: int, pooled: bool) -> list[np.ndarray]:
    with h5py.File(path, "r") as f:
        if pooled:
            return list(f["embedding"][...])
        return [f[str(i)][...] for i in range(n)]


def _parquet_rows(table, columns: list[str], pooled: bool, dim: int) -> list[np.ndarray]:
    """Row i's vectors of the vector ``columns`` stacked as the HDF5 file holds them."""
    rows = []
    for i in range(table.num_rows):
        per_column = []
        for name in columns:
            cell = table.column(name)[i].as_py()
            per_column.append(np.asarray(cell, dtype=np.float32).reshape(-1 if pooled else (len(cell), dim)))
        rows.append(per_column[0] if len(columns) == 1 else np.stack(per_column))
    return rows


@pytest.mark.parametrize(
    "layers, pooling", [("all", None), ("top", None), ("average", None), ("all", "mean"), ("top", "max")]
)
def test_parquet_holds_the_vectors_of_the_hdf5_file(tmp_path, embedder, layers, pooling):
    source = write_lines(tmp_path / "in.txt", LINES)
    embedder.embed_file(source, tmp_path / "out.hdf5", layers=layers, pooling=pooling, progress=False)
    summary = embedder.embed_file(source, tmp_path / "out.parquet", layers=layers, pooling=pooling, progress=False)
    assert summary.sentences == len(LINES) and summary.empty == 2
    table = pq.read_table(tmp_path / "out.parquet")
    layout = embedder.parquet_layout(layers, pooling)
    names = ["layer_0", "layer_1", "layer_2"] if layers == "all" else [layers]
    assert table.column_names == ["index", "tokens", *names] == layout.columns
    assert table.column("index").to_pylist() == list(range(len(LINES)))
    assert table.column("tokens").to_pylist() == [line.split() for line in LINES]
    dim = embedder.dim
    vector = pa.list_(pa.field("element", pa.float32(), nullable=False), dim)
    expected_type = vector if pooling else pa.list_(pa.field("element", vector, nullable=False))
    assert all(table.schema.field(name).type == expected_type for name in names)
    assert table.schema.field("index").type == pa.int64()
    ours = _parquet_rows(table, names, pooling is not None, dim)
    theirs = _hdf5_rows(tmp_path / "out.hdf5", len(LINES), pooling is not None)
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape, i
        np.testing.assert_array_equal(a, b)  # bit for bit (NaN of an empty pooled line included)
    assert read_metadata(tmp_path / "out.parquet") == {
        "elmokit.model": MODEL,
        "elmokit.layers": layers,
        "elmokit.pooling": pooling or "none",
        "elmokit.mode": "zero",
        "elmokit.dim": str(dim),
        "elmokit.num_layers": "3",
        "elmokit.version": __import__("elmokit").__version__,
    }


def test_row_groups_are_bounded_in_sentences_and_bytes(tmp_path):
    layout = ParquetLayout(num_layers=3, dim=4, layers="all")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((3, n, 4)).astype(np.float32) for n in [1, 2, 3, 0, 5, 4, 2, 1, 1, 7]]
    rows = [([f"t{k}" for k in range(a.shape[1])], a) for a in arrays]
    assert write_parquet(tmp_path / "a.parquet", False, iter(rows), layout, row_group_sentences=3) == 10
    assert [g.num_rows for g in _groups(tmp_path / "a.parquet")] == [3, 3, 3, 1]
    # bytes: a group ends at the row that reaches 100 bytes (3 x 5 tokens x 4 x 4 bytes = 240)
    write_parquet(tmp_path / "b.parquet", False, iter(rows), layout, first_index=100, row_group_bytes=100)
    sizes = [g.num_rows for g in _groups(tmp_path / "b.parquet")]
    assert sizes == [2, 1, 2, 1, 2, 2], sizes  # 48+96 | 144 | 0+240 | 192 | 96+48 | 48+336
    table = pq.read_table(tmp_path / "b.parquet")
    assert table.column("index").to_pylist() == list(range(100, 110))
    for i, array in enumerate(arrays):
        for k in range(3):
            got = np.asarray(table.column(f"layer_{k}")[i].as_py(), dtype=np.float32).reshape(-1, 4)
            np.testing.assert_array_equal(got, array[k])


def _groups(path):
    metadata = pq.ParquetFile(path).metadata
    return [metadata.row_group(g) for g in range(metadata.num_row_groups)]


def test_an_empty_input_is_a_file_of_no_rows_with_the_schema(tmp_path):
    layout = ParquetLayout(num_layers=3, dim=4, layers="top", pooling="mean")
    assert write_parquet(tmp_path / "e.parquet", False, iter([]), layout) == 0
    table = pq.read_table(tmp_path / "e.parquet")
    assert table.num_rows == 0 and table.column_names == ["index", "tokens", "top"]


def test_the_format_comes_from_the_suffix_or_format_and_they_must_agree():
    assert output_format("x.parquet") == output_format("x.PQ") == "parquet"
    assert output_format("x.hdf5") == output_format("x.h5") == output_format("x.vec") == "hdf5"
    assert output_format("x.vec", "parquet") == "parquet"
    with pytest.raises(ValueError, match="has the suffix of parquet but the format hdf5"):
        output_format("x.parquet", "hdf5")
    with pytest.raises(ValueError, match="format must be one of hdf5, parquet"):
        output_format("x.parquet", "csv")


def test_the_command_writes_parquet_and_refuses_with_one_line(tmp_path, capsys):
    source = str(write_lines(tmp_path / "in.txt", LINES))
    out = tmp_path / "vectors.bin"
    assert main(["embed", source, str(out), "--format", "parquet", "--model", MODEL, "--quiet"]) == 0
    assert pq.read_table(out).num_rows == len(LINES)
    capsys.readouterr()
    assert main(["embed", source, str(tmp_path / "o.parquet"), "--format", "hdf5", "--model", MODEL]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("elmokit: error: the output") and "suffix of parquet" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o.parquet").exists()
    before = out.read_bytes()  # an existing output, and an output that is the input
    assert main(["embed", source, str(out), "--format", "parquet", "--model", MODEL, "--quiet"]) == 2
    assert "exists" in capsys.readouterr().err and out.read_bytes() == before
    assert main(["embed", source, source, "--format", "parquet", "--overwrite", "--model", MODEL]) == 2
    assert "is the input file" in capsys.readouterr().err


def test_without_pyarrow_the_error_names_the_extra(tmp_path, capsys, monkeypatch):
    source = str(write_lines(tmp_path / "in.txt", LINES))
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    assert main(["embed", source, str(tmp_path / "o.parquet"), "--model", MODEL, "--quiet"]) == 2
    assert capsys.readouterr().err == (
        "elmokit: error: Parquet output needs the package pyarrow: pip install 'elmokit[parquet]'\n"
    )
    with pytest.raises(ImportError, match=r"elmokit\[parquet\]"):
        Embedder(MODEL, device="cpu", mode="zero").embed_file(source, tmp_path / "o.parquet", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_a_failure_while_writing_leaves_nothing_and_the_previous_file(tmp_path, embedder):
    layout = embedder.parquet_layout()
    good = [(["a"], np.zeros((3, 1, embedder.dim), np.float32))] * 3
    write_parquet(tmp_path / "o.parquet", False, iter(good), layout)
    before = (tmp_path / "o.parquet").read_bytes()

    def failing():
        yield from good
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        write_parquet(tmp_path / "o.parquet", True, failing(), layout, row_group_sentences=1)
    with pytest.raises(ValueError, match=r"an array of shape \(1, 32\) for 3 layers"):
        write_parquet(tmp_path / "o.parquet", True, iter([(["a"], np.zeros((1, 32), np.float32))]), layout)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.parquet"]
    assert (tmp_path / "o.parquet").read_bytes() == before


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    write_lines(tmp_path / "in.txt", [f"the cat sat on mat number {i} ." for i in range(300)])
    before = _listing(tmp_path)
    done = _elmokit_limited(["embed", "in.txt", "out.parquet", "--model", MODEL, "--quiet"], 20_000, tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert _error_line(done.stderr) == (
        "elmokit: error: out.parquet was not written: the file is larger than this process may write "
        "(File too large); no partial file was left"
    )
    assert _listing(tmp_path) == before


@pytest.mark.slow  # two worker processes start (about 20 s on 2 cores)
def test_two_processes_write_the_parquet_file_of_one(tmp_path):
    """--nproc 2 merges the processes' parts into the file one process writes: equal tables
    (with the token cache off each process computes one process's batches, bit for bit)."""
    lines = corpus_lines(copies=3)
    assert "" in lines
    source = write_lines(tmp_path / "in.txt", lines)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers take at most this process's threads: the same floats
    try:
        with kernels.disabled("token_cache"):
            one = Embedder(MODEL, device="cpu", mode="zero", batch_size=4)
            for processes in (1, 2):
                summary = one.embed_file(
                    source, tmp_path / f"{processes}.parquet", progress=False, processes=processes
                )
                assert summary.sentences == len(lines) and summary.processes == processes
            one.embed_file(source, tmp_path / "2.pq", progress=False, processes=2, pooling="max", layers="average")
            one.embed_file(source, tmp_path / "1.pq", progress=False, pooling="max", layers="average")
    finally:
        torch.set_num_threads(threads)
    assert pq.read_table(tmp_path / "1.parquet").num_rows == len(lines)
    assert (tmp_path / "1.parquet").read_bytes() == (tmp_path / "2.parquet").read_bytes()
    assert (tmp_path / "1.pq").read_bytes() == (tmp_path / "2.pq").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.parquet", "1.pq", "2.parquet", "2.pq", "in.txt"]


def test_the_ray_engine_without_ray_names_the_extra(tmp_path, capsys, monkeypatch):
    source = str(write_lines(tmp_path / "in.txt", LINES))
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert main(["embed", source, str(tmp_path / "o.parquet"), "--engine", "ray", "--model", MODEL]) == 2
    assert capsys.readouterr().err == (
        "elmokit: error: the ray engine needs the package ray: pip install 'elmokit[ray]'\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
