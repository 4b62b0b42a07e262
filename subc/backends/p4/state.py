"""Comparisons on state in the P4 programs: the template context of the registers and of the
window, update and read code (docs/state.md "Stateful subscriptions"; the pass is
:mod:`subc.ir.aggregates`, the model the simulator runs :mod:`subc.semantics.state_model`).

v1model (BMv2): one ``register`` array per quantity, indexed by aggregate instance (``wid``:
the window id the cell holds, ``count``, ``total`` for ``sum``, ``extreme`` for ``min``/``max``)
and one cell of ``excess`` per ``avg`` threshold, all 64 bits.  Right after the update table
(:data:`~subc.backends.p4.tables.UPDATE_TABLE`) a classified message updates the instances whose
bit its mask has (emptying one that holds another window id first: an instance holds the window
of its last update) and writes the state values the next stages match into metadata, an empty
window's (0) for an instance that holds another window.  In the multi-message program
every slot runs that code in turn on the same registers, so a datagram's messages update them in
order.  BMv2 runs ingress in one thread: each read-modify-write is a step no other packet sees
half done.

Times are in ns, 64 bits (``bit<64>``, wrapping as the eBPF program's ``__u64`` does): the spec's
time field times its unit, or ``standard_metadata.ingress_global_timestamp`` (µs) times 1000.
P4 has no run-time division, so the window id ``floor(now / W)`` is computed as
``(now * m) >> k`` in 136-bit arithmetic with ``k = 64 + ceil(log2 W)`` and ``m = ceil(2**k / W)``,
exact for every 64-bit ``now`` (Granlund and Montgomery, "Division by invariant integers using
multiplication", PLDI 1994, theorem 4.2), or a shift when ``W`` is a power of two.
"""

from __future__ import annotations

from typing import TypedDict

from ...ir.aggregates import StatePlan
from .tables import Pipeline, field_key_name
from ..safety import identifier, number

#: Bits of the product in the window-id multiplication (2 * 64 + 1, rounded up to bytes).
WIDE_BITS = 136


def reciprocal(window_ns: int) -> tuple[int, int]:
    """(m, k) with ``floor(n / window_ns) == (n * m) >> k`` for every ``0 <= n < 2**64``:
    ``k = 64 + ceil(log2 window_ns)``, ``m = ceil(2**k / window_ns)`` (< 2**65).  Raises
    ValueError for a window that is not positive."""
    if window_ns <= 0:
        raise ValueError(f"window must be positive, not {window_ns}")
    k = 64 + (window_ns - 1).bit_length()
    return -(-(1 << k) // window_ns), k


def window_id_expr(now: str, window_ns: int) -> str:
    """The P4 expression (``bit<64>``) of ``floor(now / window_ns)`` for the ``bit<64>``
    expression ``now``; ``64w0`` for a window that never ends (0)."""
    if window_ns == 0:
        return "64w0"
    if window_ns & (window_ns - 1) == 0:
        return f"({now} >> {window_ns.bit_length() - 1})"
    m, k = reciprocal(window_ns)
    return f"((bit<64>) (((bit<{WIDE_BITS}>) {now} * {WIDE_BITS}w{m}) >> {k}))"


def _now(plan: StatePlan, key_of, arrival_us: str) -> str:
    if plan.time_field is None:
        return f"((bit<64>) {arrival_us} * 64w1000)"
    t = f"(bit<64>) {identifier(key_of(plan.time_field.name), 'time field', dotted=True)}"
    return t if plan.time_unit_ns == 1 else f"({t} * 64w{number(plan.time_unit_ns, 'time unit')})"


def _outs(pipe: Pipeline, plan: StatePlan, meta: str, instance: int) -> list[dict[str, object]]:
    """The state values of aggregate instance ``instance`` of ``plan`` (``pipe``'s): the metadata
    (``key``) the stages match, its ``width`` in bits and its ``avg`` ``threshold`` (None for the
    other kinds)."""
    out: list[dict[str, object]] = []
    for v in plan.values:
        if v.instance == instance:
            identifier(v.field.name.split(".", 1)[1], "state value")
            out.append(
                {
                    "key": field_key_name(v.field.name, pipe.hdr, meta),
                    "width": v.field.width,
                    "threshold": None if v.threshold is None else number(v.threshold, "threshold"),
                }
            )
    return out


def _value_members(plan: StatePlan) -> list[str]:
    """The metadata members of the state values (``bit<W> subc_v<N>;``)."""
    return [f"bit<{v.field.width}> subc_{v.field.name.split('.', 1)[1]};" for v in plan.values]


def registers(plan: StatePlan) -> list[tuple[str, int]]:
    """(name, cells) of the v1model registers of ``plan``, in declaration order, each cell 64
    bits: ``subc_agg_wid`` and ``subc_agg_count`` per instance, ``subc_agg_total`` (sum) and
    ``subc_agg_extreme`` (min, max) per instance when some instance needs them, and
    ``subc_agg_excess`` per ``avg`` threshold."""
    kinds = {i.kind for i in plan.instances}
    n = len(plan.instances)
    out = [("subc_agg_wid", n), ("subc_agg_count", n)]
    if "sum" in kinds:
        out.append(("subc_agg_total", n))
    if kinds & {"min", "max"}:
        out.append(("subc_agg_extreme", n))
    n_excess = sum(len(i.thresholds) for i in plan.instances if i.kind == "avg")
    if n_excess:
        out.append(("subc_agg_excess", n_excess))
    return out


class _V1Instance(TypedDict):
    """An aggregate instance in the v1model ``agg`` context (each block adds its ``load``)."""

    index: int
    kind: str
    window_ns: int
    wid: str
    field: str | None
    outs: list[dict[str, object]]


def v1model_state(pipe: Pipeline, key_of, arrival_us: str, n_blocks: int = 1) -> dict | None:
    """The ``agg`` template context of ``pipe``'s comparisons on state for v1model, or None when
    the rules compare no state.

    ``key_of(block, query field name)`` gives the P4 expression of a header field in block
    ``block`` (a message slot of the multi-message program, or 0); ``arrival_us`` is the
    expression of the arrival time in µs (``standard_metadata.ingress_global_timestamp``);
    ``n_blocks`` blocks of code are made (one per slot).  Keys: ``registers`` ((name, cells)),
    ``meta_members``, ``mask`` (metadata of the update mask), ``mask_width``, ``blocks``
    (per block: ``now``, ``windows`` ((metadata, expression)), ``instances``)."""
    plan = pipe.state
    if plan is None:
        return None
    meta = identifier(pipe.meta, "metadata name")
    windows = sorted({i.window_ns for i in plan.instances})
    wid_var = {w: f"{meta}.subc_wid{j}" for j, w in enumerate(windows)}
    excess_slot = 0
    instances: list[_V1Instance] = []
    for inst in plan.instances:
        outs = _outs(pipe, plan, meta, inst.index)
        for o in outs:  # avg: its excess register cell, one per threshold
            o["excess"] = None
            if inst.kind == "avg":
                o["excess"], excess_slot = excess_slot, excess_slot + 1
        instances.append(
            {
                "index": number(inst.index, "instance"),
                "kind": inst.kind,
                "window_ns": inst.window_ns,
                "wid": wid_var[inst.window_ns],
                "field": inst.field.name if inst.field else None,
                "outs": outs,
            }
        )
    members = [
        f"bit<{plan.mask_width}> subc_update;",
        "bit<64> subc_now;",
        "bit<64> subc_x;",
        "bit<64> subc_t_wid;",
        "bit<64> subc_t_count;",
        "bit<64> subc_t_total;",
        "bit<64> subc_t_extreme;",
        "bit<64> subc_t_excess;",
        "bit<1> subc_t_fresh;",
    ]
    members += [f"bit<64> subc_wid{j};" for j in range(len(windows))]
    members += _value_members(plan)
    if plan.count_updates:
        members.append(f"bit<{plan.count_width}> subc_count;")

    def load(b: int, field: str | None) -> str:
        return f"(bit<64>) {identifier(key_of(b, field), 'field', dotted=True)}" if field else "64w0"

    blocks = []
    for b in range(n_blocks):
        now = _now(plan, lambda f: key_of(b, f), arrival_us)
        blocks.append(
            {
                "now": now,
                "windows": [(wid_var[w], window_id_expr(f"{meta}.subc_now", w)) for w in windows],
                "instances": [{**i, "load": load(b, i["field"])} for i in instances],
                # the named counters' updates after the last stage: they find their window again (a
                # rule set that never compares a counter has no code at the update table)
                "counts": [
                    {
                        "bit": number(u.index, "count update"),
                        "index": number(u.instance, "instance"),
                        "window_id": window_id_expr(f"{meta}.subc_now", plan.instances[u.instance].window_ns),
                        "add": load(b, u.field.name) if u.field else "64w1",
                    }
                    for u in plan.count_updates
                ],
            }
        )
    return {
        "tna": False,
        "registers": registers(plan),
        "meta_members": members,
        "mask": f"{meta}.subc_update",
        "mask_width": plan.mask_width,
        "blocks": blocks,
        "meta": meta,
        "count_mask": f"{meta}.subc_count",
        "count_width": plan.count_width,
    }


# ------------------------------------------------------------------------------------------
# Tofino (TNA)
# ------------------------------------------------------------------------------------------

#: Stateful ALUs per MAU stage on Tofino (public RMT/Tofino descriptions: four per stage).
SALUS_PER_STAGE = 4
#: The widest value a Tofino register cell keeps and a stateful ALU adds, in bits.
TOFINO_CELL_BITS = 32


def tofino_problems(plan: StatePlan) -> list[str]:
    """Why ``plan`` cannot run on Tofino as the other targets run it (empty: it can).

    Tofino has no divider and no multiplier: a window's id is a shift of the time field, so the
    window length must be a power of two of the time unit (arrival time: of 1 ns, which no µs
    window is); its stateful ALUs add 32-bit cells, so aggregated fields are at most 32 bits."""
    out = []
    unit = plan.time_unit_ns if plan.time_field is not None else 1
    for i in plan.instances:
        if i.kind == "counter":
            out.append(
                f"named counter '{i.name}': not supported on Tofino yet (its value is read before the state-value "
                "stages and its update comes after the last stage: two accesses to one register, where a "
                "RegisterAction allows one); use count() of the rule's other fields instead"
            )
            continue
        q = i.window_ns // unit if i.window_ns % unit == 0 else 0
        if i.window_ns and (q == 0 or q & (q - 1)):
            base = (
                f"the time field {plan.time_field.name} ({unit} ns units)"
                if plan.time_field is not None
                else "the arrival time (ns)"
            )
            out.append(
                f"aggregate {i.index} ({i.kind}): its window of "
                f"{i.window_ns // 1000 if i.window_ns % 1000 == 0 else i.window_ns / 1000} us is not a power of two "
                f"of {base}; Tofino has no divider to find the window (use window=0, or a time field whose "
                "unit makes the window a power of two, e.g. query_time(h.t, us) with window=1024)"
            )
        if i.field is not None and i.field.width > TOFINO_CELL_BITS:
            out.append(
                f"aggregate {i.index} ({i.kind}({i.field.name})): the field has {i.field.width} bits; Tofino's "
                f"stateful ALUs keep {TOFINO_CELL_BITS}-bit cells"
            )
    return out


def tofino_registers(plan: StatePlan) -> list[tuple[str, int]]:
    """(register, access level) of every Tofino register of ``plan``, each one 32-bit cell and one
    stateful ALU executed once per packet: level 1 the window ids; 2 the counts and the low
    halves of sums and excesses; 3 the extremes and the high halves."""
    out = []
    for i in plan.instances:
        k = i.index
        out += [(f"subc_a{k}_wid", 1), (f"subc_a{k}_count", 2)]
        if i.kind == "sum":
            out += [(f"subc_a{k}_sum_lo", 2), (f"subc_a{k}_sum_hi", 3)]
        elif i.kind in ("min", "max"):
            out.append((f"subc_a{k}_extreme", 3))
        elif i.kind == "avg":
            for j in range(len(i.thresholds)):
                out += [(f"subc_a{k}_excess{j}_lo", 2), (f"subc_a{k}_excess{j}_hi", 3)]
    return out


def tofino_resources(plan: StatePlan) -> dict:
    """Stateful ALUs and MAU stages ``plan`` needs on Tofino: ``stateful_alus`` (one per
    register), ``per_level`` (registers per access level), and ``stages``: the register levels
    (each ``ceil(n / SALUS_PER_STAGE)`` stages) plus the three dependent steps between them
    (inputs after the update table, carries, state values)."""
    levels = [sum(1 for _, lv in tofino_registers(plan) if lv == n) for n in (1, 2, 3)]
    stages = sum(-(-n // SALUS_PER_STAGE) for n in levels) + 3
    return {"stateful_alus": sum(levels), "per_level": levels, "stages": stages, "salus_per_stage": SALUS_PER_STAGE}


class _TnaInstance(TypedDict):
    """An aggregate instance in the TNA ``agg`` context."""

    index: int
    kind: str
    window_ns: int
    wid: str
    load: str
    p: str
    outs: list[dict[str, object]]
    excess: list[tuple[int, int]]


def tna_state(pipe: Pipeline, key_of, arrival_ns: str) -> dict | None:
    """The ``agg`` template context of ``pipe``'s comparisons on state for TNA, or None when the
    rules compare no state.  ``key_of(query field name)`` gives a header field's P4 expression,
    ``arrival_ns`` the arrival time's (``ig_intr_md.ingress_mac_tstamp``).  Assumes
    :func:`tofino_problems` found none."""
    plan = pipe.state
    if plan is None:
        return None
    meta = identifier(pipe.meta, "metadata name")
    unit = plan.time_unit_ns if plan.time_field is not None else 1
    time = (
        identifier(key_of(plan.time_field.name), "time field", dotted=True)
        if plan.time_field is not None
        else arrival_ns
    )
    windows = sorted({i.window_ns for i in plan.instances})
    wid = {}
    for j, w in enumerate(windows):
        shift = (w // unit).bit_length() - 1 if w else None
        wid[w] = (f"{meta}.subc_wid{j}", "32w0" if w == 0 else f"(bit<32>) ({time} >> {shift})")
    instances: list[_TnaInstance] = []
    for inst in plan.instances:
        outs = _outs(pipe, plan, meta, inst.index)
        k = number(inst.index, "instance")
        load = f"(bit<32>) {identifier(key_of(inst.field.name), 'field', dotted=True)}" if inst.field else "32w0"
        instances.append(
            {
                "index": k,
                "kind": inst.kind,
                "window_ns": inst.window_ns,
                "wid": wid[inst.window_ns][0],
                "load": load,
                "p": f"{meta}.subc_a{k}_",
                "outs": outs,
                "excess": [(j, number(x, "threshold")) for j, x in enumerate(inst.thresholds)],
            }
        )
    members = [f"bit<{plan.mask_width}> subc_update;"] + [f"bit<32> {var.split('.', 1)[1]};" for var, _ in wid.values()]
    for i in instances:
        k = i["index"]
        members += [
            f"bit<32> subc_a{k}_{n};" for n in ("x", "u", "xu", "fresh", "count", "first", "lo", "carry", "hi", "ext")
        ]
        for j, _ in i["excess"]:
            members += [
                f"bit<64> subc_a{k}_d{j};",
                f"bit<32> subc_a{k}_e{j}_lo;",
                f"bit<32> subc_a{k}_e{j}_hi_in;",
                f"bit<32> subc_a{k}_e{j}_hi;",
            ]
    members += _value_members(plan)
    return {
        "tna": True,
        "mask": f"{meta}.subc_update",
        "mask_width": plan.mask_width,
        "meta": meta,
        "meta_members": members,
        "windows": list(wid.values()),
        "instances": instances,
        "registers": tofino_registers(plan),
    }
