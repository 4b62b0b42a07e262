"""The registers of an ``entries.json`` ``state`` section over columns of messages in trace order.

The same model as :mod:`subc.semantics.state_model` (docs/state.md "Stateful subscriptions"), computed
for a whole chunk of messages at once and carried from one chunk to the next, so that ``subc
analyze`` can run the trace's messages through the registers split by split, in order:

* an aggregate instance holds the window of its last update; the messages whose update mask has
  the instance's bit update it in order, and a run of updates in one window id (consecutive among
  the instance's updates) accumulates: count = position in the run, sum and each ``avg`` excess
  ``Σ(v − X)`` = prefix sums within the run, ``min``/``max`` = running extremes within the run
  (the first run continues the carried registers when it has their window id);
* every message then reads, for each state value, its instance after the last update at or before
  it (its own included): that update's values when the update's window id is the message's, else
  an empty window (0 for every kind).

Sums are exact (NumPy int64 where the chunk's values cannot overflow it, Python integers
otherwise) and saturate at 2**64 − 1 like the model.  Named counters (updated after the last
stage, by the decision) are not computed here: a rule set with them runs message by message.
"""

from __future__ import annotations

import numpy as np

from ..backends.p4.entries_doc import InstanceDoc, StateDoc

SUM_MAX = (1 << 64) - 1
_I64 = 1 << 63


class _Carry:
    """An instance's registers after the last update so far."""

    __slots__ = ("wid", "count", "total", "extreme", "excess")

    def __init__(self, thresholds):
        self.wid, self.count, self.total, self.extreme = 0, 0, 0, 0
        self.excess = {x: 0 for x in thresholds}


def _prefix_sums(v: np.ndarray, start: np.ndarray, base: int, continues: bool, bound: int) -> np.ndarray:
    """Per element, the sum of ``v`` (signed) since the start of its run (``start``: True where a
    run begins), plus ``base`` in the first run when ``continues``.  int64 when ``bound`` (a bound
    on every |partial sum|, ``base`` included) fits, else Python integers (object array)."""
    if bound < _I64:
        x = v.astype(np.int64)
    else:
        x = np.array([int(a) for a in v], dtype=object)
    c = np.cumsum(x)
    run = np.cumsum(start) - 1  # run number of each element, from 0
    first = np.flatnonzero(start)
    out = c - (c[first] - x[first])[run]
    if continues:
        out[run == 0] += base
    return out


def _running_extreme(v: np.ndarray, start: np.ndarray, kind: str) -> np.ndarray:
    """Per element, the ``kind`` ('min' or 'max') of ``v`` since the start of its run."""
    import pandas as pd

    run = np.cumsum(start)
    g = pd.Series(v.astype(np.uint64)).groupby(run)
    return (g.cummin() if kind == "min" else g.cummax()).to_numpy(dtype=np.uint64)


class StateRegisters:
    """The aggregate instances of one ``state`` section (``doc``), empty at first.

    ``masks``: the distinct update masks of the update table
    (:attr:`~subc.analysis.tables_np.PipelineEvaluator.masks`).  :meth:`step` takes the next
    chunk of messages.  Raises ValueError for a section with named counters."""

    def __init__(self, doc: StateDoc, masks: list[int]):
        self.instances = doc.instances
        if any(i.kind == "counter" for i in self.instances):
            raise ValueError("named counters depend on each message's decision: run the messages one by one")
        self.values = [(v.key, v.instance, v.threshold) for v in doc.values]
        self.time_field = doc.time_field
        self.unit_ns = doc.unit_ns
        self.masks = masks
        self.carry = [_Carry(i.thresholds) for i in self.instances]

    def window_ids(self, window_ns: int, fields: dict[str, np.ndarray], arrival_ns: np.ndarray | None) -> np.ndarray:
        """Per message, the id of its window of ``window_ns`` (0 when the window never ends): its
        time (the time field times its unit, else ``arrival_ns``) floor-divided by the window,
        exactly (uint64 where it fits, else Python integers).  Raises ValueError when a window
        ends and neither time is known."""
        n = len(next(iter(fields.values()))) if fields else (len(arrival_ns) if arrival_ns is not None else 0)
        if not window_ns:
            return np.zeros(n, dtype=np.uint64)
        if self.time_field is None:
            if arrival_ns is None or (len(arrival_ns) and int(np.min(arrival_ns)) < 0):
                raise ValueError("the rules compare state over windows of arrival time; give each message's time")
            return arrival_ns.astype(np.uint64) // np.uint64(window_ns)
        t = fields[self.time_field].astype(np.uint64)
        unit = self.unit_ns
        if window_ns % unit == 0:
            return t // np.uint64(window_ns // unit)
        return np.array([int(a) * unit // window_ns for a in t], dtype=object)

    def step(
        self, update: np.ndarray, fields: dict[str, np.ndarray], arrival_ns: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Run the next n messages (in order) through the registers: ``update`` (int64 per message:
        index into ``masks``, -1 for none), ``fields`` (the aggregated fields and the time field,
        uint64 arrays of n), ``arrival_ns`` (int64 per message, the time without a time field; -1
        unknown).  Returns the state values each message reads, by value key (uint64 arrays of n)."""
        n = len(update)
        bits = np.array(
            [[m >> k & 1 for k in range(len(self.instances))] for m in self.masks]
            or np.zeros((0, len(self.instances))),
            dtype=bool,
        ).reshape(len(self.masks), len(self.instances))
        upd = np.where(update >= 0, update, 0)
        has = update >= 0
        out: dict[str, np.ndarray] = {}
        by_instance: dict[int, list] = {}
        for key, k, x in self.values:
            by_instance.setdefault(k, []).append((key, x))
        for k, inst in enumerate(self.instances):
            hit = has & bits[upd, k] if len(self.masks) else np.zeros(n, bool)
            wid = self.window_ids(inst.window_ns, fields, arrival_ns)
            reads = self._instance(k, inst, np.flatnonzero(hit), wid, fields)
            for key, x in by_instance.get(k, []):
                out[key] = reads(x)
        return out

    def _instance(self, k: int, inst: InstanceDoc, u: np.ndarray, wid: np.ndarray, fields: dict[str, np.ndarray]):
        """Update instance ``k`` with the messages ``u`` (indexes into the chunk, ascending), carry
        its registers on, and return ``reads(threshold)``: the state value per message."""
        carry = self.carry[k]
        prev = (carry.wid, carry.count, carry.total, carry.extreme, dict(carry.excess))
        kind, m, n = inst.kind, len(u), len(wid)
        v = fields[inst.field][u].astype(np.uint64) if inst.field is not None else np.zeros(m, np.uint64)
        w = wid[u]
        start = np.ones(m, dtype=bool)
        continues = False
        if m:
            start[1:] = w[1:] != w[:-1]
            continues = w[0] == carry.wid
        run = np.cumsum(start) - 1
        first = np.flatnonzero(start)
        count = np.arange(m, dtype=np.int64) - first[run] + 1
        if continues:
            count[run == 0] += carry.count
        vmax = int(v.max()) if m else 0
        total = _prefix_sums(v, start, carry.total, continues, m * vmax + carry.total)
        extreme = None
        if kind in ("min", "max"):
            extreme = _running_extreme(v, start, kind) if m else np.zeros(0, np.uint64)
            if continues and carry.count:
                sel = run == 0
                c = np.uint64(carry.extreme)
                extreme[sel] = np.minimum(extreme[sel], c) if kind == "min" else np.maximum(extreme[sel], c)
        excess = {}
        for x in inst.thresholds:
            bound = m * max(vmax, x) + abs(carry.excess[x])
            d = (v.astype(np.int64) - np.int64(x)) if bound < _I64 else np.array([int(a) - x for a in v], dtype=object)
            excess[x] = _prefix_sums(d, start, carry.excess[x], continues, bound)
        if m:  # the registers after the chunk's last update go on to the next chunk
            carry.wid, carry.count, carry.total = w[-1], int(count[-1]), int(total[-1])
            if extreme is not None:
                carry.extreme = int(extreme[-1])
            for x in excess:
                carry.excess[x] = int(excess[x][-1])
        # the last update at or before each message (its own included); before the chunk's first
        # update a message reads the registers as the previous chunk left them
        j = np.searchsorted(u, np.arange(n), side="right") - 1
        before = j < 0
        js = np.where(before, 0, j)
        pwid, pcount, ptotal, pext, pexc = prev
        same = wid == pwid if not m else np.where(before, wid == pwid, w[js] == wid)

        def reads(x) -> np.ndarray:
            if kind in ("count", "sum"):
                after = count if kind == "count" else total
                pre = pcount if kind == "count" else ptotal
                if m:
                    a = after[js]
                    a = (
                        np.array([min(int(q), SUM_MAX) for q in a], dtype=np.uint64)
                        if a.dtype == object
                        else a.astype(np.uint64)
                    )
                else:
                    a = np.zeros(n, np.uint64)
                val = np.where(before, np.uint64(min(pre, SUM_MAX)), a)
            elif kind in ("min", "max"):
                assert extreme is not None  # kept for min and max
                pre = pext + 1 if pcount else 0
                val = np.where(before, np.uint64(pre), (extreme[js] + np.uint64(1)) if m else np.uint64(0))
            else:

                def code(e):
                    return 1 if e < 0 else 2 if e == 0 else 3

                pre = code(pexc[x]) if pcount else 0
                if m:
                    e = excess[x][js]
                    a = np.where(e < 0, 1, np.where(e == 0, 2, 3)).astype(np.uint64)
                else:
                    a = np.zeros(n, np.uint64)
                val = np.where(before, np.uint64(pre), a)
            return np.where(same, val, np.uint64(0)).astype(np.uint64)

        return reads
