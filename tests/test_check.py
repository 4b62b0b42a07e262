"""``subc check``: the analyses against the compiled semantics, the CLI formats and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from subc.checker.analysis import RuleSpace, changes_nothing, conflicts, unsatisfiable
from subc.checker.fit import tofino_fit
from subc.checker.run import check
from subc.compiler.driver import compile_rules
from subc.ir.layered import slice_rules
from subc.lang.rules import parse_rules
from subc.spec.front_end import parse_spec
from subc.errors import SubcError
from subc.semantics.reference import reference_decision

from strategies import rule_set

ROOT = Path(__file__).resolve().parent.parent
SPEC_PATH = ROOT / "examples" / "itch" / "spec.p4"
SPEC = parse_spec("""
@pragma query_field(h.a, 8)
@pragma query_field(h.b, 16)
@pragma query_field_exact(h.c, 8)
@pragma query_field_lpm(h.d, 8)
@pragma query_field_exact(h.f, 2)
""", "check.p4")
FIELDS = {q.name: q for q in SPEC.query_fields.values()}
ORDER = sorted(FIELDS)


def canon(rules) -> tuple:
    """The compiled function of ``rules`` in a fixed field order: the reduced sliced diagram's
    runs and leaves, equal iff the functions are equal."""
    sl = slice_rules(rules, SPEC.query_fields, ORDER)
    return (sl.root_state, tuple(tuple(tuple(s.runs) for s in stage.states) for stage in sl.stages),
            tuple((lf.state, lf.atoms) for lf in sl.leaves))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_set(FIELDS, allow_drop=True))
def test_reported_rules_change_nothing_and_the_others_do(fields_text):
    _, text = fields_text
    text = text + "\n" + text.splitlines()[0]  # always one duplicate
    rules = parse_rules(text, SPEC, "gen.sub")
    space = RuleSpace(rules, SPEC)
    unsat = {d.location.line for d in unsatisfiable(space)}
    reported = {d.location.line for d in changes_nothing(space)}
    assert not unsat & reported
    for r in rules:
        assert (r.location.line in unsat) == (canon([r])[0] == 0), r.text
    # removing every reported rule (and the unsatisfiable ones) together leaves the function equal
    kept = [r for r in rules if r.location.line not in reported | unsat]
    assert canon(kept) == canon(rules)
    # every other rule matters, given the earlier rules and the later kept ones
    for i, r in enumerate(rules):
        if r.location.line in reported | unsat:
            continue
        context = rules[:i] + [x for x in rules[i + 1:] if x in kept]
        assert canon(context + [r]) != canon(context), f"rule {r.text} changes nothing but was not reported"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_set(FIELDS, allow_drop=True))
def test_conflicts_are_reported_exactly_when_compile_rejects(fields_text):
    _, text = fields_text
    rules = parse_rules(text, SPEC, "gen.sub")
    found = conflicts(RuleSpace(rules, SPEC))
    try:
        compile_rules(rules, SPEC, "bmv2")
        rejected = False
    except SubcError as e:
        assert "conflicting actions" in e.message
        rejected = True
    assert bool(found) == rejected
    for d in found:
        pkt = {f: 0 for f in FIELDS} | d.example
        with pytest.raises(SubcError, match="conflicting actions"):
            reference_decision(rules, SPEC, pkt)


EXAMPLE = """\
add_order.stock == "GOOGL" and add_order.price > 50 : fwd(1, 2);
add_order.price > 10 and add_order.price < 5 : fwd(3);
add_order.stock == "GOOGL" and add_order.price > 60 : fwd(1);
add_order.stock == "GOOGL" and add_order.price > 50 : fwd(1, 2);
add_order.stock == "MSFT" : fwd(4);
add_order.stock == "MSFT" and add_order.shares > 100 : drop();
add_order.stock == "AAPL" and add_order.prise > 1 : fwd(1);
add_order.stock == "AAPL" and : fwd(1);
"""


def run_check(tmp_path, text, *args):
    rules = tmp_path / "rules.sub"
    rules.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "subc.cli", "check", str(rules), "--spec", str(SPEC_PATH), *args],
                          capture_output=True, text=True, env=env), str(rules)


def test_check_reports_every_kind_of_finding(tmp_path):
    p, path = run_check(tmp_path, EXAMPLE, "--format", "json")
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    assert doc["format"] == "subc-check" and doc["rules"] == 6
    got = [(d["severity"], d["code"], d["line"], d["column"]) for d in doc["diagnostics"]]
    assert got == [
        ("warning", "unsatisfiable", 2, 26),
        ("warning", "redundant", 3, 1),
        ("warning", "duplicate", 4, 1),
        ("error", "conflict", 6, 1),
        ("error", "syntax", 7, 31),
        ("error", "syntax", 8, 31),
    ]
    by_line = {d["line"]: d for d in doc["diagnostics"]}
    assert "'add_order.price > 10' and 'add_order.price < 5' contradict" in by_line[2]["message"]
    assert by_line[3]["related"] == [{"file": path, "line": 1, "column": 1}]
    assert by_line[4]["related"] == [{"file": path, "line": 1, "column": 1}]
    assert 'add_order.stock="MSFT"' in by_line[6]["message"] and by_line[6]["example"]["add_order.shares"] > 100
    assert "unknown field 'add_order.prise'" in by_line[7]["message"]
    assert doc["summary"] == {"errors": 3, "warnings": 3, "notes": 0}
    assert doc["target_fit"] is None  # errors: not compiled


def test_check_text_and_github_formats(tmp_path):
    p, path = run_check(tmp_path, EXAMPLE)
    assert p.returncode == 1
    assert f"{path}:2:26: warning: rule never matches" in p.stdout
    assert "\n                             ^\n" in p.stdout  # the caret under column 26
    assert "3 error(s), 3 warning(s)" in p.stdout
    p, path = run_check(tmp_path, EXAMPLE, "--format", "github")
    lines = p.stdout.splitlines()
    assert lines[0].startswith(f"::warning file={path},line=2,col=26,title=subc unsatisfiable::")
    assert sum(ln.startswith("::error ") for ln in lines) == 3
    assert all("\n" not in ln for ln in lines)


def test_check_exit_status(tmp_path):
    clean = 'add_order.stock == "GOOGL" : fwd(1);\nadd_order.price > 5 : fwd(2);\n'
    p, _ = run_check(tmp_path, clean, "--target", "tofino")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "about 2 MAU stages" in p.stdout
    warn = clean + 'add_order.stock == "GOOGL" : fwd(1);\n'
    assert run_check(tmp_path, warn)[0].returncode == 0
    assert run_check(tmp_path, warn, "--strict")[0].returncode == 1
    p = subprocess.run([sys.executable, "-m", "subc.cli", "check", str(tmp_path / "missing.sub"), "--spec", str(SPEC_PATH)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2 and "cannot read rules" in p.stderr
    bad_spec = tmp_path / "bad.p4"
    bad_spec.write_text("header h_t { bit<8> a; \n")
    p = subprocess.run([sys.executable, "-m", "subc.cli", "check", str(tmp_path / "rules.sub"), "--spec", str(bad_spec)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2 and f"{bad_spec}:" in p.stderr


def test_check_max_rules_is_an_error_with_a_location(tmp_path):
    p, path = run_check(tmp_path, 'add_order.price > 1 : fwd(1);\n' * 3, "--max-rules", "2", "--format", "json")
    assert p.returncode == 1
    (d,) = json.loads(p.stdout)["diagnostics"]
    assert (d["code"], d["line"], d["column"]) == ("limit", 3, 1)


def test_tofino_fit_counts_stages_and_flags_too_many(example_spec):
    rules = parse_rules('add_order.stock == "GOOGL" and add_order.price > 5 : fwd(1);', example_spec, "r.sub")
    res = compile_rules(rules, example_spec, "tofino")
    fit, diags = tofino_fit(res)
    assert fit["stages"]["needed"] == len(fit["steps"]) == 2 and diags == []
    res.pipeline.mcast_groups = {g: (1, 2) for g in range(1, 65_537)}
    res.pipeline.state_width = 40
    _, diags = tofino_fit(res)
    errors = sorted(d.message for d in diags if d.severity == "error")
    assert len(errors) == 2
    assert "65,536 multicast groups" in errors[1] and "need 40 bits" in errors[0]


def test_check_ebpf_counts_instructions(tmp_path):
    from ebpf_util import need_root

    need_root()  # loading BPF programs needs root, bcc and kernel headers
    p, _ = run_check(tmp_path, 'add_order.stock == "GOOGL" and add_order.price > 5 : fwd(1);\n', "--target", "ebpf",
                     "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    ins = json.loads(p.stdout)["target_fit"]["instructions"]
    assert ins is not None, p.stdout
    assert 0 < ins["subc_xdp"]["xlated_insns"] < 1_000_000 and ins["subc_tc"]["xlated_insns"] > 0


def test_check_api_on_several_files(tmp_path):
    a, b = tmp_path / "a.sub", tmp_path / "b.sub"
    a.write_text('add_order.price > 5 : fwd(1);\n')
    b.write_text('\nadd_order.price > 6 : fwd(1);\n')
    rep = check([str(a), str(b)], str(SPEC_PATH))
    assert rep.rules == 2
    (d,) = rep.diagnostics
    assert (d.code, d.location.path, d.location.line) == ("redundant", str(b), 2)
    assert d.related[0].path == str(a)


def test_pre_commit_hook_and_workflow_examples_run(tmp_path):
    import shlex

    import yaml

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    cfg = yaml.safe_load((ROOT / "examples" / "ci" / "pre-commit-config.yaml").read_text())
    (use,) = cfg["repos"][0]["hooks"]
    assert use["id"] == hook["id"] == "subc-check"
    import re

    assert re.search(hook["files"], "rules/a.sub") and not re.search(hook["files"], "spec.p4")
    rules = ROOT / "examples" / "itch" / "rules.sub"
    args = [a if a != "spec.p4" else str(SPEC_PATH) for a in use["args"]]
    entry = shlex.split(hook["entry"])
    assert entry[0] == "subc"
    cmd = [sys.executable, "-m", "subc.cli", *entry[1:], *args, str(rules)]
    assert subprocess.run(cmd, capture_output=True, text=True, env=env).returncode == 0
    bad = tmp_path / "bad.sub"
    bad.write_text('add_order.price > 1 : fwd(1);\nadd_order.price > 2 : fwd(1);\n')
    p = subprocess.run(cmd[:-1] + [str(bad)], capture_output=True, text=True, env=env)
    assert p.returncode == 1 and "[redundant]" in p.stdout  # --strict: a warning fails the hook
    wf = yaml.safe_load((ROOT / "examples" / "ci" / "github-workflow.yml").read_text())
    step = next(s for s in wf["jobs"]["check"]["steps"] if s.get("name") == "Check the rule sets for Tofino")
    words = shlex.split(step["run"].replace("rules/*.sub", str(bad)).replace("spec.p4", str(SPEC_PATH)))
    p = subprocess.run([sys.executable, "-m", "subc.cli", *words[1:]], capture_output=True, text=True, env=env)
    assert p.returncode == 1 and p.stdout.startswith(f"::warning file={bad},line=2,col=1,title=subc redundant::")
