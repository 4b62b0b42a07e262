"""The layered slicer (the fast path) gives exactly the stages of slicing the global BDD.

Both compute the reduced per-field diagram of a rule set (Algorithm 1 of Jepsen et al. 2018);
the BDD one is canonical by construction, so the layered one must agree with it state for
state: same numbering, same runs, same next-state counts, same leaves, atoms and example
packets.  Hypothesis rule sets use every comparison kind and nested and/or/not (the cubes of
non-conjunctive conditions come from per-rule BDDs), in every field order.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import rule_set
from test_differential import FIELDS, SPEC

from subc.ir.bdd import build_bdd, fields_used
from subc.ir.layered import slice_rules
from subc.lang.rules import parse_rules
from subc.ir.slicing import slice_bdd


def assert_same(a, b):
    assert a.root_state == b.root_state
    assert len(a.stages) == len(b.stages)
    for i, (x, y) in enumerate(zip(a.stages, b.stages)):
        assert [(s.state, s.runs) for s in x.states] == [(s.state, s.runs) for s in y.states], f"stage {i}"
        assert x.n_next == y.n_next, f"stage {i}"
        assert x.domain.cuts == y.domain.cuts and x.domain.mentioned == y.domain.mentioned
    assert [(lf.state, lf.atoms, lf.example) for lf in a.leaves] == [(lf.state, lf.atoms, lf.example) for lf in b.leaves]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_set(FIELDS, allow_drop=True), st.data())
def test_layered_equals_bdd_slicing(fields_text, data):
    _, text = fields_text
    rules = parse_rules(text, SPEC, "gen.sub")
    used = fields_used(rules)
    orders = list(itertools.permutations(used))
    order = list(data.draw(st.sampled_from(orders)))
    fast = slice_rules(rules, SPEC.query_fields, order)
    assert_same(fast, slice_bdd(build_bdd(rules, SPEC.query_fields, order)))


def test_layered_merges_equivalent_states():
    # symbols 1 and 2 have different rule sets with the same residual function: one state
    rules = parse_rules("h.c == 1 and h.a > 5 : fwd(1);\nh.c == 1 and h.a > 7 : fwd(1);\n"
                        "h.c == 2 and h.a > 5 : fwd(1);\nh.c == 3 and h.a > 9 : fwd(2);\nh.a > 200 : fwd(1);",
                        SPEC, "t.sub")
    fast = slice_rules(rules, SPEC.query_fields, ["h.c", "h.a"])
    assert_same(fast, slice_bdd(build_bdd(rules, SPEC.query_fields, ["h.c", "h.a"])))
    (st0,) = fast.stages[0].states
    targets = {v: st0.target(v) for v in (0, 1, 2, 3)}
    assert targets[1] == targets[2] != targets[3] != targets[0]
    assert fast.stages[1].n_next == len(fast.leaves) == 3  # {fwd 1}, {fwd 2}, {fwd 1, fwd 2}


def test_no_rule_can_match():
    rules = parse_rules("h.a > 5 and h.a < 3 : fwd(1);", SPEC, "t.sub")
    fast = slice_rules(rules, SPEC.query_fields, ["h.a"])
    assert_same(fast, slice_bdd(build_bdd(rules, SPEC.query_fields, ["h.a"])))
    assert fast.root_state == 0 and fast.leaves == []


@st.composite
def symbol_rules(draw):
    """Camus-like rule sets: an exact field tested with == (or in, or !=: overlapping groups at
    the root) and thresholds on one or two range fields, repeated with other literals, so that
    deferred rules share core conditions."""
    lines = []
    for _ in range(draw(st.integers(1, 30))):
        sym = draw(st.integers(0, 5))
        first = draw(st.sampled_from([f"h.c == {sym}", f"h.c == {sym}", f"h.c in {{{sym}, {sym + 1}}}", f"h.c != {sym}"]))
        op = draw(st.sampled_from([">", ">", "<", "<=", "==", "!="]))
        cond = f"{first} and h.a {op} {draw(st.integers(0, 255))}"
        if draw(st.booleans()):
            cond += f" and h.b > {draw(st.integers(0, 3))}"
        lines.append(f"{cond} : fwd({draw(st.integers(1, 4))});")
    return "\n".join(lines) + "\n"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(symbol_rules(), st.data())
def test_layered_equals_bdd_slicing_on_symbol_threshold_sets(text, data):
    rules = parse_rules(text, SPEC, "sym.sub")
    used = fields_used(rules)
    order = list(data.draw(st.sampled_from([sorted(used, key=lambda f: f != "h.c"), *itertools.permutations(used)])))
    fast = slice_rules(rules, SPEC.query_fields, order)
    assert_same(fast, slice_bdd(build_bdd(rules, SPEC.query_fields, order)))
    assert fast.work == slice_rules(list(reversed(rules)), SPEC.query_fields, order).work
