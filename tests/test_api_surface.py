"""The public API is one list, written twice: the ``__all__`` of every public module (no part of
its name begins with ``_``) and the ``::: `` entries of docs/api.md hold the same names. A name in
``__all__`` is documented under its own module's path or under a package above it that exports
the same object (``elmokit.Embedder`` documents ``elmokit.embed.embedder.Embedder``); every entry
is a name its module exports; what the docs import is exported."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = SRC / "elmokit"
API = ROOT / "docs" / "api.md"
DATA_FOLDERS = {"models", "examples", "manylangs_configs"}
ENTRIES = re.findall(r"^::: ([\w.]+)\s*$", API.read_text(encoding="utf-8"), flags=re.M)
# `from elmokit.x import a, b as c` or `from elmokit.x import (\n a,\n b,\n)`
DOC_IMPORT = re.compile(r"from (elmokit(?:\.\w+)*) import (\([^)]*\)|[\w ,]+)")


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _public_modules() -> dict[str, Path]:
    """Every public module of the package, dotted (``elmokit.hub.resolve``), and its file."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("elmokit", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[1] in DATA_FOLDERS or any(_is_private(p) for p in parts):
            continue
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = _public_modules()
PACKAGES = sorted(name for name, path in MODULES.items() if path.name == "__init__.py")


def _static_all(path: Path) -> list[str] | None:
    """The literal ``__all__`` of a module's source (None: it has none), read without importing it."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            value = node.value  # type: ignore[union-attr]
            assert isinstance(value, ast.List), f"{path}: __all__ is not a list literal"
            return [ast.literal_eval(element) for element in value.elts]
    return None


def _import(name: str) -> ModuleType:
    """The module, or a skip when it needs an optional part this environment lacks."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        if (err.name or "").startswith("elmokit") and "pip install" not in str(err):
            raise
        pytest.skip(f"{name} needs an optional part: {err}")


def _entry(entry: str) -> tuple[str, str]:
    """An entry of docs/api.md split into its public module and the name in it."""
    module, _, name = entry.rpartition(".")
    assert module in MODULES, f"docs/api.md: ::: {entry}: {module} is not a public module of elmokit"
    return module, name


def test_every_public_module_has_an_all_without_repeats():
    assert len(MODULES) > 60  # the walk found the package
    missing = [name for name, path in MODULES.items() if _static_all(path) is None]
    assert missing == []
    lists = {name: _static_all(path) or [] for name, path in MODULES.items()}
    assert {name: names for name, names in lists.items() if len(names) != len(set(names))} == {}


def test_the_api_reference_has_no_repeated_entry():
    assert len(ENTRIES) == len(set(ENTRIES)) > 20


@pytest.mark.parametrize("module_name", sorted(MODULES))
def test_every_exported_name_is_documented(module_name):
    exported = _static_all(MODULES[module_name]) or []
    if not exported:
        return
    module = _import(module_name)
    ancestors = [".".join(module_name.split(".")[:i]) for i in range(1, module_name.count(".") + 1)]
    undocumented = []
    for name in exported:
        value = getattr(module, name)
        if f"{module_name}.{name}" in ENTRIES:
            continue
        if not any(
            f"{package}.{name}" in ENTRIES and getattr(_import(package), name, None) is value
            for package in ancestors
        ):
            undocumented.append(name)
    assert undocumented == [], f"{module_name}: in __all__ but not in docs/api.md"


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_api_entry_is_an_exported_name_that_resolves(entry):
    module_name, name = _entry(entry)
    assert name in (_static_all(MODULES[module_name]) or []), f"{entry} is documented but not in __all__"
    value = getattr(_import(module_name), name)
    if callable(value):
        assert (value.__doc__ or "").strip(), f"{entry} has no docstring to show"


@pytest.mark.parametrize("package", PACKAGES)
def test_a_packages_exports_import(package):
    """``from package import name`` for each of its ``__all__`` (the lazy roots included), and
    ``from package import *`` gives exactly those names."""
    module = _import(package)
    for name in module.__all__:
        getattr(module, name)
    namespace: dict[str, object] = {}
    exec(f"from {package} import *", namespace)
    assert sorted(set(namespace) - {"__builtins__"}) == sorted(module.__all__)


def _doc_imports() -> list[tuple[str, str, str]]:
    """(file, module, name) of each ``from elmokit... import name`` in README.md and docs/."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for module, names in DOC_IMPORT.findall(path.read_text(encoding="utf-8")):
            for item in names.strip("()").split(","):
                if item.split():
                    found.append((str(path.relative_to(ROOT)), module, item.split()[0]))
    return found


def test_the_docs_import_only_exported_names():
    found = _doc_imports()
    assert len(found) > 20  # the pattern matched the guides' imports
    unexported = [
        (where, module, name)
        for where, module, name in found
        if module not in MODULES or name not in (_static_all(MODULES[module]) or [])
    ]
    assert unexported == []
