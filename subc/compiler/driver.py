"""The compiler driver: rules + spec -> field order -> BDD -> stages -> match-action pipeline.

Semantics (Camus): a packet gets the actions of every rule it matches; several ``fwd`` merge
into one port set (one port: unicast, several: a multicast group); a ``fwd`` together with a
non-forwarding action, or two different non-forwarding actions, on one packet is an error that
names both rules; a packet that matches no rule gets the spec's default action.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

from ..errors import SubcError
from .ast import Rule, evaluate
from .bdd import RuleBDD, build_bdd, fields_used
from .gcpause import paused_gc
from .layered import SliceBudgetExceeded, StateLimitExceeded, slice_rules
from .limits import DEFAULT_LIMITS, Limits
from .parse_graph import check_parsed
from .slicing import Sliced
from .spec import Spec
from .tables import Pipeline, build_pipeline

EXHAUSTIVE_ORDER_FIELDS = 4
#: Above this many rules only the heuristic field order is compiled (each order is a compile).
ORDER_SEARCH_MAX_RULES = 20_000
#: A candidate field order is abandoned once slicing it visits this many times the items that the
#: best candidate so far needed (see :func:`~.layered.slice_rules`).
ORDER_SEARCH_WORK_FACTOR = 8


@dataclass
class CompileResult:
    """What :func:`compile_rules` returns: the pipeline and what produced it, with timings (s)."""

    pipeline: Pipeline
    rules: list[Rule]
    spec: Spec
    sliced: Sliced
    target: str
    phases: dict[str, float] = field(default_factory=dict)
    orders_tried: int = 1

    @cached_property
    def rbdd(self) -> RuleBDD:
        """The global BDD of the rules in the chosen field order, built on first use (``--dot``):
        the compiler slices without it (:mod:`.layered`), to the same stages."""
        return build_bdd(self.rules, self.spec.query_fields, self.pipeline.field_order)

    @property
    def diagram_states(self) -> int:
        """States of the sliced diagram: every stage's input states plus the leaves."""
        return sum(len(st.states) for st in self.sliced.stages) + len(self.sliced.leaves)


def default_action_of(spec: Spec) -> tuple[str, tuple]:
    """The leaf table's default action for the spec's ``query_default_action``."""
    name = spec.default_action
    return {"drop": ("subc_drop", ()), "nop": ("subc_nop", ())}.get(name, (name, ()))


def describe_atom(atom: tuple) -> str:
    """An action atom as a rule writes it: ``fwd(3)``, ``drop()``, ``name(arg, ...)``."""
    if atom[0] == "fwd":
        return f"fwd({atom[1]})"
    return f"{atom[0]}({', '.join(str(a) for a in atom[1:])})"


def check_leaf(atoms: frozenset, example: dict[str, int], rules: Sequence[Rule]) -> None:
    """Raise SubcError when a leaf's atoms cannot be applied together (see the module docstring)."""
    ports = [a for a in atoms if a[0] == "fwd"]
    others = sorted((a for a in atoms if a[0] != "fwd"), key=repr)
    if not others or (not ports and len(others) == 1):
        return
    first = ports[0] if ports else others[0]
    second = others[0] if ports else others[1]
    matched = [r for r in rules if evaluate(r.condition, example)]
    r1 = next(r for r in matched if first in r.atoms())
    r2 = next(r for r in matched if second in r.atoms() and (r is not r1 or first in r.atoms()))
    pkt = ", ".join(f"{k}={v}" for k, v in sorted(example.items()))
    where1 = f"{r1.location.path}:{r1.location.line}"
    err = SubcError(
        f"conflicting actions: {describe_atom(second)} of this rule and {describe_atom(first)} of the rule at {where1} "
        f"apply to the same packet ({pkt}); a packet can be forwarded or get one other action, not both",
        r2.location,
        notes=[f"{where1}: {r1.text.strip()}"],
    )
    err.example = dict(example)
    err.rules = (r1.index, r2.index)
    raise err


def _leaf_tables(sliced: Sliced, rules: Sequence[Rule], spec: Spec):
    leaf_actions: dict[int, tuple[str, tuple]] = {}
    groups: dict[tuple[int, ...], int] = {}
    atoms_by_leaf: dict[int, frozenset] = {}
    for leaf in sliced.leaves:
        check_leaf(leaf.atoms, leaf.example, rules)
        atoms_by_leaf[leaf.state] = leaf.atoms
        ports = tuple(sorted(a[1] for a in leaf.atoms if a[0] == "fwd"))
        if len(ports) == 1:
            leaf_actions[leaf.state] = ("subc_fwd", (("port", ports[0]),))
        elif ports:
            gid = groups.setdefault(ports, len(groups) + 1)
            leaf_actions[leaf.state] = ("subc_mcast", (("group", gid),))
        else:
            (atom,) = leaf.atoms
            if atom[0] == "drop":
                leaf_actions[leaf.state] = ("subc_drop", ())
            else:
                params = tuple((p, v) for (p, _), v in zip(spec.actions[atom[0]].params, atom[1:]))
                leaf_actions[leaf.state] = (atom[0], params)
    mcast = {gid: ports for ports, gid in groups.items()}
    return leaf_actions, mcast, atoms_by_leaf


def resolve_order(names: Sequence[str], spec: Spec, used: Sequence[str]) -> list[str]:
    """Resolve a user field order (bare or 'h.f' names); it must list every used field once."""
    out = []
    for n in names:
        q = spec.resolve_field(n)
        if q is None:
            raise SubcError(f"--field-order: unknown field '{n}'")
        if q.name in out:
            raise SubcError(f"--field-order: field '{q.name}' is listed twice")
        out.append(q.name)
    missing = [f for f in used if f not in out]
    if missing:
        raise SubcError(f"--field-order misses field(s) the rules use: {', '.join(missing)}")
    return [f for f in out if f in used]


def _build(rules, spec, order, target, range_form="auto", max_work=None, limits=DEFAULT_LIMITS):
    """One compilation in a given field order: (sliced stages, pipeline, phase times in s).

    Raises :class:`~.layered.SliceBudgetExceeded` past ``max_work`` and
    :class:`~.layered.StateLimitExceeded` past ``limits`` (see :func:`slice_rules`)."""
    t0 = time.perf_counter()
    sliced = slice_rules(rules, spec.query_fields, order, max_work, limits)
    t1 = time.perf_counter()
    leaf_actions, mcast, atoms = _leaf_tables(sliced, rules, spec)
    headers = list(dict.fromkeys(f.split(".")[0] for f in order))
    hdr = spec.parser.hdr if spec.parser else "hdr"
    meta = spec.parser.meta if spec.parser and spec.parser.meta else "meta"
    pipe = build_pipeline(sliced, leaf_actions, mcast, default_action_of(spec), atoms, headers, target, hdr, meta, range_form)
    t2 = time.perf_counter()
    return sliced, pipe, {"slicing": t1 - t0, "tables": t2 - t1}


def candidate_orders(used: Sequence[str], spec: Spec) -> list[list[str]]:
    """Field orders to try: all permutations for few fields, else a heuristic order and its
    neighbours (adjacent swaps).  The heuristic puts exact fields first (equality splits the rule
    set most), then fields by the number of distinct bounds, fewest first."""
    if len(used) <= EXHAUSTIVE_ORDER_FIELDS:
        return [list(p) for p in itertools.permutations(used)]
    kind_rank = {"exact": 0, "lpm": 1, "range": 2}
    base = sorted(used, key=lambda f: (kind_rank[spec.query_fields[f].match_kind], used.index(f)))
    out = [base]
    for i in range(len(base) - 1):
        o = list(base)
        o[i], o[i + 1] = o[i + 1], o[i]
        out.append(o)
    return out


def compile_rules(
    rules: Sequence[Rule],
    spec: Spec,
    target: str = "bmv2",
    field_order: Sequence[str] | None = None,
    range_form: str = "auto",
    limits: Limits = DEFAULT_LIMITS,
) -> CompileResult:
    """Compile ``rules`` for ``target`` ('bmv2', 'tofino' or 'ebpf').

    The field order is ``field_order`` when given, else the candidate (see
    :func:`candidate_orders`) with the fewest table entries (ties: first candidate; a candidate
    whose slicing costs :data:`ORDER_SEARCH_WORK_FACTOR` times the best one's is abandoned);
    above :data:`ORDER_SEARCH_MAX_RULES` rules, the first (heuristic) candidate only.
    ``range_form`` is passed to :func:`~subc.compiler.tables.build_pipeline`.  Raises
    :class:`SubcError` for conflicting actions, a bad field order, or a field the spec's parser never
    extracts or extracts past a construct the decoder cannot follow
    (:func:`~subc.compiler.parse_graph.check_parsed`), and
    :class:`~.layered.StateLimitExceeded` when every candidate order needs more states than
    ``limits`` allow (a candidate over the limit is skipped when another fits).
    """
    rules = list(rules)
    used = fields_used(rules)
    check_parsed(spec, list(used))
    t0 = time.perf_counter()
    if field_order is not None:
        orders = [resolve_order(field_order, spec, used)]
    else:
        orders = candidate_orders(used, spec)
        if len(rules) > ORDER_SEARCH_MAX_RULES:
            orders = orders[:1]
    best = None
    too_big: StateLimitExceeded | None = None
    with paused_gc():
        for order in orders:
            # a candidate is dropped once slicing it costs ORDER_SEARCH_WORK_FACTOR times the best
            # candidate's work: a heuristic cut (such an order has far larger states)
            budget = None if best is None else ORDER_SEARCH_WORK_FACTOR * best[0].work + 10_000
            try:
                built = _build(rules, spec, order, target, range_form, budget, limits)
            except SliceBudgetExceeded:
                continue
            except StateLimitExceeded as e:
                too_big = too_big or e
                continue
            if best is None or built[1].total_entries < best[1].total_entries:
                best = built
    if best is None:
        raise too_big
    sliced, pipe, phases = best
    # the order search is the time spent on the candidates that were not kept
    phases = {"order_search": time.perf_counter() - t0 - sum(phases.values()), **phases}
    return CompileResult(pipe, rules, spec, sliced, target, phases, len(orders))
