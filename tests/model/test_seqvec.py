"""SeqVec (protein ELMo, used through bio_embeddings' SeqVecEmbedder): AllenNLP's ElmoEmbedder
call pattern on elmokit, and proteins of thousands of residues in SeqVec's published shape, exact
against a plain unwindowed stateful forward while the LSTMs run in windows of at most 512 steps.

The published shape reads 168 MB of recurrent weights per residue: about 14 s on 2 quiet cores,
minutes when another process competes for them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from elmokit import BiLM, StatefulBiLM
from elmokit.compat import install_allennlp_modules, uninstall_allennlp_modules
from elmokit.compat.allennlp import ElmoEmbedder, batch_to_ids
from elmokit.model.bilm import DEFAULT_WINDOW
from elmokit.model.lstm import Packing

# SeqVec's options.json as published with its weights (sacdallago/bio_embeddings,
# machine_learning/model/options.json): the 2x4096_512 biLM, 2 highway layers, 2048 filters.
SEQVEC_OPTIONS = {
    "bidirectional": True,
    "char_cnn": {
        "activation": "relu",
        "embedding": {"dim": 16},
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "max_characters_per_token": 50,
        "n_characters": 262,
        "n_highway": 2,
    },
    "dropout": 0.1,
    "lstm": {
        "cell_clip": 3,
        "dim": 4096,
        "n_layers": 2,
        "proj_clip": 3,
        "projection_dim": 512,
        "use_skip_connections": True,
    },
    "all_clip_norm_val": 10.0,
    "n_epochs": 10,
    "n_train_tokens": 9577889953,
    "batch_size": 48,
    "n_tokens_vocab": 28,
    "unroll_steps": 100,
    "n_negative_samples_batch": 20,
}
AMINO_ACIDS = list("ACDEFGHIKLMNPQRSTVWY")
# bio_embeddings' warm-up sequence (T0922 from CASP) that SeqVecEmbedder embeds 4 times first
WARMUP = "MGSSHHHHHHSSGLVPRGSHMASVQKFPGDANCDGIVDISDAVLIMQTMANPSKYQMTDKGRINADVTGNSDGVTVLDAQFIQSYCLGLVELPPVE"


def _protein(length: int, seed: int) -> str:
    return "".join(np.random.default_rng(seed).choice(AMINO_ACIDS, size=length))


@pytest.fixture(scope="module")
def seqvec_files(tmp_path_factory):
    """A SeqVec-shaped model with random weights (seed 0), in files named as bio_embeddings names
    them ("options_file", "weights_file")."""
    torch.manual_seed(0)
    bilm = BiLM(SEQVEC_OPTIONS)
    assert sum(p.numel() for p in bilm.parameters()) == 93_600_864
    folder = tmp_path_factory.mktemp("seqvec")
    bilm.save(folder / "options_file", folder / "weights_file")
    (folder / "options_file").write_text(json.dumps(SEQVEC_OPTIONS))  # the published file's fields
    return folder / "options_file", folder / "weights_file"


def test_seqvec_shaped_protein_of_1500_residues_equals_the_unwindowed_forward(seqvec_files, monkeypatch):
    embedder = ElmoEmbedder(
        options_file=str(seqvec_files[0]), weight_file=str(seqvec_files[1]), cuda_device=-1
    )
    protein, short = _protein(1500, seed=1), _protein(30, seed=2)

    spans: list[int] = []
    from_lengths = Packing.from_lengths.__func__

    def recording(cls, lengths, steps, device=None):
        spans.append(steps)
        return from_lengths(cls, lengths, steps, device)

    with monkeypatch.context() as patch:
        patch.setattr(Packing, "from_lengths", classmethod(recording))
        first = embedder.embed_sentence(list(protein))
    assert first.shape == (3, 1500, 1024) and first.dtype == np.float32
    assert spans == [DEFAULT_WINDOW, DEFAULT_WINDOW, 1502 - 2 * DEFAULT_WINDOW], (
        "LSTM memory bounded by windows"
    )
    second = embedder.embed_sentence(list(short))  # stateful: starts where the protein ended

    bilm = embedder.elmo_bilm.bilm
    with torch.no_grad():  # the naive computation: all 1,502 steps at once, from zeros
        naive = bilm(batch_to_ids([list(protein)]), "zero", window=None)
        naive_next = bilm(batch_to_ids([list(short)]), naive.state, window=None)
    np.testing.assert_allclose(first, naive.layers[:, 0].numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(second, naive_next.layers[:, 0].numpy(), atol=1e-5, rtol=0)
    assert np.abs(first[1:]).max() > 0.1, "the biLSTM layers are not trivially zero"


def test_bio_embeddings_seqvec_call_pattern(tiny_files):
    """What bio_embeddings' SeqVecEmbedder does, through its own import of
    allennlp.commands.elmo: construct, warm up 4 times, embed one protein, embed a batch, reduce."""
    install_allennlp_modules()
    try:
        from allennlp.commands.elmo import ElmoEmbedder as SeqVecsElmoEmbedder

        model = SeqVecsElmoEmbedder(
            weight_file=str(tiny_files[1]), options_file=str(tiny_files[0]), cuda_device=-1
        )
        for _ in range(4):
            model.embed_sentence(list(WARMUP))
        proteins = [_protein(2000, seed=3), _protein(700, seed=4), _protein(40, seed=5)]
        one = model.embed_sentence(list(proteins[0]))  # SeqVecEmbedder.embed
        batch = list(model.embed_batch([list(seq) for seq in proteins[1:]]))  # _embed_batch_impl
    finally:
        uninstall_allennlp_modules()
    assert one.shape == (3, 2000, 32) and [b.shape for b in batch] == [(3, 700, 32), (3, 40, 32)]
    assert one.sum(0).mean(0).shape == (32,)  # SeqVecEmbedder.reduce_per_protein

    reference = StatefulBiLM.load(*tiny_files)  # the same calls on elmokit's own stateful biLM
    with torch.no_grad():
        for _ in range(4):
            reference(batch_to_ids([list(WARMUP)]), window=None)
        expected_one = reference(batch_to_ids([list(proteins[0])]), window=None).layers[:, 0]
        expected_batch = reference(batch_to_ids([list(p) for p in proteins[1:]]), window=None).layers
    np.testing.assert_allclose(one, expected_one.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(batch[0], expected_batch[:, 0, :700].numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(batch[1], expected_batch[:, 1, :40].numpy(), atol=1e-5, rtol=0)
