"""The shipped model's outputs are bit-identical to those of the code at commit d119d49
(tests/fixtures/news-512-outputs/: the script that wrote them and how it was run): a
restructuring may move code, never numbers. Single-threaded, as the fixture was made, and on
the vector unit it was made with (torch's CPU capability "AVX512"): another one's kernels round
differently, so elsewhere the test is skipped."""

from pathlib import Path

import numpy as np
import pytest
import torch

from elmokit import Elmo, Embedder, LanguageModel, batch_to_ids, score_sentences
from elmokit.hub.shipped import MODELS_DIR

FIXTURE = Path(__file__).parent / "fixtures" / "news-512-outputs"
SENTENCES = [
    ["The", "cat", "sat", "on", "the", "mat", "."],
    ["Stocks", "fell", "sharply", "on", "Monday", "after", "the", "report", "."],
    ["Hello"],
]


MADE_ON = "AVX512"  # torch.backends.cpu.get_cpu_capability() where the fixture was written

pytestmark = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() != MADE_ON,
    reason=f"the fixture's numbers are those of torch's {MADE_ON} kernels; this CPU runs "
    f"{torch.backends.cpu.get_cpu_capability()}",
)


@pytest.fixture(scope="module")
def expected():
    with np.load(FIXTURE / "outputs.npz") as arrays:
        return dict(arrays)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want), f"largest difference {np.abs(got - want).max()}"


@pytest.mark.parametrize("mode", ["warm", "zero"])
def test_embedder_is_bit_identical(expected, mode):
    arrays = Embedder("elmo-news-512", mode=mode, device="cpu").embed_batch(SENTENCES)
    for i, array in enumerate(arrays):
        _same(array, expected[f"embed_{mode}_{i}"])


def test_stateful_embedder_is_bit_identical_over_two_calls(expected):
    embedder = Embedder("elmo-news-512", mode="stateful", device="cpu")
    for call in range(2):
        for i, array in enumerate(embedder.embed_batch(SENTENCES)):
            _same(array, expected[f"embed_stateful_call{call}_{i}"])


def test_elmo_is_bit_identical(expected):
    folder = MODELS_DIR / "elmo-news-512"
    elmo = Elmo(
        str(folder / "options.json"), str(folder / "weights.hdf5"), num_output_representations=2, dropout=0.0
    ).eval()
    with torch.no_grad():
        result = elmo(batch_to_ids(SENTENCES))
    for i, rep in enumerate(result.representations):
        _same(rep.numpy(), expected[f"elmo_rep{i}"])


def test_scores_are_bit_identical(expected):
    model = LanguageModel.from_pretrained("elmo-news-512", device="cpu")
    for i, score in enumerate(score_sentences(model, SENTENCES)):
        _same(score.forward_logprobs, expected[f"score_forward_{i}"])
        _same(score.backward_logprobs, expected[f"score_backward_{i}"])


def test_elmo_by_name_is_bit_identical(expected):
    elmo = Elmo("elmo-news-512", num_output_representations=2, dropout=0.0).eval()
    with torch.no_grad():
        result = elmo(batch_to_ids(SENTENCES))
    for i, rep in enumerate(result.representations):
        _same(rep.numpy(), expected[f"elmo_rep{i}"])
