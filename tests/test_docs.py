"""Every code block of README.md and docs/ runs (Sybil reads the Markdown).

- A ```python block is executed; the blocks of one page share their names, in page order.
- A ```bash or ```sh block is run by bash (``set -euo pipefail``) with this Python's ``elmokit``
  first on PATH; it must exit 0.
- Each page runs in a fresh temporary folder holding the small input files its commands name
  (sentences.txt, corpus.txt, ...), offline and with a private cache (tests/conftest.py).
- A block that cannot run here (several machines, a GPU, a network, a server that never exits)
  follows the line ``<!-- no-run: why -->`` and is only syntax-checked: ``compile()`` for
  Python, ``bash -n`` for shell.
- A block that needs an optional package that is not installed (flair) is syntax-checked only.

Other fences (```text, ```json) are output shown to the reader and are not run; a fence in any
other language fails the test, so that no block escapes by its label.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHOWN = {"text", "json"}  # output shown to the reader, never run
NO_RUN = re.compile(r"<!-- no-run: [^>]+ -->\s*$")
BIN = str(Path(sys.executable).parent)
TINY = ROOT / "tests" / "fixtures" / "elmo-tiny"
# Optional packages a block may need: without them it is syntax-checked only.
OPTIONAL = {"flair": "flair"}


def _no_run(example: Example) -> bool:
    """True when the block follows a ``<!-- no-run: why -->`` line."""
    return bool(NO_RUN.search(example.document.text[: example.start]))


def _missing_optional(source: str) -> bool:
    return any(
        re.search(rf"\b(import|from) {name}\b", source) and importlib.util.find_spec(module) is None
        for name, module in OPTIONAL.items()
    )


def _where(example: Example) -> str:
    return f"{Path(example.path).relative_to(ROOT)}:{example.line}"


def run_python(example: Example) -> None:
    code = compile(example.parsed, _where(example), "exec")
    if _no_run(example) or _missing_optional(example.parsed):
        return
    example.namespace.setdefault("__name__", "docs_example")
    exec(code, example.namespace)


def run_shell(example: Example) -> None:
    checked = subprocess.run(["bash", "-n"], input=example.parsed, text=True, capture_output=True)
    assert checked.returncode == 0, f"{_where(example)}: {checked.stderr}"
    if _no_run(example):
        return
    # One thread per command: the examples are small, and idle threads of several processes
    # spinning on a shared machine cost more than they gain.
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"], OMP_NUM_THREADS="1")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", example.parsed],
        cwd=os.getcwd(),
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        f"{_where(example)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def refuse(example: Example) -> None:
    raise AssertionError(f"{_where(example)}: a code block in a language the docs test does not run")


class OtherLanguages(CodeBlockParser):
    """Every fenced block whose language is neither run nor shown output."""

    def __init__(self) -> None:
        super().__init__(language="*", evaluator=refuse)

    def __call__(self, document):  # type: ignore[no-untyped-def]
        for region in self.lexers(document):
            language = region.lexemes["arguments"].split()[0] if region.lexemes["arguments"] else ""
            if language not in {"python", "bash", "sh", *SHOWN}:
                region.parsed = region.lexemes["source"]
                region.evaluator = refuse
                yield region


SYBIL = Sybil(
    parsers=[
        CodeBlockParser("python", run_python),
        CodeBlockParser("bash", run_shell),
        CodeBlockParser("sh", run_shell),
        OtherLanguages(),
    ]
)


def _inputs(folder: Path) -> None:
    """The small files the examples' commands name, as a user would have them."""
    sentences = [" ".join(s) for group in json.loads((TINY / "sentences.json").read_text()) for s in group]
    text = "\n".join(sentences) + "\n"
    (folder / "sentences.txt").write_text("The cat sat on the mat .\nShe went to the bank .\nHello world\n")
    (folder / "raw.txt").write_text("The cat sat on the mat. She went to the bank.\n")
    (folder / "corpus.txt").write_text(text * 2)  # 60 sentences
    (folder / "heldout.txt").write_text(text * 9)
    (folder / "words.txt").write_text("the\ncat\nsat\nbank\n")  # one token per line
    conll = "The DT B-NP\ncat NN I-NP\nsat VBD B-VP\n. . O\n\nA DT B-NP\ndog NN I-NP\nran VBD B-VP\n. . O\n\n"
    (folder / "train.txt").write_text(conll * 3)  # CoNLL-2000's columns: word POS chunk
    (folder / "test.txt").write_text(conll)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    document = SYBIL.parse(page)
    _inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "src"))
    try:
        for example in document:
            example.evaluate()
    finally:  # the migration guide's import hooks (allennlp.*, simple_elmo) last one page only
        from elmokit.compat import uninstall_allennlp_modules, uninstall_simple_elmo_module

        uninstall_allennlp_modules()
        uninstall_simple_elmo_module()


def test_pages_are_found_and_hold_examples() -> None:
    """The test sees README.md and the guides, and they hold blocks to run."""
    names = {str(p.relative_to(ROOT)) for p in PAGES}
    assert {"README.md", "docs/embedding.md", "docs/models.md", "docs/training.md"} <= names
    assert sum(len(list(SYBIL.parse(p))) for p in PAGES) >= 40


def test_cli_reference_is_generated_from_the_parser() -> None:
    """The site's command-line reference (docs/hooks/mkdocs_hooks.py) has every command and
    every option of the parser, with its help."""
    pytest.importorskip("mkdocs")
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import mkdocs_hooks
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    from elmokit.cli import build_parser

    reference = mkdocs_hooks.cli_reference()
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in commands.choices.items():
        assert f"`elmokit {name}`" in reference
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in reference, (name, option)
    assert "| `--nproc NPROC` | share the work between N processes" in reference
    page = mkdocs_hooks.on_page_markdown("# Command line\n\n<!-- cli-reference -->\n")
    assert "<!-- cli-reference -->" not in page and "## `elmokit embed`" in page
