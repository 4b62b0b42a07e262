"""Control-plane outputs: ``entries.json``, BMv2 ``commands.txt``, Tofino ``bfrt_setup.py``, ``report.json``.

``entries.json`` (format ``subc-entries``, version 1) is the one documented form of every table
entry and multicast group (see docs in README.md, "Outputs")::

    {"format": "subc-entries", "version": 2, "target": "bmv2", "control": "SubcIngress",
     "state_width": 2, "code_width": 1, "initial_state": 1, "state_key": "meta.subc_state",
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
key on is invalid).  Version 1 had a separate leaf table keyed by the final state.

Match elements are ``{"exact": v}``, ``{"range": [lo, hi]}``, ``{"lpm": [value, prefix_len]}``;
integers are exact (arbitrary precision).  Priorities follow P4Runtime (larger wins); BMv2
(``docs/runtime_CLI.md``: smallest value wins) and Tofino ``MATCH_PRIORITY`` (smallest wins) get
them inverted.
"""

from __future__ import annotations

import json

from ..driver import CompileResult
from ..tables import Pipeline, Table
from .safety import check_pipeline, identifier

CONTROL = "SubcIngress"


def _match_json(kind: str, m) -> dict:
    if kind == "exact":
        return {"exact": m}
    if kind == "range":
        return {"range": [m[0], m[1]]}
    if kind == "lpm":
        return {"lpm": [m[0], m[1]]}
    return {"ternary": [m[0], m[1]]}


def _table_json(t: Table) -> dict:
    return {
        "name": f"{CONTROL}.{t.name}",
        "role": t.role,
        "field": t.field,
        "size": t.size,
        "keys": [{"name": k.name, "match_kind": k.match_kind, "bitwidth": k.width} for k in t.keys],
        "default_action": {"action": t.default_action[0], "params": dict(t.default_action[1])},
        "entries": [
            {
                "match": [_match_json(k.match_kind, m) for k, m in zip(t.keys, e.match)],
                **({"priority": e.priority} if e.priority is not None else {}),
                "action": e.action,
                "params": dict(e.params),
            }
            for e in t.entries
        ],
    }


def entries_json(pipe: Pipeline, target: str) -> dict:
    """The ``entries.json`` document of ``pipe`` (see the module docstring)."""
    return {
        "format": "subc-entries",
        "version": 2,
        "target": target,
        "control": CONTROL,
        "state_width": pipe.state_width,
        "code_width": pipe.code_width,
        "initial_state": pipe.root_state,
        "state_key": f"{pipe.meta}.subc_state",
        "default_action": {"action": pipe.default_action[0], "params": dict(pipe.default_action[1])},
        "headers": pipe.headers,
        "field_order": pipe.field_order,
        "pipeline": [
            {"table": f"{CONTROL}.{s.table}", "on_miss": f"{CONTROL}.{s.on_miss}" if s.on_miss else None}
            for s in pipe.steps
        ],
        "tables": [_table_json(t) for t in pipe.tables],
        "multicast_groups": [{"group": g, "ports": list(p)} for g, p in sorted(pipe.mcast_groups.items())],
    }


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


def bmv2_commands(pipe: Pipeline) -> str:
    """``simple_switch_CLI`` commands that install every entry and multicast group.

    Multicast node handles are assumed to be allocated from 0 in order, as on a freshly started
    ``simple_switch``.
    """
    check_pipeline(pipe)
    top = _max_priority(pipe) + 1
    lines = ["// subc: simple_switch_CLI commands (run on a freshly started switch)"]
    for t in pipe.tables:
        for e in t.entries:
            keys = [_format_match(BMV2_MATCH, k.match_kind, m) for k, m in zip(t.keys, e.match)]
            params = " ".join(str(v) for _, v in e.params)
            prio = f" {top - e.priority}" if e.priority is not None else ""
            lines.append(f"table_add {CONTROL}.{t.name} {e.action} {' '.join(keys)} => {params}{prio}".rstrip())
    for handle, (gid, ports) in enumerate(sorted(pipe.mcast_groups.items())):
        lines.append(f"mc_mgrp_create {gid}")
        lines.append(f"mc_node_create {gid} {' '.join(str(p) for p in ports)}")
        lines.append(f"mc_node_associate {gid} {handle}")
    return "\n".join(lines) + "\n"


def bfrt_key_name(key_name: str) -> str:
    """The ``@name`` a key gets in the TNA program, hence its bfrt_python keyword."""
    return key_name.split(".", 1)[1].replace(".", "_")


def bfrt_setup(pipe: Pipeline, program: str = "subc") -> str:
    """A ``bfrt_python`` script (``bfshell -b bfrt_setup.py``) installing entries and PRE groups."""
    check_pipeline(pipe)
    identifier(program, "program name")
    top = _max_priority(pipe) + 1
    out = [
        "# subc: bfrt_python script; run with `bfshell -b bfrt_setup.py` after loading the program.",
        f"p4 = bfrt.{program}.pipe",
        f"ctl = p4.{CONTROL}",
        "",
    ]
    for t in pipe.tables:
        for e in t.entries:
            kw = [_format_match(BFRT_MATCH, k.match_kind, m, bfrt_key_name(k.name)) for k, m in zip(t.keys, e.match)]
            if e.priority is not None:
                kw.append(f"MATCH_PRIORITY={top - e.priority}")
            kw.extend(f"{p}={v}" for p, v in e.params)
            out.append(f"ctl.{t.name}.add_with_{e.action}({', '.join(kw)})")
    for gid, ports in sorted(pipe.mcast_groups.items()):
        out.append(
            f"bfrt.pre.node.add(MULTICAST_NODE_ID={gid}, MULTICAST_RID={gid}, "
            f"MULTICAST_LAG_ID=[], DEV_PORT={list(ports)})"
        )
        out.append(
            f"bfrt.pre.mgid.add(MGID={gid}, MULTICAST_NODE_ID=[{gid}], "
            "MULTICAST_NODE_L1_XID_VALID=[False], MULTICAST_NODE_L1_XID=[0])"
        )
    out.append("bfrt.complete_operations()")
    return "\n".join(out) + "\n"


def report_json(res: CompileResult) -> dict:
    """``report.json``: rule count, diagram states, field order, per table its match kinds and
    entries, per stage its states, multicast groups, TCAM estimate.  No timings, so that a compile's
    outputs are byte-identical from run to run (``subc compile --timings FILE`` writes them)."""
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
        "multicast_groups": len(pipe.mcast_groups),
    }


#: Nesting depth printed one item per line; deeper values (an entry, a match) go on one line each.
PRETTY_DEPTH = 4


def dumps(doc: dict) -> str:
    """JSON text of ``doc``: indented (one space per level) down to :data:`PRETTY_DEPTH`, then one
    compact line per value, lists of scalars on one line (the C encoder: 100K-rule entries in 0.2 s
    instead of 3 s)."""
    out: list[str] = []
    _pretty(doc, 0, out)
    out.append("\n")
    return "".join(out)


def _pretty(v, depth: int, out: list[str]) -> None:
    if depth >= PRETTY_DEPTH or not isinstance(v, (dict, list)) or not v or (
        isinstance(v, list) and not isinstance(v[0], (dict, list))
    ):
        out.append(json.dumps(v))  # a scalar, or a list of scalars (ports, field names), on one line
        return
    pad = "\n" + " " * (depth + 1)
    if isinstance(v, dict):
        out.append("{")
        for i, (k, x) in enumerate(v.items()):
            out.append(("," if i else "") + pad + json.dumps(k) + ": ")
            _pretty(x, depth + 1, out)
        out.append("\n" + " " * depth + "}")
    else:
        out.append("[")
        for i, x in enumerate(v):
            out.append(("," if i else "") + pad)
            _pretty(x, depth + 1, out)
        out.append("\n" + " " * depth + "]")
