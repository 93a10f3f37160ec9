"""The int8 form of a BiLM on the PyTorch path (elmokit.model.int8, Embedder(dtype="int8"), --dtype int8)."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path
from typing import cast

import h5py
import numpy as np
import pytest
import torch

from elmokit import Embedder, StatefulBiLM
from elmokit.base import kernels
from elmokit.cli import main
from elmokit.hub.shipped import TINY_REFERENCE
from elmokit.model import int8
from elmokit.model.bilm import BiLM
from elmokit.model.char_cnn import CharCNN
from elmokit.model.int8 import (
    FORM,
    Int8BiLstmLayer,
    Int8CharCNN,
    Int8Linear,
    direction_steps,
    is_int8,
    quantize_bilm,
    scripted,
    stacked_filters,
)
from elmokit.model.lstm import BiLstmLayer
from elmokit.model.options import CharCNNOptions
from elmokit.tasks.cache import LayerCache

WORDS = "the a cat dog sat ran on under mat house quickly slowly red blue . , and but".split()


def _sentences(n: int, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    return [[rng.choice(WORDS) for _ in range(rng.randint(1, 14))] for _ in range(n)]


def _cosines(expected: list[np.ndarray], actual: list[np.ndarray]) -> np.ndarray:
    """Per layer, the cosine of every token's vector to its expected one: (num_layers, tokens)."""
    e, a = np.concatenate(expected, axis=1), np.concatenate(actual, axis=1)
    return (e * a).sum(-1) / (np.linalg.norm(e, axis=-1) * np.linalg.norm(a, axis=-1))


@pytest.fixture(scope="module")
def tiny() -> BiLM:
    return BiLM.from_pretrained(TINY_REFERENCE)


def test_int8_form_is_close_to_float32_and_quantizes_every_big_matmul(tiny):
    """Per layer a mean cosine above 0.999 to float32 (minimum above 0.995), the same mask, but
    not the float32 numbers."""
    sentences = _sentences(12)
    q = quantize_bilm(tiny)
    assert is_int8(q) and not is_int8(tiny)
    assert all(isinstance(layer, Int8BiLstmLayer) for layer in q.lstm.layers)
    assert all(
        isinstance(m, Int8Linear)
        for m in [*q.token_encoder.highway.carry, *q.token_encoder.highway.transform]
    )
    assert q.token_encoder.projection is None or isinstance(q.token_encoder.projection, Int8Linear)
    assert isinstance(q.token_encoder.char_cnn, Int8CharCNN)
    assert not any(module.training for module in q.modules())  # eval mode throughout
    ids = tiny.batch_to_ids(sentences)
    with torch.inference_mode():
        expected, actual = tiny(ids), q(ids)
    assert torch.equal(expected.mask, actual.mask)
    assert expected.layers.shape == actual.layers.shape
    mask = expected.mask
    for k in range(expected.layers.shape[0]):
        e, a = expected.layers[k][mask], actual.layers[k][mask]
        cos = torch.nn.functional.cosine_similarity(e, a, dim=-1)
        assert float(cos.mean()) > 0.999 and float(cos.min()) > 0.995, (k, cos.mean(), cos.min())
        assert float((e - a).abs().max()) < 0.2
        assert float((e - a).abs().max()) > 1e-4  # int8, not the float32 path
    for e, a in zip(expected.state, actual.state):
        assert e.shape == a.shape and float((e - a).abs().max()) < 1.0
    assert quantize_bilm(q) is q  # already int8: nothing to do


def _char_ids(lengths: list[int], padding_id: int, max_chars: int, seed: int) -> torch.Tensor:
    """Rows of ``max_chars`` shifted char ids: ``length`` random characters (never the padding
    id), then padding; an all-zero row (no token) for length 0."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max_chars), padding_id)
    for row, length in enumerate(lengths):
        chars = torch.randint(1, 261, (length,), generator=generator)
        ids[row, :length] = torch.where(chars == padding_id, chars + 1, chars)
        if length == 0:
            ids[row] = 0
    return ids


@pytest.mark.parametrize("padding_id", [261, 7])  # bilm-tf's padding character, another's
def test_int8_char_cnn_window_matmul_is_the_convolutions_max(padding_id):
    """The stacked filters' one matmul over max-width windows gives the convolutions' max over
    positions at every token length (float64, the matmul in float64 instead of int8): the
    shortcut loses no window that matters. With int8 the result is within int8 rounding, and the
    longest bucket (no padded tail) is the float32 convolutions' bit for bit."""
    options = CharCNNOptions(embedding_dim=6, filters=((1, 4), (2, 5), (3, 8), (5, 8)), n_highway=1)
    torch.manual_seed(3)
    cnn = CharCNN(options, padding_id).eval()
    with torch.no_grad():
        for conv in cnn.filter_convolutions:
            cast(torch.Tensor, conv.bias).uniform_(-0.5, 0.5)
    lengths = [0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 19, 20, 21, 30, 44, 45, 46, 49, 50, 50]
    ids = _char_ids(lengths, padding_id, options.max_characters_per_token, seed=padding_id)

    double = Int8CharCNN(options, cnn).double()
    weight, bias = stacked_filters(cnn.double(), 5)
    windows = torch.nn.Linear(weight.shape[1], weight.shape[0]).double()
    windows.weight.data, windows.bias.data = weight, bias
    double.windows = windows  # type: ignore[assignment]
    with torch.inference_mode():
        assert torch.allclose(double(ids), cnn(ids), rtol=0, atol=1e-12)
    cnn = cnn.float()

    q = Int8CharCNN(options, cnn)
    with torch.inference_mode():
        expected, actual = cnn(ids), q(ids)
    short = torch.tensor([0 < n <= 20 for n in lengths])
    cos = torch.nn.functional.cosine_similarity(expected[short], actual[short], dim=-1)
    assert float(cos.min()) > 0.999
    assert not torch.equal(expected[short], actual[short])  # int8, not the float32 path
    assert torch.equal(expected[~short], actual[~short])  # the longest bucket, and no token


@pytest.mark.parametrize("n_sentences", [1, 12])
def test_scripted_lstm_steps_equal_the_python_function(tiny, n_sentences):
    """Kernel ``lstm_scripted``: TorchScript compiles ``direction_steps`` and gives the numbers
    Python gives running it, bit for bit, for one row per step and for rows that end."""
    assert isinstance(scripted(direction_steps), torch.jit.ScriptFunction)
    q = quantize_bilm(tiny)
    ids = tiny.batch_to_ids(_sentences(n_sentences, seed=11))
    with torch.inference_mode():
        fast = q(ids, "zero")
        with kernels.disabled("lstm_scripted"):
            plain = q(ids, "zero")
    assert torch.equal(fast.layers, plain.layers)
    assert all(torch.equal(a, b) for a, b in zip(fast.state, plain.state))


def test_steps_run_in_python_where_torchscript_cannot_compile_them(tiny, monkeypatch, caplog):
    def refuse(function):
        raise RuntimeError("no TorchScript here")

    monkeypatch.setattr(int8, "_scripted", {})
    monkeypatch.setattr(torch.jit, "script", refuse)
    with caplog.at_level("INFO", logger="elmokit.model.int8"):
        assert scripted(direction_steps) is direction_steps
    assert (
        "direction_steps runs in Python: TorchScript cannot compile it (no TorchScript here)" in caplog.text
    )
    q = quantize_bilm(tiny)
    ids = tiny.batch_to_ids(_sentences(3, seed=12))
    with torch.inference_mode():
        python = q(ids, "zero").layers
    monkeypatch.undo()
    with torch.inference_mode():
        assert torch.equal(python, q(ids, "zero").layers)


def test_the_model_handed_in_is_not_changed(tiny):
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    cache_before = tiny.token_encoder.cache_stats
    rng_before = torch.random.get_rng_state()
    quantize_bilm(tiny)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # nor torch's random numbers
    embedder = Embedder(tiny, dtype="int8", mode="zero")
    embedder.embed_batch(_sentences(4))
    assert embedder.bilm is not tiny
    assert all(isinstance(layer, BiLstmLayer) for layer in tiny.lstm.layers)
    assert tiny.state_dict().keys() == before.keys()
    assert all(torch.equal(before[k], v) for k, v in tiny.state_dict().items())
    assert tiny.token_encoder.cache_stats == cache_before


def test_stateful_mode_carries_the_int8_state_into_the_next_call(tiny):
    """The second call starts from the state the first one ended in: it equals the int8 model
    run with that state passed explicitly, and differs from a start at zeros."""
    first, second = _sentences(3, seed=1), _sentences(3, seed=2)
    embedder = Embedder(tiny, dtype="int8", mode="stateful", batch_size=3)
    embedder.embed_batch(first)
    carried = embedder.embed_batch(second)
    q = embedder.bilm
    with torch.inference_mode():
        state = q(q.batch_to_ids(first), "zero").state
        expected = q(q.batch_to_ids(second), state)
        from_zero = q(q.batch_to_ids(second), "zero")
    for row, array in enumerate(carried):
        n = len(second[row])
        np.testing.assert_array_equal(array, expected.layers[:, row, :n].numpy())
        assert np.abs(array - from_zero.layers[:, row, :n].numpy()).max() > 1e-3
    # a StatefulBiLM's int8 form carries states itself, as the float32 one does
    stateful = quantize_bilm(StatefulBiLM.from_pretrained(TINY_REFERENCE, stateful=True))
    with torch.inference_mode():
        stateful(stateful.batch_to_ids(first))
        again = stateful(stateful.batch_to_ids(second))
    torch.testing.assert_close(again.layers, expected.layers, rtol=0, atol=0)


def test_int8_embedder_is_close_to_float32_in_warm_mode_and_warns_nothing(tiny):
    sentences = _sentences(20, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch's deprecation warning of quantized tensors stays inside
        embedder = Embedder(tiny, dtype="int8", batch_size=8)
        int8 = list(embedder.embed_sentences(sentences))
    float32 = list(Embedder(tiny, device="cpu", batch_size=8).embed_sentences(sentences))
    cos = _cosines(float32, int8)
    assert (cos.mean(axis=1) > 0.999).all() and (cos.min(axis=1) > 0.995).all(), cos.mean(axis=1)


def test_int8_is_refused_off_the_cpu_and_without_a_quantized_engine(tiny, monkeypatch):
    """Checked before any device is looked for: this machine need not have CUDA."""
    with pytest.raises(
        ValueError, match=r"^dtype int8 runs on the CPU only, not on cuda: pass device='cpu'$"
    ):
        Embedder(tiny, dtype="int8", device="cuda")
    monkeypatch.setattr(type(torch.backends.quantized), "engine", property(lambda self: "none"))
    with pytest.raises(
        ValueError, match=r"^dtype int8 needs PyTorch's quantized engine x86, fbgemm or qnnpack"
    ):
        Embedder(tiny, dtype="int8")


def test_embed_cli_int8_writes_vectors_close_to_float32(tmp_path, capsys):
    sentences = _sentences(10, seed=4)
    text = tmp_path / "in.txt"
    text.write_text("".join(" ".join(s) + "\n" for s in sentences), encoding="utf-8")
    outs = {dtype: tmp_path / f"{dtype}.hdf5" for dtype in ("float32", "int8")}
    for dtype, out in outs.items():
        argv = ["embed", str(text), str(out), "--model", TINY_REFERENCE, "--device", "cpu", "--quiet"]
        assert main([*argv, "--dtype", dtype]) == 0
    with h5py.File(outs["float32"], "r") as f32, h5py.File(outs["int8"], "r") as q:
        assert json.loads(q["sentence_to_index"][0]) == json.loads(f32["sentence_to_index"][0])
        float32 = [f32[str(i)][()] for i in range(len(sentences))]
        int8 = [q[str(i)][()] for i in range(len(sentences))]
    assert [a.shape for a in int8] == [a.shape for a in float32]
    assert _cosines(float32, int8).mean(axis=1).min() > 0.999
    assert max(float(np.abs(a - b).max()) for a, b in zip(float32, int8)) > 1e-4
    capsys.readouterr()
    bad = ["embed", str(text), str(tmp_path / "x.hdf5"), "--model", TINY_REFERENCE, "--quiet"]
    assert main([*bad, "--dtype", "int8", "--device", "cuda"]) == 2
    assert capsys.readouterr().err == (
        "elmokit: error: dtype int8 runs on the CPU only, not on cuda: pass device='cpu'\n"
    )
    assert not (tmp_path / "x.hdf5").exists()


def test_layer_cache_keys_int8_layers_apart(tmp_path):
    sentences = _sentences(5, seed=5)
    float32 = LayerCache(TINY_REFERENCE, tmp_path).layers(sentences, name="toy")
    int8_cache = LayerCache(TINY_REFERENCE, tmp_path, dtype="int8")
    int8 = int8_cache.layers(sentences, name="toy")
    assert int8.created and int8.path != float32.path
    assert int8_cache.key(sentences) != LayerCache(TINY_REFERENCE, tmp_path).key(sentences)
    assert int8_cache.model_identity()["int8_form"] == FORM  # a new int8 form: new keys
    assert "int8_form" not in LayerCache(TINY_REFERENCE, tmp_path).model_identity()
    expected = list(Embedder(TINY_REFERENCE, dtype="int8").embed_sentences(sentences))
    for i, array in enumerate(expected):
        np.testing.assert_allclose(int8[i], array, rtol=0, atol=1e-6)
    assert max(float(np.abs(int8[i] - float32[i]).max()) for i in range(len(sentences))) > 1e-4
    assert not LayerCache(TINY_REFERENCE, tmp_path, dtype="int8").layers(sentences, name="toy").created
    with pytest.raises(
        ValueError, match=r"^the layer cache's dtype must be float32 or int8, got 'bfloat16'$"
    ):
        LayerCache(TINY_REFERENCE, tmp_path, dtype="bfloat16")


def test_task_with_int8_elmo_features_trains_caches_apart_and_reloads(tmp_path, capsys):
    """elmokit task ... --elmo-dtype int8: the layers are the int8 form's, cached under their
    own keys; the reloaded model embeds with int8 too and predicts what was written."""
    from elmokit.tasks import TrainedTask

    from ..tasks.test_tasks import toy_ner, write_conll

    rng = random.Random(7)
    files = {s: write_conll(tmp_path / f"{s}.txt", toy_ner(rng, 8)) for s in ("train", "dev", "test")}
    cache = tmp_path / "cache"
    base = ["task", "ner", "--train", files["train"], "--dev", files["dev"], "--test", files["test"]]
    base += ["--elmo", TINY_REFERENCE, "--epochs", "1", "--hidden", "8", "--cache-dir", str(cache), "--quiet"]
    assert main([*base, "--elmo-dtype", "int8", "--out", str(tmp_path / "int8")]) == 0
    metrics = json.loads((tmp_path / "int8" / "metrics.json").read_text())
    assert metrics["elmo_dtype"] == "int8"
    int8_files = set(cache.glob("*.h5"))
    assert len(int8_files) == 3
    assert main([*base, "--out", str(tmp_path / "float32")]) == 0  # float32 layers: new files
    assert len(set(cache.glob("*.h5")) - int8_files) == 3
    trained = TrainedTask.load(tmp_path / "int8")
    assert trained.config.elmo_dtype == "int8"
    blocks = (tmp_path / "int8" / "test.predictions.txt").read_text().strip().split("\n\n")
    rows = [[line.split() for line in block.splitlines()] for block in blocks]
    assert trained.predict([[r[0] for r in s] for s in rows]) == [[r[2] for r in s] for s in rows]
    capsys.readouterr()
    no_elmo = ["task", "ner", "--train", files["train"], "--dev", files["dev"], "--test", files["test"]]
    assert main([*no_elmo, "--no-elmo", "--elmo-dtype", "int8", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        "elmokit: error: --elmo-dtype int8 applies to a frozen biLM's features "
        "(drop --no-elmo or --fine-tune-elmo)\n"
    )


def test_int8_form_pickles_exactly_and_embeds_a_file_in_two_processes(tiny, tmp_path):
    """The packed int8 weights travel as their int8 values and scales: a pickled copy gives the
    same numbers, and embed_file with processes=2 writes what one process writes."""
    import pickle

    q = quantize_bilm(tiny)
    ids = tiny.batch_to_ids(_sentences(5, seed=8))
    with torch.inference_mode():
        expected, again = q(ids), pickle.loads(pickle.dumps(q))(ids)
    assert torch.equal(expected.layers, again.layers)
    text = tmp_path / "in.txt"
    text.write_text("".join(" ".join(s) + "\n" for s in _sentences(6, seed=9)), encoding="utf-8")
    embedder = Embedder(q, batch_size=2)
    embedder.embed_file(text, tmp_path / "one.hdf5", progress=False)
    embedder.embed_file(text, tmp_path / "two.hdf5", progress=False, processes=2)
    with h5py.File(tmp_path / "one.hdf5", "r") as one, h5py.File(tmp_path / "two.hdf5", "r") as two:
        for i in range(6):
            np.testing.assert_array_equal(one[str(i)][()], two[str(i)][()])


def test_int8_elmoformanylangs_model_is_close_to_float32():
    """An ELMoForManyLangs model (its own padding character, 16 characters a token, a word
    embedding beside the char CNN): the int8 char CNN takes the rows whose tail is padding
    (tokens up to 8 characters here) and the vectors stay close to float32."""
    folder = Path(__file__).parents[1] / "fixtures" / "elmoformanylangs" / "word-model"
    sentences = json.loads((folder / "reference.json").read_text(encoding="utf-8"))["fresh"]["sentences"]
    model = BiLM.from_pretrained(folder)
    float32 = list(Embedder(model, batch_size=3).embed_sentences(sentences))
    embedder = Embedder(model, batch_size=3, dtype="int8")
    cnn = embedder.bilm.token_encoder.char_cnn
    assert isinstance(cnn, Int8CharCNN)
    calls: list[int] = []
    cnn.windows.register_forward_hook(lambda module, inputs, output: calls.append(len(output)))
    cos = _cosines(float32, list(embedder.embed_sentences(sentences)))
    assert len(calls) > 0  # the int8 matmul ran
    # with AVX2's int8 kernels (no AVX-512) the lowest sentence mean was 0.99869; 0.999 held on
    # the AVX-512 machines this test first ran on
    floor = 0.999 if torch.backends.cpu.get_cpu_capability() == "AVX512" else 0.998
    assert cos.mean(axis=1).min() > floor and cos.min() > 0.99, cos
