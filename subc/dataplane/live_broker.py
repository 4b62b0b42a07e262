"""Atomic, incremental updates of a loaded data path: the live diagram, its root slots and grace periods.

:class:`LiveBroker` ties the incremental diagram (:mod:`subc.ir.incremental`) to a data plane's
live writer (:class:`~.writer.LiveWriter`: the BPF maps or a P4Runtime switch).  One change (a
batch of subscription additions and removals):

1. the diagram derives its new delivery nodes (persistent: written next to the live ones);
2. their entries are written, children before parents;
3. a free root slot is rewritten where it differs from what it held (the level-0 spans changed
   by every change since that slot was last written);
4. ``subc_root`` is switched to the slot (one 4-byte write): from the next datagram on, the
   data plane classifies with the new diagram, and every datagram with exactly one diagram;
5. the previous slot is *retired*: once a grace period has passed (every XDP and TC program run
   that could have read the old root has ended: :func:`~.bpf.synchronize_programs`), the nodes
   that only it reached are freed, their entries deleted and their states reused, and the slot
   becomes free again.

Step 5 runs in :meth:`LiveBroker.reclaim` (the daemon's grace thread), off the path of a
request: a change waits only when every slot is still in its grace period.  The same thread
refreshes free root slots ahead of time where root writes are slow (:meth:`LiveBroker.refresh`,
a P4Runtime switch): a slot left unused while the diagram grew, then taken when changes come
faster, would otherwise be rewritten whole on the path of the change that takes it; and with a
time-based grace (below) a change does not take a slot it would rewrite whole (content unknown,
a large root) while a slot retired current comes back within its grace: it waits for that one (at
most :data:`STALE_WAIT_S` past the grace), the cheaper of the two by far at thousands of root
entries, and spends the wait refreshing the stale slot next in line.  A grace period is
either a wait for every program run that started before it (the BPF maps: one wait covers every
slot retired before it) or, where the data plane gives no such signal (a P4Runtime switch), a
time (``grace_s``): then each slot has its own, from the moment it was switched away from, and
comes back as soon as its own time has passed, not after the others retired with it.

A change may instead take effect at a feed position (a broker of a cluster, with a
:class:`Schedule`: ``subc_sched``, :mod:`.ebpf.schedule`): step 4 then schedules the switch to the
slot at that position, and :meth:`LiveBroker.advance` (called often by the grace thread while
switches are scheduled) makes the last switch the feed has reached the base root and retires the
slots before it.  A change scheduled at the position of the last scheduled switch replaces it in
the data plane's schedule; its slot is retired with the others once the position is reached
(roots are released oldest first).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol, Sequence

from ..errors import SubcError
from ..ir.incremental import Change, LiveDiagram, Node, merge_spans
from .writer import LiveWriter

MAX_DIRTY_SPANS = 512  # beyond, a root slot is rewritten whole
#: a free root slot more level-0 spans behind the live root than this (or of unknown content) is
#: refreshed ahead of time by writers that refresh (:meth:`LiveBroker.refresh`)
REFRESH_SPANS = 32
#: seconds without a change before free root slots are refreshed (changes in a burst make the
#: free slots stale again at once: refreshing them then only competes with the changes)
REFRESH_IDLE_S = 0.004
#: seconds past ``grace_s`` a change waits for a retired slot to come back instead of taking a
#: stale free one (the reclaimer may linger or be busy freeing another root)
STALE_WAIT_S = 0.025
#: entries per refresh of a stale free root slot, by the reclaimer or by a change waiting for a
#: retired slot (times the message slots' tables: a change waits for these)
REFRESH_WRITES = 8
FORCE_AFTER_S = 5.0  # a change that finds the schedule full this long switches the oldest entry at once


class Schedule(Protocol):
    """Root switches at feed positions (:class:`.ebpf.schedule.FeedSchedule`): ``capacity``
    entries at most, ``write`` replaces them ((position, slot), in order), ``position`` is the
    feed's (a position and when it was seen, or None)."""

    capacity: int

    def write(self, entries: list) -> None:
        """Replace the scheduled switches with ``entries`` ((position, slot), in order)."""
        ...

    def position(self):
        """The feed's position and when it was seen (ns), or None."""
        ...


class LiveBroker:
    """The live diagram of a loaded data path (see the module docstring).  ``grace``: a function
    that returns once every program run that started before the call has ended; ``grace_s``
    instead, for a data plane that gives no such signal: seconds after a root switch until no
    packet can still be classified with the old root (each retired slot then waits out its own
    time; ``grace`` still serves callers of :meth:`grace` from outside).  ``clock`` (seconds) and
    ``sleep`` measure and wait out that time."""

    def __init__(
        self,
        diagram: LiveDiagram,
        writer: LiveWriter,
        grace: Callable[[], None],
        schedule: Schedule | None = None,
        grace_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.diagram, self.writer, self.grace, self.schedule = diagram, writer, grace, schedule
        self.grace_s, self.clock, self.sleep = grace_s, clock, sleep
        self.scheduled: list[tuple] = []  # (position, slot, root, superseded) switches not yet reached, in order
        self.forced = 0  # scheduled switches made before the feed reached them (the schedule was full)
        self.lock = threading.Condition()
        self.free_slots = list(range(writer.root_slots, 0, -1))
        self.dirty: dict[int, list[tuple[int, int]] | None] = {s: None for s in self.free_slots}  # None: whole
        self.live_slot = 0
        self.live_root: Node | None = None
        self.retired: list[tuple[int, Node | None, float]] = []  # (slot, root, monotonic s switched away)
        self.coming_back = 0  # retired slots not yet free again (in retired, or in reclaim's hands)
        self.stale_waits = 0  # changes that waited for a retired slot rather than take a stale one
        #: real seconds a change waits for a retired slot instead of taking a stale free one
        self.stale_wait_s = (grace_s or 0.0) + STALE_WAIT_S
        self.changes = 0
        self.refresh_writes = 0  # writes made by refresh()
        self.last_change = float("-inf")  # clock() of the last change published
        self.refresh_failures = 0  # refreshes the data plane refused (the slot is rewritten by its change)
        self._inherited: Callable[[], None] | None = None
        self._unowned = False  # the live slot holds a root no slot owns (published by force)

    def adopt(self, live_slot: int, release: Callable[[], None]) -> None:
        """Start from a root slot a previous writer left live (a restarted daemon): it stays in
        use until the first change switches away from it; after that change's grace period
        ``release()`` frees what it reached (:meth:`.ebpf.live_maps.LiveMaps.release_inherited`)."""
        with self.lock:
            self.live_slot = self._inherited_slot = live_slot
            if live_slot in self.free_slots:
                self.free_slots.remove(live_slot)
            self._inherited = release

    def apply(self, ops: Sequence[tuple[Node, int, int]], force: bool = False, at=None) -> Change:
        """Apply ``ops`` ((region, subscriber, +1/-1)) and publish the result (steps 1-4); with
        ``force``, publish into a new slot even when nothing changed (a restarted daemon leaves
        the slot it inherited); with ``at`` (a feed position, and a schedule), the switch takes
        effect there.  Raises :class:`~subc.ir.incremental.CapacityError` or SubcError (the data
        plane keeps the previous diagram) when the maps are full."""
        if at is not None and self.schedule is None:
            at = None
        with self.lock:
            waited = time.monotonic()
            counted = False
            while True:
                if not self.free_slots or (at is not None and self._schedule_full(at)):
                    self.lock.wait(timeout=0.01 if self.scheduled else None)
                    if self.scheduled and time.monotonic() - waited > FORCE_AFTER_S:
                        self._advance_locked(force_one=True)
                elif self._only_stale() and time.monotonic() - waited < self.stale_wait_s:
                    # the wait refreshes the slot a change would take next, a little at a time
                    # (the lock let go between), so that under steady changes, with no pause for
                    # the reclaimer's refreshes, stale slots still come up
                    self.stale_waits += not counted
                    counted = True
                    self.lock.wait(timeout=0.001 if self._refresh_locked(REFRESH_WRITES) else 0.005)
                else:
                    break
            ch = self.diagram.change(ops)
            if not ch.changed:
                if force:
                    self._publish(ch, owned=False)
                return ch
            try:
                for node in ch.new:
                    self.writer.write(node)
                self.writer.flush()
                self._publish(ch, owned=True, at=at)
            except BaseException:
                freed = self.diagram.revert(ch, ops)
                for node in freed:
                    self.writer.clear(node)  # nothing reaches them: no grace period needed
                self.writer.flush()
                self.diagram.recycle(freed)
                raise
            return ch

    def _stale(self, slot: int) -> bool:
        """Whether free ``slot`` is far behind the live root: more than :data:`REFRESH_SPANS`
        level-0 spans changed since it was written, or its content unknown and the live root more
        than that many runs (unknown, when no root is owned)."""
        d = self.dirty.get(slot)
        return len(d) > REFRESH_SPANS if d is not None else self._whole(slot)

    def _whole(self, slot: int) -> bool:
        """Whether a change that takes free ``slot`` would rewrite it whole: its content unknown
        (never written, a failed write, too many changes behind) and the live root more than
        :data:`REFRESH_SPANS` runs.  (A slot only some changes behind costs what those changes
        touched, which every slot of a burst of changes pays alike.)"""
        if self.dirty.get(slot) is not None:
            return False
        root = self.live_root
        return root is None or len(root.runs) > REFRESH_SPANS

    def _only_stale(self) -> bool:
        """With a time-based grace: every free slot would be rewritten whole (:meth:`_whole`)
        while a retired slot, current when it was retired, will come back."""
        return self.grace_s is not None and self.coming_back > 0 and all(self._whole(s) for s in self.free_slots)

    def _schedule_full(self, at) -> bool:
        assert self.schedule is not None
        live = [e for e in self.scheduled if not e[3]]
        return len(live) >= self.schedule.capacity and live[-1][0] != at

    def _write_schedule(self, entries: list[tuple]) -> None:
        assert self.schedule is not None
        self.schedule.write([(p, s) for p, s, _, superseded in entries if not superseded])

    def _publish(self, ch: Change, owned: bool, at=None) -> None:
        """Steps 3 and 4 for ``ch``'s root (``owned``: this slot holds the root's reference), the
        switch scheduled at ``at`` when given."""
        if self.grace_s is not None and self._whole(self.free_slots[-1]):
            fresh = [s for s in self.free_slots if not self._whole(s)]
            if fresh:  # the last slot one of known content: LIFO among those
                self.free_slots.remove(fresh[-1])
                self.free_slots.append(fresh[-1])
        slot = self.free_slots.pop()
        for s, dirty in self.dirty.items():
            if s != slot and dirty is not None:
                dirty.extend(ch.spans)
                if len(dirty) > MAX_DIRTY_SPANS:
                    merged = merge_spans(dirty)
                    self.dirty[s] = merged if len(merged) <= MAX_DIRTY_SPANS else None
        spans = self.dirty[slot]
        if spans is not None:
            spans = merge_spans(spans + ch.spans)
        try:
            self.writer.write_root(slot, ch.root, spans)
            if at is not None:
                self.writer.flush()  # the slot's entries are in the maps before any datagram can reach them
                self._schedule_switch(at, slot, ch.root if owned else None)
                self.dirty[slot] = []
                self.changes += 1
                return
            self.writer.switch(slot)
        except BaseException:  # the root did not switch: the slot is free again, its content unknown here
            self.dirty[slot] = None
            self.free_slots.append(slot)
            raise
        self.dirty[slot] = []
        if self.live_root is not None or self._inherited is not None or self._unowned:
            self.retired.append((self.live_slot, self.live_root, self.clock()))
            self.coming_back += 1
            self.lock.notify_all()
        self.live_slot, self.live_root = slot, (ch.root if owned else None)
        self._unowned = not owned
        self.changes += 1
        self.last_change = self.clock()

    def _schedule_switch(self, at, slot: int, root: Node | None) -> None:
        """Schedule the switch to ``slot`` (holding ``root``) at position ``at`` (not before the
        last scheduled one); one at the last one's position replaces it."""
        entries = list(self.scheduled)
        if entries and entries[-1][0] == at:  # superseded: out of the data plane's schedule
            p, s, r, _ = entries.pop()
            entries.append((p, s, r, True))
        entries.append((at, slot, root, False))
        self._write_schedule(entries)
        self.scheduled = entries

    def advance(self) -> bool:
        """Make the last scheduled switch the feed has reached the base root (``subc_root``),
        drop the reached ones from the schedule and retire the slots they replace.  True when
        something was reached."""
        if not self.scheduled or self.schedule is None:
            return False
        with self.lock:
            return self._advance_locked()

    def _advance_locked(self, force_one: bool = False) -> bool:
        assert self.schedule is not None
        pos = self.schedule.position()
        feed = pos[0] if pos is not None else None
        n = 0
        while n < len(self.scheduled) and self.scheduled[n][0].passed_by(feed):
            n += 1
        if not n and force_one and self.scheduled:
            n = 1
            self.forced += 1
        if not n:
            return False
        passed, rest = self.scheduled[:n], self.scheduled[n:]
        _, slot, root, _ = passed[-1]
        self.writer.switch(slot)  # the schedule still holds it (or its successor): no datagram sees an older root
        self._write_schedule(rest)
        self.scheduled = rest
        now = self.clock()
        if self.live_root is not None or self._inherited is not None or self._unowned:
            self.retired.append((self.live_slot, self.live_root, now))
            self.coming_back += 1
        self.retired += [(s, r, now) for _, s, r, _ in passed[:-1]]
        self.coming_back += len(passed) - 1
        self.live_slot, self.live_root = slot, root
        self._unowned = root is None
        self.lock.notify_all()
        return True

    def reclaim(self) -> int:
        """Step 5 for every slot retired before the call: wait for a grace period, then free
        what only those slots reached, oldest first (with ``grace_s``: each slot once its own
        time since it was switched away from has passed).  Returns the nodes freed."""
        with self.lock:
            batch, self.retired = self.retired, []
        if not batch:
            return 0
        if self.grace_s is None:
            self.grace()  # covers every slot of the batch: each was retired before the call
        freed_n = 0
        for slot, root, retired_at in batch:  # oldest first; the lock is let go between roots for changes
            if self.grace_s is not None:
                left = retired_at + self.grace_s - self.clock()
                if left > 0:
                    self.sleep(left)
            with self.lock:
                self.coming_back -= 1
                if root is None:  # the slot a previous writer left live, or a root published by force
                    if self._inherited is not None and slot == self._inherited_slot:
                        self._inherited()
                        self._inherited = None
                    if slot:
                        self.free_slots.append(slot)
                else:
                    freed = self.diagram.release_root(root)
                    for node in freed:
                        self.writer.clear(node)
                    self.writer.flush()
                    self.diagram.recycle(freed)
                    freed_n += len(freed)
                    self.free_slots.append(slot)
                self.lock.notify_all()
        return freed_n

    def refresh(self, limit: int) -> int:
        """Bring the stale free root slot that a change takes first (:meth:`_stale`) closer to the live root,
        once no change was published for :data:`REFRESH_IDLE_S`:
        at most ``limit`` writes, flushed under the lock (a change waits for those at most).  A
        free slot is not live and no packet reads it (:meth:`reclaim` frees a slot only after its
        grace period), and the change that takes it rewrites it by difference with what it holds.
        Returns the writes made: 0 when no slot is stale, the writer does not refresh
        (:meth:`~.writer.LiveWriter.refresh_root`), or the data plane refused the writes
        (counted in ``refresh_failures``; the writer then holds what it held)."""
        with self.lock:
            if self.clock() - self.last_change < REFRESH_IDLE_S:
                return 0
            return self._refresh_locked(limit)

    def _refresh_locked(self, limit: int) -> int:
        """:meth:`refresh`'s writes, the lock held, whenever it is called."""
        root = self.live_root
        if root is None:
            return 0
        for slot in reversed(self.free_slots):  # the next slot a change takes is the last
            if not self._stale(slot):
                continue
            n = self.writer.refresh_root(slot, root, limit)
            if n is None:
                return 0
            if n == 0:
                self.dirty[slot] = []
                continue
            try:
                self.writer.flush()
            except SubcError:
                self.refresh_failures += 1
                return 0
            self.refresh_writes += n
            self.dirty[slot] = None if n >= limit else []
            return n
        return 0

    def free_slot_count(self) -> int:
        """Root slots free for the next changes (a glance without the lock: a hint)."""
        return len(self.free_slots)

    def stale_slot_count(self) -> int:
        """Free root slots that :meth:`refresh` would still bring up (far behind the live root:
        :meth:`_stale`): a change that takes one rewrites much of it on its own path.  A glance
        without the lock (a hint, for metrics)."""
        return sum(1 for s in list(self.free_slots) if self._stale(s))

    def pending(self) -> bool:
        """Whether retired slots wait for :meth:`reclaim`."""
        with self.lock:
            return bool(self.retired)
