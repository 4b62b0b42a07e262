"""Lowering: one state of a field stage -> its entries (range, exact with a miss target, LPM).

The one place that decides how a state of the sliced diagram becomes table or map entries, used
by the batch compiler (:mod:`.ir` states, for the P4 tables of :mod:`.tables` and the BPF maps of
:mod:`.targets.ebpf`) and by the live writers (:mod:`subc.dataplane.ebpf.live_maps` for BPF maps,
:mod:`subc.dataplane.p4rt.live_entries` for P4Runtime), so that a live subscription set is written
entry for entry as a compile of the same rules would write it.

A state is given by its *runs* ``(lo, hi, target)``: they cover the field's values ``[0, 2**width
- 1]`` in value order, adjacent runs lead to different targets (batch: next-state numbers; live:
:class:`~.incremental.Node` objects), and ``is_dead(target)`` says which target is the dead state
(state 0: no entry needed where it is the default).  Every form depends on the runs alone: not on
the other states of the stage, nor on how states are numbered (ties go to the dead state, then to
the target met first in value order).  A live node is written once and never changes, so a form
that depended on the rest of the rule set would drift from a compile of the same rules.

* :func:`range_form` (P4 range tables): the runs that do not lead to the fallback target, above
  one full-range fallback entry (none when the fallback is dead); the fallback is the target of
  the most runs (:func:`preferred_target`).  (The eBPF range stage holds every run's lower bound: the runs themselves.)
* :func:`exact_form`: the miss target is the target that covers the most values
  (:func:`preferred_target`); one entry per other value.
* :func:`lpm_form`: the fewest prefixes whose longest-prefix match gives every value its target,
  a value no prefix matches going to the dead state: ORTC (Draves, King, Venkatachary and Zill,
  "Constructing Optimal IP Routing Tables", INFOCOM 1999) over the aligned blocks that straddle a
  run boundary (at most 2 x runs x width of them).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from ..errors import SubcError

T = TypeVar("T", bound=Hashable)

MAX_EXACT_RUN = 1 << 16
"""Values of one run that an exact form may enumerate: more means a state whose miss target is
not the target of almost every value, which no rule set of ``==``/``!=`` on a wide field makes."""


def _rank(runs: Iterable[tuple[int, int, T]]) -> dict[T, int]:
    """Each target's position of first appearance in value order."""
    rank: dict[T, int] = {}
    for _, _, t in runs:
        rank.setdefault(t, len(rank))
    return rank


def preferred_target(weights: dict[T, int], rank: dict[T, int], is_dead: Callable[[T], bool]) -> T:
    """The fallback or miss target that saves the most entries: the one of greatest weight (the
    entries it saves), the dead target counting one more (it needs no fallback or miss entry of
    its own: the table's default); ties to the dead target, then to the lowest ``rank``."""
    return max(weights, key=lambda t: (weights[t] + is_dead(t), is_dead(t), -rank[t]))


def range_form(runs: Sequence[tuple[int, int, T]], is_dead: Callable[[T], bool]) -> tuple[list[tuple[int, int, T]], T]:
    """(the runs that do not lead to the fallback, fallback target): a P4 range table holds the
    runs above one full-range fallback entry, none when the fallback is dead.  The fallback is
    the target of the most runs (ties: dead, then first in value order)."""
    weights: dict[T, int] = {}
    for _, _, t in runs:
        weights[t] = weights.get(t, 0) + 1
    fb = preferred_target(weights, _rank(runs), is_dead)
    return [r for r in runs if r[2] != fb], fb


def exact_miss(runs: Iterable[tuple[int, int, T]], is_dead: Callable[[T], bool]) -> T:
    """The miss target of an exact state: the target covering the most values (ties: dead, then
    first in value order)."""
    runs = list(runs)
    weights: dict[T, int] = {}
    for lo, hi, t in runs:
        weights[t] = weights.get(t, 0) + hi - lo + 1
    return preferred_target(weights, _rank(runs), is_dead)


def exact_values(runs: Iterable[tuple[int, int, T]], miss: T, lo: int = 0, hi: int | None = None):
    """(value, target) of the values in ``[lo, hi]`` (None: to the end) whose target is not
    ``miss``, in value order.  Raises SubcError for a run of more than :data:`MAX_EXACT_RUN`
    such values."""
    for rlo, rhi, t in runs:
        if t == miss or rhi < lo or (hi is not None and rlo > hi):
            continue
        a, b = max(rlo, lo), rhi if hi is None else min(rhi, hi)
        if b - a >= MAX_EXACT_RUN:
            raise SubcError(f"an exact field's state would need {b - a + 1} entries for one run")
        for v in range(a, b + 1):
            yield v, t


def exact_form(runs: Sequence[tuple[int, int, T]], is_dead: Callable[[T], bool]) -> tuple[list[tuple[int, T]], T]:
    """([(value, target)] of the values whose target is not the miss target, miss target)."""
    miss = exact_miss(runs, is_dead)
    return list(exact_values(runs, miss)), miss


def lpm_form(runs: Sequence[tuple[int, int, T]], width: int, is_dead: Callable[[T], bool]) -> list[tuple[int, int, T]]:
    """The fewest LPM entries [(value, prefix length, target)], sorted, whose longest-prefix match
    gives each value of the ``width``-bit field its target and leaves a value no entry matches
    to the dead target (ORTC, Draves et al. 1999; ties: the enclosing entry's target when it is
    one of the optimal ones, else the target first in value order)."""
    runs = list(runs)
    los = [lo for lo, _, _ in runs]
    rank = _rank(runs)
    dead = next((t for t in rank if is_dead(t)), _NO_TARGET)

    # ORTC passes 1 and 2: the blocks [lo, lo + 2**k) that straddle a run boundary are split in
    # halves; each block gets the set of targets that make its subtree cheapest.
    def build(lo: int, k: int):
        i = bisect_right(los, lo) - 1
        if runs[i][1] >= lo + (1 << k) - 1:
            t = runs[i][2]
            return (frozenset((t,)), None, None)
        left, right = build(lo, k - 1), build(lo + (1 << (k - 1)), k - 1)
        both = left[0] & right[0]
        return (both or left[0] | right[0], left, right)

    out: list[tuple[int, int, T]] = []

    # ORTC pass 3: from the root down, a block keeps its enclosing entry's target when that is one
    # of its set's, else it gets an entry
    def emit(node, lo: int, k: int, inherited) -> None:
        targets, left, right = node
        if inherited in targets:
            chosen = inherited
        else:
            chosen = min(targets, key=rank.__getitem__)
            out.append((lo, width - k, chosen))
        if left is not None:
            emit(left, lo, k - 1, chosen)
            emit(right, lo + (1 << (k - 1)), k - 1, chosen)

    emit(build(0, width), 0, width, dead)
    out.sort(key=lambda e: (e[0], e[1]))
    return out


class _NoTarget:
    """The enclosing target of the root when no run is dead: in no target set."""

    def __repr__(self) -> str:
        return "<no target>"


_NO_TARGET = _NoTarget()
