"""The training paths' hand-written backward passes equal plain autograd on the same arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import elmokit.lstm as lstm_module
from elmokit.char_cnn import CharCNN
from elmokit.characters import tokens_to_ids
from elmokit.lstm import BiLstm, LstmState
from elmokit.options import BiLMOptions, preset
from elmokit.softmax import sampled_softmax_loss


def _lstm_run(monkeypatch, fused: bool, lengths: torch.Tensor, scale: float):
    if not fused:  # the per-step autograd path
        monkeypatch.setattr(lstm_module, "_use_fused_recurrence", lambda *args: False)
    torch.manual_seed(1)
    model = BiLstm(16, BiLMOptions.from_dict(preset("tiny")).lstm).double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    batch = len(lengths)
    x = torch.randn(2, batch, 7, 16, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 2, batch, 16, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(2, 2, batch, 64, dtype=torch.float64, requires_grad=True)
    out, final = model(x, lengths, LstmState(h0, c0))
    if scale > 1.0:  # the clips are active
        ran = lengths > 0
        assert float(out[0].detach().abs().max()) == 3.0  # the first layer has no skip connection
        assert float(final.c[:, :, ran].detach().abs().max()) == 3.0
    g = torch.Generator().manual_seed(2)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=t.dtype)).sum() for t in (out, *final))
    loss.backward()
    grads = [x.grad, h0.grad, c0.grad] + [p.grad for p in model.parameters()]
    return [out.detach(), final.h.detach(), final.c.detach()], grads


@pytest.mark.parametrize("lengths", [[7, 7, 7], [3, 0, 7, 7, 1, 0, 5]])
@pytest.mark.parametrize("scale", [1.0, 8.0])  # 8: the cell and projection clips are active
def test_lstm_recurrence_equals_autograd(monkeypatch, lengths, scale):
    lengths = torch.tensor(lengths)
    values, grads = _lstm_run(monkeypatch, True, lengths, scale)
    ref_values, ref_grads = _lstm_run(monkeypatch, False, lengths, scale)
    for got, want in zip(values, ref_values):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    for got, want in zip(grads, ref_grads):
        assert got is not None
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-11)


def test_pooled_convolutions_equal_autograd():
    torch.manual_seed(0)
    cnn = CharCNN(BiLMOptions.from_dict(preset("tiny")).char_cnn).double()
    with torch.no_grad():  # a PAD embedding that wins the max for some filters
        cnn.embedding.weight[261].fill_(0.8)
    rng = np.random.default_rng(0)
    tokens = ["a", "<S>", "</S>", "aaaa", "abab", "x" * 30, "v" * 48]
    tokens += ["".join(rng.choice(list("abcdefgh"), size=rng.integers(1, 25))) for _ in range(60)]
    ids = torch.cat([tokens_to_ids(tokens), torch.zeros(1, 50, dtype=torch.long)])
    weights = torch.randn(len(ids), cnn.output_dim, dtype=torch.float64)

    # the gradients as one backward pass returns them (short tokens: one length bucket) keep the
    # parameters' own strides, which DDP's gradient buckets need (the width-1 filter's did not)
    params = list(cnn.parameters())
    raw = torch.autograd.grad(cnn(tokens_to_ids(["abc", "de"])).sum(), params)
    assert [g.stride() for g in raw] == [p.stride() for p in params]
    (cnn(ids) * weights).sum().backward()
    got = {name: p.grad.clone() for name, p in cnn.named_parameters()}
    cnn.zero_grad()
    x = cnn.embedding(ids).transpose(1, 2)
    reference = cnn.activation(torch.cat([conv(x).amax(-1) for conv in cnn.convolutions], -1))
    (reference * weights).sum().backward()
    for name, p in cnn.named_parameters():
        torch.testing.assert_close(got[name], p.grad, atol=1e-12, rtol=1e-12, msg=name)
    assert float(got["embedding.weight"][0].abs().sum()) == 0.0  # padding_idx row


def test_sampled_softmax_equals_concatenated_cross_entropy():
    g = torch.Generator().manual_seed(0)
    n, dim, vocab = 30, 8, 50
    hidden = torch.randn(n, dim, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, dim, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(vocab, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 10, (n,), generator=g)
    sampled = torch.randperm(vocab, generator=g)[:12]
    true_q = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    sampled_q = torch.rand(12, generator=g, dtype=torch.float64) + 0.1
    assert (targets[:, None] == sampled[None]).any()

    loss = sampled_softmax_loss(hidden, targets, weight, bias, sampled, true_q, sampled_q)
    upstream = torch.randn(n, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((loss * upstream).sum(), (hidden, weight, bias))

    true_logits = (hidden * weight[targets]).sum(1) + bias[targets] - torch.log(true_q)
    sampled_logits = hidden @ weight[sampled].t() + bias[sampled] - torch.log(sampled_q)
    hits = targets[:, None] == sampled[None]
    sampled_logits = sampled_logits.masked_fill(hits, torch.finfo(torch.float64).min)
    logits = torch.cat([true_logits[:, None], sampled_logits], 1)
    expected = F.cross_entropy(logits, torch.zeros(n, dtype=torch.long), reduction="none")
    want = torch.autograd.grad((expected * upstream).sum(), (hidden, weight, bias))
    torch.testing.assert_close(loss, expected, atol=1e-12, rtol=1e-12)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_sampled_losses_of_groups_equal_one_call_per_group():
    from elmokit.softmax import Softmax

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
