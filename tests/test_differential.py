"""Differential tests: random rule sets and packets, reference semantics vs compiled tables.

Hypothesis draws rule sets over 2 to 4 fields (range, exact and lpm fields of several widths)
with every comparison kind, nested and/or/not, and several actions, then packets that sit on,
just below and just above every bound of the rules.  The table simulator over the emitted
entries must give exactly the decision of the reference interpreter; a rule set whose actions
conflict must be rejected with a packet on which the reference sees the conflict.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.spec.front_end import parse_spec
from subc.backends.p4.entries import entries_doc
from subc.errors import SubcError
from subc.semantics.reference import reference_decision
from subc.sim.switch import TableSimulator

from strategies import boundary_packets, rule_set

SPEC_TEXT = """
@pragma query_field(h.a, 8)
@pragma query_field(h.b, 16)
@pragma query_field_exact(h.c, 8)
@pragma query_field_lpm(h.d, 8)
@pragma query_field(h.e, 32)
@pragma query_field_exact(h.f, 2)
"""
SPEC = parse_spec(SPEC_TEXT, "diff.p4")
FIELDS = {q.name: q for q in SPEC.query_fields.values()}


def check(fields_text, target, range_form, data):
    fields, text = fields_text
    rules = parse_rules(text, SPEC, "gen.sub")
    try:
        res = compile_rules(rules, SPEC, target, range_form=range_form)
    except SubcError as e:
        assert "conflicting actions" in e.message, e.render()
        try:
            reference_decision(rules, SPEC, {**{f: 0 for f in FIELDS}, **e.example})
        except SubcError:
            return
        raise AssertionError("compiler reported a conflict that the reference does not see")
    sim = TableSimulator(entries_doc(res.pipeline, target))
    for pkt in boundary_packets(rules, FIELDS, data.draw):
        try:
            ref = reference_decision(rules, SPEC, pkt)
        except SubcError:
            raise AssertionError(f"reference sees a conflict on {pkt} that the compiler missed")
        got = sim.process(pkt)
        assert got == ref, f"{text}\npacket {pkt}: reference {ref}, tables {got}"
    # structural reductions: no two states of a stage with the same future, no dead entry
    for stage in res.ir.stages:
        sigs = [tuple(s.runs) for s in stage.states]
        assert len(sigs) == len(set(sigs)), "two states of one stage behave the same"
        for s in stage.states:
            assert all(lo <= hi for lo, hi, _ in s.runs)
    for t in res.pipeline.tables:
        assert all(e.match[0] != 0 for e in t.entries if t.keys[0].name.endswith("subc_state"))


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(rule_set(FIELDS), st.data())
def test_bmv2_tables_agree_with_reference(fields_text, data):
    check(fields_text, "bmv2", "auto", data)


@SETTINGS
@given(rule_set(FIELDS), st.data())
def test_tofino_tables_agree_with_reference(fields_text, data):
    check(fields_text, "tofino", "auto", data)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_set(FIELDS), st.data())
def test_interval_code_form_agrees_with_reference(fields_text, data):
    check(fields_text, "tofino", "code", data)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_set(FIELDS, allow_drop=True), st.data())
def test_conflicts_are_detected(fields_text, data):
    check(fields_text, "bmv2", "auto", data)
