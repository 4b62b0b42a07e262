"""Input limits: rule count, rule length, nesting depth, states; each a clear error, never exhaustion."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from subc.compiler.driver import compile_rules
from subc.ir.layered import StateLimitExceeded
from subc.lang.limits import Limits
from subc.lang.rules import parse_rules
from subc.errors import SubcError

ROOT = Path(__file__).resolve().parent.parent


def err(text, spec, **limits) -> SubcError:
    with pytest.raises(SubcError) as e:
        parse_rules(text, spec, "l.sub", limits=Limits(**limits))
    return e.value


def test_rule_count_limit(example_spec):
    text = "add_order.price > 1 : fwd(1);\n" * 4
    assert len(parse_rules(text, example_spec, "l.sub", limits=Limits(max_rules=4))) == 4
    e = err("# header\n" + text, example_spec, max_rules=3)
    assert (e.location.line, e.location.column) == (5, 1) and "more than 3 rules" in e.message


def test_rule_length_limit(example_spec):
    long = "add_order.price > 1" + " and add_order.price > 2" * 100 + " : fwd(1);\n"
    e = err("add_order.price > 1 : fwd(1);\n" + long, example_spec, max_rule_chars=1000)
    assert (e.location.line, e.location.column) == (2, 1) and "2,430 characters" in e.message


@pytest.mark.parametrize("depth", [64, 65])
def test_nesting_limit_not_and_parentheses(example_spec, depth):
    nots = "not " * depth + "add_order.price > 1 : fwd(1);"
    alt = "add_order.price > 0 or " + "(add_order.price > 1 and " * (depth - 1) + "add_order.price > 2" + ")" * (depth - 1)
    for text in (nots, alt + " : fwd(1);"):
        if depth <= 64:
            assert len(parse_rules(text, example_spec, "l.sub")) == 1
        else:
            assert "nested 65 levels deep" in err(text, example_spec).message
    e = err("not " * 70 + "add_order.price > 1 : fwd(1);", example_spec)
    assert e.location.column == 64 * 4 + 1  # the first 'not' one level too deep


def test_long_chains_and_redundant_parentheses_are_one_level(example_spec):
    chain = " and ".join(f"add_order.price > {i}" for i in range(2000)) + " : fwd(1);"
    (r,) = parse_rules(chain, example_spec, "l.sub")
    assert len(r.condition.items) == 2000
    parens = "(" * 500 + "add_order.price > 1" + ")" * 500 + " : fwd(1);"
    assert len(parse_rules(parens, example_spec, "l.sub")) == 1


def siena_text(n_attrs=8, n=60):
    lines = [f"@pragma query_field(s.a{i}, 8)" for i in range(n_attrs)]
    rules = [f"s.a{i % n_attrs} {'<' if i % 3 else '>'} {(i * 37) % 100} : fwd({i % 30 + 1});" for i in range(n)]
    return "\n".join(lines) + "\n", "\n".join(rules) + "\n"


def test_state_limit_stops_exponential_rule_sets():
    from subc.spec.front_end import parse_spec

    spec_text, rules_text = siena_text()
    spec = parse_spec(spec_text, "s.p4")
    rules = parse_rules(rules_text, spec, "s.sub")
    t = time.process_time()  # CPU time: a busy machine does not make the compile slow
    with pytest.raises(StateLimitExceeded, match="more than 2,000 states"):
        compile_rules(rules, spec, limits=Limits(max_states=2000))
    assert time.process_time() - t < 30


def test_compile_cli_state_limit_exit_2_and_no_output(tmp_path):
    spec_text, rules_text = siena_text()
    (tmp_path / "s.p4").write_text(spec_text)
    (tmp_path / "s.sub").write_text(rules_text)
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "subc.cli", "compile", str(tmp_path / "s.sub"), "--spec", str(tmp_path / "s.p4"),
                        "-o", str(out), "--max-states", "2000"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2, p.stderr
    assert "error: the rule set needs more than 2,000 states" in p.stderr and "--max-states" in p.stderr
    assert not out.exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["s.p4", "s.sub"]
