"""A rule set's entries by state, each state with its signature: the form an update is planned in.

The tables of ``entries.json`` are keyed by a *state* and every stage's actions set the next
state, so the entries form a diagram (compared by :mod:`subc.dataplane.p4rt.compare`).  A :class:`StateIndex` holds that
diagram node by node: for each node ((field stage, state number)) its signature (a hash of its
entries with the next states replaced by their signatures and multicast groups by their port
sets, bottom-up: nodes of equal signature classify every packet alike, whatever their numbers),
its children (the next states its entries set), its entries per table, and beside the nodes the
entries of the tables keyed by no state (``shared``) and the document without its entries
(``skeleton``: tables, keys, field order, root, multicast groups).

Serialized (:meth:`StateIndex.to_bytes`) as lines: a JSON header (the skeleton, the shared
entries, the number of nodes, the bytes of the heads and of each node's entries), then each node's
*head* ``[stage, state, signature, next states, {table: entries}]`` (JSON, one a line), then each
node's entries (JSON, one a line, in the heads' order), so that a reader parses the heads and
only the entries of the nodes it needs (:meth:`StateIndex.rows`, :meth:`StateIndex.entries`),
and a writer copies the heads and entries of the nodes it keeps: an update writes the entries of
the states the switch lacks and deletes those of the states it no longer needs, and reads
nothing else.  The writer's record of a switch (:mod:`.record`) is a StateIndex of what the
switch holds.

A node's entries are ``{table: [row, ...]}``, one *row* per entry: ``[match, priority, action,
params]`` as in ``entries.json`` but for the match, which leaves out the state key (the node's
state: equal in every entry of the node) and gives each other element as a number (exact) or a
pair (range low and high, lpm value and prefix length, ternary value and mask: the key's own
kind).  Rows are cheap to parse and to compare, and a node's rows do not depend on its number:
an update renumbers only next states and multicast groups (:mod:`~subc.dataplane.p4rt.plan`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Hashable, Iterable
from itertools import accumulate
from dataclasses import dataclass, replace
from pathlib import Path

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
    if m.kind == "exact":
        return ("exact", m.a)
    top = (1 << bits) - 1
    if m.kind == "range":
        return ("any",) if (m.a, m.b) == (0, top) else ("range", m.a, m.b)
    if m.kind == "lpm":
        v, plen = m.a, m.b
        return ("any",) if plen == 0 else ("lpm", v & (top ^ ((1 << (bits - plen)) - 1)), plen)
    if m.kind == "ternary":
        return ("any",) if m.b == 0 else ("ternary", m.a & m.b, m.b)
    raise SubcError(f"unknown match element {m}")


FORMAT = "subc-state-index"
VERSION = 2  # 1: lines of entries.json entries (read as no index: entries.json is indexed instead)
#: the signature of a state without entries (every packet misses)
EMPTY_SIG = hashlib.blake2b(b"", digest_size=16).hexdigest()
#: a node's entries of one table, as its line holds them: ``[match, priority, action, params]``
Row = list
#: a node's serialized entries (a ``memoryview`` into the document it was read from)
Line = bytes | memoryview


@dataclass(slots=True)
class NodeInfo:
    """One node: ``sig`` (its signature: 32 hex digits, a 16-byte hash; None for a spare root,
    whose children may be gone), ``children`` (the next states its entries set, in entry order,
    the dead state included) and ``counts`` (entries per table)."""

    sig: str | None
    children: tuple[int, ...]
    counts: dict[str, int]


def _exact_key(row: Row) -> tuple:
    """The canonical key of a row of a table whose keys are all exact: its match and priority."""
    return tuple(row[0]), row[1]


class StateIndex:
    """The entries of a rule set by node (see the module docstring): ``skeleton`` (an
    :class:`EntriesDoc` without entries), ``nodes`` (node -> :class:`NodeInfo`), ``shared``
    (table -> entries of the tables keyed by no state); a node's entries come from
    :meth:`entries` (:class:`Entry` objects) or :meth:`rows` (as its line holds them)."""

    def __init__(
        self,
        skeleton: EntriesDoc,
        nodes: dict[Node, NodeInfo],
        shared: dict[str, tuple[Entry, ...]],
        lines: dict[Node, Line] | None = None,
        parsed: dict[Node, dict[str, tuple[Entry, ...]]] | None = None,
        heads: dict[Node, Line] | None = None,
        rows: dict[Node, dict[str, list[Row]]] | None = None,
    ):
        self.skeleton = skeleton
        self.nodes = nodes
        self.shared = shared
        # a node's entries: serialized (lines), as rows or as entries; serialized when written
        self._lines = lines or {}
        self._rows = rows or {}
        self._parsed = parsed or {}
        self._heads = heads or {}  # node -> its serialized head, as read (its NodeInfo unchanged)
        self.state_at = {t.name: state_key_index(t) for t in skeleton.tables}
        self.tables = {t.name: t for t in skeleton.tables}
        #: table -> whether every key is exact (its rows' matches are canonical as written)
        self.exact_only = {t.name: all(k.match_kind == "exact" for k in t.keys) for t in skeleton.tables}
        #: table -> (match kind, bits) of each key but the state key, in key order
        self.row_keys = {
            t.name: tuple((k.match_kind, k.bitwidth) for j, k in enumerate(t.keys) if j != self.state_at[t.name])
            for t in skeleton.tables
        }

    @property
    def root(self) -> int:
        """The root state (the first stage's)."""
        return self.skeleton.initial_state

    @property
    def groups(self) -> dict[int, tuple[int, ...]]:
        """Multicast group id -> ports."""
        return self.skeleton.groups

    def rows(self, node: Node) -> dict[str, list[Row]]:
        """Table -> rows of ``node`` (see the module docstring; parsed from its line unless given;
        empty for a node without entries).  Not to be modified."""
        got = self._rows.get(node)
        if got is not None:
            return got
        line = self.line(node) if node in self.nodes else b"{}"
        return json.loads(line if isinstance(line, bytes) else bytes(line))

    def row(self, table: str, e: Entry) -> Row:
        """The row of entry ``e`` of ``table`` (keyed by state).  SubcError for a match element
        of another kind than its key's."""
        i = self.state_at[table]
        match: list = []
        for j, (m, key) in enumerate(zip(e.match, self.tables[table].keys)):
            kind = key.match_kind
            if j == i:
                continue
            if m.kind != kind:
                raise SubcError(f"table {table}: an entry has a {m.kind} match for a {kind} key")
            match.append(m.a if kind == "exact" else [m.a, m.b])
        return [match, e.priority, e.action, e.params]

    def entry(self, table: str, state: int, row: Row) -> Entry:
        """The entry of ``row`` of ``table`` under state ``state``."""
        match = [
            Match("exact", v) if k == "exact" else Match(k, v[0], v[1])
            for (k, _), v in zip(self.row_keys[table], row[0])
        ]
        i = self.state_at[table]
        assert i is not None, f"{table} is keyed by no state"
        match.insert(i, Match("exact", state))
        return Entry(tuple(match), row[1], row[2], dict(row[3]))

    def row_key(self, table: str) -> Callable[[Row], Hashable]:
        """The function of a row of ``table`` to its canonical match and priority (equal for
        equal matches of one node: :func:`canonical_match`)."""
        if self.exact_only[table]:
            return _exact_key
        keys = self.row_keys[table]

        def key(row: Row) -> tuple:
            match = tuple(
                ("exact", v) if k == "exact" else canonical_match(Match(k, v[0], v[1]), bits)
                for (k, bits), v in zip(keys, row[0])
            )
            return match, row[1]

        return key

    def entries(self, node: Node) -> dict[str, tuple[Entry, ...]]:
        """Table -> entries of ``node`` (empty for a node without entries)."""
        got = self._parsed.get(node)
        if got is None:
            s = node[1]
            got = {t: tuple(self.entry(t, s, r) for r in rs) for t, rs in self.rows(node).items()}
            self._parsed[node] = got
        return got

    def read_heads(self, nodes: Iterable[Node]) -> dict[Node, Line]:
        """The serialized heads of those of ``nodes`` read with the index (unchanged since), by
        node: what another index holding the same nodes may write without serializing them."""
        heads = self._heads
        return {n: heads[n] for n in nodes if n in heads}

    def head(self, node: Node) -> Line:
        """The serialized head of ``node`` (see the module docstring)."""
        got = self._heads.get(node)
        if got is None:
            i = self.nodes[node]
            got = json_line([node[0], node[1], i.sig, list(i.children), i.counts])
        return got

    def line(self, node: Node, memo: dict | None = None) -> Line:
        """The serialized rows of ``node`` (one JSON object, table -> rows).  ``memo`` (kept by
        the caller across nodes) holds the text of each tuple of entries written, by its id (the
        tuples stay alive with the index): a multi-message program's slots share one tuple, each
        written once."""
        raw = self._lines.get(node)
        if raw is None and node in self._rows:
            raw = self._lines[node] = json_line(self._rows[node])
        if raw is None:
            memo = {} if memo is None else memo
            fields = []
            for t, es in self._parsed[node].items():
                key = (id(es), self.state_at[t], self.row_keys[t])  # (the slots' tables share es)
                text = memo.get(key)
                if text is None:  # (the entries stay alive with the index: their ids stay theirs)
                    text = memo[key] = json_line([self.row(t, e) for e in es])
                fields.append(json_line(t) + b":" + text)
            raw = b"{" + b",".join(fields) + b"}"  # = json_line of the dict, table -> rows
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

    def signature(self, node: Node) -> str:
        """The signature of ``node`` (:data:`EMPTY_SIG` for a state without entries; the dead
        state's is ``"dead"``, a spare root's ``"spare"``, equal to no other)."""
        if node[1] == DEAD:
            return "dead"
        info = self.nodes.get(node)
        if info is None:
            return EMPTY_SIG
        return info.sig if info.sig is not None else "spare"

    def reachable(self) -> set[Node]:
        """The nodes the root leads to, the root included, dead ones not (stage by stage: a
        node's children are of the next stage)."""
        seen: set[Node] = set()
        states = {self.root}
        k = 0
        while states:
            states.discard(DEAD)
            after: set[int] = set()
            for s in states:
                info = self.nodes.get((k, s))
                if info is not None:
                    after.update(info.children)
            seen.update((k, s) for s in states)
            states, k = after, k + 1
        return seen

    @classmethod
    def from_doc(cls, doc: EntriesDoc, spares: bool = True) -> StateIndex:
        """The index of ``doc``; with ``spares`` the first stage's nodes other than the root get no
        signature (earlier roots on a switch: their children may be gone)."""
        stage = {t.name: stage_of(doc, t) for t in doc.tables}
        parsed: dict[Node, dict[str, tuple[Entry, ...]]] = {}
        shared: dict[str, tuple[Entry, ...]] = {}
        groups: dict[tuple, list] = {}  # by id: the slots' tables share one entries tuple, grouped once
        for t in doc.tables:
            i = state_key_index(t)
            if i is None:
                if t.entries:
                    shared[t.name] = t.entries
                continue
            k = stage[t.name]
            got = groups.get((id(t.entries), i, k))
            if got is None:
                by_state: dict[int, list[Entry]] = {}
                for e in t.entries:
                    by_state.setdefault(e.match[i].a, []).append(e)
                got = groups[(id(t.entries), i, k)] = [((k, s), tuple(es)) for s, es in by_state.items()]
            for n, es in got:
                parsed.setdefault(n, {})[t.name] = es
        skeleton = replace(doc, tables=tuple(replace(t, entries=()) for t in doc.tables))
        distinct = {id(es): es for ts in parsed.values() for es in ts.values()}  # (the slots' tables share one)
        nexts = {i: [e.params["next_state"] for e in es if "next_state" in e.params] for i, es in distinct.items()}
        nodes = {}
        for n, ts in parsed.items():
            nodes[n] = NodeInfo(
                None, tuple(s for es in ts.values() for s in nexts[id(es)]), {t: len(es) for t, es in ts.items()}
            )
        index = cls(skeleton, nodes, shared, parsed=parsed)
        skip = set(index.spare_roots()) if spares else set()
        for n in sorted(nodes, reverse=True):  # children are a stage later: computed first
            if n not in skip:
                nodes[n].sig = index._signature(n)
        return index

    def _signature(self, node: Node) -> str:
        """The signature of ``node`` from its entries and its children's signatures: the hash of
        its :meth:`abstract_rows`' texts, sorted, a line each.  A text starts with its table's
        name, quoted, so the sorted texts are the tables in order, each with its own sorted: the
        tables of a multi-message program's slots that hold the same entries share one sorted
        list, and each table's texts are joined at once."""
        k = node[0]
        rests: dict[tuple, str] = {}
        lists: dict[tuple, list[str]] = {}
        blocks = []
        for table, es in self.entries(node).items():
            if not es:
                continue
            i = self.state_at[table]
            bits = self.tables[table].bits
            key = (id(es), i, bits)  # (the slots' tables share one tuple, alive with the index)
            got = lists.get(key)
            if got is None:
                got = []
                for e in es:
                    ek = (id(e), i, bits)
                    rest = rests.get(ek)
                    if rest is None:
                        rest = rests[ek] = self._rest(e, i, bits, k)
                    got.append(rest)
                got.sort()
                lists[key] = got
            head = "(" + repr(table) + ", "
            blocks.append((head, head + ("\n" + head).join(got)))
        blocks.sort()  # by head: one a table
        return hashlib.blake2b("\n".join(b for _, b in blocks).encode(), digest_size=16).hexdigest()

    def abstract_rows(self, node: Node) -> list[tuple[str, str]]:
        """(table, text) of each entry of ``node``, in entry order: the entry with its state key left
        out, its next state given as that node's signature and its multicast group as its ports
        (the parts :meth:`signature` hashes, sorted; equal for the entries of nodes that classify
        alike, whatever their numbers)."""
        out = []
        k = node[0]
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
                    rest = rests[key] = self._rest(e, i, bits, k)
                out.append((table, head + rest))
        return out

    def _rest(self, e: Entry, i: int | None, bits: tuple, k: int) -> str:
        """The text of entry ``e`` of stage ``k`` after its table's name (state key ``i`` left
        out, key widths ``bits``): match, priority, action, parameters with the next state as its
        signature and a multicast group as its ports."""
        items = e.params.items()
        params: list[tuple[str, object]] = []
        for p, v in sorted(items) if len(items) > 1 else items:
            if p == "next_state":
                params.append((p, self.signature((k + 1, v))))
            elif p == GROUP_ACTION[1] and e.action == GROUP_ACTION[0]:
                params.append((p, self.groups.get(v, ("missing group", v))))
            else:
                params.append((p, v))
        match = tuple([canonical_match(m, b) for j, (m, b) in enumerate(zip(e.match, bits)) if j != i])
        return repr((match, e.priority, e.action, tuple(params)))[1:]

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
        """The header (with ``extra``'s keys), the heads, the entries (see the module docstring)."""
        order = sorted(self.nodes)
        memo: dict = {}
        known, serialized = self._heads, self._lines
        heads = [known.get(n) or self.head(n) for n in order]
        lines = [serialized.get(n) or self.line(n, memo) for n in order]
        header = {
            "format": FORMAT,
            "version": VERSION,
            **(extra or {}),
            "skeleton": self.skeleton.to_json(),
            "shared": {t: [e.to_json() for e in es] for t, es in self.shared.items()},
            "nodes": len(order),
            "heads_bytes": sum(map(len, heads)) + max(len(heads) - 1, 0),
            "lines_bytes": [len(x) for x in lines],
        }
        return b"\n".join([json_line(header), *heads, *lines]) + b"\n"

    @classmethod
    def from_bytes(cls, raw: bytes) -> tuple[StateIndex, dict]:
        """(index, header) of :meth:`to_bytes`'s output, the nodes' heads parsed and their entries
        left unparsed (views of ``raw``); :class:`OtherVersion` for another version's, ValueError
        when it is not one."""
        end = raw.find(b"\n")
        end = len(raw) if end < 0 else end
        try:
            header = json.loads(raw[:end])
        except json.JSONDecodeError as e:
            raise ValueError(f"not a {FORMAT} document: {e}") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} document")
        if header.get("version") != VERSION:
            raise OtherVersion(
                f"a {FORMAT} version {header.get('version')} document: this subc reads version {VERSION}"
            )
        count, sizes = header["nodes"], header["lines_bytes"]
        start = end + 1 + header["heads_bytes"] + 1  # the first node's entries
        ends = list(accumulate(sizes, lambda a, b: a + 1 + b, initial=start - 1))[1:]
        if len(sizes) != count or (ends[-1] + 1 if count else end + 1) != len(raw) or raw[-1:] != b"\n":
            raise ValueError(f"{count} nodes announced, {len(raw)} bytes: not as the header says")
        texts = raw[end + 1 : start - 1].split(b"\n") if count else []
        if len(texts) != count:
            raise ValueError(f"{count} nodes announced, {len(texts)} heads given")
        heads = json.loads(b"[" + b",".join(texts) + b"]")
        keys = [(h[0], h[1]) for h in heads]
        nodes = {key: NodeInfo(h[2], tuple(h[3]), h[4]) for key, h in zip(keys, heads)}
        view = memoryview(raw)
        starts = [e - n for e, n in zip(ends, sizes)]
        lines: dict[Node, Line] = dict(zip(keys, map(view.__getitem__, map(slice, starts, ends))))
        shared = {t: tuple(Entry.from_json(e) for e in es) for t, es in header["shared"].items()}
        skeleton = EntriesDoc.from_json(header["skeleton"])
        return cls(skeleton, nodes, shared, lines, heads=dict(zip(keys, texts))), header


class OtherVersion(ValueError):
    """A state index of another version than this subc's (:meth:`StateIndex.from_bytes`)."""


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
    is none, it is of another version (an earlier subc's) or entries.json does not have the size
    it records (edited since): index entries.json instead.  SubcError naming the file when it is
    not a state index."""
    d = Path(out_dir)
    try:
        raw = (d / STATES_FILE).read_bytes()
        size = (d / "entries.json").stat().st_size
    except FileNotFoundError:
        return None
    try:
        index, header = StateIndex.from_bytes(raw)
    except OtherVersion:
        return None
    except (KeyError, TypeError, ValueError) as e:
        raise SubcError(f"{d / STATES_FILE}: {e}") from None
    return (index, header) if header.get("entries_json_bytes") == size else None
