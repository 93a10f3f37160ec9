"""What a user meets first: every option's help and default, one-line argument errors with a
close match, --help without torch, progress bars that leave errors and warnings on their own
lines, and warnings about raw text and repeated lines in embed."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import h5py
import pytest

from elmokit.cli import main
from elmokit.cli.commands import build_parser

TINY = ["--model", "elmo-tiny-reference", "--mode", "zero"]


def _commands(parser: argparse.ArgumentParser, name: str = "elmokit"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _commands(sub, f"{name} {sub_name}")


def _shown(default) -> set[str]:
    """How a default may be written in a help text."""
    forms = {str(default)}
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        forms |= {f"{default:g}", f"{default:,}"}
    return forms


def test_every_option_of_every_command_has_help_and_shows_its_default():
    names = []
    for name, parser in _commands(build_parser()):
        names.append(name)
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            text = formatter._expand_help(action) if action.help else ""
            which = f"{name} {'/'.join(action.option_strings) or action.dest}"
            assert text.strip(), f"{which} has no help"
            default = action.default
            if action.option_strings and default is not None and default is not False:
                assert any(form in text for form in _shown(default)), f"{which}: {text!r} omits {default!r}"
    assert {"elmokit embed", "elmokit probe wsd", "elmokit probe plot", "elmokit task", "elmokit elmo"} <= set(
        names
    )


def test_embed_help_shows_the_defaults_and_no_none(capsys):
    with pytest.raises(SystemExit) as done:
        main(["embed", "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "sentences embedded together (default: 64)" in out
    assert "(default: all)" in out
    assert "default: None" not in out and "default: False" not in out
    assert "sentence_to_index" in out  # the description says what a repeated line keeps


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["embed", "in.txt", "out.hdf5", "--layres", "top"],
            "unrecognized argument --layres (did you mean --layers?); see 'elmokit embed --help'",
        ),
        (
            ["embed", "in.txt", "out.hdf5", "--batch-sise=8"],
            "unrecognized argument --batch-sise=8 (did you mean --batch-size?); see 'elmokit embed --help'",
        ),
        (["embd", "in.txt"], "unrecognized command embd (did you mean embed?); see 'elmokit --help'"),
        (["probe", "wds"], "unrecognized command wds (did you mean wsd?); see 'elmokit probe --help'"),
        (["embed", "in.txt", "out.hdf5", "--zzz"], "unrecognized argument --zzz; see 'elmokit embed --help'"),
        (
            ["embed", "in.txt", "out.hdf5", "--layers", "tpo"],
            "argument --layers: invalid choice: 'tpo' (did you mean top? choose from 'all', 'top', "
            "'average'); see 'elmokit embed --help'",
        ),
        (["models", "extra"], "unrecognized argument extra; see 'elmokit models --help'"),
    ],
)
def test_a_typo_is_one_line_with_a_close_match_and_the_subcommands_help(argv, line, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert capsys.readouterr().err == f"elmokit: error: {line}\n"


def test_help_and_argument_errors_do_not_import_torch():
    code = (
        "import sys\n"
        "from elmokit.cli import main\n"
        "for argv in (['--help'], ['embed', '--help'], ['embed', 'a', 'b', '--layres', 'top'], ['embd']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as done:\n"
        "        print('exit', done.code)\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert [line for line in done.stdout.splitlines() if line.startswith(("exit ", "True", "False"))] == [
        "exit 0",
        "exit 0",
        "exit 2",
        "exit 2",
        "False",
    ]
    assert "elmokit: error: unrecognized argument --layres (did you mean --layers?)" in done.stderr


def test_python_dash_m_elmokit_is_the_command():
    """``python -m elmokit`` (src/elmokit/__main__.py) runs the same command line."""
    done = subprocess.run([sys.executable, "-m", "elmokit", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("usage: elmokit ")
    typo = subprocess.run([sys.executable, "-m", "elmokit", "embd"], capture_output=True, text=True)
    assert typo.returncode == 2
    assert typo.stderr == "elmokit: error: unrecognized command embd (did you mean embed?); see 'elmokit --help'\n"


def test_the_library_root_imports_its_names_on_first_use():
    code = (
        "import sys, elmokit\n"
        "print('torch' in sys.modules, sorted(elmokit.__all__) == sorted(set(dir(elmokit)) & set(elmokit.__all__)))\n"
        "print(elmokit.BiLM.__module__, 'torch' in sys.modules)\n"
        "try:\n"
        "    elmokit.nothing\n"
        "except AttributeError as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["False True", "elmokit.model.bilm True", "module 'elmokit' has no attribute 'nothing'"]


def test_train_task_and_elmo_options_are_added_when_used(capsys):
    commands = dict(_commands(build_parser()))
    assert "--lr" in commands["elmokit train"].format_help()
    assert "--no-elmo" in " ".join(s for a in commands["elmokit task"]._actions for s in a.option_strings)
    with pytest.raises(SystemExit):
        main(["elmo", "in.txt", "out.hdf5", "--all", "--tpo"])
    assert capsys.readouterr().err == (
        "elmokit: error: unrecognized argument --tpo (did you mean --top?); see 'elmokit elmo --help'\n"
    )


# -- embed's messages ---------------------------------------------------------------------------
def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("elmokit: warning:") and "start state" not in line]


def test_embed_warns_once_about_raw_text_and_never_about_tokenized_text(tmp_path, capsys):
    raw = tmp_path / "raw.txt"
    raw.write_text("Hello, world.\n\"Quoted words\" here\nagain, glued\n")
    assert main(["embed", str(raw), str(tmp_path / "raw.hdf5"), *TINY, "--quiet"]) == 0
    found = _warnings(capsys.readouterr().err)
    assert found == [
        "elmokit: warning: the input looks like raw, untokenized text ('Hello,' has punctuation glued to "
        "it), but it is split on whitespace only, so such words are tokens the model rarely saw; give "
        "--tokenize (tokenize=True) to tokenize it as the training corpus was"
    ]
    tokenized = tmp_path / "tok.txt"
    tokenized.write_text("Hello , world .\nMr. Smith of the U.S. said \" yes \" ( twice ) .\n")
    assert main(["embed", str(tokenized), str(tmp_path / "tok.hdf5"), *TINY, "--quiet"]) == 0
    assert _warnings(capsys.readouterr().err) == []


def test_raw_text_warning_changes_no_vector(tmp_path):
    from elmokit.base.textfiles import line_splitter

    split = line_splitter(False)
    assert [split(line) for line in ["Hello, world.", "Hello, world."]] == [["Hello,", "world."]] * 2


def test_embed_says_how_many_lines_repeat_and_what_the_index_keeps(tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("a b\nc\na b\na b\nc\nd\n")
    out = tmp_path / "out.hdf5"
    assert main(["embed", str(text), str(out), *TINY, "--quiet"]) == 0
    assert _warnings(capsys.readouterr().err) == []  # the layout's rule, not a problem of the input
    assert main(["-v", "embed", str(text), str(out), *TINY, "--quiet", "--overwrite"]) == 0
    assert (
        "3 lines repeat an earlier line; sentence_to_index maps each to its last line "
        "number (as allennlp elmo's files do); the vectors of every line are written"
    ) in capsys.readouterr().err.splitlines()
    with h5py.File(out) as f:
        assert json.loads(f["sentence_to_index"][0]) == {"a b": "3", "c": "4", "d": "5"}
        assert sorted(f) == ["0", "1", "2", "3", "4", "5", "sentence_to_index"]
    assert main(["-v", "embed", str(text), str(tmp_path / "no.hdf5"), *TINY, "--quiet", "--no-sentence-index"]) == 0
    assert "repeat an earlier line" not in capsys.readouterr().err


def test_an_error_during_embed_clears_the_bar_before_its_line(tmp_path, capsys):
    binary = tmp_path / "in.txt"
    binary.write_bytes(b"fine line\n\xff\xfe\x00 binary\n")
    assert main(["embed", str(binary), str(tmp_path / "out.hdf5"), *TINY]) == 2
    err = capsys.readouterr().err
    assert "0/2" in err  # the bar was drawn
    last = err.split("\n")[-2]
    assert last.split("\r")[-1] == "elmokit: error: " + f"{binary}: line 2 is not valid UTF-8 (invalid start byte)"
    assert last.split("\r")[-2].strip() == ""  # the bar's line was blanked before the error


def test_the_bar_shows_no_time_left_from_its_first_sentence(capsys, monkeypatch):
    from elmokit.embed._multiprocess_embed import progress_bar

    with progress_bar(True, 2000) as bar:
        now = bar.start_t
        monkeypatch.setattr(bar, "_time", lambda: now)
        now += 1.25  # the first batch's sentences arrive together after 1.25 s
        bar.update(1)
        bar.refresh()
        first = capsys.readouterr().err.split("\r")[-1]
        bar.update(63)
        now += 1.25
        bar.update(64)
        bar.refresh()
        later = capsys.readouterr().err.split("\r")[-1]
    assert first.startswith("  0%|") and "1/2000 [00:01<?]" in first
    assert "128/2000 [00:02<00:36" in later  # (2000 - 128) / (128 / 2.5 s)


@pytest.mark.parametrize(
    ("line", "warned"),
    [
        ("Hello, world .", True),
        ("She sat on the mat.", True),
        ('He said "Hello .', True),
        ("Ms. Smith met Dr. Jones of the U.S. Army", False),  # tokenized text keeps abbreviations
        ("Hello , world .", False),
    ],
)
def test_the_raw_text_check_knows_abbreviations(line, warned, caplog):
    from elmokit.base.textfiles import line_splitter

    split = line_splitter(False)
    with caplog.at_level("WARNING", logger="elmokit"):
        assert split(line) == line.split()
    assert any("raw, untokenized" in r.getMessage() for r in caplog.records) == warned
    quiet = line_splitter(False, warn=False)  # the other processes of a shared job
    caplog.clear()
    with caplog.at_level("WARNING", logger="elmokit"):
        assert quiet(line) == line.split()
    assert not caplog.records


@pytest.mark.parametrize("raised", [RuntimeError("a device failed\n\nmore lines\nof detail"), MemoryError()])
def test_a_runtime_or_memory_error_is_one_line_with_status_2(tmp_path, capsys, monkeypatch, raised):
    """torch raises RuntimeError (a device out of memory, ...), and elmokit's own checks of its
    parts do too: each is one line, never a traceback."""
    import elmokit.embed.embedder

    def failing(*args, **kwargs):
        raise raised

    monkeypatch.setattr(elmokit.embed.embedder.Embedder, "embed_file", failing)
    (tmp_path / "in.txt").write_text("the cat sat\n")
    code = main(["embed", str(tmp_path / "in.txt"), str(tmp_path / "out.hdf5"), *TINY, "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    expected = (
        "elmokit: error: a device failed (-v shows where)\n"
        if isinstance(raised, RuntimeError)
        else "elmokit: error: out of memory: the model or a batch does not fit (try a smaller --batch-size)\n"
    )
    assert err == expected
