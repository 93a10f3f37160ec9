"""The downstream module and the scalar mix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elmokit import BiLM, Elmo, ScalarMix, batch_to_ids


def test_elmo_with_fixed_mix_equals_hand_computed_mix(tiny_files, tiny_sentences):
    sentences = [s.split() for s in tiny_sentences[1][:4]]
    weights = [0.5, -1.0, 2.0]
    elmo = Elmo(*tiny_files, num_output_representations=2, dropout=0.0, scalar_mix_parameters=weights).eval()
    bilm = BiLM.load(*tiny_files)
    ids = batch_to_ids(sentences)
    with torch.no_grad():
        out = elmo(ids)
        layers = bilm(ids).layers.numpy()
    s = np.exp(weights) / np.exp(weights).sum()
    expected = sum(s[j] * layers[j] for j in range(3))
    assert len(out.representations) == 2
    for rep in out.representations:
        assert rep.shape == (4, max(map(len, sentences)), 32)
        np.testing.assert_allclose(rep.numpy(), expected, atol=1e-6)
    assert out.mask.sum(1).tolist() == [len(s) for s in sentences]
    mix = elmo.scalar_mixes[0]
    assert not mix.scalar_parameters.requires_grad and mix.gamma.requires_grad
    assert not any(p.requires_grad for p in elmo.bilm.parameters())


def test_elmo_trains_mix_and_can_unfreeze_bilm(tiny_files):
    elmo = Elmo(*tiny_files, num_output_representations=1, dropout=0.0, requires_grad=True)
    out = elmo(batch_to_ids([["hello", "world"]]))
    out.representations[0].sum().backward()
    assert elmo.scalar_mixes[0].scalar_parameters.grad is not None
    assert elmo.bilm.token_encoder.char_cnn.embedding.weight.grad is not None


def test_elmo_from_bilm_and_keep_boundaries(tiny_files):
    bilm = BiLM.load(*tiny_files)
    elmo = Elmo(bilm=bilm, num_output_representations=1, keep_sentence_boundaries=True, dropout=0.0)
    out = elmo(batch_to_ids([["a", "b", "c"]]))
    assert out.representations[0].shape == (1, 5, 32) and out.mask.sum() == 5
    with pytest.raises(ValueError, match="not both"):
        Elmo(*tiny_files, num_output_representations=1, bilm=bilm)
    with pytest.raises(ValueError, match="options_file and weight_file"):
        Elmo(num_output_representations=1)


def test_scalar_mix_layer_norm_uses_whole_batch_statistics():
    torch.manual_seed(0)
    layers = torch.randn(3, 2, 4, 5)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    mix = ScalarMix(3, do_layer_norm=True, initial_scalar_parameters=[1.0, 2.0, 3.0])
    with torch.no_grad():
        mix.gamma.fill_(0.7)
        got = mix(layers, mask).numpy()
    x, m = layers.numpy().astype(np.float64), mask.numpy()[..., None]
    s = np.exp([1.0, 2.0, 3.0]) / np.exp([1.0, 2.0, 3.0]).sum()
    expected = 0
    for j in range(3):
        vals = x[j][np.broadcast_to(m, x[j].shape)]
        expected = expected + s[j] * (x[j] - vals.mean()) / np.sqrt(vals.var() + 1e-12)
    np.testing.assert_allclose(got, 0.7 * expected, atol=1e-5)


def test_scalar_mix_l2_penalty_and_errors():
    mix = ScalarMix(3, initial_scalar_parameters=[1.0, -2.0, 0.5])
    assert mix.l2_penalty().item() == pytest.approx(1 + 4 + 0.25)
    assert mix.scalar_parameters.requires_grad and mix.gamma.requires_grad
    frozen = ScalarMix(2, trainable=False, gamma_trainable=False)
    assert not frozen.scalar_parameters.requires_grad and not frozen.gamma.requires_grad
    with pytest.raises(ValueError, match="2 values for 3 layers"):
        ScalarMix(3, initial_scalar_parameters=[1.0, 2.0])
    with pytest.raises(ValueError, match="got 2 layers"):
        mix([torch.zeros(1, 1, 1)] * 2)
    with pytest.raises(ValueError, match="needs the mask"):
        ScalarMix(1, do_layer_norm=True)([torch.zeros(1, 1, 1)])


def test_scalar_mix_parameters_are_plain_parameters():
    mix = ScalarMix(3)
    names = dict(mix.named_parameters())
    assert set(names) == {"scalar_parameters", "gamma"}
    assert all(type(p) is torch.nn.Parameter for p in names.values())


def test_scalar_mix_layer_norm_of_an_all_masked_batch_is_zero_not_nan():
    mix = ScalarMix(3, do_layer_norm=True)
    out = mix(torch.randn(3, 2, 4, 5), torch.zeros(2, 4, dtype=torch.bool))
    assert torch.equal(out, torch.zeros(2, 4, 5))
