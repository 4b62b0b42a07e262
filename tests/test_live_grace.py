"""Grace periods of live updates (subc/dataplane/live_broker.py): a root slot is rewritten only
after a grace period has passed since the data plane was switched away from it; with a time-based
grace (a P4Runtime switch), each retired slot waits out its own time from its own switch, not the
time of slots retired after it.  The same holds for the refreshes of free root slots ahead of time
(:meth:`LiveBroker.refresh`), which never touch the live slot.  A fake clock: the verdicts do not
depend on the machine's speed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from subc.dataplane.live_broker import LiveBroker
from subc.ir.incremental import LiveDiagram
from subc.lang.rules import parse_rules
from subc.spec.front_end import load_spec

from conftest import EXAMPLE

SPEC = load_spec(EXAMPLE / "spec.p4")
ORDER = ["add_order.stock", "add_order.price"]


class Clock:
    """Seconds that move only when told to (``advance``) or slept through."""

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s > 0
        self.sleeps.append(s)
        self.now += s


class Writer:
    """Records when each root slot was written and when the data plane switched to each."""

    def __init__(self, clock: Clock, root_slots: int):
        self.clock, self.root_slots = clock, root_slots
        self.base = 0
        self.switched_away: dict[int, float] = {}  # slot -> when the data plane last left it
        self.rewrites: list[tuple[int, float, float | None]] = []  # (slot, when, when it was left)
        self.cleared = 0
        self.behind: dict[int, int] = {}  # slot -> writes a refresh still has to make (100 at first)
        self.refreshes = 0

    def write(self, node):
        pass

    def clear(self, node):
        self.cleared += 1

    def flush(self):
        pass

    def write_root(self, slot, root, spans):
        self.rewrites.append((slot, self.clock(), self.switched_away.get(slot)))
        self.behind[slot] = 0

    def refresh_root(self, slot, root, limit):
        assert slot != self.base, "a refresh of the live root slot"
        n = min(limit, self.behind.setdefault(slot, 100))
        if n:
            self.rewrites.append((slot, self.clock(), self.switched_away.get(slot)))
            self.behind[slot] -= n
            self.refreshes += 1
        return n

    def switch(self, slot):
        self.switched_away[self.base] = self.clock()
        self.base = slot


def wide(b: LiveBroker):
    """A region over 40 symbols: a root with it has more level-0 runs than REFRESH_SPANS, so a
    free slot of unknown content is stale."""
    cond = " or ".join(f'add_order.stock == "S{k:02d}"' for k in range(40))
    return b.diagram.region(parse_rules(f"{cond} : fwd(1);", SPEC, "t")[0].condition)


def broker(root_slots: int, grace_s: float | None, clock: Clock, graces: list[float]):
    diagram = LiveDiagram([SPEC.query_fields[f] for f in ORDER], [4000, 4000])
    w = Writer(clock, root_slots)
    b = LiveBroker(diagram, w, lambda: graces.append(clock()), grace_s=grace_s, clock=clock, sleep=clock.sleep)
    cond = parse_rules('add_order.stock == "AAPL" : fwd(0);', SPEC, "t")[0].condition
    return b, w, diagram.region(cond)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 0.08), st.booleans(), st.integers(0, 3)), min_size=1, max_size=30),
    st.integers(2, 6),
    st.sampled_from([0.01, 0.05]),
)
def test_a_slot_is_rewritten_only_after_its_own_grace(steps, root_slots, grace_s):
    clock, graces = Clock(), []
    b, w, region = broker(root_slots, grace_s, clock, graces)
    b.stale_wait_s = 0.0  # no reclaimer thread here: a change takes a stale slot at once
    live = False
    for gap, reclaim, refreshes in steps:
        clock.now += gap
        if not b.free_slots:  # every slot in its grace period: the reclaimer frees the oldest
            b.reclaim()
        b.apply([(region, 0, -1 if live else +1)])
        live = not live
        if reclaim:
            b.reclaim()
        clock.now += gap / 2
        for _ in range(refreshes):  # the reclaimer's refreshes of stale free slots, 40 writes each
            b.refresh(40)
    for slot, when, left in w.rewrites:
        if left is not None:  # a slot the data plane used before: its grace period has passed
            assert when - left >= grace_s - 1e-9, (slot, when, left)
    assert graces == []  # a time-based grace never needed the signal


def test_each_slot_waits_for_its_own_time_not_the_batch_s():
    clock, graces = Clock(), []
    b, w, region = broker(4, 0.05, clock, graces)
    b.apply([(region, 0, +1)])  # slot 1 live
    clock.now = 1.0
    b.apply([(region, 0, -1)])  # slot 2 live, slot 1 retired at 1.0
    clock.now = 1.04
    b.apply([(region, 0, +1)])  # slot 3 live, slot 2 retired at 1.04
    clock.now = 1.045
    assert len(b.retired) == 2
    b.reclaim()
    # the first slot was freed at 1.05 (after 5 ms), the second at 1.09: one sleep each, to its own deadline
    assert [round(s, 6) for s in clock.sleeps] == [0.005, 0.04]
    assert sorted(b.free_slots) == [1, 2, 4]


def test_a_signalled_grace_covers_the_batch_once():
    clock, graces = Clock(), []
    b, w, region = broker(4, None, clock, graces)
    for k in range(4):
        clock.now += 0.01
        b.apply([(region, 0, +1 if k % 2 == 0 else -1)])
    assert len(b.retired) == 3
    b.reclaim()
    assert len(graces) == 1 and clock.sleeps == []  # one wait for the three slots, no sleeping
    assert len(b.free_slots) == 3


def test_refreshes_bring_every_stale_free_slot_up_to_the_live_root_then_stop():
    clock, graces = Clock(), []
    b, w, region = broker(6, 0.05, clock, graces)
    b.apply([(wide(b), 1, +1)])  # slot 1 live, a root of 80 runs; slots 2..6 never written: stale
    assert b.refresh(40) == 0  # right after a change: more may follow
    assert b.stale_slot_count() == 5
    clock.now += 0.01
    made, stale = [], []
    while n := b.refresh(40):
        made.append(n)
        stale.append(b.stale_slot_count())
    assert made == [40, 40, 20] * 5  # 100 writes each, 40 at a time, the next slot a change takes first
    assert stale == [5, 5, 4, 4, 4, 3, 3, 3, 2, 2, 2, 1, 1, 1, 0]  # a slot is stale until its last write
    assert b.refresh_writes == 500 and all(b.dirty[s] == [] for s in b.free_slots)
    assert b.refresh(40) == 0


def test_a_writer_that_does_not_refresh_is_left_alone():
    clock, graces = Clock(), []
    b, w, region = broker(4, 0.05, clock, graces)
    w.refresh_root = lambda slot, root, limit: None
    b.apply([(region, 0, +1)])
    clock.now += 0.01
    assert b.refresh(40) == 0 and b.refresh_writes == 0


def test_a_change_waits_for_a_retired_slot_rather_than_take_a_stale_one():
    """With a time-based grace, a change whose free slots are all stale (never written, here)
    waits for the slot it retired (current then) to come back from its grace period, and takes
    it; with no reclaimer to free it, it takes a stale one after ``stale_wait_s``."""
    import threading

    clock, graces = Clock(), []
    b, w, region = broker(4, 0.05, clock, graces)
    b.apply([(wide(b), 1, +1), (region, 0, +1)])  # slot 1 live: the first change takes a stale slot, none can come back
    assert b.stale_waits == 0 and b.live_slot == 1
    clock.now += 0.01
    b.apply([(region, 0, -1)])  # every free slot stale and nothing retired: slot 2 at once
    assert b.stale_waits == 0 and b.live_slot == 2 and b.coming_back == 1
    clock.now += 0.01
    b.stale_wait_s = 600.0  # the verdict must not depend on speed: the change waits for the reclaimer
    w.behind.update({3: 10**9, 4: 10**9})  # slots the waiting change's refreshes never bring up
    done = threading.Event()
    t = threading.Thread(target=lambda: (b.apply([(region, 0, +1)]), done.set()))
    t.start()
    while not b.stale_waits and not done.is_set():  # the change waits (letting the lock go) or is done
        t.join(0.001)
    assert not done.is_set() and b.live_slot == 2, "took a stale slot without waiting"
    while not w.refreshes:  # the wait refreshes the stale slot next in line, 8 entries at a time
        t.join(0.001)
    b.reclaim()  # slot 1's grace passes (the fake clock sleeps through it) and it comes back
    t.join()
    assert b.live_slot == 1 and b.coming_back == 1 and sorted(b.free_slots) == [3, 4]
    b.stale_wait_s = 0.0  # no reclaimer now: the next change takes a stale slot at once
    clock.now += 0.01
    b.apply([(region, 0, -1)])
    assert b.live_slot in (3, 4) and b.stale_waits == 1


def test_a_change_takes_a_current_free_slot_before_a_stale_one():
    """Free slots in any order (a slot whose write failed comes back last, its content unknown):
    with a time-based grace the change takes a current one, not the stale slot at the end."""
    clock, graces = Clock(), []
    b, w, region = broker(4, 0.05, clock, graces)
    b.stale_wait_s = 0.0
    b.apply([(wide(b), 1, +1), (region, 0, +1)])  # slot 1
    clock.now += 0.01
    b.apply([(region, 0, -1)])  # slot 2; slot 1 retired
    clock.now += 0.1
    b.reclaim()
    assert sorted(b.free_slots) == [1, 3, 4] and b.dirty[1] is not None and b.dirty[3] is None and b.dirty[4] is None
    b.free_slots = [1, 4, 3]  # the stale ones last
    b.apply([(region, 0, +1)])
    assert b.live_slot == 1


def test_a_slot_of_unknown_content_is_not_stale_while_the_root_is_small():
    """Rewriting a never-written slot whole costs the root's few runs: a change takes it rather
    than wait for a retired slot."""
    clock, graces = Clock(), []
    b, w, region = broker(4, 0.05, clock, graces)
    b.stale_wait_s = 0.2
    b.apply([(region, 0, +1)])  # slot 1: a root of a few runs
    clock.now += 0.01
    b.apply([(region, 0, -1)])  # slots 2-4 never written, slot 1 retired: no wait
    assert b.stale_waits == 0 and b.live_slot == 2 and b.stale_slot_count() == 0


def test_a_waiting_change_takes_the_slot_its_refreshes_brought_up():
    """With no reclaimer, a change waiting for a retired slot refreshes the stale slot next in line
    (8 entries at a time) and takes it once current."""
    clock, graces = Clock(), []
    b, w, region = broker(4, 0.05, clock, graces)
    b.apply([(wide(b), 1, +1), (region, 0, +1)])  # slot 1
    clock.now += 0.01
    b.apply([(region, 0, -1)])  # slot 2 (stale, nothing retired yet); slot 1 retired
    b.stale_wait_s = 600.0
    w.behind.update({3: 20, 4: 10**9})
    b.free_slots = [4, 3]
    clock.now += 0.01
    b.apply([(region, 0, +1)])
    assert b.live_slot == 3 and b.stale_waits == 1 and b.refresh_writes == 20 and w.refreshes == 3
