from __future__ import annotations

import pytest
import torch

from elmokit import batch_to_ids
from elmokit.characters import token_to_ids


def test_token_ids_wrap_bytes_and_pad():
    ids = token_to_ids("hé")  # UTF-8: 0x68, 0xC3, 0xA9
    assert ids[:5] == (258, 104, 195, 169, 259)
    assert set(ids[5:]) == {260} and len(ids) == 50


def test_boundary_tokens():
    assert token_to_ids("<S>")[:4] == (258, 256, 259, 260)
    assert token_to_ids("</S>")[:4] == (258, 257, 259, 260)


def test_long_token_keeps_first_48_bytes():
    ids = token_to_ids("a" * 49 + "b")
    assert ids[0] == 258 and ids[49] == 259 and ids[1:49] == (97,) * 48


def test_batch_to_ids_shifts_and_pads():
    ids = batch_to_ids([["a", "bc"], ["d"]])
    assert ids.shape == (2, 2, 50) and ids.dtype == torch.long
    assert ids[0, 1, :5].tolist() == [259, 99, 100, 260, 261]
    assert ids[1, 1].sum() == 0 and ids[1, 0, 1] == ord("d") + 1


def test_batch_to_ids_errors():
    with pytest.raises(ValueError, match="empty sentence list"):
        batch_to_ids([])
    with pytest.raises(ValueError, match="sentence 1: empty token"):
        batch_to_ids([["a"], ["b", ""]])
    with pytest.raises(TypeError, match="sentence 0 is a str"):
        batch_to_ids(["hello world"])
    with pytest.raises(TypeError, match="list of token lists"):
        batch_to_ids("hello")
