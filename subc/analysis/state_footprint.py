"""Which registers a message can touch, read from the compiled tables alone (for the stateful pass).

After the header stages and the update table (:attr:`~.tables_np.PipelineEvaluator.head_steps`) a
message has a diagram state and an update mask.  Its *footprint* is every register instance
(the ``state`` section's instances: aggregates and named counters) whose registers the message
can change or whose value can change its decision:

* the instances of its update mask (the update table writes them);
* the instances of the state values that a later stage matches on where the message's state has
  more than one outcome over the value's range (the decision may depend on that value);
* the named counters that the count table may update at any leaf the message can reach.

The later stages (:attr:`~.tables_np.PipelineEvaluator.tail_steps`) are followed over every
value of every state value at once, so the footprint over-approximates what the table simulator
does with the message, whatever the registers hold.  A message with an empty footprint changes
no register and is decided the same way whatever they hold: its tail steps may be evaluated with
any state values.  Two messages whose footprints share no instance (through a chain of messages)
touch disjoint registers, so the stateful pass runs them in separate tasks
(:mod:`.state_groups`).  Tables of another form (a later stage keyed on a header field or on the
code) make every footprint *all instances*: correct, never parallel.
"""

from __future__ import annotations

import numpy as np

from .tables_np import PipelineEvaluator

#: Action kinds of :class:`~.tables_np.PipelineEvaluator` (set_state, set_code, decision, nothing, mask).
_SET_STATE, _MASK = 0, 4


class Footprints:
    """Footprints (see the module docstring) of the tables of ``tables`` (with a ``state``
    section), by (diagram state, update mask index) after the head steps, cached."""

    def __init__(self, tables: PipelineEvaluator):
        doc = tables.state_doc
        assert doc is not None  # only tables that compare state have footprints
        self.tables = tables
        self.n_instances = len(doc.instances)
        self.value_instance = {v.key: v.instance for v in doc.values}
        self.count_instances = {u.index: u.instance for u in doc.count_updates}
        self.count_table = doc.count_table
        #: False when a later step has a miss table or keys on anything but the state and one
        #: state value: then every footprint is every instance
        self.general = all(on_miss is None and self._plain(name) for name, on_miss in tables.tail_steps)
        self._cache: dict[tuple[int, int], frozenset[int]] = {}

    def of(self, state: int, mask: int) -> frozenset[int]:
        """The footprint (instance indexes) of a message in diagram ``state`` with update mask index
        ``mask`` (-1: no update) after the head steps."""
        key = (state, mask)
        fp = self._cache.get(key)
        if fp is None:
            fp = self._cache[key] = self._footprint(state, mask)
        return fp

    def of_messages(self, states: np.ndarray, masks: np.ndarray) -> list[frozenset[int]]:
        """The footprint of each message (``states``, ``masks``: the head run's, per message)."""
        pairs = np.stack([states.astype(np.int64), masks.astype(np.int64)], axis=1)
        uniq, inv = np.unique(pairs, axis=0, return_inverse=True) if len(pairs) else (pairs, np.zeros(0, np.int64))
        fps = [self.of(int(s), int(m)) for s, m in uniq]
        return [fps[j] for j in np.asarray(inv).reshape(-1)]

    def _footprint(self, state: int, mask: int) -> frozenset[int]:
        t = self.tables
        out: set[int] = set()
        if mask >= 0:
            bits = t.masks[mask]
            out |= {k for k in range(self.n_instances) if bits >> k & 1}
        if not self.general:
            return frozenset(range(self.n_instances))
        states = {state}
        for name, _ in t.tail_steps:
            nxt: set[int] = set()
            for s in states:
                outcomes = self._outcomes(name, s)
                for kind, val, value_key in outcomes:
                    if kind == _SET_STATE:
                        nxt.add(val)
                    else:
                        nxt.add(s)
                        if kind == _MASK and name == self.count_table:
                            bits = t.masks[val]
                            out |= {k for j, k in self.count_instances.items() if bits >> j & 1}
                if len({(k, v) for k, v, _ in outcomes}) > 1:
                    out |= {self.value_instance[key] for _, _, key in outcomes if key is not None}
            states = nxt
        return frozenset(out)

    def _plain(self, name: str) -> bool:
        """True when table ``name`` keys on the state (exact) and at most one state value."""
        keys = self.tables.tables[name].keys
        return (
            0 < len(keys) <= 2
            and keys[0].name == self.tables.state_key
            and keys[0].match_kind == "exact"
            and all(k.name in self.value_instance for k in keys[1:])
        )

    def _outcomes(self, name: str, state: int) -> list[tuple[int, int, str | None]]:
        """Every (action kind, value, the state-value key matched or None) that table ``name`` can
        give a message in ``state``, over every value of its state value (a miss: its default)."""
        t = self.tables
        idx = t.tables[name]
        kinds, values, default = t.actions(name)
        if len(idx.keys) == 1:  # keyed by the state alone: one outcome
            value_key = None
            entries = idx.lookup([np.array([state], dtype=np.uint64)])
        else:  # the state selects a group; its segments cover the state value's range
            value_key = idx.keys[1].name
            g = int(np.searchsorted(idx.group_code, np.uint64(state))) if len(idx.group_code) else 0
            found = g < len(idx.group_code) and int(idx.group_code[g]) == state
            entries = idx.seg_entry[idx.seg_group == g] if found else np.full(1, -1)
        out = [(int(kinds[e]), int(values[e]), value_key) for e in sorted({int(e) for e in entries if e >= 0})]
        if (entries < 0).any():
            out.append((default[0], default[1], value_key))
        return out
