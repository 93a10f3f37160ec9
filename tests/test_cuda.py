"""On a CUDA GPU, in float32, the same numbers as on the CPU: the biLM against bilm-tf's outputs,
the Embedder and ``elmokit embed`` with the shipped model, Elmo, and training steps. bfloat16 runs
and stays close. Every test here skips on a machine without CUDA (CI has none; these ran on a lent
GPU, see README "On a GPU")."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from elmokit import BiLM, Elmo, Embedder, batch_to_ids
from elmokit.cli import main as cli_main
from elmokit.lm.vocabulary import Vocabulary
from elmokit.training.collectives import Distributed
from elmokit.training.data import BidirectionalLMBatches
from elmokit.training.loop import Trainer

from .conftest import TINY
from .training.test_loop import corpus, make_config  # noqa: F401  (corpus is a fixture)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SENTENCES = [
    "The bank raised its interest rates again on Tuesday .".split(),
    "She sat on the bank of the river and watched the boats .".split(),
    "Pneumonoultramicroscopicsilicovolcanoconiosis is a long word .".split(),  # a token over 20 chars
    ["a"],
]


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    """||got - expected|| / ||expected||: float32 lands near 1e-7, TF32 near 1e-4."""
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


def test_reproduces_bilm_tf_on_the_gpu(tiny_files, tiny_sentences):
    model = BiLM.load(*tiny_files, stateful=True).cuda()
    expected = [h5py.File(TINY / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    with torch.no_grad():
        for i in range(10):
            batch = [tiny_sentences[k][i].split() for k in range(3)]
            out = model(batch_to_ids(batch).cuda())
            for k, sentence in enumerate(batch):
                ref = expected[k][str(i)][...]  # (2, n, 16): forward, backward
                top = out.layers[2, k, : len(sentence)].cpu().numpy()
                np.testing.assert_allclose(top, np.concatenate([ref[0], ref[1]], -1), atol=1e-5)


@pytest.mark.parametrize("mode", ["warm", "zero"])
def test_shipped_model_vectors_on_the_gpu_equal_the_cpus(mode):
    cpu = list(Embedder("elmo-news-512", device="cpu", mode=mode).embed_sentences(SENTENCES))
    gpu = list(Embedder("elmo-news-512", device="cuda", mode=mode).embed_sentences(SENTENCES))
    for c, g in zip(cpu, gpu):
        assert g.shape == c.shape and g.dtype == np.float32
        for layer in range(3):
            assert relative_error(g[layer], c[layer]) < 1e-5, (mode, layer)


def test_bfloat16_on_the_gpu_stays_close_to_float32():
    exact = np.concatenate(list(Embedder("elmo-news-512", device="cuda").embed_sentences(SENTENCES)), 1)
    bf16 = Embedder("elmo-news-512", device="cuda", dtype="bfloat16").embed_sentences(SENTENCES)
    approx = np.concatenate(list(bf16), 1)
    cosine = torch.nn.functional.cosine_similarity(torch.from_numpy(exact), torch.from_numpy(approx), dim=-1)
    assert approx.dtype == np.float32 and float(cosine.min()) > 0.99


def test_embed_command_on_the_gpu_writes_the_cpus_vectors(tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("\n".join(" ".join(s) for s in SENTENCES) + "\n", encoding="utf-8")
    for device in ("cpu", "cuda"):
        assert (
            cli_main(["embed", str(text), str(tmp_path / f"{device}.hdf5"), "--device", device, "--quiet"])
            == 0
        )
    with h5py.File(tmp_path / "cpu.hdf5") as c, h5py.File(tmp_path / "cuda.hdf5") as g:
        for i in range(len(SENTENCES)):
            assert relative_error(g[str(i)][...], c[str(i)][...]) < 1e-5


def test_elmo_module_on_the_gpu(tiny_files, tiny_sentences):
    batch = [s.split() for s in tiny_sentences[0][:4]]
    elmo = Elmo(*tiny_files, num_output_representations=2, dropout=0.0)
    cpu = elmo(batch_to_ids(batch))
    gpu = elmo.cuda()(batch_to_ids(batch).cuda())
    assert torch.equal(gpu.mask.cpu(), cpu.mask)
    for c, g in zip(cpu.representations, gpu.representations):
        assert g.device.type == "cuda"
        torch.testing.assert_close(g.cpu(), c, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_steps_on_the_gpu_track_the_cpus(tmp_path, corpus, precision):  # noqa: F811
    vocab = Vocabulary.from_file(corpus[1])
    batches = iter(BidirectionalLMBatches(corpus[0], vocab, 4, 5, seed=0))
    steps = [next(batches) for _ in range(3)]
    config = make_config(tmp_path, corpus, precision=precision, dropout=0.0, n_negative_samples=1000)
    trainers = {d: Trainer(config, None, len(vocab), Distributed(device=torch.device(d))) for d in ("cpu", "cuda")}
    trainers["cuda"].module.load_state_dict(trainers["cpu"].module.state_dict())
    losses = {d: [t.step(b) for b in steps] for d, t in trainers.items()}
    tolerance = 1e-5 if precision == "fp32" else 2e-2
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=tolerance)
    if precision == "fp32":  # after three Adagrad updates the weights still agree
        cpu_weights = trainers["cpu"].module.state_dict()
        for name, value in trainers["cuda"].module.state_dict().items():
            torch.testing.assert_close(value.cpu(), cpu_weights[name], rtol=1e-4, atol=1e-5)


def test_pinned_copy_gives_the_plain_copys_arrays_which_later_batches_leave_alone():
    from elmokit.base import kernels

    many = SENTENCES * 5  # 10 batches of 2 through one staging buffer
    embedder = Embedder("elmo-news-512", device="cuda", batch_size=2, mode="zero")
    fast = list(embedder.embed_sentences(many))
    with kernels.disabled("pinned_copy"):
        plain = list(embedder.embed_sentences(many))
    alone = [embedder.embed_sentence(s) for s in SENTENCES]
    for i, (f, p) in enumerate(zip(fast, plain)):
        np.testing.assert_array_equal(f, p)
        np.testing.assert_allclose(f, alone[i % len(SENTENCES)], rtol=1e-5, atol=1e-5)
