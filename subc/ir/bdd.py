"""All rules of a rule set as one BDD (``dd.cudd``), with no path that no packet can take.

Encoding.  Predicates on one field are not independent (``price > 100`` implies
``price > 50``), so a field is not given one BDD variable per predicate.  Instead the values of
each field are cut into *elementary intervals* at every predicate bound
(:func:`~subc.ir.intervals.elementary_cuts`): every predicate is a union of whole
intervals, and every interval is non-empty.  The field is encoded by the binary index of its
interval (``ceil(log2 k)`` variables, most significant first), and codes ``>= k`` are excluded by
a validity constraint.  Every path of the BDD therefore stands for a non-empty set of packets.

Actions are *atoms* (``('fwd', port)``, ``('drop',)``, ``(name, *args)``), each with one variable
``y_a`` ordered below every field variable.  The BDD is the characteristic function
``F(x, y) = valid(x) and AND_a (y_a <-> G_a(x))`` where ``G_a`` is the OR of the conditions of
the rules that carry atom ``a``; once all fields are fixed, ``F`` is the single minterm of ``y``
that lists the atoms of the packet.  Fields follow the chosen field order (one block of
variables each, in order); dynamic reordering is off so that blocks stay contiguous, which
Algorithm 1 of Jepsen et al., "Packet Subscriptions for Programmable ASICs" (HotNets 2018)
needs to slice the BDD into one table per field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Sequence


from ..lang.ast import And, Expr, Not, Or, Pred, Rule, predicates
from ..lang.rule_store import shape_cores
from .intervals import IntervalSet, elementary_cuts, interval_index
from ..spec.model import QueryField

if TYPE_CHECKING:  # dd.cudd is imported where a BDD is built: importing it costs a compile 0.1 s (networkx)
    from dd import cudd


@dataclass
class FieldDomain:
    """The elementary intervals of one field and its BDD variables (most significant bit first).

    ``cuts[i]`` is the first value of interval i; ``mentioned`` holds every single value or
    prefix that appears as an operand (used to build exact and lpm entries).
    """

    field: QueryField
    cuts: list[int]
    vars: list[str]
    mentioned: set = dataclasses.field(default_factory=set)  # (the class's own ``field`` hides dataclasses.field)

    @property
    def k(self) -> int:
        return len(self.cuts)

    def interval(self, i: int) -> tuple[int, int]:
        hi = self.cuts[i + 1] - 1 if i + 1 < len(self.cuts) else self.field.max_value
        return self.cuts[i], hi


def _var_prefix(name: str) -> str:
    return "f_" + name.replace(".", "__")


@dataclass
class RuleBDD:
    """The BDD of a rule set: manager, root, per-field domains in field order, atom variables.

    Attributes: ``bdd`` (a ``dd.cudd.BDD``), ``root`` (the function F), ``domains`` (list of
    :class:`FieldDomain` in field order), ``atoms`` (sorted atoms), ``atom_vars`` (atom -> var),
    ``rule_bdds`` (condition BDD per rule, by rule index).
    """

    bdd: cudd.BDD
    root: cudd.Function
    domains: list[FieldDomain]
    atoms: list[tuple]
    atom_vars: dict[tuple, str]
    rule_bdds: list[cudd.Function]
    valid: list[cudd.Function]  # valid[i]: validity of fields i.. (i = len(domains): true)

    def dead(self, i: int) -> cudd.Function:
        """The state reached at boundary i (before field i) when no rule can match any more."""
        none = self.bdd.true
        for v in self.atom_vars.values():
            none &= ~self.bdd.var(v)
        return self.valid[i] & none


def index_range_bdd(bdd: cudd.BDD, bits: Sequence[str], a: int, b: int) -> cudd.Function:
    """BDD of ``a <= index <= b`` over the variables ``bits`` of ``bdd`` (the binary index of a
    field's elementary interval, most significant bit first): a ge and a le comparator chain."""
    ge, le = bdd.true, bdd.true
    for pos, name in enumerate(reversed(bits)):  # LSB first
        x = bdd.var(name)
        ge = (x & ge) if (a >> pos) & 1 else (x | ge)
        le = (~x | le) if (b >> pos) & 1 else (~x & le)
    return ge & le


class ConditionBuilder:
    """BDDs of rule conditions over the interval-index variables of ``domains`` (field name ->
    :class:`FieldDomain`, whose variables are declared in ``bdd``).  A predicate is the union of
    the index ranges of its value set (cached per field and value set); ``and``, ``or`` and ``not``
    are the BDD operations.  A field missing from ``domains`` raises KeyError."""

    def __init__(self, bdd: cudd.BDD, domains: dict[str, FieldDomain]):
        self.bdd, self.domains = bdd, domains
        self.cache: dict[tuple[str, IntervalSet], cudd.Function] = {}

    def index_set(self, dom: FieldDomain, s: IntervalSet) -> cudd.Function:
        """The BDD of the indices of the elementary intervals of ``dom`` that make up ``s`` (a union
        of whole elementary intervals)."""
        key = (dom.field.name, s)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        u = self.bdd.false
        for lo, hi in s.intervals:
            u |= index_range_bdd(self.bdd, dom.vars, interval_index(dom.cuts, lo), interval_index(dom.cuts, hi))
        self.cache[key] = u
        return u

    def expr(self, e: Expr) -> cudd.Function:
        """The BDD of condition ``e``."""
        if isinstance(e, Pred):
            return self.index_set(self.domains[e.field], e.values())
        if isinstance(e, Not):
            return ~self.expr(e.item)
        assert isinstance(e, (And, Or))  # comparisons on state are pseudo-field predicates by now (.aggregates)
        u = self.bdd.true if isinstance(e, And) else self.bdd.false  # And(()) is true, Or(()) false
        for x in e.items:
            p = self.expr(x)
            u = (u & p) if isinstance(e, And) else (u | p)
        return u


_core = attrgetter("core")


def core_predicates(cores) -> list[Pred]:
    """The distinct predicate objects of the conditions ``cores``, in order of first use (depth
    first)."""
    preds: dict[int, Pred] = {}
    add = preds.setdefault
    for c in cores:
        for x in c.items if type(c) is And or type(c) is Or else (c,):
            if type(x) is Pred:
                add(id(x), x)
            else:
                for p in predicates(x):
                    add(id(p), p)
    return list(preds.values())


def fields_used(rules: Sequence[Rule]) -> list[str]:
    """Names of the fields that the rules test, in order of first use.  Of rules with one
    ``shape`` (deferred rules of one shape test the same fields in the same order: see
    :class:`~.ast.Rule`) only the first is looked at."""
    seen: dict[str, None] = {}
    for core, _ in shape_cores(rules):
        for p in core_predicates((core,)):
            seen.setdefault(p.field, None)
    return list(seen)


def field_domains(rules: Sequence[Rule], fields: dict[str, QueryField], order: Sequence[str]) -> list[FieldDomain]:
    """The :class:`FieldDomain` of every field in ``order``: elementary intervals cut at every
    bound the rules' predicates on it have, and its BDD variable names.

    Raises ValueError if ``order`` misses a field the rules use.
    """
    cores = {id(c): c for c in map(_core, rules)}  # rules of one shape share their core conditions
    return predicate_domains(core_predicates(cores.values()), fields, order)


def predicate_domains(preds: Sequence[Pred], fields: dict[str, QueryField], order: Sequence[str]) -> list[FieldDomain]:
    """:func:`field_domains` of rules whose distinct predicates are ``preds`` (in first-use order).

    Raises ValueError if ``order`` misses a field of ``preds``.
    """
    preds_by_field: dict[str, list[Pred]] = {f: [] for f in order}
    for p in preds:
        on_field = preds_by_field.get(p.field)
        if on_field is None:
            raise ValueError(f"field order misses {p.field}")
        on_field.append(p)
    domains: list[FieldDomain] = []
    for fname in order:
        q = fields[fname]
        on_field = preds_by_field[fname]
        sets = {id(v): v for v in (p.values() for p in on_field)}.values()
        cuts = elementary_cuts(sets, q.max_value)
        nbits = max(1, (len(cuts) - 1).bit_length())
        names = [f"{_var_prefix(fname)}_{b}" for b in range(nbits)]
        mentioned = {
            (o.value, o.prefix_len if o.prefix_len is not None else q.width)
            for p in on_field
            if p.op not in ("<", "<=", ">", ">=")
            for o in p.operands
        }
        domains.append(FieldDomain(q, cuts, names, mentioned))
    return domains


def build_bdd(rules: Sequence[Rule], fields: dict[str, QueryField], order: Sequence[str]) -> RuleBDD:
    """Build the BDD of ``rules`` with the fields in ``order`` (every field the rules use).

    ``fields`` maps field names to :class:`QueryField`.  Raises ValueError if ``order`` misses a
    used field.
    """
    from dd import cudd

    domains = field_domains(rules, fields, order)
    bdd = cudd.BDD()
    bdd.configure(reordering=False)
    for d in domains:
        bdd.declare(*d.vars)
    atoms = sorted({a for r in rules for a in r.atoms()}, key=repr)
    atom_vars = {a: f"y_{i}" for i, a in enumerate(atoms)}
    if atom_vars:
        bdd.declare(*atom_vars.values())
    builder = ConditionBuilder(bdd, {d.field.name: d for d in domains})
    rule_bdds = [builder.expr(r.core) for r in rules]
    valid = [bdd.true] * (len(domains) + 1)
    for i in range(len(domains) - 1, -1, -1):
        d = domains[i]
        valid[i] = valid[i + 1] & index_range_bdd(bdd, d.vars, 0, d.k - 1)
    by_atom: dict[tuple, cudd.Function] = {a: bdd.false for a in atoms}
    for r, u in zip(rules, rule_bdds):
        for a in r.atoms():
            by_atom[a] |= u
    root = valid[0]
    for a, y in atom_vars.items():
        root &= bdd.apply("<=>", bdd.var(y), by_atom[a])
    return RuleBDD(bdd, root, domains, atoms, atom_vars, rule_bdds, valid)


def branches(u: cudd.Function) -> tuple[cudd.Function, cudd.Function]:
    """(low, high) cofactors of ``u`` with respect to its top variable, complement edges applied."""
    lo, hi = u.low, u.high
    if u.negated:
        lo, hi = ~lo, ~hi
    return lo, hi


def index_segments(bdd: cudd.BDD, u: cudd.Function, dom: FieldDomain) -> list[tuple[int, int, cudd.Function]]:
    """Cofactors of ``u`` for every interval index of ``dom``: [(first, last, node)], indices < k.

    Walks the BDD through the field's variable block only; a subtree that does not test the
    remaining bits covers a whole aligned block of indices with one node.
    """
    levels = [bdd.level_of_var(v) for v in dom.vars]
    nbits = len(levels)
    out: list[tuple[int, int, cudd.Function]] = []

    def walk(node: cudd.Function, depth: int, prefix: int) -> None:
        span = 1 << (nbits - depth)
        first = prefix * span
        if first >= dom.k:
            return
        level = node.level
        if depth == nbits or level > levels[-1]:
            out.append((first, min(first + span, dom.k) - 1, node))
            return
        if level == levels[depth]:
            lo, hi = branches(node)
        else:  # node does not test this bit
            lo = hi = node
        walk(lo, depth + 1, prefix * 2)
        walk(hi, depth + 1, prefix * 2 + 1)

    walk(u, 0, 0)
    return out


def leaf_atoms(r: RuleBDD, node: cudd.Function) -> frozenset:
    """The atoms of a leaf node (a minterm over the atom variables)."""
    if not r.atom_vars:
        return frozenset()
    assignment = r.bdd.pick(node, care_vars=list(r.atom_vars.values()))
    if assignment is None:
        raise ValueError("leaf node is false: no packet reaches it")
    return frozenset(a for a, v in r.atom_vars.items() if assignment[v])


def to_dot(r: RuleBDD, max_nodes: int = 50_000) -> str:
    """The BDD of F as Graphviz dot (complement edges expanded; dashed edges are 0-branches).

    Raises ValueError when the expanded graph would have more than ``max_nodes`` nodes.
    """
    names: dict[int, str] = {}
    nodes, edges = [], []

    def name(u: cudd.Function) -> str:
        key = int(u)
        if key not in names:
            if len(names) >= max_nodes:
                raise ValueError(f"BDD has more than {max_nodes} nodes; not writing dot")
            names[key] = f"n{len(names)}"
            stack.append(u)
        return names[key]

    stack: list[cudd.Function] = []
    name(r.root)
    while stack:
        u = stack.pop()
        nid = names[int(u)]
        if u == r.bdd.true or u == r.bdd.false:
            nodes.append(f'  {nid} [shape=box, label="{1 if u == r.bdd.true else 0}"];')
            continue
        nodes.append(f'  {nid} [label="{u.var}"];')
        lo, hi = branches(u)
        edges.append(f"  {nid} -> {name(lo)} [style=dashed];")
        edges.append(f"  {nid} -> {name(hi)};")
    return "\n".join(["digraph subc_bdd {", "  node [shape=circle, fontsize=10];", *nodes, *edges, "}"]) + "\n"
