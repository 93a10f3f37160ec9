"""The kernels on the training path equal plain autograd: the same computation with the kernels
on and off (``elmokit.base.kernels``) gives the same values and gradients."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from elmokit.base import kernels
from elmokit.lm.softmax import Softmax, sampled_softmax_loss
from elmokit.model.char_cnn import CharCNN
from elmokit.model.characters import tokens_to_ids
from elmokit.model.options import BiLMOptions, preset


def _switch(on: bool):
    return contextlib.nullcontext() if on else kernels.disabled()


def _char_cnn_run(on: bool, ids: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    cnn = CharCNN(BiLMOptions.from_dict(preset("tiny")).char_cnn).double()
    with torch.no_grad():  # a PAD embedding that wins the max for some filters
        cnn.embedding.weight[261].fill_(0.8)
    with _switch(on):
        out = cnn(ids)
        (out * weights).sum().backward()
    return {"value": out.detach(), **{name: p.grad for name, p in cnn.named_parameters()}}


def test_char_cnn_gradients_equal_with_the_window_matmul_off():
    rng = np.random.default_rng(0)
    tokens = ["a", "<S>", "</S>", "aaaa", "abab", "x" * 30, "v" * 48]
    tokens += ["".join(rng.choice(list("abcdefgh"), size=rng.integers(1, 25))) for _ in range(60)]
    ids = torch.cat([tokens_to_ids(tokens), torch.zeros(1, 50, dtype=torch.long)])
    n_filters = BiLMOptions.from_dict(preset("tiny")).char_cnn.n_filters
    weights = torch.randn(len(ids), n_filters, dtype=torch.float64)
    got, want = _char_cnn_run(True, ids, weights), _char_cnn_run(False, ids, weights)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-12, rtol=1e-12, msg=name)
    assert float(got["embedding.weight"][0].abs().sum()) == 0.0  # padding_idx row


def _sampled_run(on: bool):
    g = torch.Generator().manual_seed(0)
    n, dim, vocab = 30, 8, 50
    hidden = torch.randn(n, dim, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, dim, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(vocab, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 10, (n,), generator=g)
    sampled = torch.randperm(vocab, generator=g)[:12]
    true_q = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    sampled_q = torch.rand(12, generator=g, dtype=torch.float64) + 0.1
    assert (targets[:, None] == sampled[None]).any()  # accidental hits
    with _switch(on):
        loss = sampled_softmax_loss(hidden, targets, weight, bias, sampled, true_q, sampled_q)
    upstream = torch.randn(n, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((loss * upstream).sum(), (hidden, weight, bias))
    if not on:  # the plain path is the cross entropy over the concatenated logits
        true_logits = (hidden * weight[targets]).sum(1) + bias[targets] - torch.log(true_q)
        logits = hidden @ weight[sampled].t() + bias[sampled] - torch.log(sampled_q)
        logits = logits.masked_fill(targets[:, None] == sampled[None], torch.finfo(torch.float64).min)
        logits = torch.cat([true_logits[:, None], logits], 1)
        expected = F.cross_entropy(logits, torch.zeros(n, dtype=torch.long), reduction="none")
        torch.testing.assert_close(loss, expected, atol=0, rtol=0)
    return loss.detach(), grads


def test_sampled_softmax_equals_concatenated_cross_entropy():
    loss, grads = _sampled_run(True)
    want_loss, want_grads = _sampled_run(False)
    torch.testing.assert_close(loss, want_loss, atol=1e-12, rtol=1e-12)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_sampled_losses_of_groups_equal_one_call_per_group():
    g = torch.Generator().manual_seed(0)
    hiddens = [torch.randn(20, 6, generator=g, dtype=torch.float64) for _ in range(2)]
    targets = [torch.randint(0, 30, (20,), generator=g) for _ in range(2)]
    results = []
    for together in (True, False):
        torch.manual_seed(0)
        layer = Softmax(500, 6).double()
        generator = torch.Generator().manual_seed(7)
        if together:
            losses = layer.sampled_losses(hiddens, targets, 40, generator)
        else:
            losses = [layer.sampled_loss(h, t, 40, generator) for h, t in zip(hiddens, targets)]
        sum(loss.sum() for loss in losses).backward()
        results.append((torch.stack(losses).detach(), layer.weight.grad, layer.bias.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_language_model_step_equals_with_kernels_off():
    """A whole training forward and backward (sampled softmax, dropout off) with and without."""
    from elmokit.model.bilm import BiLM

    results = []
    for on in (True, False):
        torch.manual_seed(0)
        bilm = BiLM(preset("tiny")).double().train()
        softmax = Softmax(300, 16).double()
        ids = tokens_to_ids(["the", "cat", "sat", "on", "a", "mat", "x" * 30, "<S>"]).view(2, 4, 50)
        with _switch(on):
            top = bilm(ids).layers[-1]
            hidden = top.reshape(-1, top.shape[-1])[:, :16]
            targets = torch.arange(len(hidden)) * 7 % 300
            loss = softmax.sampled_loss(hidden, targets, 40, torch.Generator().manual_seed(3)).sum()
            loss.backward()
        grads = [p.grad.clone() for p in [*bilm.parameters(), *softmax.parameters()] if p.grad is not None]
        results.append((loss.detach(), grads))
    (loss, grads), (want_loss, want_grads) = results
    torch.testing.assert_close(loss, want_loss, atol=1e-10, rtol=1e-12)
    assert len(grads) == len(want_grads)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)
