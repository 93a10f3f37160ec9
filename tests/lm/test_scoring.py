"""The language model as a product: sentence scores (`elmokit score`) and word predictions
(`elmokit substitutes`), checked against direct computations with the LanguageModel."""

from __future__ import annotations

import io
import json
import math
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from elmokit import BiLM
from elmokit.cli import main
from elmokit.lm.language_model import LanguageModel
from elmokit.lm.scoring import (
    FIELDS,
    score_sentences,
    substitutes,
    word_distributions,
)
from elmokit.lm.softmax import Softmax
from elmokit.lm.vocabulary import SPECIAL_TOKENS, Vocabulary
from elmokit.model.characters import BOS_TOKEN, EOS_TOKEN, tokens_to_ids
from elmokit.model.lstm import LstmState
from elmokit.model.weights import save_softmax

from ..conftest import TINY


@pytest.fixture(scope="session")
def corpus(tiny_sentences) -> list[list[str]]:
    """30 tokenized sentences of 12 to 60 tokens, plus short ones."""
    long = [s.split() for group in tiny_sentences for s in group]
    return [*long, ["Hello", "world"], ["."], ["The", "cat", "sat", "."]]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, corpus) -> Path:
    """An exported model folder: the tiny reference biLM with a random start state, a vocabulary
    of the corpus's tokens seen at least twice (so some are outside it) and a random softmax."""
    folder = tmp_path_factory.mktemp("scoring-model")
    bilm = BiLM.load(TINY / "options.json", TINY / "lm_weights.hdf5")
    generator = torch.Generator().manual_seed(0)
    lstm = bilm.options.lstm
    bilm.set_start_state(
        LstmState(
            torch.randn(lstm.n_layers, 2, lstm.projection_dim, generator=generator) * 0.5,
            torch.randn(lstm.n_layers, 2, lstm.dim, generator=generator),
        )
    )
    bilm.save(folder / "options.json", folder / "weights.hdf5")
    counts = Counter(t for s in corpus for t in s)
    vocab = Vocabulary.build(counts, min_count=2)
    vocab.save(folder / "vocab.txt")
    softmax = Softmax(len(vocab), lstm.projection_dim)
    with torch.no_grad():
        softmax.weight.normal_(0.0, 1.0, generator=generator)
        softmax.bias.normal_(0.0, 1.0, generator=generator)
    save_softmax(softmax, folder / "softmax.hdf5")
    return folder


@pytest.fixture(scope="session")
def lm(model_dir) -> tuple[LanguageModel, Vocabulary]:
    model = LanguageModel.from_pretrained(model_dir, device="cpu")
    return model, model.vocab


def _stream_hidden(model: LanguageModel, inputs: list[str], start: LstmState | None) -> torch.Tensor:
    """The top LSTM layer over one stream in the training format (no boundaries added), given to
    both stacks: (2, 1, len(inputs), projection_dim); [0] is the forward stack reading it, [1]
    the backward stack reading it (as its own, already reversed, stream)."""
    max_chars = model.bilm.options.char_cnn.max_characters_per_token
    ids = tokens_to_ids(inputs, max_chars).unsqueeze(0)  # (1, steps, max_chars)
    state = model.bilm.lstm.zero_state(1, torch.device("cpu"))
    if start is not None:
        state = LstmState(start.h.unsqueeze(2).clone(), start.c.unsqueeze(2).clone())
    hidden, _ = model.hidden_states(torch.stack([ids, ids]), state)
    return hidden


@torch.no_grad()
def _direct_logprobs(model: LanguageModel, vocab: Vocabulary, tokens: list[str], start: LstmState | None):
    """Per-prediction log-probabilities straight from the LanguageModel: the forward stream
    [<S>, t_1..t_n] -> [t_1..t_n, </S>]; the backward stream [</S>, t_n..t_1] -> [t_n..t_1, <S>]
    (in its reading order), each through the full softmax (``position_losses``)."""
    ids = vocab.encode(tokens)
    max_chars = model.bilm.options.char_cnn.max_characters_per_token
    chars = torch.stack(
        [
            tokens_to_ids([BOS_TOKEN, *tokens], max_chars),
            tokens_to_ids([EOS_TOKEN, *reversed(tokens)], max_chars),
        ]
    ).unsqueeze(1)  # (2, 1, n + 1, max_chars)
    state = model.bilm.lstm.zero_state(1, torch.device("cpu"))
    if start is not None:
        state = LstmState(start.h.unsqueeze(2).clone(), start.c.unsqueeze(2).clone())
    hidden, _ = model.hidden_states(chars, state)
    targets = torch.tensor([[[*ids, vocab.eos]], [[*ids[::-1], vocab.bos]]])
    losses = model.position_losses(hidden, targets)  # (2, 1, n + 1)
    return (-losses[0, 0]).double(), (-losses[1, 0]).double()


# -- sentence scores ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["warm", "zero"])
def test_sentence_logprob_equals_the_language_models_full_softmax(lm, corpus, mode):
    model, vocab = lm
    start = model.bilm.start_state if mode == "warm" else None
    sample = [*sorted(corpus, key=len)[:6], max(corpus, key=len)]  # short and long, OOV tokens
    scores = list(score_sentences(model, sample, mode=mode, batch_size=3))
    assert [s.tokens for s in scores] == sample
    for tokens, score in zip(sample, scores):
        forward, backward = _direct_logprobs(model, vocab, tokens, start)
        n = len(tokens)
        assert score.predictions == n + 1
        assert score.forward_logprobs.shape == score.backward_logprobs.shape == (n + 1,)
        # aligned with the tokens: forward predicts t_i then </S>; backward t_i then <S>
        torch.testing.assert_close(torch.from_numpy(score.forward_logprobs), forward, atol=1e-5, rtol=0)
        backward_aligned = torch.cat([backward[:n].flip(0), backward[n:]])
        torch.testing.assert_close(
            torch.from_numpy(score.backward_logprobs), backward_aligned, atol=1e-5, rtol=0
        )
        assert score.forward_logprob == pytest.approx(float(forward.sum()), abs=1e-4)
        assert score.backward_logprob == pytest.approx(float(backward.sum()), abs=1e-4)
        assert score.logprob == pytest.approx(0.5 * (score.forward_logprob + score.backward_logprob))
        assert score.perplexity == pytest.approx(
            math.sqrt(score.forward_perplexity * score.backward_perplexity)
        )
        assert score.forward_perplexity == pytest.approx(math.exp(-float(forward.mean())), rel=1e-5)
        assert score.oov == sum(t not in vocab for t in tokens)
    assert sum(s.oov for s in scores) > 0  # the vocabulary leaves some tokens out


def test_warm_and_zero_mode_differ(lm, corpus):
    model, vocab = lm
    warm = next(score_sentences(model, corpus[:1]))
    zero = next(score_sentences(model, corpus[:1], mode="zero"))
    assert abs(warm.forward_logprob - zero.forward_logprob) > 1e-3


def test_batched_equals_one_at_a_time(lm, corpus):
    model, vocab = lm
    alone = [next(score_sentences(model, [s], batch_size=1)) for s in corpus]
    batched = list(score_sentences(model, iter(corpus), batch_size=5, window=12))
    for a, b in zip(alone, batched, strict=True):
        assert a.tokens == b.tokens
        torch.testing.assert_close(
            torch.from_numpy(b.forward_logprobs), torch.from_numpy(a.forward_logprobs), atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            torch.from_numpy(b.backward_logprobs), torch.from_numpy(a.backward_logprobs), atol=1e-5, rtol=0
        )


def test_a_sentences_score_does_not_depend_on_its_batch_neighbours(lm, corpus):
    model, vocab = lm
    sentence = ["The", "cat", "sat", "."]
    neighbourhoods = [[], corpus[:7], corpus[-3:], [["."]] * 9, corpus[10:20][::-1]]
    results = []
    for others in neighbourhoods:
        batch = [*others[: len(others) // 2], sentence, *others[len(others) // 2 :]]
        scores = list(score_sentences(model, batch, batch_size=len(batch)))
        results.append(scores[len(others) // 2])
    for score in results:
        assert score.tokens == sentence
        assert score.forward_logprob == pytest.approx(results[0].forward_logprob, abs=1e-5)
        assert score.backward_logprob == pytest.approx(results[0].backward_logprob, abs=1e-5)


def test_scoring_leaves_the_callers_model_as_it_was(model_dir, corpus):
    model = LanguageModel.from_pretrained(model_dir, device="cpu")
    model.train()
    model.bilm.lstm.dropout = 0.5  # would change the scores if scoring ran in training mode
    before = {k: v.clone() for k, v in model.state_dict().items()}
    first = [s.logprob for s in score_sentences(model, corpus[:4])]
    second = [s.logprob for s in score_sentences(model, corpus[:4])]
    assert first == second
    assert model.training and model.bilm.training and model.softmax.training
    assert torch.is_grad_enabled()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_model_without_a_vocabulary_takes_one_by_keyword(lm, corpus):
    """``LanguageModel.from_pretrained`` gives the model its vocabulary; a model made otherwise
    (as training makes it) is scored with ``vocab=``, and without it the error says so."""
    model, vocab = lm
    bare = LanguageModel(model.bilm, len(vocab))
    bare.softmax.load_state_dict(model.softmax.state_dict())
    expected = [s.logprob for s in score_sentences(model, corpus[:3])]
    assert [s.logprob for s in score_sentences(bare, corpus[:3], vocab=vocab)] == expected
    tokens = corpus[0]
    assert substitutes(bare, tokens, 1, k=3, vocab=vocab) == substitutes(model, tokens, 1, k=3)
    with pytest.raises(ValueError, match="no vocabulary: .* pass its softmax's Vocabulary as vocab="):
        next(score_sentences(bare, corpus[:1]))


def test_score_sentences_refuses_bad_input(lm):
    model, vocab = lm
    with pytest.raises(ValueError, match="sentence 1 is empty"):
        list(score_sentences(model, [["a"], []]))
    with pytest.raises(ValueError, match="mode must be one of warm, zero"):
        list(score_sentences(model, [["a"]], mode="stateful"))
    with pytest.raises(TypeError, match="sentence 1 is a str"):
        list(score_sentences(model, [["a"], "a b"]))


# -- substitutes --------------------------------------------------------------------------------
@torch.no_grad()
def test_word_distributions_are_the_softmax_of_each_directions_top_layer(lm):
    model, vocab = lm
    tokens = "The cat sat on the mat .".split()
    start = model.bilm.start_state
    for i in (0, 3, len(tokens) - 1):
        dists = word_distributions(model, tokens, i)
        # forward: only the left context <S> t_0 .. t_{i-1} exists; its last top-layer state
        left = _stream_hidden(model, [BOS_TOKEN, *tokens[:i]], start)[0, 0, -1]
        torch.testing.assert_close(
            dists.forward.float(), F.log_softmax(model.softmax.logits(left), -1), atol=1e-5, rtol=0
        )
        # backward: </S> t_{n-1} .. t_{i+1}, read by the backward stack
        right = [EOS_TOKEN, *reversed(tokens[i + 1 :])]
        hidden = _stream_hidden(model, right, start)[1, 0, -1]
        torch.testing.assert_close(
            dists.backward.float(), F.log_softmax(model.softmax.logits(hidden), -1), atol=1e-5, rtol=0
        )
        for dist in (dists.forward, dists.backward, dists.both):
            assert dist.shape == (len(vocab),)
            assert float(dist.exp().sum()) == pytest.approx(1.0, abs=1e-9)
        # both: the product of the two distributions, renormalised
        product = dists.forward.exp() * dists.backward.exp()
        torch.testing.assert_close(dists.both.exp(), product / product.sum())


def test_substitutes_list_the_most_probable_words_without_boundaries_and_unk(lm):
    model, vocab = lm
    tokens = "The cat sat on the mat .".split()
    result = substitutes(model, tokens, 2, k=7)
    dists = word_distributions(model, tokens, 2)
    assert result.word == "sat" and result.position == 2
    for name in ("forward", "backward", "both"):
        listed = getattr(result, name)
        assert len(listed) == 7
        words = [w for w, _ in listed]
        assert not set(words) & set(SPECIAL_TOKENS)
        probabilities = [p for _, p in listed]
        assert probabilities == sorted(probabilities, reverse=True)
        dist = getattr(dists, name)
        for word, p in listed:
            assert p == pytest.approx(math.exp(float(dist[vocab.token_to_id(word)])))
        others = [
            math.exp(float(dist[i]))
            for i in range(len(vocab))
            if vocab.id_to_token(i) not in words + list(SPECIAL_TOKENS)
        ]
        assert max(others) <= probabilities[-1] + 1e-12
        assert result.probability[name] == pytest.approx(math.exp(float(dist[vocab.token_to_id("sat")])))
    outside = substitutes(model, ["The", "zyzzyva", "sat"], 1, k=3)
    assert not outside.in_vocabulary and outside.rank == {"forward": None, "backward": None, "both": None}


def test_substitutes_refuse_a_word_index_outside_the_sentence(lm):
    model, vocab = lm
    with pytest.raises(
        ValueError, match=r"word index 3 is outside the sentence: it has 3 tokens, indices 0 to 2"
    ):
        substitutes(model, ["a", "b", "c"], 3)
    with pytest.raises(ValueError, match="word index -1"):
        substitutes(model, ["a", "b", "c"], -1)


# -- command line -------------------------------------------------------------------------------
def _write_input(path: Path, corpus: list[list[str]]) -> list[str]:
    lines = [" ".join(corpus[0]), "", "   ", " ".join(corpus[30]), " ".join(corpus[32])]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines


def test_score_command_writes_json_lines_in_input_order_skipping_empty_lines(
    lm, model_dir, corpus, tmp_path, capsys
):
    model, vocab = lm
    source = tmp_path / "in.txt"
    _write_input(source, corpus)
    assert (
        main(["score", str(source), "--model", str(model_dir), "--batch-size", "2", "--device", "cpu"]) == 0
    )
    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert [r["line"] for r in records] == [1, 4, 5]
    assert [r["sentence"] for r in records] == [" ".join(corpus[i]) for i in (0, 30, 32)]
    expected = list(score_sentences(model, [corpus[0], corpus[30], corpus[32]]))
    for record, score in zip(records, expected):
        assert list(record) == ["line", "sentence", *FIELDS[1:]]
        assert record["tokens"] == len(score.tokens) and record["oov"] == score.oov
        for name in FIELDS[3:]:
            assert record[name] == pytest.approx(getattr(score, name), rel=1e-6, abs=1e-4)
    assert "scored 3 sentences (2 empty lines skipped)" in captured.err
    assert "elmokit: error" not in captured.err


def test_score_command_tsv_per_token_stdin_and_atomic_output(
    lm, model_dir, corpus, tmp_path, capsys, monkeypatch
):
    source = tmp_path / "in.txt"
    lines = _write_input(source, corpus)
    out = tmp_path / "scores.tsv"
    assert (
        main(["score", str(source), "--model", str(model_dir), "--format", "tsv", "-o", str(out), "--quiet"])
        == 0
    )
    assert capsys.readouterr() == ("", "")
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows[0] == [*FIELDS, "sentence"]
    assert [r[0] for r in rows[1:]] == ["1", "4", "5"]
    assert rows[2][-1] == lines[3] and rows[2][1] == str(len(corpus[30]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "scores.tsv"]  # no temporary file left
    # an existing output is kept without --overwrite
    assert main(["score", str(source), "--model", str(model_dir), "-o", str(out), "--quiet"]) == 2
    assert "exists" in capsys.readouterr().err
    # - reads stdin; --per-token adds each prediction's log-probability
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(source.read_bytes())))
    assert main(["score", "-", "--model", str(model_dir), "--per-token", "--mode", "zero", "--quiet"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["line"] for r in records] == [1, 4, 5]
    for record in records:
        assert len(record["forward_logprobs"]) == len(record["backward_logprobs"]) == record["tokens"] + 1
        assert sum(record["forward_logprobs"]) == pytest.approx(record["forward_logprob"], abs=1e-3)


def test_score_command_errors_are_one_line(model_dir, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("a b c\n", encoding="utf-8")
    cases = [
        (["score", str(tmp_path / "missing.txt"), "--model", str(model_dir)], "input file not found"),
        (
            ["score", str(source), "--model", "elmo-tiny-reference"],
            "this model ships no softmax.hdf5: scoring needs one; export it from a training run with `elmokit export`",
        ),
        (["score", str(source), "--model", str(tmp_path / "nothing")], "no model folder, archive or known model"),
        (
            ["score", str(source), "--model", str(model_dir), "--format", "tsv", "--per-token"],
            "only in the jsonl format",
        ),
        (["score", str(source), "--model", str(model_dir), "-o", str(tmp_path)], "is a folder"),
        (
            ["substitutes", "a", "b", "--word", "2", "--model", str(model_dir)],
            "word index 2 is outside the sentence",
        ),
        (
            ["substitutes", "a b", "--word", "0", "--model", "elmo-tiny-reference"],
            "this model ships no softmax.hdf5",
        ),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("elmokit: error: ") and err.count("\n") == 1, err
        assert message in err


def test_substitutes_command_table_and_json(lm, model_dir, capsys):
    model, vocab = lm
    assert (
        main(
            [
                "substitutes",
                "The cat sat on the mat .",
                "--word",
                "2",
                "-k",
                "4",
                "--model",
                str(model_dir),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "The cat [sat] on the mat ."
    assert table[3].split()[:2] == ["rank", "left"]
    assert [line.split()[0] for line in table[4:8]] == ["1", "2", "3", "4"]
    expected = substitutes(model, "The cat sat on the mat .".split(), 2, k=4)
    assert table[4].split()[1::2] == [expected.forward[0][0], expected.backward[0][0], expected.both[0][0]]
    assert (
        main(
            [
                "substitutes",
                "The",
                "cat",
                "sat",
                "--word",
                "1",
                "-k",
                "3",
                "--json",
                "--model",
                str(model_dir),
            ]
        )
        == 0
    )
    record = json.loads(capsys.readouterr().out)
    assert record["word"] == "cat" and record["position"] == 1 and len(record["both"]) == 3
    assert set(record["both"][0]) == {"word", "probability"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_scores_and_distributions_on_a_gpu_equal_the_cpus(model_dir, lm, corpus):
    model, vocab = lm
    gpu_model = LanguageModel.from_pretrained(model_dir, device="cuda")
    for cpu, gpu in zip(score_sentences(model, corpus), score_sentences(gpu_model, corpus)):
        # (cuDNN may run the char CNN in TF32)
        assert gpu.forward_logprob == pytest.approx(cpu.forward_logprob, rel=1e-3, abs=1e-2)
        assert gpu.backward_logprob == pytest.approx(cpu.backward_logprob, rel=1e-3, abs=1e-2)
    tokens = "The cat sat on the mat .".split()
    cpu_result = substitutes(model, tokens, 2, k=5)
    gpu_result = substitutes(gpu_model, tokens, 2, k=5)
    assert gpu_result.both[0][0] == cpu_result.both[0][0]
    assert gpu_result.probability["both"] == pytest.approx(cpu_result.probability["both"], rel=1e-3)


# -- the examples of the language model's guide ---------------------------------------------------
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "language-model.md"


def _readme_block(after: str) -> list[str]:
    """The lines of the first ```text block after the line that starts with ``after``."""
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index("```text\n", text.index(after)) + len("```text\n")
    return text[start : text.index("```", start)].rstrip("\n").split("\n")


def _shipped_scoring_model() -> None:
    from elmokit.hub import DEFAULT_MODEL
    from elmokit.hub.shipped import MODELS_DIR

    if not (MODELS_DIR / DEFAULT_MODEL / "softmax.hdf5").is_file():
        pytest.skip("the shipped model has no softmax.hdf5")


def test_guide_score_example_is_what_the_shipped_model_gives(tmp_path, capsys):
    _shipped_scoring_model()
    expected = [json.loads(line) for line in _readme_block("`elmokit score INPUT")]
    source = tmp_path / "in.txt"
    source.write_text(f"{expected[0]['sentence']}\n\n{expected[1]['sentence']}\n", encoding="utf-8")
    assert main(["score", str(source), "--device", "cpu", "--quiet"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [list(r) for r in records] == [list(e) for e in expected]
    for record, shown in zip(records, expected):
        for name, value in shown.items():
            # Printed to 4 decimals; float32 sums differ in the 7th significant digit between
            # machines (an AMD AVX2 one gave perplexity 870.0721 for a shown 870.0739).
            want = pytest.approx(value, rel=1e-5, abs=2e-4) if isinstance(value, float) else value
            assert record[name] == want


def test_guide_substitutes_example_is_what_the_shipped_model_gives(capsys):
    _shipped_scoring_model()
    shown = _readme_block("`elmokit substitutes SENTENCE")
    sentence = shown[0].replace("[", "").replace("]", "")
    assert main(["substitutes", sentence, "--word", "4", "-k", "5", "--device", "cpu"]) == 0
    table = capsys.readouterr().out.rstrip("\n").split("\n")
    assert len(table) == len(shown)
    number = re.compile(r"\d+\.\d{4}")
    for line, expected in zip(table, shown):
        assert number.sub("#", line) == number.sub("#", expected)
        for got, want in zip(number.findall(line), number.findall(expected)):
            assert float(got) == pytest.approx(float(want), abs=2e-4)
