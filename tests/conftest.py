"""Shared fixtures: paths to the example and the shared real ITCH sample."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "itch"
SHARED_ITCH = ROOT.parent / "shared" / "data" / "itch"


@pytest.fixture(scope="session")
def example_spec():
    from subc.compiler.spec import load_spec

    return load_spec(EXAMPLE / "spec.p4")


def real_sample(name: str = "ex20101224.TEST_ITCH_50") -> Path:
    """The shared real sample, or its copy under examples/itch/data."""
    for base in (SHARED_ITCH, EXAMPLE / "data"):
        if (base / name).exists():
            return base / name
    pytest.skip(f"real ITCH sample {name} not found")
