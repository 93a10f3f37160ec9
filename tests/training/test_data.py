from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pytest

from elmokit.lm.vocabulary import Vocabulary
from elmokit.model.characters import token_to_ids
from elmokit.training.data import (
    BidirectionalLMBatches,
    LMBatches,
    SentenceStream,
    corpus_files,
    count_tokens,
    heldout_batches,
)

# ids: <S> 0, </S> 1, <UNK> 2, a 3, b 4, c 5, d 6; "e" is out of vocabulary
SMALL_VOCAB = ["<S>", "</S>", "<UNK>", "a", "b", "c", "d"]


@pytest.fixture
def small_corpus(tmp_path):
    path = tmp_path / "small.txt"
    path.write_text("a b c\n\n d e \n", encoding="utf-8")
    return str(path)


def write_shards(tmp_path, n_shards: int, n_sentences: int, prefix: str = "shard") -> list[str]:
    """Unique sentences of varying length: 's{shard}_{i} w...'."""
    paths = []
    rng = np.random.default_rng(0)
    for s in range(n_shards):
        lines = []
        for i in range(n_sentences):
            words = [f"w{int(w)}" for w in rng.integers(0, 20, size=int(rng.integers(0, 12)))]
            lines.append(" ".join([f"s{s}_{i}", *words]))
        path = tmp_path / f"{prefix}-{s:03d}.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(str(path))
    return paths


def corpus_vocab(paths) -> Vocabulary:
    counts = count_tokens(paths)
    # keep only the words: the unique sentence labels are out of vocabulary (exercise <UNK>)
    return Vocabulary.build({t: c for t, c in counts.items() if t.startswith("w")})


# ---------------------------------------------------------------------------------- vocabulary


def test_build_orders_specials_then_descending_count_with_ties_by_token():
    counts = {"b": 2, "a": 2, "c": 5, "d": 1, "<S>": 9}
    vocab = Vocabulary.build(counts, min_count=2)
    assert vocab.tokens == ["<S>", "</S>", "<UNK>", "c", "a", "b"]
    assert (vocab.bos, vocab.eos, vocab.unk, len(vocab)) == (0, 1, 2, 6)
    assert Vocabulary.build(counts, max_size=4).tokens == ["<S>", "</S>", "<UNK>", "c"]
    assert vocab.encode(["a", "zzz", "c"]) == [4, 2, 3]


def test_vocab_file_round_trip_and_missing_special_tokens(tmp_path):
    path = tmp_path / "vocab.txt"
    Vocabulary(["</S>", "<S>", "<UNK>", "the", "é"]).save(path)
    assert path.read_text(encoding="utf-8") == "</S>\n<S>\n<UNK>\nthe\né\n"
    vocab = Vocabulary.from_file(path)
    assert (vocab.bos, vocab.eos, vocab.unk) == (1, 0, 2)
    assert vocab.encode(["é", "the", "?"]) == [4, 3, 2]

    bad = tmp_path / "bad_vocab.txt"
    bad.write_text("<S>\nthe\n", encoding="utf-8")
    with pytest.raises(ValueError, match="missing the special token") as err:
        Vocabulary.from_file(bad)
    assert "</S>, <UNK>" in str(err.value) and "bad_vocab.txt" in str(err.value)


def test_unsorted_vocabulary_is_refused_for_sampling():
    counts = Counter({"a": 1, "b": 5})
    unsorted = Vocabulary(["<S>", "</S>", "<UNK>", "a", "b"])
    assert unsorted.unsorted_position(counts) == 4
    with pytest.raises(ValueError, match="not sorted by descending frequency"):
        unsorted.check_sorted_by_frequency(counts)
    Vocabulary.build(counts).check_sorted_by_frequency(counts)  # no error


def test_count_tokens_and_coverage(tmp_path, small_corpus):
    other = tmp_path / "other.txt"
    other.write_text("a a\n", encoding="utf-8")
    counts = count_tokens([small_corpus, other])
    assert counts == Counter({"a": 3, "b": 1, "c": 1, "d": 1, "e": 1})
    assert count_tokens(str(tmp_path / "*.txt")) == counts  # a str is a glob
    assert Vocabulary(SMALL_VOCAB).coverage(counts) == pytest.approx(6 / 7)


# ---------------------------------------------------------------------------------- corpus


def test_glob_without_match_names_the_glob(tmp_path):
    pattern = str(tmp_path / "nothing-*.txt")
    with pytest.raises(FileNotFoundError, match="nothing-"):
        corpus_files(pattern)
    with pytest.raises(FileNotFoundError, match="nothing-"):
        BidirectionalLMBatches(pattern, Vocabulary(SMALL_VOCAB), 2, 3)


def test_corpus_files_sorted(tmp_path):
    paths = write_shards(tmp_path, 3, 2)
    assert corpus_files(str(tmp_path / "shard-*")) == sorted(paths)


def test_empty_corpus_is_a_clear_error(tmp_path):
    (tmp_path / "e1.txt").write_text("\n  \n", encoding="utf-8")
    (tmp_path / "e2.txt").write_text("", encoding="utf-8")
    batches = BidirectionalLMBatches(str(tmp_path / "e*.txt"), Vocabulary(SMALL_VOCAB), 2, 3)
    with pytest.raises(ValueError, match="empty corpus"):
        next(batches)
    with pytest.raises(ValueError, match="empty corpus"):
        next(heldout_batches(str(tmp_path / "e*.txt"), Vocabulary(SMALL_VOCAB)))


# ---------------------------------------------------------------------------------- batch layout


def test_batch_layout_by_hand(small_corpus):
    """Sentences [<S> a b c </S>] and [<S> d e </S>] (e -> <UNK>), no shuffle, B=2, T=3."""
    batches = BidirectionalLMBatches(small_corpus, Vocabulary(SMALL_VOCAB), 2, 3, shuffle=False)
    first, second = next(batches), next(batches)
    assert set(first) == {
        "token_ids",
        "char_ids",
        "next_token_id",
        "token_ids_reverse",
        "char_ids_reverse",
        "next_token_id_reverse",
    }
    assert first["token_ids"].dtype == np.int64 and first["char_ids"].shape == (2, 3, 50)
    # forward: row 0 <S> a b | c ..., row 1 <S> d e | </S> only as a target
    assert first["token_ids"].tolist() == [[0, 3, 4], [0, 6, 2]]
    assert first["next_token_id"].tolist() == [[3, 4, 5], [6, 2, 1]]
    # row 0 finishes "c -> </S>" then starts the next sentence (loop: the corpus again);
    # row 1 had only </S> left, which is never an input, so it starts a new sentence
    assert second["token_ids"].tolist() == [[5, 0, 3], [0, 6, 2]]
    assert second["next_token_id"].tolist() == [[1, 3, 4], [6, 2, 1]]
    # backward: reversed sentences [</S> c b a <S>] and [</S> e d <S>]; <S> only as a target
    assert first["token_ids_reverse"].tolist() == [[1, 5, 4], [1, 2, 6]]
    assert first["next_token_id_reverse"].tolist() == [[5, 4, 3], [2, 6, 0]]
    assert second["token_ids_reverse"].tolist() == [[3, 1, 5], [1, 2, 6]]
    assert second["next_token_id_reverse"].tolist() == [[0, 5, 4], [2, 6, 0]]
    for batch in (first, second):
        assert 1 not in batch["token_ids"].flatten().tolist()
        assert 0 not in batch["token_ids_reverse"].flatten().tolist()


def test_char_ids_are_unshifted_token_to_ids(small_corpus):
    vocab = Vocabulary(SMALL_VOCAB)
    batch = next(BidirectionalLMBatches(small_corpus, vocab, 2, 3, shuffle=False))
    expected = [["<S>", "a", "b"], ["<S>", "d", "e"]]  # "e" keeps its own characters
    assert batch["char_ids"].tolist() == [[list(token_to_ids(t)) for t in row] for row in expected]
    expected_rev = [["</S>", "c", "b"], ["</S>", "e", "d"]]
    assert batch["char_ids_reverse"].tolist() == [
        [list(token_to_ids(t)) for t in row] for row in expected_rev
    ]
    assert int(batch["char_ids"].min()) == 97 and int(batch["char_ids"].max()) == 260
    shifted = next(BidirectionalLMBatches(small_corpus, vocab, 2, 3, shuffle=False, char_id_offset=1))
    assert np.array_equal(shifted["char_ids"], batch["char_ids"] + 1)


def test_char_ids_match_tokens_on_a_shuffled_corpus(tmp_path):
    paths = write_shards(tmp_path, 2, 6)
    vocab = corpus_vocab(paths)
    batches = LMBatches(paths, vocab, 4, 7, seed=3)
    for _ in range(5):
        batch = next(batches)
        ids = batch["token_ids"].flatten().tolist()
        chars = batch["char_ids"].reshape(len(ids), -1).tolist()
        for token_id, row in zip(ids, chars):
            if token_id != vocab.unk:
                assert row == list(token_to_ids(vocab.id_to_token(token_id)))
            else:  # an out-of-vocabulary sentence label "s{shard}_{i}" keeps its characters
                end = row.index(259)
                label = bytes(row[1:end]).decode()
                assert re.fullmatch(r"s\d+_\d+", label)
                assert row == list(token_to_ids(label))


# ---------------------------------------------------------------------------------- state, ranks


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def assert_same_batches(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert x.keys() == y.keys()
        for key in x:
            assert np.array_equal(x[key], y[key]), key


@pytest.mark.parametrize("k", [0, 1, 7, 12])
def test_resume_gives_the_same_batches(tmp_path, k):
    paths = write_shards(tmp_path, 3, 5)  # ~ 110 tokens per epoch: several epochs in 30 batches
    vocab = corpus_vocab(paths)
    make = lambda: BidirectionalLMBatches(  # noqa: E731
        str(tmp_path / "shard-*.txt"), vocab, 3, 5, seed=11
    )
    uninterrupted = take(make(), 30)
    first = make()
    assert_same_batches(take(first, k), uninterrupted[:k])
    state = json.loads(json.dumps(first.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    assert_same_batches(take(resumed, 30 - k), uninterrupted[k:])
    assert resumed.forward.stream.epoch >= 2


def test_heldout_protocol_by_hand(small_corpus):
    """Batch rows of 1 step, no shuffle, one pass, the incomplete last batch dropped."""
    batches = list(heldout_batches(small_corpus, Vocabulary(SMALL_VOCAB), batch_size=2))
    assert [b["token_ids"].tolist() for b in batches] == [[[0], [0]], [[3], [6]], [[4], [2]]]
    assert [b["next_token_id"].tolist() for b in batches] == [[[3], [6]], [[4], [2]], [[5], [1]]]
    # a 4th batch would need a third sentence for row 1: dropped, so "c -> </S>" is never scored
    assert [b["token_ids_reverse"].tolist() for b in batches] == [
        [[1], [1]],
        [[5], [2]],
        [[4], [6]],
    ]
    assert [b["next_token_id_reverse"].tolist() for b in batches] == [
        [[5], [2]],
        [[4], [6]],
        [[3], [0]],
    ]


def test_resume_single_pass_heldout(tmp_path):
    paths = write_shards(tmp_path, 2, 7)
    vocab = corpus_vocab(paths)
    full = list(heldout_batches(paths, vocab, batch_size=4))
    n_inputs = sum(len(line.split()) + 1 for p in paths for line in open(p, encoding="utf-8"))
    assert 0 <= n_inputs - 4 * len(full) <= 4 * 13  # at most each row's unfinished sentence lost
    first = heldout_batches(paths, vocab, batch_size=4)
    assert_same_batches(take(first, 5), full[:5])
    resumed = heldout_batches(paths, vocab, batch_size=4)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert_same_batches(list(resumed), full[5:])
    assert list(first) and list(resumed) == []


def test_state_from_another_configuration_is_refused(tmp_path):
    paths = write_shards(tmp_path, 2, 3)
    vocab = corpus_vocab(paths)
    state = BidirectionalLMBatches(paths, vocab, 2, 4, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        BidirectionalLMBatches(paths, vocab, 2, 4, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size"):
        BidirectionalLMBatches(paths, vocab, 3, 4, seed=1).load_state_dict(state)


def one_pass(paths, rank, world_size):
    stream = SentenceStream(paths, rank=rank, world_size=world_size, loop=False, seed=5)
    return [" ".join(s) for s in stream]


@pytest.mark.parametrize("n_shards,world_size", [(5, 2), (4, 4), (1, 3), (2, 3)])
def test_ranks_partition_the_corpus(tmp_path, n_shards, world_size):
    paths = write_shards(tmp_path, n_shards, 7)
    corpus = [line.strip() for p in paths for line in open(p, encoding="utf-8")]
    per_rank = [one_pass(paths, r, world_size) for r in range(world_size)]
    assert all(per_rank)
    union = [s for sentences in per_rank for s in sentences]
    assert len(union) == len(set(union)) == len(corpus)  # no overlap, nothing lost
    assert set(union) == set(corpus)
    if n_shards >= world_size:  # round-robin shards: a rank reads whole shards
        assert {s.split("_")[0] for s in per_rank[0]} == {f"s{i}" for i in range(0, n_shards, world_size)}


def test_seed_determinism_and_independent_directions(tmp_path):
    paths = write_shards(tmp_path, 3, 20)
    vocab = corpus_vocab(paths)
    a = take(BidirectionalLMBatches(paths, vocab, 4, 6, seed=42), 8)
    b = take(BidirectionalLMBatches(paths, vocab, 4, 6, seed=42), 8)
    c = take(BidirectionalLMBatches(paths, vocab, 4, 6, seed=43), 8)
    assert_same_batches(a, b)
    assert not np.array_equal(a[0]["token_ids"], c[0]["token_ids"])
    # the backward stream has its own shuffle: different sentences, not a mirror of the forward
    forward = [" ".join(s) for s in take(SentenceStream(paths, seed=42, stream_id=0), 60)]
    backward = [" ".join(s) for s in take(SentenceStream(paths, seed=42, stream_id=1), 60)]
    assert forward != backward and set(forward) == set(backward)
    # every shard once per epoch, each sentence once per epoch
    assert len(set(forward)) == 60
