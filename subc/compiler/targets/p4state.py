"""Comparisons on state in the P4 programs: the template context of the registers and of the
window, update and read code (README "Stateful subscriptions"; the pass is
:mod:`subc.compiler.aggregates`, the model the simulator runs :mod:`subc.runtime.state_model`).

v1model (BMv2): one ``register`` array per quantity, indexed by aggregate instance (``wid``:
the window id the cell holds, ``count``, ``total`` for ``sum``, ``extreme`` for ``min``/``max``)
and one cell of ``excess`` per ``avg`` threshold, all 64 bits.  Right after the update table
(:data:`~subc.compiler.tables.UPDATE_TABLE`) every classified message moves every instance to its
window (emptying it when the window id differs), updates the instances whose bit its mask has,
and writes the state values the next stages match into metadata.  In the multi-message program
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

from ..aggregates import StatePlan
from ..tables import Pipeline, field_key_name
from .safety import identifier, number

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
    excess_slot, instances = 0, []
    for inst in plan.instances:
        outs = []
        for n, v in enumerate(plan.values):
            if v.instance != inst.index:
                continue
            identifier(v.field.name.split(".", 1)[1], "state value")
            j = None
            if inst.kind == "avg":
                j, excess_slot = excess_slot, excess_slot + 1
            outs.append({"key": field_key_name(v.field.name, pipe.hdr, meta), "width": v.field.width,
                         "excess": j, "threshold": number(v.threshold, "threshold") if j is not None else None})
        instances.append({"index": number(inst.index, "instance"), "kind": inst.kind, "window_ns": inst.window_ns,
                          "wid": wid_var[inst.window_ns], "field": inst.field.name if inst.field else None,
                          "outs": outs})
    members = [f"bit<{plan.mask_width}> subc_update;", "bit<64> subc_now;", "bit<64> subc_x;",
               "bit<64> subc_t_wid;", "bit<64> subc_t_count;", "bit<64> subc_t_total;", "bit<64> subc_t_extreme;",
               "bit<64> subc_t_excess;", "bit<1> subc_t_fresh;"]
    members += [f"bit<64> subc_wid{j};" for j in range(len(windows))]
    members += [f"bit<{v.field.width}> subc_{v.field.name.split('.', 1)[1]};" for v in plan.values]
    blocks = []
    for b in range(n_blocks):
        now = _now(plan, lambda f: key_of(b, f), arrival_us)
        blocks.append({
            "now": now,
            "windows": [(wid_var[w], window_id_expr(f"{meta}.subc_now", w)) for w in windows],
            "instances": [{**i, "load": f"(bit<64>) {identifier(key_of(b, i['field']), 'field', dotted=True)}" if i["field"] else "64w0"}
                          for i in instances],
        })
    return {"registers": registers(plan), "meta_members": members, "mask": f"{meta}.subc_update",
            "mask_width": plan.mask_width, "blocks": blocks, "meta": meta}
