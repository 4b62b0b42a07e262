"""The entries of a P4 rule set as a state diagram: the tables of ``entries.json`` are keyed by a
*state* (the metadata field ``subc_state``, one per message slot in the multi-message program)
and every stage's actions set the next state, so the entries form a diagram from the root state
(the default action of the keyless table ``subc_root``).

:class:`Diagram` gives every state a *signature*: a hash of its entries with the next states
replaced by their signatures and multicast groups by their port sets (bottom-up; states of equal
signature classify every packet alike).  An update (:mod:`.plan`) keeps the states whose
signature the switch holds; :func:`compare` tells whether a switch holds a rule set up to the
numbering of states and groups.  Entries are compared in a canonical form (:class:`Row`) in which
equal matches are equal, as P4Runtime reads them back (section 9.1.1).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ...backends.p4.entries_doc import Entry, EntriesDoc, Key, Match
from ...backends.p4.state_index import DEAD, GROUP_ACTION, Node, canonical_match, stage_of, state_key_index


@dataclass
class Row:
    """One entry in canonical form: ``key`` (match elements, priority) and ``value`` (action and
    sorted parameters)."""

    table: str
    key: tuple
    action: str
    params: tuple

    def entry(self, keys: tuple[Key, ...]) -> Entry:
        """The entry, for the table's ``keys``."""
        match, priority = self.key
        return Entry(tuple(entry_match(m, k) for m, k in zip(match, keys)), priority, self.action, dict(self.params))


def rows(doc: EntriesDoc) -> list[Row]:
    """Every entry of ``doc`` as a :class:`Row`."""
    out = []
    for t in doc.tables:
        bits = t.bits
        for e in t.entries:
            match = tuple(canonical_match(m, b) for m, b in zip(e.match, bits))
            out.append(Row(t.name, (match, e.priority), e.action, tuple(sorted(e.params.items()))))
    return out


def entry_match(m: tuple, key: Key) -> Match:
    """The match element of canonical element ``m`` for ``key``."""
    if m[0] == "exact":
        return Match("exact", m[1])
    if m[0] != "any":
        return Match(m[0], m[1], m[2])
    kind, top = key.match_kind, (1 << key.bitwidth) - 1
    return (
        Match("range", 0, top) if kind == "range" else Match("lpm", 0, 0) if kind == "lpm" else Match("ternary", 0, 0)
    )


class Diagram:
    """The state diagram of an entries.json document ``doc``: rows by state, rows of the tables
    not keyed by state (``shared``), multicast groups, the root and the signatures."""

    def __init__(self, doc: EntriesDoc):
        self.doc = doc
        self.root = doc.initial_state
        self.state_width = doc.state_width
        self.groups = doc.groups
        self.state_at = {t.name: state_key_index(t) for t in doc.tables}
        self.stage = {t.name: stage_of(doc, t) for t in doc.tables}
        self.tables = {t.name: t for t in doc.tables}
        self.by_state: dict[Node, list[Row]] = {}
        self.shared: list[Row] = []
        for r in rows(doc):
            i = self.state_at[r.table]
            if i is None:
                self.shared.append(r)
            else:
                self.by_state.setdefault((self.stage[r.table], r.key[0][i][1]), []).append(r)
        self._sig: dict[Node, bytes] = {}

    def states(self) -> set[Node]:
        """Every node with entries, and the root."""
        return set(self.by_state) | {(0, self.root)}

    def node_of(self, r: Row) -> Node | None:
        """The node whose entry ``r`` is (None: a table not keyed by state)."""
        i = self.state_at[r.table]
        return None if i is None else (self.stage[r.table], r.key[0][i][1])

    def spare_roots(self) -> list[Node]:
        """The nodes of the first stage with entries, the root aside: earlier roots, one of which an
        update rewrites into the next root (see the module docstring)."""
        return sorted(n for n in self.by_state if n[0] == 0 and n[1] != self.root)

    def _children(self, node: Node) -> list[Node]:
        k = node[0]
        return [(k + 1, v) for r in self.by_state.get(node, ()) for p, v in r.params if p == "next_state"]

    def signature(self, node: Node) -> bytes:
        """The signature of ``node`` (16 bytes; see the module docstring)."""
        stack = [node]
        while stack:
            top = stack[-1]
            if top in self._sig:
                stack.pop()
                continue
            if top[1] == DEAD:
                self._sig[top] = b"dead"
                continue
            todo = [c for c in self._children(top) if c not in self._sig]
            if todo:  # children are a stage later: no cycle
                stack.extend(todo)
                continue
            stack.pop()
            parts = sorted(repr(self._abstract(r)) for r in self.by_state.get(top, ()))
            self._sig[top] = hashlib.blake2b("\n".join(parts).encode(), digest_size=16).digest()
        return self._sig[node]

    def _abstract(self, r: Row) -> tuple:
        """``r`` with its state key dropped, next states as signatures and groups as port sets."""
        i = self.state_at[r.table]
        match, priority = r.key
        if i is None:
            return (r.table, match, priority, r.action, r.params)
        params = []
        for p, v in r.params:
            if p == "next_state":
                v = self.signature((self.stage[r.table] + 1, v))
            elif (r.action, p) == GROUP_ACTION:
                v = self.groups.get(v, ("missing group", v))
            params.append((p, v))
        return (r.table, match[:i] + match[i + 1 :], priority, r.action, tuple(params))

    def abstract_rows(self) -> dict[str, list[str]]:
        """Table name -> sorted abstract rows (states as signatures) of the states the root
        reaches, and the rows of the tables not keyed by state."""
        out: dict[str, list[str]] = {t: [] for t in self.tables}
        for node in self.reachable():
            for r in self.by_state.get(node, ()):
                out[r.table].append(repr(self._abstract(r)))
        for r in self.shared:
            out[r.table].append(repr((r.key, r.action, r.params)))
        return {t: sorted(v) for t, v in out.items()}

    def reachable(self) -> set[Node]:
        """The nodes the root leads to, the root included, dead ones not."""
        seen: set[Node] = set()
        todo = [(0, self.root)]
        while todo:
            n = todo.pop()
            if n not in seen and n[1] != DEAD:
                seen.add(n)
                todo.extend(self._children(n))
        return seen


def compare(switch: EntriesDoc, compiled: EntriesDoc) -> list[str]:
    """Differences between the entries a switch holds (``switch``, read back) and a compiled
    rule set, up to the numbering of states and multicast groups: one line per table (or the
    groups) that differs, empty when the switch classifies every packet as ``compiled`` says."""
    a, b = Diagram(switch), Diagram(compiled)
    ta, tb = a.abstract_rows(), b.abstract_rows()
    out = []
    for name in sorted(set(ta) | set(tb)):
        x, y = ta.get(name, []), tb.get(name, [])
        if x != y:
            sx, sy = set(x), set(y)
            missing = sum(1 for r in y if r not in sx)
            extra = sum(1 for r in x if r not in sy)
            out.append(
                f"{name}: {missing} entries of the rule set are missing on the switch and {extra} entries "
                f"on the switch are not in the rule set ({len(x)} on the switch, {len(y)} compiled)"
            )
    ga, gb = sorted(a.groups.values()), sorted(b.groups.values())
    if ga != gb:
        out.append(f"multicast groups: the switch has port sets {ga}, the rule set {gb}")
    spares = a.spare_roots()
    leftover = len(a.states() - a.reachable() - {(0, a.root)} - set(spares))
    if leftover:
        out.append(f"{leftover} states on the switch are not reachable from its root (left over)")
    if len(spares) > 1:
        out.append(f"{len(spares)} earlier roots are on the switch where one (the next update's spare) is kept")
    return out
