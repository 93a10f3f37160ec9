"""What the command line sets up around a command and the library never does by itself: the
``elmokit`` logger's one-line messages on stderr, and signal handling for atomic writes."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys

import pytest

import elmokit.cli
import elmokit.cli._models
from elmokit.base._console import command_context
from elmokit.base.atomic import atomic_path


def test_importing_the_library_configures_no_logging_and_no_signal_handler():
    code = (
        "import logging, pkgutil, importlib, signal, elmokit\n"
        "skip = {'elmokit.base._console', 'elmokit.tasks.__main__'}\n"
        "for m in pkgutil.walk_packages(elmokit.__path__, 'elmokit.'):\n"
        "    if m.name not in skip and not m.name.startswith(('elmokit.integrations', 'elmokit.serve', 'elmokit.cli')):\n"
        "        try:\n"
        "            importlib.import_module(m.name)\n"
        "        except ImportError as error:  # an optional part's package, named by its cause\n"
        "            missing = error if isinstance(error, ModuleNotFoundError) else error.__cause__ or error.__context__\n"
        "            if not isinstance(missing, ModuleNotFoundError) or missing.name.startswith('elmokit'):\n"
        "                raise\n"
        "log = logging.getLogger('elmokit')\n"
        "print(log.handlers, log.level, logging.getLogger().handlers,\n"
        "      signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,\n"
        "      signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "0", "[]", "True", "True"]


def test_a_command_shows_the_librarys_log_in_one_line_per_record(capsys):
    log = logging.getLogger("elmokit.somewhere")
    with command_context():
        log.info("not shown without --verbose")
        log.warning("the model has no start state")
    with command_context(verbose=True):
        log.info("wrote out.hdf5")
        log.error("cannot read x")
        log.debug("not shown")
    log.warning("after the command: not through elmokit's handler")
    err = capsys.readouterr().err.splitlines()
    assert err[:3] == [
        "elmokit: warning: the model has no start state",
        "wrote out.hdf5",
        "elmokit: error: cannot read x",
    ]
    root = logging.getLogger("elmokit")
    assert root.handlers == [] and root.level == logging.NOTSET and root.propagate


def test_the_cli_runs_each_command_inside_the_context(tmp_path, monkeypatch, capsys):
    """``elmokit.cli.commands.run`` enters it: a command's log lines reach stderr (INFO with --verbose),
    and its atomic writes install the SIGTERM handler (which a library write never does)."""
    seen = []

    def command(args) -> int:
        logging.getLogger("elmokit.models").info("a line from the library")
        with atomic_path(tmp_path / "out.txt") as tmp:
            seen.append(signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL)
            tmp.write_text("done")
        return 0

    monkeypatch.setattr(elmokit.cli._models, "models_command", command)  # bound when main builds the parser
    assert elmokit.cli.main(["models"]) == 0
    assert seen == [True] and (tmp_path / "out.txt").read_text() == "done"
    assert capsys.readouterr().err == ""  # an INFO line: shown with --verbose only
    assert elmokit.cli.main(["--verbose", "models"]) == 0
    assert capsys.readouterr().err == "a line from the library\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_serve_worker_process_gets_logging_from_the_command_lines_factory_only():
    """``create_app_from_env`` (the library) leaves logging alone; ``serve_worker_app`` (what
    ``elmokit serve --workers N`` makes each process run) sets it up as the command does."""
    pytest.importorskip("starlette", reason="the serve extra")
    code = (
        "import logging, os\n"
        "from elmokit.hub.shipped import MODELS_DIR\n"
        "from elmokit.serve import ServeConfig\n"
        "from elmokit.serve.app import create_app_from_env\n"
        "from elmokit.serve.config import CONFIG_ENV\n"
        "from elmokit.cli._serve_worker import serve_worker_app\n"
        "model = f'tiny={MODELS_DIR / \"elmo-tiny-reference\"}'\n"
        "os.environ[CONFIG_ENV] = ServeConfig(models=(model,), device='cpu').to_json()\n"
        "create_app_from_env()\n"
        "print(logging.getLogger().handlers, logging.getLogger('elmokit').handlers)\n"
        "serve_worker_app()\n"
        "logging.getLogger('elmokit.serve').info('serving tiny')\n"
        "logging.getLogger('elmokit.embed.embedder').info('not shown')\n"
        "logging.getLogger('elmokit.embed.embedder').warning('careful')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["[]", "[]"]
    loaded, *rest = done.stderr.splitlines()  # the model the worker loaded, then the test's lines
    assert loaded.startswith("model tiny: ") and rest == ["serving tiny", "elmokit: warning: careful"]


def test_a_log_line_goes_above_a_shown_progress_bar_on_its_own_line(capsys):
    from tqdm import tqdm

    log = logging.getLogger("elmokit.somewhere")
    with command_context():
        with tqdm(total=10, file=sys.stderr, ncols=60) as bar:
            bar.update(3)
            bar.refresh()
            log.warning("stopping at the next checkpoint (SIGINT)")
        log.warning("no bar now")
    err = capsys.readouterr().err
    assert "\relmokit: warning: stopping at the next checkpoint (SIGINT)\n" in err  # the bar's line cleared first
    before = err.split("elmokit: warning: stopping")[0].split("\r")
    assert before[-2].strip() == ""  # blanked, then the warning from the line's start
    assert err.endswith("\nelmokit: warning: no bar now\n")
