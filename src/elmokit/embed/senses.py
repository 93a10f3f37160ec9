"""Word senses from context: nearest neighbours of one word's vectors among many contexts.

The paper's Table 4 shows that the biLM's vector for "play" finds contexts with the same sense,
while a context-free vector cannot tell the senses apart. ``nearest_contexts`` does this for any
word: it embeds query sentences and labelled contexts that contain the word and ranks the
contexts by the cosine similarity of the word's vector, separately for every layer.

The shipped contexts (``examples/bank-contexts.tsv``) are every held-out news sentence that holds
the token "bank": the three 1B Word Benchmark held-out shards and our Reuters held-out files,
none of which the shipped model was trained on. Each line is ``sense<TAB>source<TAB>sentence``;
the senses were labelled by hand (money: the institution; river: the land beside water; other:
verbs, "fuel bank", slang).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .embedder import Embedder

__all__: list[str] = []

EXAMPLES_DIR = Path(__file__).parent.parent / "examples"
BANK_CONTEXTS = EXAMPLES_DIR / "bank-contexts.tsv"


@dataclass
class Context:
    """A sentence that contains the word, with the word's sense and where it comes from."""

    sense: str
    source: str
    tokens: list[str]


@dataclass
class Neighbour:
    score: float  # cosine similarity to the query's vector
    context: Context


@dataclass
class LayerRanking:
    """How one layer ranks the contexts for one query."""

    layer: int
    neighbours: list[Neighbour]  # the k most similar contexts, best first
    same_sense_at_k: float  # share of those k with the query's sense
    same_sense_ranks: list[int]  # 1-based ranks of all contexts with the query's sense
    distinct_scores: int  # number of different similarity values (1: the layer cannot rank)


def read_contexts(path: str | Path = BANK_CONTEXTS) -> list[Context]:
    """Labelled contexts from a ``sense<TAB>source<TAB>sentence`` file."""
    contexts = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split("\t")
        if len(parts) != 3 or not parts[2].split():
            raise ValueError(f"{path}:{number}: expected sense<TAB>source<TAB>tokenized sentence")
        contexts.append(Context(parts[0], parts[1], parts[2].split()))
    return contexts


def _word_vectors(embedder: Embedder, word: str, sentences: Sequence[Sequence[str]]) -> np.ndarray:
    """The word's vectors (n_sentences, n_layers, dim), at its first position in each sentence."""
    vectors = []
    for tokens, layers in zip(sentences, embedder.embed_sentences(sentences)):
        if word not in tokens:
            raise ValueError(f"{word!r} is not a token of: {' '.join(tokens)}")
        vectors.append(layers[:, list(tokens).index(word)])
    return np.stack(vectors)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def nearest_contexts(
    embedder: Embedder,
    word: str,
    queries: Sequence[tuple[Sequence[str], str]],
    contexts: Sequence[Context],
    k: int = 5,
) -> list[list[LayerRanking]]:
    """For each (query tokens, query sense): one LayerRanking per layer of the model."""
    query_vectors = _unit(_word_vectors(embedder, word, [q for q, _ in queries]))
    context_vectors = _unit(_word_vectors(embedder, word, [c.tokens for c in contexts]))
    results = []
    for (_, sense), query in zip(queries, query_vectors):
        rankings = []
        for layer in range(query.shape[0]):
            scores = context_vectors[:, layer] @ query[layer]
            order = np.argsort(-scores, kind="stable")
            same = np.array([contexts[i].sense == sense for i in order])
            rankings.append(
                LayerRanking(
                    layer=layer,
                    neighbours=[Neighbour(float(scores[i]), contexts[i]) for i in order[:k]],
                    same_sense_at_k=float(same[:k].mean()),
                    same_sense_ranks=(np.flatnonzero(same) + 1).tolist(),
                    distinct_scores=len(np.unique(scores.round(5))),
                )
            )
        results.append(rankings)
    return results
