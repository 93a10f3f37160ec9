"""Where ELMo enters a task model (--elmo-at) and how its layers are weighted (--layers, --mix-l2)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from elmokit.cli import main as elmokit_main
from elmokit.hub.shipped import TINY_REFERENCE
from elmokit.tasks import TrainedTask
from elmokit.tasks.models import Batch, Classifier, LayerWeighting, ModelConfig, Tagger

from .test_tasks import toy_ner, write_conll, write_sst

L, B, T, D, HIDDEN = 3, 2, 5, 6, 4


def make_batch(seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    return Batch(
        mask=mask,
        words=torch.randint(1, 9, (B, T), generator=g) * mask,
        elmo_layers=torch.randn(L, B, T, D, generator=g),
        targets=torch.randint(0, 3, (B, T), generator=g) * mask,
    )


def tagger(**kw) -> Tagger:
    torch.manual_seed(0)
    config = ModelConfig(word_dim=4, char_filters=0, hidden=HIDDEN, elmo_layers=L, elmo_dim=D, **kw)
    return Tagger(config, n_words=10, n_tags=3).eval()


def lstm_states(model: Tagger, batch: Batch, features: torch.Tensor) -> torch.Tensor:
    """The task BiLSTM's states for these features, by hand (eval mode: no dropout)."""
    lengths = batch.mask.sum(1)
    packed = pack_padded_sequence(features, lengths, batch_first=True, enforce_sorted=False)
    out, _ = pad_packed_sequence(model.lstm(packed)[0], batch_first=True, total_length=T)
    return out


def test_elmo_at_input_output_and_both_put_the_mix_where_they_say():
    batch = make_batch()
    words = None
    for at in ("input", "output", "both"):
        model = tagger(elmo_at=at)
        words = model.features.words(batch.words)
        with torch.no_grad():
            for p in model.parameters():  # distinct mixes per site, so a swap would show
                if p.dim() == 1 and p.numel() == L:
                    p.copy_(torch.randn(L))
            emissions = model.emissions(batch)
        mixes = {k for k in model.state_dict() if k.endswith("scalar_parameters")}
        if at == "input":
            assert mixes == {"features.weighting.scalar_mix.scalar_parameters"}
            x = torch.cat([words, model.features.weighting(batch.elmo_layers, batch.mask)], -1)
            expected = model.output(lstm_states(model, batch, x))
        elif at == "output":
            assert mixes == {"output_weighting.scalar_mix.scalar_parameters"}
            assert model.lstm.input_size == 4 and model.output.in_features == 2 * HIDDEN + D
            elmo = model.output_weighting(batch.elmo_layers, batch.mask)
            states = lstm_states(model, batch, words)
            expected = model.output(torch.cat([states, elmo * batch.mask.unsqueeze(-1)], -1))
        else:
            assert len(mixes) == 2
            assert model.lstm.input_size == 4 + D and model.output.in_features == 2 * HIDDEN + D
            x = torch.cat([words, model.features.weighting(batch.elmo_layers, batch.mask)], -1)
            elmo = model.output_weighting(batch.elmo_layers, batch.mask)
            states = lstm_states(model, batch, x)
            expected = model.output(torch.cat([states, elmo * batch.mask.unsqueeze(-1)], -1))
        m = batch.mask.unsqueeze(-1)
        assert torch.allclose(emissions * m, expected * m, atol=1e-6), at


def test_layer_weightings_top_average_and_mix():
    layers = torch.randn(L, B, T, D)
    mask = torch.ones(B, T, dtype=torch.bool)
    top = LayerWeighting(L, "top")
    assert torch.equal(top(layers, mask), layers[-1]) and not list(top.parameters())
    average = LayerWeighting(L, "average")
    assert torch.allclose(average(layers, mask), layers.mean(0), atol=1e-6)
    assert not average.scalar_mix.scalar_parameters.requires_grad and average.scalar_mix.gamma.requires_grad
    mix = LayerWeighting(L, "mix")
    assert mix.scalar_mix.scalar_parameters.requires_grad


def test_mix_l2_adds_lambda_times_the_squared_raw_weights_to_the_loss():
    batch = make_batch(1)
    plain, penalised = tagger(elmo_at="both"), tagger(elmo_at="both", mix_l2=0.5)
    penalised.load_state_dict(plain.state_dict())
    s_in, s_out = torch.tensor([0.3, -1.0, 2.0]), torch.tensor([1.0, 0.0, -0.5])
    for model in (plain, penalised):
        with torch.no_grad():
            model.features.weighting.scalar_mix.scalar_parameters.copy_(s_in)
            model.output_weighting.scalar_mix.scalar_parameters.copy_(s_out)
    expected = 0.5 * (s_in.pow(2).sum() + s_out.pow(2).sum())
    assert (penalised.loss(batch) - plain.loss(batch)).item() == pytest.approx(expected.item(), rel=1e-5)
    # the penalty's gradient pulls each raw weight towards 0 (2 * lambda * s more than without it)
    grads = []
    for model in (plain, penalised):
        model.zero_grad()
        model.loss(batch).backward()
        grads.append(model.features.weighting.scalar_mix.scalar_parameters.grad.clone())
    assert torch.allclose(grads[1] - grads[0], 2 * 0.5 * s_in, atol=1e-5)


def test_classifier_pools_elmo_at_the_output():
    torch.manual_seed(0)
    config = ModelConfig(word_dim=4, char_filters=0, hidden=HIDDEN, elmo_layers=L, elmo_dim=D, elmo_at="output")
    model = Classifier(config, n_words=10, n_labels=5).eval()
    assert model.output.in_features == 2 * (2 * HIDDEN + D)
    batch = make_batch(2)
    changed = Batch(mask=batch.mask, words=batch.words, elmo_layers=batch.elmo_layers + 1.0)
    assert not torch.allclose(model.logits(batch), model.logits(changed))  # ELMo reaches the output


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--no-elmo", "--elmo-at", "output"], "need ELMo"),
        (["--layers", "top", "--mix-l2", "1"], "mix_l2 applies to the 'mix' weighting"),
        (["--layers", "top", "--elmo-layer-norm"], "not to the top layer alone"),
        (["--fine-tune-elmo", "--layers", "average"], "frozen biLM's cached layers only"),
        (["--mix-l2", "-1"], "mix_l2 must be at least 0"),
    ],
)
def test_bad_combinations_fail_in_one_line(tmp_path, capsys, options, message):
    files = write_conll(tmp_path / "a.txt", toy_ner(random.Random(0), 4))
    argv = ["task", "ner", "--train", files, "--dev", files, "--test", files, "--out", str(tmp_path / "o")]
    elmo = [] if "--no-elmo" in options else ["--elmo", TINY_REFERENCE]
    argv += [*elmo, *options, "--quiet"]
    assert elmokit_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("elmokit: error:") and message in err and "\n" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("task", "at", "layers"), [("ner", "both", "mix"), ("sentiment", "output", "top")])
def test_task_command_trains_saves_and_reloads_each_site(tmp_path, task, at, layers):
    rng = random.Random(5)
    if task == "ner":
        files = {s: write_conll(tmp_path / f"{s}.txt", toy_ner(rng, 8)) for s in ("train", "dev", "test")}
    else:
        files = {s: write_sst(tmp_path / f"{s}.txt", rng, 12) for s in ("train", "dev", "test")}
    out = tmp_path / "out"
    argv = ["task", task, "--train", files["train"], "--dev", files["dev"], "--test", files["test"]]
    argv += ["--elmo", TINY_REFERENCE, "--elmo-at", at, "--layers", layers, "--epochs", "1", "--hidden", "8"]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--quiet"]
    if layers == "mix":
        argv += ["--mix-l2", "0.001"]
    assert elmokit_main(argv) == 0
    saved = json.loads((out / "model.json").read_text())["config"]["model"]
    assert (saved["elmo_at"], saved["elmo_weighting"]) == (at, layers)
    assert saved["mix_l2"] == (0.001 if layers == "mix" else 0.0)
    trained = TrainedTask.load(out)
    sentences = [["Paris", "is", "big"], ["it", "was", "okay"]]
    first = trained.predict(sentences)
    assert TrainedTask.load(out).predict(sentences) == first  # the saved model gives the same answers
    assert (trained.model.output_weighting is not None) == (at in ("output", "both"))
    saved = json.loads((out / "model.json").read_text())
    (out / "model.json").write_text(json.dumps({**saved, "format": "elmokit-task-model-v1"}))
    with pytest.raises(ValueError, match="earlier elmokit .*retrain it"):
        TrainedTask.load(out)


def test_fine_tuned_elmo_gets_one_mix_per_site(tmp_path):
    files = write_conll(tmp_path / "a.txt", toy_ner(random.Random(6), 4))
    out = tmp_path / "out"
    argv = ["task", "ner", "--train", files, "--dev", files, "--test", files, "--elmo", TINY_REFERENCE]
    argv += ["--fine-tune-elmo", "--elmo-at", "both", "--epochs", "1", "--hidden", "8", "--out", str(out)]
    assert elmokit_main([*argv, "--quiet"]) == 0
    model = TrainedTask.load(out).model
    assert len(model.features.elmo.scalar_mixes) == 2
    assert model.lstm.input_size == model.features.output_dim
    assert model.output.in_features == 2 * 8 + model.features.elmo.output_dim
