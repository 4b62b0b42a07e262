"""P4_16 program generation from Jinja templates (``subc/backends/p4/templates``).

``render_program`` gives a whole program for BMv2 (``v1model.p4``) or Tofino (``tna.p4``) when
the spec has headers and a parser, else the subscription control block only.  Every identifier
that reaches a template comes from the spec parser (already a P4 identifier) or from subc, and is
checked again at the template boundary (:mod:`.safety`); rule literals reach it only as integers.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path


from ... import __version__
from ...compiler.driver import CompileResult
from .tables import COUNT_TABLE, UPDATE_TABLE
from .entries import slot_key, bfrt_key_name
from .slots import (
    ALL_PORTS_GROUP,
    COUNTERS,
    DEFAULT_MAX_MESSAGES,
    KIND_DATA,
    KIND_HEARTBEAT,
    KIND_NONE,
    SlotPlan,
    deliver_table,
    message_action,
    message_tables,
    slot_plan,
    slot_table_name,
)
from ..templating import environment
from ..safety import check_action, check_pipeline, comment_text, identifier, number
from ...compiler.target import Target

TEMPLATES = Path(__file__).resolve().parent / "templates"


@lru_cache(maxsize=1)
def _call(action: tuple[str, tuple]) -> str:
    check_action(action, "default")
    name, params = action
    return f"{name}({', '.join(str(v) for _, v in params)})"


def _table_ctx(t) -> dict:
    return {
        "name": t.name,
        "key_fields": [
            {"name": k.name, "match_kind": k.match_kind, "bfrt_name": bfrt_key_name(k.name)} for k in t.keys
        ],
        "actions": t.actions,
        "default_action": t.default_action,
        "default_call": _call(t.default_action),
        "size": t.size,
    }


def program_context(res: CompileResult, rules_path: str, tna: bool) -> dict:
    """The template context for ``res`` (see the templates for the names used)."""
    spec, pipe = res.spec, res.pipeline
    check_pipeline(pipe)
    parser = spec.parser
    ctx: dict[str, object] = {
        "version": __version__,
        "tna": tna,
        "rules_path": comment_text(rules_path),
        "spec_path": comment_text(spec.path),
        "n_rules": len(res.rules),
        "field_order": pipe.field_order,
        "state_width": pipe.state_width,
        "code_width": pipe.code_width,
        "uses_code": any(t.role == "code" for t in pipe.tables),
        "tables": [_table_ctx(t) for t in pipe.tables],
        "steps": pipe.steps,
        "root_state": pipe.root_state,
        "headers": pipe.headers,
        "hdr": pipe.hdr,
        "meta": pipe.meta,
        "spec_actions": [a.text for a in spec.actions.values()],
        "default_call": _call(pipe.default_action),
        "headers_type": parser.headers_type if parser else "headers",
        "packet": parser.packet if parser else "packet",
        "std_meta": (parser.std_meta if parser and parser.std_meta else "standard_metadata"),
    }
    for name in (ctx["hdr"], ctx["meta"], ctx["packet"], ctx["std_meta"], ctx["headers_type"]):
        identifier(name, "parser parameter")
    for a in spec.actions.values():
        identifier(a.name, "spec action")
    meta_members: list[str] = []
    if parser is not None:
        rename = (lambda n: "subc_spec_start" if n == "start" else n) if tna else (lambda n: n)
        for s in parser.states:
            identifier(s.name, "parser state")
            for _, t in s.transition.cases:
                identifier(t, "parser state")
        ctx["states"] = [
            {
                "name": rename(s.name),
                "statements": s.statements,
                "select": s.transition.select_text,
                "cases": [(ks, rename(t)) for ks, t in s.transition.cases],
            }
            for s in parser.states
        ]
        ctx["decls"] = [text for kind, name, text in spec.decls if not (kind == "struct" and name == parser.meta_type)]
        meta_members = [raw for _, _, raw in spec.structs.get(parser.meta_type or "", [])]
        ctx["meta_members"] = meta_members
    agg = _state_context(res, ctx, tna)
    ctx["agg"] = agg
    if agg is not None:
        ctx["meta_members"] = meta_members + agg["meta_members"]
    return ctx


def _state_context(res: CompileResult, ctx: dict, tna: bool, plan: SlotPlan | None = None) -> dict | None:
    """The ``agg`` context of the comparisons on state (:mod:`.p4state`), or None."""
    pipe = res.pipeline
    if pipe.state is None:
        return None
    from .state import tna_state, v1model_state  # (a rule set without state does not import it)

    if plan is None:
        key_of = lambda b, name: f"{pipe.hdr}.{name}"  # noqa: E731
    else:
        key_of = lambda b, name: slot_key(f"{pipe.hdr}.{name}", b, plan, pipe)  # noqa: E731
    if tna:  # one message per packet touches the registers (target_files checks)
        agg = tna_state(pipe, lambda name: key_of(0, name), "ig_intr_md.ingress_mac_tstamp")
        assert agg is not None  # None only when the pipeline has no state plan
        return {**agg, "table": UPDATE_TABLE, "count_table": None}
    agg = v1model_state(
        pipe, key_of, f"{ctx['std_meta']}.ingress_global_timestamp", plan.max_messages if plan is not None else 1
    )
    assert agg is not None  # None only when the pipeline has no state plan
    return {**agg, "table": UPDATE_TABLE, "count_table": COUNT_TABLE}


def _bound(action: str, i: int, meta: str) -> str | None:
    """The metadata field slot ``i``'s copy of ``action`` writes (its ``out`` parameter)."""
    return {
        "subc_set_state": f"{meta}.subc_s{i}_state",
        "subc_set_code": f"{meta}.subc_s{i}_code",
        "subc_msg_fwd": f"{meta}.subc_s{i}_ports",
        "subc_msg_hold": f"{meta}.subc_s{i}_held",
    }.get(action)


def _slot_call(action: tuple[str, tuple], i: int, meta: str) -> str:
    check_action(action, "default")
    name, params = action
    bound = _bound(name, i, meta)
    args = ([bound] if bound else []) + [str(v) for _, v in params]
    return f"{name}({', '.join(args)})"


def _slot_default(action: tuple[str, tuple], i: int, meta: str) -> str:
    """The statement giving slot ``i`` the per-message default ``action`` when its headers are
    invalid: an assignment to the slot's metadata, not a call.  A direct call with constant
    arguments makes p4c emit a second action of the same name without action data, and
    ``simple_switch_CLI`` resolves names to the last one, so ``table_add ... subc_msg_hold``
    would then be refused."""
    check_action(action, "default")
    name, params = action
    bound = _bound(name, i, meta)
    if bound is None or len(params) != 1:
        return _slot_call(action, i, meta)
    return f"{bound} = {params[0][1]}"


def _tree_sum(terms: list[str], op: str = "+") -> str:
    """``terms`` combined pairwise (a balanced tree: log2(n) dependent operations on Tofino)."""
    while len(terms) > 1:
        terms = [
            f"({terms[k]} {op} {terms[k + 1]})" if k + 1 < len(terms) else terms[k] for k in range(0, len(terms), 2)
        ]
    return terms[0]


def multi_message_context(res: CompileResult, plan: SlotPlan, tna: bool, ctx: dict) -> dict:
    """The ``mm`` template context of the multi-message program (see :mod:`.p4slots`)."""
    pipe = res.pipeline
    hdr, meta, std = ctx["hdr"], ctx["meta"], ctx["std_meta"]
    K = plan.max_messages
    slots = list(range(K))
    slot_insts = [inst for inst, _ in plan.slot]
    t_ctx = _mm_tables(plan, pipe, meta)
    steps = _mm_steps(pipe, slots)
    headers = [
        [f"{hdr}.subc_s{i}.{h}.isValid()" if h in slot_insts else f"{hdr}.{h}.isValid()" for h in pipe.headers]
        for i in slots
    ]
    default = message_action(plan, pipe, pipe.default_action)
    block_len_rel = plan.f["block_len"].split(".", 2)[2]  # 'inst.field' inside a slot
    block_inst = block_len_rel.split(".")[0]
    n_held = max(plan.held.values()) + 1
    if tna:
        overflow, mm_target, count_held, eg_ports, eg_size = _tna_mm_target(plan, hdr, meta, slots)
    else:
        overflow, mm_target, count_held, eg_ports, eg_size = _v1model_mm_target(plan, meta, std)
    count = lambda name: f"subc_datagrams.count({COUNTERS.index(name)});"  # noqa: E731
    for p in plan.ports:
        number(p, "port")
    bridge_bits = 8 + plan.port_bits * (K + 1) + 16 * K
    return {
        "K": K,
        "slots": slots,
        "slot": plan.slot,
        "top": plan.top,
        "port_bits": plan.port_bits,
        "ports": plan.ports,
        "group": ALL_PORTS_GROUP,
        "tables": t_ctx,
        "steps": steps,
        "headers": headers,
        "default_calls": [_slot_default(default, i, meta) for i in slots],
        "counters": COUNTERS,
        "n_held": n_held,
        "count": count,
        "count_held": count_held,
        "overflow": overflow,
        "cnt": plan.f["count"],
        "block_len": plan.f["block_len"],
        "block_len_rel": block_len_rel,
        "block_inst": block_inst,
        "udp_len": plan.f["udp_len"],
        "ip_len": plan.f["ip_len"],
        "ip_csum": plan.f["ip_csum"],
        "udp_csum": plan.f["udp_csum"],
        "ip_src": plan.f["ip_src"],
        "ip_dst": plan.f["ip_dst"],
        "ip_proto": plan.f["ip_proto"],
        "ip_fields": plan.f["ip_fields"],
        "udp_fields": plan.f["udp_fields"],
        "mold": plan.f["mold"],
        "ipv4": plan.f["ipv4"],
        "size_sum": _tree_sum([f"{meta}.subc_s{i}_size" for i in slots]),
        "union_expr": _tree_sum([f"{meta}.subc_s{i}_ports" for i in slots], "|"),
        "kept_sum": _tree_sum([f"{meta}.subc_s{i}_keep" for i in slots]),
        "rm_sum": _tree_sum([f"{meta}.subc_s{i}_rm" for i in slots]),
        "eg_ports": eg_ports,
        "eg_size": eg_size,
        "kind_none": KIND_NONE,
        "kind_data": KIND_DATA,
        "kind_heartbeat": KIND_HEARTBEAT,
        "bridge_pad": -bridge_bits % 8,
        **mm_target,
    }


def _mm_tables(plan: SlotPlan, pipe, meta: str) -> list[dict]:
    """The template context of every slot's copy of the message tables, then the deliver table."""
    slots = range(plan.max_messages)
    tables = message_tables(plan, pipe)
    t_ctx = []
    for i in slots:
        for t in tables:
            t_ctx.append(
                {
                    "name": slot_table_name(t.name, i),
                    "key_fields": [
                        {
                            "name": slot_key(k.name, i, plan, pipe),
                            "match_kind": k.match_kind,
                            "bfrt_name": bfrt_key_name(slot_key(k.name, i, plan, pipe)),
                        }
                        for k in t.keys
                    ],
                    "actions": [f"{a}({_bound(a, i, meta)})" if _bound(a, i, meta) else a for a in t.actions],
                    "noaction": t.default_action[0] == "NoAction",
                    "default_call": "NoAction()"
                    if t.default_action[0] == "NoAction"
                    else _slot_call(t.default_action, i, meta),
                    "size": t.size,
                }
            )
    d = deliver_table(plan)
    t_ctx.append(
        {
            "name": d.name,
            "key_fields": [{"name": f"{meta}.subc_union", "match_kind": "exact", "bfrt_name": "subc_union"}],
            "actions": d.actions,
            "noaction": False,
            "default_call": "subc_multicast()",
            "size": d.size,
        }
    )
    return t_ctx


def _mm_steps(pipe, slots: list[int]) -> list[list[dict]]:
    """Per slot, the tables to apply in order (with their miss tables and what they are)."""
    return [
        [
            {
                "table": slot_table_name(s.table, i),
                "on_miss": slot_table_name(s.on_miss, i) if s.on_miss else None,
                "state": s.table == UPDATE_TABLE,
                "count": s.table == COUNT_TABLE,
            }
            for s in pipe.steps
        ]
        for i in slots
    ]


def _tna_mm_target(plan: SlotPlan, hdr: str, meta: str, slots: list[int]) -> tuple:
    """The TNA (Tofino) specifics of the multi-message program: (overflow statements, template
    names, and the held-counter, egress ports and egress size expressions per slot)."""
    overflow = (
        [f"ig_tm_md.ucast_egress_port = {plan.overflow_port};"]
        if plan.overflow_port is not None
        else ["ig_dprsr_md.drop_ctl = 1;"]
    )
    mm_target = {
        "port_type": "PortId_t",
        "unicast": "ig_tm_md.ucast_egress_port",
        "multicast": "ig_tm_md.mcast_grp_a",
        "drop": "ig_dprsr_md.drop_ctl = 1;",
        "parser_error": "ig_prsr_md.parser_err != 0",
        "egress_port": "eg_intr_md.egress_port",
        "eg_kind": f"{meta}.subc_kind",
        "eg_union": f"{meta}.subc_union",
        "eg_drop": f"eg_dprsr_md.drop_ctl = 1;\n                {meta}.subc_kind = {KIND_NONE};",
        "ingress_tail": [
            f"{hdr}.subc_bridge.setValid();  // always: the egress parser extracts it first",
            f"{hdr}.subc_bridge.kind = (bit<8>) {meta}.subc_kind;",
            f"{hdr}.subc_bridge.union = {meta}.subc_union;",
        ]
        + [
            st
            for i in slots
            for st in (
                f"{hdr}.subc_bridge.s{i}_ports = {meta}.subc_s{i}_ports;",
                f"{hdr}.subc_bridge.s{i}_size = {meta}.subc_s{i}_size;",
            )
        ],
        "egress_head": [
            f"{meta}.subc_kind = (bit<2>) {hdr}.subc_bridge.kind;",
            f"{meta}.subc_union = {hdr}.subc_bridge.union;",
        ],
        "egress_tail": [f"{hdr}.subc_bridge.setInvalid();"],
        "seq_decl": (
            f"    Register<bit<32>, bit<9>>(512, 0) subc_seq;\n"
            f"    RegisterAction<bit<32>, bit<9>, bit<32>>(subc_seq) subc_seq_take = {{\n"
            f"        void apply(inout bit<32> value, out bit<32> taken) {{\n"
            f"            taken = value;\n"
            f"            value = value + (bit<32>) {meta}.subc_kept;\n"
            f"        }}\n"
            f"    }};"
        ),
        "seq_take": [
            f"{plan.f['seq']} = (bit<64>) subc_seq_take.execute(eg_intr_md.egress_port) + 1;",
            f"{plan.f['udp_csum']} = 0;  // no UDP checksum (RFC 768): Tofino does not sum the payload",
        ],
    }
    count_held = lambda i: f"subc_held_s{i}.count({meta}.subc_s{i}_held);"  # noqa: E731
    eg_ports = lambda i: f"{hdr}.subc_bridge.s{i}_ports"  # noqa: E731
    eg_size = lambda i: f"{hdr}.subc_bridge.s{i}_size"  # noqa: E731
    return overflow, mm_target, count_held, eg_ports, eg_size


def _v1model_mm_target(plan: SlotPlan, meta: str, std: str) -> tuple:
    """The v1model (BMv2) specifics of the multi-message program, as :func:`_tna_mm_target`."""
    overflow = (
        [f"{std}.egress_spec = {plan.overflow_port};"] if plan.overflow_port is not None else [f"mark_to_drop({std});"]
    )
    mm_target = {
        "port_type": "bit<9>",
        "unicast": f"{std}.egress_spec",
        "multicast": f"{std}.mcast_grp",
        "drop": f"mark_to_drop({std});",
        "parser_error": f"{std}.parser_error != error.NoError",
        "egress_port": f"{std}.egress_port",
        "eg_kind": f"{meta}.subc_kind",
        "eg_union": f"{meta}.subc_union",
        "eg_drop": f"mark_to_drop({std});\n                {meta}.subc_kind = {KIND_NONE};",
        "seq_decl": "    register<bit<64>>(512) subc_seq;  // per egress port: sequence numbers taken so far",
        "ingress_tail": [],
        "egress_head": [],
        "egress_tail": [],
        "seq_take": [
            f"subc_seq.read({meta}.subc_seq_taken, (bit<32>) {std}.egress_port);",
            f"{plan.f['seq']} = {meta}.subc_seq_taken + 1;",
            f"subc_seq.write((bit<32>) {std}.egress_port, {meta}.subc_seq_taken + (bit<64>) {meta}.subc_kept);",
        ],
    }
    count_held = lambda i: f"subc_held.count((bit<32>) {meta}.subc_s{i}_held);"  # noqa: E731
    eg_ports = lambda i: f"{meta}.subc_s{i}_ports"  # noqa: E731
    eg_size = lambda i: f"{meta}.subc_s{i}_size"  # noqa: E731
    return overflow, mm_target, count_held, eg_ports, eg_size


def _mm_meta_members(plan: SlotPlan, pipe) -> list[str]:
    n = plan.port_bits
    out = [
        "bit<1> subc_feed;",
        "bit<1> subc_unframed;",
        "bit<2> subc_kind;",
        f"bit<{n}> subc_union;",
        f"bit<{n}> subc_my_bit;",
        "bit<16> subc_kept;",
        "bit<16> subc_removed;",
        "bit<64> subc_seq_taken;",
    ]
    for i in range(plan.max_messages):
        out += [
            f"bit<{pipe.state_width}> subc_s{i}_state;",
            f"bit<{pipe.code_width}> subc_s{i}_code;",
            f"bit<{n}> subc_s{i}_ports;",
            f"bit<8> subc_s{i}_held;",
            f"bit<16> subc_s{i}_size;",
            f"bit<16> subc_s{i}_rm;",
            f"bit<16> subc_s{i}_keep;",
        ]
    return out


def render_program(
    res: CompileResult,
    rules_path: str,
    max_messages: int = DEFAULT_MAX_MESSAGES,
    overflow_port: int | None = None,
    planned: tuple | None = None,
) -> tuple[str, str]:
    """(file name, P4 source) for ``res``: ``subc.p4`` or, for a pragma-only spec, ``subc_control.p4``.

    A spec whose feed is MoldUDP64-framed gets the multi-message program (:mod:`.p4slots`:
    ``max_messages`` slots, datagrams it cannot handle to ``overflow_port`` or dropped, counted);
    any other spec the single-message program.  ``planned``: what
    :func:`~.slots.slot_plan` gave for these options (the caller's, so that its tables are
    built once), else it is called here.  Raises SubcError for bad options
    (:func:`~.p4slots.check_options`)."""
    tna = res.target == Target.TOFINO
    ctx = program_context(res, rules_path, tna)
    env = environment(TEMPLATES)
    if not res.spec.whole_program:
        return "subc_control.p4", env.get_template("control_only.p4.j2").render(ctx)
    plan, _ = planned if planned is not None else slot_plan(res, max_messages, overflow_port)
    if plan is not None:
        rename = (lambda n: "subc_spec_start" if n == "start" else n) if tna else (lambda n: n)
        states = plan.top_states + [s for ss in plan.slot_states for s in ss]
        ctx["states"] = [
            {
                "name": rename(s.name),
                "statements": s.statements,
                "select": s.select,
                "cases": [(ks, rename(t)) for ks, t in s.cases],
            }
            for s in states
        ]
        ctx["meta_members"] = ctx["meta_members"] + _mm_meta_members(plan, res.pipeline)
        ctx["agg"] = _state_context(res, ctx, tna, plan)  # its members are in ctx["meta_members"] already
        ctx["mm"] = multi_message_context(res, plan, tna, ctx)
        return "subc.p4", env.get_template("tna_mm.p4.j2" if tna else "v1model_mm.p4.j2").render(ctx)
    template = "tna.p4.j2" if tna else "v1model.p4.j2"
    return "subc.p4", env.get_template(template).render(ctx)
