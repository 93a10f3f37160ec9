"""Packaging: one version, the license, type information."""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import pytest

import elmokit

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_written_once_and_installed_as_written():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "elmokit._version.__version__"}
    assert importlib.metadata.version("elmokit") == elmokit.__version__


def test_license_is_an_spdx_expression_with_the_apache_text():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    # the text of https://www.apache.org/licenses/LICENSE-2.0.txt, byte for byte
    digest = hashlib.md5((ROOT / "LICENSE").read_bytes()).hexdigest()
    assert digest == "3b83ef96387f14655fc854ddc3c6bd57"


def test_the_package_is_typed_and_ships_the_marker():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert (Path(elmokit.__file__).parent / "py.typed").is_file()
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["elmokit"]


def test_torch_lower_bound_covers_the_apis_the_code_calls():
    """torch.is_autocast_enabled(device_type) and fused Adagrad on CPU first shipped in 2.4."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "torch>=2.4" in project["dependencies"]


# -- the test lock (requirements/test-lock.txt, make install) ------------------------------------
LOCK = ROOT / "requirements" / "test-lock.txt"
LOCKED_EXTRAS = ("dev", "flair", "docs")  # the Makefile's EXTRAS


def _lock_drift():
    import importlib.util

    spec = importlib.util.spec_from_file_location("lock_drift", ROOT / "scripts" / "lock_drift.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _requirements(project: dict, extras: tuple[str, ...]) -> list:
    """The requirements ``pip install '.[extras]'`` asks for, ``elmokit[...]`` self-references
    followed."""
    from packaging.requirements import Requirement

    found, todo, seen = [], [*project["dependencies"]], set()
    todo += [r for extra in extras for r in project["optional-dependencies"][extra]]
    while todo:
        requirement = Requirement(todo.pop())
        if requirement.name == "elmokit":
            for extra in requirement.extras - seen:
                seen.add(extra)
                todo += project["optional-dependencies"][extra]
        elif requirement.marker is None or requirement.marker.evaluate():
            found.append(requirement)
    return found


def test_the_lock_pins_every_declared_dependency_inside_its_range():
    """make install takes every version from the lock: a dependency that pyproject.toml declares
    and the lock lacks, or pins outside the declared range, means `make lock` was not run."""
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = _lock_drift().read_lock(LOCK)
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert f"EXTRAS := {','.join(LOCKED_EXTRAS)}\n" in makefile
    assert "--constraint $(LOCK)" in makefile and "LOCK := requirements/test-lock.txt" in makefile
    torch_version = makefile.split("TORCH_VERSION := ", 1)[1].split()[0]
    assert pins["torch"] == torch_version
    for requirement in _requirements(project, LOCKED_EXTRAS):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is declared in pyproject.toml but not locked: run make lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} in the lock is outside {requirement.specifier}: run make lock"
        )
    assert all(line.count("==") == 1 for line in LOCK.read_text().splitlines() if not line.startswith("#"))


def test_lock_drift_lists_changed_new_and_gone_packages(tmp_path):
    drift = _lock_drift()
    lock = tmp_path / "lock.txt"
    lock.write_text("# a header\nnumpy==2.0.0\nh5py==3.8.0  # a note\nsix==1.0\n")
    assert drift.read_lock(lock) == {"numpy": "2.0.0", "h5py": "3.8.0", "six": "1.0"}
    now = {"numpy": "2.1.0", "h5py": "3.8.0", "tzdata": "2026.1"}
    assert drift.drift(drift.read_lock(lock), now) == [
        "drift: numpy: 2.0.0 -> 2.1.0",
        "drift: six: 1.0 -> (not installed)",
        "drift: tzdata: (not locked) -> 2026.1",
    ]


def test_ci_runs_the_readme_test_command_first_and_alone():
    """A user runs only the README's test command: CI runs exactly that before anything else
    installs a package (make test sets up .venv itself)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "\nmake test " in readme.split("## Tests", 1)[1].split("\n## ", 1)[0]
    steps = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    first_make = next(i for i, line in enumerate(steps) if "make " in line or "pip " in line)
    assert steps[first_make].startswith("make test 2>&1") and "pip " not in "\n".join(steps[:first_make])


def test_the_slow_modules_exist_and_the_quick_tier_leaves_them_out():
    from tests.conftest import SLOW_MODULES

    tests = {path.stem for path in (ROOT / "tests").rglob("test_*.py")}
    assert sorted(SLOW_MODULES - tests) == []
    assert '-m "not slow"' in (ROOT / "Makefile").read_text(encoding="utf-8")
