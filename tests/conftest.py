"""Shared fixtures: paths to the example and the shared real ITCH sample; the Spark tests skip
when there is no Java runtime.  The P4Runtime writer's records of switches (``SUBC_STATE_DIR``)
go to a temporary directory of the test run, removed at its end."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

if "SUBC_STATE_DIR" not in os.environ:
    os.environ["SUBC_STATE_DIR"] = tempfile.mkdtemp(prefix="subc-state-")
    atexit.register(shutil.rmtree, os.environ["SUBC_STATE_DIR"], True)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "itch"
SHARED_ITCH = ROOT.parent / "shared" / "data" / "itch"


@pytest.fixture(scope="session")
def example_spec():
    from subc.spec.front_end import load_spec

    return load_spec(EXAMPLE / "spec.p4")


def real_sample(name: str = "ex20101224.TEST_ITCH_50") -> Path:
    """The shared real sample, or its copy under examples/itch/data."""
    for base in (SHARED_ITCH, EXAMPLE / "data"):
        if (base / name).exists():
            return base / name
    pytest.skip(f"real ITCH sample {name} not found")


JAVA_MODULES = ("test_pipeline_spark.py",)  # the Spark jobs end to end, in process and through the CLI


def pytest_runtest_setup(item):
    """Skip the tests that run Spark (those of :data:`JAVA_MODULES` and any using a ``spark``
    fixture: PySpark runs on Java) when no Java runtime is found."""
    uses_spark = item.path.name in JAVA_MODULES or "spark" in getattr(item, "fixturenames", ())
    if uses_spark and shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("the data pipeline (PySpark) needs a Java 17 runtime (apt-get install openjdk-17-jre-headless)")
