"""Training: the loss against a hand computation, exact resume, DDP equivalence, checkpoints, errors."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from elmokit import BiLM
from elmokit.base._processes import run_processes
from elmokit.lm.checkpoints import SaveFolder, load_checkpoint_file
from elmokit.lm.language_model import LanguageModel
from elmokit.lm.vocabulary import Vocabulary
from elmokit.model.options import preset
from elmokit.training import loop
from elmokit.training.collectives import Distributed, setup_distributed
from elmokit.training.config import TrainConfig, TrainingError, prepare_run, resume_config
from elmokit.training.data import BidirectionalLMBatches, count_tokens
from elmokit.training.evaluate import evaluate_perplexity
from elmokit.training.export import export_model
from elmokit.training.launch import launch
from elmokit.training.loop import StopRequest, Trainer

from ..reference import run_direction, token_vector

CPU = Distributed(device=torch.device("cpu"))

WORDS = "the a of to in and stocks rose fell shares bank river money said year market oil".split()


def _load_lm(folder):
    """(LanguageModel, Vocabulary) of a save dir or an exported model folder, on the CPU."""
    model = LanguageModel.from_pretrained(folder, device="cpu")
    return model, model.vocab


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


def train(
    config: TrainConfig,
    resume: bool = False,
    progress: bool = True,
    new_data: bool = False,
    resume_from: str | None = None,
) -> loop.Outcome:
    """A run in this process as `elmokit train` runs it: on resume the stored configuration with
    the changes ``config`` gives, checked once (``prepare_run``), then the loop."""
    if resume:
        config = resume_config(config.save_dir, dataclasses.asdict(config))
    config = prepare_run(config, resume, new_data=new_data, resume_from=resume_from)
    return loop.train(config, resume=resume, progress=progress, new_data=new_data, resume_from=resume_from)


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
    a = LanguageModel.from_pretrained(tmp_path / "a", device="cpu")
    b = LanguageModel.from_pretrained(tmp_path / "b", device="cpu")
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
    from elmokit.training.metrics import MetricsLog

    path = tmp_path / "metrics.csv"
    path.write_text(
        "step,tokens,seconds,loss_forward,loss_backward,perplexity,tokens_per_second\n1,20,0.5,9,9,8103.1,40\n"
    )
    log = MetricsLog(path)
    log.write(**dict(zip(MetricsLog.FIELDS, [2, 40, 1.0, 8, 8, 2981.0, 40, 3.5])))
    rows = path.read_text().splitlines()
    assert rows == [",".join(MetricsLog.FIELDS), "1,20,0.5,9,9,8103.1,40,", "2,40,1.0,8,8,2981.0,40,3.5"]


def test_save_dir_with_another_run_needs_resume(tmp_path, corpus):
    train(make_config(tmp_path, corpus, max_steps=1), progress=False)
    with pytest.raises(TrainingError, match="holds another run; pass --resume"):
        train(make_config(tmp_path, corpus, max_steps=2), progress=False)
    with pytest.raises(
        TrainingError,
        match=r"^--resume: .*/new holds no run \(no train_config.json\); start it without --resume$",
    ):
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


def test_non_finite_loss_stops_and_says_which_checkpoint_is_kept(tmp_path, corpus):
    config = make_config(tmp_path, corpus)
    (tmp_path / "run").mkdir()
    vocab = Vocabulary.from_file(corpus[1])
    data = BidirectionalLMBatches(corpus[0], vocab, 4, 5, seed=0)
    batches = iter(data)
    fresh = Trainer(config, data, len(vocab), CPU)
    with torch.no_grad():
        fresh.model.softmax.bias.fill_(float("inf"))
    with pytest.raises(
        TrainingError,
        match=r"^non-finite loss \(nan\) at step 1; the run stopped; it had not written a checkpoint yet$",
    ):
        fresh.step(next(batches))
    trainer = Trainer(config, data, len(vocab), CPU)
    trainer.step(next(batches))
    good = trainer.save_checkpoint()
    with torch.no_grad():
        trainer.model.softmax.bias.fill_(float("inf"))
    kept = f"its last checkpoint, step 1, is kept in {tmp_path / 'run'}"
    with pytest.raises(
        TrainingError, match=r"^non-finite loss \(nan\) at step 2; the run stopped; " + re.escape(kept) + "$"
    ):
        trainer.step(next(batches))
    assert SaveFolder(tmp_path / "run").latest_checkpoint() == good
    saved = load_checkpoint_file(good / "model.pt")["model"]
    assert torch.isfinite(saved["softmax.bias"]).all()


def test_evaluation_windows_equal_unroll_one_and_export_round_trip(tmp_path, corpus):
    train(make_config(tmp_path, corpus, max_steps=3), progress=False)
    model, vocab = _load_lm(tmp_path / "run")
    one = evaluate_perplexity(model, vocab, corpus[0], batch_size=4, window=1)
    many = evaluate_perplexity(model, vocab, corpus[0], batch_size=4, window=20)
    assert one.tokens == many.tokens > 100
    assert many.forward == pytest.approx(one.forward, rel=1e-5)
    assert many.backward == pytest.approx(one.backward, rel=1e-5)
    assert many.average == pytest.approx(np.sqrt(many.forward * many.backward), rel=1e-9)
    out = export_model(tmp_path / "run", tmp_path / "exported")
    exported, vocab2 = _load_lm(out)
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
    from elmokit.training.loop import initialize_from

    train(make_config(tmp_path, corpus, max_steps=2), progress=False)
    source, source_vocab = _load_lm(tmp_path / "run")
    new_vocab = Vocabulary(["<S>", "</S>", "<UNK>", "bank", "zebra", "the"])
    new_vocab.save(tmp_path / "v2.txt")
    tuned = LanguageModel(source.bilm.options.to_dict(), len(new_vocab))
    assert initialize_from(tuned, tmp_path / "run", new_vocab) == 5  # all but "zebra"
    for token in ["bank", "the", "<S>"]:
        np.testing.assert_array_equal(
            tuned.softmax.weight[new_vocab.token_to_id(token)].detach(),
            source.softmax.weight[source_vocab.token_to_id(token)].detach(),
        )
    for name, value in source.bilm.state_dict().items():
        assert torch.equal(tuned.bilm.state_dict()[name], value), name
    config = make_config(
        tmp_path,
        corpus,
        save_dir=str(tmp_path / "ft"),
        vocab=str(tmp_path / "v2.txt"),
        init_from=str(tmp_path / "run"),
        max_steps=1,
        options={},
    )
    train(config, progress=False)
    fine_tuned, _ = _load_lm(tmp_path / "ft")
    assert fine_tuned.bilm.options == source.bilm.options


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


def _ddp_worker(config: TrainConfig, batches, out: str) -> None:
    """One of the processes that ``run_processes`` starts (it finds its rank in the environment)."""
    run(config, batches, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), out)


def run(config: TrainConfig, batches, rank: int, world_size: int, out: str) -> None:
    env = setup_distributed(config)
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
    run_processes(_ddp_worker, (config, batches, str(tmp_path / "two.pt")), nproc=2)
    one = torch.load(tmp_path / "one.pt", weights_only=True)
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    for name in one:
        torch.testing.assert_close(one[name], two[name], atol=1e-5, rtol=0, msg=name)
    assert not torch.equal(one["softmax.bias"], torch.zeros_like(one["softmax.bias"]))


def test_nproc_trains_in_two_processes_and_resumes(tmp_path, corpus):
    """``elmokit train --nproc 2``: two gloo processes through the elastic launcher, one checkpoint."""
    launch(make_config(tmp_path, corpus, max_steps=2), resume=False, processes=2)
    saved = load_checkpoint_file(SaveFolder(tmp_path / "run").latest_checkpoint() / "model.pt")
    assert (saved["world_size"], saved["run"]["step"], saved["run"]["tokens"]) == (2, 2, 2 * 2 * 4 * 5)
    assert sorted(p.name for p in SaveFolder(tmp_path / "run").latest_checkpoint().glob("*.pt")) == [
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
        trainer = Trainer(config, None, len(vocab), CPU)
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
        trainer = Trainer(config, None, len(vocab), CPU)
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

    from elmokit.training.loop import run_training

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
    trainer = Trainer(config, InterruptedBatches(batches, 0, 4), len(vocab), CPU)
    outcome = run_training(trainer, max_steps=None, max_time=None, progress=False)
    assert (outcome.run.step, outcome.signal, outcome.ended_by, outcome.finished) == (
        4,
        signal.SIGINT,
        "SIGINT",
        False,
    )
    assert SaveFolder(tmp_path / "run").latest_checkpoint().name.endswith("4")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


def test_best_checkpoint_by_heldout_is_kept_and_exported(tmp_path, corpus, monkeypatch):
    """Checkpoints after steps 1, 2, 3 score 5, 4, 6 (the end writes none: step 3 has one):
    step 2 stays on disk as the best, step 1 is deleted, and export can take either."""
    import elmokit.training.loop as training

    scores = iter([5.0, 4.0, 6.0])

    def scripted(*args, **kwargs):
        value = next(scores)
        return training.Perplexity(value, value, value, value, 10, "scripted")

    monkeypatch.setattr(training, "evaluate_perplexity", scripted)
    heldout = write_corpus(tmp_path / "heldout", n_sentences=300, n_files=1, seed=9)
    config = make_config(tmp_path, corpus, max_steps=3, checkpoint_minutes=0, heldout=heldout)
    train(config, progress=False)
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("checkpoint-*")) == [
        "checkpoint-000000002",
        "checkpoint-000000003",
    ]
    best = json.loads((run / "best.json").read_text())
    assert (best["folder"], best["step"], best["average"]) == ("checkpoint-000000002", 2, 4.0)
    assert SaveFolder(run).latest_checkpoint().name == "checkpoint-000000003"
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


# -- the command line: resumption, limits, signals, errors ------------------------------------

TINY_RUN = ["--config", "tiny", "--batch-size", "4", "--unroll-steps", "5", "--n-negative-samples", "8"]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``elmokit ARGS`` in this process: (exit status, stdout, stderr)."""
    from elmokit.cli import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as exit:  # argparse
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else ""


def weights(save_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint_file(SaveFolder(save_dir).latest_checkpoint() / "model.pt")["model"]


def steps_logged(save_dir: Path) -> list[int]:
    return [int(r.split(",")[0]) for r in (save_dir / "metrics.csv").read_text().splitlines()[1:]]


def test_kept_checkpoints_rotate_and_their_average_exports(tmp_path, corpus, capsys):
    """--keep-checkpoints N keeps the newest N checkpoints (a resume may lower N: the oldest go);
    export/evaluate --average N use the mean of their weights, computed here by hand."""
    run = tmp_path / "run"
    code, _, err = cli(
        capsys, "train", "--train", corpus[0], "--vocab", corpus[1], "--save-dir", run, *TINY_RUN,
        "--checkpoint-minutes", 0, "--max-steps", 4, "--keep-checkpoints", 3,
    )
    assert code == 0, err
    folders = sorted(p.name for p in run.glob("checkpoint-*"))
    assert folders == [f"checkpoint-00000000{s}" for s in (2, 3, 4)]
    saved = [load_checkpoint_file(run / name / "model.pt")["model"] for name in folders]
    assert not torch.equal(saved[0]["softmax.weight"], saved[2]["softmax.weight"])
    code, out, err = cli(capsys, "export", run, tmp_path / "mean", "--average", 3)
    assert code == 0 and "mean of the newest 3 checkpoints" in out, err
    history = json.loads((tmp_path / "mean" / "training.json").read_text())
    assert (history["steps"], history["averaged_steps"]) == (4, [2, 3, 4])
    bilm = BiLM.load(tmp_path / "mean" / "options.json", tmp_path / "mean" / "weights.hdf5")
    for name, value in bilm.state_dict().items():
        by_hand = sum(w[f"bilm.{name}"].double() for w in saved) / 3
        assert torch.equal(value, by_hand.float()), name
    model, _ = _load_lm(tmp_path / "mean")
    by_hand = (sum(w["softmax.weight"].double() for w in saved) / 3).float()
    assert torch.equal(model.softmax.weight, by_hand)
    heldout = write_corpus(tmp_path / "heldout", n_sentences=300, n_files=1, seed=9)
    code, out, err = cli(capsys, "evaluate", run, "--heldout", heldout, "--average", 2, "--quiet")
    assert code == 0 and "perplexity forward" in out, err

    for args, message in [
        (
            ("export", run, tmp_path / "x", "--average", 4),
            "holds 3 recent checkpoint(s) (steps 2, 3, 4; the run keeps 3); train with --keep-checkpoints 4",
        ),
        (("export", tmp_path / "mean", tmp_path / "y", "--average", 2), "--average needs a training save dir"),
        (("export", run, tmp_path / "z", "--average", 2, "--checkpoint", "best"), "not allowed with argument"),
        (("export", run, tmp_path / "z", "--average", 0), "--average"),
    ]:
        code, _, err = cli(capsys, *args)
        assert code == 2 and message in err and len(err.strip().splitlines()) in (1, 2), err
        assert "Traceback" not in err

    code, _, err = cli(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 5, "--keep-checkpoints", 2)
    assert code == 0, err
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-000000004", "checkpoint-000000005"]
    assert json.loads((run / "train_config.json").read_text())["keep_checkpoints"] == 2
    # An older best checkpoint stays on disk but is not one of the recent ones an average takes.
    import shutil

    shutil.copytree(run / "checkpoint-000000004", run / "checkpoint-000000001")
    (run / "best.json").write_text(json.dumps({"folder": "checkpoint-000000001", "step": 1, "average": 1.0}))
    code, _, err = cli(capsys, "export", run, tmp_path / "x", "--average", 3)
    assert code == 2 and "holds 2 recent checkpoint(s) (steps 4, 5; the run keeps 2)" in err
    code, _, err = cli(capsys, "export", run, tmp_path / "last2", "--average", 2)
    assert code == 0, err
    assert json.loads((tmp_path / "last2" / "training.json").read_text())["averaged_steps"] == [4, 5]


def test_resume_trains_the_given_save_dir_which_may_be_moved(tmp_path, corpus, capsys, monkeypatch):
    """Issue 13.1: a copied run dir resumes itself (not the original), from another working
    directory, with relative paths given at the start; train_config.json stores no save dir and
    absolute data paths; an old one with an absolute save_dir still resumes the given dir."""
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli(
        capsys,
        "train",
        "--train",
        "corpus/shard-*.txt",
        "--vocab",
        "vocab.txt",
        "--save-dir",
        "a",
        "--max-steps",
        2,
        *TINY_RUN,
    )
    assert code == 0 and last_line(out).startswith("finished at step 2: reached --max-steps 2.")
    stored = json.loads((tmp_path / "a" / "train_config.json").read_text())
    assert "save_dir" not in stored
    assert (stored["train"], stored["vocab"]) == (
        str(tmp_path / "corpus/shard-*.txt"),
        str(tmp_path / "vocab.txt"),
    )
    original = sorted(p.name for p in (tmp_path / "a").iterdir())
    a_weights = weights(tmp_path / "a")

    import shutil

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, _ = cli(capsys, "train", "--save-dir", tmp_path / "b", "--resume", "--max-steps", 3)
    assert code == 0 and last_line(out).startswith("finished at step 3: reached --max-steps 3.")
    assert SaveFolder(tmp_path / "b").latest_checkpoint().name == "checkpoint-000000003"
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == original  # untouched
    assert SaveFolder(tmp_path / "a").latest_checkpoint().name == "checkpoint-000000002"
    assert all(torch.equal(a_weights[k], v) for k, v in weights(tmp_path / "a").items())

    # a train_config.json of an older version names its save dir: ignored
    stored = json.loads((tmp_path / "b" / "train_config.json").read_text())
    (tmp_path / "b" / "train_config.json").write_text(json.dumps({**stored, "save_dir": str(tmp_path / "a")}))
    # the corpus moves; the data position names its shards by file name
    shutil.move(tmp_path / "corpus", tmp_path / "moved")
    code, _, err = cli(capsys, "train", "--save-dir", tmp_path / "b", "--resume", "--max-steps", 4)
    assert (
        code == 2
        and last_line(err)
        == f"elmokit: error: no files match the corpus glob '{tmp_path}/corpus/shard-*.txt'"
    )
    code, out, _ = cli(
        capsys,
        "train",
        "--save-dir",
        tmp_path / "b",
        "--resume",
        "--max-steps",
        4,
        "--train",
        tmp_path / "moved" / "shard-*.txt",
    )
    assert code == 0 and SaveFolder(tmp_path / "b").latest_checkpoint().name == "checkpoint-000000004"
    assert SaveFolder(tmp_path / "a").latest_checkpoint().name == "checkpoint-000000002"
    stored = json.loads((tmp_path / "b" / "train_config.json").read_text())
    assert "save_dir" not in stored and stored["train"] == str(tmp_path / "moved" / "shard-*.txt")
    # other shards are refused by name
    (tmp_path / "moved" / "shard-1.txt").rename(tmp_path / "moved" / "shard-9.txt")
    code, _, err = cli(capsys, "train", "--save-dir", tmp_path / "b", "--resume", "--max-steps", 5)
    assert code == 2 and last_line(err) == (
        "elmokit: error: the data position is for the shards shard-0.txt, shard-1.txt, but the "
        "corpus glob matches shard-0.txt, shard-9.txt; resume with the same shards (they may be moved), "
        "or add --new-data to read the new ones from their beginning"
    )
    # --new-data: weights, optimizer and step continue on the new shards, read from their start
    before = torch.load(SaveFolder(tmp_path / "b").latest_checkpoint() / "model.pt", weights_only=True)
    code, out, err = cli(
        capsys, "-v", "train", "--save-dir", tmp_path / "b", "--resume", "--new-data", "--max-steps", 5
    )
    assert code == 0 and out.count("continuing step 4 on a new corpus") == 1
    assert "continuing step" not in err  # once: the run's messages are its output, not also its log
    assert SaveFolder(tmp_path / "b").latest_checkpoint().name == "checkpoint-000000005"
    after = torch.load(SaveFolder(tmp_path / "b").latest_checkpoint() / "model.pt", weights_only=True)
    assert (
        after["run"]["step"] == 5
        and after["optimizer"]["state"].keys() == before["optimizer"]["state"].keys()
    )
    rank0 = torch.load(SaveFolder(tmp_path / "b").latest_checkpoint() / "rank0.pt", weights_only=True)
    stream = rank0["data"]["forward"]["stream"]
    # shards by file name only: no machine path in a checkpoint
    assert stream["files"] == ["shard-0.txt", "shard-9.txt"] and stream["epoch"] == 0
    code, _, err = cli(
        capsys, "train", "--save-dir", tmp_path / "c", "--new-data", "--train", "x", "--vocab", "y"
    )
    assert code == 2 and last_line(err) == "elmokit: error: --new-data continues a run: give it with --resume"


def test_committed_training_state_names_no_machine_path(tmp_path):
    """checkpoints/news-512 resumes with the data paths given (checkpoints/README.md)."""

    run = Path(__file__).parents[2] / "checkpoints" / "news-512"
    stored = json.loads((run / "train_config.json").read_text())

    def strings(value):
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        return [value] if isinstance(value, str) else []

    assert "save_dir" not in stored and not [s for s in strings(stored) if "/" in s]
    with pytest.raises(TrainingError, match="names no training data: pass --train"):
        resume_config(run, {})
    config = resume_config(run, {"train": "corpus/train/*.txt", "heldout": "h.txt", "max_time": 60})
    assert (config.save_dir, config.train, config.heldout) == (
        str(run),
        os.path.abspath("corpus/train/*.txt"),
        os.path.abspath("h.txt"),
    )
    assert (config.max_time, config.epochs, config.state_reset, config.batch_size) == (60, None, 0.01, 64)


def test_a_run_stopped_before_its_first_checkpoint_starts_again_or_resumes(tmp_path, corpus, monkeypatch):
    """Issue 13.2: a crash before the first checkpoint leaves a config and no checkpoint; the
    dir can be started afresh, or resumed from step 0 with its stored configuration."""
    train(make_config(tmp_path, corpus, save_dir=str(tmp_path / "reference"), max_steps=3), progress=False)
    real_step = Trainer.step

    def crash_at_step_3(self, batch):
        if self.run.step == 2:
            raise RuntimeError("the machine went away")
        return real_step(self, batch)

    for resume in (True, False):
        with monkeypatch.context() as m:
            m.setattr(Trainer, "step", crash_at_step_3)
            with pytest.raises(RuntimeError, match="went away"):
                train(make_config(tmp_path, corpus, max_steps=3, batch_size=2), progress=False)
        assert SaveFolder(tmp_path / "run").latest_checkpoint() is None and steps_logged(tmp_path / "run") == [1, 2]
        config = make_config(tmp_path, corpus, max_steps=3)
        if resume:  # the stored configuration (batch 2) applies; the limits may change
            config = make_config(tmp_path, corpus, batch_size=2, max_steps=3)
        outcome = train(config, resume=resume, progress=False)
        assert (outcome.run.step, outcome.ended_by) == (3, "--max-steps 3")
        assert steps_logged(tmp_path / "run") == [1, 2, 3]
        if not resume:  # started afresh with batch 4: the same as an uninterrupted run
            assert all(
                torch.equal(weights(tmp_path / "reference")[k], v)
                for k, v in weights(tmp_path / "run").items()
            )
        shutil_rmtree(tmp_path / "run")


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


def test_resume_changes_only_what_it_may(tmp_path, corpus, capsys):
    """Issue 13.3: --heldout, --checkpoint-minutes, the limits, --device and the data paths
    change on resume (and are recorded); other options must equal the run's; --heldout is checked
    before training, fresh and on resume."""
    run = tmp_path / "run"
    data = ["--train", corpus[0], "--vocab", corpus[1], "--save-dir", run]
    (tmp_path / "small.txt").write_text("the bank\n" * 10)
    heldout = write_corpus(tmp_path / "heldout", n_sentences=300, n_files=1, seed=5)
    code, _, err = cli(
        capsys, "train", *data, "--max-steps", 1, "--heldout", tmp_path / "nothing*.txt", *TINY_RUN
    )
    assert (
        code == 2
        and last_line(err)
        == f"elmokit: error: --heldout {tmp_path}/nothing*.txt: no files match the corpus glob '{tmp_path}/nothing*.txt'"
    )
    assert not run.exists()  # nothing left behind
    assert cli(capsys, "train", *data, "--max-steps", 1, *TINY_RUN)[0] == 0
    before = (run / "train_config.json").read_text()
    too_small = (
        f"elmokit: error: --heldout {tmp_path}/small.txt: too little text for bilm-tf's evaluation "
        "protocol, which needs at least 256 sentences (one batch of 256 streams)"
    )
    refused = {
        ("--heldout", tmp_path / "small.txt"): too_small,
        (
            "--batch-size",
            8,
        ): "elmokit: error: --batch-size cannot change when resuming (the run's is 4, given 8); "
        "a resumed run may change only --train, --vocab, --heldout, --epochs, --max-steps, --max-time, "
        "--device, --checkpoint-minutes, --keep-checkpoints, --precision",
        (
            "--config",
            "small",
        ): "elmokit: error: --config cannot change when resuming; a resumed run may change only "
        "--train, --vocab, --heldout, --epochs, --max-steps, --max-time, --device, --checkpoint-minutes, "
        "--keep-checkpoints, --precision",
        (
            "--seed",
            3,
        ): "elmokit: error: --seed cannot change when resuming (the run's is 0, given 3); a resumed run "
        "may change only --train, --vocab, --heldout, --epochs, --max-steps, --max-time, --device, "
        "--checkpoint-minutes, --keep-checkpoints, --precision",
        ("--vocab", tmp_path / "other.txt"): f"elmokit: error: --vocab {tmp_path}/other.txt is not the run's "
        f"vocabulary ({run}/vocab.txt); a resumed run keeps it",
    }
    Vocabulary(["<S>", "</S>", "<UNK>", "the"]).save(tmp_path / "other.txt")
    for args, message in refused.items():
        code, _, err = cli(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 2, *args)
        assert (code, last_line(err)) == (2, message)
        assert (run / "train_config.json").read_text() == before and SaveFolder(run).latest_checkpoint().name.endswith("1")
    code, out, _ = cli(
        capsys,
        "train",
        *data,
        *TINY_RUN,
        "--resume",
        "--max-steps",
        3,
        "--heldout",
        heldout,
        "--checkpoint-minutes",
        0,
        "--device",
        "cpu",
    )
    assert code == 0 and last_line(out).startswith("finished at step 3: reached --max-steps 3.")
    stored = json.loads((run / "train_config.json").read_text())
    assert (stored["heldout"], stored["checkpoint_minutes"], stored["max_steps"]) == (heldout, 0, 3)
    assert [r.split(",")[0] for r in (run / "heldout.csv").read_text().splitlines()] == ["step", "2", "3"]


def test_a_signal_stops_early_with_its_exit_status_and_a_limit_ends_normally(
    tmp_path, corpus, capsys, monkeypatch
):
    """Issue 13.4: SIGTERM ends the run with exit status 143, saying it stopped early and how to
    resume; reaching a limit exits 0 and names the limit."""
    import signal

    run = tmp_path / "run"
    data = ["--train", corpus[0], "--vocab", corpus[1], "--save-dir", run]
    real_step = Trainer.step

    def terminated_in_step_2(self, batch):
        if self.run.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self, batch)

    with monkeypatch.context() as m:
        m.setattr(Trainer, "step", terminated_in_step_2)
        code, out, err = cli(capsys, "train", *data, "--max-steps", 4, *TINY_RUN)
    assert code == 128 + signal.SIGTERM
    assert last_line(err) == (
        f"elmokit: stopped early by SIGTERM at step 2: the run is not finished (its checkpoint is in "
        f"{run}). Resume with: elmokit train --save-dir {run} --resume"
    )
    assert "finished" not in out and SaveFolder(run).latest_checkpoint().name == "checkpoint-000000002"
    code, out, _ = cli(capsys, "train", "--save-dir", run, "--resume")  # its limit: --max-steps 4
    assert code == 0 and last_line(out) == (
        f"finished at step 4: reached --max-steps 4. Checkpoint and metrics.csv in {run}; export with: "
        f"elmokit export {run} OUT_DIR"
    )
    code, out, _ = cli(capsys, "train", *data, "--epochs", 0.05, *TINY_RUN, "--save-dir", tmp_path / "epochs")
    assert code == 0 and last_line(out).startswith("finished at step 2: reached --epochs 0.05 (2 steps).")
    code, out, _ = cli(
        capsys, "train", *data, "--max-time", "0.001", *TINY_RUN, "--save-dir", tmp_path / "time"
    )
    assert code == 0 and last_line(out).startswith("finished at step 1: reached --max-time 0.001 s.")

    def terminated_twice_in_step_5(self, batch):  # the second signal stops at once
        if self.run.step == 4:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self, batch)

    monkeypatch.setattr(Trainer, "step", terminated_twice_in_step_5)
    monkeypatch.setattr(StopRequest, "REPEAT_SECONDS", 0.0)
    code, out, err = cli(capsys, "train", "--save-dir", run, "--resume", "--max-steps", 6)
    assert code == 128 + signal.SIGTERM and last_line(err) == (
        "elmokit: stopped at once by SIGTERM; the steps since the last checkpoint are lost. Resume with: "
        f"elmokit train --save-dir {run} --resume"
    )
    assert (
        SaveFolder(run).latest_checkpoint().name == "checkpoint-000000004"
        and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    )


def test_bilm_tf_training_options_file_trains(tmp_path, corpus, capsys, tiny_options):
    """Issue 13.6: bilm-tf's own training options (n_characters 261, its training fields) train,
    stored and exported as 262 (elmokit's layout, bilm-tf's value for inference)."""
    options = json.loads(json.dumps(tiny_options))
    options["char_cnn"]["n_characters"] = 261
    options.update(
        bidirectional=True,
        dropout=0.1,
        all_clip_norm_val=10.0,
        n_epochs=10,
        unroll_steps=20,
        batch_size=128,
        n_tokens_vocab=20,
        n_train_tokens=768648884,
        n_negative_samples_batch=8192,
    )
    (tmp_path / "bilm-tf.json").write_text(json.dumps(options))
    run = tmp_path / "run"
    code, out, _ = cli(
        capsys,
        "train",
        "--train",
        corpus[0],
        "--vocab",
        corpus[1],
        "--save-dir",
        run,
        "--max-steps",
        2,
        "--config",
        tmp_path / "bilm-tf.json",
        "--batch-size",
        4,
        "--unroll-steps",
        5,
        "--n-negative-samples",
        8,
    )
    assert code == 0 and "finished at step 2" in out
    assert json.loads((run / "train_config.json").read_text())["options"]["char_cnn"]["n_characters"] == 262
    out_dir = export_model(run, tmp_path / "model")
    assert json.loads((out_dir / "options.json").read_text())["char_cnn"]["n_characters"] == 262
    bilm = BiLM.load(out_dir / "options.json", out_dir / "weights.hdf5")
    assert bilm.token_encoder.char_cnn.embedding.num_embeddings == 262
    code, _, _ = cli(
        capsys,
        "train",
        "--save-dir",
        run,
        "--resume",
        "--max-steps",
        3,
        "--config",
        tmp_path / "bilm-tf.json",
    )
    assert code == 0  # the same model, in bilm-tf's words
    options["char_cnn"]["n_characters"] = 100
    (tmp_path / "bad.json").write_text(json.dumps(options))
    code, _, err = cli(
        capsys,
        "train",
        "--train",
        corpus[0],
        "--vocab",
        corpus[1],
        "--save-dir",
        tmp_path / "bad",
        "--config",
        tmp_path / "bad.json",
    )
    assert code == 2 and last_line(err).startswith("elmokit: error: --config: char_cnn.n_characters must be")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--epochs", "0"], "argument --epochs: must be greater than 0, got 0"),
        (["--epochs", "-1"], "argument --epochs: must be greater than 0, got -1"),
        (["--max-steps", "0"], "argument --max-steps: must be at least 1, got 0"),
        (["--max-steps", "-5"], "argument --max-steps: must be at least 1, got -5"),
        (["--max-steps", "1.5"], "argument --max-steps: not an integer: '1.5'"),
        (["--max-time", "0"], "argument --max-time: must be greater than 0, got 0"),
        (["--state-reset", "2"], "argument --state-reset: must be at most 1, got 2"),
        (["--state-reset", "-1"], "argument --state-reset: must be at least 0, got -1"),
        (["--nproc", "0"], "argument --nproc: must be at least 1, got 0"),
        (["--checkpoint-minutes", "-1"], "argument --checkpoint-minutes: must be at least 0, got -1"),
        (["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
        (["--lr", "0"], "argument --lr: must be greater than 0, got 0"),
        (["--seed", "-1"], "argument --seed: must be at least 0, got -1"),
    ],
)
def test_out_of_range_options_are_refused_when_parsed(args, message, capsys):
    """Issue 13.7: exit 2 with argparse's one-line error, before anything runs."""
    code, _, err = cli(capsys, "train", "--train", "x", "--vocab", "y", "--save-dir", "z", *args)
    assert (code, last_line(err)) == (2, f"elmokit: error: {message}; see 'elmokit train --help'")


def test_out_of_range_values_are_refused_by_the_api_and_the_other_commands(tmp_path, corpus, capsys):
    for field, value, message in [
        ("max_steps", 0, "--max-steps must be at least 1, got 0"),
        ("epochs", -1, "--epochs must be greater than 0, got -1"),
        ("state_reset", 2, "--state-reset must be at most 1, got 2"),
        ("checkpoint_minutes", -1, "--checkpoint-minutes must be at least 0, got -1"),
        ("precision", "fp8", "--precision must be one of fp32, bf16, got 'fp8'"),
    ]:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            train(make_config(tmp_path, corpus, **{field: value}), progress=False)
    with pytest.raises(ValueError, match="^--nproc must be at least 1, got 0$"):
        launch(make_config(tmp_path, corpus, max_steps=1), resume=False, processes=0)
    assert not (tmp_path / "run").exists()
    code, _, err = cli(capsys, "demo", "-k", "-1")
    assert (code, last_line(err)) == (
        2,
        "elmokit: error: argument -k: must be at least 1, got -1; see 'elmokit demo --help'",
    )
    code, _, err = cli(capsys, "vocab", corpus[0], "-o", tmp_path / "v.txt", "--min-count", "0")
    assert (code, last_line(err)) == (
        2,
        "elmokit: error: argument --min-count: must be at least 1, got 0; see 'elmokit vocab --help'",
    )


def test_leftovers_of_a_crash_are_removed_and_replayed_steps_logged_once(tmp_path, corpus):
    """Issue 13.8: a partial checkpoint folder and the temporary file of a killed writer are
    deleted when the run starts again, an older checkpoint folder (a rotation cut short) by the
    run's rotation at its next checkpoint; metrics.csv keeps each step once."""
    import subprocess

    from elmokit.base.atomic import atomic_path

    run = tmp_path / "run"
    train(make_config(tmp_path, corpus, max_steps=2), progress=False)
    (run / ".checkpoint-000000003.partial").mkdir()
    (run / ".checkpoint-000000003.partial" / "rank0.pt").write_bytes(b"half")
    (run / "checkpoint-000000001").mkdir()  # a rotation cut short
    with atomic_path(tmp_path / "metrics.csv") as temporary:  # the name a writer of this process uses
        dead = subprocess.Popen(["true"])
        dead.wait()
        (run / temporary.name.replace(f".{os.getpid()}@", f".{dead.pid}@")).write_text("step\n")
    (run / "notes.tmp").write_text("mine")
    with (run / "metrics.csv").open("a") as f:  # steps 3 and 4 ran, their checkpoint never came
        f.write("3,60,1.0,2,2,7.4,40,1.0\n4,80,1.5,2,2,7.4,40,1.0\n")
    train(make_config(tmp_path, corpus, max_steps=4), resume=True, progress=False)
    assert sorted(p.name for p in run.iterdir()) == [
        "checkpoint-000000004",
        "latest",
        "metrics.csv",
        "notes.tmp",
        "train_config.json",
        "vocab.txt",
    ]
    assert steps_logged(run) == [1, 2, 3, 4]
    lines = (run / "metrics.csv").read_text().splitlines()
    assert "3,60,1.0,2,2,7.4,40,1.0" not in lines and "4,80,1.5,2,2,7.4,40,1.0" not in lines


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 911680 vs 911572"),
    ],
)
def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, corpus, monkeypatch, error):
    """Issue 13.8: a full disk is named; the partial checkpoint is removed and the previous one
    stays the latest, from which the run resumes."""
    import shutil

    import elmokit.training.loop as training

    real_save = training.save_checkpoint_file
    writes = []

    def disk_full_at_step_2(value, path):
        writes.append(path.name)
        if len(writes) == 4:  # step 2's model.pt, after its rank file
            path.write_bytes(b"partial")
            raise error

    monkeypatch.setattr(
        training,
        "save_checkpoint_file",
        lambda value, path: (disk_full_at_step_2(value, path), real_save(value, path)),
    )
    if isinstance(error, RuntimeError):  # torch says only this; the free space tells
        usage = shutil.disk_usage(tmp_path)
        monkeypatch.setattr(training.shutil, "disk_usage", lambda path: usage._replace(free=0))
    run = tmp_path / "run"
    message = (
        f"writing the checkpoint of step 2 in {run} failed: the disk is full (no space left on "
        "device); the previous checkpoint (step 1) is still the latest"
    )
    with pytest.raises(TrainingError, match=f"^{re.escape(message)}$"):
        train(make_config(tmp_path, corpus, max_steps=3, checkpoint_minutes=0), progress=False)
    assert sorted(p.name for p in run.iterdir()) == [
        "checkpoint-000000001",
        "latest",
        "metrics.csv",
        "train_config.json",
        "vocab.txt",
    ]
    assert load_checkpoint_file(SaveFolder(run).latest_checkpoint() / "model.pt")["run"]["step"] == 1
    monkeypatch.undo()
    outcome = train(
        make_config(tmp_path, corpus, max_steps=3, checkpoint_minutes=0), resume=True, progress=False
    )
    assert outcome.run.step == 3 and steps_logged(run) == [1, 2, 3]


def _device_error(device: str) -> ValueError:
    from elmokit.base.devices import resolve_device

    with pytest.raises(ValueError) as info:
        resolve_device(device)
    return info.value


def test_training_errors_are_one_line(tmp_path, corpus, capsys, monkeypatch):
    """Issue 13.19: each bad input or failure of `elmokit train` is one line and exit status 2."""
    import tempfile

    import elmokit.training.config

    data = ["--train", corpus[0], "--vocab", corpus[1]]
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("\n\n")
    (tmp_path / "file").write_text("")
    cases = {
        (
            "--train",
            tmp_path / "empty" / "*.txt",
            "--vocab",
            corpus[1],
            "--save-dir",
            tmp_path / "e",
        ): f"empty corpus: {tmp_path}/empty/*.txt holds no tokens",
        (
            "--save-dir",
            tmp_path / "none",
            "--resume",
        ): f"--resume: {tmp_path}/none holds no run (no train_config.json); start it without --resume",
        (
            *data,
            "--save-dir",
            tmp_path / "file" / "run",
        ): f"cannot write to --save-dir {tmp_path}/file/run: Not a directory",
        (
            *data,
            "--save-dir",
            tmp_path / "r",
            "--device",
            "foo",
        ): "unknown device 'foo': use cpu, cuda or cuda:N",
        (*data, "--save-dir", tmp_path / "r", "--device", "cuda:99"): str(_device_error("cuda:99")),
        ("--train", corpus[0], "--save-dir", tmp_path / "r"): None,  # argparse's: --vocab missing
    }
    for args, message in cases.items():
        code, _, err = cli(capsys, "train", *args, *TINY_RUN)
        if message is None:
            assert (code, last_line(err)) == (
                2,
                "elmokit: error: --train and --vocab are required (unless --resume); see 'elmokit train --help'",
            )
        else:
            assert (code, err.strip()) == (2, f"elmokit: error: {message}"), args
    assert not [d for d in ("e", "none", "r") if (tmp_path / d).exists()]  # nothing left behind
    code, _, _ = cli(capsys, "train", *data, "--save-dir", tmp_path / "used", "--max-steps", 1, *TINY_RUN)
    code, _, err = cli(capsys, "train", *data, "--save-dir", tmp_path / "used", "--max-steps", 2, *TINY_RUN)
    assert (code, err.strip()) == (
        2,
        f"elmokit: error: {tmp_path}/used holds another run; pass --resume to continue it or choose another --save-dir",
    )

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    (tmp_path / "ro").mkdir()
    with monkeypatch.context() as m:
        m.setattr(elmokit.training.config.tempfile, "TemporaryFile", read_only)
        code, _, err = cli(capsys, "train", *data, "--save-dir", tmp_path / "ro", *TINY_RUN)
    assert (code, err.strip()) == (
        2,
        f"elmokit: error: cannot write to --save-dir {tmp_path}/ro: Permission denied",
    )
    real_step = Trainer.step

    def overflow_at_step_2(self, batch):
        if self.run.step == 1:
            with torch.no_grad():
                self.model.softmax.bias.fill_(float("inf"))
        return real_step(self, batch)

    monkeypatch.setattr(Trainer, "step", overflow_at_step_2)
    code, _, err = cli(
        capsys,
        "train",
        *data,
        "--save-dir",
        tmp_path / "nan",
        "--max-steps",
        3,
        "--checkpoint-minutes",
        0,
        *TINY_RUN,
    )
    assert code == 2 and "Traceback" not in err
    assert (
        last_line(err)
        == f"elmokit: error: non-finite loss (nan) at step 2; the run stopped; its last checkpoint, step 1, is kept in {tmp_path}/nan"
    )
    del tempfile


def test_the_runs_messages_are_shown_once_and_its_warnings_as_the_commands(capsys):
    """Inside the command line's logging (verbose: INFO shown on stderr), the training loop's INFO
    lines go to the run's output stream only, its warnings to stderr as one-line warnings."""
    import io
    import logging

    from elmokit.base._console import command_context
    from elmokit.training.launch import messages_to

    stream = io.StringIO()
    log = logging.getLogger("elmokit.training.loop")
    with command_context(verbose=True), messages_to(stream):
        log.info("continuing step 3")
        log.warning("SIGTERM: stopping after this step")
    assert stream.getvalue() == "continuing step 3\n"
    assert capsys.readouterr().err == "elmokit: warning: SIGTERM: stopping after this step\n"
