"""Incremental slicing (subc/ir/incremental.py) against the rules and against a full compile.

Hypothesis draws subscriptions (conditions of every comparison kind with nested and/or/not, on
range, exact and lpm fields) and a sequence of additions and removals, applied in batches.  After
every batch:

* every message of a set of boundary and random ones gets, from the counting diagram and from
  the delivery diagram (what the data plane holds), exactly the subscribers of the live
  subscriptions whose conditions the AST evaluator (the reference semantics) accepts;
* the delivery diagram is the reduced sliced diagram of the live subscriptions compiled as rules
  ``condition : fwd(subscriber)`` by the batch slicer (:mod:`subc.ir.layered`): the same
  number of states per stage and of leaves;
* states are unique per level among the live nodes, and freed states come back once the roots
  that held them are released.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from strategies import boundary_packets, condition
from test_differential import FIELDS, SPEC

from subc.ir import lowering
from subc.ir.live_nodes import exact_miss, is_dead
from subc.lang.ast import evaluate
from subc.ir import root_runs
from subc.ir.incremental import CapacityError, LiveDiagram
from subc.ir.layered import slice_rules
from subc.lang.rules import parse_rules


def reachable(root):
    """Delivery nodes reachable from ``root``, per level (dead chain excluded)."""
    seen, stack = {}, [root]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen[id(n)] = n
        runs = tuple(n.runs)  # a root's runs are chunked (subc/ir/root_runs.py)
        if runs and isinstance(runs[0], tuple) and len(runs[0]) == 3 and hasattr(runs[0][2], "level"):
            stack.extend(r[2] for r in runs)
    return list(seen.values())


def walk(root, values, order):
    node = root
    for f in order:
        node = node.child(values[f])
    return node.runs


@st.composite
def scenario(draw):
    order = draw(st.permutations(sorted(FIELDS)).map(lambda p: p[: draw(st.integers(1, 4))]))
    qs = {f: FIELDS[f] for f in order}
    subs = draw(st.lists(st.tuples(condition(list(order), qs), st.integers(0, 5)), min_size=1, max_size=10))
    steps = draw(st.lists(st.tuples(st.booleans(), st.integers(0, 100), st.integers(1, 3)), min_size=1, max_size=12))
    return list(order), subs, steps


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenario(), st.data())
def test_incremental_equals_rules_and_full_slicing(sc, data):
    order, subs, steps = sc
    parsed = [parse_rules(f"{c} : fwd({sid});", SPEC, "sub")[0] for c, sid in subs]
    live = LiveDiagram([FIELDS[f] for f in order], capacity=[10_000] * len(order))
    live.SPLICE_MIN_RUNS = data.draw(st.sampled_from([0, 2, 64]))  # exercise the splicing path
    chunk = data.draw(st.sampled_from([1, 2, 64]))  # roots of many chunks, shared between versions
    saved, root_runs.CHUNK = root_runs.CHUNK, chunk
    try:
        run_scenario(live, order, subs, steps, parsed, data)
    finally:
        root_runs.CHUNK = saved


def run_scenario(live, order, subs, steps, parsed, data) -> None:
    regions = [live.region(r.condition) for r in parsed]
    active: list[int] = []  # indexes into parsed (a subscription may be live more than once)
    roots = []
    pkts = boundary_packets(parsed, FIELDS, data.draw)
    for add, pick, batch in steps:
        before = list(active)
        ops = []
        for k in range(batch):
            if add or not active:
                i = (pick + k) % len(parsed)
                active.append(i)
                ops.append((regions[i], parsed[i].actions[0].args[0], +1))
            else:
                i = active.pop((pick + k) % len(active))
                ops.append((regions[i], parsed[i].actions[0].args[0], -1))
        ch = live.change(ops)
        if ch.changed and data.draw(st.booleans(), label="revert"):
            # the data plane refused the change: the diagram goes back to the previous one
            live.recycle(live.revert(ch, ops))
            active[:] = before
            for p in pkts:
                want = tuple(sorted({parsed[i].actions[0].args[0] for i in active if evaluate(parsed[i].condition, p)}))
                assert live.deliver(p) == want
                assert walk(live.root.q, p, order) == want
            continue
        if ch.changed:
            roots.append(ch.root)
        for root in (ch.root, live.root):  # roots cover the first field's values, maximal runs
            rr = list(root.runs)
            assert rr[0][0] == 0 and rr[-1][1] == live.tops[0]
            assert all(a[1] + 1 == b[0] and a[2] is not b[2] for a, b in zip(rr, rr[1:]))
        for r in roots:  # nothing a live root reaches was freed
            assert not any(n.dead for n in reachable(r))
        for n in ch.new:
            assert n.state > 0
        # the root's miss target (the target of the most values), when derived from the previous
        # root's over the change's spans, is the one a count over every run gives
        derived = ch.root.miss is not None
        fresh = lowering.exact_miss(ch.root.runs, is_dead)
        assert exact_miss(ch.root) is fresh
        if ch.changed:
            event(f"root's miss target derived: {derived}")
        for p in pkts:
            want = tuple(sorted({parsed[i].actions[0].args[0] for i in active if evaluate(parsed[i].condition, p)}))
            assert live.deliver(p) == want, (p, want)
            assert walk(ch.root, p, order) == want, (p, want)
        # the full slicer's reduced diagram of the live subscriptions, state for state
        rules = [parsed[i] for i in active]
        nodes = [n for n in reachable(ch.root) if n.state or n.level == 0]
        got_leaves = {n.runs for n in nodes if n.level == len(order) and n.runs}
        if rules:
            sliced = slice_rules(rules, FIELDS, order)
            if sliced.root_state:
                want_states = [len(s.states) for s in sliced.stages]
                got_states = [sum(1 for n in nodes if n.level == lv) for lv in range(len(order))]
                assert got_states == want_states
                assert len(got_leaves) == len({lf.atoms for lf in sliced.leaves})
            else:
                assert not got_leaves
        states = [(n.level, n.state) for n in nodes if n.level > 0]
        assert len(states) == len(set(states))
        # roots older than the last two are released (their grace period is over)
        while len(roots) > 2:
            live.recycle(live.release_root(roots.pop(0)))
    for r in roots:
        live.recycle(live.release_root(r))
    used = live.states_used()
    alive = [sum(1 for n in reachable(live.root.q) if n.level == lv and n.state) for lv in range(1, len(order) + 1)]
    assert used == alive


def test_capacity_error_rolls_back():
    order = ["h.a", "h.b"]
    live = LiveDiagram([FIELDS[f] for f in order], capacity=[3, 3])
    conds = [parse_rules(f"h.a == {v} and h.b > {v} : fwd(1);", SPEC, "s")[0].condition for v in range(10)]
    held = [live.change([(live.region(conds[0]), 1, +1)]).root]  # (each change is a real one)
    before = live.states_used()
    try:
        for c in conds[1:]:
            held.append(live.change([(live.region(c), 1, +1)]).root)
        raise AssertionError("capacity never ran out")
    except CapacityError as e:
        assert "no free state" in e.message
    # the failed change left the diagram as it was: a message of the first condition still goes to 1
    assert live.deliver({"h.a": 0, "h.b": 5}) == (1,)
    assert live.states_used() >= before
