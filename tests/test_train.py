"""Training: the loss against a hand computation, exact resume, DDP equivalence, checkpoints, errors."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from elmokit import BiLM
from elmokit.checkpoints import latest_checkpoint, load_checkpoint_file
from elmokit.data import BidirectionalLMBatches, Vocabulary, count_tokens
from elmokit.evaluate import evaluate_perplexity
from elmokit.export import export_model, load_language_model
from elmokit.language_model import LanguageModel
from elmokit.launch import launch, run_processes
from elmokit.options import preset
from elmokit.train import TrainConfig, Trainer, TrainingError, setup_distributed, train

from .reference import run_direction, token_vector

WORDS = "the a of to in and stocks rose fell shares bank river money said year market oil".split()


def write_corpus(folder: Path, n_sentences: int = 120, n_files: int = 2, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(WORDS) + 1)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(n_files):
        lines = [
            " ".join(rng.choice(WORDS, size=rng.integers(3, 12), p=p / p.sum()))
            for _ in range(n_sentences // n_files)
        ]
        (folder / f"shard-{f}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(folder / "shard-*.txt")


@pytest.fixture()
def corpus(tmp_path) -> tuple[str, str]:
    pattern = write_corpus(tmp_path / "corpus")
    vocab = Vocabulary.build(count_tokens(pattern))
    vocab.save(tmp_path / "vocab.txt")
    return pattern, str(tmp_path / "vocab.txt")


def make_config(tmp_path: Path, corpus, **kw) -> TrainConfig:
    base = dict(
        train=corpus[0],
        vocab=corpus[1],
        save_dir=str(tmp_path / "run"),
        options=preset("tiny"),
        batch_size=4,
        unroll_steps=5,
        n_negative_samples=8,
        checkpoint_minutes=60,
        log_every=1,
    )
    base.update(kw)
    return TrainConfig(**base)


def test_one_batch_loss_equals_hand_computation(tmp_path, corpus):
    torch.manual_seed(0)
    vocab = Vocabulary.from_file(corpus[1])
    model = LanguageModel(preset("tiny"), len(vocab), dropout=0.0).eval()
    with torch.no_grad():
        for layer in model.bilm.lstm.layers:
            layer.bias.normal_(0, 1.0)
    model.bilm.save(tmp_path / "o.json", tmp_path / "w.hdf5")
    batch = next(iter(BidirectionalLMBatches(corpus[0], vocab, 2, 6, seed=3)))
    chars = torch.from_numpy(np.stack([batch["char_ids"], batch["char_ids_reverse"]])) + 1
    targets = torch.from_numpy(np.stack([batch["next_token_id"], batch["next_token_id_reverse"]]))
    with torch.no_grad():
        losses, _ = model(chars, targets, None, num_sampled=None)

    import h5py

    w = model.softmax.weight.detach().double().numpy()
    b = model.softmax.bias.detach().double().numpy()
    expected = []
    with h5py.File(tmp_path / "w.hdf5", "r") as f:
        for d, suffix in enumerate(["", "_reverse"]):
            total, n = 0.0, 0
            for row in range(2):
                tokens = [vocab.id_to_token(i) for i in batch["token_ids" + suffix][row]]
                xs = [token_vector(f, preset("tiny"), t) for t in tokens]
                top = run_direction(f, preset("tiny"), d, xs)[-1]
                for h, target in zip(top, batch["next_token_id" + suffix][row]):
                    logits = w @ h + b
                    log_z = np.log(np.exp(logits - logits.max()).sum()) + logits.max()
                    total += log_z - logits[target]
                    n += 1
            expected.append(total / n)
    np.testing.assert_allclose(losses.numpy(), expected, rtol=1e-5)


def test_resume_continues_exactly(tmp_path, corpus):
    whole = make_config(tmp_path / "a", corpus, save_dir=str(tmp_path / "a"), max_steps=6)
    train(whole, progress=False)
    first = make_config(tmp_path / "b", corpus, save_dir=str(tmp_path / "b"), max_steps=3)
    train(first, progress=False)
    second = make_config(tmp_path / "b", corpus, save_dir=str(tmp_path / "b"), max_steps=6)
    train(second, resume=True, progress=False)
    a, _ = load_language_model(tmp_path / "a")
    b, _ = load_language_model(tmp_path / "b")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    rows = (tmp_path / "b" / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("step,") and [r.split(",")[0] for r in rows[1:]] == list("123456")
    norms = [
        [float(r.split(",")[-1]) for r in (tmp_path / d / "metrics.csv").read_text().splitlines()[1:]]
        for d in "ab"
    ]
    assert rows[0].endswith(",grad_norm") and norms[0] == norms[1] and min(norms[0]) > 0


def test_metrics_log_from_an_older_version_gains_the_new_columns(tmp_path):
    from elmokit.train import _MetricsLog

    path = tmp_path / "metrics.csv"
    path.write_text(
        "step,tokens,seconds,loss_forward,loss_backward,perplexity,tokens_per_second\n1,20,0.5,9,9,8103.1,40\n"
    )
    log = _MetricsLog(path)
    log.write(**dict(zip(_MetricsLog.FIELDS, [2, 40, 1.0, 8, 8, 2981.0, 40, 3.5])))
    rows = path.read_text().splitlines()
    assert rows == [",".join(_MetricsLog.FIELDS), "1,20,0.5,9,9,8103.1,40,", "2,40,1.0,8,8,2981.0,40,3.5"]


def test_save_dir_with_another_run_needs_resume(tmp_path, corpus):
    train(make_config(tmp_path, corpus, max_steps=1), progress=False)
    with pytest.raises(TrainingError, match="holds another run; pass --resume"):
        train(make_config(tmp_path, corpus, max_steps=2), progress=False)
    with pytest.raises(TrainingError, match="no checkpoint"):
        train(make_config(tmp_path, corpus, save_dir=str(tmp_path / "new")), resume=True)


def test_unsorted_vocabulary_is_refused_when_sampling(tmp_path, corpus):
    tokens = Vocabulary.from_file(corpus[1]).tokens
    (tmp_path / "unsorted.txt").write_text("\n".join(tokens[:3] + tokens[3:][::-1]) + "\n")
    with pytest.raises(ValueError, match="not sorted by descending frequency"):
        train(make_config(tmp_path, corpus, vocab=str(tmp_path / "unsorted.txt"), max_steps=1))


def test_empty_corpus_and_missing_glob(tmp_path, corpus):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("\n\n")
    with pytest.raises((TrainingError, ValueError), match="empty corpus"):
        train(make_config(tmp_path, corpus, train=str(tmp_path / "empty" / "*.txt"), max_steps=1))
    with pytest.raises(FileNotFoundError, match="nothing/\\*.txt"):
        train(make_config(tmp_path, corpus, train=str(tmp_path / "nothing" / "*.txt")))


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, corpus):
    config = make_config(tmp_path, corpus)
    vocab = Vocabulary.from_file(corpus[1])
    data = BidirectionalLMBatches(corpus[0], vocab, 4, 5, seed=0)
    trainer = Trainer(config, data, len(vocab), setup_distributed("cpu"))
    batches = iter(data)
    trainer.step(next(batches))
    good = trainer.save_checkpoint()
    with torch.no_grad():
        trainer.model.softmax.bias.fill_(float("inf"))
    with pytest.raises(TrainingError, match="non-finite loss .* at step 2; the last good checkpoint"):
        trainer.step(next(batches))
    assert latest_checkpoint(tmp_path / "run") == good
    saved = load_checkpoint_file(good / "model.pt")["model"]
    assert torch.isfinite(saved["softmax.bias"]).all()


def test_evaluation_windows_equal_unroll_one_and_export_round_trip(tmp_path, corpus):
    train(make_config(tmp_path, corpus, max_steps=3), progress=False)
    model, vocab = load_language_model(tmp_path / "run")
    one = evaluate_perplexity(model, vocab, corpus[0], batch_size=4, window=1)
    many = evaluate_perplexity(model, vocab, corpus[0], batch_size=4, window=20)
    assert one.tokens == many.tokens > 100
    assert many.forward == pytest.approx(one.forward, rel=1e-5)
    assert many.backward == pytest.approx(one.backward, rel=1e-5)
    assert many.average == pytest.approx(np.sqrt(many.forward * many.backward), rel=1e-9)
    out = export_model(tmp_path / "run", tmp_path / "exported")
    exported, vocab2 = load_language_model(out)
    again = evaluate_perplexity(exported, vocab2, corpus[0], batch_size=4)
    assert again.average == pytest.approx(many.average, rel=1e-6)
    bilm = BiLM.load(out / "options.json", out / "weights.hdf5")
    for (name, x), (_, y) in zip(bilm.state_dict().items(), model.bilm.state_dict().items()):
        assert torch.equal(x, y), name
    history = json.loads((out / "training.json").read_text())
    assert history["steps"] == 3 and history["tokens"] == 3 * 4 * 5
    assert history["epochs"] == round(60 / history["config"]["n_train_tokens"], 3)
    assert (
        history["config"]["options"]
        == json.loads((tmp_path / "run" / "train_config.json").read_text())["options"]
    )


def test_init_from_copies_shared_softmax_rows(tmp_path, corpus):
    train(make_config(tmp_path, corpus, max_steps=2), progress=False)
    source, source_vocab = load_language_model(tmp_path / "run")
    new_vocab = Vocabulary(["<S>", "</S>", "<UNK>", "bank", "zebra", "the"])
    new_vocab.save(tmp_path / "v2.txt")
    config = make_config(
        tmp_path,
        corpus,
        save_dir=str(tmp_path / "ft"),
        vocab=str(tmp_path / "v2.txt"),
        init_from=str(tmp_path / "run"),
        max_steps=0,
        options={},
    )
    train(config, progress=False)
    tuned, _ = load_language_model(tmp_path / "ft")
    for token in ["bank", "the", "<S>"]:
        np.testing.assert_array_equal(
            tuned.softmax.weight[new_vocab.token_to_id(token)].detach(),
            source.softmax.weight[source_vocab.token_to_id(token)].detach(),
        )
    assert tuned.bilm.options == source.bilm.options


class FixedBatches:
    """The same few batches for every run, rows [lo:hi] of each (a rank's share)."""

    def __init__(self, batches, lo: int, hi: int) -> None:
        self.batches = [{k: v[lo:hi] for k, v in b.items()} for b in batches]
        self.position = 0

    def __iter__(self):
        while self.position < len(self.batches):
            self.position += 1
            yield self.batches[self.position - 1]

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def _ddp_worker(config: dict, batches, out: str) -> None:
    """One of the processes that ``run_processes`` starts (it finds its rank in the environment)."""
    run(TrainConfig(**config), batches, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), out)


def run(config: TrainConfig, batches, rank: int, world_size: int, out: str) -> None:
    env = setup_distributed("cpu")
    rows = batches[0]["token_ids"].shape[0] // world_size
    data = FixedBatches(batches, rank * rows, (rank + 1) * rows)
    vocab_size = len(Vocabulary.from_file(config.vocab))
    trainer = Trainer(config, data, vocab_size, env)
    for batch in data:
        trainer.step(batch)
    if rank == 0:
        torch.save(trainer.model.state_dict(), out)


def test_two_processes_equal_one_process_with_twice_the_batch(tmp_path, corpus):
    vocab = Vocabulary.from_file(corpus[1])
    batches = [b for _, b in zip(range(3), BidirectionalLMBatches(corpus[0], vocab, 8, 5, seed=1))]
    config = make_config(tmp_path, corpus, dropout=0.0, n_negative_samples=1000)  # full softmax
    run(config, batches, 0, 1, str(tmp_path / "one.pt"))
    run_processes(_ddp_worker, (dataclasses.asdict(config), batches, str(tmp_path / "two.pt")), nproc=2)
    one = torch.load(tmp_path / "one.pt", weights_only=True)
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    for name in one:
        torch.testing.assert_close(one[name], two[name], atol=1e-5, rtol=0, msg=name)
    assert not torch.equal(one["softmax.bias"], torch.zeros_like(one["softmax.bias"]))


def test_nproc_trains_in_two_processes_and_resumes(tmp_path, corpus):
    """``elmokit train --nproc 2``: two gloo processes through the elastic launcher, one checkpoint."""
    launch(make_config(tmp_path, corpus, max_steps=2), resume=False, processes=2)
    saved = load_checkpoint_file(latest_checkpoint(tmp_path / "run") / "model.pt")
    assert (saved["world_size"], saved["run"]["step"], saved["run"]["tokens"]) == (2, 2, 2 * 2 * 4 * 5)
    assert sorted(p.name for p in latest_checkpoint(tmp_path / "run").glob("*.pt")) == [
        "model.pt",
        "rank0.pt",
        "rank1.pt",
    ]
    with pytest.raises(TrainingError, match="written by 2 processes; resume with as many"):
        train(make_config(tmp_path, corpus, max_steps=3), resume=True, progress=False)


def test_bf16_autocast_step_runs_and_tracks_fp32(tmp_path, corpus):
    vocab = Vocabulary.from_file(corpus[1])
    batch = next(iter(BidirectionalLMBatches(corpus[0], vocab, 4, 5, seed=0)))
    results = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        config = make_config(tmp_path, corpus, precision=precision, dropout=0.0, n_negative_samples=1000)
        trainer = Trainer(config, None, len(vocab), setup_distributed("cpu"))
        results[precision] = trainer.step(batch)
        assert trainer.lstm_state.h.dtype == torch.float32
    np.testing.assert_allclose(results["bf16"], results["fp32"], rtol=0.02)


def test_state_reset_zeroes_carried_states(tmp_path, corpus):
    """state_reset=1 makes every window start from zero, like a fresh trainer per step; 0 carries."""
    vocab = Vocabulary.from_file(corpus[1])
    batches = [b for _, b in zip(range(3), BidirectionalLMBatches(corpus[0], vocab, 4, 5, seed=2))]

    def losses(state_reset: float, fresh_state: bool) -> list[tuple[float, float]]:
        torch.manual_seed(0)
        config = make_config(tmp_path, corpus, dropout=0.0, n_negative_samples=1000, state_reset=state_reset)
        trainer = Trainer(config, None, len(vocab), setup_distributed("cpu"))
        out = []
        for batch in batches:
            if fresh_state:
                trainer.lstm_state = None
            out.append(trainer.step(batch))
        return out

    reset, fresh, carried = losses(1.0, False), losses(0.0, True), losses(0.0, False)
    np.testing.assert_allclose(reset, fresh, rtol=1e-6)
    assert not np.allclose(carried[1:], fresh[1:], rtol=1e-6)


def test_sigint_stops_after_the_step_with_a_checkpoint(tmp_path, corpus):
    """Ctrl-C (or a scheduler's SIGTERM) ends the run like max_steps: the last step is kept."""
    import signal

    from elmokit.train import run_training

    vocab = Vocabulary.from_file(corpus[1])
    batches = [b for _, b in zip(range(6), BidirectionalLMBatches(corpus[0], vocab, 4, 5, seed=0))]

    class InterruptedBatches(FixedBatches):
        def __iter__(self):
            for k, batch in enumerate(super().__iter__()):
                if k == 3:  # the signal arrives while the 4th batch is being prepared
                    os.kill(os.getpid(), signal.SIGINT)
                yield batch

    config = make_config(tmp_path, corpus)
    (tmp_path / "run").mkdir()
    trainer = Trainer(config, InterruptedBatches(batches, 0, 4), len(vocab), setup_distributed("cpu"))
    run = run_training(trainer, max_steps=None, max_time=None, progress=False)
    assert run.step == 4
    assert latest_checkpoint(tmp_path / "run").name.endswith("4")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


def test_best_checkpoint_by_heldout_is_kept_and_exported(tmp_path, corpus, monkeypatch):
    """Checkpoints after steps 1, 2, 3 (and at the end, 3 again) score 5, 4, 6, 6: step 2 stays
    on disk as the best, step 1 is deleted, and export can take either."""
    import elmokit.train as training

    scores = iter([5.0, 4.0, 6.0, 6.0])

    def scripted(*args, **kwargs):
        value = next(scores)
        return training.Perplexity(value, value, value, value, 10, "scripted")

    monkeypatch.setattr(training, "evaluate_perplexity", scripted)
    config = make_config(tmp_path, corpus, max_steps=3, checkpoint_minutes=0, heldout=corpus[0])
    train(config, progress=False)
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("checkpoint-*")) == [
        "checkpoint-000000002",
        "checkpoint-000000003",
    ]
    best = json.loads((run / "best.json").read_text())
    assert (best["folder"], best["step"], best["average"]) == ("checkpoint-000000002", 2, 4.0)
    assert latest_checkpoint(run).name == "checkpoint-000000003"
    for which, step in (("best", 2), ("latest", 3)):
        out = export_model(run, tmp_path / which, checkpoint=which)
        history = json.loads((out / "training.json").read_text())
        assert (history["steps"], history["checkpoint"]) == (step, which)
        saved = load_checkpoint_file(run / f"checkpoint-{step:09d}" / "model.pt")["model"]
        bilm = BiLM.load(out / "options.json", out / "weights.hdf5")
        for name, value in bilm.state_dict().items():
            assert torch.equal(value, saved[f"bilm.{name}"]), name
    train(make_config(tmp_path, corpus, max_steps=1, save_dir=str(tmp_path / "no-heldout")), progress=False)
    with pytest.raises(FileNotFoundError, match="no best checkpoint"):
        export_model(tmp_path / "no-heldout", tmp_path / "x", checkpoint="best")
