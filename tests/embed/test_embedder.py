"""Embedder and `elmokit embed`: layout, modes, order, determinism, cache, windows, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch

from elmokit import BiLM, batch_to_ids
from elmokit.base import kernels
from elmokit.cli import main
from elmokit.embed.embedder import Embedder
from elmokit.lm.start_state import estimate_start_state
from elmokit.model.lstm import LstmState

from ..conftest import HDF5_BYTES_REPEAT, TINY


@pytest.fixture(scope="module")
def sentences(tiny_sentences) -> list[list[str]]:
    return [s.split() for group in tiny_sentences for s in group]


@pytest.fixture(scope="module")
def bilm(tiny_files) -> BiLM:
    return BiLM.load(*tiny_files)


def write_lines(path, lines) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_stateful_embed_file_reproduces_bilm_tf(tmp_path, tiny_files, tiny_sentences):
    # File order s0[0], s1[0], s2[0], s0[1], ... in batches of 3 = the reference's batches.
    lines = [tiny_sentences[k][i] for i in range(10) for k in range(3)]
    source = write_lines(tmp_path / "in.txt", lines)
    embedder = Embedder(BiLM.load(*tiny_files), batch_size=3, mode="stateful")
    embedder.embed_file(source, tmp_path / "out.hdf5", layers="top", progress=False)
    with h5py.File(tmp_path / "out.hdf5", "r") as out:
        for line in range(len(lines)):
            i, k = divmod(line, 3)
            with h5py.File(TINY / f"lm_embeddings_{k}.hdf5", "r") as ref:
                expected = np.concatenate(ref[str(i)][...], axis=-1)
            np.testing.assert_allclose(out[str(line)][...], expected, atol=1e-6)
        index = json.loads(out["sentence_to_index"][0])
    assert index[lines[4]] == "4" and len(index) == 30


def test_layers_modes_and_layout(tmp_path, bilm, sentences):
    source = write_lines(tmp_path / "in.txt", [" ".join(s) for s in sentences[:5]])
    embedder = Embedder(bilm, batch_size=2)
    for layers in ("all", "top", "average"):
        embedder.embed_file(source, tmp_path / f"{layers}.hdf5", layers=layers, progress=False)
    with (
        h5py.File(tmp_path / "all.hdf5") as a,
        h5py.File(tmp_path / "top.hdf5") as t,
        h5py.File(tmp_path / "average.hdf5") as m,
    ):
        assert sorted(a) == ["0", "1", "2", "3", "4", "sentence_to_index"]
        for i, s in enumerate(sentences[:5]):
            full = a[str(i)][...]
            assert full.shape == (3, len(s), 32) and full.dtype == np.float32
            np.testing.assert_array_equal(t[str(i)][...], full[2])
            np.testing.assert_allclose(m[str(i)][...], full.mean(0), atol=1e-7)


def test_order_restored_and_deterministic_across_batch_sizes(bilm, sentences):
    alone = [Embedder(bilm, batch_size=1).embed_sentence(s) for s in sentences[:12]]
    for batch_size in (3, 64):
        for mode in ("warm", "zero"):
            got = list(Embedder(bilm, batch_size=batch_size, mode=mode).embed_sentences(sentences[:12]))
            for a, b in zip(alone, got):
                np.testing.assert_allclose(a, b, atol=1e-6)
    with torch.no_grad():
        direct = bilm(batch_to_ids(sentences[:12])).layers.numpy()
    for i, a in enumerate(alone):
        np.testing.assert_allclose(a, direct[:, i, : a.shape[1]], atol=1e-6)


def test_cache_does_not_change_results(bilm, sentences):
    bilm.token_encoder.clear_cache()
    cached = Embedder(bilm, batch_size=16)  # batches with enough distinct tokens to use it
    a = list(cached.embed_sentences(sentences[:10] * 2))
    assert bilm.token_encoder.cache_stats[0] > 0  # the model's token cache served the repeats
    with kernels.disabled("token_cache"):
        b = list(cached.embed_sentences(sentences[:10] * 2))
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, atol=1e-6)


def test_long_sentence_windows_equal_unsplit(tiny_files, sentences):
    long = [t for s in sentences for t in s][:700]
    bilm = BiLM.load(*tiny_files)
    ids = batch_to_ids([long, sentences[0]])
    with torch.no_grad():
        whole, windowed = bilm(ids, window=None), bilm(ids, window=64)
    torch.testing.assert_close(whole.layers, windowed.layers, atol=1e-6, rtol=0)
    torch.testing.assert_close(whole.state.h, windowed.state.h, atol=1e-6, rtol=0)
    stateful = BiLM.load(*tiny_files, stateful=True)
    with torch.no_grad():
        c = stateful(ids, window=64).layers
    torch.testing.assert_close(whole.layers, c, atol=1e-6, rtol=0)
    # with autograd (the out-of-place scatter) the windows give the same values and gradients
    bilm.requires_grad_(True)
    grads = []
    for window in (None, 64):
        bilm.zero_grad()
        out = bilm(ids, window=window)
        torch.testing.assert_close(out.layers.detach(), whole.layers, atol=1e-6, rtol=0)
        out.layers[2].sum().backward()
        grads.append(bilm.lstm.layers[0].weight_hidden.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-5)


def test_warm_start_state_round_trip_and_modes(tmp_path, bilm, sentences, tiny_files):
    state = estimate_start_state(bilm, sentences, rows=4, burn_in=2)
    assert state.h.shape == (2, 2, 16) and state.c.shape == (2, 2, 64)
    assert state.h.abs().sum() > 0
    model = BiLM.load(*tiny_files)
    model.set_start_state(state)
    model.save(tmp_path / "options.json", tmp_path / "weights.hdf5")
    with h5py.File(tmp_path / "weights.hdf5") as f:
        np.testing.assert_array_equal(f["start_state/c"][...], state.c.numpy())
    warm = Embedder(str(tmp_path), mode="warm")
    zero = Embedder(str(tmp_path), mode="zero")
    assert isinstance(warm.bilm.start_state, LstmState)
    s = sentences[3]
    w, z = warm.embed_sentence(s), zero.embed_sentence(s)
    np.testing.assert_array_equal(w[0], z[0])  # the token layer has no state
    assert not np.allclose(w[1], z[1], atol=1e-4)
    np.testing.assert_allclose(z, Embedder(bilm, mode="warm").embed_sentence(s), atol=1e-6)
    # warm mode is deterministic: batch composition does not matter
    batch = list(warm.embed_sentences([sentences[0], s, sentences[7]]))
    np.testing.assert_allclose(batch[1], w, atol=1e-6)


def test_empty_lines_invalid_utf8_and_existing_output(tmp_path, bilm):
    source = write_lines(tmp_path / "in.txt", ["a b c", "", "d e"])
    summary = Embedder(bilm).embed_file(source, tmp_path / "out.hdf5", progress=False)
    assert (summary.sentences, summary.empty, summary.tokens) == (3, 1, 5)
    with h5py.File(tmp_path / "out.hdf5") as f:
        assert f["1"].shape == (3, 0, 32)
    with pytest.raises(FileExistsError, match="exists; pass overwrite=True"):
        Embedder(bilm).embed_file(source, tmp_path / "out.hdf5", progress=False)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\nsecond line\nbroken \xff\xfe line\n")
    with pytest.raises(ValueError, match="line 3 is not valid UTF-8"):
        Embedder(bilm).embed_file(bad, tmp_path / "bad.hdf5", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "in.txt", "out.hdf5"]


def test_interrupted_run_leaves_no_output(tmp_path, bilm, monkeypatch):
    source = write_lines(tmp_path / "in.txt", ["a b"] * 10)
    embedder = Embedder(bilm, batch_size=2)
    calls = {"n": 0}
    original = embedder.embed_batch

    def interrupted(batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(batch)

    monkeypatch.setattr(embedder, "embed_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        embedder.embed_file(source, tmp_path / "out.hdf5", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_model_folder_errors(tmp_path, tiny_files):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "options.json").write_text(tiny_files[0].read_text())
    with pytest.raises(FileNotFoundError, match="has no weights.hdf5"):
        Embedder(str(tmp_path / "m"))
    options = json.loads(tiny_files[0].read_text())
    options["lstm"]["projection_dim"] = 8
    (tmp_path / "m" / "options.json").write_text(json.dumps(options))
    (tmp_path / "m" / "weights.hdf5").write_bytes(tiny_files[1].read_bytes())
    with pytest.raises(ValueError, match="weights.hdf5: dataset 'CNN_proj/W_proj' has shape"):
        Embedder(str(tmp_path / "m"))


def test_cli_embed_tokenize_and_tokens(tmp_path, capsys):
    pytest.importorskip("sacremoses", reason="the corpus extra")
    source = write_lines(tmp_path / "raw.txt", ["He said, “it won’t rain.”"])
    assert main(["embed", source, str(tmp_path / "o.hdf5"), "--tokenize", "--quiet"]) == 0
    with h5py.File(tmp_path / "o.hdf5") as f:
        index = json.loads(f["sentence_to_index"][0])
        assert f["0"].shape == (3, 10, 256)  # He said , " it won 't rain . " (default model)
    assert list(index) == ["He said, “it won’t rain.”"]
    assert main(["embed", source, str(tmp_path / "o.hdf5"), "--quiet"]) == 2
    assert "exists" in capsys.readouterr().err
    vocab = write_lines(tmp_path / "vocab.txt", ["<S>", "bank", "river"])
    assert main(["tokens", vocab, str(tmp_path / "t.hdf5"), "--model", "elmo-tiny-reference"]) == 0
    bilm = BiLM.load(*(TINY / "options.json", TINY / "lm_weights.hdf5"))
    with h5py.File(tmp_path / "t.hdf5") as f, torch.no_grad():
        np.testing.assert_allclose(
            f["embedding"][...], bilm.encode_tokens(["<S>", "bank", "river"]).numpy(), atol=1e-6
        )


def test_bfloat16_vectors_track_float32_and_bad_dtype_is_refused(bilm, sentences):
    fp32 = Embedder("elmo-news-512", batch_size=8, mode="warm")
    bf16 = Embedder("elmo-news-512", batch_size=8, mode="warm", dtype="bf16")
    assert next(bf16.bilm.parameters()).dtype == torch.bfloat16
    exact, approx = list(fp32.embed_sentences(sentences)), list(bf16.embed_sentences(sentences))
    a, b = (torch.from_numpy(np.concatenate(x, axis=1)) for x in (exact, approx))
    assert b.dtype == torch.float32 and a.shape == b.shape
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=-1)  # (layers, tokens)
    assert cosine.mean() > 0.999 and cosine.min() > 0.99
    assert not torch.equal(a, b)  # it did run in another precision
    with pytest.raises(ValueError, match="dtype must be one of"):
        Embedder(bilm, dtype="half")


def test_embed_file_never_replaces_an_output_that_appeared_meanwhile(tmp_path, bilm, sentences):
    src = write_lines(tmp_path / "in.txt", [" ".join(s) for s in sentences[:4]])
    out = tmp_path / "out.hdf5"
    embedder = Embedder(bilm, batch_size=2)

    def racing(batch):  # another run writes OUTPUT while this one embeds
        if not out.exists():
            out.write_bytes(b"the other run's result")
        return original(batch)

    original, embedder.embed_batch = embedder.embed_batch, racing
    with pytest.raises(FileExistsError, match="appeared while it was being written"):
        embedder.embed_file(src, out, progress=False)
    assert out.read_bytes() == b"the other run's result"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.hdf5"]  # no temporary left


def test_embed_file_output_follows_the_umask_and_a_bom_is_not_a_token(tmp_path, bilm, sentences):
    import os

    text = " ".join(sentences[0])
    plain = write_lines(tmp_path / "plain.txt", [text])
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + text.encode() + b"\n")
    embedder = Embedder(bilm)
    old = os.umask(0o022)
    try:
        embedder.embed_file(plain, tmp_path / "a.hdf5", progress=False)
        embedder.embed_file(str(tmp_path / "bom.txt"), tmp_path / "b.hdf5", progress=False)
    finally:
        os.umask(old)
    assert (tmp_path / "a.hdf5").stat().st_mode & 0o777 == 0o644
    with h5py.File(tmp_path / "a.hdf5") as a, h5py.File(tmp_path / "b.hdf5") as b:
        np.testing.assert_array_equal(a["0"][...], b["0"][...])
        assert json.loads(b["sentence_to_index"][0]) == {text: "0"}


def test_embed_file_reads_a_pipe(tmp_path, bilm, sentences):
    import os
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    lines = [" ".join(s) for s in sentences[:3]]

    def feed():
        with open(fifo, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

    writer = threading.Thread(target=feed)
    writer.start()
    summary = Embedder(bilm).embed_file(str(fifo), tmp_path / "out.hdf5", progress=False)
    writer.join()
    assert summary.sentences == 3


def test_embed_refuses_to_replace_its_own_input(tmp_path, capsys):
    source = write_lines(tmp_path / "in.txt", ["a b c", "d e"])
    before = (tmp_path / "in.txt").read_bytes()
    (tmp_path / "link.txt").symlink_to(tmp_path / "in.txt")
    os.link(tmp_path / "in.txt", tmp_path / "hard.txt")
    for output in (source, str(tmp_path / "link.txt"), str(tmp_path / "hard.txt")):
        argv = ["embed", source, output, "--overwrite", "--quiet", "--model", "elmo-tiny-reference"]
        assert main(argv) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"elmokit: error: output {output} is the input file {source}; write to another file"
        )
    argv = ["tokens", source, source, "--overwrite", "--model", "elmo-tiny-reference"]
    assert main(argv) == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith(f"elmokit: error: output {source} is the input file")
    )
    assert (tmp_path / "in.txt").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.txt", "in.txt", "link.txt"]


def test_every_text_reader_ends_lines_at_lf_crlf_and_lone_cr(tmp_path, bilm):
    """One rule for every reader (universal newlines, as allennlp's elmo command reads): the
    embed line numbers, the training data, the vocabulary and start-state's text agree."""
    from elmokit.base.textfiles import count_lines, read_lines
    from elmokit.lm.vocabulary import Vocabulary
    from elmokit.training.data import count_tokens, read_sentences

    path = tmp_path / "in.txt"
    path.write_bytes(b"a b\rc d\r\ne\n\rf")
    expected = ["a b", "c d", "e", "", "f"]
    assert list(read_lines(path)) == expected and count_lines(path) == 5
    Embedder(bilm).embed_file(path, tmp_path / "out.hdf5", progress=False)
    with h5py.File(tmp_path / "out.hdf5") as f:
        assert sorted(f) == ["0", "1", "2", "3", "4", "sentence_to_index"]
        assert [f[str(i)].shape[1] for i in range(5)] == [2, 2, 1, 0, 1]
        assert json.loads(f["sentence_to_index"][0]) == {line: str(i) for i, line in enumerate(expected)}
    assert read_sentences(str(path), None) == [["a", "b"], ["c", "d"], ["e"], ["f"]]
    assert count_tokens([str(path)])["f"] == 1
    (tmp_path / "vocab.txt").write_bytes(b"<S>\r</S>\r\n<UNK>\rbank")
    assert len(Vocabulary.from_file(tmp_path / "vocab.txt")) == 4
    # a "\r\n" split between two 1 MB blocks of the byte counter is one line end
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * ((1 << 20) - 1) + b"\r\n" + b"y\n")
    assert count_lines(big) == 2 == len(list(read_lines(big)))


def _embed_command(source, output) -> list[str]:
    return [sys.executable, "-m", "elmokit.cli", "embed", str(source), str(output)] + [
        "--model",
        "elmo-tiny-reference",
        "--quiet",
        "--batch-size",
        "4",
    ]


def _start_and_wait_for_temporary(tmp_path, n_lines=20000):
    source = write_lines(tmp_path / "in.txt", ["the bank raised rates again today ."] * n_lines)
    proc = subprocess.Popen(
        _embed_command(source, tmp_path / "out.hdf5"), stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".out.hdf5.*.tmp")):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # well inside the writing
    return proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_embed_removes_its_temporary_file(tmp_path, signum):
    proc = _start_and_wait_for_temporary(tmp_path)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert err.splitlines()[-1] == (
        f"elmokit: error: interrupted by {signal.Signals(signum).name}; no partial output was left"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_the_leftover_of_a_killed_embed_is_removed_by_the_next_write(tmp_path, bilm):
    proc = _start_and_wait_for_temporary(tmp_path)
    proc.kill()  # SIGKILL: nothing can clean up
    proc.communicate(timeout=60)
    leftovers = list(tmp_path.glob(".out.hdf5.*.tmp"))
    assert len(leftovers) == 1 and f".out.hdf5.{proc.pid}@" in leftovers[0].name
    alive = tmp_path / leftovers[0].name.replace(f".{proc.pid}@", f".{os.getpid()}@")
    alive.write_bytes(b"a write in progress in a live process")
    write_lines(tmp_path / "small.txt", ["a b"])
    Embedder(bilm).embed_file(tmp_path / "small.txt", tmp_path / "out.hdf5", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["in.txt", "small.txt", "out.hdf5", alive.name]
    )


def test_sentence_index_json_never_held_in_memory(tmp_path, bilm):
    """The sentence_to_index JSON (here 12 MB) is built in a temporary file and copied into the
    output in blocks: Python's peak memory stays far below its size (it held it twice before)."""
    import tracemalloc

    lines = [f"{i:06d} {'y' * 12000}" for i in range(1000)]  # distinct sentences, 2 tokens each
    source = write_lines(tmp_path / "in.txt", lines)
    embedder = Embedder(bilm, batch_size=16)
    # one small call first: the first call's one-off allocations (on a GPU: 11 MB) are not the index's
    write_lines(tmp_path / "warm.txt", ["a b"])
    embedder.embed_file(tmp_path / "warm.txt", tmp_path / "warm.hdf5", layers="top", progress=False)
    tracemalloc.start()
    try:
        embedder.embed_file(source, tmp_path / "out.hdf5", layers="top", progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    with h5py.File(tmp_path / "out.hdf5") as f:
        stored = f["sentence_to_index"][0]
        assert f["sentence_to_index"].shape == (1,)
        index = json.loads(stored)
    assert len(index) == 1000 and index[lines[123]] == "123"
    assert len(stored) > 12_000_000
    assert peak < len(stored) / 2.5, (peak, len(stored))  # it was 1.07 times the JSON's size


def test_pooled_sentence_vectors_are_the_masked_mean_and_max_over_tokens(bilm, sentences):
    """embed_sentences(pooling=...) gives (num_layers, dim) per sentence: the mean or max over
    the sentence's own tokens, as a masked mean/max of the padded batch output gives."""
    batch = sentences[:8]
    embedder = Embedder(bilm, batch_size=4)
    unpooled = list(embedder.embed_sentences(batch))
    with torch.no_grad():
        out = bilm(batch_to_ids(batch))
    layers, mask = out.layers, out.mask.unsqueeze(0).unsqueeze(-1)  # (3, B, T, D), (1, B, T, 1)
    masked_mean = ((layers * mask).sum(2) / mask.sum(2)).numpy()  # (3, B, D)
    masked_max = layers.masked_fill(~mask.bool(), float("-inf")).amax(2).numpy()
    padded_mean = layers.mean(2).numpy()  # what counting the padding would give
    for pooling, manual in (("mean", masked_mean), ("max", masked_max)):
        pooled = list(embedder.embed_sentences(batch, pooling=pooling))
        assert len(pooled) == len(batch)
        for i, vector in enumerate(pooled):
            assert vector.shape == (3, 32) and vector.dtype == np.float32
            np.testing.assert_allclose(vector, manual[:, i], atol=1e-6)
            whole = unpooled[i].mean(axis=1) if pooling == "mean" else unpooled[i].max(axis=1)
            np.testing.assert_allclose(vector, whole, atol=1e-6)
        np.testing.assert_allclose(embedder.embed_sentence(batch[0], pooling=pooling), pooled[0], atol=1e-6)
    shortest = min(range(len(batch)), key=lambda i: len(batch[i]))
    assert not np.allclose(padded_mean[:, shortest], masked_mean[:, shortest], atol=1e-3)
    # padding never counts: a short sentence alone and beside a long one pool the same
    short, long = ["a", "bank", "."], [t for s in batch for t in s][:120]
    for pooling in ("mean", "max"):
        alone = embedder.embed_sentence(short, pooling=pooling)
        together = list(embedder.embed_sentences([long, short], pooling=pooling))[1]
        np.testing.assert_allclose(alone, together, atol=1e-6)
    empty = list(embedder.embed_sentences([short, []], pooling="mean"))[1]
    assert empty.shape == (3, 32) and np.isnan(empty).all()  # no tokens, nothing to pool
    with pytest.raises(ValueError, match=r"^pooling must be one of mean, max \(or None\), got 'sum'$"):
        next(embedder.embed_sentences(batch, pooling="sum"))


def test_cli_embed_pooling_writes_one_row_per_line(tmp_path, capsys):
    lines = ["The bank raised rates .", "", "They sat on the bank of the river .", "The bank raised rates ."]
    source = write_lines(tmp_path / "in.txt", lines)
    model = ["--model", "elmo-tiny-reference", "--mode", "zero", "--quiet"]
    for layers, pooling in (("average", "mean"), ("all", "max")):
        output = tmp_path / f"{layers}-{pooling}.hdf5"
        assert main(["embed", source, str(output), "--layers", layers, "--pooling", pooling, *model]) == 0
        with h5py.File(output) as f:
            assert sorted(f) == ["embedding", "sentence_to_index"]
            rows = f["embedding"][...]
            index = json.loads(f["sentence_to_index"][0])
        assert rows.shape == ((4, 32) if layers == "average" else (4, 3, 32)) and rows.dtype == np.float32
        assert index == {lines[0]: "3", "": "1", lines[2]: "2"}
        assert np.isnan(rows[1]).all() and not np.isnan(rows[[0, 2, 3]]).any()
        embedder = Embedder("elmo-tiny-reference", mode="zero")
        for i in (0, 2, 3):
            vectors = embedder.embed_sentence(lines[i].split())  # (3, n_tokens, 32)
            selected = vectors.mean(axis=0) if layers == "average" else vectors
            expected = selected.mean(axis=-2) if pooling == "mean" else selected.max(axis=-2)
            np.testing.assert_allclose(rows[i], expected, atol=1e-6)
    with pytest.raises(SystemExit) as exit_:
        main(["embed", source, str(tmp_path / "x.hdf5"), "--pooling", "sum", *model])
    assert exit_.value.code == 2
    assert "elmokit: error: argument --pooling: invalid choice: 'sum'" in capsys.readouterr().err


def test_an_empty_sentence_gives_an_empty_array_as_allennlp(bilm, sentences):
    """embed_batch and embed_sentence give (num_layers, 0, dim) for a sentence without tokens,
    alone or among others, and the others' vectors are those of a batch without it."""
    embedder = Embedder(bilm, mode="zero", device="cpu")
    alone = embedder.embed_sentence([])
    assert alone.shape == (3, 0, 32) and alone.dtype == np.float32
    assert [a.shape for a in embedder.embed_batch([[], []])] == [(3, 0, 32)] * 2
    mixed = embedder.embed_batch([sentences[0], [], sentences[1], []])
    plain = embedder.embed_batch([sentences[0], sentences[1]])
    assert [a.shape for a in mixed] == [
        (3, len(sentences[0]), 32),
        (3, 0, 32),
        (3, len(sentences[1]), 32),
    ] + [(3, 0, 32)]
    np.testing.assert_array_equal(mixed[0], plain[0])
    np.testing.assert_array_equal(mixed[2], plain[1])
    with pytest.raises(ValueError, match="empty token"):
        embedder.embed_batch([["a", ""]])


def test_start_state_is_a_buffer_that_moves_and_round_trips(tiny_files):
    """The start state moves with .to(), lives in state_dict, loads from one (also into a model
    without one), and a state dict without it (older, or of a model without one) keeps it."""
    state = LstmState(torch.full((2, 2, 16), 0.25), torch.full((2, 2, 64), -0.5))
    model = BiLM.load(*tiny_files)
    assert model.start_state is None and "start_state_h" not in model.state_dict()
    model.set_start_state(state)
    with pytest.raises(AttributeError):
        model.start_state = state  # set through set_start_state only
    with pytest.raises(ValueError, match=r"^a start state of shapes h \(2, 2, 3\)"):
        model.set_start_state(LstmState(torch.zeros(2, 2, 3), torch.zeros(2, 2, 64)))
    saved = model.state_dict()
    torch.testing.assert_close(saved["start_state_h"], state.h, rtol=0, atol=0)
    torch.testing.assert_close(saved["start_state_c"], state.c, rtol=0, atol=0)
    moved = model.to(torch.float64)
    assert moved.start_state is not None and moved.start_state.h.dtype == torch.float64
    model.to(torch.float32)
    fresh = BiLM.load(*tiny_files)
    fresh.load_state_dict(saved)  # strict: the keys are known once the state is set
    torch.testing.assert_close(fresh.start_state.c, state.c, rtol=0, atol=0)
    ids = batch_to_ids([["a", "b"]])
    torch.testing.assert_close(fresh(ids).layers, model(ids).layers, rtol=0, atol=0)
    older = {k: v for k, v in saved.items() if not k.startswith("start_state_")}
    fresh.load_state_dict(older)  # strict too; the start state stays
    torch.testing.assert_close(fresh.start_state.h, state.h, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="a start state needs both"):
        fresh.load_state_dict({**older, "start_state_h": state.h})


def test_the_hdf5_free_list_switch_turns_the_tuning_off(bilm, tmp_path, monkeypatch):
    """Kernel hdf5_free_lists (on by default) makes embed_file call into libhdf5; off, it does not."""
    from elmokit.base import _hdf5_tuning, kernels

    calls: list[int] = []
    monkeypatch.setattr(_hdf5_tuning, "_limit_free_lists", lambda: calls.append(1) or True)
    source = write_lines(tmp_path / "in.txt", ["a b", "c"])
    embedder = Embedder(bilm, mode="zero", device="cpu")
    embedder.embed_file(source, tmp_path / "on.hdf5", progress=False)
    assert calls == [1]
    with kernels.disabled("hdf5_free_lists"):
        embedder.embed_file(source, tmp_path / "off.hdf5", progress=False)
        assert _hdf5_tuning.apply() is False
    assert calls == [1]
    if HDF5_BYTES_REPEAT:  # else the root group's time stamps may differ
        assert (tmp_path / "on.hdf5").read_bytes() == (tmp_path / "off.hdf5").read_bytes()


def test_embedder_vectors_are_the_models_own_bit_for_bit(bilm, sentences, monkeypatch):
    """The Embedder runs the model's forward (its token cache included), so a batch's vectors
    equal ``bilm(batch_to_ids(batch))``'s exactly, cached or not."""
    embedder = Embedder(bilm, mode="zero", batch_size=8)
    monkeypatch.setattr(bilm.token_encoder, "cache_min_tokens", 1)  # the cache serves this batch too
    batch = sentences[:8]
    for _ in range(2):  # the second time from the model's token cache
        arrays = embedder.embed_batch(batch)
        with torch.no_grad():
            layers = bilm(batch_to_ids(batch), "zero").layers.numpy()
        for i, array in enumerate(arrays):
            assert np.array_equal(array, layers[:, i, : len(batch[i])])
    assert bilm.token_encoder.cache_stats[0] > 0


def test_embedding_runs_in_eval_mode_and_gives_the_model_back_in_its_mode():
    """A model in training mode embeds without dropout and is given back in training mode, each
    submodule as it was; a model in eval mode throughout stays so."""
    from elmokit import BiLM, Embedder
    from elmokit.hub.shipped import TINY_REFERENCE

    bilm = BiLM.from_pretrained(TINY_REFERENCE)
    bilm.lstm.dropout = 0.5  # dropout that would change the vectors if it ran
    expected = Embedder(bilm, mode="zero").embed_sentence(["a", "cat"])
    bilm.train()
    np.testing.assert_array_equal(Embedder(bilm, mode="zero").embed_sentence(["a", "cat"]), expected)
    assert all(m.training for m in bilm.modules())
    bilm.eval()
    Embedder(bilm, mode="zero").embed_sentence(["a", "cat"])
    assert not any(m.training for m in bilm.modules())


def test_a_runner_made_beforehand_embeds_as_the_arguments_do_and_its_recipe_rebuilds_it(bilm, sentences):
    """``Embedder(runner=make_runner(...))`` gives the vectors of ``Embedder(...)`` with the same
    arguments; the runner's recipe pickles, and the runner it rebuilds (a worker's) gives them
    too; a runner with the arguments it replaces is refused."""
    import pickle

    from elmokit.embed.runners import Int8Runner, Recipe, TorchRunner, make_runner

    batch = sentences[:5]
    expected = Embedder(bilm, device="cpu", mode="zero").embed_batch(batch)
    runner = make_runner(bilm, device="cpu")
    assert isinstance(runner, TorchRunner) and runner.bilm is bilm  # already on the CPU: not copied
    assert runner.recipe == Recipe("torch", "float32", None, runner.model_name)
    again = pickle.loads(pickle.dumps(runner.recipe)).build(bilm, "cpu")
    for made in (runner, again):
        got = Embedder(mode="zero", runner=made).embed_batch(batch)
        assert all(np.array_equal(a, b) for a, b in zip(expected, got))
    assert make_runner(bilm, dtype="bf16").recipe.dtype == "bfloat16"  # one name for each dtype
    int8 = make_runner(bilm, dtype="int8")
    assert isinstance(int8, Int8Runner) and int8.recipe.dtype == "int8"
    assert int8.recipe.build(int8.bilm, "cpu").bilm is int8.bilm  # a worker's: quantized once
    with pytest.raises(ValueError, match=r"^a runner holds the model, device, dtype and backend: give them"):
        Embedder(bilm, runner=runner)
