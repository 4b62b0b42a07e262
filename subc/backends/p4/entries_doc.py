"""``entries.json`` (format ``subc-entries``, version 2) as dataclasses: the one place that writes
and reads the control-plane document of the P4 targets (written by
:func:`subc.backends.p4.entries.entries_doc`; read by the table simulator, the P4Runtime control
plane and the data pipeline).  The format is described in :mod:`subc.backends.p4.entries` and
docs/outputs.md.

:meth:`EntriesDoc.to_json` gives back exactly the dictionary the document was read from (key
order included), so a document read and written again is the same text; every message slot's
copy of a table shares one entries tuple, written as one JSON list (:func:`..json_text.dumps` writes
it once).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..output import read_document

FORMAT = "subc-entries"
VERSION = 2
MATCH_KINDS = ("exact", "range", "lpm", "ternary")


@dataclass(frozen=True, slots=True)
class Match:
    """One match element of an entry: ``kind`` (``exact``, ``range``, ``lpm``, ``ternary``) and
    its two numbers ``a``, ``b``: exact value (``b`` 0), range ``lo``/``hi`` (inclusive), lpm value
    and prefix length in bits, ternary value and mask.  Integers are exact (any width)."""

    kind: str
    a: int
    b: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Match:
        """The element of ``{"exact": v}``, ``{"range": [lo, hi]}``, ``{"lpm": [v, len]}`` or
        ``{"ternary": [v, mask]}``; ValueError for anything else."""
        if len(d) != 1:
            raise ValueError(f"match element {d}: one of {', '.join(MATCH_KINDS)} expected")
        ((kind, v),) = d.items()
        if kind == "exact":
            return cls("exact", v)
        if kind not in MATCH_KINDS:
            raise ValueError(f"unknown match element {d}")
        return cls(kind, v[0], v[1])

    def to_json(self) -> dict[str, Any]:
        return {"exact": self.a} if self.kind == "exact" else {self.kind: [self.a, self.b]}

    def matches(self, v: int, bits: int) -> bool:
        """Whether value ``v`` of a ``bits``-bit key matches (P4 semantics of the match kind)."""
        if self.kind == "exact":
            return self.a == v
        if self.kind == "range":
            return self.a <= v <= self.b
        if self.kind == "lpm":
            shift = bits - self.b
            return (v >> shift) == (self.a >> shift)
        return (v & self.b) == (self.a & self.b)


@dataclass(frozen=True, slots=True)
class ActionCall:
    """An action with its parameters (name -> value, in the action's order)."""

    action: str
    params: dict[str, int]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ActionCall:
        return cls(d["action"], dict(d["params"]))

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "params": dict(self.params)}


@dataclass(frozen=True, slots=True)
class Entry:
    """One table entry: a match element per key, the ``priority`` of a ternary/range/lpm table's
    entry (P4Runtime's order: larger wins; None when the table has none) and the action."""

    match: tuple[Match, ...]
    priority: int | None
    action: str
    params: dict[str, int]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Entry:
        return cls(
            tuple(Match.from_json(m) for m in d["match"]), d.get("priority"), d["action"], dict(d.get("params", {}))
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"match": [m.to_json() for m in self.match]}
        if self.priority is not None:
            out["priority"] = self.priority
        out["action"] = self.action
        out["params"] = dict(self.params)
        return out


@dataclass(frozen=True, slots=True)
class Key:
    """A table key: its P4 expression ``name``, ``match_kind``, width in bits and, in a message
    slot's copy of a table, the query ``field`` it holds (None elsewhere)."""

    name: str
    match_kind: str
    bitwidth: int
    field: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Key:
        return cls(d["name"], d["match_kind"], d["bitwidth"], d.get("field"))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "match_kind": self.match_kind, "bitwidth": self.bitwidth}
        if self.field is not None:
            out["field"] = self.field
        return out


@dataclass(frozen=True, slots=True)
class TableDoc:
    """One match-action table: full ``name`` (control.table), ``role``, the query ``field`` its
    stage tests (None for tables of no field), ``size`` (entries it holds), ``keys``, its
    ``default_action`` and ``entries``; ``slot``: the message slot of a multi-message program's
    copy (None elsewhere)."""

    name: str
    role: str
    field: str | None
    size: int
    keys: tuple[Key, ...]
    default_action: ActionCall
    entries: tuple[Entry, ...]
    slot: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any], memo: dict[int, tuple[Entry, ...]] | None = None) -> TableDoc:
        raw = d["entries"]
        entries = memo.get(id(raw)) if memo is not None else None
        if entries is None:
            entries = tuple(Entry.from_json(e) for e in raw)
            if memo is not None:
                memo[id(raw)] = entries
        return cls(
            d["name"],
            d["role"],
            d.get("field"),
            d["size"],
            tuple(Key.from_json(k) for k in d["keys"]),
            ActionCall.from_json(d["default_action"]),
            entries,
            d.get("slot"),
        )

    def to_json(self, memo: dict[int, list] | None = None) -> dict[str, Any]:
        """The JSON object; ``memo`` (id of an entries tuple -> its list) shares the list of the
        slots' copies."""
        entries = memo.get(id(self.entries)) if memo is not None else None
        if entries is None:
            entries = [e.to_json() for e in self.entries]
            if memo is not None:
                memo[id(self.entries)] = entries
        out: dict[str, Any] = {
            "name": self.name,
            "role": self.role,
            "field": self.field,
            "size": self.size,
            "keys": [k.to_json() for k in self.keys],
            "default_action": self.default_action.to_json(),
            "entries": entries,
        }
        if self.slot is not None:
            out["slot"] = self.slot
        return out

    @property
    def bits(self) -> tuple[int, ...]:
        """The keys' widths in bits."""
        return tuple(k.bitwidth for k in self.keys)


@dataclass(frozen=True, slots=True)
class Step:
    """One step of the pipeline: apply ``table``; on a miss, apply ``on_miss`` (None: none)."""

    table: str
    on_miss: str | None


@dataclass(frozen=True, slots=True)
class RootRef:
    """The keyless table whose default ``action`` sets the root state (its parameter ``param``)."""

    table: str
    action: str
    param: str


@dataclass(frozen=True, slots=True)
class Held:
    """A withheld (non-forwarding) decision of the multi-message program: its ``code`` and action."""

    code: int
    action: str
    params: dict[str, int]


@dataclass(frozen=True, slots=True)
class MessagesDoc:
    """The multi-message program's section: message slots (``max_messages``), the port that gets
    a datagram it cannot classify whole (``overflow_port``, None: dropped), the subscriber
    ``ports`` (bit j of a message's port bitmap is ``ports[j]``), the ``held`` decisions, and the
    names of its ``counters`` and ``sequence_register``."""

    max_messages: int
    overflow_port: int | None
    ports: tuple[int, ...]
    held: tuple[Held, ...]
    counters: dict[str, Any]
    sequence_register: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MessagesDoc:
        return cls(
            d["max_messages"],
            d["overflow_port"],
            tuple(d["ports"]),
            tuple(Held(h["code"], h["action"], dict(h["params"])) for h in d["held"]),
            dict(d["counters"]),
            d["sequence_register"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "max_messages": self.max_messages,
            "overflow_port": self.overflow_port,
            "ports": list(self.ports),
            "held": [{"code": h.code, "action": h.action, "params": dict(h.params)} for h in self.held],
            "counters": dict(self.counters),
            "sequence_register": self.sequence_register,
        }


@dataclass(frozen=True, slots=True)
class StateValue:
    """A state value a stage matches: metadata ``key``, query ``field``, aggregate ``instance``,
    its ``threshold`` index and ``width`` in bits."""

    key: str
    field: str
    instance: int
    threshold: int | None
    width: int


@dataclass(frozen=True, slots=True)
class CountUpdate:
    """A named counter's update: bit ``index`` of the count table's mask, the ``instance`` it
    updates and the query ``field`` it adds (None: adds 1)."""

    index: int
    instance: int
    field: str | None


@dataclass(frozen=True, slots=True)
class InstanceDoc:
    """An aggregate instance (:class:`subc.ir.aggregates.AggregateInstance`): ``index``,
    ``kind``, query ``field`` (None for ``count``), ``window_ns`` (0: none), ``thresholds``, and a
    named counter's ``name``."""

    index: int
    kind: str
    field: str | None
    window_ns: int
    thresholds: tuple[int, ...]
    name: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> InstanceDoc:
        return cls(d["index"], d["kind"], d["field"], d["window_ns"], tuple(d["thresholds"]), d.get("name"))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "kind": self.kind,
            "field": self.field,
            "window_ns": self.window_ns,
            "thresholds": list(self.thresholds),
        }
        if self.name is not None:
            out["name"] = self.name
        return out


@dataclass(frozen=True, slots=True)
class StateDoc:
    """The ``state`` section (comparisons on state, docs/state.md): the ``update_table`` (full
    name) whose ``mask`` parameter goes to ``mask_key``, the time field (``time_field``, None: the
    arrival time) in ``unit_ns``, the ``instances``, the ``values`` the stages match and, with
    named counters, the ``count_table``, ``count_key`` and ``count_updates``."""

    update_table: str
    mask_key: str
    time_field: str | None
    unit_ns: int
    instances: tuple[InstanceDoc, ...]
    values: tuple[StateValue, ...]
    count_table: str | None = None
    count_key: str | None = None
    count_updates: tuple[CountUpdate, ...] = ()

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StateDoc:
        return cls(
            d["update_table"],
            d["mask_key"],
            d["time"]["field"],
            d["time"]["unit_ns"],
            tuple(InstanceDoc.from_json(i) for i in d["instances"]),
            tuple(StateValue(v["key"], v["field"], v["instance"], v["threshold"], v["width"]) for v in d["values"]),
            d.get("count_table"),
            d.get("count_key"),
            tuple(CountUpdate(u["index"], u["instance"], u["field"]) for u in d.get("count_updates", ())),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "update_table": self.update_table,
            "mask_key": self.mask_key,
            "time": {"field": self.time_field, "unit_ns": self.unit_ns},
            "instances": [i.to_json() for i in self.instances],
            "values": [
                {"key": v.key, "field": v.field, "instance": v.instance, "threshold": v.threshold, "width": v.width}
                for v in self.values
            ],
        }
        if self.count_table is not None:
            out["count_table"] = self.count_table
            out["count_key"] = self.count_key
            out["count_updates"] = [
                {"index": u.index, "instance": u.instance, "field": u.field} for u in self.count_updates
            ]
        return out


@dataclass(frozen=True, slots=True)
class EntriesDoc:
    """The ``entries.json`` document (see :mod:`subc.backends.p4.entries`): ``target`` (``bmv2``
    or ``tofino``), ingress ``control`` name, state and code widths in bits, the root state as
    compiled (``initial_state``) and where it lives (``root``), the state key (and the
    multi-message program's ``code_key``), the ``default_action`` of a packet no rule matches,
    the headers the tables need valid, the field order, the ``pipeline`` steps, the ``tables``,
    the multicast groups (id -> ports), and the ``state`` and ``messages`` sections (None when
    absent)."""

    target: str
    control: str
    state_width: int
    code_width: int
    initial_state: int
    root: RootRef
    state_key: str
    default_action: ActionCall
    headers: tuple[str, ...]
    field_order: tuple[str, ...]
    pipeline: tuple[Step, ...]
    tables: tuple[TableDoc, ...]
    multicast_groups: tuple[tuple[int, tuple[int, ...]], ...]
    state: StateDoc | None = None
    code_key: str | None = None
    messages: MessagesDoc | None = None
    version: int = VERSION

    @property
    def groups(self) -> dict[int, tuple[int, ...]]:
        """Multicast group -> its ports, sorted."""
        return {g: tuple(sorted(p)) for g, p in self.multicast_groups}

    def table(self, name: str) -> TableDoc:
        """The table called ``name`` (the first, in a multi-message program: slot 0's); KeyError
        when there is none."""
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EntriesDoc:
        """The document of the parsed JSON ``d``; ValueError when it is not an ``entries.json``
        of this version (or lacks a part)."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("not a subc entries.json document")
        if d.get("version") != VERSION:
            raise ValueError(f"entries.json version {d.get('version')}; this subc reads version {VERSION}")
        memo: dict[int, tuple[Entry, ...]] = {}
        try:
            root = d["root"]
            return cls(
                d["target"],
                d["control"],
                d["state_width"],
                d["code_width"],
                d["initial_state"],
                RootRef(root["table"], root["action"], root["param"]),
                d["state_key"],
                ActionCall.from_json(d["default_action"]),
                tuple(d["headers"]),
                tuple(d["field_order"]),
                tuple(Step(s["table"], s["on_miss"]) for s in d["pipeline"]),
                tuple(TableDoc.from_json(t, memo) for t in d["tables"]),
                tuple((g["group"], tuple(g["ports"])) for g in d["multicast_groups"]),
                StateDoc.from_json(d["state"]) if d.get("state") is not None else None,
                d.get("code_key"),
                MessagesDoc.from_json(d["messages"]) if d.get("messages") is not None else None,
            )
        except (KeyError, TypeError, IndexError) as e:
            raise ValueError(f"entries.json lacks or mistypes {e}") from None

    @classmethod
    def read(cls, path: str | Path) -> EntriesDoc:
        """The document in file ``path``; SubcError naming the file when it is not one."""
        return read_document(path, cls.from_json)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the document (key order as subc has always written it)."""
        memo: dict[int, list] = {}
        out: dict[str, Any] = {
            "format": FORMAT,
            "version": self.version,
            "target": self.target,
            "control": self.control,
            "state_width": self.state_width,
            "code_width": self.code_width,
            "initial_state": self.initial_state,
            "root": {"table": self.root.table, "action": self.root.action, "param": self.root.param},
            "state_key": self.state_key,
            "default_action": self.default_action.to_json(),
            "headers": list(self.headers),
            "field_order": list(self.field_order),
            "pipeline": [{"table": s.table, "on_miss": s.on_miss} for s in self.pipeline],
            "tables": [t.to_json(memo) for t in self.tables],
            "multicast_groups": [{"group": g, "ports": list(p)} for g, p in self.multicast_groups],
        }
        if self.state is not None:
            out["state"] = self.state.to_json()
        if self.code_key is not None:
            out["code_key"] = self.code_key
        if self.messages is not None:
            out["messages"] = self.messages.to_json()
        return out
