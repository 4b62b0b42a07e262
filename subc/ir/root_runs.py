"""The runs of a live diagram's root, as a persistent sequence of chunks.

A root of :mod:`subc.ir.incremental` has one run ``(lo, hi, child)`` per stretch of
level-0 values with one child: thousands when the first field is an exact field of many values
(one run per symbol and one per gap between symbols).  Every change makes a new root that
differs from the previous one in a few value spans, and several roots are alive at once (the
data plane's root slots, until their grace period), so a root cannot be changed in place.
Copying all runs per change costs a pass that touches every run (in CPython, a reference count
update per run, each a likely cache miss): at 100,000 subscriptions over 2,000 symbols that was
most of a change's time.

:class:`ChunkedRuns` keeps the runs in immutable chunks of at most ``2 * CHUNK`` runs that
roots share; :class:`ChunkBuilder` builds a new root's runs from pieces of others, copying the
chunks a change touches and sharing the rest.  The cost of a change at level 0 is then
O(chunks + CHUNK x spans) instead of O(runs).  Runs keep the invariants of the diagram: they
cover the field's values in order, and adjacent runs lead to different children (the builder
merges runs at every junction).
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import chain
from operator import itemgetter
from typing import Iterator, Sequence

#: Target chunk length (runs); chunks hold 1 to 2 x CHUNK runs.
CHUNK = 64

_LO = itemgetter(0)


class ChunkedRuns:
    """Runs ``(lo, hi, child)`` in value order, held as ``chunks`` (tuples of runs) with their
    lower bounds ``clos`` (one list per chunk) and each chunk's first lower bound ``firsts``.
    Immutable once built: chunks and their bound lists are shared between versions.  Supports
    ``len``, iteration, integer indexing (O(chunks)), :meth:`run_at` and :meth:`between`."""

    __slots__ = ("chunks", "clos", "firsts", "n")

    def __init__(self, chunks: list[tuple], clos: list[list[int]], firsts: list[int]):
        self.chunks, self.clos, self.firsts = chunks, clos, firsts
        self.n = sum(map(len, chunks))

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple]:
        return chain.from_iterable(self.chunks)

    def __getitem__(self, i: int) -> tuple:
        if not isinstance(i, int):
            raise TypeError("ChunkedRuns: integer indexes only")
        if i == -1 and self.chunks:
            return self.chunks[-1][-1]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError("ChunkedRuns index out of range")
        for c in self.chunks:
            if i < len(c):
                return c[i]
            i -= len(c)
        raise IndexError("ChunkedRuns index out of range")  # not reached: n is the sum of the lengths

    def run_at(self, v: int) -> tuple:
        """The run that holds value ``v`` (O(log runs))."""
        ci = bisect_right(self.firsts, v) - 1
        return self.chunks[ci][bisect_right(self.clos[ci], v) - 1]

    def between(self, lo: int, hi: int) -> Sequence[tuple]:
        """The runs that overlap [lo, hi], in order (unclipped)."""
        firsts, chunks, clos = self.firsts, self.chunks, self.clos
        ci = bisect_right(firsts, lo) - 1
        cj = bisect_right(firsts, hi) - 1
        k = bisect_right(clos[ci], lo) - 1
        m = bisect_right(clos[cj], hi)
        if ci == cj:
            return chunks[ci][k:m]
        out = list(chunks[ci][k:])
        for x in range(ci + 1, cj):
            out.extend(chunks[x])
        out.extend(chunks[cj][:m])
        return out


class ChunkBuilder:
    """Builds a :class:`ChunkedRuns` from runs appended in value order (:meth:`emit`) and from
    pieces of other roots (:meth:`copy_span`, which shares the whole chunks it covers).  Runs
    with the same child that meet are merged, as :func:`subc.ir.live_nodes.emit_run` does."""

    __slots__ = ("chunks", "clos", "firsts", "part", "plos")

    def __init__(self):
        self.chunks: list[tuple] = []
        self.clos: list[list[int]] = []
        self.firsts: list[int] = []
        self.part: list[tuple] = []  # runs not yet sealed into a chunk
        self.plos: list[int] = []

    def emit(self, lo: int, hi: int, child) -> None:
        """Append run (lo, hi, child), merged with the last run when it has the same child."""
        part = self.part
        if part:
            last = part[-1]
            if last[2] is child:
                part[-1] = (last[0], hi, child)
                return
        elif self.chunks and self.chunks[-1][-1][2] is child:
            self._reopen()
            part = self.part
            part[-1] = (part[-1][0], hi, child)
            return
        part.append((lo, hi, child))
        self.plos.append(lo)
        if len(part) >= 2 * CHUNK:
            self._seal(CHUNK)

    def _emit_runs(self, seg: Sequence[tuple], lo: int | None, hi: int | None) -> None:
        """Append the runs ``seg`` (consecutive runs of one root), the first clipped to start at
        ``lo`` and the last to end at ``hi`` (None: as they are)."""
        n = len(seg)
        if not n:
            return
        first, last = seg[0], seg[-1]
        if n == 1:
            self.emit(
                first[0] if lo is None else max(first[0], lo), first[1] if hi is None else min(first[1], hi), first[2]
            )
            return
        self.emit(first[0] if lo is None else max(first[0], lo), first[1], first[2])
        # consecutive runs of one root never merge with their neighbours there
        mid = seg[1:-1]
        part = self.part
        part.extend(mid)
        self.plos.extend(map(_LO, mid))
        part.append((last[0], last[1] if hi is None else min(last[1], hi), last[2]))
        self.plos.append(last[0])
        while len(part) >= 2 * CHUNK:
            self._seal(CHUNK)

    def copy_span(self, node, lo: int, hi: int) -> None:
        """Append the runs of ``node`` (an incremental diagram node of level 0, with
        :class:`ChunkedRuns` or a plain tuple of runs) clipped to [lo, hi]."""
        runs = node.runs
        if runs.__class__ is not ChunkedRuns:
            self._emit_runs(node.between(lo, hi), lo, hi)
            return
        firsts, chunks, clos = runs.firsts, runs.chunks, runs.clos
        ci = bisect_right(firsts, lo) - 1
        cj = bisect_right(firsts, hi) - 1
        if cj - ci < 2:
            self._emit_runs(runs.between(lo, hi), lo, hi)
            return
        self._emit_runs(chunks[ci][bisect_right(clos[ci], lo) - 1 :], lo, None)
        self._add_chunk(chunks[ci + 1], clos[ci + 1])
        if cj - ci > 2:  # chunks that were neighbours there need no merging: shared as they are
            self._seal()
            self.chunks.extend(chunks[ci + 2 : cj])
            self.clos.extend(clos[ci + 2 : cj])
            self.firsts.extend(firsts[ci + 2 : cj])
        self._emit_runs(chunks[cj][: bisect_right(clos[cj], hi)], None, hi)

    def _add_chunk(self, chunk: tuple, los: list[int]) -> None:
        """Append a whole chunk of another root, right after the run that precedes it there (so
        the two never merge): shared, unless it would leave a short chunk next to it, then copied."""
        part = self.part
        if part:
            if len(part) + len(chunk) <= 2 * CHUNK:
                part.extend(chunk)
                self.plos.extend(los)
                if len(part) >= CHUNK:
                    self._seal()
                return
            self._seal()
        if self.chunks and len(self.chunks[-1]) + len(chunk) <= CHUNK:
            self._reopen()
            self.part.extend(chunk)
            self.plos.extend(los)
            return
        self.chunks.append(chunk)
        self.clos.append(los)
        self.firsts.append(los[0])

    def _reopen(self) -> None:
        """Take the last sealed chunk back (copied) to extend it."""
        c = self.chunks.pop()
        ls = self.clos.pop()
        self.firsts.pop()
        self.part = list(c) + self.part
        self.plos = list(ls) + self.plos

    def _seal(self, size: int | None = None) -> None:
        """Make the first ``size`` runs of the part (None: all of them) a chunk; a short part is
        first joined to a short last chunk."""
        part, plos = self.part, self.plos
        if not part:
            return
        if size is None or size >= len(part):
            if self.chunks and len(self.chunks[-1]) + len(part) <= CHUNK:
                self._reopen()
                part, plos = self.part, self.plos
            self.chunks.append(tuple(part))
            self.clos.append(plos)
            self.firsts.append(plos[0])
            self.part, self.plos = [], []
            return
        self.chunks.append(tuple(part[:size]))
        self.clos.append(plos[:size])
        self.firsts.append(plos[0])
        del part[:size]
        del plos[:size]

    def runs(self) -> ChunkedRuns:
        """The runs built (the builder must not be used afterwards)."""
        self._seal()
        return ChunkedRuns(self.chunks, self.clos, self.firsts)
