"""Reference semantics over many messages: every rule evaluated directly, vectorised with NumPy.

Evaluating R rules on M messages one by one costs R x M predicate evaluations (10^12 for 100,000
rules and 10 million messages).  This module evaluates the rules exactly but on far fewer points:

1. **Value classes.**  For each field, the constants of all predicates on it give breakpoints
   (for a constant ``c``: ``c`` and ``c + 1``; for a prefix: its first value and one past its last).
   Two values between the same consecutive breakpoints satisfy exactly the same predicates
   (``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in``, prefixes), so every rule gives the same
   answer on two messages whose values fall in the same class on every field.
   :class:`ValueClasses` maps message columns to one *class key* per message (int64).
2. **Direct evaluation on one representative per class key.**  :func:`evaluate_rules` evaluates
   each rule's condition, as written (the operators of :meth:`subc.lang.ast.Pred.holds`), on
   the actual field values of one message per distinct class key, vectorised over the
   representatives and over all rules of the same shape (same tree, operators and fields;
   constants differ), then combines the matched rules' actions as
   :func:`subc.semantics.reference.combine` does.

Rules with a top-level conjunct ``field == c`` are evaluated only on the representatives whose
value is ``c`` (exact: the rule is false on the others).  Nothing here uses the BDD, the
intervals of the compiler or the tables, so agreement with the
compiled pipeline is a real check.  Cost: O(R x T) for T distinct class keys in the data, divided
by about the number of distinct equality constants when rules have one.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import cast

import numpy as np

from ..lang.ast import And, Not, Pred, Rule, predicates
from ..ir.decisions import Decision, decide
from ..spec.model import Spec
from ..compiler.gcpause import paused_gc
from ..errors import SubcError
from ..semantics.reference import default_decision

#: Largest boolean block (rules x representatives) evaluated at once.
BLOCK = 1 << 22
_TOP = 1 << 64


class ValueClasses:
    """Breakpoints of every field used by ``rules`` and the class key of a message.

    ``fields`` (sorted 'header.field' names) and ``breaks[f]`` (sorted uint64 breakpoints, always
    starting with 0).  ``key(columns)`` maps ``{'header.field': uint64 array}`` to int64 class keys
    (mixed radix over the fields).  Raises :class:`SubcError` for a field wider than 64 bits or
    when the number of class combinations does not fit in 63 bits."""

    def __init__(self, rules: Sequence[Rule]):
        points: dict[str, set[int]] = {}
        seen: set[int] = set()  # ids of the core conditions already taken (rules share them)
        for r in rules:
            core = r.core
            if id(core) in seen:
                continue
            seen.add(id(core))
            for p in predicates(core):
                if p.width > 64:
                    raise SubcError(
                        f"field {p.field} is {p.width} bits wide; the data pipeline evaluates fields up to 64 bits"
                    )
                s = points.setdefault(p.field, {0})
                for o in p.operands:
                    lo, hi = o.interval(p.width)
                    s.add(lo)
                    s.add(hi + 1)
        self.fields = sorted(points)
        self.breaks = {f: np.array(sorted(x for x in points[f] if x < _TOP), dtype=np.uint64) for f in self.fields}
        self.radix = {f: len(self.breaks[f]) for f in self.fields}
        total = 1
        for f in self.fields:
            total *= self.radix[f]
        if total >= 1 << 63:
            raise SubcError(f"{total} value-class combinations do not fit a 63-bit class key")
        self.combinations = total

    def key(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        n = len(next(iter(columns.values()))) if columns else 0
        key = np.zeros(n, dtype=np.int64)
        for f in self.fields:
            cls = np.searchsorted(self.breaks[f], columns[f], side="right") - 1
            key = key * self.radix[f] + cls
        return key


def _shape(e) -> tuple:
    if isinstance(e, Pred):
        return ("p", e.field, e.width, e.op, tuple(o.prefix_len for o in e.operands))
    if isinstance(e, Not):
        return ("not", _shape(e.item))
    return ("and" if isinstance(e, And) else "or", tuple(_shape(i) for i in e.items))


def _constants(e, out: list[int]) -> None:
    if isinstance(e, Pred):
        out.extend(o.value for o in e.operands)
    elif isinstance(e, Not):
        _constants(e.item, out)
    else:
        for i in e.items:
            _constants(i, out)


def shape_groups(rules: Sequence[Rule]) -> list[tuple[tuple, list[int], np.ndarray]]:
    """The rules grouped by shape (same tree, operators, fields and prefix lengths): per group
    (shape, the rules' positions in ``rules``, their constants as a uint64 matrix, one row per rule,
    columns in depth-first order).  Read from each rule's shared ``core`` condition (equal in
    meaning to its condition, see :class:`~subc.lang.ast.Rule`); the rules of one parser shape
    (:attr:`~subc.lang.ast.Rule.shape`) have one shape here, and rules that share a core share
    their constants, so each is computed once."""
    groups: dict[tuple, list[int]] = {}
    rows: list[list[int]] = []
    by_parser_shape: dict[int, tuple] = {}
    by_core: dict[int, list[int]] = {}
    with paused_gc():  # many small lists that live on: the collector would rescan them
        for i, r in enumerate(rules):
            _group_rule(i, r, groups, rows, by_parser_shape, by_core)
    return [
        (shape, idx, np.array([rows[i] for i in idx], dtype=np.uint64).reshape(len(idx), -1))
        for shape, idx in groups.items()
    ]


def _group_rule(i: int, r: Rule, groups: dict, rows: list, by_parser_shape: dict, by_core: dict) -> None:
    """Rule ``i`` (``r``) into :func:`shape_groups`' ``groups`` and ``rows``, with its caches."""
    core = r.core
    shape = by_parser_shape.get(id(r.shape)) if r.shape is not None else None
    if shape is None:
        shape = _shape(core)
        if r.shape is not None:
            by_parser_shape[id(r.shape)] = shape
    row = by_core.get(id(core))
    if row is None:
        row = by_core[id(core)] = []
        _constants(core, row)
    groups.setdefault(shape, []).append(i)
    rows.append(row)


def _eval_shape(shape: tuple, C: np.ndarray, reps: dict[str, np.ndarray], j: int) -> tuple[np.ndarray, int]:
    """(bool matrix rules x representatives, next constant column) for ``shape``; ``C`` holds the
    constants of each rule (one row per rule, columns in depth-first order)."""
    kind = shape[0]
    if kind == "p":
        _, field, width, op, plens = shape
        v = reps[field][None, :]
        if op in ("==", "!=", "in", "not in"):
            hit = np.zeros((C.shape[0], v.shape[1]), dtype=bool)
            for m, plen in enumerate(plens):
                c = C[:, j + m][:, None]
                if plen is None:
                    hit |= v == c
                elif plen == 0:
                    hit[:] = True
                else:
                    s = np.uint64(width - plen)
                    hit |= (v >> s) == (c >> s)
            return (hit if op in ("==", "in") else ~hit), j + len(plens)
        c = C[:, j][:, None]
        res = {"<": v < c, "<=": v <= c, ">": v > c, ">=": v >= c}[op]
        return res, j + 1
    if kind == "not":
        res, j = _eval_shape(shape[1], C, reps, j)
        return ~res, j
    acc = None
    for sub in shape[1]:
        res, j = _eval_shape(sub, C, reps, j)
        acc = res if acc is None else (acc & res if kind == "and" else acc | res)
    assert acc is not None  # a parsed 'and' or 'or' joins two conditions or more
    return acc, j


@dataclass
class ReferenceResult:
    """Per representative the decision (:class:`Decision`), per rule its hits (messages, weighted
    by the representatives' ``counts``), and per representative how many rules matched;
    ``action_sets`` (the distinct action sets of the rules, K) and ``matched_sets`` (bool, K x T:
    whether a rule with action set k matched representative t)."""

    decisions: list[Decision]
    rule_hits: np.ndarray
    matched_rules: np.ndarray
    action_sets: list[frozenset]
    matched_sets: np.ndarray

    def atoms(self, t: int) -> frozenset:
        """The union of the action sets of the rules representative ``t`` matched."""
        out: frozenset = frozenset()
        for k in np.flatnonzero(self.matched_sets[:, t]):
            out |= self.action_sets[k]
        return out


def _index_column(shape: tuple) -> tuple[str, int] | None:
    """(field, constant column) of a top-level conjunct ``field == constant`` of ``shape``, if any."""
    items = shape[1] if shape[0] == "and" else (shape,)
    j = 0
    for sub in items:
        if sub[0] == "p" and sub[3] == "==" and sub[4] == (None,):
            return sub[1], j
        j += _count_constants(sub)
    return None


def _shape_fields(shape: tuple) -> set[str]:
    """The fields the predicates of ``shape`` test."""
    if shape[0] == "p":
        return {shape[1]}
    if shape[0] == "not":
        return _shape_fields(shape[1])
    return set().union(*(_shape_fields(s) for s in shape[1]))


def _count_constants(shape: tuple) -> int:
    if shape[0] == "p":
        return len(shape[4])
    if shape[0] == "not":
        return _count_constants(shape[1])
    return sum(_count_constants(s) for s in shape[1])


def action_sets(rules: Sequence[Rule]) -> tuple[np.ndarray, list[frozenset]]:
    """The distinct action sets of ``rules`` (:meth:`~subc.lang.ast.Rule.atoms`), in order of
    first use, and per rule the index of its own (int64 array of ``len(rules)``)."""
    ids: dict[frozenset, int] = {}
    per_rule = np.array([ids.setdefault(r.atoms(), len(ids)) for r in rules], dtype=np.int64)
    return per_rule, list(ids)


def evaluate_rules(
    rules: Sequence[Rule],
    spec: Spec,
    reps: dict[str, np.ndarray],
    counts: np.ndarray,
    groups: list | None = None,
    actions: tuple[np.ndarray, list[frozenset]] | None = None,
) -> ReferenceResult:
    """Evaluate ``rules`` on T representatives (``reps``: 'header.field' -> uint64 array of T; every
    field the rules use) weighted by ``counts`` (int64, messages per representative); ``groups``
    and ``actions``: :func:`shape_groups` and :func:`action_sets` of ``rules`` when already
    computed.

    Rules whose condition has a top-level conjunct ``field == c`` are evaluated only on the
    representatives whose value of that field is ``c`` (on the others the conjunct, hence the
    rule, is false); the rest on all representatives.  Raises :class:`SubcError` when matched
    rules' actions conflict on a representative (as :func:`subc.semantics.reference.combine`)."""
    T = len(counts)
    counts = np.asarray(counts, dtype=np.int64)
    hits = np.zeros(len(rules), dtype=np.int64)
    matched = np.zeros(T, dtype=np.int64)
    rule_aset, asets = action_sets(rules) if actions is None else actions
    acc = np.zeros((len(asets), T), dtype=bool)

    def block(shape: tuple, rows: np.ndarray, C: np.ndarray, cols: np.ndarray | None) -> None:
        # rows given with cols are in order of their action sets (see below): no sort per block
        sub = reps if cols is None else {f: reps[f][cols] for f in _shape_fields(shape)}
        width = T if cols is None else len(cols)
        step = max(1, BLOCK // max(width, 1))
        w = counts if cols is None else counts[cols]
        for a in range(0, len(rows), step):
            r = rows[a : a + step]
            M, _ = _eval_shape(shape, C[a : a + step], sub, 0)
            M = np.broadcast_to(M, (len(r), width))
            hits[r] = M.astype(np.int64) @ w
            ids = rule_aset[r]
            if cols is None:
                order = np.argsort(ids, kind="stable")
                ids, M = ids[order], M[order]
            starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            hit_sets = np.logical_or.reduceat(M, starts, axis=0)
            if cols is None:
                matched[:] += M.sum(axis=0)
                acc[ids[starts]] |= hit_sets
            else:
                matched[cols] += M.sum(axis=0)
                acc[np.ix_(ids[starts], cols)] |= hit_sets

    for shape, idx, C in shape_groups(rules) if groups is None else groups:
        idx_arr = np.array(idx, dtype=np.int64)
        index = _index_column(shape)
        if index is None or T == 0:
            block(shape, idx_arr, C, None)
            continue
        field, j = index
        # bucket rules by their constant and representatives by their value of the field
        rep_vals = reps[field]
        rep_order = np.argsort(rep_vals, kind="stable")
        sorted_vals = rep_vals[rep_order]
        rule_order = np.lexsort((rule_aset[idx_arr], C[:, j]))  # by constant, then by action set
        cj = C[rule_order, j]
        bounds = np.flatnonzero(np.r_[True, cj[1:] != cj[:-1], True])
        for a, b in zip(bounds[:-1], bounds[1:]):
            c = cj[a]
            lo, hi = np.searchsorted(sorted_vals, c, "left"), np.searchsorted(sorted_vals, c, "right")
            if lo == hi:
                continue  # no representative has this value: these rules match nothing
            sel = rule_order[a:b]
            block(shape, idx_arr[sel], C[sel], rep_order[lo:hi])
    return ReferenceResult(_combine_sets(asets, acc, spec), hits, matched, asets, acc)


def _combine_sets(asets: list[frozenset], acc: np.ndarray, spec: Spec) -> list[Decision]:
    """Per representative (column of ``acc``), the combined decision of the matched action sets
    (:func:`subc.ir.decisions.decide`; a representative whose matched rules only forward
    gets the union of their ports, computed as a matrix product)."""
    K, T = acc.shape
    default = default_decision(spec)
    if K == 0:
        return [default] * T
    ports = sorted({a[1] for s in asets for a in s if a[0] == "fwd"})
    col = {p: i for i, p in enumerate(ports)}
    PM = np.zeros((K, max(1, len(ports))), dtype=np.float32)
    has_other = np.zeros(K, dtype=bool)
    for k, s in enumerate(asets):
        for a in s:
            if a[0] == "fwd":
                PM[k, col[a[1]]] = 1
            else:
                has_other[k] = True
    A = acc.T.astype(np.float32)
    port_hits = (A @ PM) > 0
    # (acc is 2-D: any() over axis 0 is an array, not the scalar numpy's types allow for)
    any_match = cast(np.ndarray, acc.any(axis=0))
    other = cast(np.ndarray, acc[has_other].any(axis=0)) if has_other.any() else np.zeros(T, dtype=bool)
    out: list[Decision] = [default] * T
    for t in np.flatnonzero(other).tolist():
        atoms = set().union(*(asets[k] for k in np.flatnonzero(acc[:, t])))
        out[t] = decide(atoms, default)
    # forward only: one Decision per distinct set of ports (rows packed to bytes, made unique)
    fwd = np.flatnonzero(any_match & ~other)
    if len(fwd):
        packed = np.packbits(port_hits[fwd], axis=1)
        rows = np.ascontiguousarray(packed).view(np.dtype((np.void, packed.shape[1]))).ravel()
        uniq, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
        port_arr = np.array(ports, dtype=np.int64)
        made = [Decision(tuple(port_arr[port_hits[fwd[i]]].tolist()), None) for i in first.tolist()]
        for t, u in zip(fwd.tolist(), inverse.ravel().tolist()):
            out[t] = made[u]
    return out
