"""Rule-set analyses of ``subc check`` on BDDs (``dd.cudd``): unsatisfiable rules, rules that change
nothing, and conflicting actions.

All rules' conditions are built in one manager over the fields' elementary intervals (the encoding
of :mod:`subc.ir.bdd`), conjoined with the validity constraint, so a non-false BDD always
stands for real packets.

* **Unsatisfiable**: the condition is false.  The contradicting predicates are a minimal subset of
  the top-level conjuncts whose conjunction is still false (deletion-based).
* **Changes nothing**: the compiled function maps a packet to the action atoms of the rules it
  matches.  Removing rule r leaves it equal iff, for every atom a of r, r's condition implies the
  OR of the conditions of the other rules that carry a.  Rules are examined from the last to the
  first, and a rule found to change nothing is left out of the later checks, so removing *all*
  reported rules together leaves the function equal (earlier rules are kept: of two duplicates,
  the second is reported).  The rules named as covering are a greedy, then pruned, subset.
  Candidates are narrowed by each rule's bounding box over the fields and an index on the field
  most rules test for equality.
* **Conflicts**: a ``fwd`` and a non-forwarding action, or two different non-forwarding actions,
  on one packet (what :func:`subc.compiler.driver.compile_rules` rejects), found as non-empty
  intersections of per-atom-group ORs; up to :data:`MAX_CONFLICTS_PER_PAIR` rule pairs per pair
  of actions, each with an example packet.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Sequence

from dd import cudd

from ..lang.ast import And, Expr, Pred, Rule, evaluate
from ..ir.bdd import ConditionBuilder, field_domains, fields_used, index_range_bdd
from ..ir.decisions import action_class, conflict_message
from ..ir.cubes import CubeMaker
from ..lang.literals import show_value
from ..spec.model import Spec
from ..errors import Location
from .diagnostics import Diagnostic

MAX_CONFLICTS_PER_PAIR = 10
#: Covering rules named in one diagnostic (the rest are counted).
MAX_NAMED = 5

#: A field, or an aggregate call (``avg(h.f, window=5)``).
_OPERAND = r"""(?:[A-Za-z_]\w*\s*\([^)]*\)|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)"""
_PRED_TEXT = re.compile(
    rf"""(?:{_OPERAND}\s*(?:not\s+in|in)\s*\{{[^}}]*\}}"""
    rf"""|{_OPERAND}\s*(?:==|=|!=|<=|>=|<|>)\s*(?:"(?:[^"\\]|\\.)*"|[^\s;:(),]+(?:/\d+)?)"""
    rf"""|(?:"(?:[^"\\]|\\.)*"|[^\s;:(),]+)\s*(?:==|=|!=|<=|>=|<|>)\s*{_OPERAND})"""
)


def pred_text(p: Pred) -> str:
    """The predicate as written (read from its source line), or a rendering of its parts.  ``p``
    is a predicate of a rule's located condition (not of its shared ``core``)."""
    loc = _located(p)
    m = _PRED_TEXT.match(loc.source_line, loc.column - 1) if loc.source_line else None
    if m:
        return m.group()
    return f"{p.field} {p.op} {', '.join(str(o.value) for o in p.operands)}"


def _located(p: Pred) -> Location:
    """The location of ``p``, a predicate of a rule's located condition (which has one)."""
    assert p.location is not None, "a predicate of a rule's core"
    return p.location


def _where(loc: Location) -> str:
    return f"{loc.path}:{loc.line}"


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, And):
        out: list[Expr] = []
        for x in e.items:
            out += _conjuncts(x)
        return out
    return [e]


class RuleSpace:
    """The BDDs of a rule set: one manager over the used fields (declared in first-use order;
    ``fields``: the query fields with the state values of :func:`~subc.ir.aggregates.plan_state`
    when the rules are its rewritten rules, whose comparisons on state are predicates on them).

    ``cond[i]`` is rule i's condition AND the validity constraint; ``box[i]`` its bounding box
    (per field a (first, last) elementary-interval index, None for any), ``None`` when empty.
    """

    def __init__(self, rules: Sequence[Rule], spec: Spec, fields: dict | None = None):
        self.rules = list(rules)
        self.order = fields_used(self.rules)
        self.fields = fields if fields is not None else spec.query_fields
        self.domains = field_domains(self.rules, self.fields, self.order)
        self.bdd = cudd.BDD()
        self.bdd.configure(reordering=False)
        for d in self.domains:
            self.bdd.declare(*d.vars)
        self.builder = ConditionBuilder(self.bdd, {d.field.name: d for d in self.domains})
        self.valid = self.bdd.true
        for d in self.domains:
            self.valid &= index_range_bdd(self.bdd, d.vars, 0, d.k - 1)
        self.cond = [self.builder.expr(r.condition) & self.valid for r in self.rules]
        maker = CubeMaker(self.domains)
        self.box: list[tuple | None] = []
        for r in self.rules:
            cubes = maker.cubes(r.condition)
            if not cubes:
                self.box.append(None)
                continue
            hull = []
            for i, d in enumerate(self.domains):
                rs = [c[i] for c in cubes]
                known = [x for x in rs if x is not None]
                if len(known) < len(rs):  # a cube with any value of the field
                    hull.append((0, d.k - 1))
                else:
                    hull.append((min(a for x in known for a, _ in x), max(b for x in known for _, b in x)))
            self.box.append(tuple(hull))

    def expr(self, e: Expr) -> cudd.Function:
        return self.builder.expr(e) & self.valid

    def example(self, u: cudd.Function) -> dict[str, int]:
        """A packet ({'header.field': value}, first value of each interval) in non-false ``u``."""
        a = self.bdd.pick(u, care_vars=[v for d in self.domains for v in d.vars])
        out = {}
        for d in self.domains:
            idx = 0
            for v in d.vars:
                idx = (idx << 1) | (1 if a[v] else 0)
            out[d.field.name] = d.interval(idx)[0]
        return out


def _boxes_meet(a: tuple, b: tuple) -> bool:
    return all(x[0] <= y[1] and y[0] <= x[1] for x, y in zip(a, b))


def unsatisfiable(space: RuleSpace) -> list[Diagnostic]:
    """A warning for every rule that no packet matches, naming the contradicting predicates."""
    out = []
    f = space.bdd.false
    for r, u in zip(space.rules, space.cond):
        if u != f:
            continue
        items = _conjuncts(r.condition)
        parts = [space.expr(x) for x in items]
        # a minimal unsatisfiable subset by insertion: each round adds the first conjunct at which
        # (core and the conjuncts before it) becomes false; O(conjuncts x core size) conjunctions
        chosen: list[int] = []
        while True:
            acc = space.valid
            for j in chosen:
                acc &= parts[j]
            if acc == f:
                break
            for j, u in enumerate(parts):
                if j in chosen:
                    continue
                acc &= u
                if acc == f:
                    chosen.append(j)
                    break
        core = [items[j] for j in sorted(chosen)]
        texts = [pred_text(x) if isinstance(x, Pred) else "(...)" for x in core]
        if len(core) == 1:
            msg = f"rule never matches: '{texts[0]}' holds for no packet"
        else:
            msg = "rule never matches: " + " and ".join(f"'{t}'" for t in texts) + " contradict"
        notes = [
            f"{_where(_located(x))}:{_located(x).column}: '{t}'" for x, t in zip(core, texts) if isinstance(x, Pred)
        ]
        at = core[-1].location if isinstance(core[-1], Pred) else r.location
        d = Diagnostic("warning", "unsatisfiable", msg, at, notes, [r.location])
        out.append(d)
    return out


def _index_field(space: RuleSpace) -> int | None:
    """The field position on which most rules' boxes are one elementary interval (or None)."""
    best, best_n = None, 0
    for i in range(len(space.domains)):
        n = sum(1 for b in space.box if b is not None and b[i][0] == b[i][1])
        if n > best_n:
            best, best_n = i, n
    return best


def changes_nothing(space: RuleSpace) -> list[Diagnostic]:
    """A warning for every rule whose removal leaves the compiled function equal (see the module
    docstring), naming the rules that cover it; 'duplicate' when one covering rule has the same
    condition and actions."""
    rules, cond, box, f = space.rules, space.cond, space.box, space.bdd.false
    key_field = _index_field(space)
    buckets: dict[tuple, list[int]] = defaultdict(list)  # (atom, point or None) -> rule indices
    by_atom: dict[tuple, list[int]] = defaultdict(list)
    boxed = {i: b for i, b in enumerate(box) if b is not None}  # the satisfiable rules' boxes
    for i, r in enumerate(rules):
        bi = boxed.get(i)
        if bi is None:
            continue
        for a in r.atoms():
            by_atom[a].append(i)
            pt = bi[key_field][0] if key_field is not None and bi[key_field][0] == bi[key_field][1] else None
            buckets[(a, pt)].append(i)
    kept = [True] * len(rules)
    out = []
    for i in range(len(rules) - 1, -1, -1):
        bi = boxed.get(i)
        if bi is None:
            continue  # unsatisfiable: reported as such
        r = rules[i]
        covers: list[int] = []
        redundant = True
        for a in sorted(r.atoms(), key=repr):
            if key_field is not None and bi[key_field][0] == bi[key_field][1]:
                cand = sorted(buckets[(a, bi[key_field][0])] + buckets[(a, None)])
            else:
                cand = by_atom[a]
            uncovered = cond[i]
            chosen: list[int] = []
            for j in cand:
                if j == i or (j > i and not kept[j]) or not _boxes_meet(bi, boxed[j]):
                    continue
                if uncovered & cond[j] != f:
                    uncovered &= ~cond[j]
                    chosen.append(j)
                    if uncovered == f:
                        break
            if uncovered != f:
                redundant = False
                break
            if len(chosen) <= 8:  # prune to a minimal cover
                for j in list(reversed(chosen)):
                    rest = [k for k in chosen if k != j]
                    acc = f
                    for k in rest:
                        acc |= cond[k]
                    if rest and cond[i] & ~acc == f:
                        chosen = rest
            covers += [j for j in chosen if j not in covers]
        if not redundant:
            continue
        kept[i] = False
        covers.sort()
        dup = next((j for j in covers if cond[j] == cond[i] and rules[j].atoms() == r.atoms()), None)
        if dup is not None:
            msg = f"duplicate rule: the rule at {_where(rules[dup].location)} has the same condition and actions"
            out.append(Diagnostic("warning", "duplicate", msg, r.location, [], [rules[dup].location]))
            continue
        named = ", ".join(_where(rules[j].location) for j in covers[:MAX_NAMED])
        more = f" and {len(covers) - MAX_NAMED} more" if len(covers) > MAX_NAMED else ""
        msg = (
            f"rule changes nothing: every packet it matches already gets its actions from the rule(s) at {named}{more}"
        )
        notes = [f"{_where(rules[j].location)}: {rules[j].text.strip()}" for j in covers[:MAX_NAMED]]
        out.append(Diagnostic("warning", "redundant", msg, r.location, notes, [rules[j].location for j in covers]))
    out.reverse()
    return out


def conflicts(space: RuleSpace) -> list[Diagnostic]:
    """An error for every pair of rules whose actions cannot apply to one packet together (atoms
    of different :func:`~subc.ir.decisions.action_class`: a ``fwd`` and another action, or
    two different non-forwarding actions), with an example packet; at most
    :data:`MAX_CONFLICTS_PER_PAIR` rule pairs per pair of action classes."""
    rules, cond, f = space.rules, space.cond, space.bdd.false
    groups: dict[object, cudd.Function] = {}
    members: dict[object, list[int]] = defaultdict(list)
    for i, (r, u) in enumerate(zip(rules, cond)):
        for g in {action_class(a) for a in r.atoms()} - {None}:
            groups[g] = groups.get(g, f) | u
            members[g].append(i)
    others = sorted((g for g in groups if g != "fwd"), key=repr)
    pairs = [("fwd", b) for b in others if "fwd" in groups] + [
        (b, c) for k, b in enumerate(others) for c in others[k + 1 :]
    ]
    used = [d.field.name for d in space.domains]
    out = []
    for x, y in pairs:
        overlap = groups[x] & groups[y]
        for _ in range(MAX_CONFLICTS_PER_PAIR):
            if overlap == f:
                break
            pkt = space.example(overlap)
            i = next(i for i in members[x] if evaluate(rules[i].condition, pkt))
            j = next(j for j in members[y] if evaluate(rules[j].condition, pkt))
            ax = next(a for a in sorted(rules[i].atoms(), key=repr) if action_class(a) == x)
            ay = next(a for a in sorted(rules[j].atoms(), key=repr) if action_class(a) == y)
            if i > j:
                i, j, ax, ay = j, i, ay, ax
            where = ", ".join(f"{k}={show_value(space.fields[k], pkt[k])}" for k in used)
            if i == j:
                msg = conflict_message(ay, ax, where, None)
                out.append(Diagnostic("error", "conflict", msg, rules[j].location, [], [], pkt))
            else:
                msg = conflict_message(ay, ax, where, _where(rules[i].location))
                out.append(
                    Diagnostic(
                        "error",
                        "conflict",
                        msg,
                        rules[j].location,
                        [f"{_where(rules[i].location)}: {rules[i].text.strip()}"],
                        [rules[i].location],
                        pkt,
                    )
                )
            overlap &= ~(cond[i] & cond[j])
    return out
