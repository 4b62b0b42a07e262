"""BDD encoding and slicing: dependent predicates give no impossible path, states are minimal."""

from __future__ import annotations

from subc.ir.bdd import build_bdd, index_segments
from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.spec.front_end import parse_spec

SPEC = parse_spec(
    "@pragma query_field(h.price, 32)\n@pragma query_field(h.shares, 32)\n@pragma query_field_exact(h.sym, 16)\n",
    "s.p4",
)


def compile_text(text, **kw):
    return compile_rules(parse_rules(text, SPEC, "r.sub"), SPEC, **kw)


def test_implied_predicates_need_no_impossible_entry():
    res = compile_text("price > 100 : fwd(1);\nprice > 50 : fwd(2);\n")
    (stage,) = res.ir.stages
    (state,) = stage.states
    # three value ranges, no fourth for "price > 100 and not price > 50"
    assert list(state.runs) == [(0, 50, 0), (51, 100, 1), (101, 2**32 - 1, 2)]
    leaves = {leaf.state: leaf.atoms for leaf in res.ir.leaves}
    assert leaves == {1: {("fwd", 2)}, 2: {("fwd", 1), ("fwd", 2)}}


def test_contradiction_compiles_to_no_entries():
    res = compile_text("price > 10 and price < 5 : fwd(1);\n")
    assert res.pipeline.root_state == 0
    assert all(not t.entries for t in res.pipeline.tables)


def test_every_interval_code_is_a_real_value_range():
    rules = parse_rules("price > 10 and price < 20 or shares == 7 : fwd(1);\nprice >= 15 : fwd(2);\n", SPEC, "r.sub")
    rb = build_bdd(rules, SPEC.query_fields, ["h.price", "h.shares"])
    dom = rb.domains[0]
    segs = index_segments(rb.bdd, rb.root, dom)
    covered = [i for first, last, _ in segs for i in range(first, last + 1)]
    assert covered == list(range(dom.k))  # every index < k, none beyond: no code without a value
    assert [dom.interval(i) for i in range(dom.k)] == [(0, 10), (11, 14), (15, 19), (20, 2**32 - 1)]


def test_states_with_equal_futures_are_merged():
    # both symbols lead to the same future (fwd(1) when price > 5): one state, not two
    res = compile_text('sym == 1 and price > 5 : fwd(1);\nsym == 2 and price > 5 : fwd(1);\n',
                       field_order=["h.sym", "h.price"])
    sym_stage, price_stage = res.ir.stages
    assert sym_stage.n_next == 1 and len(price_stage.states) == 1


def test_adjacent_ranges_with_the_same_target_are_one_entry():
    res = compile_text("price < 10 : fwd(1);\nprice >= 10 and price < 20 : fwd(1);\nprice > 30 : fwd(2);\n")
    (state,) = res.ir.stages[0].states
    assert [(lo, hi) for lo, hi, t in state.runs if t] == [(0, 19), (31, 2**32 - 1)]


def test_field_order_heuristic_minimises_entries():
    text = 'sym == 1 and price > 5 : fwd(1);\nsym == 2 and price > 7 : fwd(2);\nsym == 3 : fwd(3);\n'
    best = compile_text(text)
    for order in (["h.sym", "h.price"], ["h.price", "h.sym"]):
        assert best.pipeline.total_entries <= compile_text(text, field_order=order).pipeline.total_entries
