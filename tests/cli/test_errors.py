"""Every command's error is one line: each (sub)command the parser has, run in its own process
with a bad input (a missing file, a model that does not exist, a bad option value), exits 2
with exactly one line on stderr, ``elmokit: error: ...``, naming what was wrong, and no
traceback. The commands are read from the parser, so a new command without a case here fails."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elmokit.cli.commands import build_parser
from elmokit.hub.shipped import MODELS_DIR, TINY_REFERENCE

ROOT = Path(__file__).resolve().parents[2]
TINY = MODELS_DIR / TINY_REFERENCE
TASKS_MODULE = ("python -m elmokit.tasks",)  # the task command on its own

# command -> (its arguments, what the error line names); {missing}: a path that does not exist,
# {out}: a path that does not exist in an empty folder (which stays empty)
CASES: dict[tuple[str, ...], tuple[list[str], str]] = {
    ("demo",): (["--model", "{missing}"], "{missing}"),
    ("embed",): (["{missing}.txt", "{out}.hdf5", "--model", TINY_REFERENCE], "{missing}.txt"),
    ("tokens",): (["{missing}.txt", "{out}.hdf5", "--model", TINY_REFERENCE], "{missing}.txt"),
    ("start-state",): ([TINY_REFERENCE, "--text", "{missing}*.txt"], "{missing}*.txt"),
    ("vocab",): (["{missing}.txt", "-o", "{out}.txt"], "{missing}.txt"),
    ("train",): (
        ["--train", "{missing}.txt", "--vocab", "{missing}.vocab", "--save-dir", "{out}"],
        "{missing}.vocab",
    ),
    ("evaluate",): (["{missing}", "--heldout", "{missing}.txt"], "{missing}"),
    ("export",): (["{missing}", "{out}"], "{missing}"),
    ("convert",): (["{missing}", "{out}"], "{missing}"),
    ("export-onnx",): (["{missing}", "{out}.onnx"], "{missing}"),
    ("score",): (["{missing}.txt"], "{missing}.txt"),
    ("substitutes",): (["a", "b", "--word", "1", "--model", "{missing}"], "{missing}"),
    ("models",): (["--jsn"], "unrecognized argument --jsn (did you mean --json?)"),
    ("download",): (["no-such-model"], "'no-such-model' is neither a known model"),
    ("probe",): (
        [
            "--train",
            "{missing}.conll",
            "--test",
            "{missing}.conll",
            "--column",
            "1",
            "--model",
            TINY_REFERENCE,
        ],
        "{missing}.conll",
    ),
    ("probe", "plot"): (["{missing}.json", "--out", "{out}.png"], "{missing}.json"),
    ("probe", "wsd"): (
        ["--train", "{missing}.xml", "--test", "{missing}.xml", "--model", TINY_REFERENCE],
        "{missing}.xml",
    ),
    ("serve",): (["--model", "{missing}", "--port", "0"], "{missing}"),
    ("task",): (
        [
            "ner",
            "--train",
            "{missing}",
            "--dev",
            "{missing}",
            "--test",
            "{missing}",
            "--out",
            "{out}",
            "--no-elmo",
        ],
        "{missing}",
    ),
    ("elmo",): (
        ["{missing}.txt", "{out}.hdf5", "--all", "--options-file", str(TINY / "options.json")]
        + ["--weight-file", str(TINY / "weights.hdf5")],
        "{missing}.txt",
    ),
    ("data",): ([], "the following arguments are required: list|sample|fetch"),
    ("data", "list"): (["--jsn"], "unrecognized argument --jsn"),
    ("data", "sample"): (["no-such", "{out}"], "argument NAME: invalid choice: 'no-such'"),
    ("data", "fetch"): (["no-such", "{out}"], "argument NAME: invalid choice: 'no-such'"),
    TASKS_MODULE: (
        [
            "ner",
            "--train",
            "{missing}",
            "--dev",
            "{missing}",
            "--test",
            "{missing}",
            "--out",
            "{out}",
            "--no-elmo",
        ],
        "{missing}",
    ),
}


# Commands whose bad input is reached only with an optional part installed (without it, the
# one error line names the extra to install: tests/cli/test_messages.py).
NEEDS = {("export-onnx",): ("onnx",), ("serve",): ("starlette", "uvicorn", "prometheus_client")}


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """Every (sub)command of ``parser``, as the words that name it (``("probe", "wsd")``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _commands(sub, (*prefix, name))


def test_every_command_of_the_parser_has_a_case():
    commands = set(_commands(build_parser()))
    assert {("train",), ("serve",), ("task",), ("elmo",), ("probe", "wsd"), ("data", "fetch")} <= commands
    assert sorted(commands - set(CASES)) == [], "commands without a bad-input case in CASES"
    assert sorted(set(CASES) - commands - {TASKS_MODULE}) == [], "cases of commands that do not exist"


@pytest.mark.parametrize("command", sorted(CASES), ids=" ".join)
def test_a_bad_input_is_one_error_line_and_exit_status_2(command, tmp_path):
    for module in NEEDS.get(command, ()):
        pytest.importorskip(module)
    arguments, named = CASES[command]
    (tmp_path / "out").mkdir()
    paths = {"missing": str(tmp_path / "missing"), "out": str(tmp_path / "out" / "result")}
    argv = [arg.format(**paths) for arg in arguments]
    prefix = ["-m", "elmokit.tasks"] if command == TASKS_MODULE else ["-m", "elmokit", *command]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", COLUMNS="100")
    done = subprocess.run(
        [sys.executable, *prefix, *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("elmokit: error: "), done.stderr
    assert named.format(**paths) in lines[0], done.stderr
    assert "[Errno" not in lines[0], done.stderr  # Python's own OSError text, said plainly
    assert done.returncode == 2, done.stderr
    assert list((tmp_path / "out").iterdir()) == []  # nothing written
