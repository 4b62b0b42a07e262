"""``maps.json`` (format ``subc-ebpf-maps``, version 1) as dataclasses: the one place that writes
and reads the document the eBPF target compiles (:func:`subc.backends.ebpf.target.build_maps`)
and the broker loads (:mod:`subc.dataplane.ebpf`).  docs/outputs.md describes the format::

    {"format": "subc-ebpf-maps", "version": 1, "program": "subc_filter.bpf.c",
     "functions": {"xdp": "subc_xdp", ...}, "moldudp64": true, "generation_bit": 2147483648,
     "ports": [25475], "field_order": ["add_order.stock", ...], "root_state": 1,
     "default_action": "drop", "max_endpoints": 8, "stats": ["datagrams", ...],
     "stages": [{"field": "add_order.price", "kind": "range", "maps": ["st0_info", "st0_bnd"],
                 "max_runs": 3, "search_steps": 32, "width": 32, "states": 2, "next_states": 3}, ...],
     "subscribers": [1, 2],
     "maps": [{"name": "st0_info", "type": "array", "role": "state_info", "field": "add_order.price",
               "key": {"struct": "u32", "size": 4, "fields": [...]}, "value": {...},
               "capacity": 16, "entries": [{"state": 1, "offset": 0, "count": 3}, ...]}, ...],
     "state": {...}}

Each map's entries are in logical form (states without the generation bit, bounds indexed from
0, leaf actions as subscriber lists), one dataclass per map role (:data:`ENTRY_TYPES`).
:meth:`MapsDoc.to_json` gives back exactly the dictionary it was read from (key order included),
so a document read and written again is the same text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..output import read_document
from . import map_names as MN

FORMAT = "subc-ebpf-maps"
VERSION = 1


@dataclass(frozen=True, slots=True)
class RootEntry:
    """``subc_root``: the root state at ``index`` 0 (generation bit added by the loader)."""

    index: int
    root_state: int

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "root_state": self.root_state}


@dataclass(frozen=True, slots=True)
class InfoEntry:
    """A ``state_info`` array's entry of ``state``: a range state's slice of the bounds array
    (``offset``, ``count`` runs), a state-value state with one run (``next`` state, ``count`` 1),
    or an exact state's ``miss`` target.  Absent parts are None."""

    state: int
    offset: int | None = None
    next: int | None = None
    count: int | None = None
    miss: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state}
        for k in ("offset", "next", "count", "miss"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out


@dataclass(frozen=True, slots=True)
class BoundEntry:
    """A ``bounds`` array's entry: at ``index``, a run from ``lo`` (inclusive) to the next bound
    goes to ``next``."""

    index: int
    lo: int
    next: int

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "lo": self.lo, "next": self.next}


@dataclass(frozen=True, slots=True)
class ExactEntry:
    """An ``exact`` hash map's entry: (``state``, ``value``) -> ``next``."""

    state: int
    value: int
    next: int

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "value": self.value, "next": self.next}


@dataclass(frozen=True, slots=True)
class LpmEntry:
    """An ``lpm`` trie's entry: ``state`` and the first ``prefix_len`` bits of ``value`` (a
    ``width``-bit field value, right aligned) -> ``next``."""

    state: int
    value: int
    prefix_len: int
    next: int

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "value": self.value, "prefix_len": self.prefix_len, "next": self.next}


@dataclass(frozen=True, slots=True)
class MaskEntry:
    """An ``update_masks`` or ``count_masks`` entry: ``state`` -> ``mask`` (bit k: instance or
    update k)."""

    state: int
    mask: int

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "mask": self.mask}


@dataclass(frozen=True, slots=True)
class BasesEntry:
    """``subc_sv_base``: the state-value stages' first info slots (``bases``, one per stage)."""

    index: int
    bases: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "bases": list(self.bases)}


@dataclass(frozen=True, slots=True)
class LeafEntry:
    """A ``leaf`` entry: final ``state`` -> ``action`` (``fwd``, ``drop`` or ``nop``), with the
    subscriber ids of a ``fwd`` (None otherwise)."""

    state: int
    action: str
    subscribers: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "action": self.action}
        if self.subscribers is not None:
            out["subscribers"] = list(self.subscribers)
        return out

    @property
    def label(self) -> str:
        """How ``subc stats`` names the leaf: ``fwd(1, 2)``, ``drop``, ``drop(default)`` for state 0."""
        if self.action == "fwd":
            return "fwd(" + ", ".join(map(str, self.subscribers or ())) + ")"
        return self.action + ("(default)" if self.state == 0 else "")


MapEntry = RootEntry | InfoEntry | BoundEntry | ExactEntry | LpmEntry | MaskEntry | BasesEntry | LeafEntry

#: The entry dataclass of each map role that has compiled entries (the other roles' maps are
#: filled by the broker and list none).
ENTRY_TYPES: dict[str, type] = {
    "root": RootEntry,
    "state_info": InfoEntry,
    "bounds": BoundEntry,
    "exact": ExactEntry,
    "lpm": LpmEntry,
    "update_masks": MaskEntry,
    "count_masks": MaskEntry,
    "state_bases": BasesEntry,
    "leaf": LeafEntry,
}

#: Roles of the maps of one entry per compiled entry (bounds arrays, hash maps, tries).
ENTRY_ROLES = ("bounds", "exact", "lpm")


def _entry(cls: type, d: dict[str, Any]) -> MapEntry:
    if cls is BasesEntry:
        return BasesEntry(d["index"], tuple(d["bases"]))
    if cls is LeafEntry:
        subs = d.get("subscribers")
        return LeafEntry(d["state"], d["action"], tuple(subs) if subs is not None else None)
    return cls(**d)


@dataclass(frozen=True, slots=True)
class StructDoc:
    """A key or value layout (:class:`subc.backends.ebpf.layout.Struct`): C ``struct`` name,
    ``size`` in bytes, ``fields`` (name, type, count)."""

    struct: str
    size: int
    fields: tuple[tuple[str, str, int], ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StructDoc:
        return cls(d["struct"], d["size"], tuple((f["name"], f["type"], f["count"]) for f in d["fields"]))

    def to_json(self) -> dict[str, Any]:
        return {
            "struct": self.struct,
            "size": self.size,
            "fields": [{"name": n, "type": k, "count": c} for n, k, c in self.fields],
        }


@dataclass(frozen=True, slots=True)
class MapDoc:
    """One BPF map: ``name``, BPF ``type`` (``array``, ``hash``, ``lpm_trie``, ``percpu_array``,
    ``prog_array``, ``array_of_maps``), ``role``, the query ``field`` of a field stage's map (None
    otherwise), ``key`` and ``value`` layouts, default ``capacity`` (entries) and compiled
    ``entries`` (:data:`ENTRY_TYPES` by role)."""

    name: str
    type: str
    role: str
    field: str | None
    key: StructDoc
    value: StructDoc
    capacity: int
    entries: tuple[Any, ...]

    @property
    def percpu(self) -> bool:
        """Whether the map keeps one value per CPU."""
        return self.type.startswith("percpu")

    @property
    def state_count(self) -> int:
        """Slots an array indexed by state needs for one generation: its highest state + 1."""
        return max((e.state for e in self.entries), default=0) + 1

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MapDoc:
        etype = ENTRY_TYPES.get(d["role"])
        if d["entries"] and etype is None:
            raise ValueError(f"map {d['name']}: role {d['role']!r} has no compiled entries")
        entries = tuple(_entry(etype, e) for e in d["entries"]) if etype else ()
        return cls(
            d["name"],
            d["type"],
            d["role"],
            d["field"],
            StructDoc.from_json(d["key"]),
            StructDoc.from_json(d["value"]),
            d["capacity"],
            entries,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "role": self.role,
            "field": self.field,
            "key": self.key.to_json(),
            "value": self.value.to_json(),
            "capacity": self.capacity,
            "entries": [e.to_json() for e in self.entries],
        }


@dataclass(frozen=True, slots=True)
class StageDoc:
    """One field stage: the query ``field``, its ``kind`` (``range``, ``exact``, ``lpm``), the
    ``maps`` it reads (by name), the key ``width`` in bits, its input ``states`` and
    ``next_states``; for range stages the most runs of a state (``max_runs``) and the binary
    search's ``search_steps``; for state-value stages (which share their maps) ``base_index``, the
    stage's slot in ``subc_sv_base``."""

    field: str
    kind: str
    maps: tuple[str, ...]
    width: int
    states: int
    next_states: int
    max_runs: int | None = None
    search_steps: int | None = None
    base_index: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StageDoc:
        return cls(
            d["field"],
            d["kind"],
            tuple(d["maps"]),
            d["width"],
            d["states"],
            d["next_states"],
            d.get("max_runs"),
            d.get("search_steps"),
            d.get("base_index"),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field, "kind": self.kind, "maps": list(self.maps)}
        for k in ("base_index", "max_runs", "search_steps"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        out.update({"width": self.width, "states": self.states, "next_states": self.next_states})
        return out


@dataclass(frozen=True, slots=True)
class MapsDoc:
    """The ``maps.json`` document (see the module docstring).  ``state`` is the comparisons on
    state section (docs/state.md "Stateful subscriptions"; :func:`.target.state_doc`), kept as
    its JSON object, or None without state."""

    FORMAT: ClassVar[str] = FORMAT

    program: str
    functions: dict[str, str]
    moldudp64: bool
    generation_bit: int
    ports: tuple[int, ...]
    field_order: tuple[str, ...]
    root_state: int
    default_action: str
    max_endpoints: int
    stats: tuple[str, ...]
    stages: tuple[StageDoc, ...]
    subscribers: tuple[int, ...]
    maps: tuple[MapDoc, ...]
    state: dict[str, Any] | None = None
    version: int = VERSION
    by_name: dict[str, MapDoc] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {m.name: m for m in self.maps})

    def map(self, name: str) -> MapDoc:
        """The map called ``name`` (KeyError when the program has none)."""
        return self.by_name[name]

    @property
    def leaves(self) -> tuple[LeafEntry, ...]:
        """The leaf map's entries (state 0: the default action)."""
        return self.by_name[MN.LEAF].entries

    @property
    def instances(self) -> int:
        """Aggregate instances of the comparisons on state (0 without state)."""
        return len(self.state["instances"]) if self.state else 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MapsDoc:
        """The document of the parsed JSON ``d``; ValueError when it is not a ``maps.json`` of this
        version (or lacks a part)."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("not a subc eBPF maps document")
        if d.get("version") != VERSION:
            raise ValueError(f"maps.json version {d.get('version')}; this subc reads version {VERSION}")
        try:
            return cls(
                d["program"],
                dict(d["functions"]),
                d["moldudp64"],
                d["generation_bit"],
                tuple(d["ports"]),
                tuple(d["field_order"]),
                d["root_state"],
                d["default_action"],
                d["max_endpoints"],
                tuple(d["stats"]),
                tuple(StageDoc.from_json(s) for s in d["stages"]),
                tuple(d["subscribers"]),
                tuple(MapDoc.from_json(m) for m in d["maps"]),
                d.get("state"),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"maps.json lacks or mistypes {e}") from None

    @classmethod
    def read(cls, path: str | Path) -> MapsDoc:
        """The document in file ``path``; SubcError naming the file when it is not one."""
        return read_document(path, cls.from_json)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the document (key order as subc has always written it)."""
        out: dict[str, Any] = {
            "format": FORMAT,
            "version": self.version,
            "program": self.program,
            "functions": dict(self.functions),
            "moldudp64": self.moldudp64,
            "generation_bit": self.generation_bit,
            "ports": list(self.ports),
            "field_order": list(self.field_order),
            "root_state": self.root_state,
            "default_action": self.default_action,
            "max_endpoints": self.max_endpoints,
            "stats": list(self.stats),
            "stages": [s.to_json() for s in self.stages],
            "subscribers": list(self.subscribers),
            "maps": [m.to_json() for m in self.maps],
        }
        if self.state is not None:
            out["state"] = self.state
        return out

    def dumps(self) -> str:
        """The document as the compact JSON text a broker keeps in its state directory."""
        return json.dumps(self.to_json())
