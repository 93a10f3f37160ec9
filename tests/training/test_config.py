"""Training as config -> launch -> loop: a frozen TrainConfig checked in one place, the command
line's options generated from its fields, the GPU list carried to each process's device."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
import torch

import elmokit.training.config as config_module
import elmokit.training.launch as launch_module
from elmokit.base.devices import Process
from elmokit.cli.commands import build_parser
from elmokit.model.options import preset
from elmokit.training.collectives import setup_distributed
from elmokit.training.config import (
    TrainConfig,
    TrainingError,
    config_from_options,
    option_name,
    resume_config,
    train_options,
)

from .test_loop import TINY_RUN, cli, corpus, last_line  # noqa: F401 (corpus: a fixture)

# the fields a run sets itself or that only a Python caller gives
NOT_OPTIONS = {"clip_norm", "log_every", "n_train_tokens"}
# the options of the launch, not of the configuration
LAUNCH_OPTIONS = {"--nproc", "--resume", "--resume-from", "--new-data"}


def config(tmp_path, **kw) -> TrainConfig:
    base = dict(
        train=str(tmp_path / "*.txt"),
        vocab=str(tmp_path / "vocab.txt"),
        save_dir=str(tmp_path / "run"),
        options=preset("tiny"),
        batch_size=4,
    )
    return TrainConfig(**{**base, **kw})


def train_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["train"]


def test_a_config_is_frozen_and_changes_by_replace(tmp_path):
    first = config(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.epochs = 3  # type: ignore[misc]
    second = dataclasses.replace(first, epochs=3)
    assert (first.epochs, second.epochs) == (None, 3)
    with pytest.raises(ValueError, match=r"^--epochs must be greater than 0, got 0$"):
        dataclasses.replace(first, epochs=0)  # replace checks as construction does


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("dropout", 2.0, "--dropout must be at most 1, got 2"),
        ("batch_size", 0, "--batch-size must be at least 1, got 0"),
        ("batch_size", "4", "--batch-size must be a whole number, got '4'"),
        ("lr", True, "--lr must be a number, got True"),
        ("log_every", 0, "--log-every must be at least 1, got 0"),
        ("precision", "fp8", "--precision must be one of fp32, bf16, got 'fp8'"),
        ("device", "foo", "unknown device 'foo': use cpu, cuda or cuda:N"),
        ("gpus", (1, 1), "--gpus names a GPU twice: 1,1"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_option(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        config(tmp_path, **{field: value})


def test_the_same_rule_refuses_a_value_from_the_command_line_and_from_a_stored_config(
    tmp_path, corpus, capsys  # noqa: F811
):
    data = ["--train", corpus[0], "--vocab", corpus[1], *TINY_RUN]
    code, _, err = cli(capsys, "train", *data, "--save-dir", tmp_path / "a", "--dropout", "2")
    assert (code, last_line(err)) == (
        2,
        "elmokit: error: argument --dropout: must be at most 1, got 2; see 'elmokit train --help'",
    )
    code, _, err = cli(capsys, "train", *data, "--save-dir", tmp_path / "a", "--max-steps", 1)
    assert code == 0, err
    stored_file = tmp_path / "a" / "train_config.json"
    stored = json.loads(stored_file.read_text())
    stored_file.write_text(json.dumps({**stored, "dropout": 2}))
    code, _, err = cli(capsys, "train", "--save-dir", tmp_path / "a", "--resume", "--max-steps", 2)
    assert (code, err.strip()) == (2, f"elmokit: error: {stored_file}: --dropout must be at most 1, got 2")
    stored_file.write_text(json.dumps({**stored, "batch_size": "4"}))
    with pytest.raises(TrainingError, match=r"train_config.json: --batch-size must be a whole number, got '4'$"):
        resume_config(tmp_path / "a", {})
    assert "gpus" not in stored and "save_dir" not in stored  # the session's, never stored


def test_the_train_options_are_the_config_fields():
    """`elmokit train` offers one option per TrainConfig field (generated from the fields), each
    with its help and default, besides the options of the launch."""
    parser = train_parser()
    offered = {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert offered - LAUNCH_OPTIONS == {option_name(n) for n in fields - NOT_OPTIONS}
    assert {name for name, _, _ in train_options()} == fields - NOT_OPTIONS
    help_text = " ".join(parser.format_help().split())
    for name, spec, default in train_options():
        assert spec.help in " ".join(help_text.split()), name
        if default is not None and spec.group is None:
            shown = spec.default_text or (f"{default:g}" if isinstance(default, float) else str(default))
            assert f"{spec.help} (default {shown})" in help_text, name
    assert "when to stop (default: 10 epochs)" in help_text
    # the parsed values are the fields' kinds; not given stays None (the default, or the run's)
    args = parser.parse_args(["--save-dir", "d", "--gpus", "0,2", "--max-time", "2h", "--lr", "0.5"])
    assert (args.gpus, args.max_time, args.lr, args.batch_size) == ((0, 2), 7200.0, 0.5, None)


def test_a_new_runs_config_takes_the_defaults_and_ten_epochs(tmp_path):
    given = {"train": "t", "vocab": "v", "save_dir": str(tmp_path), "options": preset("tiny"), "seed": None}
    new = config_from_options(given)
    assert (new.epochs, new.seed, new.device, new.gpus) == (10.0, 0, "cpu", ())
    assert config_from_options({**given, "max_steps": 5}).epochs is None


@pytest.fixture()
def four_gpus(monkeypatch):
    """A machine with four CUDA GPUs, as torch sees it; returns the devices made current."""
    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_the_gpu_list_reaches_each_processs_device(tmp_path, monkeypatch, four_gpus):
    """`elmokit train --gpus 0,2`: two processes, local ranks 0 and 1 on cuda:0 and cuda:2 (NCCL),
    the list carried in the configuration, not in the environment."""
    groups = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(
        torch.distributed, "init_process_group", lambda backend, rank, world_size: groups.append(backend)
    )

    def processes(entrypoint, args, nproc, share_cores=True):
        """run_processes's work, in this process: each rank with its environment."""
        results = {}
        for rank in range(nproc):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("LOCAL_RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(nproc))
            results[rank] = (entrypoint(*args), share_cores)
        return results

    def loop(config, **kw):
        assert "ELMOKIT_GPUS" not in os.environ
        return setup_distributed(config)

    monkeypatch.setattr(launch_module, "run_processes", processes)
    monkeypatch.setattr(launch_module, "train", loop)
    given = {"save_dir": str(tmp_path / "run"), "train": "t", "vocab": "v", "options": preset("tiny")}
    gpu_config = config_from_options({**given, "gpus": (0, 2)})
    assert (gpu_config.device, gpu_config.gpus) == ("cuda", (0, 2))
    first, share_cores = launch_module.launch(gpu_config, resume=False)
    assert (first.process, first.device, share_cores) == (Process(0, 0, 2), torch.device("cuda:0"), False)
    assert four_gpus == [torch.device("cuda:0"), torch.device("cuda:2")] and groups == ["nccl", "nccl"]
    with pytest.raises(ValueError, match="does not exist: this machine has 4 CUDA GPU"):
        config_from_options({**given, "gpus": (0, 7)})
    with pytest.raises(ValueError, match="^--gpus places each process on its GPU: leave out --device"):
        config_from_options({**given, "gpus": (0,), "device": "cpu"})
    with pytest.raises(ValueError, match="^give --gpus or --nproc, not both"):
        launch_module.launch(gpu_config, resume=False, processes=2)


def test_a_resume_reads_the_stored_config_once(tmp_path, corpus, capsys, monkeypatch):  # noqa: F811
    data = ["--train", corpus[0], "--vocab", corpus[1], *TINY_RUN]
    code, _, err = cli(capsys, "train", *data, "--save-dir", tmp_path / "run", "--max-steps", 1)
    assert code == 0, err
    calls = []
    real = config_module.resume_config
    monkeypatch.setattr(config_module, "resume_config", lambda *a: calls.append(a) or real(*a))
    code, out, err = cli(capsys, "train", "--save-dir", tmp_path / "run", "--resume", "--max-steps", 2)
    assert code == 0 and last_line(out).startswith("finished at step 2"), err
    assert len(calls) == 1
