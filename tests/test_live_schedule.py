"""Root switches scheduled at feed positions (:class:`~subc.dataplane.live_broker.LiveBroker` with a
schedule), without a kernel: a writer and a schedule that record what they are given, and the
kernel's rule (``bpf/subc_cluster.h``) written here from its definition: a datagram whose first
sequence number is ``s`` is classified with the root of the last scheduled switch at or before
``s``, else with the base root.

Hypothesis draws changes at non-decreasing positions (equal ones included: a later change at the
same position supersedes the earlier switch), the feed's progress between them, and a schedule of
small capacity (changes then wait, or force the oldest switch once the feed stalls).  At every step,
for every datagram position from the feed on, the root chosen must be the diagram root of the last
change at or before that position (or the base); reclaiming after every step releases roots oldest
first (the diagram refuses anything else), and at the end every slot is free again.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from subc.dataplane import live_broker as LB
from subc.dataplane.ebpf.schedule import Position
from subc.dataplane.live_broker import LiveBroker
from subc.ir.incremental import LiveDiagram
from subc.lang.rules import parse_rules
from subc.spec.front_end import load_spec

from conftest import EXAMPLE

SPEC = load_spec(EXAMPLE / "spec.p4")
ORDER = ["add_order.stock", "add_order.price"]
S = b"SESSION001"


class Writer:
    root_slots = 32

    def __init__(self):
        self.slot_root: dict[int, object] = {}
        self.base = 0

    def write(self, node):
        pass

    def clear(self, node):
        pass

    def flush(self):
        pass

    def write_root(self, slot, root, spans):
        self.slot_root[slot] = root

    def switch(self, slot):
        self.base = slot


class Schedule:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: list[tuple[Position, int]] = []
        self.feed: Position | None = None

    def write(self, entries):
        assert len(entries) <= self.capacity
        assert all(a[0].seq <= b[0].seq for a, b in zip(entries, entries[1:]))
        self.entries = list(entries)

    def position(self):
        return None if self.feed is None else (self.feed, 1)


def chosen(w: Writer, sched: Schedule, s: int) -> int:
    slot = w.base
    for p, sl in sched.entries:
        if p.session == S and s < p.seq:
            break
        slot = sl
    return slot


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.booleans()), min_size=1, max_size=25),
    st.integers(2, 4),
)
def test_scheduled_switches_take_effect_at_their_positions(steps, capacity):
    LB.FORCE_AFTER_S = 0.05  # a stalled feed forces the oldest switch soon (the test never waits long)
    diagram = LiveDiagram([SPEC.query_fields[f] for f in ORDER], [4000, 4000])
    w = Writer()
    sched = Schedule(capacity)
    broker = LiveBroker(diagram, w, lambda: None, sched)
    cond = parse_rules('add_order.stock == "AAPL" : fwd(0);', SPEC, "t")[0].condition
    region = diagram.region(cond)
    pos = 10
    feed = 10
    live_subs: set[int] = set()
    history: list[tuple[int, object]] = []  # (position, root) of every change, in order
    base_root = None
    for gap, advance_by, remove in steps:
        pos += gap
        sid = len(history) % 5
        op = -1 if (remove and sid in live_subs) else +1
        if op > 0 and sid in live_subs:
            op = -1
        ch = broker.apply([(region, sid, op)], at=Position(S, pos))
        (live_subs.discard if op < 0 else live_subs.add)(sid)
        if ch.changed:
            history.append((pos, ch.root))
        feed = min(pos + 1, feed + advance_by)
        sched.feed = Position(S, feed)
        broker.advance()
        forced = broker.forced
        # every datagram position from the feed on: the last change at or before it
        for s in range(feed, pos + 3):
            want = [r for p, r in history if p <= s]
            got = w.slot_root.get(chosen(w, sched, s))
            if forced == 0:
                if want:
                    assert got is want[-1], f"datagram {s}"
                else:
                    assert got is base_root
        broker.reclaim()
    sched.feed = Position(S, pos + 1)
    broker.advance()
    broker.reclaim()
    broker.reclaim()
    assert not broker.scheduled and not sched.entries
    assert len(broker.free_slots) == w.root_slots - 1  # the live slot alone is taken
