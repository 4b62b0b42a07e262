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


def _field_match(te, fid: int, kind: str, bits: int, m: Match) -> None:
    """Add the FieldMatch of match element ``m`` to TableEntry ``te``; nothing when it matches
    everything (P4Runtime leaves such a field out, section 9.1.1)."""
    top = (1 << bits) - 1

    def add():
        if m.kind != kind:
            raise SubcError(f"field {fid} is {kind} in the P4Info, the entry gives {m.kind}")
        return te.match.add(field_id=fid)

    if m.kind == "exact":
        add().exact.value = encode_value(m.a, bits)
    elif m.kind == "range":
        lo, hi = m.a, m.b
        if (lo, hi) == (0, top):
            return
        if lo > hi:
            raise SubcError(f"range {lo}..{hi} is empty")
        r = add().range
        r.low, r.high = encode_value(lo, bits), encode_value(hi, bits)
    elif m.kind == "lpm":
        value, plen = m.a, m.b
        if not 0 <= plen <= bits:
            raise SubcError(f"prefix length {plen} of a {bits}-bit field")
        if plen == 0:
            return
        lpm = add().lpm
        lpm.value = encode_value(value & (top ^ ((1 << (bits - plen)) - 1)), bits)
        lpm.prefix_len = plen
    elif m.kind == "ternary":
        value, mask = m.a, m.b
        if mask == 0:
            return
        t = add().ternary
        t.value, t.mask = encode_value(value & mask, bits), encode_value(mask, bits)
    else:
        raise SubcError(f"unknown match element {m}")


def table_entry(index: P4InfoIndex, table: str, entry: Entry, into=None, action: bool = True):
    """The ``p4.v1.TableEntry`` of one ``entry`` of ``table``, written into ``into`` (a TableEntry
    inside the message that will carry it: pure-Python protobuf copies a message given to a
    constructor) or a new one; without ``action`` (a DELETE names none).  SubcError for a field,
    action or parameter the P4Info lacks."""
    from p4.v1 import p4runtime_pb2 as pr

    ti = index.table(table)
    if len(entry.match) != len(ti.fields):
        raise SubcError(f"{table}: the entry has {len(entry.match)} match fields, the P4Info {len(ti.fields)}")
    te = pr.TableEntry() if into is None else into
    te.table_id = ti.id
    for (fid, _, bits, kind), m in zip(ti.fields, entry.match):
        _field_match(te, fid, kind, bits, m)
    if entry.priority is not None and any(k in PRIORITY_KINDS for *_, k in ti.fields):
        te.priority = entry.priority
    _, ai = index.action(table, entry.action)
    if not action:
        return te
    te.action.action.action_id = ai.id
    for pname, value in entry.params.items():
        if pname not in ai.params:
            raise SubcError(f"action {entry.action} of {table} has no parameter {pname} in the P4Info")
        pid, bits = ai.params[pname]
        te.action.action.params.add(param_id=pid, value=encode_value(value, bits))
    return te


def entry_update(index: P4InfoIndex, kind: int, table: str, entry: Entry, action: bool = True):
    """The ``p4.v1.Update`` of type ``kind`` (``Update.INSERT``, ``MODIFY``, ``DELETE``) of
    ``entry`` of ``table`` (built in place: no message copied); ``action`` as :func:`table_entry`."""
    from p4.v1 import p4runtime_pb2 as pr

    u = pr.Update(type=kind)
    table_entry(index, table, entry, into=u.entity.table_entry, action=action)
    return u


def multicast_entry(group: int, ports: Sequence[int], into=None):
    """The ``PacketReplicationEngineEntry`` of multicast group ``group`` (one replica per port),
    written into ``into`` or a new one."""
    from p4.v1 import p4runtime_pb2 as pr

    pre = pr.PacketReplicationEngineEntry() if into is None else into
    mg = pre.multicast_group_entry
    mg.multicast_group_id = group
    for p in ports:
        mg.replicas.add(egress_port=p, instance=0)
    return pre


def group_update(kind: int, group: int, ports: Sequence[int] = ()):
    """The ``p4.v1.Update`` of type ``kind`` of multicast group ``group`` with ``ports``."""
    from p4.v1 import p4runtime_pb2 as pr

    u = pr.Update(type=kind)
    multicast_entry(group, ports, into=u.entity.packet_replication_engine_entry)
    return u


def insert_updates(doc: EntriesDoc, index: P4InfoIndex) -> list:
    """``Update`` messages inserting every entry of ``doc``: its multicast groups first (entries
    refer to them), then its table entries in the order of its tables."""
    from p4.v1 import p4runtime_pb2 as pr

    ins = pr.Update.INSERT
    out = [group_update(ins, g, ports) for g, ports in doc.multicast_groups]
    for t in doc.tables:
        out += [entry_update(index, ins, t.name, e) for e in t.entries]
    return out
