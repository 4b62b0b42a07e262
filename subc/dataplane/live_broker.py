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
request: a change waits only when every slot is still in its grace period.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from ..ir.incremental import Change, LiveDiagram, Node, merge_spans
from .writer import LiveWriter

MAX_DIRTY_SPANS = 512  # beyond, a root slot is rewritten whole


class LiveBroker:
    """The live diagram of a loaded data path (see the module docstring).  ``grace``: a function
    that returns once every program run that started before the call has ended."""

    def __init__(self, diagram: LiveDiagram, writer: LiveWriter, grace: Callable[[], None]):
        self.diagram, self.writer, self.grace = diagram, writer, grace
        self.lock = threading.Condition()
        self.free_slots = list(range(writer.root_slots, 0, -1))
        self.dirty: dict[int, list[tuple[int, int]] | None] = {s: None for s in self.free_slots}  # None: whole
        self.live_slot = 0
        self.live_root: Node | None = None
        self.retired: list[tuple[int, Node | None]] = []
        self.changes = 0
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

    def apply(self, ops: Sequence[tuple[Node, int, int]], force: bool = False) -> Change:
        """Apply ``ops`` ((region, subscriber, +1/-1)) and publish the result (steps 1-4); with
        ``force``, publish into a new slot even when nothing changed (a restarted daemon leaves
        the slot it inherited).  Raises :class:`~subc.ir.incremental.CapacityError` or
        SubcError (the data plane keeps the previous diagram) when the maps are full."""
        with self.lock:
            while not self.free_slots:
                self.lock.wait()
            ch = self.diagram.change(ops)
            if not ch.changed:
                if force:
                    self._publish(ch, owned=False)
                return ch
            try:
                for node in ch.new:
                    self.writer.write(node)
                self.writer.flush()
                self._publish(ch, owned=True)
            except BaseException:
                freed = self.diagram.revert(ch, ops)
                for node in freed:
                    self.writer.clear(node)  # nothing reaches them: no grace period needed
                self.writer.flush()
                self.diagram.recycle(freed)
                raise
            return ch

    def _publish(self, ch: Change, owned: bool) -> None:
        """Steps 3 and 4 for ``ch``'s root (``owned``: this slot holds the root's reference)."""
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
            self.writer.switch(slot)
        except BaseException:  # the root did not switch: the slot is free again, its content unknown here
            self.dirty[slot] = None
            self.free_slots.append(slot)
            raise
        self.dirty[slot] = []
        if self.live_root is not None or self._inherited is not None or self._unowned:
            self.retired.append((self.live_slot, self.live_root))
            self.lock.notify_all()
        self.live_slot, self.live_root = slot, (ch.root if owned else None)
        self._unowned = not owned
        self.changes += 1

    def reclaim(self) -> int:
        """Step 5 for every slot retired before the call: wait for a grace period, then free
        what only those slots reached.  Returns the nodes freed."""
        with self.lock:
            batch, self.retired = self.retired, []
        if not batch:
            return 0
        self.grace()
        freed_n = 0
        for slot, root in batch:  # oldest first; the lock is let go between roots for changes
            with self.lock:
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

    def free_slot_count(self) -> int:
        """Root slots free for the next changes (a glance without the lock: a hint)."""
        return len(self.free_slots)

    def pending(self) -> bool:
        """Whether retired slots wait for :meth:`reclaim`."""
        with self.lock:
            return bool(self.retired)
