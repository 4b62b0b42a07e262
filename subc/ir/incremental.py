"""Incremental slicing: the sliced diagram of a set of subscriptions that changes one at a time.

``subc compile`` slices a whole rule set (:mod:`.layered`); a broker whose subscribers come and
go (``subc serve``) cannot recompile 100,000 subscriptions per request.  This module keeps the
diagram of Algorithm 1 of Jepsen et al. ("Packet Subscriptions for Programmable ASICs", HotNets
2018) as hash-consed multi-terminal *interval decision diagrams* and changes it by ``apply``
operations (Bryant 1986, with interval edges as in Srinivasan et al.'s multi-valued decision
diagrams) whose cost follows the part of the diagram a subscription's condition touches.

Three kinds of diagram over the same field order (level i tests field i; level n = the number of
fields holds the terminals).  All are *quasi-reduced*: every path visits every level (as the
data path's stages do), a node's *runs* ``(lo, hi, child)`` cover ``[0, 2**width - 1]`` in value
order with adjacent runs leading to different children, and equal nodes are one object (a
unique table per level), so each diagram is canonical for its function:

* a *region* (:meth:`LiveDiagram.region`): the set of messages a condition accepts, terminals
  ``TRUE`` and ``FALSE``;
* the *counting diagram*: per message, how many live subscriptions of each subscriber accept it
  (terminals: a tuple of sorted subscribers and a tuple of their counts).  Adding or removing a subscription is one
  ``apply`` of its region with +1 or -1 for its subscriber: exact, without knowing the
  subscriber's other subscriptions;
* the *delivery diagram* (the quotient of the counting diagram by "count > 0"): per message,
  the set of subscribers that receive it (terminals: sorted subscriber tuples).  It is what the
  data plane holds, and it is the reduced sliced diagram that compiling the live subscriptions
  as rules ``condition : fwd(subscriber)`` gives (``tests/test_incremental.py`` checks this).

Delivery nodes are *persistent*: once created a node never changes, and each one below level 0
has a number (its *state*, per level, from 1; 0 is the dead state of every level and the
default leaf), so the data plane can write a new node's entries next to the live ones and a
packet that started with an older root keeps a consistent diagram.  A change therefore writes
the entries of the new nodes only, plus the root: level 0 has ``root_slots`` versions of the
root (states 1..root_slots), and a change rewrites one free slot's entries where they differ
(:meth:`LiveDiagram.root_diff`), then switches the data plane's root to it.  A retired root slot
keeps its nodes alive until :meth:`LiveDiagram.release_root` (after the data plane's grace
period); nodes no root reaches are then freed and their states reused (:meth:`LiveDiagram.recycle`).

The nodes, the helpers that build their runs and the free states are in :mod:`.live_nodes`;
regions are built by :mod:`.live_regions`.

Errors: :class:`~subc.errors.SubcError` for a condition on a field outside the field order,
and :class:`CapacityError` when a level runs out of states (the change is rolled back).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence, cast

from ..errors import SubcError
from ..lang.ast import Expr
from .live_nodes import (
    Node,
    StatePool,
    Universe,
    aligned_regions,
    constant_chain,
    derive_miss,
    merge_spans,
    root_regions,
    run_builder,
    spans_of,
)
from .live_regions import region_of
from ..spec.model import QueryField


class CapacityError(SubcError):
    """A level of the delivery diagram has no free state left (the data plane's maps are full)."""


@dataclass
class Change:
    """What a change did to the delivery diagram: ``root`` (its new level-0 node), ``new`` (the
    delivery nodes it created below level 0, children before parents, each with its state) and
    ``spans`` (the level-0 values whose children may differ from the previous root's)."""

    root: Node
    new: list[Node] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    changed: bool = True
    base: Node | None = None  # the delivery root before the change


class LiveDiagram:
    """The counting and delivery diagrams of the live subscriptions (module docstring).

    ``fields``: the field order (:class:`~.spec.QueryField`, widths in bits); ``capacity``: per
    level below 0, the states the data plane has room for (state 0 excluded).  The root's
    versions (slots) are the data plane's business (:mod:`subc.dataplane.live_broker`).  Subscriber
    numbers are any non-negative integers (the eBPF data plane uses 0..511)."""

    #: Nodes with more runs than this derive their delivery node by splicing their origin's
    #: (copying the runs outside the changed spans) instead of mapping every run.
    SPLICE_MIN_RUNS = 64

    def __init__(self, fields: Sequence[QueryField], capacity: Sequence[int]):
        self.fields = list(fields)
        self.n = n = len(self.fields)
        if n == 0:
            raise SubcError("a live diagram needs at least one field")
        self.index = {q.name: i for i, q in enumerate(self.fields)}
        self.tops = [(1 << q.width) - 1 for q in self.fields]
        self.counting = Universe(n)
        self.delivery = Universe(n)
        self.capacity = list(capacity)
        if len(self.capacity) != n:
            raise ValueError("capacity: one figure per level below 0 (levels 1..n)")
        # free states per level 1..n (index level - 1); state 0 is dead / the default leaf
        self._free: list[StatePool] = [StatePool(c) for c in self.capacity]
        self.dead = constant_chain(self.counting, self.tops, ((), ()))
        self.qdead = constant_chain(self.delivery, self.tops, ())
        for node in self.qdead:
            node.state = 0
        for c, q in zip(self.dead, self.qdead):
            c.q = q
            c.ref += 1 << 30  # never freed
            q.ref += 1 << 30
        self.root = self.dead[0]
        self._roots: deque[Node] = deque()  # live delivery roots, oldest first (see change())

    # -- construction -------------------------------------------------------------------------

    def region(self, cond: Expr) -> Node:
        """The region diagram of condition ``cond`` (an AST expression over the field order's
        fields; :func:`.live_regions.region_of`).  Regions are built in a universe of their own,
        shared by nobody, so they cost nothing once the subscription is gone.  Raises SubcError
        (at the predicate) for a field outside the field order."""
        return region_of(cond, self.index, self.tops)

    @staticmethod
    def is_empty(region: Node) -> bool:
        """Whether ``region`` accepts no message."""
        return region.false

    # -- changes ------------------------------------------------------------------------------

    def _apply(self, n: Node, b: Node, sid: int, delta: int, memo: dict) -> Node:
        """The counting node of ``n`` with ``delta`` added to ``sid``'s count where region ``b`` holds."""
        if b.false:
            return n
        lv = n.level
        if lv == self.n:  # runs: (sorted subscribers, their counts), every count > 0
            sids, counts = n.runs
            i = bisect_left(sids, sid)
            had = i < len(sids) and sids[i] == sid
            c = (counts[i] if had else 0) + delta
            if c < 0:
                raise ValueError(f"subscriber {sid}: count below zero (a removal without its addition)")
            j = i + had
            if c:
                return self.counting.intern(lv, (sids[:i] + (sid,) + sids[j:], counts[:i] + (c,) + counts[j:]))[0]
            return self.counting.intern(lv, (sids[:i] + sids[j:], counts[:i] + counts[j:]))[0]
        key = (n, b)
        hit = memo.get(key)
        if hit is not None:
            return hit
        out: list = []
        rr, emit, copy = run_builder(lv, out)
        spans = []
        for blo, bhi, bc in b.runs:
            if bc.false:
                copy(n, blo, bhi)
                continue
            spans.append((blo, bhi))
            for lo, hi, c in n.between(blo, bhi):
                emit(max(lo, blo), min(hi, bhi), self._apply(c, bc, sid, delta, memo))
        if lv == 0:  # a root: not hash-consed, references taken by change()
            res, created = Node(0, rr.runs()), True
        else:
            res, created = self.counting.intern(lv, tuple(out))
        if created:
            res.origin = (n, spans)
        memo[key] = res
        return res

    def _quotient(self, n: Node, new: list[Node]) -> Node:
        """The delivery node of counting node ``n`` (created ones appended to ``new``)."""
        q = n.q
        if q is not None and not q.dead:
            return q
        lv = n.level
        if lv == self.n:
            q, created = self.delivery.intern(lv, n.runs[0])  # the subscribers (counts are > 0)
        else:
            out: list = []
            rr, emit, copy = run_builder(lv, out)
            origin = cast("tuple[Node, list[tuple[int, int]]] | None", n.origin)  # a counting node's
            if (
                origin is not None
                and len(n.runs) > self.SPLICE_MIN_RUNS
                and origin[0].q is not None
                and not origin[0].q.dead
                and (lv == 0 or not origin[0].dead)
            ):
                base, spans = origin[0].q, merge_spans(origin[1])
                cur = 0
                for lo, hi in spans:
                    if lo > cur:
                        copy(base, cur, lo - 1)
                    for rlo, rhi, c in n.between(lo, hi):
                        emit(max(rlo, lo), min(rhi, hi), self._quotient(c, new))
                    cur = hi + 1
                if cur <= self.tops[lv]:
                    copy(base, cur, self.tops[lv])
            elif lv == 0:
                for lo, hi, c in n.runs:
                    emit(lo, hi, self._quotient(c, new))
            else:  # as emit(lo, hi, self._quotient(c, new)) per run, inlined: the hot loop of a change
                last = None
                for lo, hi, c in n.runs:
                    cq = c.q
                    if cq is None or cq.dead:
                        cq = self._quotient(c, new)
                    if cq is last:
                        out[-1] = (out[-1][0], hi, cq)
                    else:
                        out.append((lo, hi, cq))
                        last = cq
            if lv == 0:  # a root: not hash-consed, references taken by change()
                q, created = Node(0, rr.runs()), False
            else:
                q, created = self.delivery.intern(lv, tuple(out))
        if created:
            if lv > 0:
                state = self._free[lv - 1].pop()
                if state is None:
                    new.append(q)  # rolled back by the caller
                    raise CapacityError(
                        f"level {lv} ({self._level_name(lv)}) has no free state left ({self.capacity[lv - 1]} in all)"
                    )
                q.state = state
            new.append(q)
        n.q = q
        return q

    def _level_name(self, lv: int) -> str:
        return "leaves" if lv == self.n else self.fields[lv].name

    def change(self, ops: Sequence[tuple[Node, int, int]]) -> Change:
        """Apply ``ops`` ((region, subscriber, +1 or -1), in order) to the counting diagram and
        derive the new delivery root.  Returns the :class:`Change`; its new root is held (by the
        caller's root slot) until :meth:`release_root`.  ``Change.changed`` is False when no
        message's subscribers changed (every region empty): the root is then the live one and
        must not be released.  Raises CapacityError (nothing changed) when a level is full,
        ValueError (nothing changed) when a removal has no matching addition.

        Cost: roots have one run per distinct level-0 child (thousands, for an exact field of
        many values), so a root is neither hash-consed nor reference-counted run by run, and its
        runs are chunks shared with the root it derives from (:mod:`.root_runs`).  A new
        root takes references only in the :func:`aligned_regions` where it differs from the
        previous one; outside them it shares the previous root's.  The counting diagram's old
        root dies at once and hands its shared references over; a delivery root is kept by its
        root slot, and the live delivery roots form a chain in which the oldest holds references
        for all its runs and each later one for its own regions (see :meth:`release_root`)."""
        old_root = self.root
        root = old_root
        spans: list[tuple[int, int]] = []
        done: list[tuple[Node, Node, list]] = []  # (previous root, new root, regions), to undo
        try:
            for region, sid, delta in ops:
                nr = self._apply(root, region, sid, delta, {})
                if nr is root:
                    continue
                sp = spans_of(region)
                regions = aligned_regions(root, nr, sp)
                self.counting.hold(nr, regions)
                self.counting.drop(root, regions)
                done.append((root, nr, regions))
                root = nr
                spans.extend(sp)
        except BaseException:
            self._undo(done)
            raise
        if root is old_root:
            assert old_root.q is not None  # the counting root's delivery root (at first the dead chain's)
            return Change(old_root.q, [], [], changed=False)
        if len(done) > 1:
            root.origin = (old_root, spans)  # outside the spans of all ops, root's runs are old_root's
        spans = merge_spans(spans)
        new: list[Node] = []
        try:
            q = self._quotient(root, new)
        except BaseException:
            self._rollback(new)
            self._undo(done)
            raise
        base = old_root.q
        if self._roots and self._roots[-1] is base and not base.dead:
            q.origin = aligned_regions(base, q, spans)
        else:
            q.origin = None
        if base is not None and q.miss is None:
            derive_miss(base, q, spans)
        self.delivery.hold(q, q.origin)
        self._roots.append(q)
        self.root = root
        return Change(q, [n for n in new if n.level > 0], spans, True, base)

    def revert(self, ch: Change, ops: Sequence[tuple[Node, int, int]]) -> list[Node]:
        """Undo the latest change ``ch`` made by ``ops`` (the data plane could not take it):
        release its root, change the counting diagram back, and make ``ch.base`` the delivery
        root again.  Returns the freed delivery nodes, as :meth:`release_root` does."""
        if not ch.changed:
            return []
        freed = self.release_root(ch.root)
        root = self.root
        for region, sid, delta in reversed(ops):
            nr = self._apply(root, region, sid, -delta, {})
            if nr is not root:
                regions = aligned_regions(root, nr, spans_of(region))
                self.counting.hold(nr, regions)
                self.counting.drop(root, regions)
                root = nr
        root.q = ch.base
        self.root = root
        return freed

    def _undo(self, done: list[tuple[Node, Node, list]]) -> None:
        """Give back the counting references that ``done``'s root changes moved, newest first."""
        for prev, nr, regions in reversed(done):
            self.counting.hold(prev, regions)
            self.counting.drop(nr, regions)

    def _rollback(self, new: list[Node]) -> None:
        """Free the delivery nodes of a change that failed (``new``: children before parents)."""
        for node in reversed(new):
            if node.ref == 0 and not node.dead:
                node.ref = 1
                freed: list[Node] = []
                self.delivery.decref(node, freed)
                self.recycle(f for f in freed if f.level > 0)

    def release_root(self, q: Node) -> list[Node]:
        """Drop what delivery root ``q`` holds (after the data plane's grace period: no packet
        still uses it).  ``q`` must be the oldest live root (slots retire in order) or the
        newest (a change the data plane could not take; the counting diagram must then be
        changed back by the caller).  Returns the delivery nodes this frees, whose states the
        data plane must clear before :meth:`recycle` makes them reusable.  Raises ValueError
        for any other root."""
        roots = self._roots
        freed: list[Node] = []
        if roots and roots[0] is q:
            roots.popleft()
            if roots:
                succ = roots[0]
                self.delivery.drop(q, root_regions(succ), freed)  # succ now holds all its runs
                succ.origin = None
            else:
                self.delivery.drop(q, None, freed)
        elif roots and roots[-1] is q:
            roots.pop()
            self.delivery.drop(q, root_regions(q), freed)
        else:
            raise ValueError("release_root: not the oldest or newest live root")
        q.dead = True
        return [n for n in freed if n.level > 0]

    def recycle(self, nodes: Iterable[Node]) -> None:
        """Make the states of freed ``nodes`` (from :meth:`release_root`) reusable."""
        for n in nodes:
            if n.state:
                self._free[n.level - 1].push(n.state)
                n.state = 0

    def reserve(self, level: int, states: Iterable[int]) -> None:
        """Take ``states`` of ``level`` (1..n) out of the free list: they hold entries this
        diagram did not write (a previous daemon's, still live in pinned maps) until
        :meth:`unreserve`.  Raises ValueError for a state beyond the level's capacity."""
        taken = set(states)
        if taken and max(taken) > self.capacity[level - 1]:
            raise ValueError(f"level {level}: state {max(taken)} beyond the capacity {self.capacity[level - 1]}")
        self._free[level - 1].reserve(taken)

    def unreserve(self, level: int, states: Iterable[int]) -> None:
        """Give reserved ``states`` of ``level`` back to the free list."""
        self._free[level - 1].unreserve(states)

    # -- queries ------------------------------------------------------------------------------

    def deliver(self, values: dict[str, int]) -> tuple[int, ...]:
        """The subscribers of a message with field ``values`` (every field of the order), by
        walking the counting diagram (for tests)."""
        node = self.root
        for q in self.fields:
            node = node.child(values[q.name])
        sids, counts = node.runs
        return tuple(sid for sid, c in zip(sids, counts) if c > 0)

    def states_used(self) -> list[int]:
        """States in use per level 1..n (delivery nodes alive, including retired roots' nodes)."""
        return [self.capacity[i] - self._free[i].free() for i in range(self.n)]
