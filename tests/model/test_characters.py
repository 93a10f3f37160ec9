from __future__ import annotations

import re

import pytest
import torch

from elmokit import batch_to_ids
from elmokit.model.characters import token_to_ids, tokens_to_ids


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
    with pytest.raises(
        TypeError, match=r"^expected a list of sentences, each a list of str tokens, .*; got str$"
    ):
        batch_to_ids("hello")


EXPECTED = re.escape("expected a list of sentences, each a list of str tokens, e.g. [['Hello', 'world']]")


@pytest.mark.parametrize(
    "sentences, message",
    [
        ([None], r"^sentence 0 is NoneType, not a list of tokens; " + EXPECTED + "$"),
        ([["a"], 7], r"^sentence 1 is int, not a list of tokens; "),
        ([[["a", "b"]]], r"^sentence 0, token 0 is list, not a str: \['a', 'b'\]; " + EXPECTED + "$"),
        ([["a", None]], r"^sentence 0, token 1 is NoneType, not a str: None; "),
        ([["a", b"b"]], r"^sentence 0, token 1 is bytes, not a str: b'b'; "),
        (None, r"^expected a list of sentences, .*; got NoneType$"),
    ],
)
def test_batch_to_ids_names_what_it_expects(sentences, message):
    with pytest.raises(TypeError, match=message):
        batch_to_ids(sentences)


def test_bilm_refuses_padding_between_tokens_and_ids_out_of_range(tiny_files):
    """An all-zero token is padding: between real tokens it would shift them (lengths count the
    real tokens, </S> would overwrite the last one), so the biLM refuses it and names it."""
    from elmokit import BiLM

    bilm = BiLM.load(*tiny_files)
    ids = batch_to_ids([["a", "b", "c"], ["d", "e", "f"]])
    ids[1, 1] = 0
    with pytest.raises(
        ValueError,
        match=r"^char_ids row 1 has an all-zero \(padding\) token at position 1 before a real token at position 2;",
    ):
        bilm(ids)
    ids[1, 1] = 300
    with pytest.raises(ValueError, match=r"^char_ids must lie in 0\.\.261 .*, found 300$"):
        bilm(ids)
    with pytest.raises(ValueError, match=r"must hold integer ids .*, got torch.float32$"):
        bilm(batch_to_ids([["a"]]).float())
    trailing = batch_to_ids([["a", "b", "c"], ["d"]])  # padding after the last token is fine
    with torch.no_grad():
        assert bilm(trailing).mask.tolist() == [[True] * 3, [True, False, False]]


@pytest.mark.parametrize("max_chars", [50, 3, 7])
def test_the_ids_of_a_token_list_are_each_tokens_own(max_chars):
    """``tokens_to_ids`` (array operations over the joined bytes) gives ``token_to_ids`` + 1 for
    every kind of token: multi-byte and 0xFF bytes, cut tokens, <S> and </S>, a lone surrogate
    (no bytes), and a token whose cut ends inside a character."""
    tokens = ["a", "hé", "日本語", "\x00", "\xff", "ÿ" * 30, "<S>", "</S>", "\ud800", "x" * 60, "😀" * 3]
    expected = torch.tensor([token_to_ids(t, max_chars) for t in tokens]) + 1
    assert torch.equal(tokens_to_ids(tokens, max_chars), expected)
    assert tokens_to_ids([], max_chars).shape == (0, max_chars)
    with pytest.raises(TypeError, match="a token must be a str, got int: 3"):
        tokens_to_ids(["a", 3], max_chars)  # type: ignore[list-item]
