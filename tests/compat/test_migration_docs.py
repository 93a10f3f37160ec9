"""What README.md and the migration pages (docs/migrating*.md) say about the compatibility layers
exists: every elmokit name they give resolves, every import line they show imports, every
``elmokit`` command they name is a command, and every peer has its page in the site's nav. (Their
examples run in tests/test_docs.py; the numbers they promise are tested in test_compat_*.py,
test_flair.py, test_manylangs.py and test_seqvec.py.)"""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

from elmokit.cli.commands import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("migrating*.md"))
PEERS = ("allennlp", "flair", "bio-embeddings", "simple-elmo", "manylangs", "tfhub")
CODE = re.compile(r"`([^`]+)`")


def _compat_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## Coming from AllenNLP")
    return text[start : text.index("\n## ", start + 1)]


def _optional_missing(error: ImportError) -> bool:
    """True when ``error`` is an optional package's absence (flair without the flair extra), not
    a stale elmokit name."""
    cause: BaseException | None = error  # elmokit's own message is raised over the original
    while cause is not None and not isinstance(cause, ModuleNotFoundError):
        cause = cause.__cause__ or cause.__context__
    name = getattr(cause, "name", None) or ""
    return bool(name) and name.split(".")[0] != "elmokit"


def _resolve(dotted: str) -> object:
    """The object named ``elmokit.a.b.C`` (the longest importable module, then attributes); None
    when its module needs an optional package that is not installed."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError as error:
            if _optional_missing(error):
                return None
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def _names(text: str) -> set[str]:
    """The dotted elmokit names in backticks, e.g. ``elmokit.compat.install_allennlp_modules()``."""
    found = set()
    for code in CODE.findall(text):
        for match in re.finditer(r"\belmokit(?:\.[A-Za-z_]\w*)+", code):
            found.add(match.group(0))
    return found


def _imports(text: str) -> set[str]:
    """``from elmokit... import a, b`` lines in backticks or text blocks."""
    return {m.group(0) for m in re.finditer(r"from elmokit[\w.]* import [\w, ]+(?: as \w+)?", text)}


def _commands(text: str) -> set[str]:
    return {m.group(1) for code in CODE.findall(text) for m in re.finditer(r"^elmokit ([a-z-]+)", code)}


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: p.name)
def test_every_name_import_and_command_exists(path):
    text = _compat_section() if path == README else path.read_text(encoding="utf-8")
    names, imports = _names(text), _imports(text)
    assert names, "the page names elmokit's compatibility API"
    for dotted in names:
        _resolve(dotted)  # raises when a name is stale
    for line in imports:
        try:
            exec(line, {})  # the page's own import line
        except ImportError as error:
            if not _optional_missing(error):
                raise
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert _commands(text) <= set(commands)


def test_readme_names_the_compat_entry_points_the_tests_cover():
    section = _compat_section()
    for claim in (
        "from elmokit.compat.allennlp import Elmo, ElmoEmbedder, batch_to_ids",
        "elmokit.compat.install_allennlp_modules()",
        "elmokit.integrations.flair.ELMoEmbeddings",
        "from elmokit.compat.simple_elmo import ElmoModel",
        "elmokit.compat.manylangs.ManyLangsEmbedder",
        "`elmokit elmo`",
    ):
        assert claim in section, claim


def test_every_peer_has_a_page_with_its_one_line_and_a_name_table_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for peer in PEERS:
        page = ROOT / "docs" / f"migrating-{peer}.md"
        text = page.read_text(encoding="utf-8")
        assert "## Name table" in text and "```text\n" in text, page.name  # the table and the one line
        assert (
            f"migrating-{peer}.md" in nav
            and f"(migrating-{peer}.md" in (ROOT / "docs" / "migrating.md").read_text()
        )
