"""Sharded, resumable embed runs in one process (``embed_file(shard_sentences=N)``, ``elmokit
embed --shard-sentences N``): the parts hold a single output's vectors, a rerun keeps the parts
that verify and redoes the others, a changed model, option or input is refused in one line,
--overwrite removes only what the run made, and ``read_shards`` reads the folder back. The
killed runs, --nproc and torchrun are in test_shards_processes.py."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from elmokit.base import kernels
from elmokit.cli import main
from elmokit.embed.embedder import Embedder
from elmokit.embed.shards import MANIFEST, read_manifest, read_shards

from ..conftest import HDF5_BYTES_REPEAT
from .test_multiprocess_embed import corpus_lines, write_lines

MODEL = "elmo-tiny-reference"
PARTS = [f"part-{i:05d}.hdf5" for i in range(7)]  # 322 lines in parts of 50


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(MODEL, batch_size=4, mode="zero", device="cpu")


@pytest.fixture
def corpus(tmp_path) -> Path:
    lines = corpus_lines()
    assert len(lines) == 322 and "" in lines
    return write_lines(tmp_path / "in.txt", lines)


def contents(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_the_parts_hold_the_vectors_of_one_output(tmp_path, corpus, embedder):
    """With parts of a multiple of the chunk (8 x batch size) and the token cache off, each
    line's array read back across the parts is the single file's bit for bit, with and without
    pooling; the manifest says what made them."""
    corpus = write_lines(corpus, corpus.read_text().splitlines()[:130])
    with kernels.disabled("token_cache"):
        for layers, pooling in (("all", None), ("top", "mean")):
            one, folder = tmp_path / f"{layers}.hdf5", tmp_path / f"{layers}-parts"
            embedder.embed_file(corpus, one, layers, progress=False, pooling=pooling)
            summary = embedder.embed_file(
                corpus, folder, layers, progress=False, pooling=pooling, shard_sentences=64
            )
            assert (summary.sentences, summary.parts, summary.skipped_parts) == (130, 3, 0)
            arrays = list(read_shards(folder))
            assert len(arrays) == 130
            with h5py.File(one) as f:
                for i, array in enumerate(arrays):
                    expected = f["embedding"][i] if pooling else f[str(i)][...]
                    assert array.dtype == np.float32
                    np.testing.assert_array_equal(array, expected, err_msg=f"line {i}")
    manifest = read_manifest(tmp_path / "top-parts")
    assert manifest["options"] == {
        "layers": "top",
        "pooling": "mean",
        "mode": "zero",
        "dtype": "float32",
        "backend": "torch",
        "tokenize": False,
        "sentence_index": True,
    }
    assert [f["name"] for f in manifest["model"]["files"]] == ["options.json", "weights.hdf5"]
    assert manifest["input"]["lines"] == 130 and manifest["input"]["size"] == corpus.stat().st_size
    assert [(p["name"], p["first_line"], p["lines"]) for p in manifest["parts"]] == [
        (f"part-{i:05d}.hdf5", 64 * i, 64 if i < 2 else 2) for i in range(3)
    ]
    with h5py.File(tmp_path / "top-parts" / "part-00001.hdf5") as f:  # a part numbers its own lines
        index = json.loads(f["sentence_to_index"][0])
        assert f["embedding"].shape == (64, 32)
    lines = corpus.read_text().splitlines()[64:128]
    assert index[lines[-1].strip()] == str(
        max(i for i, x in enumerate(lines) if x.strip() == lines[-1].strip())
    )


@pytest.mark.skipif(not HDF5_BYTES_REPEAT, reason="libhdf5 before 2.0 stamps a part written again with its time")
def test_a_rerun_keeps_the_parts_that_verify_and_redoes_the_others(tmp_path, corpus, embedder, caplog):
    """After a full run: part 1 claimed but never finished (its sha256 null), part 3 gone, part
    5 changed by one byte. The same call redoes those three, leaves the other files untouched,
    and ends with the same folder, byte for byte."""
    folder = tmp_path / "out"
    embedder.embed_file(corpus, folder, progress=False, shard_sentences=50)
    first = contents(folder)
    assert sorted(first) == [MANIFEST, *PARTS]
    manifest = json.loads(first[MANIFEST])
    manifest["parts"][1]["sha256"] = None
    (folder / MANIFEST).write_text(json.dumps(manifest))
    (folder / PARTS[3]).unlink()
    changed = bytearray(first[PARTS[5]])
    changed[len(changed) // 2] ^= 1
    (folder / PARTS[5]).write_bytes(bytes(changed))
    kept = {name: (folder / name).stat().st_mtime_ns for name in (PARTS[0], PARTS[2], PARTS[4], PARTS[6])}
    with caplog.at_level(logging.INFO, logger="elmokit"):
        summary = embedder.embed_file(corpus, folder, progress=False, shard_sentences=50)
    assert (summary.parts, summary.skipped_parts, summary.sentences) == (7, 4, 150)
    assert contents(folder) == first
    assert {name: (folder / name).stat().st_mtime_ns for name in kept} == kept
    messages = [record.getMessage() for record in caplog.records]
    assert f"{folder / PARTS[3]} is missing: it is embedded again" in messages
    assert f"{folder / PARTS[5]} does not match its sha256 in the manifest: it is embedded again" in messages
    assert f"{folder}: 4 of 7 parts (172 lines) are done already and verified; they are skipped" in messages
    # nothing to do: every part is skipped
    summary = embedder.embed_file(corpus, folder, progress=False, shard_sentences=50)
    assert (summary.skipped_parts, summary.sentences) == (7, 0) and contents(folder) == first


def test_a_changed_model_option_or_input_is_refused_in_one_line(tmp_path, corpus, capsys):
    """Each change is named in one line, exit status 2, and the folder is left as it was;
    --overwrite starts over, deleting only the parts and the manifest the tool made."""
    folder = tmp_path / "out"
    base = ["embed", str(corpus), str(folder), "--model", MODEL, "--batch-size", "4", "--device", "cpu"]
    base += ["--mode", "zero", "--shard-sentences", "50", "--quiet"]
    assert main(base) == 0
    first = contents(folder)
    after = "; run the same command to resume it, or pass --overwrite (overwrite=True) to start over"
    model = tmp_path / "model"
    shutil.copytree(Path(Embedder(MODEL).source_files[0]).parent, model)
    (model / "options.json").write_text((model / "options.json").read_text() + "\n")
    changes = [
        (["--layers", "top"], f"{folder} holds parts embedded with layers 'all', not 'top'"),
        (["--mode", "warm"], f"{folder} holds parts embedded with mode 'zero', not 'warm'"),
        (["--pooling", "max"], f"{folder} holds parts embedded with pooling None, not 'max'"),
        (["--dtype", "bfloat16"], f"{folder} holds parts embedded with dtype 'float32', not 'bfloat16'"),
        (
            ["--no-sentence-index"],
            f"{folder} holds parts embedded with sentence_index (--no-sentence-index) True, not False",
        ),
        (["--shard-sentences", "60"], f"{folder} holds parts of shard_sentences 50, not 60"),
        (
            ["--model", str(model)],
            f"{folder} holds parts of another model: options.json (417 bytes, sha256 "
            "117cb6d2fb87), weights.hdf5 (450,896 bytes, sha256 dfdfd3001b59), not options.json (418 bytes",
        ),
    ]
    for extra, message in changes:
        assert main([*base, *extra]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if " error: " in line]
        assert len(err) == 1 and err[0].startswith(f"elmokit: error: {message}"), (extra, err)
        assert err[0].endswith(after) and contents(folder) == first
    size = corpus.stat().st_size
    with corpus.open("a") as f:
        f.write("one more line\n")
    assert main(base) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"elmokit: error: {folder} holds parts of another input (size {size} -> {size + 14}, lines 322 -> "
        "323, sha256 "
    ), err
    assert contents(folder) == first
    # --overwrite: the tool's files go, a file of the user's in the folder stays
    (folder / "notes.txt").write_text("mine")
    assert main([*base, "--shard-sentences", "200", "--overwrite"]) == 0
    assert sorted(contents(folder)) == [MANIFEST, "notes.txt", "part-00000.hdf5", "part-00001.hdf5"]
    assert read_manifest(folder)["input"]["lines"] == 323
    assert (folder / "notes.txt").read_text() == "mine"


def test_what_is_refused_before_any_part(tmp_path, corpus, embedder, capsys):
    base = ["--model", MODEL, "--device", "cpu", "--shard-sentences", "50", "--quiet"]
    assert main(["embed", "-", str(tmp_path / "a"), *base]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "elmokit: error: standard input can be read only once, so a sharded run cannot resume from it; "
        "give a file"
    )
    assert main(["embed", str(corpus), str(corpus), *base]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"elmokit: error: output {corpus} is a file; with --shard-sentences the output is a folder"
    ]
    assert main(["embed", str(corpus), str(tmp_path / "a"), *base, "--mode", "stateful"]) == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith(
            "elmokit: error: --mode stateful carries LSTM states from each batch into the next, so a part's"
        )
    )
    # a file at a part's name that the manifest does not name is the user's
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "part-00002.hdf5").write_text("not ours")
    assert main(["embed", str(corpus), str(tmp_path / "b"), *base, "--mode", "zero"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"elmokit: error: {tmp_path / 'b' / 'part-00002.hdf5'} exists and the manifest does not name it, "
        "so elmokit did not write it; move it away, or pass --overwrite (overwrite=True) to replace it"
    ]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["part-00002.hdf5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "in.txt"]
    with pytest.raises(ValueError, match="^shard_sentences must be a whole number of at least 1, got 0$"):
        embedder.embed_file(corpus, tmp_path / "c", shard_sentences=0)


def test_an_unfinished_folder_is_not_read_and_an_empty_input_has_no_parts(tmp_path, corpus, embedder):
    folder = tmp_path / "out"
    embedder.embed_file(corpus, folder, progress=False, shard_sentences=100)
    manifest = json.loads((folder / MANIFEST).read_text())
    parts = manifest["parts"]
    manifest["parts"] = parts[:2]
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"holds 2 of 4 parts: the run is not finished; run its command"):
        list(read_shards(folder))
    (folder / MANIFEST).write_text(json.dumps(read_manifest(folder) | {"parts": parts}))
    part = folder / "part-00000.hdf5"
    part.write_bytes(part.read_bytes()[:-1] + b"x")
    with pytest.raises(ValueError, match="part-00000.hdf5 does not match its sha256 in the manifest"):
        next(read_shards(folder))
    empty = write_lines(tmp_path / "empty.txt", [])
    empty.write_text("")
    summary = embedder.embed_file(empty, tmp_path / "none", progress=False, shard_sentences=10)
    assert (summary.parts, summary.sentences) == (0, 0)
    assert sorted(p.name for p in (tmp_path / "none").iterdir()) == [MANIFEST]
    assert list(read_shards(tmp_path / "none")) == []


def test_parquet_parts_hold_the_rows_of_one_parquet_output(tmp_path, corpus, embedder):
    """--format parquet: each part is the Parquet file of its lines, its "index" column the
    lines' numbers in the whole input; read back across the parts, the vectors are the single
    file's bit for bit (parts of a multiple of the chunk, the token cache off); a killed part
    (claimed, not finished) is redone to the same bytes."""
    pq = pytest.importorskip("pyarrow.parquet")
    corpus = write_lines(corpus, corpus.read_text().splitlines()[:130])
    folder, one = tmp_path / "parts", tmp_path / "one.parquet"
    with kernels.disabled("token_cache"):
        embedder.embed_file(corpus, one, "top", progress=False)
        embedder.embed_file(corpus, folder, "top", progress=False, shard_sentences=64, format="parquet")
        first = contents(folder)
        assert sorted(first) == [MANIFEST, "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
        table = pq.read_table(one)
        assert pq.read_table(folder / "part-00001.parquet").column("index").to_pylist() == list(
            range(64, 128)
        )
        for i, array in enumerate(read_shards(folder)):
            expected = np.asarray(table.column("top")[i].as_py(), dtype=np.float32).reshape(-1, 32)
            np.testing.assert_array_equal(array, expected, err_msg=f"line {i}")
        assert i == 129
        manifest = json.loads(first[MANIFEST])
        manifest["parts"][1]["sha256"] = None
        (folder / MANIFEST).write_text(json.dumps(manifest))
        summary = embedder.embed_file(
            corpus, folder, "top", progress=False, shard_sentences=64, format="parquet"
        )
    assert (summary.skipped_parts, summary.sentences) == (2, 64) and contents(folder) == first
