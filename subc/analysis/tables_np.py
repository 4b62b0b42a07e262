"""The compiled tables (``entries.json``) evaluated on many packets at once with NumPy.

The semantics are those of the table simulator (:mod:`subc.sim.switch`, P4 table
semantics), applied to columns instead of one packet: exact keys must be equal, range keys contain
the value, lpm keys pick the longest prefix, among several hits the largest priority wins (equal
priorities: the first entry); a miss runs the default action and the step's ``on_miss`` table.

Each table is prepared once (:class:`TableIndex`): entries are grouped by the values of their
leading exact keys, and within a group the last key's ranges (an exact value is the range
``[v, v]``, a prefix the range it covers) are resolved by priority into disjoint segments.  A
lookup is then two ``searchsorted`` calls per table over the batch: O(packets x log entries).
Ternary keys with masks that are not prefixes are not supported (subc never emits them).

:class:`PipelineEvaluator` gives, per packet, a *decision code*: an index into
:attr:`PipelineEvaluator.decisions`, the list of distinct :class:`~subc.semantics.reference.Decision`
values the last stage's actions (and the default action) can produce.
"""

from __future__ import annotations

import numpy as np

from ..backends.p4.entries_doc import EntriesDoc, Match, TableDoc
from ..semantics.reference import Decision
from ..sim.switch import leaf_decision

_NO_ENTRY = -1


def _interval(kind: str, m: Match, width: int) -> tuple[int, int]:
    """The values ``[lo, hi]`` a match element covers."""
    if kind == "exact":
        return m.a, m.a
    if kind == "range":
        return m.a, m.b
    if kind == "lpm":
        value, plen = m.a, m.b
        span = (1 << (width - plen)) - 1
        return value & ~span, value | span
    value, mask = m.a, m.b
    top = (1 << width) - 1
    inv = top & ~mask
    if inv & (inv + 1):  # not a prefix mask
        raise ValueError("ternary key with a non-prefix mask")
    return value & mask, (value & mask) | inv


class TableIndex:
    """One table prepared for vectorised lookups (see the module docstring).

    ``lookup(values)`` takes one uint64 array per key (in key order, all of equal length n) and
    returns the index of the winning entry per packet (int64, -1 on a miss).  It keeps arrays, not
    the entries (a Spark broadcast ships it to every task: 100,000 rules' entries as Python objects
    took 0.36 s to unpickle per worker)."""

    def __init__(self, t: TableDoc):
        self.name = t.name
        self.keys = t.keys
        self.kinds = [k.match_kind for k in self.keys]
        self.default = (t.default_action.action, t.default_action.params)
        lead = len(self.keys) - 1
        groups: dict[tuple, list] = {}
        for i, e in enumerate(t.entries):
            prefix = tuple(m.a for m in e.match[:lead])
            lo, hi = _interval(self.kinds[-1], e.match[-1], self.keys[-1].bitwidth)
            if e.priority is not None:
                rank = e.priority
            else:
                rank = e.match[-1].b if self.kinds[-1] == "lpm" else 0
            groups.setdefault(prefix, []).append((rank, -i, lo, hi, i))
        if any(k != "exact" for k in self.kinds[:lead]):
            raise ValueError(f"table {self.name}: only the last key may be non-exact")
        self.group_keys = sorted(groups)
        # per group: disjoint segments [start, next start) -> entry (or -1), painted by priority
        starts_all: list[int] = []
        seg_group: list[int] = []
        seg_start: list[int] = []
        seg_entry: list[int] = []
        for g, prefix in enumerate(self.group_keys):
            items = sorted(groups[prefix])  # lowest rank first; equal rank: later entries first
            points = sorted(
                {0} | {lo for _, _, lo, _, _ in items} | {hi + 1 for _, _, _, hi, _ in items if hi + 1 < 1 << 64}
            )
            owner = np.full(len(points), _NO_ENTRY, dtype=np.int64)
            pts = np.array(points, dtype=np.uint64)
            for _, _, lo, hi, i in items:
                a = int(np.searchsorted(pts, np.uint64(lo)))
                b = int(np.searchsorted(pts, np.uint64(hi + 1))) if hi + 1 < 1 << 64 else len(points)
                owner[a:b] = i
            for p, o in zip(points, owner):
                starts_all.append(p)
                seg_group.append(g)
                seg_start.append(p)
                seg_entry.append(int(o))
        self.breaks = np.array(sorted(set(starts_all)) or [0], dtype=np.uint64)
        nb = len(self.breaks)
        self.nbreaks = nb
        cls = np.searchsorted(self.breaks, np.array(seg_start, dtype=np.uint64)) if seg_start else np.zeros(0, np.int64)
        composite = np.array(seg_group, dtype=np.int64) * nb + cls
        order = np.argsort(composite, kind="stable")
        self.seg_key = composite[order]
        self.seg_group = np.array(seg_group, dtype=np.int64)[order]
        self.seg_entry = np.array(seg_entry, dtype=np.int64)[order]
        # leading exact keys -> group number
        self.prefix_width = [k.bitwidth for k in self.keys[:lead]]
        self.group_code = np.array([self._prefix_code(p) for p in self.group_keys], dtype=np.uint64)

    def _prefix_code(self, prefix: tuple) -> int:
        code = 0
        for v, w in zip(prefix, self.prefix_width):
            code = (code << w) | v
        return code

    def lookup(self, values: list[np.ndarray]) -> np.ndarray:
        n = len(values[0])
        if not len(self.seg_key):
            return np.full(n, _NO_ENTRY, dtype=np.int64)
        code = np.zeros(n, dtype=np.uint64)
        for v, w in zip(values[:-1], self.prefix_width):
            code = (code << np.uint64(w)) | v
        g = np.searchsorted(self.group_code, code)
        g_ok = g < len(self.group_code)
        g = np.where(g_ok, g, 0)
        g_ok &= self.group_code[g] == code if len(self.group_code) else False
        c = np.searchsorted(self.breaks, values[-1], side="right") - 1
        composite = g.astype(np.int64) * self.nbreaks + c
        pos = np.searchsorted(self.seg_key, composite, side="right") - 1
        pos_ok = pos >= 0
        pos = np.where(pos_ok, pos, 0)
        hit = g_ok & pos_ok & (self.seg_group[pos] == g)
        return np.where(hit, self.seg_entry[pos], _NO_ENTRY)


class PipelineEvaluator:
    """All steps of an ``entries.json`` document over columns of packets.

    ``decide(fields)`` takes ``{'header.field': uint64 array}`` (every field a key names, equal
    lengths n) and returns the decision code per packet (int64 array of n, indexes into
    :attr:`decisions`).  Raises ValueError for a key on a field missing from ``fields``.

    With comparisons on state (the document's ``state`` section, docs/state.md "Stateful
    subscriptions") the pipeline runs in two parts around the registers: :meth:`run` over
    :attr:`head_steps` (the header stages and the update table) gives each packet's state and
    update mask (an index into :attr:`masks`), the caller computes the state values, and
    :meth:`run` over :attr:`tail_steps` with them (``meta``) gives the decisions.
    """

    def __init__(self, doc: EntriesDoc):
        self.tables = {t.name: TableIndex(t) for t in doc.tables}
        self.steps = [(s.table, s.on_miss) for s in doc.pipeline]
        state = doc.state
        #: the document's ``state`` section (None without comparisons on state)
        self.state_doc = state
        self.update_table = state.update_table if state else None
        self.count_table = state.count_table if state else None
        cut = next((i + 1 for i, (t, _) in enumerate(self.steps) if t == self.update_table), len(self.steps))
        #: the steps up to the update table (all steps without state) and the steps after it
        self.head_steps, self.tail_steps = self.steps[:cut], self.steps[cut:]
        #: the distinct update masks of the update and count tables (``subc_update``, ``subc_count``)
        self.masks: list[int] = []
        self._mask_ids: dict[int, int] = {}
        self.groups = doc.groups
        self.initial_state = doc.initial_state
        self.state_key = doc.state_key
        self.code_key = self.state_key.rsplit(".", 1)[0] + ".subc_code"
        self.decisions: list[Decision] = []
        self._codes: dict[Decision, int] = {}
        self.default_code = self.code_of(self._decision(doc.default_action.action, doc.default_action.params))
        # per table: per entry (kind, value): kind 0 set_state, 1 set_code, 2 decision, 3 nothing,
        # 4 update mask (value: index into self.masks)
        self._acts: dict[str, tuple[np.ndarray, np.ndarray, tuple[int, int]]] = {}
        for td in doc.tables:
            kinds, vals = [], []
            for e in td.entries:
                k, v = self._action(e.action, e.params)
                kinds.append(k)
                vals.append(v)
            self._acts[td.name] = (
                np.array(kinds, dtype=np.int8),
                np.array(vals, dtype=np.int64),
                self._action(*self.tables[td.name].default),
            )

    def code_of(self, d: Decision) -> int:
        """The decision code of ``d`` (a new code when the tables never produce it)."""
        c = self._codes.get(d)
        if c is None:
            c = self._codes[d] = len(self.decisions)
            self.decisions.append(d)
        return c

    def actions(self, name: str) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
        """Table ``name``'s actions as :meth:`run` applies them: per entry its kind (int8: 0
        set_state, 1 set_code, 2 decision, 3 nothing, 4 update mask) and value (int64: the next
        state, the code, the decision code, 0, the index into :attr:`masks`), and the default
        action's (kind, value)."""
        return self._acts[name]

    def _decision(self, action: str, params: dict) -> Decision:
        return leaf_decision(action, params, self.groups)

    def _action(self, action: str, params: dict) -> tuple[int, int]:
        if action == "subc_set_state":
            return 0, params["next_state"]
        if action == "subc_set_code":
            return 1, params["code"]
        if action == "NoAction":
            return 3, 0
        if action in ("subc_update", "subc_count"):
            mask = params["mask"]
            if mask not in self._mask_ids:
                self._mask_ids[mask] = len(self.masks)
                self.masks.append(mask)
            return 4, self._mask_ids[mask]
        return 2, self.code_of(self._decision(action, params))

    def decide(self, fields: dict[str, np.ndarray]) -> np.ndarray:
        if self.update_table is not None:
            raise ValueError("the tables compare state: run head_steps, the registers, then tail_steps")
        return self.run(fields).decisions()

    def run(
        self,
        fields: dict[str, np.ndarray],
        steps: list | None = None,
        meta: dict[str, np.ndarray] | None = None,
        state: np.ndarray | None = None,
        code: np.ndarray | None = None,
    ) -> "Run":
        """Run ``steps`` (default: every step) on the packets ``fields`` (as :meth:`decide`);
        ``meta``: more key columns by full key name (state values, ``meta.subc_v0``); ``state`` and
        ``code``: the packets' state and code fields when the steps start mid-pipeline (default:
        the initial state, code 0).  Raises ValueError for a key on a missing column."""
        meta = meta or {}
        n = len(state) if state is not None else (len(next(iter(fields.values()))) if fields else 0)
        state = np.full(n, self.initial_state, dtype=np.uint64) if state is None else state.astype(np.uint64)
        code = np.zeros(n, dtype=np.uint64) if code is None else code.astype(np.uint64)
        result = np.full(n, -1, dtype=np.int64)
        mask = np.full(n, -1, dtype=np.int64)
        for table_name, on_miss in self.steps if steps is None else steps:
            pending = np.ones(n, dtype=bool)  # packets for which this step is not finished
            for name in (table_name, on_miss):
                if name is None:
                    continue
                t = self.tables[name]
                idx = np.flatnonzero(pending)
                vals = []
                for k in t.keys:
                    key = k.name
                    if key == self.state_key:
                        vals.append(state[idx])
                    elif key == self.code_key:
                        vals.append(code[idx])
                    elif key in meta:
                        vals.append(meta[key][idx])
                    else:
                        field = key.split(".", 1)[1]
                        if field not in fields:
                            raise ValueError(f"table {name} keys on {field}, which the packets lack")
                        vals.append(fields[field][idx])
                hit = t.lookup(vals)
                kinds, values, (dkind, dval) = self._acts[name]
                is_hit = hit >= 0
                safe = np.where(is_hit, hit, 0)
                kind = np.where(is_hit, kinds[safe] if len(kinds) else dkind, dkind)
                val = np.where(is_hit, values[safe] if len(values) else dval, dval)
                for kcode, target in ((0, state), (1, code)):
                    sel = kind == kcode
                    target[idx[sel]] = val[sel].astype(np.uint64)
                sel = kind == 2
                result[idx[sel]] = val[sel]
                sel = kind == 4
                mask[idx[sel]] = val[sel]
                done = is_hit | (name == on_miss)
                pending[idx[done]] = False
                if not pending.any():
                    break
        return Run(state, code, result, mask, self.default_code)


class Run:
    """The outcome of :meth:`PipelineEvaluator.run` on n packets: ``state`` and ``code`` (uint64),
    ``result`` (decision code, -1 where no step decided), ``mask`` (the update or count table's
    mask as an index into :attr:`PipelineEvaluator.masks`, -1 where none ran)."""

    def __init__(self, state: np.ndarray, code: np.ndarray, result: np.ndarray, mask: np.ndarray, default_code: int):
        self.state, self.code, self.result, self.mask = state, code, result, mask
        self.default_code = default_code

    def decisions(self) -> np.ndarray:
        """The decision codes (int64), the default action's where no step decided."""
        return np.where(self.result < 0, self.default_code, self.result)
