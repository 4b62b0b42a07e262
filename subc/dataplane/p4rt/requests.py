"""P4Runtime updates of a compiled rule set: ``entries.json`` + ``p4info.txtpb`` -> ``Update`` messages.

Encoding (P4Runtime specification v1.3):

* values are byte strings in network order in their *canonical* form, the shortest string that
  holds the value (section 8.4.1: a 0 is one zero byte); a value too wide for its field's
  ``bitwidth`` is an error;
* a match field that matches every value (a range over the whole field, an lpm of prefix length
  0, a ternary of mask 0) is omitted (section 9.1.1, "don't care" matches); an lpm value has its
  bits past the prefix cleared (section 9.1.1);
* ``priority`` is written as ``entries.json`` has it (P4Runtime's order: larger wins); entries of
  tables without range, ternary or optional keys have none;
* a multicast group is a ``PacketReplicationEngineEntry`` with one replica (instance 0) per port.

Names resolve through the P4Info: a table's full name (``SubcIngress.subc_s0_add_order_stock``),
an action's name qualified by its table's control (``SubcIngress.subc_set_state``), else as is
(``NoAction``).  :class:`~subc.errors.SubcError` for a name or parameter the P4Info lacks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...backends.p4.entries_doc import EntriesDoc, Entry, Match
from ...errors import SubcError

PRIORITY_KINDS = ("range", "ternary", "optional")


def encode_value(value: int, bits: int) -> bytes:
    """The canonical byte string of ``value`` (P4Runtime section 8.4.1) for a ``bits``-bit field.
    SubcError when the value is negative or does not fit."""
    if value < 0 or value >> bits:
        raise SubcError(f"value {value} does not fit in {bits} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


@dataclass
class TableInfo:
    """A table of the P4Info: ``id``; ``fields`` (id, name, bitwidth, match kind) in key order."""

    id: int
    fields: list[tuple[int, str, int, str]]


@dataclass
class ActionInfo:
    """An action of the P4Info: ``id``; ``params`` name -> (id, bitwidth)."""

    id: int
    params: dict[str, tuple[int, int]]


class P4InfoIndex:
    """Tables and actions of a P4Info message by fully qualified name."""

    KINDS = {2: "exact", 3: "lpm", 4: "ternary", 5: "range", 6: "optional"}

    def __init__(self, p4info):
        self.p4info = p4info
        self.tables = {
            t.preamble.name: TableInfo(
                t.preamble.id, [(f.id, f.name, f.bitwidth, self.KINDS.get(f.match_type, "?")) for f in t.match_fields]
            )
            for t in p4info.tables
        }
        self.actions = {
            a.preamble.name: ActionInfo(a.preamble.id, {p.name: (p.id, p.bitwidth) for p in a.params})
            for a in p4info.actions
        }
        self.table_names = {t.id: n for n, t in self.tables.items()}
        self.action_names = {a.id: n for n, a in self.actions.items()}

    def table(self, name: str) -> TableInfo:
        try:
            return self.tables[name]
        except KeyError:
            raise SubcError(f"table {name} is not in the P4Info: was the switch loaded with this program?") from None

    def action(self, table: str, name: str) -> tuple[str, ActionInfo]:
        """(full name, info) of action ``name`` of ``table``."""
        for full in (f"{table.rsplit('.', 1)[0]}.{name}", name):
            if full in self.actions:
                return full, self.actions[full]
        raise SubcError(f"action {name} of table {table} is not in the P4Info")


def read_p4info(text: str):
    """The ``p4.config.v1.P4Info`` message of protobuf text ``text``."""
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2

    return text_format.Parse(text, p4info_pb2.P4Info())


def _field_match(fid: int, kind: str, bits: int, m: Match):
    """The FieldMatch of match element ``m``, or None when it matches everything."""
    from p4.v1 import p4runtime_pb2 as pr

    fm = pr.FieldMatch(field_id=fid)
    top = (1 << bits) - 1
    if m.kind == "exact":
        fm.exact.value = encode_value(m.a, bits)
    elif m.kind == "range":
        lo, hi = m.a, m.b
        if (lo, hi) == (0, top):
            return None
        if lo > hi:
            raise SubcError(f"range {lo}..{hi} is empty")
        fm.range.low, fm.range.high = encode_value(lo, bits), encode_value(hi, bits)
    elif m.kind == "lpm":
        value, plen = m.a, m.b
        if not 0 <= plen <= bits:
            raise SubcError(f"prefix length {plen} of a {bits}-bit field")
        if plen == 0:
            return None
        fm.lpm.value = encode_value(value & (top ^ ((1 << (bits - plen)) - 1)), bits)
        fm.lpm.prefix_len = plen
    elif m.kind == "ternary":
        value, mask = m.a, m.b
        if mask == 0:
            return None
        fm.ternary.value, fm.ternary.mask = encode_value(value & mask, bits), encode_value(mask, bits)
    else:
        raise SubcError(f"unknown match element {m}")
    if kind != m.kind:
        raise SubcError(f"field {fid} is {kind} in the P4Info, the entry gives {m.kind}")
    return fm


def table_entry(index: P4InfoIndex, table: str, entry: Entry):
    """The ``p4.v1.TableEntry`` of one ``entry`` of ``table``."""
    from p4.v1 import p4runtime_pb2 as pr

    ti = index.table(table)
    if len(entry.match) != len(ti.fields):
        raise SubcError(f"{table}: the entry has {len(entry.match)} match fields, the P4Info {len(ti.fields)}")
    te = pr.TableEntry(table_id=ti.id)
    for (fid, _, bits, kind), m in zip(ti.fields, entry.match):
        fm = _field_match(fid, kind, bits, m)
        if fm is not None:
            te.match.append(fm)
    if entry.priority is not None and any(k in PRIORITY_KINDS for *_, k in ti.fields):
        te.priority = entry.priority
    _, ai = index.action(table, entry.action)
    te.action.action.action_id = ai.id
    for pname, value in entry.params.items():
        if pname not in ai.params:
            raise SubcError(f"action {entry.action} of {table} has no parameter {pname} in the P4Info")
        pid, bits = ai.params[pname]
        te.action.action.params.add(param_id=pid, value=encode_value(value, bits))
    return te


def multicast_entry(group: int, ports: Sequence[int]):
    """The ``PacketReplicationEngineEntry`` of multicast group ``group`` (one replica per port)."""
    from p4.v1 import p4runtime_pb2 as pr

    pre = pr.PacketReplicationEngineEntry()
    mg = pre.multicast_group_entry
    mg.multicast_group_id = group
    for p in ports:
        mg.replicas.add(egress_port=p, instance=0)
    return pre


def generation_entities(doc: EntriesDoc, index: P4InfoIndex) -> list:
    """Every ``p4.v1.Entity`` of ``doc``: table entries in the order of its tables,
    then the multicast groups."""
    from p4.v1 import p4runtime_pb2 as pr

    out = []
    for t in doc.tables:
        for e in t.entries:
            out.append(pr.Entity(table_entry=table_entry(index, t.name, e)))
    for g, ports in doc.multicast_groups:
        out.append(pr.Entity(packet_replication_engine_entry=multicast_entry(g, ports)))
    return out


def insert_updates(entities: list) -> list:
    """``Update`` messages inserting ``entities``: multicast groups first (entries refer to them)."""
    from p4.v1 import p4runtime_pb2 as pr

    groups = [e for e in entities if e.HasField("packet_replication_engine_entry")]
    rest = [e for e in entities if not e.HasField("packet_replication_engine_entry")]
    return [pr.Update(type=pr.Update.INSERT, entity=e) for e in groups + rest]
