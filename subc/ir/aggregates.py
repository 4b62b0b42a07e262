"""The stateful pass: comparisons on state -> aggregate instances, update rules, state values.

Semantics (docs/state.md "Stateful subscriptions"; the reference is
:mod:`subc.semantics.stateful_reference`): every rule has its own aggregates; a message updates a
rule's aggregates when it matches the rule's *stateless part* (its condition holds for some truth
values of its comparisons on state), and its comparisons see the aggregates after that update.
Aggregates of one function, field and window whose rules have the same stateless part (as
written, literals compared by value) always hold equal values, so they share one *aggregate
instance*: one set of registers.

The pass rewrites the rules so that the slicer (:mod:`.layered`) sees header fields only:

* each instance's **update rule**: its stateless part, with the atom ``('subc_update', k)``;
  after the header fields every state of the diagram knows which of these matched (they test
  header fields only), and :func:`boundary_updates` reads that set off the leaves;
* each comparison on state becomes a predicate on a **state value**, a range field of the
  pseudo-header :data:`STATE_HEADER` placed after every header field (as Camus places its
  stateful metadata).  The value a target computes after the update is:

  ======== ================ ==========================================================
  count    64 bits          the count
  sum      64 bits          the sum, saturating at 2**64 - 1
  min, max width + 1 bits   0 for an empty window, else the extreme + 1
  avg      2 bits per       0 empty window, 1 below, 2 equal, 3 above the threshold X:
           threshold        the sign of the excess ``sum(f - X)`` (no division)
  counter  64 bits          the named counter, before the message's own updates
  ======== ================ ==========================================================

Named counters (``@pragma query_counter``) are instances of kind ``counter``, one per counter the
rules compare or update, shared by every rule.  Their updates are actions: each distinct update
atom ``('subc_count', counter, field)`` is a :class:`CountUpdate`; the atoms stay on the leaves
(a rule that updates a counter may compare it), and :func:`leaf_count_masks` reads each leaf's
set of updates, which a target applies after the last stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Sequence

from ..errors import Location
from .decisions import COUNT_ATOM, UPDATE_ATOM
from ..lang.ast import COUNTER, And, Action, Aggregate, Expr, Not, Operand, Or, Pred, Rule, StatePred, state_predicates
from ..lang.rule_store import RuleStore, distinct_atom_sets, unshaped_rules
from ..spec.model import QueryField, Spec


#: The pseudo-header instance of the state values.
STATE_HEADER = "subc_state"
#: A condition every message satisfies.
TRUE: Expr = And(())


@dataclass(frozen=True)
class AggregateInstance:
    """The registers of one aggregate: ``index`` (bit ``index`` of the update mask), ``kind``,
    the aggregated ``field`` (None for ``count()``), ``window_ns`` (0: never ends), the
    ``thresholds`` its ``avg`` comparisons use (one excess register each), the ``rules`` (indices)
    that share it, and ``update``, its stateless part as written (located; a condition no
    message meets for a named counter, which actions update), and a named counter's ``name``."""

    index: int
    kind: str
    field: QueryField | None
    window_ns: int
    thresholds: tuple[int, ...]
    rules: tuple[int, ...]
    update: Expr
    name: str | None = None

    def as_json(self) -> dict:
        """The instance as ``maps.json`` and ``entries.json`` describe it: ``index``, ``kind``,
        ``field`` (or null), ``window_ns``, ``thresholds`` and, for a named counter, ``name``."""
        return {
            "index": self.index,
            "kind": self.kind,
            "field": self.field.name if self.field else None,
            "window_ns": self.window_ns,
            "thresholds": list(self.thresholds),
            **({"name": self.name} if self.name is not None else {}),
        }


@dataclass(frozen=True)
class StateValue:
    """A state value that a stage matches: the pseudo-field ``field`` (range, in
    :data:`STATE_HEADER`), computed from ``instance`` (for ``avg``: against ``threshold``)."""

    field: QueryField
    instance: int
    threshold: int | None = None


@dataclass(frozen=True)
class CountUpdate:
    """Update ``index`` of the named counters (bit ``index`` of a leaf's count mask): add 1
    (``field`` None) or the message's ``field`` to the counter of instance ``instance``."""

    index: int
    instance: int
    field: QueryField | None


@dataclass(frozen=True)
class StatePlan:
    """What a target keeps and computes for the rule set's comparisons on state.

    ``instances`` and ``values`` as above; ``time_field`` (a query field, or None: arrival time)
    in units of ``time_unit_ns``; ``boundary``, the index of the first stage on a state value
    (the number of header-field stages); ``updates`` (input state of that stage, mask of the
    instances it updates), sorted, for the states whose mask is not 0; ``count_updates``, the
    named counters' updates, and ``leaf_counts`` (leaf state, mask of the count updates its
    message applies), sorted, for the leaves whose mask is not 0."""

    instances: tuple[AggregateInstance, ...]
    values: tuple[StateValue, ...]
    time_field: QueryField | None
    time_unit_ns: int
    boundary: int = 0
    updates: tuple[tuple[int, int], ...] = ()
    count_updates: tuple[CountUpdate, ...] = ()
    leaf_counts: tuple[tuple[int, int], ...] = ()

    @property
    def mask_width(self) -> int:
        """Bits of an update mask (at least 1)."""
        return max(1, len(self.instances))

    @property
    def count_width(self) -> int:
        """Bits of a leaf's count mask (at least 1)."""
        return max(1, len(self.count_updates))

    def value_of(self, name: str) -> StateValue:
        """The state value of pseudo-field ``name`` (KeyError when none)."""
        for v in self.values:
            if v.field.name == name:
                return v
        raise KeyError(name)


def is_state_field(name: str) -> bool:
    """True for the name of a state value's pseudo-field."""
    return name.startswith(STATE_HEADER + ".")


def _substitute(e: Expr, truth: dict[tuple, bool]) -> Expr | bool:
    """``e`` with each comparison on state replaced by its truth in ``truth`` (by key), simplified:
    True, False, or a condition on header fields only."""
    if isinstance(e, Pred):
        return e
    if isinstance(e, StatePred):
        return truth[e.key]
    if isinstance(e, Not):
        x = _substitute(e.item, truth)
        return (not x) if isinstance(x, bool) else Not(x)
    conj = isinstance(e, And)
    items = []
    for it in e.items:
        x = _substitute(it, truth)
        if isinstance(x, bool):
            if x != conj:  # False in a conjunction, True in a disjunction
                return x
            continue
        items.append(x)
    if not items:
        return conj
    return items[0] if len(items) == 1 else (And if conj else Or)(tuple(items))


def stateless_part(cond: Expr) -> Expr | bool:
    """The condition on header fields under which ``cond`` holds for some truth values of its
    comparisons on state (existential quantification over each distinct comparison, by key):
    True, False, or a condition.  2**n substitutions for n comparisons (at most
    :data:`~.ast.MAX_STATE_PREDICATES`)."""
    preds = state_predicates(cond)
    parts: list[Expr] = []
    for bits in product((False, True), repeat=len(preds)):
        x = _substitute(cond, {p.key: b for p, b in zip(preds, bits)})
        if x is True:
            return True
        if x is not False and x not in parts:
            parts.append(x)
    if not parts:
        return False
    return parts[0] if len(parts) == 1 else Or(tuple(parts))


def _unlocated(e: Expr) -> Expr:
    """``e`` without predicate locations (to compare stateless parts as written)."""
    if isinstance(e, Pred):
        return Pred(e.field, e.width, e.op, e.operands, None)
    if isinstance(e, Not):
        return Not(_unlocated(e.item))
    if isinstance(e, (And, Or)):
        return type(e)(tuple(_unlocated(x) for x in e.items))
    return e


def _values_pred(q: QueryField, op: str, values: Sequence[int], location=None) -> Pred:
    return Pred(q.name, q.width, op, tuple(Operand(v) for v in values), location)


def _encoded(p: StatePred, q: QueryField) -> Expr:
    """``p`` as a condition on its state value ``q`` (see the module docstring's encoding)."""
    kind, op, values, at = p.agg.kind, p.op, [o.value for o in p.operands], p.location
    if kind in ("count", "sum", COUNTER):
        return _values_pred(q, op, values, at)
    if kind == "avg":
        codes = {">": (3,), ">=": (2, 3), "<": (1,), "<=": (1, 2), "==": (2,), "!=": (1, 3)}[op]
        return _values_pred(q, "in", codes, at)
    shifted = [v + 1 for v in values]  # min, max: 0 is the empty window
    if op in ("==", "in", ">", ">="):
        return _values_pred(q, op, shifted, at)
    if op in ("!=", "not in"):
        return _values_pred(q, "not in", [0, *shifted], at)
    return And((_values_pred(q, "!=", [0], at), _values_pred(q, op, shifted, at)))


def plan_state(rules: Sequence[Rule], spec: Spec) -> tuple[Sequence[Rule], StatePlan | None, dict[str, QueryField]]:
    """The stateful pass (see the module docstring) over ``rules``.

    Returns (the rules to slice: each rule with its comparisons on state rewritten onto state
    values, then one update rule per instance, indexed after them; the plan without its
    ``boundary`` and ``updates``, which :func:`boundary_updates` fills in, or None when no rule
    compares state; the query fields with the state values' pseudo-fields added).  Rules without
    state are returned as they are (``rules`` itself when it is a list or a
    :class:`~subc.lang.rule_store.RuleStore` and no rule compares state)."""
    # the distinct atom sets first (rules share them): the same atoms in the same order
    atom_sets = distinct_atom_sets(rules)
    count_atoms = {a: None for atoms in atom_sets for a in atoms if a[0] == COUNT_ATOM}
    if not count_atoms and not any(state_predicates(r.core) for r in unshaped_rules(rules)):
        return (rules if isinstance(rules, (list, RuleStore)) else list(rules)), None, spec.query_fields
    keyed, per_rule = _group_instances(rules, spec, count_atoms)
    compared = {p.agg.name for _, preds, _ in per_rule for p in preds if p.agg.kind == COUNTER}
    instances, values, fields, value_of = _number_instances(keyed, compared, spec)
    rewritten: dict[int, Rule] = {}
    for r, _, inst_of in per_rule:
        cond = _rewrite(r.condition, inst_of, value_of)
        rewritten[r.index] = Rule(r.index, cond, r.actions, r.location, r.text)
    out = [rewritten.get(r.index, r) for r in rules] + _update_rules(rules, instances)
    counter_index = {i.name: i.index for i in instances if i.kind == COUNTER}
    count_updates = tuple(
        CountUpdate(j, counter_index[name], spec.query_fields[f] if f else None)
        for j, (_, name, f) in enumerate(count_atoms)
    )
    time_field = spec.query_fields[spec.time_field] if spec.time_field else None
    return (
        out,
        StatePlan(tuple(instances), tuple(values), time_field, spec.time_unit_ns, count_updates=count_updates),
        fields,
    )


def _group_instances(
    rules: Sequence[Rule], spec: Spec, count_atoms: dict
) -> tuple[dict[tuple, dict], list[tuple[Rule, list[StatePred], dict]]]:
    """The aggregate instances of ``rules``, before numbering: (key -> instance draft, a dict
    with ``agg``, ``part`` (the stateless part, False for a named counter), ``rules`` and
    ``thresholds``; per rule that compares state, (rule, its comparisons, aggregate -> its
    instance draft)).  A key is (aggregate, stateless part as written) or ("counter", name);
    the named counters of ``count_atoms`` that no rule compares get an instance too."""
    keyed: dict[tuple, dict] = {}  # (aggregate, stateless part as written) or counter name -> instance
    per_rule: list[tuple[Rule, list[StatePred], dict]] = []
    for r in rules:
        preds = state_predicates(r.core) if r.shape is None else []
        if not preds:
            continue
        part = stateless_part(r.core)
        key_part = _unlocated(part) if not isinstance(part, bool) else part
        inst_of: dict = {}
        for p in preds:
            counter = p.agg.kind == COUNTER  # one instance per counter, shared by every rule
            inst = keyed.setdefault(
                ("counter", p.agg.name) if counter else (p.agg, key_part),
                {"agg": p.agg, "part": False if counter else part, "rules": [], "thresholds": []},
            )
            if r.index not in inst["rules"]:
                inst["rules"].append(r.index)
            if p.agg.kind == "avg" and p.operands[0].value not in inst["thresholds"]:
                inst["thresholds"].append(p.operands[0].value)
            inst_of[p.agg] = inst
        per_rule.append((r, preds, inst_of))
    for _, name, _ in count_atoms:  # counters that are updated and never compared
        c = spec.counters[name]
        keyed.setdefault(
            ("counter", name),
            {"agg": Aggregate(COUNTER, None, 0, c.window_ns, name), "part": False, "rules": [], "thresholds": []},
        )
    return keyed, per_rule


def _number_instances(
    keyed: dict[tuple, dict], compared: set, spec: Spec
) -> tuple[list[AggregateInstance], list[StateValue], dict[str, QueryField], dict[tuple, QueryField]]:
    """The instance drafts of ``keyed`` numbered in order (each draft gets its ``index``), with
    their state values: (the instances, the state values, the query fields with the values'
    pseudo-fields added, (instance, threshold or None) -> pseudo-field).  A named counter not in
    ``compared`` (updated, never compared) has no state value."""
    instances: list[AggregateInstance] = []
    values: list[StateValue] = []
    fields = dict(spec.query_fields)
    value_of: dict[tuple, QueryField] = {}  # (instance, threshold) -> pseudo-field
    for k, inst in enumerate(keyed.values()):
        agg: Aggregate = inst["agg"]
        inst["index"] = k
        src = spec.query_fields[agg.field] if agg.field else None
        part = inst["part"]
        update = TRUE if part is True else part
        thresholds = tuple(sorted(inst["thresholds"]))
        instances.append(
            AggregateInstance(
                k,
                agg.kind,
                src,
                agg.window_ns,
                thresholds,
                tuple(inst["rules"]),
                update if part is not False else Or(()),
                agg.name,
            )
        )
        width = {"count": 64, "sum": 64, "avg": 2, COUNTER: 64}.get(agg.kind, agg.width + 1)
        if agg.kind == COUNTER and agg.name not in compared:
            continue  # updated, never compared: no state value
        for x in thresholds if agg.kind == "avg" else (None,):
            name = f"{STATE_HEADER}.v{len(values)}"
            q = QueryField(name, width, "range", src.location if src else spec_location(spec))
            fields[name] = q
            values.append(StateValue(q, k, x))
            value_of[(k, x)] = q
    return instances, values, fields, value_of


def _rewrite(e: Expr, inst_of: dict, value_of: dict[tuple, QueryField]) -> Expr:
    """``e`` with each comparison on state replaced by its condition on its state value
    (``inst_of``: aggregate -> numbered instance draft; ``value_of`` as :func:`_number_instances`)."""
    if isinstance(e, StatePred):
        k = inst_of[e.agg]["index"]
        x = e.operands[0].value if e.agg.kind == "avg" else None
        return _encoded(e, value_of[(k, x)])
    if isinstance(e, Not):
        return Not(_rewrite(e.item, inst_of, value_of))
    if isinstance(e, (And, Or)):
        return type(e)(tuple(_rewrite(x, inst_of, value_of) for x in e.items))
    return e


def _update_rules(rules: Sequence[Rule], instances: list[AggregateInstance]) -> list[Rule]:
    """One update rule per instance whose stateless part some message can meet, indexed after
    ``rules``: its stateless part, with the atom ``(UPDATE_ATOM, instance index)``, located at
    the instance's first rule."""
    out = []
    first = len(rules) and max(r.index for r in rules) + 1
    for instance in instances:
        if isinstance(instance.update, Or) and not instance.update.items:
            continue  # no message matches the stateless part: the aggregate stays empty
        r0 = next(r for r in rules if r.index == instance.rules[0])
        out.append(
            Rule(
                first + instance.index,
                instance.update,
                (Action(UPDATE_ATOM, (instance.index,), r0.location),),
                r0.location,
                r0.text,
            )
        )
    return out


def spec_location(spec: Spec) -> Location:
    """The location of the spec's first line (for pseudo-fields of ``count()``)."""
    return Location(spec.path, 1, 1, spec.text.split("\n", 1)[0])


def leaf_count_masks(plan: StatePlan, leaves) -> tuple[tuple[int, int], ...]:
    """(leaf state, mask of the :class:`CountUpdate` s its message applies) of every leaf of
    ``leaves`` (objects with ``state`` and ``atoms``) whose mask is not 0, sorted."""
    index = {
        (COUNT_ATOM, plan.instances[u.instance].name, u.field.name if u.field else None): u.index
        for u in plan.count_updates
    }
    out = []
    for leaf in leaves:
        mask = sum(1 << index[a] for a in leaf.atoms if a[0] == COUNT_ATOM)
        if mask:
            out.append((leaf.state, mask))
    return tuple(sorted(out))


def boundary_updates(sliced, boundary: int) -> tuple[tuple[int, int], ...]:
    """(input state of stage ``boundary``, update mask) of every state of ``sliced`` (a
    :class:`~.slicing.Sliced` of rules with update rules) at that boundary whose mask is not 0.

    An update rule tests header fields only, so at the boundary it has either matched or not:
    every leaf below a state carries the same update atoms, read off the first one reached."""
    stages = sliced.stages
    if boundary >= len(stages):
        return ()
    by_stage = [{st.state: st for st in s.states} for s in stages]
    leaves = {leaf.state: leaf.atoms for leaf in sliced.leaves}
    out = []
    for st in stages[boundary].states:
        node, i = st, boundary
        atoms: frozenset = frozenset()
        while True:
            t = next((t for _, _, t in node.runs if t), 0)
            i += 1
            if not t:
                break
            if i == len(stages):
                atoms = leaves[t]
                break
            node = by_stage[i][t]
        mask = sum(1 << a[1] for a in atoms if a[0] == UPDATE_ATOM)
        if mask:
            out.append((st.state, mask))
    return tuple(sorted(out))
