"""The nodes of the live diagrams (:mod:`.incremental`) and what builds and holds them.

A :class:`Node` is a node of a region, counting or delivery diagram: its level and its runs
``(lo, hi, child)`` over the field's values (for a terminal, its value).  Here are the helpers
that build runs (:func:`emit_run`, :func:`copy_span`, :func:`run_builder`), the level-0 value
spans a change touches (:func:`spans_of`, :func:`merge_spans`, :func:`aligned_regions`), a
family of hash-consed, reference-counted nodes (:class:`Universe`) and the free states of one
level (:class:`StatePool`).
"""

from __future__ import annotations

from bisect import bisect_right
from functools import partial
from operator import itemgetter
from typing import Iterable, Sequence, cast

from . import lowering
from .root_runs import ChunkBuilder, ChunkedRuns


class Node:
    """A node: ``level`` (field index, or n for a terminal), ``runs`` (for a field level,
    ``(lo, hi, child)`` covering the field's values; for a terminal its value), ``ref`` (parent
    runs that hold it; level-0 nodes, the roots, are neither hash-consed nor counted: see
    :meth:`.incremental.LiveDiagram.change`).  Delivery nodes also have ``state`` (their number, see
    :mod:`.incremental`); counting nodes ``q`` (their delivery node) and ``origin`` (the node and
    level-0 spans they were derived from, to derive ``q`` by splicing).  A delivery root's
    ``origin`` is the list of level-0 regions where it holds references of its own (None: all
    of its runs; see :meth:`.incremental.LiveDiagram.release_root`)."""

    __slots__ = ("level", "runs", "ref", "state", "q", "origin", "dead", "false", "_los", "miss", "miss_bound")

    def __init__(self, level: int, runs: tuple):
        self.level, self.runs = level, runs
        self.false = False  # a region's FALSE (at any level)
        self.ref = 0
        self.state = 0
        self.q: Node | None = None
        # a counting node's (node, level-0 spans) it derives from; a delivery root's regions
        self.origin: tuple[Node, list[tuple[int, int]]] | list[tuple[int, int]] | None = None
        self.dead = False
        self._los: list[int] | None = None
        #: an exact delivery node's miss target, once asked (:func:`exact_miss`; runs never change)
        self.miss: Node | None = None
        #: (values the miss target covers, whether it was dead, a bound on any other target's
        #: values + 1 if dead): what :func:`derive_miss` needs
        self.miss_bound: tuple[int, bool, int] | None = None

    @property
    def los(self) -> list[int]:
        """The runs' lower bounds (for bisection), computed once (nodes with a tuple of runs)."""
        if self._los is None:
            self._los = list(map(_LO, self.runs))
        return self._los

    def run_at(self, v: int) -> tuple:
        """The run ``(lo, hi, child)`` that holds value ``v``."""
        runs = self.runs
        if runs.__class__ is ChunkedRuns:
            return runs.run_at(v)
        return runs[bisect_right(self.los, v) - 1]

    def child(self, v: int) -> "Node":
        """The child of value ``v``."""
        return self.run_at(v)[2]

    def between(self, lo: int, hi: int) -> Sequence[tuple]:
        """The runs that overlap [lo, hi], in order (unclipped)."""
        runs = self.runs
        if runs.__class__ is ChunkedRuns:
            return runs.between(lo, hi)
        los = self.los
        return runs[bisect_right(los, lo) - 1 : bisect_right(los, hi)]

    def __repr__(self) -> str:
        return f"Node(L{self.level}#{self.state}, {len(self.runs)} runs)"


_LO = itemgetter(0)


def is_dead(node: Node) -> bool:
    """Whether delivery node ``node`` is on the dead chain (state 0: no subscriber below)."""
    return node.state == 0


def exact_miss(node: Node) -> Node:
    """The miss target of an exact delivery node (:func:`.lowering.exact_miss`), computed once
    per node (a node's runs never change), or derived from the root it changes
    (:func:`derive_miss`)."""
    miss = node.miss
    if miss is None:
        weights: dict[Node, int] = {}
        for lo, hi, t in node.runs:
            weights[t] = weights.get(t, 0) + hi - lo + 1
        miss = node.miss = lowering.exact_miss(node.runs, is_dead)
        second = max((w + is_dead(t) for t, w in weights.items() if t is not miss), default=0)
        node.miss_bound = (weights[miss], is_dead(miss), second)
    return miss


def _covered(node: Node, lo: int, hi: int, target: Node) -> int:
    """Values of [lo, hi] whose child in ``node`` is ``target``."""
    n = 0
    for rlo, rhi, c in node.between(lo, hi):
        if c is target:
            n += min(rhi, hi) - max(rlo, lo) + 1
    return n


def derive_miss(base: Node, root: Node, spans: Sequence[tuple[int, int]]) -> None:
    """Give delivery root ``root``, whose children are ``base``'s outside the disjoint level-0
    ``spans``, ``base``'s miss target when that is known and stays the target of the most values
    by a margin no other target can close within the spans (every other target gains at most the
    spans' values): its weight is updated over the spans alone, not over the root's thousands of
    runs.  Otherwise nothing (:func:`exact_miss` computes it when asked)."""
    m, bound = base.miss, base.miss_bound
    if m is None or bound is None:
        return
    weight, dead, second = bound
    size = 0
    for lo, hi in spans:
        size += hi - lo + 1
        weight += _covered(root, lo, hi, m) - _covered(base, lo, hi, m)
    second = max(second, 1) + size  # a target new within the spans: at most their values (+1 if dead)
    if weight + dead > second:
        root.miss, root.miss_bound = m, (weight, dead, second)


def emit_run(out: list, lo: int, hi: int, child) -> None:
    """Append run (lo, hi, child) to ``out``, merged with the last run when it has the same child."""
    if out and out[-1][2] is child:
        out[-1] = (out[-1][0], hi, child)
    else:
        out.append((lo, hi, child))


def copy_span(out: list, node: Node, lo: int, hi: int) -> None:
    """Append ``node``'s runs clipped to [lo, hi] to ``out`` (merged at the junction)."""
    runs, los = node.runs, node.los
    i = bisect_right(los, lo) - 1
    j = bisect_right(los, hi) - 1
    if i == j:
        emit_run(out, lo, hi, runs[i][2])
        return
    emit_run(out, lo, runs[i][1], runs[i][2])
    out.extend(runs[i + 1 : j])
    out.append((runs[j][0], hi, runs[j][2]))


def run_builder(level: int, out: list):
    """(chunk builder or None, emit, copy_span) building the runs of a node of ``level``: with
    a :class:`~.root_runs.ChunkBuilder` at level 0 (a root's runs are chunked and shared with
    the roots it derives from), else into ``out``."""
    if level == 0:
        cb = ChunkBuilder()
        return cb, cb.emit, cb.copy_span
    return None, partial(emit_run, out), partial(copy_span, out)


def spans_of(region: Node) -> list[tuple[int, int]]:
    """The level-0 value spans where ``region`` (a region's root) is not FALSE."""
    return [(lo, hi) for lo, hi, c in region.runs if not c.false]


def merge_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint, non-adjacent union of ``spans``."""
    out: list[list[int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(a, b) for a, b in out]


def aligned_regions(old: Node, new: Node, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The level-0 regions, each a whole number of runs of both ``old`` and ``new`` (two roots
    whose children differ only within the merged ``spans``), outside which their runs are the
    same runs: each span widened to the runs of either root that contain its ends, widened
    regions that touch merged.  Shape: sorted disjoint ``(lo, hi)`` value pairs."""
    out: list[list[int]] = []
    for lo, hi in spans:
        a = min(old.run_at(lo)[0], new.run_at(lo)[0])
        b = max(old.run_at(hi)[1], new.run_at(hi)[1])
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _runs_within(node: Node, regions: Iterable[tuple[int, int]] | None):
    """The runs of ``node`` that lie in ``regions`` (aligned to its runs; None: all runs)."""
    if regions is None:
        yield from node.runs
        return
    for a, b in regions:
        yield from node.between(a, b)


def root_regions(root: Node) -> list[tuple[int, int]] | None:
    """The regions where delivery root ``root`` holds references of its own (None: all its runs)."""
    return cast("list[tuple[int, int]] | None", root.origin)


def constant_chain(uni: Universe, tops: Sequence[int], terminal) -> list[Node]:
    """Nodes of ``uni`` that lead every value to the terminal of value ``terminal``, one per level
    (index = level; level ``len(tops)`` is the terminal itself); ``tops[i]``: the largest value of
    field i."""
    n = len(tops)
    out = [uni.intern(n, terminal)[0]] * (n + 1)  # levels below n: replaced next
    for lv in range(n - 1, -1, -1):
        out[lv] = uni.intern(lv, ((0, tops[lv], out[lv + 1]),))[0]
    return out


class Universe:
    """A family of hash-consed nodes: one unique table per level, reference counts, freeing."""

    def __init__(self, n_levels: int):
        self.unique: list[dict] = [dict() for _ in range(n_levels + 1)]

    def intern(self, level: int, runs: tuple) -> tuple[Node, bool]:
        """The node of (level, runs) and whether it was created (its children then gain a reference)."""
        t = self.unique[level]
        node = t.get(runs)
        if node is not None:
            return node, False
        node = Node(level, runs)
        t[runs] = node
        if level < len(self.unique) - 1:
            for r in runs:
                r[2].ref += 1
        return node, True

    def decref(self, node: Node, freed: list | None = None) -> None:
        """Drop one reference of ``node``; free (and append to ``freed``) every node left without one."""
        node.ref -= 1
        if node.ref > 0:
            return
        stack = [node]
        last = len(self.unique) - 1
        while stack:
            n = stack.pop()
            if n.dead or n.ref > 0:
                continue
            n.dead = True
            del self.unique[n.level][n.runs]
            if freed is not None:
                freed.append(n)
            if n.level < last:
                for r in n.runs:
                    c = r[2]
                    c.ref -= 1
                    if c.ref <= 0:
                        stack.append(c)

    def hold(self, root: Node, regions: Iterable[tuple[int, int]] | None) -> None:
        """Give the children of ``root``'s runs in ``regions`` (None: all) one reference each."""
        for r in _runs_within(root, regions):
            r[2].ref += 1

    def drop(self, root: Node, regions: Iterable[tuple[int, int]] | None, freed: list | None = None) -> None:
        """Take back what :meth:`hold` gave (freeing, into ``freed``, what is left unreferenced)."""
        for r in _runs_within(root, regions):
            self.decref(r[2], freed)

    def size(self) -> int:
        """The number of live nodes, all levels together."""
        return sum(len(t) for t in self.unique)


class StatePool:
    """The free states 1..``capacity`` of one level, in O(states handed out) memory (a switch's
    level may have 2**24 of them): a counter of states never handed out, a stack of those given
    back, and reserved states the counter skips."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.next = 1  # the lowest state never handed out
        self.back: list[int] = []
        self.reserved: set[int] = set()  # states >= next not to hand out

    def pop(self) -> int | None:
        """A free state, or None."""
        if self.back:
            return self.back.pop()
        while self.next <= self.capacity:
            s, self.next = self.next, self.next + 1
            if s not in self.reserved:
                return s
            self.reserved.discard(s)
        return None

    def push(self, state: int) -> None:
        """Give ``state`` back (it is handed out again before any never handed out)."""
        self.back.append(state)

    def reserve(self, states: set[int]) -> None:
        """Take ``states`` out of the free ones until :meth:`unreserve`."""
        self.back = [s for s in self.back if s not in states]
        self.reserved.update(s for s in states if s >= self.next)

    def unreserve(self, states: Iterable[int]) -> None:
        """Give reserved ``states`` back to the free ones."""
        for s in states:
            if s in self.reserved:
                self.reserved.discard(s)
            else:
                self.back.append(s)

    def free(self) -> int:
        """The number of states free to hand out."""
        return self.capacity - (self.next - 1) + len(self.back) - len(self.reserved)
