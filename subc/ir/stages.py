"""The target-neutral IR: what every back end (P4 for BMv2 and Tofino, eBPF) lowers.

The IR of a rule set in one field order is the sliced diagram (Algorithm 1 of Jepsen et al.,
"Packet Subscriptions for Programmable ASICs", HotNets 2018) with its decisions, frozen:

* per field, in order, a :class:`FieldStage`: the field (name, width in bits, match kind), the
  values and prefixes the rules mention, and for every input state its *runs* ``(lo, hi, next
  state)`` covering ``[0, 2**width - 1]``; state 0 is dead (no rule can match any more);
* the *leaves*: every final state with its :class:`~.decisions.Decision` (the rules' atoms
  combined by :mod:`.decisions`, conflicts refused when the IR is built) and the atoms;
* the spec's default decision, and the *action signatures* the decisions use, with parameter
  widths in bits.

The match forms of a state that back ends share (a per-state fallback for range fields, the miss
target for exact fields, the prefix entries of lpm fields) are those of :mod:`.lowering`, which
the live writers use too (:meth:`FieldStage.range_form`, :meth:`FieldStage.exact_form`,
:meth:`FieldStage.lpm_form`); how they become match-action table entries or BPF map entries is
each back end's business (:mod:`.tables`, :mod:`.targets.ebpf`), and so is the cost model the
field-order search uses (:mod:`.costs`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from ..errors import SubcError
from . import lowering
from .aggregates import StatePlan, boundary_updates, is_state_field, leaf_count_masks
from ..lang.ast import Rule, evaluate
from .decisions import (
    FWD,
    STATE_ATOMS,
    Decision,
    conflict_message,
    conflicting_pair,
    decide,
    default_decision_of,
    forwarding_ports,
)
from .slicing import Sliced
from ..spec.model import QueryField, Spec

#: Width in bits of a ``fwd`` port (a v1model and TNA egress port, an eBPF subscriber index < 512).
PORT_WIDTH = 9


@dataclass(frozen=True)
class StateRuns:
    """One input state of a stage: ``runs`` (lo, hi, next state) over the field's values, in value
    order, covering ``[0, 2**width - 1]``; adjacent runs lead to different states."""

    state: int
    runs: tuple[tuple[int, int, int], ...]

    def target(self, v: int) -> int:
        """The next state of value ``v`` (raises ValueError when no run holds it)."""
        i = bisect_right(self.runs, (v, float("inf"))) - 1
        if i >= 0 and self.runs[i][0] <= v <= self.runs[i][1]:
            return self.runs[i][2]
        raise ValueError(v)


def fallback_target(targets: Counter) -> int:
    """The next state that a per-state fallback entry should lead to, given how many entries each
    would save (:func:`.lowering.preferred_target`; ties to state 0, then the smallest)."""
    if not targets:
        return 0
    return lowering.preferred_target(dict(targets), {t: t for t in targets}, is_dead_state)


@dataclass(frozen=True)
class FieldStage:
    """The stage of one field: ``field`` (a :class:`~.spec.QueryField`: name, width in bits,
    match kind), ``mentioned`` (the (value, prefix length) operands of the rules on it),
    ``states`` (its input states, by number) and ``n_next`` (how many next states, not counting
    the dead state 0)."""

    field: QueryField
    mentioned: frozenset
    states: tuple[StateRuns, ...]
    n_next: int

    @property
    def exact_points(self) -> list[int]:
        """The whole values (prefix length = width) the rules mention, sorted."""
        w = self.field.width
        return sorted(v for v, plen in self.mentioned if plen == w)

    @property
    def prefixes(self) -> list[tuple[int, int]]:
        """The (value, prefix length) operands, sorted."""
        return sorted(self.mentioned)

    @staticmethod
    def range_form(st: StateRuns) -> tuple[list[tuple[int, int, int]], int]:
        """Range entries of a state: (the runs that differ from its fallback, fallback target);
        a range table holds these above one full-range fallback entry, none when the fallback is
        state 0 (:func:`.lowering.range_form`)."""
        return lowering.range_form(st.runs, is_dead_state)

    @staticmethod
    def exact_form(st: StateRuns) -> tuple[list[tuple[int, int]], int]:
        """Exact entries of a state: ([(value, next state)] of the values whose next state is not
        the miss target, miss target) (:func:`.lowering.exact_form`)."""
        return lowering.exact_form(st.runs, is_dead_state)

    @staticmethod
    def lpm_form(st: StateRuns, width: int) -> list[tuple[int, int, int]]:
        """Lpm entries of a state: the fewest [(value, prefix length, next state)] whose longest
        match gives every value its next state, none matching meaning state 0
        (:func:`.lowering.lpm_form`)."""
        return lowering.lpm_form(st.runs, width, is_dead_state)


def is_dead_state(state: int) -> bool:
    """Whether next state ``state`` is the dead state 0 of a stage."""
    return state == 0


@dataclass(frozen=True)
class LeafDecision:
    """A final state: its ``decision``, the :attr:`atoms` of the rules that reach it, and
    ``example``, one packet ({field: value}) that reaches it.

    ``other_atoms`` holds the atoms when they are not those of the decision's ports, None when
    they are (``('fwd', port)`` per port: a forwarding leaf keeps its sorted ports only, where a
    frozenset of its atoms would take 4 KB for a hundred ports)."""

    state: int
    decision: Decision
    other_atoms: tuple | None
    example: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def atoms(self) -> frozenset:
        """The atoms of the rules that reach this leaf (built on each call)."""
        if self.other_atoms is None:
            return frozenset((FWD, p) for p in self.decision.ports)
        return frozenset(self.other_atoms)


@dataclass(frozen=True)
class ActionSignature:
    """An action a decision uses: ``name`` and its ``params`` ((name, width in bits), ...).
    ``fwd`` has one parameter, a port of :data:`PORT_WIDTH` bits, per port."""

    name: str
    params: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class SubscriptionIR:
    """The IR (see the module docstring).  ``root_state`` is 1, or 0 when no packet can match;
    ``headers`` are the header instances of the fields, in field order; ``work`` counts the
    slicer's item visits (the order search's budget; not compared)."""

    stages: tuple[FieldStage, ...]
    leaves: tuple[LeafDecision, ...]
    root_state: int
    default: Decision
    actions: tuple[ActionSignature, ...]
    headers: tuple[str, ...]
    work: int = field(default=0, compare=False)
    #: the registers and state values of comparisons on state (None: a stateless rule set); its
    #: state-value stages come after every header-field stage
    state: StatePlan | None = None

    @property
    def field_order(self) -> list[str]:
        """The fields in stage order ('instance.field')."""
        return [s.field.name for s in self.stages]

    @property
    def diagram_states(self) -> int:
        """States of the sliced diagram: every stage's input states plus the leaves."""
        return sum(len(st.states) for st in self.stages) + len(self.leaves)

    @property
    def port_sets(self) -> list[tuple[int, ...]]:
        """The distinct sets of two or more ports of the leaf decisions (multicast groups on a
        switch), in leaf order."""
        return list(dict.fromkeys(leaf.decision.ports for leaf in self.leaves if len(leaf.decision.ports) > 1))


class ConflictError(SubcError):
    """Rules whose actions conflict on some packet: ``example`` (field -> value) is one such
    packet, ``rules`` the indexes of the two rules (the first named in a note, the second
    pointed at)."""

    def __init__(self, message: str, location, notes: list[str], example: dict[str, int], rules: tuple[int, int]):
        super().__init__(message, location, notes)
        self.example = example
        self.rules = rules

    def __reduce__(self):
        return type(self), (self.message, self.location, self.notes, self.example, self.rules)


def _conflict_error(pair: tuple[tuple, tuple], example: dict[str, int], rules: Sequence[Rule]) -> ConflictError:
    """The error for conflicting atoms ``pair`` of a leaf reached by ``example``: it points at
    the rule of the second atom and names the rule of the first."""
    first, second = pair
    matched = [r for r in rules if evaluate(r.condition, example)]
    r1 = next(r for r in matched if first in r.atoms())
    r2 = next(r for r in matched if second in r.atoms() and (r is not r1 or first in r.atoms()))
    pkt = ", ".join(f"{k}={v}" for k, v in sorted(example.items()))
    where1 = f"{r1.location.path}:{r1.location.line}"
    return ConflictError(
        conflict_message(second, first, pkt, where1),
        r2.location,
        [f"{where1}: {r1.text.strip()}"],
        dict(example),
        (r1.index, r2.index),
    )


def build_ir(sliced: Sliced, rules: Sequence[Rule], spec: Spec, plan: StatePlan | None = None) -> SubscriptionIR:
    """Freeze ``sliced`` (from :func:`~.layered.slice_rules`) with its decisions into the IR.

    With ``plan`` (:func:`~.aggregates.plan_state`; ``rules`` are then the rules it returned),
    the state atoms are taken off the leaves and become the plan's per-state update masks and
    per-leaf count masks.
    Raises :class:`SubcError` when a leaf's atoms conflict (:mod:`.decisions`), pointing at one
    of the two rules, naming the other, with an example packet."""
    stages = tuple(
        FieldStage(
            s.field,
            frozenset(s.domain.mentioned),
            tuple(StateRuns(st.state, tuple(st.runs)) for st in s.states),
            s.n_next,
        )
        for s in sliced.stages
    )
    default = default_decision_of(spec.default_action)
    leaves = []
    used: dict[str, ActionSignature] = {}
    for leaf in sliced.leaves:
        atoms = leaf.atom_items if plan is None else tuple(a for a in leaf.atom_items if a[0] not in STATE_ATOMS)
        ports = forwarding_ports(atoms)  # (most leaves: no conflict, the decision is the ports)
        if ports is not None:
            d = Decision(ports, None)
        else:
            pair = conflicting_pair(atoms)
            if pair is not None:
                raise _conflict_error(pair, leaf.example, rules)
            d = decide(atoms, default)
        # a forwarding leaf's atoms are its ports' (decide: no other atom goes with a fwd)
        leaves.append(LeafDecision(leaf.state, d, None if d.ports else atoms, leaf.example))
        if d.ports:
            if FWD not in used:
                used[FWD] = ActionSignature(FWD, (("port", PORT_WIDTH),))
            continue
        assert d.action is not None  # decide(): a decision that forwards nowhere has its action
        if d.action[0] in spec.actions:
            used.setdefault(d.action[0], ActionSignature(d.action[0], tuple(spec.actions[d.action[0]].params)))
        else:
            used.setdefault(d.action[0], ActionSignature(d.action[0]))
    da = spec.default_action
    if da not in used:
        used[da] = ActionSignature(da, tuple(spec.actions[da].params) if da in spec.actions else ())
    headers = tuple(dict.fromkeys(s.field.header for s in stages if not is_state_field(s.field.name)))
    if plan is not None:
        boundary = sum(1 for s in stages if not is_state_field(s.field.name))
        plan = StatePlan(
            plan.instances,
            plan.values,
            plan.time_field,
            plan.time_unit_ns,
            boundary,
            boundary_updates(sliced, boundary),
            plan.count_updates,
            leaf_count_masks(plan, sliced.leaves),
        )
        extra = [i.field.header for i in plan.instances if i.field is not None]
        extra += [u.field.header for u in plan.count_updates if u.field is not None]
        if plan.time_field is not None:
            extra.append(plan.time_field.header)
        headers = tuple(dict.fromkeys([*headers, *extra]))
    return SubscriptionIR(
        stages,
        tuple(leaves),
        sliced.root_state,
        default,
        tuple(sorted(used.values(), key=lambda a: a.name)),
        headers,
        sliced.work,
        plan,
    )
