"""The package's public names: every one declared resolves, and the type checkers see the same list."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import elmo_cache


def test_every_declared_public_name_resolves():
    for name in elmo_cache.__all__:
        assert getattr(elmo_cache, name) is not None, name


def test_the_names_type_checkers_see_are_the_names_the_package_exports():
    tree = ast.parse(Path(elmo_cache.__file__).read_text(encoding="utf-8"))
    guarded = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    seen = {
        alias.asname or alias.name
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name != "*"
    }
    assert seen <= set(elmo_cache.__all__), seen - set(elmo_cache.__all__)


def test_a_name_the_package_does_not_export_is_an_attribute_error():
    with pytest.raises(AttributeError, match="NotAName"):
        elmo_cache.NotAName  # noqa: B018


def test_every_stage_package_imports_on_its_own():
    for stage in ("text", "model", "encoder", "rows", "store", "builder", "reader", "verify", "compat", "train"):
        importlib.import_module(f"elmo_cache.{stage}")


def test_a_system_that_is_not_posix_gets_one_clear_error_at_import():
    """setup.cfg declares POSIX (fcntl, resource): elsewhere ``import elmo_cache`` says so, naming the platform."""
    code = "import os, sys; os.name = 'nt'; sys.platform = 'win32'; import elmo_cache"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: elmo-cache runs on POSIX systems (Linux, macOS), not on 'win32'"), last
    assert "WSL" in last


def test_posix_is_declared():
    import configparser

    config = configparser.ConfigParser()
    config.read(Path(__file__).parents[1] / "setup.cfg")
    assert "Operating System :: POSIX" in config["metadata"]["classifiers"]
