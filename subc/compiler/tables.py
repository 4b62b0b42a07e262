"""Match-action tables from the sliced BDD: the target-independent pipeline.

Each field stage becomes a table keyed by ``(state: exact, field: <match kind>)`` whose actions
set the next state, except the last stage: its entries apply the packet's actions (egress port,
multicast group, drop, spec action) directly, so no leaf table keyed by the final state is needed
(one entry per leaf state fewer).  State 0 is dead: every table's default action leads to state
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
  entries (:func:`~subc.compiler.intervals.prefix_cover_count`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, field as dc_field

from .intervals import prefix_cover_count
from .slicing import Sliced, Stage, StageState

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
    """A match-action table: ``role`` is 'stage', 'miss', 'code' or 'leaf' (the table keyed by
    the root state alone, only when there is no field stage)."""

    name: str
    keys: list[Key]
    entries: list[Entry]
    default_action: tuple[str, tuple[tuple[str, int], ...]]
    role: str
    field: str | None = None
    actions: list[str] = dc_field(default_factory=list)
    tcam_words: int = 0

    @property
    def size(self) -> int:
        """Declared table size: the number of entries (at least 1)."""
        return max(1, len(self.entries))

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
    leaf_atoms: dict[int, frozenset]
    meta: str = "meta"
    hdr: str = "hdr"

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
    return "subc_" + field_name.replace(".", "_")


def _state_entry(state: int, match, target: int, priority=None) -> Entry:
    return Entry((state, match), "subc_set_state", (("next_state", target),), priority)


def _fallback(targets: Counter) -> int:
    """The target to use as a per-state fallback: most entries saved, state 0 preferred."""
    if not targets:
        return 0
    total = sum(targets.values())
    return min(targets, key=lambda t: (total - targets[t] + (1 if t else 0), t))


def _range_entries(st: StageState) -> tuple[list[Entry], int]:
    fb = _fallback(Counter(t for _, _, t in st.runs))
    out = [_state_entry(st.state, (lo, hi), t, SPECIFIC_PRIORITY) for lo, hi, t in st.runs if t != fb]
    if fb:
        out.append(_state_entry(st.state, (0, st.runs[-1][1]), fb, FALLBACK_PRIORITY))
    return out, fb


def exact_entries(st: StageState, points: list[int]) -> tuple[list[Entry], int]:
    """Entries for the mentioned ``points`` (sorted) and the miss target of the state."""
    miss, counts = None, Counter()
    for lo, hi, t in st.runs:
        n_points = bisect_right(points, hi) - bisect_left(points, lo)
        counts[t] += n_points
        if n_points < hi - lo + 1:
            miss = t  # the run holds an unmentioned value: all of those lead to one target
    if miss is None:
        miss = _fallback(counts)
    out = []
    for v in points:
        t = st.target(v)
        if t != miss:
            out.append(_state_entry(st.state, v, t))
    return out, miss


def lpm_entries(st: StageState, prefixes: list[tuple[int, int]], width: int) -> list[Entry]:
    """Entries for a state over the prefix tree of ``prefixes`` [(value, len)], root /0 first."""
    top = (1 << width) - 1
    spans = [(v, v | (top >> plen if plen else top), plen) for v, plen in prefixes]
    spans = sorted(set(spans) | {(0, top, 0)}, key=lambda s: (s[0], s[2]))
    parent: dict[tuple, tuple | None] = {}
    children: dict[tuple, list] = {s: [] for s in spans}
    stack: list[tuple] = []
    for s in spans:
        while stack and not (stack[-1][0] <= s[0] and s[1] <= stack[-1][1]):
            stack.pop()
        parent[s] = stack[-1] if stack else None
        if stack:
            children[stack[-1]].append(s)
        stack.append(s)
    los = [lo for lo, _, _ in st.runs]
    effective: dict[tuple, int] = {}
    out = []
    for s in spans:
        inherited = effective[parent[s]] if parent[s] is not None else 0
        cursor = s[0]
        for c in children[s]:
            if c[0] == cursor:
                cursor = c[1] + 1
            else:
                break
        if cursor > s[1]:
            effective[s] = inherited
            continue
        t = st.runs[bisect_right(los, cursor) - 1][2]
        effective[s] = t
        if t != inherited:
            out.append(_state_entry(st.state, (s[0], s[2]), t))
    return out


def _code_form(stage: Stage) -> tuple[list[tuple[int, int, int]], dict[int, dict[int, int]], int]:
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
    sliced: Sliced,
    leaf_actions: dict[int, tuple[str, tuple]],
    mcast_groups: dict[int, tuple[int, ...]],
    default_action: tuple[str, tuple],
    leaf_atoms: dict[int, frozenset],
    headers: list[str],
    target: str = "bmv2",
    hdr: str = "hdr",
    meta: str = "meta",
    range_form: str = "auto",
) -> Pipeline:
    """Build the tables of ``sliced`` (see the module docstring).

    ``leaf_actions`` maps each leaf state to (action, params); ``target`` 'tofino' enables the
    interval-code form of range fields where it needs fewer TCAM words.  ``range_form``
    'direct' or 'code' forces one form of range fields on every target (for tests and tuning).
    """
    # states are written by every stage but the last, which applies the packets' actions
    max_state = max([1] + [s.n_next for s in sliced.stages[:-1]])
    state_width = max(1, max_state.bit_length())
    state_key = Key(f"{meta}.subc_state", "exact", state_width)
    to_dead = ("subc_set_state", (("next_state", 0),))
    tables: list[Table] = []
    steps: list[Step] = []
    forms: dict[str, str] = {}
    code_width = 1
    for stage in sliced.stages:
        q = stage.field
        base = _table_base(q.name)
        fkey = lambda kind: Key(f"{hdr}.{q.name}", kind, q.width, q.name)  # noqa: E731
        if q.match_kind == "range":
            direct: list[Entry] = []
            for st in stage.states:
                direct.extend(_range_entries(st)[0])
            direct_tcam = sum(prefix_cover_count(*e.match[1], q.width) for e in direct)
            use_code = False
            if stage.states and (target == "tofino" or range_form == "code"):
                runs, per_state, ncodes = _code_form(stage)
                cfb = _fallback(Counter(c for _, _, c in runs))
                code_runs = [r for r in runs if r[2] != cfb]
                code_tcam = sum(prefix_cover_count(lo, hi, q.width) for lo, hi, _ in code_runs)
                use_code = code_tcam < direct_tcam if range_form == "auto" else range_form == "code"
            if not use_code:
                forms[q.name] = "range"
                tables.append(
                    Table(base, [state_key, fkey("range")], direct, to_dead, "stage", q.name, ["subc_set_state"], direct_tcam)
                )
                steps.append(Step(base))
                continue
            forms[q.name] = "code"
            cw = max(1, (ncodes - 1).bit_length())
            code_width = max(code_width, cw)
            code_entries = [Entry(((lo, hi),), "subc_set_code", (("code", c),), FALLBACK_PRIORITY) for lo, hi, c in code_runs]
            tables.append(
                Table(f"{base}_code", [fkey("range")], code_entries, ("subc_set_code", (("code", cfb),)), "code",
                      q.name, ["subc_set_code"], code_tcam)
            )
            ckey = Key(f"{meta}.subc_code", "exact", 0)  # width fixed below
            code_state_entries, miss_entries = [], []
            for st in stage.states:
                targets = per_state[st.state]
                fb = _fallback(Counter(targets.values()))
                code_state_entries.extend(_state_entry(st.state, c, t) for c, t in sorted(targets.items()) if t != fb)
                if fb:
                    miss_entries.append(Entry((st.state,), "subc_set_state", (("next_state", fb),)))
            tables.append(Table(base, [state_key, ckey], code_state_entries, NO_ACTION, "stage", q.name, ["subc_set_state"]))
            tables.append(Table(f"{base}_miss", [state_key], miss_entries, to_dead, "miss", q.name, ["subc_set_state"]))
            steps.append(Step(f"{base}_code"))
            steps.append(Step(base, f"{base}_miss"))
        elif q.match_kind == "exact":
            forms[q.name] = "exact"
            points = sorted(v for v, plen in stage.domain.mentioned if plen == q.width)
            entries, misses = [], []
            for st in stage.states:
                es, miss = exact_entries(st, points)
                entries.extend(es)
                if miss:
                    misses.append(Entry((st.state,), "subc_set_state", (("next_state", miss),)))
            tables.append(Table(base, [state_key, fkey("exact")], entries, NO_ACTION, "stage", q.name, ["subc_set_state"]))
            tables.append(Table(f"{base}_miss", [state_key], misses, to_dead, "miss", q.name, ["subc_set_state"]))
            steps.append(Step(base, f"{base}_miss"))
        else:
            forms[q.name] = "lpm"
            prefixes = sorted(stage.domain.mentioned)
            entries = []
            for st in stage.states:
                entries.extend(lpm_entries(st, prefixes, q.width))
            tables.append(Table(base, [state_key, fkey("lpm")], entries, to_dead, "stage", q.name, ["subc_set_state"]))
            steps.append(Step(base))
    # widths of code keys are known only now
    for t in tables:
        t.keys = [Key(k.name, k.match_kind, code_width, k.field) if k.name.endswith(".subc_code") else k for k in t.keys]
    if sliced.stages:
        last = sliced.stages[-1].field.name
        _apply_leaf_actions([t for t in tables if t.field == last and t.role != "code"], leaf_actions, default_action)
    else:  # no field to match (no rules): the root state alone decides
        leaf_entries = [Entry((s,), a, p) for s, (a, p) in sorted(leaf_actions.items())]
        actions = sorted({a for a, _ in leaf_actions.values()} | {default_action[0]})
        tables.append(Table("subc_leaf", [state_key], leaf_entries, default_action, "leaf", None, actions))
        steps.append(Step("subc_leaf"))
    return Pipeline(
        tables=tables,
        steps=steps,
        mcast_groups=mcast_groups,
        state_width=state_width,
        code_width=code_width,
        root_state=sliced.root_state,
        field_order=[s.field.name for s in sliced.stages],
        match_forms=forms,
        headers=headers,
        default_action=default_action,
        leaf_atoms=leaf_atoms,
        meta=meta,
        hdr=hdr,
    )
