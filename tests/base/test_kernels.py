"""The inference fast paths (kernels, caches, exact shortcuts) equal the plain computations they
replace, and the switch that turns the kernels off."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import warnings

import pytest
import torch

import elmokit.embed.embedder as embed
import elmokit.model.char_cnn as char_cnn
from elmokit import BiLM, batch_to_ids
from elmokit.base import kernels
from elmokit.embed.vectors_file import SentenceIndex
from elmokit.model import lstm
from elmokit.model.char_cnn import distinct_rows
from elmokit.model.lstm import LstmState
from elmokit.model.options import LstmOptions, preset


def test_packed_inference_equals_autograd_path(tiny_sentences):
    torch.manual_seed(0)
    bilm = BiLM(preset("tiny")).eval()
    bilm.set_start_state(LstmState(torch.randn(2, 2, 16) * 0.3, torch.randn(2, 2, 64) * 0.3))
    sentences = [s.split() for s in tiny_sentences[0][:7]]
    sentences[2] = sentences[2] * 9  # long: several windows
    bilm.window = 16
    ids = batch_to_ids(sentences)
    for keep in (False, True):
        with torch.no_grad():
            fast = bilm(ids, keep_sentence_boundaries=keep)
        bilm.requires_grad_(True)
        slow = bilm(ids, keep_sentence_boundaries=keep)  # grad enabled: the autograd path
        assert slow.layers.requires_grad
        torch.testing.assert_close(fast.layers, slow.layers.detach(), atol=1e-6, rtol=0)
        assert torch.equal(fast.mask, slow.mask)


@pytest.mark.parametrize("group_elements", [None, 1])  # 1: a group of steps per step
@pytest.mark.parametrize("projection", [True, False])
def test_lstm_without_autograd_equals_autograd(monkeypatch, group_elements, projection):
    """Without autograd the input side of the gates is computed for groups of steps: the same
    values. Unsorted rows, rows of length 0, final states."""
    if group_elements is not None:
        monkeypatch.setattr(lstm, "INPUT_CHUNK_ELEMENTS", group_elements)
    torch.manual_seed(0)
    options = preset("tiny")["lstm"] | ({} if projection else {"projection_dim": 64})
    model = lstm.BiLstm(16, LstmOptions(**options)).double()
    lengths = torch.tensor([3, 0, 7, 7, 1, 0, 5])
    dim, proj = 64, model.options.projection_dim
    x = torch.randn(2, 7, 7, 16, dtype=torch.float64)
    state = LstmState(
        torch.randn(2, 2, 7, proj, dtype=torch.float64), torch.randn(2, 2, 7, dim, dtype=torch.float64)
    )
    with torch.no_grad():
        out, final = model(x, lengths, state)
    slow_out, slow_final = model(x, lengths, state)  # the parameters require grad: autograd
    assert slow_out.requires_grad
    for a, b in zip([out, *final], [slow_out, *slow_final]):
        torch.testing.assert_close(a, b.detach(), atol=1e-13, rtol=0)
    assert not out[:, :, 1].any() and torch.equal(final.h[:, :, 1], state.h[:, :, 1])


@pytest.mark.parametrize("group_elements", [None, 1])
@pytest.mark.parametrize("projection", [True, False])
def test_lstm_inplace_kernel_equals_plain_steps(monkeypatch, group_elements, projection):
    """Kernel ``lstm_inplace``: the same operations in the same order as the plain step, so the
    same floats: outputs and final states of unsorted rows, rows of length 0, clips reached."""
    if group_elements is not None:
        monkeypatch.setattr(lstm, "INPUT_CHUNK_ELEMENTS", group_elements)
    torch.manual_seed(0)
    options = preset("tiny")["lstm"] | {"cell_clip": 0.5, "proj_clip": 0.2}
    options |= {} if projection else {"projection_dim": 64}
    model = lstm.BiLstm(16, LstmOptions(**options))
    lengths = torch.tensor([3, 0, 9, 9, 1, 0, 5])
    dim, proj = 64, model.options.projection_dim
    x = torch.randn(2, 7, 9, 16) * 3
    state = LstmState(torch.randn(2, 2, 7, proj), torch.randn(2, 2, 7, dim))
    with torch.no_grad():
        assert kernels.enabled("lstm_inplace")
        fast, fast_final = model(x, lengths, state)
        with kernels.disabled("lstm_inplace"):
            plain, plain_final = model(x, lengths, state)
    assert (fast_final.c.abs() == 0.5).any()  # the clips apply
    assert (fast[0].abs() == 0.2).any() or not projection
    for a, b in zip([fast, *fast_final], [plain, *plain_final]):
        assert torch.equal(a, b)


def test_window_matmul_equals_conv1d():
    """The unfolded-window matmul (kernel char_cnn_matmul) against conv1d."""
    torch.manual_seed(0)
    for width, filter_width in [(3, 3), (12, 1), (20, 7), (20, 2)]:
        x = torch.randn(30, 4, width, dtype=torch.float64)
        x[7, :, :] = 0.25  # every window of a row equal
        weight = torch.randn(8, 4, filter_width, dtype=torch.float64)
        bias = torch.randn(8, dtype=torch.float64)
        got = kernels.max_over_windows(x, weight, bias)
        with kernels.disabled("char_cnn_matmul"):
            want = kernels.max_over_windows(x, weight, bias)
        torch.testing.assert_close(got, want, atol=1e-13, rtol=0)
        torch.testing.assert_close(want, torch.nn.functional.conv1d(x, weight, bias).amax(-1), atol=0, rtol=0)


@pytest.mark.parametrize("matmul", [True, False])
def test_max_over_windows_gradients_equal_amax_with_tied_padding_windows(matmul):
    """With autograd the max keeps one index (a scatter backward); amax splits the gradient among
    ties. Tied windows are padding windows with the same characters: the same gradients."""
    torch.manual_seed(0)
    embedding = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(1, 6, (30, 12))
    ids[:, 4:] = 0  # short tokens: the rest is padding (character 0)
    ids[3, :] = 0  # every window of a row equal
    weight = torch.randn(8, 4, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(8, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(30, 8, dtype=torch.float64)

    def gradients(pool):
        x = embedding[ids].transpose(1, 2)
        return torch.autograd.grad((pool(x) * grad).sum(), [embedding, weight, bias])

    with kernels.disabled() if not matmul else contextlib.nullcontext():
        got = gradients(lambda x: kernels.max_over_windows(x, weight, bias))
    want = gradients(lambda x: torch.nn.functional.conv1d(x, weight, bias).amax(-1))
    ties = torch.nn.functional.conv1d(embedding[ids].transpose(1, 2), weight, bias).detach()
    assert (ties == ties.amax(-1, keepdim=True)).sum(-1).max() > 1  # ties occur
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_inference_with_all_kernels_off_equals_on(tiny_sentences):
    torch.manual_seed(0)
    bilm = BiLM(preset("tiny")).eval()
    batches = [batch_to_ids([s.split() for s in group[:5]]) for group in tiny_sentences]
    with torch.no_grad():
        on = [bilm(ids).layers for ids in batches]  # the token cache serves the later batches
        assert bilm.token_encoder.cache_stats[0] > 0
        with kernels.disabled():
            assert not kernels.enabled() and not kernels.enabled("token_cache")
            stats = bilm.token_encoder.cache_stats
            off = [bilm(ids).layers for ids in batches]
            assert bilm.token_encoder.cache_stats == stats  # off: the cache is not used
    assert kernels.enabled()
    for a, b in zip(on, off):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_switch():
    assert kernels.enabled() and all(kernels.enabled(name) for name in kernels.NAMES)
    with kernels.disabled("token_cache"):
        assert not kernels.enabled() and not kernels.enabled("token_cache")
        assert kernels.enabled("sampled_softmax")
        with kernels.disabled():
            assert not any(kernels.enabled(name) for name in kernels.NAMES)
        assert not kernels.enabled("token_cache") and kernels.enabled("char_cnn_matmul")
    assert kernels.enabled()
    kernels.set_enabled(False)
    try:
        assert not any(kernels.enabled(name) for name in kernels.NAMES)
        kernels.set_enabled(True, "token_cache")
        assert kernels.enabled("token_cache") and not kernels.enabled("sampled_softmax")
    finally:
        kernels.set_enabled(True)
    assert kernels.enabled()
    with pytest.raises(ValueError, match="unknown kernel"):
        kernels.enabled("lstm")
    with pytest.raises(ValueError, match="unknown kernel"):
        kernels.set_enabled(False, "fast")


@pytest.mark.parametrize(
    "value, on",
    [
        ("0", []),
        ("1", list(kernels.NAMES)),
        ("token_cache,sampled_softmax", ["sampled_softmax", "token_cache"]),
        ("-token_cache", [n for n in kernels.NAMES if n != "token_cache"]),
    ],
)
def test_switch_from_the_environment(value, on):
    code = "from elmokit.base import kernels; print(','.join(n for n in kernels.NAMES if kernels.enabled(n)))"
    env = {**os.environ, "ELMOKIT_KERNELS": value}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ",".join(n for n in kernels.NAMES if n in on)
    env["ELMOKIT_KERNELS"] = "lstm,-cache"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown kernel cache, lstm" in bad.stderr


@pytest.mark.parametrize("collide", [False, True])
def test_distinct_rows_equals_unique(monkeypatch, collide):
    if collide:  # every row gets the same key: the check must fall back to torch.unique
        monkeypatch.setattr(
            char_cnn, "row_hash_weights", lambda width, n_values: torch.zeros(width, dtype=torch.long)
        )
    ids = torch.randint(0, 4, (300, 6))
    rows, inverse = distinct_rows(ids, 262)
    assert torch.equal(rows[inverse], ids)
    assert len(rows) == len(torch.unique(ids, dim=0))


@pytest.mark.parametrize("collide", [False, True])
def test_sentence_index_equals_the_dict_json(tmp_path, monkeypatch, collide):
    if collide:
        monkeypatch.setattr(embed, "hash", lambda s: len(s) % 3, raising=False)
    rng = random.Random(0)
    words = ["a", "b", "é", '"q"', "back\\slash", "tab\there", "", "日本", "x y"]
    for _ in range(100):
        sentences = [" ".join(rng.choices(words, k=rng.randint(0, 3))) for _ in range(rng.randint(0, 30))]
        expected = {}
        with SentenceIndex(tmp_path) as index:
            for i, sentence in enumerate(sentences):
                expected[sentence] = str(i)
                index.add(sentence)
            assert index.to_json() == json.dumps(expected).encode()


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "torchscript"])
def test_the_shared_lstm_cell_equals_the_plain_step(compiled):
    """``kernels.lstm_cell_``, the cell of the kernel ``lstm_inplace`` and of the int8 steps (which
    TorchScript compiles with it), gives the floats of ``BiLstmLayer._step`` (out of place, for
    autograd): the cell and h, with both clips reached."""
    torch.manual_seed(0)
    options = LstmOptions(**preset("tiny")["lstm"] | {"cell_clip": 0.5, "proj_clip": 0.2})
    layer = lstm.BiLstmLayer(16, options)
    n, dim, proj = 5, options.dim, options.projection_dim
    projected = torch.randn(2, n, 4 * dim) * 3  # the input side of the gates
    c = torch.randn(2, n, dim)
    with torch.no_grad():
        plain_h, plain_c = layer._step(projected, torch.zeros(2, n, proj), c)  # h = 0: gates = projected
    cell = kernels.lstm_cell_
    if compiled:
        with warnings.catch_warnings():  # TorchScript's deprecation
            warnings.simplefilter("ignore", DeprecationWarning)
            cell = torch.jit.script(kernels.lstm_cell_)
    i, j, f, o = projected.clone().chunk(4, dim=-1)
    c_t = c.clone()
    tanh_c = cell(torch.sigmoid(i), torch.sigmoid(f + lstm.FORGET_BIAS), j, c_t, options.cell_clip)
    h = torch.bmm(torch.sigmoid(o) * tanh_c, layer.weight_projection.detach()).clamp(-0.2, 0.2)
    assert (plain_c.abs() == 0.5).any() and (plain_h.abs() == 0.2).any()
    assert torch.equal(c_t, plain_c) and torch.equal(h, plain_h)
