"""A model of a target's registers for comparisons on state, read from ``entries.json`` alone.

The table simulator (:mod:`.simulator`) runs it between the update table and the first
state-value stage, as the generated programs do (docs/state.md "Stateful subscriptions"): an aggregate
instance of the document's ``state`` section holds the window of its last update; a classified
message updates the instances whose bit its update mask has (emptying one whose window id is not
the message's first), then the state values are written to the metadata the stages match, read
as an empty window's (0 for every kind) when an instance's window is not the message's:

* ``count``: the count; ``sum``: the sum, saturating at 2**64 - 1;
* ``min``/``max``: 0 for an empty window, else the extreme + 1;
* ``avg`` against threshold X: the *excess* ``sum(v - X)`` kept per threshold (no division), as
  0 for an empty window, 1 below (excess < 0), 2 equal, 3 above;
* ``counter`` (a named counter): its value, read before the message's updates.

After the last stage, the count table's mask names the named counters' updates the message
applies (:meth:`StateModel.count`): each empties its counter when its window is not the
message's, then adds 1 or the message's field (saturating at 2**64 - 1).
"""

from __future__ import annotations

from ..backends.p4.entries_doc import InstanceDoc, StateDoc

SUM_MAX = (1 << 64) - 1


class _Instance:
    __slots__ = ("kind", "field", "window_ns", "thresholds", "wid", "count", "total", "extreme", "excess")

    def __init__(self, doc: InstanceDoc):
        self.kind, self.field, self.window_ns = doc.kind, doc.field, doc.window_ns
        self.thresholds = list(doc.thresholds)
        self.wid = 0
        self.clear()

    def clear(self) -> None:
        self.count = self.total = self.extreme = 0
        self.excess = {x: 0 for x in self.thresholds}

    def window(self, time_ns: int) -> int:
        """The id of ``time_ns``'s window (0 when the window never ends)."""
        return time_ns // self.window_ns if self.window_ns else 0

    def move(self, time_ns: int) -> None:
        """Empty the registers when ``time_ns``'s window is not the one they hold."""
        wid = self.window(time_ns)
        if wid != self.wid:
            self.wid = wid
            self.clear()

    def update(self, time_ns: int, packet: dict[str, int]) -> None:
        """An aggregate's update with ``packet`` at ``time_ns``."""
        self.move(time_ns)
        v = packet[self.field] if self.field is not None else 0
        if self.kind == "min":
            self.extreme = v if self.count == 0 else min(self.extreme, v)
        elif self.kind == "max":
            self.extreme = v if self.count == 0 else max(self.extreme, v)
        self.count = min(self.count + 1, SUM_MAX)
        self.total = min(self.total + v, SUM_MAX)
        for x in self.thresholds:
            self.excess[x] += v - x

    def add(self, time_ns: int, v: int) -> None:
        """A named counter's update: move to ``time_ns``'s window, add ``v`` (saturating)."""
        self.move(time_ns)
        self.count = min(self.count + v, SUM_MAX)

    def read(self, time_ns: int, threshold: int | None) -> int:
        """The state value a message at ``time_ns`` sees: :meth:`value`, or 0 (an empty window)
        when the registers hold another window."""
        return self.value(threshold) if self.window(time_ns) == self.wid else 0

    def value(self, threshold: int | None) -> int:
        kind = self.kind
        if kind in ("count", "counter"):
            return self.count
        if kind == "sum":
            return self.total
        if self.count == 0:
            return 0
        if kind in ("min", "max"):
            return self.extreme + 1
        assert threshold is not None, "an avg state value compares against a threshold"
        e = self.excess[threshold]
        return 1 if e < 0 else 2 if e == 0 else 3


class StateModel:
    """The registers of one ``entries.json`` ``state`` section (``doc``), all empty at first."""

    def __init__(self, doc: StateDoc):
        self.doc = doc
        self.update_table = doc.update_table
        self.mask_key = doc.mask_key
        self.time_field = doc.time_field
        self.unit_ns = doc.unit_ns
        self.instances = [_Instance(i) for i in doc.instances]
        self.values = [(v.key, v.instance, v.threshold) for v in doc.values]
        self.count_table = doc.count_table
        self.count_updates = [(u.index, u.instance, u.field) for u in doc.count_updates]

    def message_time(self, packet: dict[str, int], arrival_ns: int | None) -> int:
        """A message's time in ns: its time field's value (times the unit) when the document names
        one, else ``arrival_ns`` (ValueError when that is None)."""
        if self.time_field is not None:
            return packet[self.time_field] * self.unit_ns
        if arrival_ns is None:
            raise ValueError("the rules compare state over windows of arrival time; give each message's time")
        return arrival_ns

    def step(self, mask: int, packet: dict[str, int], time_ns: int, meta: dict[str, int]) -> None:
        """Update the instances whose bit is set in ``mask`` with ``packet`` at ``time_ns``, and
        write the state values it sees into ``meta``."""
        for k, inst in enumerate(self.instances):
            if mask >> k & 1:
                inst.update(time_ns, packet)
        for key, k, x in self.values:
            meta[key] = self.instances[k].read(time_ns, x)

    def count(self, mask: int, packet: dict[str, int], time_ns: int) -> None:
        """Apply the named counters' updates whose bit is set in ``mask`` (the count table's
        parameter) for ``packet`` at ``time_ns``."""
        for j, k, field in self.count_updates:
            if mask >> j & 1:
                self.instances[k].add(time_ns, packet[field] if field is not None else 1)
