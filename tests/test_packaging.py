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
