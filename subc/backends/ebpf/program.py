"""The eBPF target's program: the two generated headers of the static C (``bpf/``) for a rule set
and spec (:func:`render_filter`: the spec's parser, the field loads, the stage list, the
aggregates), and the program of ``subc serve`` (:func:`live_program`).  The maps it runs on are
:mod:`.target`'s."""

from __future__ import annotations


from . import layout as L
from ... import __version__
from ...compiler.driver import CompileResult
from ...errors import SubcError
from ...ir.decisions import default_decision_of
from ...ir.stages import FieldStage, SubscriptionIR
from ...lang.ast import COUNTER
from ..safety import comment_text, identifier
from ..templating import environment
from .parse_plan import FieldLayout, ParsePlan
from .source import BPF_DIR, GENERATED_FILES, program_source, static_files
from .maps_doc import MapsDoc
from . import map_names as MN
from .target import build_maps, ebpf_plan


def _load_expr(fl: FieldLayout) -> str:
    expr = "(__u64)p[0]"
    for i in range(1, fl.n_bytes):
        expr = f"(({expr} << 8) | p[{i}])"
    if fl.shift:
        expr = f"({expr} >> {fl.shift})"
    if fl.width < 64 and fl.width != fl.n_bytes * 8:
        expr = f"({expr} & {hex((1 << fl.width) - 1)}ull)"
    return expr


def render_filter(res: CompileResult, plan: ParsePlan, doc: MapsDoc, rules_path: str) -> dict[str, str]:
    """The eBPF program for ``res`` (name -> text): the static C (:mod:`.ebpf_source`) and the two
    headers generated from the rule set and the spec, ``subc_config.h`` (variant, constants, map
    capacities and layouts, the field stages' maps) and ``subc_classify.h`` (the spec's parser and
    the stage walk).  Raises SubcError for a map, field or parser state name that is no C
    identifier."""
    spec = res.spec
    for m in doc.maps:
        identifier(m.name, "BPF map name")
    for f in res.ir.field_order:
        identifier(f, "field", dotted=True)
    states = _parser_states(spec, plan)
    stage_ctx = _stage_contexts(res, plan, doc)
    sp = res.ir.state
    need = 0
    for h in res.ir.headers:
        need |= 1 << plan.bit[h]
    net = (1 << plan.bit[plan.eth]) | (1 << plan.bit[plan.ipv4]) | (1 << plan.bit[plan.udp])
    message_insts = [i for i in plan.header_bytes if i not in (plan.eth, plan.ipv4, plan.udp)]
    structs = [s.c_decl() for s in L.STRUCTS]
    agg = _aggregates_context(res, plan) if sp is not None else None
    ctx = dict(
        version=__version__,
        rules_path=comment_text(rules_path),
        spec_path=comment_text(spec.path),
        n_rules=len(res.rules),
        field_order=res.ir.field_order,
        ports=[p for p, _ in plan.ports],
        port_states=[{"port": p, "state": s} for p, s in plan.ports],
        meta_magic=hex(L.META_MAGIC),
        fan_slots=L.FAN_SLOTS,
        fan_tc=L.FAN_TC,
        fan_list=L.FAN_LIST,
        fan_all=L.FAN_ALL,
        fan_set=L.FAN_SET,
        fan_sets=L.FAN_SETS,
        fan_misses=L.FAN_MISSES,
        no_fan=hex(L.NO_FAN) + "u",
        max_endpoints=doc.max_endpoints,
        mold=plan.moldudp64,
        sub_words=L.SUB_WORDS,
        local=L.LOCAL,
        pass_local=L.LEAF_PASS_LOCAL,
        maps=[{"name": m.name, "capacity": m.capacity} for m in doc.maps],
        stats=L.STATS,
        structs=structs,
        stages=stage_ctx,
        states=states,
        eth=plan.eth,
        ipv4=plan.ipv4,
        udp=plan.udp,
        offset_vars=message_insts,
        net_valid=hex(net) + "u",
        need_valid=hex(need),
        agg=agg,
    )
    files = static_files()
    for name in GENERATED_FILES:
        files[name] = environment(BPF_DIR).get_template(f"{name}.j2").render(**ctx)
    return files


def _parser_states(spec, plan: ParsePlan) -> list[dict]:
    """The template's view of the spec's parser states (``subc_classify.h``): per state its
    extracts (instance, bytes, valid bit, payload or not), its select (the key's load) or None,
    its cases (value, target ``st_<state>``/``accept``/``reject``, the implicit reject) and the
    MoldUDP64 header fixes.  Raises SubcError for a state name that is no C identifier."""
    hb = plan.header_bytes
    states = []
    for s in plan.states:
        identifier(s.name, "parser state")
        extracts = [
            {"inst": i, "bytes": hb[i], "bit": 1 << plan.bit[i], "payload": i in spec.payload_instances}
            for i in s.extracts
        ]
        sel = None
        if s.select is not None:
            sel = {
                "inst": s.select.instance,
                "byte_offset": s.select.byte_offset,
                "n_bytes": s.select.n_bytes,
                "expr": _load_expr(s.select),
            }
        cases = [
            {"value": v, "target": t if t in ("accept", "reject") else f"st_{t}", "implicit": False} for v, t in s.cases
        ]
        if s.implicit_reject:
            cases[-1]["implicit"] = True
        if sel is None:
            cases = [{"value": None, "target": cases[0]["target"], "implicit": False}]
        states.append(
            {
                "name": s.name,
                "extracts": extracts,
                "select": sel,
                "cases": cases,
                "fix": plan.mold_header.get(s.name, []),
            }
        )
    return states


def _stage_contexts(res: CompileResult, plan: ParsePlan, doc: MapsDoc) -> list[dict]:
    """The template's view of the stages (``subc_config.h``, ``subc_classify.h``): per stage its
    field, kind and width, the field's load (or, past the aggregates' boundary, the state value
    it reads), its search steps and base index, its maps (declared by the first stage that names
    them)."""
    stage_ctx = []
    declared: set[str] = set()
    sp = res.ir.state
    for i, st in enumerate(doc.stages):
        ctx: dict[str, object]
        if sp is not None and i >= sp.boundary:  # a state value, computed by the aggregates' code
            ctx = {"field": st.field, "kind": st.kind, "width": st.width, "state_value": i - sp.boundary}
        else:
            fl = plan.field(st.field)
            ctx = {
                "field": st.field,
                "kind": st.kind,
                "width": st.width,
                "inst": fl.instance,
                "byte_offset": fl.byte_offset,
                "n_bytes": fl.n_bytes,
                "expr": _load_expr(fl),
                "state_value": None,
            }
        ctx["steps"] = st.search_steps
        ctx["base_index"] = st.base_index
        ctx["declare"] = not any(m in declared for m in st.maps)
        declared.update(st.maps)
        for map_name in st.maps:
            ctx[map_name.rsplit("_", 1)[1].replace("bnd", "bounds").replace("ex", "exact")] = map_name
        stage_ctx.append(ctx)
    return stage_ctx


def _load_ctx(plan: ParsePlan, name: str) -> dict:
    fl = plan.field(name)
    return {"inst": fl.instance, "byte_offset": fl.byte_offset, "n_bytes": fl.n_bytes, "expr": _load_expr(fl)}


def _aggregates_context(res: CompileResult, plan: ParsePlan) -> dict:
    """The template's view of the aggregates' code (docs/state.md "Stateful subscriptions"): the fields
    loaded at the boundary (``loads``: a variable per distinct field the updates add), the
    instances the update mask can name (``updates``, with the mask word and bit of each), what
    each state-value stage reads (``values``: instance, kind, window, ``avg`` excess slot) and the
    named counters' updates after the last stage (``counts``)."""
    sp = res.ir.state
    assert sp is not None  # called for a stateful rule set only
    loads: dict[str, dict] = {}

    def var(field) -> str | None:
        if field is None:
            return None
        if field.name not in loads:
            loads[field.name] = {"var": f"x{len(loads)}", **_load_ctx(plan, field.name)}
        return loads[field.name]["var"]

    updates = [
        {
            "index": inst.index,
            "kind": inst.kind,
            "window_ns": inst.window_ns,
            "x": var(inst.field),
            "thresholds": list(inst.thresholds),
            "word": inst.index // 64,
            "bit": inst.index % 64,
        }
        for inst in sp.instances
        if inst.kind != COUNTER
    ]
    values = []
    for v in sp.values:
        inst = sp.instances[v.instance]
        values.append(
            {
                "instance": inst.index,
                "kind": inst.kind,
                "window_ns": inst.window_ns,
                "slot": inst.thresholds.index(v.threshold) if v.threshold is not None else None,
            }
        )
    counts = [
        {
            "word": u.index // 64,
            "bit": u.index % 64,
            "instance": u.instance,
            "window_ns": sp.instances[u.instance].window_ns,
            "x": var(u.field),
        }
        for u in sp.count_updates
    ]
    time = None
    if sp.time_field is not None:
        time = {**_load_ctx(plan, sp.time_field.name), "unit_ns": sp.time_unit_ns}
    return {
        "boundary": sp.boundary,
        "updates": updates,
        "values": values,
        "counts": counts,
        "loads": list(loads.values()),
        "time": time,
        "mask_words": L.mask_word_count(sp.mask_width),
        "count_words": L.mask_word_count(sp.count_width),
        "n_thresholds": max([len(i.thresholds) for i in sp.instances], default=1) or 1,
        "n_stages": len(sp.values),
        "base_map": MN.SV_BASE,
    }


def live_program(spec, field_order: list[str]) -> tuple[MapsDoc, str, ParsePlan]:
    """(``maps.json`` document, C source (one translation unit: :func:`.ebpf_source.program_source`),
    parse plan) of a program over ``field_order`` with no
    rule: the data path of ``subc serve``, whose maps the broker fills incrementally
    (:mod:`subc.dataplane.ebpf.live_maps`).  Raises SubcError for an unknown or unsupported field."""
    fields = []
    for name in field_order:
        if name not in spec.query_fields:
            raise SubcError(
                f"--field-order: '{name}' is not a query field of {spec.path} ({', '.join(spec.query_fields)})"
            )
        fields.append(spec.query_fields[name])
    stages = tuple(FieldStage(q, frozenset(), (), 0) for q in fields)
    headers = tuple(dict.fromkeys(q.header for q in fields))
    ir = SubscriptionIR(stages, (), 0, default_decision_of(spec.default_action), (), headers)
    res = CompileResult(ir, [], spec, "ebpf")
    plan = ebpf_plan(res)
    doc = build_maps(res, plan)
    return doc, program_source(render_filter(res, plan, doc, "<subc serve>")), plan
