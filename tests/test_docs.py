"""Every code block of README.md and docs/ runs (Sybil reads the Markdown).

- A ```python block is executed; the blocks of one page share their names, in page order.
- A ```bash or ```sh block is run by bash (``set -euo pipefail``) with this Python's ``elmokit``
  first on PATH; it must exit 0.
- Each page runs in an empty temporary folder, offline and with a private cache
  (tests/conftest.py): the input files its commands name are the ones the page itself writes
  or shows, so the reader can do the same.
- Each page runs twice in a row in that folder (a fresh namespace each time), as a reader runs
  it again: an example that fails when its own output already exists fails the test.
- A block that cannot run here (several machines, a GPU, a network, a server that never exits)
  follows the line ``<!-- no-run: why -->`` and is only syntax-checked: ``compile()`` for
  Python, ``bash -n`` for shell.
- A block that needs an optional package that is not installed (flair, pandas, DuckDB, polars,
  pyarrow, ray, pyspark; a shell block with ``--engine ray`` needs ray; pyspark needs ``java`` on
  PATH) is syntax-checked only.

The site's own checks are here too: a Markdown list needs a blank line before it, and the HTML
check of docs/hooks/mkdocs_hooks.py refuses a raw ``<S>`` tag.

Other fences (```text, ```json) are output shown to the reader and are not run; a fence in any
other language fails the test, so that no block escapes by its label.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
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
# Optional packages a block may need: without them it is syntax-checked only.
OPTIONAL = {"flair": "flair", "pandas": "pandas", "duckdb": "duckdb", "polars": "polars", "pyarrow": "pyarrow", "ray": "ray",
            "pyspark": "pyspark"}


def _no_run(example: Example) -> bool:
    """True when the block follows a ``<!-- no-run: why -->`` line."""
    return bool(NO_RUN.search(example.document.text[: example.start]))


def _missing_optional(source: str) -> bool:
    return any(
        re.search(rf"\b(import|from) {name}\b", source) and importlib.util.find_spec(module) is None
        for name, module in OPTIONAL.items()
    ) or ("--engine ray" in source and importlib.util.find_spec("ray") is None) or (
        re.search(r"\b(import|from) pyspark\b", source) is not None and shutil.which("java") is None
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
    if _no_run(example) or _missing_optional(example.parsed):
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


def _run_page(page: Path) -> None:
    document = SYBIL.parse(page)  # a fresh namespace
    try:
        for example in document:
            example.evaluate()
    finally:  # the migration guide's import hooks (allennlp.*, simple_elmo) last one page only
        from elmokit.compat import uninstall_allennlp_modules, uninstall_simple_elmo_module

        uninstall_allennlp_modules()
        uninstall_simple_elmo_module()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_runs_twice_in_an_empty_folder(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "src"))
    assert not any(tmp_path.iterdir())
    _run_page(page)
    try:
        _run_page(page)
    except Exception as error:
        raise AssertionError(
            f"{page.relative_to(ROOT)}: its examples pass once but fail when run again in the same "
            "folder (an output that already exists?)"
        ) from error


def test_pages_are_found_and_hold_examples() -> None:
    """The test sees README.md and the guides, and they hold blocks to run."""
    names = {str(p.relative_to(ROOT)) for p in PAGES}
    assert {"README.md", "docs/embedding.md", "docs/models.md", "docs/training.md"} <= names
    assert sum(len(list(SYBIL.parse(p))) for p in PAGES) >= 40


def test_cli_reference_is_generated_from_the_parser() -> None:
    """The site's command-line reference (docs/hooks/mkdocs_hooks.py) has every command and
    every option of the parser, with its help."""
    mkdocs_hooks = _hooks()
    from elmokit.cli.commands import build_parser

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


LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")
FENCE = re.compile(r"^\s*(```|~~~)")


def lists_without_a_blank_line(text: str) -> list[int]:
    """The line numbers of list items that directly follow a paragraph line (outside code fences):
    Markdown reads such a list as more words of the paragraph."""
    found = []
    fenced = in_list = False
    before = "blank"  # what the previous line was: blank, list, heading or paragraph
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            before, in_list = "blank", False
            continue
        if fenced:
            continue
        if not line.strip():
            before = "blank"
        elif LIST_ITEM.match(line):
            if before == "paragraph" and not in_list:
                found.append(number)
            before, in_list = "list", True
        elif line.lstrip().startswith("#"):
            before, in_list = "heading", False
        else:  # a list item's continuation (indented, or straight after it), else a paragraph
            in_list = in_list and (before != "blank" or line.startswith((" ", "\t")))
            before = "paragraph"
    return found


def test_the_list_check_finds_a_list_glued_to_its_paragraph() -> None:
    assert lists_without_a_blank_line("Text:\n- a\n- b\n") == [2]
    assert lists_without_a_blank_line("Some text\n1. first\n") == [2]
    assert lists_without_a_blank_line("Text:\n\n- a\n  wrapped\n- b\n\n  more of b\n* c\n") == []
    assert lists_without_a_blank_line("## Heading\n- a\n\n```text\nx\n- y\n```\n") == []
    assert lists_without_a_blank_line("- a\n\nA paragraph.\n- glued\n") == [4]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_list_has_a_blank_line_before_it(page: Path) -> None:
    lines = lists_without_a_blank_line(page.read_text(encoding="utf-8"))
    assert not lines, f"{page.relative_to(ROOT)}: a list right after a paragraph line, lines {lines}"


def _hooks():  # type: ignore[no-untyped-def]
    pytest.importorskip("mkdocs")
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import mkdocs_hooks
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    return mkdocs_hooks


def test_the_site_build_refuses_a_raw_sentence_boundary_tag() -> None:
    """A ``<S>`` that reaches the HTML raw is a strike-through element to the browser (and
    ``<UNK>`` vanishes): the strict build stops on it; escaped, it passes."""
    hooks = _hooks()
    from mkdocs.exceptions import PluginError

    for raw in ("<p>adds <S> and </S> itself</p>", "<td>including <unk></td>", "<p>a <EOS>.</p>"):
        with pytest.raises(PluginError, match=r"api/index\.md: .*raw tag"):
            hooks.check_html(raw, "api/index.md")
    hooks.check_html(
        "<p>adds &lt;S&gt; and <code>&lt;/S&gt;</code>, <strong>x</strong> <span>y</span></p>", "ok"
    )
    assert hooks.raw_tags("<p>a <S> b </ S> c <s/> <sup>2</sup> <summary>") == ["<S>", "</ S>", "<s/>"]
    page = "<html><body><p>ok &lt;UNK&gt;</p></body></html>"
    assert hooks.on_post_page(page, page=None) == page
    with pytest.raises(PluginError):
        hooks.on_post_page("<p><UNK></p>", page=None)


def test_the_cli_reference_escapes_tags_outside_code() -> None:
    hooks = _hooks()
    assert (
        hooks._cell("including <S>, </S> & `a <b>` | x")
        == "including &lt;S&gt;, &lt;/S&gt; &amp; `a <b>` \\| x"
    )
    assert "| `--max-size MAX_SIZE` | including &lt;S&gt;, &lt;/S&gt;, &lt;UNK&gt;" in hooks.cli_reference()
