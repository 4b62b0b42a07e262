"""The package's source is formatted, lint-clean and type-checked as ``pyproject.toml`` configures
ruff (``ruff format --check`` and ``ruff check`` on ``subc/``) and mypy (``[tool.mypy]``: every
module of ``subc/``, bodies of unannotated functions included): a change that breaks any of them
is named here, file and line, before review; and no module is over 500 lines."""

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


MAX_MODULE_LINES = 500  # modules stay small and named for what they hold (the README's layout table)


def test_modules_stay_small():
    """Every module of ``subc/`` (Python, C, templates) is at most :data:`MAX_MODULE_LINES` lines:
    a module that grows past it is split by what it holds."""
    long = []
    for path in sorted((ROOT / "subc").rglob("*")):
        if path.suffix in (".py", ".c", ".h", ".j2") and "__pycache__" not in path.parts:
            n = path.read_text().count("\n")
            if n > MAX_MODULE_LINES:
                long.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert not long, "modules over the limit:\n" + "\n".join(long)
