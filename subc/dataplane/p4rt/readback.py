"""Entries read from a switch over P4Runtime, back in their ``entries.json`` form.

The inverse of :mod:`.requests` for the tables of a P4Info (P4Runtime specification v1.3):
values are big-endian byte strings of any length (a server may pad them); a match field the
entry leaves out matches everything: a whole-field range, an lpm of prefix length 0, a ternary
of mask 0 (section 9.1.1); actions are named as ``entries.json`` names them, without the control
of their table (``subc_set_state``), and their parameters by name.
"""

from __future__ import annotations

from dataclasses import replace

from ...backends.p4.entries_doc import EntriesDoc, Entry, Match
from ...errors import SubcError
from .requests import P4InfoIndex


def decode_value(raw: bytes) -> int:
    """The unsigned integer of a P4Runtime byte string (network order)."""
    return int.from_bytes(raw, "big")


def _action_name(table: str, full: str) -> str:
    control = table.rsplit(".", 1)[0] + "."
    return full[len(control) :] if full.startswith(control) else full


def decode_entry(index: P4InfoIndex, te) -> tuple[str, Entry]:
    """(table name, entry) of the ``p4.v1.TableEntry`` ``te``.
    SubcError for a table, field or action the P4Info lacks, or an indirect action."""
    table = index.table_names.get(te.table_id)
    if table is None:
        raise SubcError(f"the switch returned an entry of table id {te.table_id}, which its P4Info lacks")
    info = index.tables[table]
    given = {fm.field_id: fm for fm in te.match}
    match: list[Match] = []
    for fid, name, bits, kind in info.fields:
        fm = given.pop(fid, None)
        top = (1 << bits) - 1
        if fm is None:
            if kind not in ("range", "lpm", "ternary"):
                raise SubcError(f"{table}: the switch returned an entry without its {kind} field {name}")
            match.append(Match(kind, 0, top) if kind == "range" else Match(kind, 0, 0))
            continue
        which = fm.WhichOneof("field_match_type")
        if which == "exact":
            match.append(Match("exact", decode_value(fm.exact.value)))
        elif which == "range":
            match.append(Match("range", decode_value(fm.range.low), decode_value(fm.range.high)))
        elif which == "lpm":
            match.append(Match("lpm", decode_value(fm.lpm.value), fm.lpm.prefix_len))
        elif which == "ternary":
            match.append(Match("ternary", decode_value(fm.ternary.value), decode_value(fm.ternary.mask)))
        else:
            raise SubcError(f"{table}: field {name} has a {which} match, which subc does not write")
    if given:
        raise SubcError(f"{table}: the switch returned match fields {sorted(given)} that the P4Info lacks")
    priority = te.priority if any(k in ("range", "ternary", "optional") for *_, k in info.fields) else None
    action, params = decode_action(index, table, te)
    return table, Entry(tuple(match), priority, action, params)


def decode_action(index: P4InfoIndex, table: str, te) -> tuple[str, dict]:
    """(action name, params) of entry ``te`` of ``table`` (entries.json names).  SubcError for an
    indirect action or an action the P4Info lacks."""
    if te.action.WhichOneof("type") != "action":
        raise SubcError(f"{table}: the switch returned an indirect action, which subc does not write")
    act = te.action.action
    full = index.action_names.get(act.action_id)
    if full is None:
        raise SubcError(f"{table}: the switch returned action id {act.action_id}, which its P4Info lacks")
    names = {pid: pname for pname, (pid, _) in index.actions[full].params.items()}
    return _action_name(table, full), {names[p.param_id]: decode_value(p.value) for p in act.params}


def switch_document(skeleton: EntriesDoc, index: P4InfoIndex, entries: list, root_entry, groups: list) -> EntriesDoc:
    """The entries.json document of what a switch holds: ``skeleton`` (a compiled entries.json
    of the same program: tables, keys, field order) with the entries of ``entries``
    (``TableEntry`` messages), the root of ``root_entry`` (the default entry of the root table)
    and the multicast groups of ``groups`` (``MulticastGroupEntry`` messages).

    SubcError when the switch holds entries of a table the skeleton lacks."""
    by_table: dict[str, list[Entry]] = {t.name: [] for t in skeleton.tables}
    root_table = skeleton.root.table
    for te in entries:
        table, e = decode_entry(index, te)
        if table == root_table:
            continue
        if table not in by_table:
            raise SubcError(
                f"the switch holds entries of table {table}, which the rule set's program does not have: "
                "it runs another program (reload it: subc load --config)"
            )
        by_table[table].append(e)
    action, params = decode_action(index, root_table, root_entry)
    if action != skeleton.root.action:
        raise SubcError(f"the root table {root_table} runs action {action}, not {skeleton.root.action}")
    return replace(
        skeleton,
        initial_state=params[skeleton.root.param],
        tables=tuple(replace(t, entries=tuple(by_table[t.name])) for t in skeleton.tables),
        multicast_groups=tuple(
            sorted((g.multicast_group_id, tuple(sorted(r.egress_port for r in g.replicas))) for g in groups)
        ),
    )
