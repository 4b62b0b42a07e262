"""The update planner (subc.dataplane.p4rt.plan) on its own: cases the step-by-step tests of
tests/test_p4rt_update.py reach only by chance.

* An update after a rule set that matches nothing (its root is the dead state, which has no
  entries to keep aside as the next spare root).
"""

from __future__ import annotations

from subc.backends.p4.entries import entries_doc
from subc.backends.p4.state_index import DEAD, StateIndex
from subc.compiler.driver import compile_rules
from subc.dataplane.p4rt.compare import compare
from subc.dataplane.p4rt.plan import plan_update, with_spare_root
from subc.lang.rules import parse_rules

from test_differential import SPEC


def _doc(text: str, fields: list[str]):
    return entries_doc(
        compile_rules(parse_rules(text, SPEC, "r.sub"), SPEC, "bmv2", field_order=fields).pipeline, "bmv2"
    )


def test_an_update_after_a_rule_set_that_matches_nothing():
    fields = ["h.d", "h.a"]
    docs = [_doc(t, fields) for t in ("h.d == 0 : fwd(1);", "(h.d == 0 and h.d == 1) : fwd(1);", "h.d == 0 : fwd(1);")]
    held = StateIndex.from_doc(with_spare_root(docs[0]))
    roots = []
    for doc in docs[1:]:
        plan = plan_update(held, doc)
        assert compare(plan.doc, doc) == []
        assert plan.held is not None
        held = plan.held
        roots.append(plan.root)
    assert roots[0] == DEAD and roots[1] not in (None, DEAD)
