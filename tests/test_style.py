"""The package's source is formatted, lint-clean and type-checked as ``pyproject.toml`` configures
ruff (``ruff format --check`` and ``ruff check`` on ``subc/``) and mypy (``[tool.mypy]``: every
module of ``subc/``, bodies of unannotated functions included): a change that breaks any of them
is named here, file and line, before review."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import ROOT


def ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff")
    if exe is None:
        try:
            import ruff  # noqa: F401 - the test extra installs it
        except ImportError:
            pytest.skip("ruff is not installed (pip install -e '.[test]')")
        cmd = [sys.executable, "-m", "ruff"]
    else:
        cmd = [exe]
    return subprocess.run([*cmd, *args], cwd=ROOT, capture_output=True, text=True)


def test_lint_is_clean():
    r = ruff("check", "--no-cache", "subc")
    assert r.returncode == 0, r.stdout + r.stderr


def test_format_is_clean():
    r = ruff("format", "--no-cache", "--check", "subc")
    assert r.returncode == 0, "ruff format would change:\n" + r.stdout + r.stderr


def test_types_are_clean():
    try:
        import mypy  # noqa: F401 - the test extra installs it
    except ImportError:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--config-file", "pyproject.toml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
