"""Sets of unsigned integers as sorted disjoint closed intervals.

Every predicate of a rule denotes the set of field values that satisfy it; for a field of
W bits that set is a union of intervals of ``[0, 2**W - 1]``.  Intervals are closed:
``(lo, hi)`` holds every v with lo <= v <= hi.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterable, Sequence

Interval = tuple[int, int]


class IntervalSet:
    """An immutable union of closed intervals within ``[0, top]``.

    ``intervals`` is a tuple of disjoint, non-adjacent ``(lo, hi)`` pairs in increasing order.
    """

    __slots__ = ("top", "intervals")

    def __init__(self, top: int, intervals: Iterable[Interval] = ()):
        self.top = top
        self.intervals = _normalise(intervals)

    @classmethod
    def point(cls, top: int, v: int) -> "IntervalSet":
        return cls(top, [(v, v)])

    @classmethod
    def full(cls, top: int) -> "IntervalSet":
        return cls(top, [(0, top)])

    def complement(self) -> "IntervalSet":
        out, nxt = [], 0
        for lo, hi in self.intervals:
            if lo > nxt:
                out.append((nxt, lo - 1))
            nxt = hi + 1
        if nxt <= self.top:
            out.append((nxt, self.top))
        return IntervalSet(self.top, out)

    def union(self, other: "IntervalSet") -> "IntervalSet":
        return IntervalSet(self.top, list(self.intervals) + list(other.intervals))

    def intersect(self, other: "IntervalSet") -> "IntervalSet":
        out = []
        i = j = 0
        a, b = self.intervals, other.intervals
        while i < len(a) and j < len(b):
            lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
            if lo <= hi:
                out.append((lo, hi))
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return IntervalSet(self.top, out)

    def __contains__(self, v: int) -> bool:
        for lo, hi in self.intervals:
            if lo <= v <= hi:
                return True
            if v < lo:
                return False
        return False

    def is_empty(self) -> bool:
        return not self.intervals

    def is_full(self) -> bool:
        return self.intervals == ((0, self.top),)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IntervalSet) and (self.top, self.intervals) == (other.top, other.intervals)

    def __hash__(self) -> int:
        return hash((self.top, self.intervals))

    def __repr__(self) -> str:
        return f"IntervalSet({self.intervals})"


def _normalise(intervals: Iterable[Interval]) -> tuple[Interval, ...]:
    out: list[list[int]] = []
    for lo, hi in sorted(intervals):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def elementary_cuts(sets: Iterable[IntervalSet], top: int) -> list[int]:
    """Start points of the elementary intervals that refine every set in ``sets``.

    The result starts with 0; elementary interval i is ``[cuts[i], cuts[i+1] - 1]`` (the last
    ends at ``top``).  Each set is a union of whole elementary intervals.
    """
    cuts = {0}
    for s in sets:
        for lo, hi in s.intervals:
            cuts.add(lo)
            if hi < top:
                cuts.add(hi + 1)
    return sorted(cuts)


def interval_index(cuts: Sequence[int], v: int) -> int:
    """Index of the elementary interval (see :func:`elementary_cuts`) that holds ``v``."""
    return bisect_right(cuts, v) - 1


def prefix_cover_count(lo: int, hi: int, width: int) -> int:
    """Number of ternary (value, mask) entries needed to match exactly ``[lo, hi]`` on ``width`` bits.

    This is the classic range-to-prefix expansion (at most ``2 * width - 2`` prefixes), the
    TCAM cost of a range entry on a TCAM without range units.
    """
    count = 0
    while lo <= hi:
        size = lo & -lo if lo else 1 << width
        while size > hi - lo + 1:
            size >>= 1
        count += 1
        lo += size
    return count
