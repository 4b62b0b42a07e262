"""Live subscriptions in the kernel: incremental changes written into a loaded XDP program.

Hypothesis draws subscriptions over fields of every match kind (DIFF_SPEC of the eBPF tests: 2- to
64-bit fields at unaligned offsets) and a sequence of additions and removals; each batch is
applied by :class:`~subc.dataplane.live_broker.LiveBroker` (new nodes, a root slot rewritten in
place, the root switched, retired slots reclaimed after a grace period), then frames built with
scapy from values go through the XDP program with BPF_PROG_TEST_RUN.  The leaf each frame reaches
(its per-leaf counter) must hold, in the kernel's ``subc_leaf`` map, exactly the subscribers of
the live subscriptions whose conditions the AST evaluator accepts on those values.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebpf_util import DIFF_SPEC, fake_subscribers, need_root
from strategies import boundary_packets, condition
from ebpf_util import diff_frame

from subc.lang.ast import evaluate
from subc.ir.incremental import LiveDiagram
from subc.lang.rules import parse_rules
from subc.backends.ebpf import layout as L

QS = dict(DIFF_SPEC.query_fields)
ORDERS = [["m.c", "m.a", "ip.dstAddr", "m.g"], ["m.e", "m.f", "m.d", "m.b", "m.h"]]
_LOADED: dict = {}


def loaded(ix: int):
    """One loaded live program and its live broker per field order (each example ends with no
    subscription, so the next starts from an empty diagram in maps that have been used)."""
    from subc.backends.ebpf.program import live_program
    from subc.dataplane.ebpf.broker import LoadedFilter
    from subc.dataplane.ebpf.fanout import grace_waiter
    from subc.dataplane.ebpf.install import install_subscribers

    if ix not in _LOADED:
        doc, src, _ = live_program(DIFF_SPEC, ORDERS[ix])
        caps = {m.name: 8192 for m in doc.maps if m.role in ("state_info", "bounds", "exact", "lpm", "leaf",
                                                                     "leaf_sets", "leaf_counters")}
        lf = LoadedFilter.build(doc, src, None, min_caps=caps, max_endpoints=1)
        install_subscribers(lf.maps, fake_subscribers(range(0, 6)), 1)
        from subc.dataplane.live_broker import LiveBroker
        from subc.dataplane.ebpf.live_maps import LiveMaps

        stage_caps = [lf.caps[st.maps[0]] - 1 for st in lf.doc.stages[1:]] + [lf.caps["subc_leaf"] - 1]
        diagram = LiveDiagram([QS[f] for f in ORDERS[ix]], stage_caps)
        writer = LiveMaps(lf.maps, lf.doc.stages, lf.caps, 4)
        _LOADED[ix] = (lf, LiveBroker(diagram, writer, grace_waiter(lf.maps)))
    return _LOADED[ix]


def teardown_module():
    """Release the loaded programs (their map and program descriptors)."""
    for lf, _ in _LOADED.values():
        lf.close()
    _LOADED.clear()


def leaf_messages(lf, state: int) -> int:
    vals = lf.maps["subc_leaf_cnt"].lookup(L.U32.pack(v=state)) or []
    return sum(L.COUNTER.unpack(v)["messages"] for v in vals)


def leaf_subscribers(lf, state: int) -> tuple[int, ...]:
    words = L.LEAF.unpack(lf.maps["subc_leaf"].lookup(L.U32.pack(v=state)))["subs"]
    return tuple(i for i in range(L.MAX_SUBSCRIBERS) if words[i // 64] >> (i % 64) & 1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.integers(0, 1), st.data())
def test_live_changes_in_the_kernel_agree_with_the_rules(ix, data):
    need_root()
    from subc.dataplane.ebpf.bpf_objects import test_run

    lf, broker = loaded(ix)
    diagram = broker.diagram
    order = ORDERS[ix]
    qs = {f: QS[f] for f in order}
    subs = data.draw(st.lists(st.tuples(condition(order, qs), st.integers(0, 5)), min_size=1, max_size=8))
    parsed = [parse_rules(f"{c} : fwd({sid});", DIFF_SPEC, "sub")[0] for c, sid in subs]
    regions = [diagram.region(r.condition) for r in parsed]
    pkts = boundary_packets(parsed, QS, data.draw)[:20]
    active: list[int] = []  # the subscriptions applied (the diagram holds exactly these)
    try:
        steps = data.draw(st.lists(st.tuples(st.booleans(), st.integers(0, 50)), min_size=1, max_size=6))
        for add, pick in steps:
            if add or not active:
                i = pick % len(parsed)
                delta = +1
            else:
                i = active[pick % len(active)]
                delta = -1
            ops = [(regions[i], parsed[i].actions[0].args[0], delta)]
            if not broker.free_slot_count() or data.draw(st.booleans()):  # retired slots freed at any point
                broker.reclaim()
            ch = broker.apply(ops)
            if delta > 0:
                active.append(i)
            else:
                active.remove(i)
            for p in pkts:
                want = tuple(sorted({parsed[i].actions[0].args[0] for i in active if evaluate(parsed[i].condition, p)}))
                leaf = ch.root
                for f in order:
                    leaf = leaf.child(p[f])
                before = leaf_messages(lf, leaf.state)
                test_run(lf.program.xdp.fd, diff_frame(p))
                assert leaf_messages(lf, leaf.state) == before + 1, f"{p}: the frame did not reach leaf {leaf.state}"
                got = leaf_subscribers(lf, leaf.state) if leaf.state else ()
                assert got == want, f"{[s for s, _ in subs]}\n{p}: kernel leaf {leaf.state} {got}, rules {want}"
    finally:
        # tear down, however the example ended (hypothesis may stop one at a draw; the loaded
        # program and its diagram are shared by every example): every subscription removed,
        # every slot reclaimed, every state back
        for ops in ([(regions[i], parsed[i].actions[0].args[0], -1) for i in active], []):
            if not broker.free_slot_count():  # apply waits for a free slot: nothing else reclaims here
                broker.reclaim()
            broker.apply(ops)
        broker.reclaim()
    assert diagram.states_used() == [0] * len(order)
