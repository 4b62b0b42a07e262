"""The P4 back end's lowering of the IR (:mod:`.ir`) to match-action tables (BMv2 and Tofino).

Each field stage becomes a table keyed by ``(state: exact, field: <match kind>)`` whose actions
set the next state, except the last stage: its entries apply the packet's actions (egress port,
multicast group, drop, spec action) directly, so no leaf table keyed by the final state is needed
(one entry per leaf state fewer).  When rules update named counters the last stage sets the leaf
state too, and two tables keyed by it follow: :data:`COUNT_TABLE` (the counters' updates) and
``subc_leaf`` (the packet's actions).  State 0 is dead: every table's default action leads to state
0, and the last stage's default is the spec's default action, so no entry is ever written for a
dead path.  Match kinds and their entries:

* **range** (``query_field``): per state, the runs of the state; one target per state becomes a
  full-range fallback entry at lower priority (or nothing, when it is state 0), chosen to
  minimise entries.  Priorities follow P4Runtime: a larger number wins.
* **exact** (``query_field_exact``): per state, one entry per mentioned value whose next state
  differs from the state's *miss* target; the miss target (what every unmentioned value leads
  to) is an entry of a companion ``_miss`` table keyed by state alone, applied when the first
  misses.
* **lpm** (``query_field_lpm``): per state, one entry per prefix region whose target differs from
  its nearest enclosing entry's.
* **code** (Tofino only, for range fields, when it saves TCAM): a range table on the field alone
  maps each value to a small interval code, then an exact ``(state, code)`` table with a miss
  table, as for exact fields.  The TCAM cost compared is the prefix expansion of the range
  entries (:func:`~subc.ir.intervals.prefix_cover_count`).
"""

from __future__ import annotations

import math

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field as dc_field

from ...ir.aggregates import UPDATE_ATOM, StatePlan, is_state_field
from ...ir.decisions import COUNT_ATOM
from ...ir.intervals import prefix_cover_count
from ...ir.stages import FieldStage, LeafDecision, SubscriptionIR, fallback_target
from ...spec.model import Spec
from ...compiler.target import Target

MIN_ROOM = 16  # entries: the least size of a table declared with room for updates

NO_ACTION = ("NoAction", ())
FALLBACK_PRIORITY = 1
SPECIFIC_PRIORITY = 2


@dataclass(frozen=True)
class Key:
    """A table key: P4 expression ``name``, ``match_kind``, ``width`` in bits, query field (or None)."""

    name: str
    match_kind: str
    width: int
    field: str | None = None


@dataclass(frozen=True)
class Entry:
    """A table entry.

    ``match`` has one element per key: an int (exact), ``(lo, hi)`` (range), ``(value, prefix_len)``
    (lpm).  ``params`` is a tuple of (name, value); ``priority`` is set for tables with range keys
    (P4Runtime convention: larger wins).
    """

    match: tuple
    action: str
    params: tuple[tuple[str, int], ...] = ()
    priority: int | None = None


@dataclass
class Table:
    """A match-action table: ``role`` is 'stage', 'miss', 'code', 'update' (:data:`UPDATE_TABLE`),
    'count' (:data:`COUNT_TABLE`) or 'leaf' (keyed by the final state: when there is no field
    stage, or rules update named counters)."""

    name: str
    keys: list[Key]
    entries: list[Entry]
    default_action: tuple[str, tuple[tuple[str, int], ...]]
    role: str
    field: str | None = None
    actions: list[str] = dc_field(default_factory=list)
    tcam_words: int = 0
    capacity_factor: float = 1.0
    min_size: int = 0

    @property
    def size(self) -> int:
        """Declared table size: the entries (at least 1) at a ``capacity_factor`` of 1, else that
        factor times the entries, rounded up, and at least :data:`MIN_ROOM` (room for the
        entries an update writes before it deletes the old ones); at least ``min_size`` (a
        program whose entries ``subc serve`` writes: :mod:`.targets.serve_program`)."""
        n = len(self.entries)
        if self.capacity_factor <= 1:
            return max(1, n, self.min_size)
        return max(MIN_ROOM, math.ceil(n * self.capacity_factor), self.min_size)

    @property
    def entry_count(self) -> int:
        """Entries including the default action (which counts as one), unless the default is
        ``NoAction`` because a companion miss table decides what a miss does."""
        return len(self.entries) + (0 if self.default_action[0] == "NoAction" else 1)


@dataclass
class Step:
    """Apply ``table``; if it misses and ``on_miss`` is set, apply that table."""

    table: str
    on_miss: str | None = None


@dataclass
class Pipeline:
    """The compiled pipeline: tables in application order, steps, multicast groups and widths."""

    tables: list[Table]
    steps: list[Step]
    mcast_groups: dict[int, tuple[int, ...]]
    state_width: int
    code_width: int
    root_state: int
    field_order: list[str]
    match_forms: dict[str, str]
    headers: list[str]
    default_action: tuple[str, tuple[tuple[str, int], ...]]
    meta: str = "meta"
    hdr: str = "hdr"
    #: the registers and state values of comparisons on state (the IR's), or None
    state: StatePlan | None = None
    #: the IR's leaves (:attr:`leaf_atoms`)
    leaves: tuple[LeafDecision, ...] = dc_field(default=(), repr=False)

    @property
    def leaf_atoms(self) -> dict[int, frozenset]:
        """Leaf state -> the atoms of the rules that reach it (built on each call)."""
        return {leaf.state: leaf.atoms for leaf in self.leaves}

    def table(self, name: str) -> Table:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def total_entries(self) -> int:
        """Entries of all tables, each table's default action counting as one."""
        return sum(t.entry_count for t in self.tables)


def _table_base(field_name: str) -> str:
    if is_state_field(field_name):
        return "subc_" + field_name.split(".", 1)[1]
    return "subc_" + field_name.replace(".", "_")


def field_key_name(field_name: str, hdr: str, meta: str) -> str:
    """The P4 expression a stage matches for a field: ``hdr.h.f``, or ``meta.subc_vN`` for a
    state value (:mod:`.aggregates`)."""
    if is_state_field(field_name):
        return f"{meta}.subc_{field_name.split('.', 1)[1]}"
    return f"{hdr}.{field_name}"


#: The table applied before the first state-value stage (its action is :data:`UPDATE_ATOM`).
UPDATE_TABLE = "subc_state_update"


def update_table(plan: StatePlan, state_key: Key) -> Table:
    """:data:`UPDATE_TABLE`: the diagram's state before the first state-value stage ->
    ``subc_update(mask)``, the aggregate instances the message updates (default: none)."""
    entries = [Entry((s,), UPDATE_ATOM, (("mask", m),)) for s, m in plan.updates]
    return Table(UPDATE_TABLE, [state_key], entries, (UPDATE_ATOM, (("mask", 0),)), "update", None, [UPDATE_ATOM])


#: The table applied after the last stage when rules update named counters (action
#: :data:`~.decisions.COUNT_ATOM`); the leaf table ``subc_leaf`` follows it.
COUNT_TABLE = "subc_count_update"


def count_table(plan: StatePlan, state_key: Key) -> Table:
    """:data:`COUNT_TABLE`: a leaf state -> ``subc_count(mask)``, the named counters' updates
    (:class:`~.aggregates.CountUpdate`) its message applies (default: none)."""
    entries = [Entry((s,), COUNT_ATOM, (("mask", m),)) for s, m in plan.leaf_counts]
    return Table(COUNT_TABLE, [state_key], entries, (COUNT_ATOM, (("mask", 0),)), "count", None, [COUNT_ATOM])


def _state_entry(state: int, match, target: int, priority=None) -> Entry:
    return Entry((state, match), "subc_set_state", (("next_state", target),), priority)


def _code_form(stage: FieldStage) -> tuple[list[tuple[int, int, int]], dict[int, dict[int, int]], int]:
    """Interval codes of a range stage: (code runs [(lo, hi, code)], per state {code: target}, #codes)."""
    cuts = sorted({lo for st in stage.states for lo, _, _ in st.runs})
    top = stage.field.max_value
    segs = []
    for i, lo in enumerate(cuts):
        hi = cuts[i + 1] - 1 if i + 1 < len(cuts) else top
        segs.append((lo, hi, tuple(st.target(lo) for st in stage.states)))
    codes: dict[tuple, int] = {}
    runs: list[tuple[int, int, int]] = []
    for lo, hi, tup in segs:
        c = codes.setdefault(tup, len(codes))
        if runs and runs[-1][2] == c:
            runs[-1] = (runs[-1][0], hi, c)
        else:
            runs.append((lo, hi, c))
    per_state = {st.state: {c: tup[j] for tup, c in codes.items()} for j, st in enumerate(stage.states)}
    return runs, per_state, len(codes)


def p4_leaf_actions(ir: SubscriptionIR, spec: Spec) -> tuple[dict[int, tuple[str, tuple]], dict[int, tuple[int, ...]]]:
    """The P4 action of every leaf decision of ``ir`` and the multicast groups they use.

    Returns (leaf state -> (action, ((param, value), ...)), group id -> ports): one port is
    ``subc_fwd(port)``, several are ``subc_mcast(group)`` with groups numbered from 1 in leaf
    order (:attr:`~.ir.SubscriptionIR.port_sets`), ``drop`` is ``subc_drop``, a spec action
    keeps its name and gets its arguments as named parameters."""
    groups: dict[tuple[int, ...], int] = {}  # numbered as they come: ir.port_sets's order, each set hashed once
    out: dict[int, tuple[str, tuple]] = {}
    for leaf in ir.leaves:
        d = leaf.decision
        if len(d.ports) == 1:
            out[leaf.state] = ("subc_fwd", (("port", d.ports[0]),))
        elif d.ports:
            out[leaf.state] = ("subc_mcast", (("group", groups.setdefault(d.ports, len(groups) + 1)),))
        else:
            action = d.action
            assert action is not None  # a decision that forwards nowhere has its action
            if action[0] == "drop":
                out[leaf.state] = ("subc_drop", ())
            else:
                params = tuple((p, v) for (p, _), v in zip(spec.actions[action[0]].params, action[1:]))
                out[leaf.state] = (action[0], params)
    return out, {gid: ports for ports, gid in groups.items()}


def p4_default_action(spec: Spec) -> tuple[str, tuple]:
    """The last stage's default action for the spec's ``query_default_action``."""
    name = spec.default_action
    return {"drop": ("subc_drop", ()), "nop": ("subc_nop", ())}.get(name, (name, ()))


def _apply_leaf_actions(tables: list[Table], leaf_actions: dict[int, tuple[str, tuple]], default_action) -> None:
    """Make the last stage's tables apply the packets' actions: an entry that would set leaf state
    ``s`` applies ``leaf_actions[s]`` instead, and an entry or default that leads to the dead state
    applies ``default_action`` (a packet that reaches the dead state matched no rule)."""
    for t in tables:
        used = set()
        entries = []
        for e in t.entries:
            target = e.params[0][1]
            action, params = leaf_actions[target] if target else default_action
            used.add(action)
            entries.append(Entry(e.match, action, params, e.priority))
        t.entries = entries
        if t.default_action != NO_ACTION:
            t.default_action = default_action
            used.add(default_action[0])
        t.actions = sorted(used) or [default_action[0]]


def build_pipeline(
    ir: SubscriptionIR,
    spec: Spec,
    target: str = "bmv2",
    range_form: str = "auto",
    capacity_factor: float = 1.0,
    state_bits: int = 0,
) -> Pipeline:
    """Lower ``ir`` to the P4 match-action tables of ``target`` (see the module docstring).

    ``capacity_factor`` scales the declared table sizes (:attr:`Table.size`).  The state width
    has one bit more than the states need: an update over P4Runtime numbers its new states in
    the free half (:mod:`subc.dataplane.p4rt.plan`); ``state_bits`` widens it further (a program
    that rule sets with more states can be loaded into by updates).

    ``target`` 'tofino' enables the interval-code form of range fields where it needs fewer
    TCAM words; ``range_form`` 'direct' or 'code' forces one form of range fields on every
    target (for tests and tuning).  Header and metadata names come from the spec's parser.
    """
    leaf_actions, mcast_groups = p4_leaf_actions(ir, spec)
    default_action = p4_default_action(spec)
    hdr = spec.parser.hdr if spec.parser else "hdr"
    meta = spec.parser.meta if spec.parser and spec.parser.meta else "meta"
    # states are written by every stage but the last, which applies the packets' actions, unless
    # rules update named counters: then it writes the leaf state, which the count and leaf tables match
    counting = ir.state is not None and bool(ir.state.count_updates)
    max_state = max([1] + [s.n_next for s in (ir.stages if counting else ir.stages[:-1])])
    state_width = max(max(1, max_state.bit_length()) + 1, state_bits)
    state_key = Key(f"{meta}.subc_state", "exact", state_width)
    to_dead = ("subc_set_state", (("next_state", 0),))
    tables: list[Table] = []
    steps: list[Step] = []
    forms: dict[str, str] = {}
    code_width = 1
    for i, stage in enumerate(ir.stages):
        q = stage.field
        base = _table_base(q.name)
        fkey = lambda kind: Key(field_key_name(q.name, hdr, meta), kind, q.width, q.name)  # noqa: E731
        if ir.state is not None and i == ir.state.boundary:
            tables.append(update_table(ir.state, state_key))
            steps.append(Step(UPDATE_TABLE))
        lowered = _stage_tables(stage, _StageKeys(base, fkey, state_key, meta, to_dead), target, range_form)
        tables += lowered.tables
        steps += lowered.steps
        forms[q.name] = lowered.form
        code_width = max(code_width, lowered.code_width)
    # widths of code keys are known only now
    for t in tables:
        t.keys = [
            Key(k.name, k.match_kind, code_width, k.field) if k.name.endswith(".subc_code") else k for k in t.keys
        ]
    if ir.stages and not counting:
        last = ir.stages[-1].field.name
        _apply_leaf_actions([t for t in tables if t.field == last and t.role != "code"], leaf_actions, default_action)
    else:  # no field to match (no rules: the root state alone decides), or counters to update
        if counting:
            assert ir.state is not None  # counting: the rules update named counters of the state plan
            tables.append(count_table(ir.state, state_key))
            steps.append(Step(COUNT_TABLE))
        leaf_entries = [Entry((s,), a, p) for s, (a, p) in sorted(leaf_actions.items())]
        actions = sorted({a for a, _ in leaf_actions.values()} | {default_action[0]})
        tables.append(Table("subc_leaf", [state_key], leaf_entries, default_action, "leaf", None, actions))
        steps.append(Step("subc_leaf"))
    for t in tables:
        t.capacity_factor = capacity_factor
    return Pipeline(
        tables=tables,
        steps=steps,
        mcast_groups=mcast_groups,
        state_width=state_width,
        code_width=code_width,
        root_state=ir.root_state,
        field_order=[s.field.name for s in ir.stages],
        match_forms=forms,
        headers=list(ir.headers),
        default_action=default_action,
        leaves=ir.leaves,
        meta=meta,
        hdr=hdr,
        state=ir.state,
    )


@dataclass
class _StageKeys:
    """What a field stage's tables are named and keyed by: ``base`` (table name), ``field_key``
    (match kind -> the field's key), ``state_key``, the metadata struct ``meta``, and ``to_dead``
    (the action that leads to the dead state)."""

    base: str
    field_key: Callable[[str], Key]
    state_key: Key
    meta: str
    to_dead: tuple


@dataclass
class _StageTables:
    """A field stage lowered: its tables and steps in order, its match form ('range', 'code',
    'exact' or 'lpm'), and the width of its interval code (1 when it has none)."""

    tables: list[Table]
    steps: list[Step]
    form: str
    code_width: int = 1


def _stage_tables(stage, k: _StageKeys, target: str, range_form: str) -> _StageTables:
    """The tables of one field stage (the module docstring), in the forms of :mod:`subc.ir.lowering`."""
    q = stage.field
    if q.match_kind == "range":
        return _range_stage(stage, k, target, range_form)
    if q.match_kind == "exact":
        entries: list[Entry] = []
        misses: list[Entry] = []
        for st in stage.states:
            es, miss = FieldStage.exact_form(st)
            entries.extend(_state_entry(st.state, v, t) for v, t in es)
            if miss:
                misses.append(Entry((st.state,), "subc_set_state", (("next_state", miss),)))
        return _StageTables(
            [
                Table(
                    k.base, [k.state_key, k.field_key("exact")], entries, NO_ACTION, "stage", q.name, ["subc_set_state"]
                ),
                Table(f"{k.base}_miss", [k.state_key], misses, k.to_dead, "miss", q.name, ["subc_set_state"]),
            ],
            [Step(k.base, f"{k.base}_miss")],
            "exact",
        )
    entries = []
    for st in stage.states:
        entries.extend(_state_entry(st.state, (v, plen), t) for v, plen, t in FieldStage.lpm_form(st, q.width))
    return _StageTables(
        [Table(k.base, [k.state_key, k.field_key("lpm")], entries, k.to_dead, "stage", q.name, ["subc_set_state"])],
        [Step(k.base)],
        "lpm",
    )


def _range_stage(stage, k: _StageKeys, target: str, range_form: str) -> _StageTables:
    """A range stage: direct (per state, its runs above a fallback entry) or, on Tofino when it
    needs fewer TCAM words (or when ``range_form`` is 'code'), an interval code: a range table on
    the field alone writes the code, an exact ``(state, code)`` table with a ``_miss`` table."""
    q = stage.field
    direct: list[Entry] = []
    for st in stage.states:
        runs, fb = FieldStage.range_form(st)
        direct.extend(_state_entry(st.state, (lo, hi), t, SPECIFIC_PRIORITY) for lo, hi, t in runs)
        if fb:
            direct.append(_state_entry(st.state, (0, st.runs[-1][1]), fb, FALLBACK_PRIORITY))
    # a direct entry's match is (state, (lo, hi))
    direct_tcam = sum(prefix_cover_count(e.match[1][0], e.match[1][1], q.width) for e in direct)
    use_code = False
    if stage.states and (target == Target.TOFINO or range_form == "code"):
        runs, per_state, ncodes = _code_form(stage)
        cfb = fallback_target(Counter(c for _, _, c in runs))
        code_runs = [r for r in runs if r[2] != cfb]
        code_tcam = sum(prefix_cover_count(lo, hi, q.width) for lo, hi, _ in code_runs)
        use_code = code_tcam < direct_tcam if range_form == "auto" else range_form == "code"
    if not use_code:
        table = Table(
            k.base,
            [k.state_key, k.field_key("range")],
            direct,
            k.to_dead,
            "stage",
            q.name,
            ["subc_set_state"],
            direct_tcam,
        )
        return _StageTables([table], [Step(k.base)], "range")
    code_entries = [Entry(((lo, hi),), "subc_set_code", (("code", c),), FALLBACK_PRIORITY) for lo, hi, c in code_runs]
    code_table = Table(
        f"{k.base}_code",
        [k.field_key("range")],
        code_entries,
        ("subc_set_code", (("code", cfb),)),
        "code",
        q.name,
        ["subc_set_code"],
        code_tcam,
    )
    ckey = Key(f"{k.meta}.subc_code", "exact", 0)  # width fixed by build_pipeline
    code_state_entries: list[Entry] = []
    miss_entries: list[Entry] = []
    for st in stage.states:
        targets = per_state[st.state]
        fb = fallback_target(Counter(targets.values()))
        code_state_entries.extend(_state_entry(st.state, c, t) for c, t in sorted(targets.items()) if t != fb)
        if fb:
            miss_entries.append(Entry((st.state,), "subc_set_state", (("next_state", fb),)))
    return _StageTables(
        [
            code_table,
            Table(k.base, [k.state_key, ckey], code_state_entries, NO_ACTION, "stage", q.name, ["subc_set_state"]),
            Table(f"{k.base}_miss", [k.state_key], miss_entries, k.to_dead, "miss", q.name, ["subc_set_state"]),
        ],
        [Step(f"{k.base}_code"), Step(k.base, f"{k.base}_miss")],
        "code",
        max(1, (ncodes - 1).bit_length()),
    )
