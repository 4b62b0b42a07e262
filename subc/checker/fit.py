"""Target fit of a compiled pipeline: does it fit the switch or the kernel it is meant for?

**Tofino** (``--target tofino``), an estimate from the public figures of the RMT/Tofino MAU
(Bosshart et al., "Forwarding Metamorphosis", SIGCOMM 2013, and the figures used for Tofino in the
literature, e.g. P4All, NSDI 2022): per MAU stage 24 TCAM blocks of 512 x 44-bit words and 80 SRAM
blocks of 1,024 x 128-bit words; 12 stages on Tofino 1 and 20 on Tofino 2; multicast group IDs of
16 bits (1..65,535); metadata containers of at most 32 bits.

* A range key costs its range-to-prefix expansion in TCAM words (:attr:`Table.tcam_words`), an lpm
  key one word per entry; a TCAM entry spans ceil(key bits / 44) blocks side by side.  Action data
  of TCAM tables sits in SRAM.
* An exact table packs ``floor(128 / entry bits)`` entries per SRAM word (entry bits: key, action
  data and 8 bits of action and version overhead) at a cuckoo-hash fill of
  :data:`EXACT_FILL`.
* The tables of one field (stage table, its ``_miss`` table applied on a miss, and the interval-code
  table) form one dependency step: the next field's tables match on the state the step writes,
  so each step needs at least one MAU stage of its own, more when its blocks exceed a stage's.  An
  interval-code table matches on the field alone and is placed in the previous step's stages,
  except in the first step, which then needs one more stage.

* **Every message of a datagram** (the multi-message program, docs/p4-messages.md "P4: every message of a
  datagram"): K slots each apply their own copy of every table.  The slots' chains are independent,
  so they share MAU stages: a step needs ``max(1, ceil(K x TCAM blocks / 24), ceil(K x SRAM blocks /
  80))`` stages; then the union of the K port bitmaps (a tree of ceil(log2 K) OR stages) and the
  delivery table (1).  Egress: the port-bit table (1), the per-slot keep/remove decision (1), the
  sums of removed bytes and kept messages (ceil(log2 K)) and the rewrite with the sequence register
  (1).  PHV: network and MoldUDP64 headers, K slots of the widest message path, per-slot metadata
  and the bridged header, against Tofino 1's 4,096 bits (a note, not a verdict: the estimate assumes the
  compiler overlays the headers of different message types of one slot, and metadata may overlay too).
  Reported for K = 1, 2,
  4, ... up to ``max_messages``.

**eBPF**: map entries against the capacities a load gives them, and, when running as root with
bcc, the XDP and TC programs compiled and loaded: instructions after the verifier
(``xlated_insns``) against 1,000,000 (BPF_COMPLEXITY_LIMIT_INSNS, also the program size limit for
privileged loaders) and 4,096 (BPF_MAXINSNS, for unprivileged ones), and the instructions the
verifier processed over all paths against 1,000,000.

**BMv2**: the logical limits (multicast groups, state width); BMv2 tables have no fixed capacity.
"""

from __future__ import annotations

import math
from typing import Any

from ..backends.ebpf import map_names as MN
from ..backends.ebpf.maps_doc import MapsDoc
from ..compiler.driver import CompileResult
from ..backends.p4.tables import Table
from .diagnostics import Diagnostic

TCAM_BLOCKS, TCAM_BLOCK_WORDS, TCAM_WORD_BITS = 24, 512, 44
SRAM_BLOCKS, SRAM_BLOCK_WORDS, SRAM_WORD_BITS = 80, 1024, 128
TOFINO_STAGES = {"Tofino 1": 12, "Tofino 2": 20}
MAX_MCAST_GROUPS = 65_535
MAX_STATE_BITS = 32
EXACT_FILL = 0.8
ACTION_OVERHEAD_BITS = 8
BPF_COMPLEXITY_LIMIT_INSNS = 1_000_000
BPF_MAXINSNS = 4_096


def _action_bits(t: Table) -> int:
    return max([sum(_param_width(p) for p, _ in e.params) for e in t.entries] + [0])


def _param_width(name: str) -> int:
    return {"port": 9, "group": 16}.get(name, 32)


def table_resources(t: Table) -> dict:
    """TCAM and SRAM blocks of one table (see the module docstring): ``{'name', 'entries',
    'match', 'key_bits', 'tcam_words', 'tcam_blocks', 'sram_blocks'}``."""
    key_bits = sum(k.width for k in t.keys)
    ad_bits = _action_bits(t)
    entries = len(t.entries)
    ternary = any(k.match_kind in ("range", "lpm", "ternary") for k in t.keys)
    if ternary:
        words = t.tcam_words if t.tcam_words else entries
        tcam = math.ceil(words / TCAM_BLOCK_WORDS) * math.ceil(max(1, key_bits) / TCAM_WORD_BITS) if words else 0
        sram = math.ceil(entries * ad_bits / SRAM_WORD_BITS / SRAM_BLOCK_WORDS) if ad_bits else 0
        match = "tcam"
    else:
        words = 0
        entry_bits = key_bits + ad_bits + ACTION_OVERHEAD_BITS
        per_word = SRAM_WORD_BITS // entry_bits if entry_bits <= SRAM_WORD_BITS else 0
        sram_words = math.ceil(entries / per_word) if per_word else entries * math.ceil(entry_bits / SRAM_WORD_BITS)
        tcam = 0
        sram = math.ceil(sram_words / EXACT_FILL / SRAM_BLOCK_WORDS) if entries else 0
        match = "sram"
    return {
        "name": t.name,
        "entries": entries,
        "match": match,
        "key_bits": key_bits,
        "tcam_words": words,
        "tcam_blocks": tcam,
        "sram_blocks": sram,
    }


def tofino_steps(res: CompileResult) -> list[dict]:
    """Per dependency step (one per field, plus a leaf table if any): its tables' resources and
    the MAU stages it needs."""
    pipe = res.pipeline
    steps: list[dict] = []
    groups: dict[str | None, list[Table]] = {}
    for t in pipe.tables:
        groups.setdefault(t.field, []).append(t)
    for k, (fname, tables) in enumerate(groups.items()):
        rs = [table_resources(t) for t in tables]
        tcam = sum(r["tcam_blocks"] for r in rs)
        sram = sum(r["sram_blocks"] for r in rs)
        stages = max(1, math.ceil(tcam / TCAM_BLOCKS), math.ceil(sram / SRAM_BLOCKS))
        if k == 0 and any(t.role == "code" for t in tables):
            stages += 1  # the (state, code) table matches on the code: a stage after the code table
        steps.append({"field": fname, "tables": rs, "tcam_blocks": tcam, "sram_blocks": sram, "stages": stages})
    return steps


def _logical(res: CompileResult, out: list[Diagnostic], fit: dict) -> None:
    pipe = res.pipeline
    n_groups = len(pipe.mcast_groups)
    fit["multicast_groups"] = {"used": n_groups, "limit": MAX_MCAST_GROUPS}
    if n_groups > MAX_MCAST_GROUPS:
        out.append(
            Diagnostic(
                "error",
                "target-fit",
                f"the rule set needs {n_groups:,} multicast groups; group IDs are 16 bits "
                f"(at most {MAX_MCAST_GROUPS:,})",
            )
        )
    fit["state_bits"] = {"used": pipe.state_width, "limit": MAX_STATE_BITS}
    if pipe.state_width > MAX_STATE_BITS:
        out.append(
            Diagnostic(
                "error",
                "target-fit",
                f"state identifiers need {pipe.state_width} bits, more than a {MAX_STATE_BITS}-bit metadata container",
            )
        )


PHV_BITS = 4096


def message_stages_text(fit: dict) -> str:
    """The per-K figures of a Tofino fit report as text ('' when single-message)."""
    rows = (fit.get("messages") or {}).get("per_k") or []
    if not rows:
        return ""
    return (
        "every message of a datagram: "
        + ", ".join(f"K={r['k']} {r['stages']} stages, {r['phv_bits']:,} PHV bits" for r in rows)
        + f" (Tofino 1 PHV: {PHV_BITS:,} bits)"
    )


def message_stages(res: CompileResult, max_messages: int, overflow_port: int | None = None) -> dict:
    """Stages and PHV bits of the multi-message program for K = 1, 2, 4, ... up to ``max_messages``
    (see the module docstring): ``{'max_messages', 'mode': 'multi', 'phv_limit', 'per_k': [{'k',
    'ingress_stages', 'egress_stages', 'stages', 'phv_bits'}]}``, or, when the spec is not slotted
    (the program is single-message), ``{'max_messages': 1, 'mode': 'single', 'reason', 'per_k': []}``
    (``reason`` says why).  Raises SubcError for a bad ``max_messages``."""
    from ..backends.p4.slots import check_options, slot_plan

    check_options(max_messages, overflow_port)
    plan, reason = slot_plan(res, max_messages, overflow_port) if res.spec.whole_program else (None, "pragma-only spec")
    if plan is None:
        return {"max_messages": 1, "mode": "single", "reason": reason, "per_k": []}
    steps = tofino_steps(res)
    ks = sorted({k for k in (2**i for i in range(max_messages.bit_length())) if k <= max_messages} | {max_messages})
    g_net = sum(sum(w or 0 for _, w in res.spec.headers[t].fields) for _, t in plan.top)
    pipe = res.pipeline
    per_slot_meta = pipe.state_width + pipe.code_width + plan.port_bits + 8 + 16 * 3
    per_k = []
    for k in ks:
        classify = 0
        for j, st in enumerate(steps):
            n = max(1, math.ceil(k * st["tcam_blocks"] / TCAM_BLOCKS), math.ceil(k * st["sram_blocks"] / SRAM_BLOCKS))
            if j == 0 and any(t["name"].endswith("_code") for t in st["tables"]):
                n += 1
            classify += n
        log = (k - 1).bit_length()
        ingress = classify + log + 1
        egress = 3 + log
        phv = g_net + k * (plan.slot_bits + per_slot_meta) + 2 * plan.port_bits + 8 + k * (plan.port_bits + 16) + 64
        per_k.append(
            {
                "k": k,
                "ingress_stages": ingress,
                "egress_stages": egress,
                "stages": max(ingress, egress),
                "phv_bits": phv,
            }
        )
    return {"max_messages": max_messages, "mode": "multi", "phv_limit": PHV_BITS, "per_k": per_k}


def tofino_fit(
    res: CompileResult, max_messages: int = 8, overflow_port: int | None = None
) -> tuple[dict, list[Diagnostic]]:
    """(fit report, diagnostics) for Tofino 1 and 2 (see the module docstring); ``messages``: the
    multi-message program's stages for K up to ``max_messages`` (:func:`message_stages`)."""
    out: list[Diagnostic] = []
    steps = tofino_steps(res)
    total = sum(s["stages"] for s in steps)
    fit: dict = {
        "model": "tofino",
        "steps": steps,
        "stages": {"needed": total, "limits": TOFINO_STAGES},
        "per_stage": {"tcam_blocks": TCAM_BLOCKS, "sram_blocks": SRAM_BLOCKS},
    }
    _logical(res, out, fit)
    fit["messages"] = msgs = message_stages(res, max_messages, overflow_port)
    if msgs["per_k"]:
        last = msgs["per_k"][-1]
        table = ", ".join(f"K={r['k']}: {r['stages']} stages, {r['phv_bits']:,} PHV bits" for r in msgs["per_k"])
        if last["stages"] > TOFINO_STAGES["Tofino 2"]:
            out.append(
                Diagnostic(
                    "error",
                    "target-fit",
                    f"{last['k']} messages per datagram need about "
                    f"{last['stages']} MAU stages: more than Tofino 1 (12) and Tofino 2 (20) have; "
                    "lower --max-messages",
                    notes=[table],
                )
            )
        elif last["stages"] > TOFINO_STAGES["Tofino 1"]:
            out.append(
                Diagnostic(
                    "warning",
                    "target-fit",
                    f"{last['k']} messages per datagram need about {last['stages']} MAU stages: Tofino 2 only",
                    notes=[table],
                )
            )
    if total > TOFINO_STAGES["Tofino 2"]:
        out.append(
            Diagnostic(
                "error",
                "target-fit",
                f"the pipeline needs about {total} MAU stages: more than Tofino 1 (12) and Tofino 2 (20) have",
                notes=_step_notes(steps),
            )
        )
    elif total > TOFINO_STAGES["Tofino 1"]:
        out.append(
            Diagnostic(
                "warning",
                "target-fit",
                f"the pipeline needs about {total} MAU stages: it fits Tofino 2 (20) but not Tofino 1 (12)",
                notes=_step_notes(steps),
            )
        )
    return fit, out


def _step_notes(steps: list[dict]) -> list[str]:
    return [
        f"{s['field'] or 'leaf'}: {s['stages']} stage(s), {s['tcam_blocks']} TCAM and {s['sram_blocks']} SRAM blocks"
        for s in steps
    ]


def bmv2_fit(res: CompileResult) -> tuple[dict, list[Diagnostic]]:
    """(fit report, diagnostics) for BMv2: the logical limits only."""
    out: list[Diagnostic] = []
    fit: dict = {"model": "bmv2", "tables": [{"name": t.name, "entries": len(t.entries)} for t in res.pipeline.tables]}
    _logical(res, out, fit)
    return fit, out


def ebpf_fit(res: CompileResult, rules_path: str, load: bool = True) -> tuple[dict, list[Diagnostic]]:
    """(fit report, diagnostics) for the eBPF target: map entries against capacities and, with
    ``load`` (root and bcc needed, else a note says why not), the programs' instruction counts."""
    from ..backends.ebpf.program import render_filter
    from ..backends.ebpf.target import build_maps, ebpf_plan
    from ..backends.ebpf.source import program_source
    from ..dataplane.ebpf import install

    out: list[Diagnostic] = []
    plan = ebpf_plan(res)
    doc = build_maps(res, plan)
    caps = install.capacities(doc, 2.0, None)
    maps: list[dict[str, Any]] = [
        {"name": m.name, "type": m.type, "entries": len(m.entries), "capacity": caps[m.name]} for m in doc.maps
    ]
    fit: dict = {"model": "ebpf", "maps": maps, "instructions": None}
    for m in maps:
        if m["capacity"] >= 1 << 32:
            out.append(
                Diagnostic(
                    "error",
                    "target-fit",
                    f"BPF map {m['name']} needs {m['capacity']:,} entries; max_entries is 32 bits",
                )
            )
    if not load:
        return fit, out
    src = program_source(render_filter(res, plan, doc, rules_path))
    try:
        counts = _instruction_counts(doc, src, caps)
    except Exception as e:  # noqa: BLE001 - any reason bcc cannot load here is reported, not fatal
        out.append(Diagnostic("note", "target-fit", f"instruction counts not measured: {e}".splitlines()[0]))
        return fit, out
    fit["instructions"] = counts
    for fn, c in counts.items():
        if c["verified_insns"] > BPF_COMPLEXITY_LIMIT_INSNS or c["xlated_insns"] > BPF_COMPLEXITY_LIMIT_INSNS:
            out.append(Diagnostic("error", "target-fit", f"{fn}: {c} exceeds the verifier's 1,000,000 instructions"))
        elif c["xlated_insns"] > BPF_MAXINSNS:
            out.append(
                Diagnostic(
                    "note",
                    "target-fit",
                    f"{fn}: {c['xlated_insns']:,} instructions: loadable only with CAP_BPF or root "
                    f"(unprivileged programs are limited to {BPF_MAXINSNS:,})",
                )
            )
    return fit, out


def _instruction_counts(doc: MapsDoc, src: str, caps: dict[str, int]) -> dict:
    from ..dataplane.ebpf.bpf import compile_and_load
    from ..dataplane.ebpf.bpf_objects import prog_info
    from ..dataplane.ebpf.broker import cflags

    prog = compile_and_load(src, cflags(caps, doc.max_endpoints))
    try:
        return {"subc_xdp": prog_info(prog.xdp.fd), "subc_tc": prog_info(prog.tc.fd)}
    finally:
        prog.bpf.cleanup()


def state_fit(res: CompileResult) -> dict:
    """What comparisons on state need (docs/state.md "Stateful subscriptions"): the aggregate instances
    (function, field, window in us, avg thresholds, the rules sharing it; a named counter's
    name), the state values the pipeline matches, the named counters' updates (what each adds)
    and the leaves that apply some, and per target the registers: eBPF, ``subc_agg`` entries (two generations per
    instance) and their bytes; BMv2, the v1model register arrays (64-bit cells) and their bytes;
    Tofino, the registers (one 32-bit cell and one stateful ALU each) and the MAU stages they add
    (:func:`~subc.backends.p4.state.tofino_resources`)."""
    from ..backends.ebpf import layout as L
    from ..backends.p4.state import registers, tofino_registers, tofino_resources

    st = res.ir.state
    assert st is not None  # called for a rule set with comparisons on state only
    size = L.agg_struct(max([len(i.thresholds) for i in st.instances], default=1)).size
    return {
        "instances": [
            {
                "index": i.index,
                "kind": i.kind,
                "field": i.field.name if i.field else None,
                "window_us": i.window_ns / 1000,
                "thresholds": list(i.thresholds),
                "rules": list(i.rules),
                **({"name": i.name} if i.name is not None else {}),
            }
            for i in st.instances
        ],
        "state_values": len(st.values),
        "update_states": len(st.updates),
        "count_updates": [
            {"counter": st.instances[u.instance].name, "adds": u.field.name if u.field else 1} for u in st.count_updates
        ],
        "count_leaves": len(st.leaf_counts),
        "time": st.time_field.name if st.time_field else "arrival",
        "ebpf": {
            "map": MN.AGG,
            "entries": 2 * len(st.instances),
            "bytes": 2 * len(st.instances) * size,
            "lock": "bpf_spin_lock per instance",
        },
        "bmv2": {
            "registers": [{"name": n, "cells": c, "bits": 64} for n, c in registers(st)],
            "bytes": 8 * sum(c for _, c in registers(st)),
        },
        "tofino": {**tofino_resources(st), "registers": [n for n, _ in tofino_registers(st)]},
    }
