"""Control-plane outputs: ``entries.json``, BMv2 ``commands.txt``, Tofino ``bfrt_setup.py``, ``report.json``.

``entries.json`` (format ``subc-entries``, version 1) is the one documented form of every table
entry and multicast group (docs/outputs.md)::

    {"format": "subc-entries", "version": 2, "target": "bmv2", "control": "SubcIngress",
     "state_width": 3, "code_width": 1, "initial_state": 1, "state_key": "meta.subc_state",
     "root": {"table": "SubcIngress.subc_root", "action": "subc_set_root", "param": "root"},
     "default_action": {"action": "subc_drop", "params": {}}, "headers": ["add_order"],
     "pipeline": [{"table": "SubcIngress.subc_add_order_stock", "on_miss": "...miss"}, ...],
     "tables": [{"name": "SubcIngress.subc_add_order_shares", "role": "stage",
                 "field": "add_order.shares", "size": 2,
                 "keys": [{"name": "meta.subc_state", "match_kind": "exact", "bitwidth": 2}, ...],
                 "default_action": {"action": "subc_set_state", "params": {"next_state": 0}},
                 "entries": [{"match": [{"exact": 1}, {"range": [0, 59]}], "priority": 2,
                              "action": "subc_set_state", "params": {"next_state": 1}}]}],
     "multicast_groups": [{"group": 1, "ports": [1, 2]}]}

The last stage's entries (and its ``_miss`` table's) apply the packet's action: ``subc_fwd``
(``port``), ``subc_mcast`` (``group``), ``subc_drop``, ``subc_nop`` or a spec action;
``default_action`` is what a packet that matches no rule gets (also when a header the tables
key on is invalid).  ``root`` names the keyless table whose default action holds the root state
(``initial_state`` as compiled): a P4Runtime update writes new states next to the old ones and
switches this one default action last (:mod:`subc.dataplane.p4rt.plan`).  The state width has one
bit more than the states need, and ``size`` is the entries times ``subc compile
--capacity-factor``: room for both.  Version 1 had a separate leaf table keyed by the final state.

Match elements are ``{"exact": v}``, ``{"range": [lo, hi]}``, ``{"lpm": [value, prefix_len]}``;
integers are exact (arbitrary precision).  Priorities follow P4Runtime (larger wins); BMv2
(``docs/runtime_CLI.md``: smallest value wins) and Tofino ``MATCH_PRIORITY`` (smallest wins) get
them inverted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ...ir.aggregates import UPDATE_ATOM
from ...ir.decisions import COUNT_ATOM
from ...compiler.driver import CompileResult
from .tables import COUNT_TABLE, UPDATE_TABLE, Pipeline, Table, field_key_name
from ..output import TextStream
from ..safety import check_pipeline, identifier
from ...compiler.target import P4_TARGETS, Target
from .entries_doc import (
    ActionCall,
    CountUpdate,
    Entry,
    EntriesDoc,
    Held,
    InstanceDoc,
    Key,
    Match,
    MessagesDoc,
    RootRef,
    StateDoc,
    StateValue,
    Step,
    TableDoc,
)

CONTROL = "SubcIngress"


def _table_doc(t: Table, control: str = CONTROL) -> TableDoc:
    kinds = [k.match_kind for k in t.keys]
    exact: dict[int, Match] = {}  # one element per exact value (a stage's state key repeats a few)

    def match(kind: str, m) -> Match:
        if kind != "exact":
            return Match(kind, m[0], m[1])
        got = exact.get(m)
        if got is None:
            got = exact[m] = Match("exact", m)
        return got

    return TableDoc(
        f"{control}.{t.name}",
        t.role,
        t.field,
        t.size,
        tuple(Key(k.name, k.match_kind, k.width) for k in t.keys),
        ActionCall(t.default_action[0], dict(t.default_action[1])),
        tuple(
            Entry(tuple([match(kind, m) for kind, m in zip(kinds, e.match)]), e.priority, e.action, dict(e.params))
            for e in t.entries
        ),
    )


def entries_doc(pipe: Pipeline, target: str, plan=None) -> EntriesDoc:
    """The ``entries.json`` document of ``pipe`` (see the module docstring;
    :meth:`~.entries_doc.EntriesDoc.to_json` gives its JSON).

    With ``plan`` (a :class:`~.p4slots.SlotPlan`: the multi-message program), the tables' leaf
    entries take their per-message form (``subc_msg_fwd(ports)``: a bitmap over
    ``messages.ports``, ``subc_msg_hold(code)``: a non-forwarding decision of ``messages.held``),
    every table is written once per message slot (``slot``: its index; the slots' copies carry the
    same entries, and ``pipeline`` names slot 0's), the delivery tables ``subc_deliver`` (ingress)
    and ``subc_port_bit`` (egress) are added, and ``multicast_groups`` is the one group of all
    subscriber ports."""
    base = EntriesDoc(
        target=target,
        control=CONTROL,
        state_width=pipe.state_width,
        code_width=pipe.code_width,
        initial_state=pipe.root_state,
        root=RootRef(f"{CONTROL}.subc_root", "subc_set_root", "root"),
        state_key=f"{pipe.meta}.subc_state",
        default_action=ActionCall(pipe.default_action[0], dict(pipe.default_action[1])),
        headers=tuple(pipe.headers),
        field_order=tuple(pipe.field_order),
        pipeline=tuple(
            Step(f"{CONTROL}.{s.table}", f"{CONTROL}.{s.on_miss}" if s.on_miss else None) for s in pipe.steps
        ),
        tables=tuple(_table_doc(t) for t in pipe.tables) if plan is None else (),  # (a plan's: below)
        multicast_groups=tuple((g, tuple(p)) for g, p in sorted(pipe.mcast_groups.items())),
        state=state_doc(pipe) if pipe.state is not None else None,
    )
    if plan is None:
        return base
    from .slots import ALL_PORTS_GROUP, COUNTERS, message_action, slot_table_name

    tables = []
    for t, names in _installed(pipe, plan, target):
        tdoc = _table_doc(t)
        for i, name in enumerate(names):
            if t.role in ("deliver", "egress"):
                tables.append(replace(tdoc, name=name))
                continue
            keys = tuple(Key(slot_key(k.name, i, plan, pipe), k.match_kind, k.width, k.field or None) for k in t.keys)
            tables.append(replace(tdoc, name=name, keys=keys, slot=i))  # the slots share one entries tuple
    action, params = message_action(plan, pipe, pipe.default_action)
    return replace(
        base,
        default_action=ActionCall(action, dict(params)),
        state_key=f"{pipe.meta}.subc_s0_state",
        code_key=f"{pipe.meta}.subc_s0_code",
        pipeline=tuple(
            Step(
                f"{CONTROL}.{slot_table_name(s.table, 0)}",
                f"{CONTROL}.{slot_table_name(s.on_miss, 0)}" if s.on_miss else None,
            )
            for s in pipe.steps
        ),
        tables=tuple(tables),
        multicast_groups=((ALL_PORTS_GROUP, tuple(plan.ports)),) if plan.ports else (),
        messages=MessagesDoc(
            max_messages=plan.max_messages,
            overflow_port=plan.overflow_port,
            ports=tuple(plan.ports),
            held=tuple(Held(c, a, dict(p)) for (a, p), c in sorted(plan.held.items(), key=lambda x: x[1])),
            counters={
                "SubcIngress.subc_datagrams": list(COUNTERS),
                "SubcIngress.subc_held": "messages withheld, by code (Tofino: one counter per slot, subc_held_s<i>)",
            },
            sequence_register="SubcEgress.subc_seq",
        ),
        # every slot's messages update the one set of registers, in order
        state=state_doc(pipe, slot_table_name(UPDATE_TABLE, 0), slot_table_name(COUNT_TABLE, 0))
        if pipe.state is not None
        else None,
    )


def state_doc(pipe: Pipeline, update_table: str = UPDATE_TABLE, count_table: str = COUNT_TABLE) -> StateDoc:
    """The ``state`` section of ``entries.json``: what a target keeps and computes for comparisons
    on state (:mod:`subc.ir.aggregates`), for a simulator or a control plane to read.

    ``update_table`` (the full name of the table applied before the first state-value stage, by
    default :data:`~subc.backends.p4.tables.UPDATE_TABLE`; its ``mask`` parameter, bit k
    for instance k, goes to ``mask_key``), ``time`` (``field``: the query field giving a message's
    time in ``unit_ns``, or null for the arrival time), ``instances`` (``index``, ``kind``
    (``counter`` for a named counter, with its ``name``), ``field``, ``window_ns``,
    ``thresholds``), ``values`` (``key``: the metadata a stage matches, ``field``, ``instance``,
    ``threshold``, ``width`` in bits) and, when rules update named counters, ``count_table``
    (the full name of the table after the last stage; its ``mask`` parameter, bit j for update
    j, goes to ``count_key``) and ``count_updates`` (``index``, ``instance``, ``field``: added,
    or null to add 1)."""
    st = pipe.state
    assert st is not None, "a pipeline without comparisons on state has no state section"
    counts = bool(st.count_updates)
    return StateDoc(
        update_table=f"{CONTROL}.{update_table}",
        mask_key=f"{pipe.meta}.{UPDATE_ATOM}",
        time_field=st.time_field.name if st.time_field else None,
        unit_ns=st.time_unit_ns,
        instances=tuple(InstanceDoc.from_json(i.as_json()) for i in st.instances),
        values=tuple(
            StateValue(
                field_key_name(v.field.name, pipe.hdr, pipe.meta), v.field.name, v.instance, v.threshold, v.field.width
            )
            for v in st.values
        ),
        count_table=f"{CONTROL}.{count_table}" if counts else None,
        count_key=f"{pipe.meta}.{COUNT_ATOM}" if counts else None,
        count_updates=tuple(
            CountUpdate(u.index, u.instance, u.field.name if u.field else None) for u in st.count_updates
        ),
    )


def slot_key(name: str, i: int, plan, pipe: Pipeline) -> str:
    """The P4 expression of key ``name`` in slot ``i``'s copy of a table."""
    from .slot_parser import rename_instances

    if name == f"{pipe.meta}.subc_state":
        return f"{pipe.meta}.subc_s{i}_state"
    if name == f"{pipe.meta}.subc_code":
        return f"{pipe.meta}.subc_s{i}_code"
    return rename_instances(name, pipe.hdr, [inst for inst, _ in plan.slot], f"subc_s{i}")


def _message_tables(pipe: Pipeline, plan) -> list[Table]:
    from .slots import message_tables

    return message_tables(plan, pipe)


def _delivery_tables(plan, target: str) -> list[tuple[Table, str]]:
    from .slots import deliver_table, port_bit_table

    port_key = "eg_intr_md.egress_port" if target == Target.TOFINO else "standard_metadata.egress_port"
    return [(deliver_table(plan), CONTROL), (port_bit_table(plan, port_key), "SubcEgress")]


#: How a match element is written: simple_switch_CLI (docs/runtime_CLI.md) and bfrt_python keywords.
BMV2_MATCH = {"exact": "{0}", "range": "{0}->{1}", "lpm": "{0}/{1}", "ternary": "{0}&&&{1}"}
BFRT_MATCH = {
    "exact": "{n}={0}",
    "range": "{n}_start={0}, {n}_end={1}",
    "lpm": "{n}={0}, {n}_p_length={1}",
    "ternary": "{n}={0}, {n}_mask={1}",
}


def _format_match(formats: dict[str, str], kind: str, m, name: str = "") -> str:
    return formats[kind].format(*((m,) if kind == "exact" else m), n=name)


def _max_priority(pipe: Pipeline) -> int:
    return max([e.priority for t in pipe.tables for e in t.entries if e.priority is not None] or [0])


def _installed(pipe: Pipeline, plan, target: str) -> list[tuple[Table, list[str]]]:
    """(table, the full names of the tables that carry its entries) of what a control plane installs."""
    if plan is None:
        return [(t, [f"{CONTROL}.{t.name}"]) for t in pipe.tables]
    from .slots import slot_table_name

    out = [
        (t, [f"{CONTROL}.{slot_table_name(t.name, i)}" for i in range(plan.max_messages)])
        for t in _message_tables(pipe, plan)
    ]
    out += [(t, [f"{control}.{t.name}"]) for t, control in _delivery_tables(plan, target)]
    return out


def _groups(pipe: Pipeline, plan) -> list[tuple[int, tuple[int, ...]]]:
    if plan is None:
        return sorted(pipe.mcast_groups.items())
    from .slots import ALL_PORTS_GROUP

    return [(ALL_PORTS_GROUP, tuple(plan.ports))] if plan.ports else []


def bmv2_commands(pipe: Pipeline, plan=None) -> str:
    """``simple_switch_CLI`` commands that install every entry and multicast group (with ``plan``,
    the multi-message program's: each entry once per message slot, the delivery tables).

    Multicast node handles are assumed to be allocated from 0 in order, as on a freshly started
    ``simple_switch``.  Raises SubcError as :func:`~..safety.check_pipeline` does.
    """
    return str(bmv2_commands_stream(pipe, plan))


def bmv2_commands_stream(pipe: Pipeline, plan=None) -> TextStream:
    """:func:`bmv2_commands` as a :class:`~..output.TextStream` (written one table at a time;
    the pipeline is checked now)."""
    check_pipeline(pipe)

    def write(emit: Callable[[str], object]) -> None:
        top = _max_priority(pipe) + 1
        emit("// subc: simple_switch_CLI commands (run on a freshly started switch)\n")
        for t, names in _installed(pipe, plan, "bmv2"):
            tails = []  # what follows the table name, the same in every slot's copy
            kinds = [k.match_kind for k in t.keys]
            for e in t.entries:
                keys = [_format_match(BMV2_MATCH, kind, m) for kind, m in zip(kinds, e.match)]
                params = " ".join(str(v) for _, v in e.params)
                prio = f" {top - e.priority}" if e.priority is not None else ""
                tails.append(f" {e.action} {' '.join(keys)} => {params}{prio}".rstrip())
            for name in names:  # one join a copy: its lines are the tails after the same head
                if tails:
                    head = f"table_add {name}"
                    emit(head + f"\n{head}".join(tails) + "\n")
        for handle, (gid, ports) in enumerate(_groups(pipe, plan)):
            emit(f"mc_mgrp_create {gid}\n")
            emit(f"mc_node_create {gid} {' '.join(str(p) for p in ports)}\n")
            emit(f"mc_node_associate {gid} {handle}\n")

    return TextStream(write)


def bfrt_key_name(key_name: str) -> str:
    """The ``@name`` a key gets in the TNA program, hence its bfrt_python keyword."""
    return key_name.split(".", 1)[1].replace(".", "_")


def bfrt_setup(pipe: Pipeline, program: str = "subc", plan=None) -> str:
    """A ``bfrt_python`` script (``bfshell -b bfrt_setup.py``) installing entries and PRE groups
    (with ``plan``, the multi-message program's: each entry once per message slot).  Raises
    SubcError as :func:`~..safety.check_pipeline` does, or for a bad program name."""
    return str(bfrt_setup_stream(pipe, program, plan))


def bfrt_setup_stream(pipe: Pipeline, program: str = "subc", plan=None) -> TextStream:
    """:func:`bfrt_setup` as a :class:`~..output.TextStream` (written one table copy at a time;
    the pipeline and the program name are checked now)."""
    check_pipeline(pipe)
    identifier(program, "program name")

    def write(emit: Callable[[str], object]) -> None:
        top = _max_priority(pipe) + 1
        emit("# subc: bfrt_python script; run with `bfshell -b bfrt_setup.py` after loading the program.\n")
        emit(f"p4 = bfrt.{program}.pipe\n\n")
        for t, names in _installed(pipe, plan, "tofino"):
            for i, name in enumerate(names):
                keys = [
                    bfrt_key_name(
                        slot_key(k.name, i, plan, pipe) if plan and t.role not in ("deliver", "egress") else k.name
                    )
                    for k in t.keys
                ]
                lines = []
                for e in t.entries:
                    kw = [_format_match(BFRT_MATCH, k.match_kind, m, kn) for k, m, kn in zip(t.keys, e.match, keys)]
                    if e.priority is not None:
                        kw.append(f"MATCH_PRIORITY={top - e.priority}")
                    kw.extend(f"{p}={v}" for p, v in e.params)
                    lines.append(f"p4.{name}.add_with_{e.action}({', '.join(kw)})\n")
                emit("".join(lines))
        for gid, ports in _groups(pipe, plan):
            emit(
                f"bfrt.pre.node.add(MULTICAST_NODE_ID={gid}, MULTICAST_RID={gid}, "
                f"MULTICAST_LAG_ID=[], DEV_PORT={list(ports)})\n"
            )
            emit(
                f"bfrt.pre.mgid.add(MGID={gid}, MULTICAST_NODE_ID=[{gid}], "
                "MULTICAST_NODE_L1_XID_VALID=[False], MULTICAST_NODE_L1_XID=[0])\n"
            )
        emit("bfrt.complete_operations()\n")

    return TextStream(write)


def report_json(res: CompileResult, plan=None, single_reason: str | None = None) -> dict:
    """``report.json``: rule count, diagram states, field order, per table its match kinds and
    entries, per stage its states, multicast groups, TCAM estimate, and ``messages``: the
    multi-message program's K (``max_messages``), overflow port, subscriber ports and entries
    installed over all slots (with ``plan``), or why the program is single-message
    (``single_reason``).  No timings, so that a compile's outputs are byte-identical from run to
    run (``subc compile --timings FILE`` writes them)."""
    pipe = res.pipeline
    stages = []
    for st in res.ir.stages:
        name = st.field.name
        tables = [t for t in pipe.tables if t.field == name]
        stages.append(
            {
                "field": name,
                "form": pipe.match_forms[name],
                "states": len(st.states),
                "next_states": st.n_next,
                "entries": sum(t.entry_count for t in tables),
            }
        )
    return {
        "target": res.target,
        "rules": len(res.rules),
        "diagram_states": res.diagram_states,
        "field_order": pipe.field_order,
        "orders_tried": res.orders_tried,
        "state_width": pipe.state_width,
        "stages": stages,
        "tables": [
            {
                "name": f"{CONTROL}.{t.name}",
                "role": t.role,
                "match_kinds": [k.match_kind for k in t.keys],
                "entries": t.entry_count,
                "tcam_words_estimate": t.tcam_words,
            }
            for t in pipe.tables
        ],
        "leaf_states": len(res.ir.leaves),
        "total_entries": pipe.total_entries,
        "multicast_groups": len(_groups(pipe, plan)),
        "messages": _messages_report(res, plan, single_reason),
    }


def _messages_report(res: CompileResult, plan, single_reason: str | None) -> dict | None:
    if res.target not in P4_TARGETS or not res.spec.whole_program:
        return None
    if plan is None:
        return {"mode": "single", "max_messages": 1, "reason": single_reason}
    installed = _installed(res.pipeline, plan, res.target)
    return {
        "mode": "multi",
        "max_messages": plan.max_messages,
        "overflow_port": plan.overflow_port,
        "ports": list(plan.ports),
        "slot_header_bits": plan.slot_bits,
        "tables_per_slot": len(res.pipeline.tables),
        "tables": sum(len(names) for _, names in installed),
        "entries_installed": sum(len(t.entries) * len(names) for t, names in installed),
        "multicast_groups": len(_groups(res.pipeline, plan)),
    }
