"""The public API (``import subc``, ``subc/api.py``) gives exactly what the commands give.

Each function is compared with its command run as a separate process: the outputs of
``subc.compile(...).write`` with ``subc compile``'s, byte for byte, for every target; ``subc.simulate``
with ``subc simulate --json`` on the real sample; ``subc.check`` with ``subc check --format json``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import subc
from conftest import EXAMPLE, real_sample

SUBC = [sys.executable, "-m", "subc.cli"]
RULES = EXAMPLE / "rules.sub"
SPEC = EXAMPLE / "spec.p4"


def run(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([*SUBC, *args], capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stderr
    return r


@pytest.mark.parametrize("target", ["bmv2", "tofino", "ebpf"])
def test_compile_writes_what_subc_compile_writes(tmp_path, target):
    spec = subc.load_spec(SPEC)
    rules = subc.load_rules(RULES, spec)
    c = subc.compile(rules, spec, target=target, rules_path=str(RULES))
    c.write(tmp_path / "api")
    run("compile", str(RULES), "--spec", str(SPEC), "--target", target, "-o", str(tmp_path / "cli"))
    names = sorted(p.name for p in (tmp_path / "cli").iterdir())
    assert sorted(p.name for p in (tmp_path / "api").iterdir()) == names
    for name in names:
        assert (tmp_path / "api" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    assert c.field_order == c.report["field_order"]
    assert c.entries.to_json() == json.loads((tmp_path / "cli" / ("maps.json" if target == "ebpf" else "entries.json")).read_text())


def test_simulate_agrees_with_subc_simulate():
    spec = subc.load_spec(SPEC)
    c = subc.compile(subc.parse_rules(RULES.read_text(), spec, str(RULES)), spec)
    sim = subc.simulate(c, real_sample())
    want = json.loads(run("simulate", str(RULES), "--spec", str(SPEC), "--trace", str(real_sample()), "--json").stdout)
    assert sim.as_json() == want
    assert sim.messages > 0 and sim.disagreements == 0


def test_check_agrees_with_subc_check(tmp_path):
    f = tmp_path / "r.sub"
    f.write_text(RULES.read_text() + 'add_order.stock == "BOB" and add_order.shares > 5 : fwd(1);\n'
                 'add_order.shares > 5 and add_order.shares < 2 : fwd(2);\n')
    rep = subc.check([f], SPEC, "tofino")
    want = json.loads(run("check", str(f), "--spec", str(SPEC), "--target", "tofino", "--format", "json").stdout)
    got = [(d.code, d.severity, d.location and d.location.line) for d in rep.diagnostics]
    assert got == [(d["code"], d["severity"], d["line"]) for d in want["diagnostics"]]
    assert {"redundant", "unsatisfiable"} <= {c for c, _, _ in got}


def test_errors_are_subc_errors_with_locations(tmp_path):
    spec = subc.load_spec(SPEC)
    with pytest.raises(subc.SubcError, match="unknown target"):
        subc.compile([], spec, target="p5")
    with pytest.raises(subc.SubcError) as e:
        subc.parse_rules("add_order.nope == 1 : fwd(1);", spec, "x.sub")
    assert "x.sub:1:" in str(e.value)


def test_import_subc_is_light():
    """``import subc`` loads the API on first use only, so that the commands start fast."""
    code = "import sys, subc; print('subc.compiler.driver' in sys.modules); subc.load_spec; " \
           "print('subc.compiler.driver' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.split() == ["False", "True"], r.stderr
    assert sorted(subc.__all__) == sorted([*subc.API, "__version__"])
    from subc import api

    assert sorted(api.__all__) == sorted(subc.API)  # the two lists (linters need api's literal) agree
    with pytest.raises(AttributeError):
        subc.no_such_name  # noqa: B018


def test_the_readme_example_runs(tmp_path, monkeypatch, capsys):
    """README's "Python API" example, as written (its output directory moved to a temporary one)."""
    import re

    from conftest import ROOT

    code = re.search(r"## Python API\n.*?```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    monkeypatch.chdir(ROOT)
    exec(compile(code.replace('"out/"', repr(str(tmp_path / "out"))), "README.md", "exec"), {})
    printed = capsys.readouterr().out.split("\n")
    assert printed[1].split() == [printed[1].split()[0], "0"]  # messages, no disagreement
    assert (tmp_path / "out" / "subc.p4").exists()
