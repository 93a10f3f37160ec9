"""The biLM against the activations computed by the original TensorFlow code, and its modes."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from elmokit import BiLM, batch_to_ids

from ..conftest import TINY
from ..reference import reference_layers


@pytest.fixture()
def stateful_bilm(tiny_files) -> BiLM:
    return BiLM.load(*tiny_files, stateful=True)


@pytest.fixture(scope="module")
def bilm(tiny_files) -> BiLM:
    return BiLM.load(*tiny_files)


def test_reproduces_bilm_tf_top_layer_through_10_stateful_batches(stateful_bilm, tiny_sentences):
    expected = [h5py.File(TINY / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    with torch.no_grad():
        for i in range(10):
            batch = [tiny_sentences[k][i].split() for k in range(3)]
            out = stateful_bilm(batch_to_ids(batch))
            lengths = [len(s) for s in batch]
            assert out.layers.shape == (3, 3, max(lengths), 32)
            assert out.mask.sum(dim=1).tolist() == lengths
            for k, n in enumerate(lengths):
                ref = expected[k][str(i)][...]  # (2, n, 16): forward, backward
                top = out.layers[2, k, :n].numpy()
                np.testing.assert_allclose(top, np.concatenate([ref[0], ref[1]], -1), atol=1e-6)
                assert not out.layers[:, k, n:].any(), "padding positions must be zero"


def test_stateful_rows_beyond_a_smaller_batch_keep_their_state(tiny_files, tiny_sentences):
    s = [x.split() for x in tiny_sentences[0]]
    a = BiLM.load(*tiny_files, stateful=True)
    with torch.no_grad():
        a(batch_to_ids([s[0], s[1], s[2]]))
        a(batch_to_ids([s[3]]))
        third = a(batch_to_ids([s[4], s[5], s[6]])).layers
        b = BiLM.load(*tiny_files, stateful=True)
        b(batch_to_ids([s[1]]))
        row1 = b(batch_to_ids([s[5]])).layers
        b.reset_states()
        fresh = b(batch_to_ids([s[5]])).layers
    n = len(s[5])
    np.testing.assert_allclose(third[:, 1, :n], row1[:, 0, :n], atol=1e-6)
    assert not torch.allclose(row1[2, 0, :n], fresh[2, 0, :n], atol=1e-3)


def test_reset_states_returns_to_zero_start(tiny_files, tiny_sentences, bilm):
    s = tiny_sentences[1][0].split()
    m = BiLM.load(*tiny_files, stateful=True)
    with torch.no_grad():
        m(batch_to_ids([tiny_sentences[1][3].split()]))
        m.reset_states()
        after_reset = m(batch_to_ids([s])).layers
        stateless = bilm(batch_to_ids([s])).layers
    np.testing.assert_allclose(after_reset, stateless, atol=1e-6)


def test_stateless_vectors_do_not_depend_on_batch_or_padding(bilm, tiny_sentences):
    sentences = [x.split() for x in tiny_sentences[2]]
    target = sentences[3]
    with torch.no_grad():
        alone = bilm(batch_to_ids([target])).layers[:, 0]
        n = len(target)
        for batch in ([sentences[0], target], [target, *sentences[4:9]], [sentences[1], target]):
            out = bilm(batch_to_ids(batch)).layers
            row = batch.index(target)
            np.testing.assert_allclose(out[:, row, :n], alone, atol=1e-6)
        padded = torch.nn.functional.pad(batch_to_ids([target]), (0, 0, 0, 7))
        out = bilm(padded)
        assert out.layers.shape[2] == n + 7 and out.mask.sum() == n
        np.testing.assert_allclose(out.layers[:, 0, :n], alone, atol=1e-6)
        again = bilm(batch_to_ids([target])).layers[:, 0]
    np.testing.assert_array_equal(again, alone)


def test_matches_naive_reference_implementation(bilm, tiny_files, tiny_options, tiny_sentences):
    sentence = tiny_sentences[0][9].split()
    with torch.no_grad():
        got = bilm(batch_to_ids([sentence])).layers[:, 0].double().numpy()
    ref = reference_layers(str(tiny_files[1]), tiny_options, sentence)
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_layer_zero_is_token_vector_duplicated(bilm, tiny_sentences):
    sentence = tiny_sentences[1][2].split()
    with torch.no_grad():
        layer0 = bilm(batch_to_ids([sentence])).layers[0, 0]
        tokens = bilm.encode_tokens(sentence)
    assert tokens.shape == (len(sentence), 16)
    np.testing.assert_allclose(layer0[:, :16], tokens, atol=1e-6)
    np.testing.assert_array_equal(layer0[:, :16], layer0[:, 16:])


def test_keep_sentence_boundaries(bilm, tiny_sentences):
    sentences = [tiny_sentences[0][3].split(), tiny_sentences[0][5].split()]
    with torch.no_grad():
        inner = bilm(batch_to_ids(sentences))
        outer = bilm(batch_to_ids(sentences), keep_sentence_boundaries=True)
        bos = bilm.encode_tokens(["<S>"])[0]
    assert outer.layers.shape[2] == inner.layers.shape[2] + 2
    assert outer.mask.sum(1).tolist() == [len(s) + 2 for s in sentences]
    for row, s in enumerate(sentences):
        np.testing.assert_array_equal(outer.layers[:, row, 1 : len(s) + 1], inner.layers[:, row, : len(s)])
        np.testing.assert_allclose(outer.layers[0, row, 0, :16], bos, atol=1e-6)


def test_fresh_model_from_options_dict(tiny_options):
    torch.manual_seed(0)
    model = BiLM(tiny_options).eval()
    out = model(batch_to_ids([["a", "b"], ["c"]]))
    assert out.layers.shape == (3, 2, 2, 32)
    assert out.mask.tolist() == [[True, True], [True, False]]
    assert model.num_layers == 3 and model.output_dim == 32
    assert torch.isfinite(out.layers).all()


def test_long_tokens_are_truncated_to_48_bytes(bilm):
    long = "x" * 60
    with torch.no_grad():
        a = bilm.encode_tokens([long])
        b = bilm.encode_tokens(["x" * 48])
    np.testing.assert_array_equal(a, b)


def test_options_json_copy_is_the_original(tiny_options):
    # Guards against editing the fixture: these are the values the reference activations used.
    assert tiny_options["lstm"] == json.loads((TINY / "options.json").read_text())["lstm"]
    assert tiny_options["lstm"]["dim"] == 64 and tiny_options["char_cnn"]["n_highway"] == 2


# -- explicit state ---------------------------------------------------------------------------


def test_out_state_continues_a_stream_as_the_stateful_model_does(tiny_files, tiny_sentences, bilm):
    s = [x.split() for x in tiny_sentences[0][:6]]
    stateful = BiLM.load(*tiny_files, stateful=True)
    with torch.no_grad():
        first = bilm(batch_to_ids(s[:3]), state="zero")
        second = bilm(batch_to_ids(s[3:6]), state=first.state)
        stateful(batch_to_ids(s[:3]))
        expected = stateful(batch_to_ids(s[3:6]))
    torch.testing.assert_close(second.layers, expected.layers, atol=1e-6, rtol=0)
    torch.testing.assert_close(second.state.h, stateful.carried.state.h, atol=1e-6, rtol=0)
    # each row's state is the one after its own last position: a row alone ends in the same state
    with torch.no_grad():
        alone = bilm(batch_to_ids([s[4]]), state=first.state.select(torch.tensor([1])))
    torch.testing.assert_close(alone.state.c[:, :, 0], second.state.c[:, :, 1], atol=1e-6, rtol=0)
    assert second.state.h.shape == (2, 2, 3, 16) and second.state.c.shape == (2, 2, 3, 64)


def test_default_state_is_the_start_state_and_zero_is_explicit(tiny_files, tiny_sentences):
    from elmokit.model.lstm import LstmState

    model = BiLM.load(*tiny_files)
    ids = batch_to_ids([tiny_sentences[1][0].split(), tiny_sentences[1][1].split()])
    with torch.no_grad():
        zero = model(ids).layers  # no start state: zeros
        torch.testing.assert_close(model(ids, state="zero").layers, zero, atol=0, rtol=0)
        torch.testing.assert_close(model(ids, state=model.zero_state(2)).layers, zero, atol=0, rtol=0)
        model.set_start_state(LstmState(torch.full((2, 2, 16), 0.2), torch.full((2, 2, 64), -0.3)))
        warm = model(ids).layers
        explicit = model(ids, state=model.initial_state(2)).layers
        still_zero = model(ids, state="zero").layers
    torch.testing.assert_close(warm, explicit, atol=0, rtol=0)
    torch.testing.assert_close(still_zero, zero, atol=0, rtol=0)
    assert not torch.allclose(warm[2], zero[2], atol=1e-4)
    with pytest.raises(ValueError, match="for a batch of 2"):
        model(ids, state=model.zero_state(3))
    with pytest.raises(ValueError, match="'zero'"):
        model(ids, state="warm")


def test_explicit_state_carries_gradients(bilm, tiny_sentences):
    from elmokit.model.lstm import LstmState

    ids = batch_to_ids([tiny_sentences[2][0].split()])
    h = torch.zeros(2, 2, 1, 16, requires_grad=True)
    c = torch.zeros(2, 2, 1, 64, requires_grad=True)
    out = bilm(ids, state=LstmState(h, c))
    out.layers[1].sum().backward()
    assert h.grad is not None and h.grad.abs().sum() > 0 and c.grad.abs().sum() > 0


def test_wrapping_never_changes_the_model_passed_in(tiny_files, tiny_sentences):
    from elmokit import Elmo, Embedder

    s = [x.split() for x in tiny_sentences[0][:4]]
    stateful = BiLM.load(*tiny_files, stateful=True)
    stateful.train()
    Elmo(bilm=stateful, num_output_representations=1)
    assert stateful.stateful and stateful.training
    assert all(p.requires_grad for p in stateful.parameters())
    # Elmo with requires_grad=False gives the biLM no gradient, without freezing it
    elmo = Elmo(bilm=stateful, num_output_representations=1, dropout=0.0, stateful=False)
    elmo(batch_to_ids(s)).representations[0].sum().backward()
    assert all(p.grad is None for p in stateful.parameters())
    assert stateful.carried.state is None  # stateful=False: the carried states were not used
    # Embedder: another dtype runs a copy; the model keeps its dtype, mode and carried states
    embedder = Embedder(stateful, mode="warm", dtype="bfloat16", device="cpu")
    embedder.embed_sentence(s[0])
    assert next(stateful.parameters()).dtype == torch.float32 and stateful.training
    assert embedder.bilm is not stateful and stateful.carried.state is None
    same = Embedder(stateful, mode="zero", device="cpu")
    a = same.embed_sentence(s[1])
    b = same.embed_sentence(s[1])
    np.testing.assert_array_equal(a, b)  # deterministic although the model is a StatefulBiLM
    assert same.bilm is stateful and stateful.training and stateful.carried.state is None


def test_stateful_elmo_carries_states_without_touching_the_bilm(tiny_files, tiny_sentences, bilm):
    from elmokit import Elmo

    s = [x.split() for x in tiny_sentences[0][:6]]
    elmo = Elmo(bilm=bilm, num_output_representations=1, dropout=0.0, stateful=True,
                scalar_mix_parameters=[0.0, 0.0, 1e4])
    reference = BiLM.load(*tiny_files, stateful=True)
    with torch.no_grad():
        elmo(batch_to_ids(s[:3]))
        got = elmo(batch_to_ids(s[3:5])).representations[0]
        reference(batch_to_ids(s[:3]))
        top = reference(batch_to_ids(s[3:5])).layers[2]
    torch.testing.assert_close(got, top, atol=1e-5, rtol=0)
    assert not bilm.stateful


def test_old_calls_keep_working_with_a_deprecation_warning(tiny_options, tiny_sentences, bilm):
    with pytest.raises(TypeError):  # the old BiLM(options, stateful=True): StatefulBiLM(options) now
        BiLM(tiny_options, stateful=True)
    ids = batch_to_ids([tiny_sentences[0][0].split()])
    with pytest.warns(DeprecationWarning, match="keep_sentence_boundaries"), torch.no_grad():
        out = bilm(ids, True)
    assert out.layers.shape[2] == ids.shape[1] + 2
