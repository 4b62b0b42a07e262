"""The manual (``docs/``) builds with ``mkdocs build --strict`` (a broken link, a page missing from the
navigation's files or an API name mkdocstrings cannot find fails it), every page is in the navigation,
and the API reference is generated from the docstrings of ``subc/api.py``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT


def nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_every_page_is_in_the_navigation():
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(nav_pages(cfg["nav"])) == pages


def test_the_manual_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("Compilation", "simulate", "load_spec", "parse_rules"):
        assert name in api, name
    assert "atomically" in api  # a docstring's text, not only its names
    for page in ("rules", "ebpf", "serve", "tests"):
        assert (tmp_path / "site" / page / "index.html").exists()
