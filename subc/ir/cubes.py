"""Cubes: a rule condition as disjoint boxes of elementary-interval index ranges, one tuple of
ranges per field in field order (None: any value), the first pass of :mod:`.layered` (its
docstring, step 1) and what :mod:`subc.checker.analysis` reasons about."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Final, Literal, cast

from ..lang.ast import And, Expr, Pred
from .bdd import ConditionBuilder, FieldDomain, index_segments
from .intervals import IntervalSet, interval_index

if TYPE_CHECKING:  # dd.cudd is imported where a BDD is built: importing it costs a compile 0.1 s (networkx)
    from dd import cudd

Ranges = tuple[tuple[int, int], ...] | None
Cube = tuple[Ranges, ...]


class _Empty(enum.Enum):
    EMPTY = "EMPTY"


EMPTY: Final = _Empty.EMPTY  # the index ranges of an empty value set


def conjuncts(e: Expr) -> list[Pred] | None:
    """The predicates of ``e`` when it is a predicate or a conjunction of them, else None."""
    if isinstance(e, Pred):
        return [e]
    if isinstance(e, And):
        out: list[Pred] = []
        for x in e.items:
            sub = conjuncts(x)
            if sub is None:
                return None
            out += sub
        return out
    return None


def index_ranges(dom: FieldDomain, s: IntervalSet) -> Ranges:
    """The elementary-interval index ranges of value set ``s`` of ``dom``'s field (None: every value)."""
    if s.is_full():
        return None
    return tuple((interval_index(dom.cuts, lo), interval_index(dom.cuts, hi)) for lo, hi in s.intervals)


class CubeMaker:
    """Cubes of rule conditions over ``domains`` (see the module docstring, step 1).

    ``domains`` are the :class:`~.bdd.FieldDomain` of the fields in field order (every field the
    conditions test).  :meth:`cubes` gives the disjoint cubes of a condition: tuples with one entry
    per domain, the sorted disjoint ``(first, last)`` elementary-interval index ranges the cube allows
    on that field, or None for any value.  Results are cached per condition object (rules that share
    a ``core`` condition share its cubes) and per predicate."""

    def __init__(self, domains: list[FieldDomain]):
        self.domains = domains
        self.pos = {d.field.name: i for i, d in enumerate(domains)}
        self._bdd: cudd.BDD | None = None
        self._builder: ConditionBuilder | None = None
        self._ranges: dict[tuple[int, int], tuple[IntervalSet, Ranges]] = {}  # (field, id(set)) -> ranges
        self._by_pred: dict[int, tuple[Pred, int, IntervalSet]] = {}  # id(pred) -> (pred, field, values)
        self._by_cond: dict[int, tuple[Expr, list[Cube]]] = {}  # id(condition) -> (condition, cubes)
        self._pred_cube: dict[int, tuple] = {}  # id(pred) -> (pred, field, ranges or EMPTY)

    def cubes(self, cond: Expr) -> list[Cube]:
        """The cubes of ``cond`` (an empty list when no packet satisfies it)."""
        hit = self._by_cond.get(id(cond))
        if hit is not None and hit[0] is cond:
            return hit[1]
        out = self._cubes(cond)
        self._by_cond[id(cond)] = (cond, out)
        return out

    def pred_ranges(self, p: Pred) -> tuple[Pred, int, Ranges | Literal[_Empty.EMPTY]]:
        """(p, field position, index ranges of p's values or EMPTY), cached per predicate."""
        hit = self._pred_cube.get(id(p))
        if hit is None or hit[0] is not p:
            _, i, values = self._pred(p)
            hit = self._pred_cube[id(p)] = (p, i, EMPTY if values.is_empty() else self._index_ranges(i, values))
        return hit

    def _index_ranges(self, i: int, s: IntervalSet) -> Ranges:
        hit = self._ranges.get((i, id(s)))
        if hit is not None and hit[0] is s:
            return hit[1]
        out = index_ranges(self.domains[i], s)
        self._ranges[(i, id(s))] = (s, out)
        return out

    def _pred(self, p: Pred) -> tuple[Pred, int, IntervalSet]:
        hit = self._by_pred.get(id(p))
        if hit is None or hit[0] is not p:
            hit = self._by_pred[id(p)] = (p, self.pos[p.field], p.values())
        return hit

    def _cubes(self, cond: Expr) -> list[Cube]:
        if type(cond) is And and all(type(p) is Pred for p in cond.items):
            # the common case: predicates on distinct fields, each its own cached ranges
            cube: list[Ranges] = [None] * len(self.domains)
            seen = set()
            for p in cast("tuple[Pred, ...]", cond.items):  # predicates, as just checked
                _, i, ranges = self.pred_ranges(p)
                if i in seen:
                    break
                if ranges is EMPTY:
                    return []
                seen.add(i)
                cube[i] = ranges
            else:
                return [tuple(cube)]
        flat = conjuncts(cond)
        if flat is None:
            return self._bdd_cubes(cond)
        per: dict[int, IntervalSet] = {}
        for p in flat:
            _, i, values = self._pred(p)
            per[i] = per[i].intersect(values) if i in per else values
        cube = [None] * len(self.domains)
        cache = self._ranges
        for i, s in per.items():
            hit = cache.get((i, id(s)))
            if hit is not None and hit[0] is s:  # value sets of equal predicates are one object
                cube[i] = hit[1]
                continue
            if s.is_empty():
                return []
            cube[i] = index_ranges(self.domains[i], s)
            cache[(i, id(s))] = (s, cube[i])
        return [tuple(cube)]

    def _bdd_cubes(self, cond: Expr) -> list[Cube]:
        if self._bdd is None:
            from dd import cudd

            self._bdd = cudd.BDD()
            self._bdd.configure(reordering=False)
            for d in self.domains:
                self._bdd.declare(*d.vars)
            self._builder = ConditionBuilder(self._bdd, {d.field.name: d for d in self.domains})
        bdd, n, out = self._bdd, len(self.domains), []

        def walk(node: cudd.Function, i: int, acc: list[Ranges]) -> None:
            if node == bdd.false:
                return
            if i == n or node == bdd.true:
                out.append(tuple(acc + [None] * (n - i)))
                return
            dom = self.domains[i]
            groups: dict[int, tuple[cudd.Function, list[tuple[int, int]]]] = {}
            for first, last, child in index_segments(bdd, node, dom):
                if child == bdd.false:
                    continue
                rs = groups.setdefault(int(child), (child, []))[1]
                if rs and rs[-1][1] + 1 == first:
                    rs[-1] = (rs[-1][0], last)
                else:
                    rs.append((first, last))
            for child, rs in groups.values():
                walk(child, i + 1, acc + [None if rs == [(0, dom.k - 1)] else tuple(rs)])

        assert self._builder is not None  # made with the BDD
        walk(self._builder.expr(cond), 0, [])
        return out
