"""The compiler driver: rules + spec -> field order -> slicing -> IR -> the target's lowering.

For every candidate field order the rules are sliced (:mod:`.layered`) and frozen with their
decisions into the target-neutral IR (:mod:`.ir`; the decision semantics are
:mod:`.decisions`); the target's cost model (:mod:`.costs`) picks the order.  The P4 back end's
match-action pipeline (:mod:`.tables`) is the lowering of the chosen IR.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

from ..errors import SubcError
from ..ir.aggregates import is_state_field, plan_state
from ..lang.ast import Rule
from ..ir.bdd import RuleBDD, build_bdd, fields_used
from .costs import ebpf_cost, p4_cost
from .gcpause import paused_gc
from ..ir.stages import SubscriptionIR, build_ir
from ..ir.layered import SliceBudgetExceeded, StateLimitExceeded, slice_rules
from ..lang.limits import DEFAULT_LIMITS, Limits
from ..lang.rule_store import RuleStore
from ..spec.parse_graph import check_parsed
from ..spec.model import QueryField, Spec
from ..backends.p4.tables import Pipeline, build_pipeline
from .target import P4_TARGETS, Target, target_of

EXHAUSTIVE_ORDER_FIELDS = 4
#: Above this many rules only the heuristic field order is compiled (each order is a compile).
ORDER_SEARCH_MAX_RULES = 20_000
#: A candidate field order is abandoned once slicing it visits this many times the items that the
#: best candidate so far needed (see :func:`~.layered.slice_rules`).
ORDER_SEARCH_WORK_FACTOR = 8


@dataclass
class CompileResult:
    """What :func:`compile_rules` returns: the IR in the chosen field order and what produced it,
    with phase timings (s)."""

    ir: SubscriptionIR
    rules: Sequence[Rule]
    spec: Spec
    target: str
    phases: dict[str, float] = field(default_factory=dict)
    orders_tried: int = 1
    range_form: str = "auto"
    #: declared P4 table sizes as a multiple of the entries
    capacity_factor: float = 2.0
    #: the least width of the P4 state field (bits)
    state_bits: int = 0
    #: the rules as sliced (comparisons on state rewritten, update rules added:
    #: :func:`~.aggregates.plan_state`) and the fields they test, when the rules compare state
    sliced_rules: Sequence[Rule] | None = None
    fields: dict[str, QueryField] | None = None
    #: the pipeline the field-order search built for the IR it kept (:attr:`pipeline`)
    searched_pipeline: Pipeline | None = field(default=None, repr=False, compare=False)

    @cached_property
    def pipeline(self) -> Pipeline:
        """The P4 match-action pipeline of the IR (:func:`~.tables.build_pipeline`) for the target
        ('bmv2' for the eBPF target, whose table view the table simulator and ``simulate`` use);
        the one the field-order search built when it built one."""
        if self.searched_pipeline is not None:
            return self.searched_pipeline
        p4_target = self.target if self.target in P4_TARGETS else Target.BMV2
        return build_pipeline(self.ir, self.spec, p4_target, self.range_form, self.capacity_factor, self.state_bits)

    @cached_property
    def rbdd(self) -> RuleBDD:
        """The global BDD of the rules in the chosen field order, built on first use (``--dot``):
        the compiler slices without it (:mod:`.layered`), to the same stages."""
        if self.sliced_rules is not None:
            assert self.fields is not None  # set with sliced_rules
            return build_bdd(self.sliced_rules, self.fields, self.ir.field_order)
        return build_bdd(self.rules, self.spec.query_fields, self.ir.field_order)

    @property
    def diagram_states(self) -> int:
        """States of the sliced diagram: every stage's input states plus the leaves."""
        return self.ir.diagram_states


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


def _build(rules, spec, order, target, range_form="auto", max_work=None, limits=DEFAULT_LIMITS, plan=None, fields=None):
    """One candidate field order: (IR, cost, P4 pipeline or None, phase times in s); ``plan`` and
    ``fields`` those of :func:`~.aggregates.plan_state` when the rules compare state.

    Raises :class:`~.layered.SliceBudgetExceeded` past ``max_work``,
    :class:`~.layered.StateLimitExceeded` past ``limits`` (see :func:`slice_rules`), and
    :class:`SubcError` for conflicting actions (:func:`~.ir.build_ir`)."""
    t0 = time.perf_counter()
    sliced = slice_rules(rules, fields or spec.query_fields, order, max_work, limits)
    t1 = time.perf_counter()
    ir = build_ir(sliced, rules, spec, plan)
    cost: tuple[int, ...]  # (compared between candidates: least first)
    pipe: Pipeline | None
    if target == Target.EBPF:
        cost, pipe = ebpf_cost(ir), None
    else:
        cost, pipe = p4_cost(ir, spec, target, range_form)
    t2 = time.perf_counter()
    return ir, cost, pipe, {"slicing": t1 - t0, "tables": t2 - t1}


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
    capacity_factor: float = 2.0,
    state_bits: int = 0,
) -> CompileResult:
    """Compile ``rules`` for ``target`` ('bmv2', 'tofino' or 'ebpf': :class:`~.target.Target`).

    The field order is ``field_order`` when given, else the candidate (see
    :func:`candidate_orders`) of least cost under the target's cost model (:mod:`.costs`: P4 table
    entries, or BPF map entries then lookup steps; ties: first candidate; a candidate
    whose slicing costs :data:`ORDER_SEARCH_WORK_FACTOR` times the best one's is abandoned);
    above :data:`ORDER_SEARCH_MAX_RULES` rules, the first (heuristic) candidate only.
    ``range_form``, ``capacity_factor`` (declared P4 table sizes per entry) and ``state_bits``
    (the least width of the state field) are passed to
    :func:`~subc.backends.p4.tables.build_pipeline`.  Raises
    :class:`SubcError` for conflicting actions, a bad field order, or a field the spec's parser never
    extracts or extracts past a construct the decoder cannot follow
    (:func:`~subc.spec.parse_graph.check_parsed`), and
    :class:`~.layered.StateLimitExceeded` when every candidate order needs more states than
    ``limits`` allow (a candidate over the limit is skipped when another fits).
    """
    target = target_of(target)
    if not isinstance(rules, (list, RuleStore)):
        rules = list(rules)  # (a million rules: 8 MB a copy; a store answers from its columns)
    sliced_rules, plan, fields = plan_state(rules, spec)
    used = [f for f in fields_used(sliced_rules) if not is_state_field(f)]
    after: list[str] = []  # the state values' stages come after every header field's
    needed = list(used)
    if plan is not None:
        after = [v.field.name for v in plan.values]
        needed += [i.field.name for i in plan.instances if i.field is not None]
        needed += [u.field.name for u in plan.count_updates if u.field is not None]
        needed += [plan.time_field.name] if plan.time_field is not None else []
    check_parsed(spec, list(dict.fromkeys(needed)))
    t0 = time.perf_counter()
    if field_order is not None:
        orders = [resolve_order(field_order, spec, used)]
    else:
        orders = candidate_orders(used, spec)
        if len(rules) > ORDER_SEARCH_MAX_RULES:
            orders = orders[:1]
    orders = [o + after for o in orders]
    best = None
    too_big: StateLimitExceeded | None = None
    with paused_gc():
        for order in orders:
            # a candidate is dropped once slicing it costs ORDER_SEARCH_WORK_FACTOR times the best
            # candidate's work: a heuristic cut (such an order has far larger states)
            budget = None if best is None else ORDER_SEARCH_WORK_FACTOR * best[0].work + 10_000
            try:
                built = _build(
                    sliced_rules,
                    spec,
                    order,
                    target,
                    range_form,
                    budget,
                    limits,
                    plan,
                    fields if plan is not None else None,
                )
            except SliceBudgetExceeded:
                continue
            except StateLimitExceeded as e:
                too_big = too_big or e
                continue
            if best is None or built[1] < best[1]:
                best = built
    if best is None:
        assert too_big is not None  # the first candidate has no work budget: it was built, or too big
        raise too_big
    ir, _, pipe, phases = best
    # the order search is the time spent on the candidates that were not kept
    phases = {"order_search": time.perf_counter() - t0 - sum(phases.values()), **phases}
    res = CompileResult(ir, rules, spec, target, phases, len(orders), range_form, capacity_factor, state_bits)
    if plan is not None:
        res.sliced_rules, res.fields = sliced_rules, fields
    if pipe is not None and pipe.state_width >= state_bits:
        for t in pipe.tables:
            t.capacity_factor = capacity_factor
        res.searched_pipeline = pipe  # the winner's lowering, as the property would build it
    return res
