"""The example of Figures 3 and 4 of Jepsen et al., "Packet Subscriptions for Programmable ASICs".

Rules reconstructed from the tables of Figure 4: the shares table has 3 entries, the stock table
4 and the leaf table 4 (a default action counts as an entry), with one multicast group for
ports 1 and 2.  subc's last stage applies the leaf actions itself, so the stock table keeps its 4
entries and the leaf table's 4 are not needed.
"""

from __future__ import annotations

import pytest

from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.backends.p4.entries import entries_doc
from subc.semantics.reference import reference_decision
from subc.sim.switch import TableSimulator

RULES = """
shares < 60 and stock == "AAPL" : fwd(3);
shares > 100 and stock == "MSFT" : fwd(2);
shares > 100 : fwd(1);
"""


def sym(s: str) -> int:
    return int.from_bytes(s.encode().ljust(8), "big")


@pytest.mark.parametrize("target", ["bmv2", "tofino"])
def test_figure4_entry_counts(example_spec, target):
    res = compile_rules(parse_rules(RULES, example_spec, "fig4.sub"), example_spec, target)
    pipe = res.pipeline
    assert pipe.field_order == ["add_order.shares", "add_order.stock"]
    per_field = {}
    for t in pipe.tables:
        per_field[t.field] = per_field.get(t.field, 0) + t.entry_count
    assert per_field == {"add_order.shares": 3, "add_order.stock": 4}
    stock_actions = {e.action for t in pipe.tables if t.field == "add_order.stock" for e in t.entries}
    assert stock_actions == {"subc_fwd", "subc_mcast"}
    assert pipe.mcast_groups == {1: (1, 2)}
    assert pipe.table("subc_add_order_shares").keys[1].match_kind == "range"
    assert pipe.table("subc_add_order_stock").keys[1].match_kind == "exact"
    assert len(res.ir.leaves) == 3


def test_figure4_forwarding(example_spec):
    rules = parse_rules(RULES, example_spec, "fig4.sub")
    res = compile_rules(rules, example_spec, "bmv2")
    sim = TableSimulator(entries_doc(res.pipeline, "bmv2"))
    cases = {
        (59, "AAPL"): (3,), (60, "AAPL"): (), (101, "MSFT"): (1, 2), (100, "MSFT"): (),
        (101, "AAPL"): (1,), (5, "MSFT"): (), (1000, "GOOGL"): (1,),
    }
    for (shares, stock), ports in cases.items():
        pkt = {"add_order.shares": shares, "add_order.stock": sym(stock)}
        got = sim.process(pkt)
        assert got == reference_decision(rules, example_spec, pkt)
        assert got.ports == ports
        if not ports:
            assert got.action == ("drop",)


def test_forced_field_order(example_spec):
    rules = parse_rules(RULES, example_spec, "fig4.sub")
    res = compile_rules(rules, example_spec, "bmv2", field_order=["stock", "shares"])
    assert res.pipeline.field_order == ["add_order.stock", "add_order.shares"]
    assert res.orders_tried == 1
