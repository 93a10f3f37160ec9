"""The inference fast paths equal the straightforward computations they replace."""

from __future__ import annotations

import json
import random

import pytest
import torch

import elmokit.char_cnn as char_cnn
import elmokit.embed as embed
from elmokit import BiLM, batch_to_ids
from elmokit.char_cnn import distinct_rows
from elmokit.embed import SentenceIndex
from elmokit.lstm import LstmState
from elmokit.options import preset


def test_packed_inference_equals_autograd_path(tiny_sentences):
    torch.manual_seed(0)
    bilm = BiLM(preset("tiny")).eval()
    bilm.start_state = LstmState(torch.randn(2, 2, 16) * 0.3, torch.randn(2, 2, 64) * 0.3)
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
    # the raw LSTM: unsorted rows, rows of length 0, final states
    lengths = torch.tensor([3, 0, 7, 7, 1, 0, 5])
    x = torch.randn(2, 7, 7, 16)
    state = LstmState(torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 64))
    slow_out, slow_final = bilm.lstm(x, lengths, state)
    with torch.no_grad():
        fast_out, fast_final = bilm.lstm(x, lengths, state)
    torch.testing.assert_close(fast_out, slow_out.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(fast_final.h, slow_final.h.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(fast_final.c, slow_final.c.detach(), atol=1e-6, rtol=0)
    assert not fast_out[:, :, 1].any() and torch.equal(fast_final.h[:, :, 1], state.h[:, :, 1])


@pytest.mark.parametrize("collide", [False, True])
def test_distinct_rows_equals_unique(monkeypatch, collide):
    if collide:  # every row gets the same key: the check must fall back to torch.unique
        monkeypatch.setattr(
            char_cnn, "_hash_weights", lambda width, bound, device: torch.zeros(width, dtype=torch.long)
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
