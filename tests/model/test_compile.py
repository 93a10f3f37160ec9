"""torch.compile with the defaults on elmokit's models: a compiled BiLM, Elmo and compat Elmo
give the eager numbers (the token cache steps aside while torch.compile traces).

Compiling is slow on 2 CPU cores (about 10 s a model with inductor, the default backend): the
three models are compiled once each, on one batch of more distinct tokens than the cache's
threshold, so that eager runs use the cache and compiled runs must not."""

from __future__ import annotations

import pytest
import torch

from elmokit import BiLM, batch_to_ids
from elmokit.compat import allennlp as compat
from elmokit.model.elmo import Elmo
from elmokit.model.token_cache import EncodingCache, caching_allowed

from ..conftest import TINY

WORDS = [f"w{i}" for i in range(EncodingCache.MIN_KEYS + 6)]
SENTENCES = [WORDS[0:30], WORDS[30:50], WORDS[50:]]

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return batch_to_ids(SENTENCES)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from nothing, in this process (a pool of compile workers costs more
    than it saves on 2 cores: 35 s for this file instead of 58 s)."""
    import torch._inductor.config as inductor

    threads, inductor.compile_threads = inductor.compile_threads, 1
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    inductor.compile_threads = threads


def _bilm() -> BiLM:
    return BiLM.load(TINY / "options.json", TINY / "lm_weights.hdf5")


def test_caching_is_not_allowed_while_compiling():
    assert caching_allowed()
    seen = []

    def probe(x: torch.Tensor) -> torch.Tensor:
        seen.append(caching_allowed())
        return x + 1

    torch.compile(probe, backend="eager")(torch.zeros(2))
    assert seen == [False]


def test_compiled_bilm_gives_the_eager_numbers(ids):
    bilm = _bilm()
    with torch.no_grad():
        eager = bilm(ids)
        assert bilm.token_encoder.cache_stats[1] > 0, "the eager run used the cache"
        compiled = torch.compile(bilm)(ids)
    torch.testing.assert_close(compiled.layers, eager.layers, atol=1e-5, rtol=1e-5)
    assert torch.equal(compiled.mask, eager.mask)


def test_compiled_elmo_gives_the_eager_numbers(ids):
    elmo = Elmo(bilm=_bilm(), num_output_representations=2, dropout=0.0).eval()
    with torch.no_grad():
        eager = elmo(ids)
        compiled = torch.compile(elmo)(ids)
    for got, expected in zip(compiled.representations, eager.representations):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_compiled_compat_elmo_gives_the_eager_numbers(ids):
    """Stateless (allenai/allennlp#2398's recipe), so that both runs start from zeros."""
    elmo = compat.Elmo(TINY / "options.json", TINY / "lm_weights.hdf5", 1, dropout=0.0).eval()
    elmo._elmo_lstm._elmo_lstm.stateful = False
    with torch.no_grad():
        eager = elmo(ids)
        compiled = torch.compile(elmo)(ids)
    torch.testing.assert_close(
        compiled["elmo_representations"][0], eager["elmo_representations"][0], atol=1e-5, rtol=1e-5
    )
    assert torch.equal(compiled["mask"], eager["mask"])
