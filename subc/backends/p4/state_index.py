"""A rule set's entries by state, each state with its signature: the form an update is planned in.

The tables of ``entries.json`` are keyed by a *state* and every stage's actions set the next
state, so the entries form a diagram (:mod:`.diagram`).  A :class:`StateIndex` holds that
diagram node by node: for each node ((field stage, state number)) its signature (a hash of its
entries with the next states replaced by their signatures and multicast groups by their port
sets, bottom-up: nodes of equal signature classify every packet alike, whatever their numbers),
its children (the next states its entries set), its entries per table, and beside the nodes the
entries of the tables keyed by no state (``shared``) and the document without its entries
(``skeleton``: tables, keys, field order, root, multicast groups).

Serialized (:meth:`StateIndex.to_bytes`) as JSON lines: a header (the skeleton, the shared
entries, one ``[stage, state, signature, children, {table: entries}]`` row per node) and one line
per node with its entries, so that a reader parses only the nodes it needs
(:meth:`StateIndex.entries`): an update writes the entries of the states the switch lacks and
deletes those of the states it no longer needs, and reads nothing else.  The writer's record of
a switch (:mod:`.record`) is a StateIndex of what the switch holds.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path

import json

from ...errors import SubcError
from .entries_doc import EntriesDoc, Entry, Match, TableDoc

STATE_KEY = re.compile(r"(^|\.)subc_(s\d+_)?state$")
#: the action whose ``group`` parameter names a multicast group (single-message programs)
GROUP_ACTION = ("subc_mcast", "group")
DEAD = 0  # the dead state: no entries, every table's miss leads there
Node = tuple  # (field stage, state): state numbers are per stage


def json_line(obj) -> bytes:
    """Compact JSON (integers of any width: match values and port bitmaps exceed 64 bits)."""
    return json.dumps(obj, separators=(",", ":")).encode()


def stage_of(doc: EntriesDoc, table: TableDoc) -> int:
    """The field stage of ``table``: the index of its field in the document's field order (0 for a
    table with no field: the leaf table keyed by the root state alone)."""
    return doc.field_order.index(table.field) if table.field else 0


def state_key_index(table: TableDoc) -> int | None:
    """Position of the state key among ``table``'s keys, or None."""
    for i, k in enumerate(table.keys):
        if STATE_KEY.search(k.name):
            return i
    return None


def canonical_match(m: Match, bits: int) -> tuple:
    """A hashable form of match element ``m`` of a ``bits``-bit key in which equal
    matches are equal: lpm values masked to their prefix, ternary values to their mask, a
    whole-field range, lpm /0 and ternary mask 0 all ``('any',)`` (as P4Runtime omits them)."""
    top = (1 << bits) - 1
    if m.kind == "exact":
        return ("exact", m.a)
    if m.kind == "range":
        return ("any",) if (m.a, m.b) == (0, top) else ("range", m.a, m.b)
    if m.kind == "lpm":
        v, plen = m.a, m.b
        return ("any",) if plen == 0 else ("lpm", v & (top ^ ((1 << (bits - plen)) - 1)), plen)
    if m.kind == "ternary":
        return ("any",) if m.b == 0 else ("ternary", m.a & m.b, m.b)
    raise SubcError(f"unknown match element {m}")


FORMAT = "subc-state-index"
VERSION = 1
#: the signature of a state without entries (every packet misses)
EMPTY_SIG = hashlib.blake2b(b"", digest_size=16).digest()


@dataclass
class NodeInfo:
    """One node: ``sig`` (16 bytes; None for a spare root, whose children may be gone),
    ``children`` (the next states its entries set, in entry order, the dead state included) and
    ``counts`` (entries per table)."""

    sig: bytes | None
    children: tuple[int, ...]
    counts: dict[str, int]


class StateIndex:
    """The entries of a rule set by node (see the module docstring): ``skeleton`` (an
    :class:`EntriesDoc` without entries), ``nodes`` (node -> :class:`NodeInfo`), ``shared``
    (table -> entries of the tables keyed by no state); a node's entries come from
    :meth:`entries`."""

    def __init__(
        self,
        skeleton: EntriesDoc,
        nodes: dict[Node, NodeInfo],
        shared: dict[str, tuple[Entry, ...]],
        lines: dict[Node, bytes] | None = None,
        parsed: dict[Node, dict[str, tuple[Entry, ...]]] | None = None,
    ):
        self.skeleton = skeleton
        self.nodes = nodes
        self.shared = shared
        self._lines = lines or {}
        self._parsed = parsed or {}
        self.state_at = {t.name: state_key_index(t) for t in skeleton.tables}
        self.tables = {t.name: t for t in skeleton.tables}
        #: table -> whether every key is exact (its entries' matches are canonical as written)
        self.exact_only = {t.name: all(k.match_kind == "exact" for k in t.keys) for t in skeleton.tables}

    @property
    def root(self) -> int:
        """The root state (the first stage's)."""
        return self.skeleton.initial_state

    @property
    def groups(self) -> dict[int, tuple[int, ...]]:
        """Multicast group id -> ports."""
        return self.skeleton.groups

    def raw(self, node: Node) -> dict[str, list[dict]]:
        """Table -> entries of ``node`` in their entries.json form (parsed from its line; empty
        for a node without entries)."""
        line = self._lines.get(node)
        if line is not None:
            return json.loads(line)
        return {t: [e.to_json() for e in es] for t, es in self.entries(node).items()}

    def entries(self, node: Node) -> dict[str, tuple[Entry, ...]]:
        """Table -> entries of ``node`` (empty for a node without entries)."""
        got = self._parsed.get(node)
        if got is None:
            raw = self._lines.get(node)
            got = {} if raw is None else {t: tuple(Entry.from_json(e) for e in es) for t, es in json.loads(raw).items()}
            self._parsed[node] = got
        return got

    def line(self, node: Node, memo: dict | None = None) -> bytes:
        """The serialized entries of ``node`` (one JSON object, table -> entries).  ``memo`` (kept
        by the caller across nodes) holds the text of each list of entries written, by the ids of
        its entries: a multi-message program's slots hold the same entries, each written once."""
        raw = self._lines.get(node)
        if raw is None:
            memo = {} if memo is None else memo
            fields = []
            for t, es in self.entries(node).items():
                key = tuple(map(id, es))
                text = memo.get(key)
                if text is None:  # (the entries stay alive with the index: their ids stay theirs)
                    text = memo[key] = json_line([e.to_json() for e in es])
                fields.append(json_line(t) + b":" + text)
            raw = b"{" + b",".join(fields) + b"}"  # = json_line of the dict, table -> entries
            self._lines[node] = raw
        return raw

    def table_sizes(self) -> dict[str, int]:
        """Entries per table."""
        out = {t.name: len(self.shared.get(t.name, ())) for t in self.skeleton.tables}
        for info in self.nodes.values():
            for t, n in info.counts.items():
                out[t] += n
        return out

    def spare_roots(self) -> list[Node]:
        """The first stage's nodes with entries other than the root: earlier roots (:mod:`.plan`)."""
        return sorted(n for n in self.nodes if n[0] == 0 and n[1] != self.root)

    def signature(self, node: Node) -> bytes:
        """The signature of ``node`` (:data:`EMPTY_SIG` for a state without entries; the dead
        state's is ``b"dead"``, a spare root's ``b"spare"``, equal to no other)."""
        if node[1] == DEAD:
            return b"dead"
        info = self.nodes.get(node)
        if info is None:
            return EMPTY_SIG
        return info.sig if info.sig is not None else b"spare"

    def reachable(self) -> set[Node]:
        """The nodes the root leads to, the root included, dead ones not."""
        seen: set[Node] = set()
        todo = [(0, self.root)]
        while todo:
            n = todo.pop()
            if n in seen or n[1] == DEAD:
                continue
            seen.add(n)
            info = self.nodes.get(n)
            if info is not None:
                todo.extend((n[0] + 1, c) for c in info.children)
        return seen

    @classmethod
    def from_doc(cls, doc: EntriesDoc, spares: bool = True) -> StateIndex:
        """The index of ``doc``; with ``spares`` the first stage's nodes other than the root get no
        signature (earlier roots on a switch: their children may be gone)."""
        stage = {t.name: stage_of(doc, t) for t in doc.tables}
        by_node: dict[Node, dict[str, list[Entry]]] = {}
        shared: dict[str, tuple[Entry, ...]] = {}
        for t in doc.tables:
            i = state_key_index(t)
            if i is None:
                if t.entries:
                    shared[t.name] = t.entries
                continue
            k = stage[t.name]
            for e in t.entries:
                by_node.setdefault((k, e.match[i].a), {}).setdefault(t.name, []).append(e)
        skeleton = replace(doc, tables=tuple(replace(t, entries=()) for t in doc.tables))
        parsed = {n: {t: tuple(es) for t, es in ts.items()} for n, ts in by_node.items()}
        nodes = {
            n: NodeInfo(
                None,
                tuple(e.params["next_state"] for es in ts.values() for e in es if "next_state" in e.params),
                {t: len(es) for t, es in ts.items()},
            )
            for n, ts in parsed.items()
        }
        index = cls(skeleton, nodes, shared, parsed=parsed)
        skip = set(index.spare_roots()) if spares else set()
        for n in sorted(nodes, reverse=True):  # children are a stage later: computed first
            if n not in skip:
                nodes[n].sig = index._signature(n)
        return index

    def _signature(self, node: Node) -> bytes:
        """The signature of ``node`` from its entries and its children's signatures."""
        parts = []
        k = node[0]
        groups = self.groups
        # an entry's part but its table, by entry: the slots of a multi-message program hold the
        # same entries (repr((table, *rest)) is "(" + repr(table) + ", " + repr(rest)[1:])
        rests: dict[tuple, str] = {}
        for table, es in self.entries(node).items():
            i = self.state_at[table]
            bits = self.tables[table].bits
            head = "(" + repr(table) + ", "
            for e in es:
                key = (id(e), i, bits)
                rest = rests.get(key)
                if rest is None:
                    params: list[tuple[str, object]] = []
                    for p, v in sorted(e.params.items()):
                        val: object = v
                        if p == "next_state":
                            val = self.signature((k + 1, v))
                        elif (e.action, p) == GROUP_ACTION:
                            val = groups.get(v, ("missing group", v))
                        params.append((p, val))
                    match = tuple(canonical_match(m, b) for j, (m, b) in enumerate(zip(e.match, bits)) if j != i)
                    rest = rests[key] = repr((match, e.priority, e.action, tuple(params)))[1:]
                parts.append(head + rest)
        parts.sort()
        return hashlib.blake2b("\n".join(parts).encode(), digest_size=16).digest()

    def to_doc(self, without: Node | None = None) -> EntriesDoc:
        """The entries.json document (entries in node order, then the shared ones), the entries
        of node ``without`` left out."""
        by_table: dict[str, list[Entry]] = {t.name: [] for t in self.skeleton.tables}
        for n in sorted(self.nodes):
            if n == without:
                continue
            for t, es in self.entries(n).items():
                by_table[t].extend(es)
        for t, es in self.shared.items():
            by_table[t].extend(es)
        return replace(
            self.skeleton, tables=tuple(replace(t, entries=tuple(by_table[t.name])) for t in self.skeleton.tables)
        )

    def to_bytes(self, extra: dict | None = None) -> bytes:
        """JSON lines: the header (with ``extra``'s keys), then one line per node."""
        order = sorted(self.nodes)
        header = {
            "format": FORMAT,
            "version": VERSION,
            **(extra or {}),
            "skeleton": self.skeleton.to_json(),
            "shared": {t: [e.to_json() for e in es] for t, es in self.shared.items()},
            "nodes": [
                [n[0], n[1], None if i.sig is None else i.sig.hex(), list(i.children), i.counts]
                for n in order
                for i in (self.nodes[n],)
            ],
        }
        memo: dict = {}
        return b"\n".join([json_line(header), *(self.line(n, memo) for n in order)]) + b"\n"

    @classmethod
    def from_bytes(cls, raw: bytes) -> tuple[StateIndex, dict]:
        """(index, header) of :meth:`to_bytes`'s output; ValueError when it is not one."""
        lines = raw.split(b"\n")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError as e:
            raise ValueError(f"not a {FORMAT} document: {e}") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
            raise ValueError(f"not a {FORMAT} version {VERSION} document")
        rows = header["nodes"]
        if len(lines) < len(rows) + 1:
            raise ValueError(f"{len(rows)} nodes announced, {len(lines) - 1} lines given")
        skeleton = EntriesDoc.from_json(header["skeleton"])
        nodes: dict[Node, NodeInfo] = {}
        node_lines: dict[Node, bytes] = {}
        for j, (k, s, sig, children, counts) in enumerate(rows):
            nodes[(k, s)] = NodeInfo(None if sig is None else bytes.fromhex(sig), tuple(children), counts)
            node_lines[(k, s)] = lines[j + 1]
        shared = {t: tuple(Entry.from_json(e) for e in es) for t, es in header["shared"].items()}
        return cls(skeleton, nodes, shared, lines=node_lines), header


STATES_FILE = "states.jsonl"


def states_file(doc: EntriesDoc, entries_bytes: int, program_shape: str) -> bytes:
    """The ``states.jsonl`` of a compiled rule set ``doc`` whose entries.json has
    ``entries_bytes`` bytes and whose P4Info has shape digest ``program_shape``
    (:func:`~.p4info.shape_digest`): its :class:`StateIndex` (signatures computed), the two in its
    header (:func:`read_states` ignores a file whose entries.json has another size)."""
    extra = {"entries_json_bytes": entries_bytes, "program_shape": program_shape}
    return StateIndex.from_doc(doc, spares=False).to_bytes(extra)


def read_states(out_dir: str | Path) -> tuple[StateIndex, dict] | None:
    """(the :class:`StateIndex` of ``out_dir``'s ``states.jsonl``, its header), or None when there
    is none or entries.json does not have the size it records (edited since: index entries.json
    instead).  SubcError naming the file when it is not a state index."""
    d = Path(out_dir)
    try:
        raw = (d / STATES_FILE).read_bytes()
        size = (d / "entries.json").stat().st_size
    except FileNotFoundError:
        return None
    try:
        index, header = StateIndex.from_bytes(raw)
    except (KeyError, TypeError, ValueError) as e:
        raise SubcError(f"{d / STATES_FILE}: {e}") from None
    return (index, header) if header.get("entries_json_bytes") == size else None
