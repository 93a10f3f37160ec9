"""The tree is the map: the package root holds only its entry points, every other module sits in
a package of one layer, and docs/architecture.md names every module there is, and no other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import elmokit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(elmokit.__file__).resolve().parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DATA_FOLDERS = {"models", "examples", "manylangs_configs"}


def _modules() -> set[str]:
    """Every module of the package, dotted below ``elmokit`` (a package by its own name)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[0] in DATA_FOLDERS:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            names.add(".".join(parts))
    return names


def _mapped() -> set[str]:
    """The modules the module map of docs/architecture.md has a row for (its first cell)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text[text.index("## The modules") :]
    return set(re.findall(r"^\| `([\w.]+)` \|", section, flags=re.M))


def test_the_package_root_holds_only_its_entry_points_and_packages():
    modules = {p.name for p in PACKAGE.glob("*.py")}
    assert modules == {"__init__.py", "__main__.py", "_version.py"}
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    packages = {p for p in folders if (PACKAGE / p / "__init__.py").is_file()}
    assert folders - packages == DATA_FOLDERS
    assert packages == {
        "base",
        "hub",
        "model",
        "lm",
        "embed",
        "training",
        "serve",
        "probe",
        "cli",
        "compat",
        "integrations",
        "tasks",
    }


def test_every_module_has_a_row_in_the_architecture_page_and_every_row_a_module():
    modules, mapped = _modules(), _mapped()
    assert sorted(modules - mapped) == [], "modules docs/architecture.md does not describe"
    assert sorted(mapped - modules) == [], "rows of docs/architecture.md for modules that do not exist"


def test_the_layers_contract_has_one_entry_per_package_and_covers_every_package():
    """pyproject.toml's layers name packages (and the root's entry points), not modules, and
    each package of the root is in exactly one layer."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers")
    placed = [name.strip() for layer in contract["layers"] for name in re.split(r"[:|]", layer)]
    top = {m.split(".")[0] for m in _modules()}
    assert sorted(placed) == sorted(top - {""})
    assert all("." not in name for name in placed)


MAX_FUNCTION_LINES = 100


def test_no_function_or_method_of_the_package_is_over_100_lines():
    """Every function and method of the package, from its ``def`` to its last line (its
    docstring included, its decorators not), is at most 100 lines: a longer one is split into
    helpers of one idea each."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    where = path.relative_to(PACKAGE.parent).as_posix()
                    offenders.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    assert offenders == [], f"functions over {MAX_FUNCTION_LINES} lines: {', '.join(offenders)}"


def test_the_tests_mirror_the_package():
    """A test module lives in the folder of the package it tests (tests/model/ for
    elmokit.model, ...), tests/scripts/ for the repository's scripts; only the tests of the
    project as a whole (its docs, packaging, architecture, benchmarks, every layer on CUDA) stay
    at the top."""
    tests = ROOT / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in ("fixtures", "__pycache__")}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders - packages == {"scripts"}, "test folders that name no package of elmokit"
    for folder in folders:
        assert (tests / folder / "__init__.py").is_file(), f"tests/{folder} is not a package"
    top = sorted(p.stem for p in tests.glob("test_*.py"))
    assert top == [
        "test_api_surface",
        "test_architecture",
        "test_benchmarks",
        "test_bit_identity",
        "test_cuda",
        "test_docs",
        "test_hostile_sizes",
        "test_packaging",
    ]
