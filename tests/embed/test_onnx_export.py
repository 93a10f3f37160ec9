"""ONNX export (elmokit export-onnx, elmokit.embed.onnx_export) and the onnxruntime backend of the Embedder:
the exported graph against the PyTorch model (batch 1, 7 and 64; lengths 1 to 600; the tiny
reference model, a random original-shape model with a start state, an ELMoForManyLangs model),
state carried over calls, the scan form of the LSTM against the packed one, and the files it
refuses."""

from __future__ import annotations

import random
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmokit import Embedder, StatefulBiLM
from elmokit.cli import main
from elmokit.model.bilm import BiLM
from elmokit.model.lstm import LstmState
from elmokit.model.options import preset
from elmokit.model.scan_lstm import scan_bilstm

from ..conftest import FIXTURES, TINY

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from elmokit.embed.onnx_export import OnnxBiLM, export_onnx  # noqa: E402

ATOL = 1e-5


def _words() -> list[str]:
    import json

    groups = json.loads((TINY / "sentences.json").read_text())
    return [token for group in groups for sentence in group for token in sentence.split()]


WORDS = _words()


def _sentences(lengths: list[int], seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    return [[rng.choice(WORDS) for _ in range(n)] for n in lengths]


def _close(expected: torch.Tensor, actual: torch.Tensor, what: str) -> None:
    assert expected.shape == actual.shape, what
    error = float((expected.float() - actual.float()).abs().max()) if expected.numel() else 0.0
    assert error <= ATOL, f"{what}: max error {error:.3g}"


def _same_output(expected, actual, what: str) -> None:
    _close(expected.layers, actual.layers, f"{what} layers")
    assert torch.equal(expected.mask, actual.mask), f"{what} mask"
    _close(expected.state.h, actual.state.h, f"{what} final h")
    _close(expected.state.c, actual.state.c, f"{what} final c")


@pytest.fixture(scope="module")
def tiny() -> BiLM:
    return BiLM.load(TINY / "options.json", TINY / "lm_weights.hdf5")


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory) -> Path:
    """The tiny reference model exported by the command line."""
    out = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    assert main(["export-onnx", str(TINY), str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def tiny_runtime(tiny, tiny_onnx) -> OnnxBiLM:
    return OnnxBiLM(tiny_onnx, tiny)


# -- the scan form of the LSTM (no onnx needed) -------------------------------------------------


@pytest.mark.parametrize("shape", ["tiny", "small"])
def test_scan_form_equals_the_packed_lstm_clips_binding(shape):
    """scan_bilstm (what is exported) gives BiLstm's outputs and final states, rows of any length
    and a given state, with weights large enough that both clips bind."""
    torch.manual_seed(0)
    bilm = BiLM(preset(shape)).eval()
    lstm = bilm.lstm
    with torch.no_grad():
        for layer in lstm.layers:
            layer.weight_projection.mul_(3.0)
    lengths = torch.tensor([9, 1, 4, 9, 6])
    batch, steps, dim = len(lengths), 9, lstm.options.projection_dim
    inputs = torch.randn(2, batch, steps, dim)
    mask = torch.arange(steps).unsqueeze(0) < lengths.unsqueeze(1)
    zero = lstm.zero_state(batch)
    state = LstmState(torch.randn_like(zero.h), 4 * torch.randn_like(zero.c))
    with torch.no_grad():
        expected, final = lstm(inputs, lengths, state)
        actual, scanned = scan_bilstm(lstm, inputs, mask, state)
    assert float((expected.abs() >= 3.0 - 1e-6).float().mean()) > 0.01  # the projection clip binds
    assert float(final.c.abs().max()) == 3.0  # the cell clip binds
    _close(expected, actual, "outputs")
    _close(final.h, scanned.h, "final h")
    _close(final.c, scanned.c, "final c")


# -- the exported graph --------------------------------------------------------------------------


def test_export_onnx_writes_one_scan_per_layer_with_dynamic_shapes(tiny_onnx, capsys):
    model = onnx.load(str(tiny_onnx))
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("Scan") == 2  # one per LSTM layer, both directions in each
    assert "Loop" not in ops
    inputs = {i.name: i for i in model.graph.input}
    assert list(inputs) == ["char_ids", "initial_h", "initial_c"]
    dims = inputs["char_ids"].type.tensor_type.shape.dim
    assert all(d.dim_param and not d.dim_value for d in dims)  # batch, length, characters used
    assert {i.name for i in model.graph.initializer} >= {"initial_h", "initial_c"}  # optional inputs
    assert [o.name for o in model.graph.output] == ["layers", "mask", "final_h", "final_c"]
    metadata = {p.key: p.value for p in model.metadata_props}
    assert metadata["elmokit.format"] == "elmokit-bilm-1" and len(metadata["elmokit.fingerprint"]) == 64


def test_export_onnx_refuses_to_replace_a_file_unless_told(tiny_onnx, tmp_path, capsys):
    out = tmp_path / "exists.onnx"
    out.write_bytes(b"keep me")
    assert main(["export-onnx", str(TINY), str(out)]) == 2
    assert capsys.readouterr().err == (
        f"elmokit: error: {out} exists; pass overwrite=True (--overwrite) to replace it\n"
    )
    assert out.read_bytes() == b"keep me"
    assert main(["export-onnx", str(TINY), str(tmp_path / "missing" / "x.onnx")]) == 2
    assert (
        capsys.readouterr().err == f"elmokit: error: output folder does not exist: {tmp_path / 'missing'}\n"
    )


def test_onnxruntime_matches_pytorch_batch_1_7_64_lengths_1_to_600(tiny, tiny_runtime):
    """Within 1e-5 of BiLM.forward: layers, mask and final state, from the start state held in the
    file, from zeros and from a given state, for lengths 1 to 600 (beyond the PyTorch path's window
    of 512, so that path windows and the graph does not)."""
    batches = {
        1: [[1], [600]],
        7: [[3, 1, 17, 2, 40, 9, 5]],
        64: [sorted({1 + (599 * i) // 63 for i in range(64)}, reverse=True)],
    }
    torch.manual_seed(1)
    for batch, runs in batches.items():
        for lengths in runs:
            sentences = _sentences(lengths, seed=batch)
            if batch == 7:  # a token of 60 bytes (cut to 48) needs every character position
                sentences[4][7] = "x" * 60
            ids = tiny.batch_to_ids(sentences)
            zero = tiny.zero_state(batch)
            given = LstmState(torch.randn_like(zero.h), torch.randn_like(zero.c))
            for state in (None, "zero", given) if sum(lengths) < 100 else (given,):
                with torch.no_grad():
                    expected = tiny(ids, state)
                actual = tiny_runtime(ids, state)
                _same_output(expected, actual, f"batch {batch}, lengths {lengths[:3]}, state {type(state)}")
            if batch < 64:  # the runtime feeds only the characters needed; the full width gives the same
                full = tiny_runtime.session.run(["layers"], {"char_ids": ids.numpy()})[0]
                _close(expected_none(tiny, ids).layers, torch.from_numpy(full), f"batch {batch}, full width")


def expected_none(bilm: BiLM, ids: torch.Tensor):
    with torch.no_grad():
        return bilm(ids)


def test_the_runtime_feeds_only_the_characters_a_batch_needs(tiny, tiny_runtime, monkeypatch):
    widths = []
    run = tiny_runtime.session.run

    def recording(names, feeds):
        widths.append(feeds["char_ids"].shape[-1])
        return run(names, feeds)

    monkeypatch.setattr(tiny_runtime.session, "run", recording)
    for sentence in (["a", "to"], ["abcdefghij"], ["y" * 60]):
        ids = tiny.batch_to_ids([sentence, ["b"]])
        _same_output(expected_none(tiny, ids), tiny_runtime(ids), str(sentence))
    # 2 bytes + begin and end of word = 4 characters, +5 (the widest filter) = 9; 10 bytes: 17; 60: all 50
    assert widths == [9, 17, 50]


@pytest.fixture(scope="module")
def original() -> tuple[BiLM, OnnxBiLM]:
    """A random model of the original shape (4096 / 512, 2 highway layers) with a start state."""
    torch.manual_seed(2)
    bilm = BiLM(preset("original"))
    assert bilm.training
    bilm.set_start_state(LstmState(0.3 * torch.randn(2, 2, 512), torch.randn(2, 2, 4096)))
    runtime = OnnxBiLM(export_onnx(bilm), bilm)  # exported in eval mode (no dropout) ...
    assert bilm.training and bilm.lstm.training  # ... and given back in the mode it had
    return bilm.eval(), runtime


@pytest.mark.parametrize("lengths", [[1], [16], [5, 1, 9, 3, 8, 2, 6]])
def test_original_shape_matches_with_the_start_state_inside(original, lengths):
    """Warm mode: the graph starts every row from the model's start state held in the file."""
    bilm, runtime = original
    ids = bilm.batch_to_ids(_sentences(lengths, seed=len(lengths)))
    with torch.no_grad():
        expected = bilm(ids)
        zeros = bilm(ids, "zero")
    assert float((expected.layers - zeros.layers).abs().max()) > 1e-2  # the start state matters
    _same_output(expected, runtime(ids), f"original shape, lengths {lengths}")


def test_state_carried_over_three_calls_equals_stateful_bilm(tiny, tiny_onnx):
    """Stateful mode through onnxruntime (batches of 3, 2 then 3 rows: rows beyond a smaller
    batch keep their states) equals StatefulBiLM's three calls, row for row."""
    stateful = StatefulBiLM.load(TINY / "options.json", TINY / "lm_weights.hdf5", stateful=True)
    embedder = Embedder(tiny, batch_size=3, mode="stateful", backend="onnxruntime", onnx_file=tiny_onnx)
    for k, lengths in enumerate([[4, 9, 2], [6, 3], [5, 5, 11]]):
        sentences = _sentences(lengths, seed=10 + k)
        with torch.no_grad():
            expected = stateful(stateful.batch_to_ids(sentences)).layers
        actual = embedder.embed_batch(sentences)
        for row, n in enumerate(lengths):
            _close(expected[:, row, :n], torch.from_numpy(actual[row]), f"call {k}, row {row}")
    runtime = OnnxBiLM(tiny_onnx, tiny)  # the state passed by hand: the same three calls
    stateful.reset_states()
    state = "zero"
    for k in range(3):
        ids = tiny.batch_to_ids(_sentences([7, 2, 5], seed=20 + k))
        with torch.no_grad():
            expected = stateful(ids)
        actual = runtime(ids, state)
        _same_output(expected, actual, f"call {k}")
        state = actual.state


@pytest.mark.filterwarnings("ignore:the model has no start state")
@pytest.mark.parametrize("mode", ["warm", "zero", "stateful"])
def test_embedder_backend_onnxruntime_gives_the_torch_backends_vectors(tiny, tiny_onnx, mode):
    sentences = _sentences([5, 1, 30, 2, 8, 13, 3, 7, 1, 21], seed=3)
    sentences.insert(4, [])  # an empty sentence gives an empty array on both backends
    kwargs = {"batch_size": 3, "mode": mode, "max_tokens_per_batch": 40}
    expected = list(Embedder(tiny, **kwargs).embed_sentences(sentences))
    embedder = Embedder(tiny, backend="onnxruntime", onnx_file=tiny_onnx, **kwargs)
    actual = list(embedder.embed_sentences(sentences))
    assert len(actual) == len(expected)
    for i, (e, a) in enumerate(zip(expected, actual)):
        assert a.dtype == np.float32 and a.shape == e.shape, i
        _close(torch.from_numpy(e), torch.from_numpy(a), f"sentence {i}")
    if mode != "stateful":  # (a stateful embedder's next sentence starts where the last ended)
        pooled = embedder.embed_sentence(sentences[2], pooling="mean")
        _close(torch.from_numpy(expected[2].mean(axis=1)), torch.from_numpy(pooled), "pooled")


def test_manylangs_model_through_onnxruntime_gives_elmoformanylangs_numbers():
    """An ELMoForManyLangs model (word embedding beside the char CNN, its own char ids) exported in
    memory by the Embedder gives the numbers ELMoForManyLangs computed for each sentence alone."""
    import json

    folder = FIXTURES / "elmoformanylangs" / "word-model"
    reference = json.loads((folder / "reference.json").read_text(encoding="utf-8"))
    arrays = np.load(folder / "reference.npz")
    sentences = reference["fresh"]["sentences"]
    embedder = Embedder(BiLM.from_pretrained(folder), batch_size=3, backend="onnxruntime")
    for i, array in enumerate(embedder.embed_sentences(sentences)):
        _close(torch.from_numpy(arrays[f"fresh/{i}"]), torch.from_numpy(array), f"sentence {i}")


def test_cli_embed_backend_onnxruntime_writes_the_torch_backends_file(tiny_onnx, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("The cat sat on the mat .\n\nHello world\n" + " ".join(WORDS[:80]) + "\n")
    common = ["--model", str(TINY), "--quiet", "--batch-size", "2"]
    assert main(["embed", str(source), str(tmp_path / "torch.hdf5"), *common]) == 0
    onnx_args = ["--backend", "onnxruntime", "--onnx", str(tiny_onnx)]
    assert main(["embed", str(source), str(tmp_path / "onnx.hdf5"), *common, *onnx_args]) == 0
    with h5py.File(tmp_path / "torch.hdf5") as expected, h5py.File(tmp_path / "onnx.hdf5") as actual:
        assert sorted(expected) == sorted(actual) == ["0", "1", "2", "3", "sentence_to_index"]
        assert expected["sentence_to_index"][0] == actual["sentence_to_index"][0]
        for name in ("0", "1", "2", "3"):
            _close(torch.from_numpy(expected[name][()]), torch.from_numpy(actual[name][()]), name)


# -- what is refused ------------------------------------------------------------------------------


def test_a_file_of_other_weights_is_refused_in_one_line(tiny, tiny_onnx, tmp_path, capsys):
    other = BiLM(preset("tiny")).eval()
    with pytest.raises(ValueError, match=r"was exported from other weights than the model given"):
        Embedder(other, backend="onnxruntime", onnx_file=tiny_onnx)
    changed = BiLM.load(TINY / "options.json", TINY / "lm_weights.hdf5")
    changed.set_start_state(LstmState(torch.full((2, 2, 16), 0.5), torch.zeros(2, 2, 64)))  # weights alike
    with pytest.raises(ValueError, match=r"exported from other weights"):
        OnnxBiLM(tiny_onnx, changed)


@pytest.mark.parametrize("content", ["text", "truncated", "other-onnx"])
def test_files_that_are_not_an_export_are_named_in_one_line(tiny_onnx, tmp_path, capsys, content):
    source = tmp_path / "in.txt"
    source.write_text("a b c\n")
    bad = tmp_path / "bad.onnx"
    if content == "text":
        bad.write_text("not a model\n")
        cause = "not an ONNX file"
    elif content == "truncated":
        bad.write_bytes(tiny_onnx.read_bytes()[:4000])
        cause = "not an ONNX file"
    else:
        model = onnx.load(str(tiny_onnx))
        del model.metadata_props[:]
        bad.write_bytes(model.SerializeToString())
        cause = "not an ONNX file exported by elmokit export-onnx"
    output = tmp_path / "out.hdf5"
    args = ["embed", str(source), str(output), "--model", str(TINY), "--quiet"]
    assert main([*args, "--backend", "onnxruntime", "--onnx", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"elmokit: error: {bad}: {cause}") and err.count("\n") == 1, err
    assert not output.exists()
    assert main([*args, "--backend", "onnxruntime", "--onnx", str(tmp_path / "none.onnx")]) == 2
    assert capsys.readouterr().err == f"elmokit: error: ONNX file not found: {tmp_path / 'none.onnx'}\n"
    assert main([*args, "--backend", "onnxruntime", "--onnx", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"elmokit: error: {tmp_path} is a folder, not an ONNX file\n"
    assert main([*args, "--onnx", str(bad)]) == 2  # an ONNX file without the onnxruntime backend
    assert "runs on the onnxruntime backend: pass backend='onnxruntime'" in capsys.readouterr().err


def test_without_the_onnx_extra_the_commands_say_what_to_install(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if it were not installed
    out = tmp_path / "x.onnx"
    assert main(["export-onnx", str(TINY), str(out)]) == 2
    assert capsys.readouterr().err == (
        "elmokit: error: export-onnx needs the package onnxruntime: pip install 'elmokit[onnx]'\n"
    )
    assert not out.exists()


def test_unsupported_settings_are_refused(tiny, tiny_runtime):
    with pytest.raises(ValueError, match=r"^backend must be torch or onnxruntime, got 'tvm'$"):
        Embedder(tiny, backend="tvm")
    with pytest.raises(ValueError, match=r"^backend onnxruntime runs on the CPU in float32 or int8"):
        Embedder(tiny, backend="onnxruntime", dtype="bfloat16")
    with pytest.raises(ValueError, match=r"^onnx_file x.onnx runs on the onnxruntime backend: pass backend="):
        Embedder(tiny, onnx_file="x.onnx")  # never silently ignored
    ids = tiny.batch_to_ids([["a", "b"], ["c"]])
    zero = tiny.zero_state(3)
    with pytest.raises(ValueError, match=r"^state has 3 rows for a batch of 2$"):
        tiny_runtime(ids, zero)
    with pytest.raises(ValueError, match=r"^state must be an LstmState, None or 'zero', got 'warm'$"):
        tiny_runtime(ids, "warm")


# -- int8 -----------------------------------------------------------------------------------------


def _cosines(expected: list[np.ndarray], actual: list[np.ndarray]) -> np.ndarray:
    """Per layer, the cosine of every token's int8 vector to its float32 one: (num_layers, tokens)."""
    a, b = np.concatenate(expected, axis=1), np.concatenate(actual, axis=1)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_int8_export_quantizes_the_lstm_steps_and_stays_close(tiny, tiny_onnx, tmp_path, capsys):
    """export-onnx --int8: the matmuls inside the Scans become int8 (MatMulInteger); its vectors
    stay close to float32 but are not exact (opt-in only); a float32 file runs as int8 when asked,
    and an int8 file is refused as float32."""
    out = tmp_path / "tiny-int8.onnx"
    assert main(["export-onnx", str(TINY), str(out), "--int8"]) == 0
    assert capsys.readouterr().err == f"wrote {out} ({out.stat().st_size:,} bytes)\n"  # no quantizer advice
    model = onnx.load(str(out))
    scans = [node for node in model.graph.node if node.op_type == "Scan"]
    body_ops = {n.op_type for scan in scans for a in scan.attribute if a.name == "body" for n in a.g.node}
    assert "MatMulInteger" in body_ops and "MatMul" not in body_ops
    assert {p.key: p.value for p in model.metadata_props}["elmokit.dtype"] == "int8"
    sentences = _sentences([12, 3, 30, 7], seed=5)
    expected = list(Embedder(tiny, mode="zero").embed_sentences(sentences))
    int8 = list(
        Embedder(tiny, mode="zero", backend="onnxruntime", dtype="int8", onnx_file=out).embed_sentences(
            sentences
        )
    )
    cosines = _cosines(expected, int8)
    assert cosines.min() > 0.99 and cosines.mean() > 0.999
    assert max(float(np.abs(e - a).max()) for e, a in zip(expected, int8)) > 1e-4  # not the float32 path
    quantized_here = Embedder(tiny, mode="zero", backend="onnxruntime", dtype="int8", onnx_file=tiny_onnx)
    for e, a in zip(int8, quantized_here.embed_sentences(sentences)):
        np.testing.assert_array_equal(e, a)
    with pytest.raises(ValueError, match=r"is an int8 export: pass dtype='int8' to run it$"):
        Embedder(tiny, backend="onnxruntime", onnx_file=out)
