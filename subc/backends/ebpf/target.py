"""The eBPF target's maps: ``maps.json`` and ``report.json`` (the program that runs on them, static C
plus two generated headers, is :mod:`.program` and :mod:`.source`).

Each field stage of the IR (:mod:`subc.ir.stages`) becomes BPF maps keyed by state (Algorithm 1 of Jepsen et al.,
HotNets 2018, with maps in place of match-action tables).  The IR numbers each stage's input
states densely from 1, so per-state data lives in ``BPF_MAP_TYPE_ARRAY`` maps indexed by state
(one inlined array access, no hashing): generation 0 at the state's index, generation 1 at
``capacity - 1 - state`` (:func:`subc.dataplane.ebpf.install.state_slot`).

* **range** fields: per state, the sorted lower bounds of its runs in a slice of one
  ``BPF_MAP_TYPE_ARRAY`` (``stN_bnd``: lower bound, next state), found through an array indexed
  by state (``stN_info``: offset, count) and searched with a branch-free binary search of at most
  min(32, key width) steps (a W-bit key has at most 2**W runs; ceil(log2 count) in practice), so
  the verifier sees a bounded loop (short for narrow keys, such as the 2-bit ``avg`` state values)
  and the cost is logarithmic in the runs of the state;
* **exact** fields: a hash map (``stN_ex``: (state, value) -> next state) of the values whose next
  state differs from the state's miss target, which ``stN_info`` (indexed by state) holds;
* **lpm** fields: an LPM trie (``stN_lpm``) keyed by 32 bits of state then the field, left
  aligned, so a prefix of length L is trie prefix 32 + L;
* the leaf array (``subc_leaf``, indexed by final state) holds each leaf's action and the index
  of its subscriber set; ``subc_leaf_cnt`` (per CPU, same index) counts its messages and bytes.
  State 0 of every stage is dead; leaf 0 holds the spec's default action.

``maps.json`` holds every map's key and value layout (:mod:`.ebpf_layout`), its default capacity
and its entries in logical form (states untagged, bounds indexed from 0, leaf actions as
subscriber lists); the loader (:mod:`subc.dataplane.ebpf.broker`) resolves subscribers to endpoints,
adds the generation bit and places states and bounds in their generation's region of the arrays.
"""

from __future__ import annotations

import math

from . import map_names as MN
from ...errors import SubcError
from ...ir.aggregates import is_state_field
from ...compiler.driver import CompileResult
from ...ir.stages import FieldStage, SubscriptionIR
from . import layout as L
from .maps_doc import (
    BasesEntry,
    BoundEntry,
    ExactEntry,
    InfoEntry,
    LeafEntry,
    LpmEntry,
    MapDoc,
    MapsDoc,
    MaskEntry,
    RootEntry,
    StageDoc,
    StructDoc,
)
from .parse_plan import ParsePlan, check_fields, plan_parser
from .source import MAIN_FILE

DEFAULT_MAX_ENDPOINTS = 8  # endpoints of one subscriber
DEFAULT_ENDPOINTS = 1024
MAX_SEARCH_STEPS = 32  # binary search steps of a range stage: a map holds fewer than 2**32 bounds
CAPACITY_FACTOR = 2.0  # room for two generations of the compiled entries during `subc update`
MIN_CAPACITY = 16


def capacity(n_entries: int, factor: float = CAPACITY_FACTOR) -> int:
    """Map capacity for ``n_entries`` entries per generation: ``factor`` generations, at least 16."""
    return max(MIN_CAPACITY, math.ceil(n_entries * factor))


def state_capacity(entries: list, factor: float = CAPACITY_FACTOR) -> int:
    """Capacity of an array map indexed by the ``state`` of ``entries`` (entries of
    :mod:`.maps_doc` with a ``state``): ``factor`` times the highest state + 1 (two generations,
    one from each end, at 2.0), at least 16."""
    return capacity(max((e.state for e in entries), default=0) + 1, factor)


def steps_needed(runs: int) -> int:
    """Binary search steps that find a run among ``runs`` (ceil(log2 runs); 0 for one or none)."""
    return max(0, runs - 1).bit_length()


def search_steps(width: int, runs: int, state_value: bool) -> int:
    """Steps of a range stage's binary search over a ``width``-bit key whose states have at most
    ``runs`` runs: enough for any rule set (min(32, width)) for a header field, so that `subc
    update` can swap in any rule set; for a state value (64-bit counts and sums, compared against
    a few thresholds) the steps ``runs`` needs plus 3 (8 times as many thresholds per state), at
    least 4, which keeps the verifier's work per stage small.  `subc update` refuses a rule set
    that needs more (:func:`steps_needed`)."""
    full = min(MAX_SEARCH_STEPS, width)
    if not state_value:
        return full
    return min(full, max(4, steps_needed(runs) + 3))


def _leaf_entry(state: int, decision) -> LeafEntry:
    """The ``subc_leaf`` entry of a leaf :class:`~subc.ir.decisions.Decision`."""
    if decision.ports:
        return LeafEntry(state, "fwd", tuple(decision.ports))
    name = decision.action[0]
    if name not in ("drop", "nop"):
        raise SubcError(f"--target ebpf: action '{name}' has no eBPF meaning (fwd, drop and nop only)")
    return LeafEntry(state, name)


def _struct_doc(s: L.Struct) -> StructDoc:
    return StructDoc(s.name, s.size, tuple(s.fields))


class _Maps(list[MapDoc]):
    """The ``maps`` list of ``maps.json`` being built, in declaration order."""

    def add(
        self,
        name: str,
        mtype: str,
        key: L.Struct,
        value: L.Struct,
        entries: list,
        role: str,
        field: str | None = None,
        cap: int | None = None,
    ) -> None:
        """Append map ``name`` of BPF type ``mtype`` with key and value layouts, its entries in
        logical form (:mod:`.maps_doc`), its role and field, and its capacity (default:
        :func:`capacity` of the entries)."""
        cap = cap if cap is not None else capacity(len(entries))
        self.append(MapDoc(name, mtype, role, field, _struct_doc(key), _struct_doc(value), cap, tuple(entries)))


class _StateValueMaps:
    """The maps the state-value stages share (a program may use at most 64 maps): one info array,
    one bounds array, and an array of each stage's first info slot per generation (``subc_sv_base``)."""

    def __init__(self):
        self.info: list[InfoEntry] = []
        self.bounds: list[BoundEntry] = []
        self.base: list[int] = []
        self.next_slot = 0  # the first info slot of the next state-value stage

    def stage(self, stage: FieldStage) -> StageDoc:
        """Add ``stage``'s states; its ``stages`` entry."""
        q = stage.field
        first_slot = self.next_slot
        self.next_slot += max((st.state for st in stage.states), default=0) + 1
        self.base.append(first_slot)
        runs = 0
        for st in stage.states:
            if len(st.runs) == 1:  # the next state does not depend on the value: no read, no search
                self.info.append(InfoEntry(first_slot + st.state, next=st.runs[0][2], count=1))
                continue
            first = len(self.bounds)
            self.info.append(InfoEntry(first_slot + st.state, offset=first, count=len(st.runs)))
            self.bounds.extend(BoundEntry(first + j, lo, t) for j, (lo, _, t) in enumerate(st.runs))
            runs = max(runs, len(st.runs))
        return StageDoc(
            q.name,
            "range",
            (MN.SV_INFO, MN.SV_BOUNDS),
            q.width,
            len(stage.states),
            stage.n_next,
            max_runs=runs,
            search_steps=search_steps(q.width, runs, True),
            base_index=len(self.base) - 1,
        )

    def add_to(self, maps: _Maps) -> None:
        """Declare the shared maps (none when no stage is a state value)."""
        if not self.base:
            return
        maps.add(MN.SV_INFO, "array", L.U32, L.INFO, self.info, "state_info", cap=state_capacity(self.info))
        maps.add(MN.SV_BOUNDS, "array", L.U32, L.BOUND, self.bounds, "bounds")
        maps.add(
            MN.SV_BASE,
            "array",
            L.U32,
            L.bases_struct(len(self.base)),
            [BasesEntry(0, tuple(self.base))],
            "state_bases",
            cap=2,
        )


def _field_stage_maps(maps: _Maps, i: int, stage: FieldStage) -> StageDoc:
    """Declare the maps of field stage ``i`` (range, exact or lpm: the module docstring); its
    ``stages`` entry."""
    q = stage.field
    base = f"st{i}"
    shape = (q.width, len(stage.states), stage.n_next)
    if q.match_kind == "range":
        info: list[InfoEntry] = []
        bounds: list[BoundEntry] = []
        for st in stage.states:
            first = len(bounds)
            info.append(InfoEntry(st.state, offset=first, count=len(st.runs)))
            bounds.extend(BoundEntry(first + j, lo, t) for j, (lo, _, t) in enumerate(st.runs))
        maps.add(f"{base}_info", "array", L.U32, L.INFO, info, "state_info", q.name, cap=state_capacity(info))
        maps.add(f"{base}_bnd", "array", L.U32, L.BOUND, bounds, "bounds", q.name)
        runs = max((len(st.runs) for st in stage.states), default=0)
        steps = search_steps(q.width, runs, False)
        return StageDoc(q.name, "range", (f"{base}_info", f"{base}_bnd"), *shape, max_runs=runs, search_steps=steps)
    if q.match_kind == "exact":
        info = []
        ex: list[ExactEntry] = []
        for st in stage.states:
            es, miss = FieldStage.exact_form(st)
            info.append(InfoEntry(st.state, miss=miss))
            ex.extend(ExactEntry(st.state, v, t) for v, t in es)
        maps.add(f"{base}_info", "array", L.U32, L.INFO, info, "state_info", q.name, cap=state_capacity(info))
        maps.add(f"{base}_ex", "hash", L.EXACT_KEY, L.U32, ex, "exact", q.name)
        return StageDoc(q.name, "exact", (f"{base}_info", f"{base}_ex"), *shape)
    lpm = [LpmEntry(st.state, v, plen, t) for st in stage.states for v, plen, t in FieldStage.lpm_form(st, q.width)]
    maps.add(f"{base}_lpm", "lpm_trie", L.LPM_KEY, L.U32, lpm, "lpm", q.name)
    return StageDoc(q.name, "lpm", (f"{base}_lpm",), *shape)


def _state_maps(maps: _Maps, ir: SubscriptionIR) -> None:
    """Declare the maps of comparisons on state: the update masks and the aggregate registers."""
    st = ir.state
    assert st is not None  # called for a stateful rule set only
    # every state gets its mask, 0 too: a later rule set in this generation's slots finds none stale
    masks = dict(st.updates)
    boundary_states = [x.state for x in ir.stages[st.boundary].states] if st.boundary < len(ir.stages) else []
    upd = [MaskEntry(s, masks.get(s, 0)) for s in sorted(set(boundary_states) | set(masks))]
    maps.add(
        MN.UPD, "array", L.U32, L.mask_struct("subc_umask", st.mask_width), upd, "update_masks", cap=state_capacity(upd)
    )
    agg = L.agg_struct(max([len(i.thresholds) for i in st.instances], default=1))
    maps.add(MN.AGG, "array", L.U32, agg, [], "registers", cap=2 * len(st.instances))


def _leaf_maps(maps: _Maps, ir: SubscriptionIR, leaves: list[LeafEntry]) -> None:
    """Declare the leaf maps: actions, subscriber sets and, with named counters, each leaf's updates."""
    maps.add(MN.LEAF, "array", L.U32, L.LEAF, leaves, "leaf", cap=state_capacity(leaves))
    maps.add(MN.LEAF_SET, "array", L.U32, L.SUBSET, [], "leaf_sets", cap=state_capacity(leaves))
    if ir.state is not None and ir.state.count_updates:  # named counters: each leaf's updates (0 too)
        cmask = dict(ir.state.leaf_counts)
        maps.add(
            MN.CNT,
            "array",
            L.U32,
            L.mask_struct("subc_cmask", ir.state.count_width),
            [MaskEntry(e.state, cmask.get(e.state, 0)) for e in leaves],
            "count_masks",
            cap=state_capacity(leaves),
        )


def _broker_maps(maps: _Maps, leaves: list[LeafEntry]) -> None:
    """Declare the maps the broker fills (subscribers, endpoints, sequence numbers, counters, tail
    calls, the fan-out's)."""
    maps.add(MN.SUBS, "array", L.U32, L.sub_struct(DEFAULT_MAX_ENDPOINTS), [], "subscribers", cap=L.MAX_SUBSCRIBERS)
    maps.add(MN.ALL, "array", L.U32, L.SUBSET, [], "everyone", cap=2)
    maps.add(MN.EPS, "array", L.U32, L.ENDPOINT, [], "endpoints", cap=DEFAULT_ENDPOINTS)
    maps.add(MN.SEQ, "array", L.U32, L.U64, [], "sequence", cap=L.RECIPIENTS)
    maps.add(MN.STATS, "percpu_array", L.U32, L.U64, [], "stats", cap=len(L.STATS))
    maps.add(MN.SUB_CNT, "percpu_array", L.U32, L.SUB_COUNTER, [], "subscriber_counters", cap=L.RECIPIENTS)
    maps.add(MN.LEAF_CNT, "percpu_array", L.U32, L.COUNTER, [], "leaf_counters", cap=state_capacity(leaves))
    maps.add(MN.JMP_XDP, "prog_array", L.U32, L.U32, [], "tail_calls", cap=3)
    maps.add(MN.JMP_TC, "prog_array", L.U32, L.U32, [], "tail_calls", cap=1)
    maps.add(MN.FAN_CFG, "array", L.U32, L.FAN_CFG, [], "fan_config", cap=1)
    maps.add(MN.FAN_DEV, "hash", L.U32, L.U32, [], "fan_devices", cap=L.FAN_SLOTS)
    maps.add(MN.FAN_GEPS, "array", L.U32, L.U32, [], "fan_group_endpoints", cap=L.FAN_SLOTS * L.FAN_SLOTS)
    maps.add(MN.FAN, "array_of_maps", L.U32, L.U32, [], "fan", cap=L.FAN_SLOTS * L.FAN_SLOTS + 1 + L.FAN_SETS)
    maps.add(MN.FAN_SETS, "hash", L.U64, L.U32, [], "fan_sets", cap=L.FAN_SETS)
    maps.add(MN.FAN_MISS, "hash", L.U64, L.U64, [], "fan_misses", cap=L.FAN_MISSES)
    maps.add(MN.FAN_HITS, "percpu_array", L.U32, L.U64, [], "fan_set_datagrams", cap=L.FAN_SETS)


def build_maps(res: CompileResult, plan: ParsePlan) -> MapsDoc:
    """The ``maps.json`` document of ``res`` (see the module docstring): the lowering of its IR.

    Raises SubcError when a decision or the default action has no eBPF meaning."""
    spec, ir = res.spec, res.ir
    default = spec.default_action
    if default not in ("drop", "nop"):
        raise SubcError(
            f"--target ebpf: default action '{default}' has no eBPF meaning (drop or nop)", spec.default_action_location
        )
    maps = _Maps()
    maps.add(MN.ROOT, "array", L.U32, L.U32, [RootEntry(0, ir.root_state)], "root", cap=1)
    sv = _StateValueMaps()
    stages = []
    for i, stage in enumerate(ir.stages):
        q = stage.field
        if q.match_kind == "range" and is_state_field(q.name):
            stages.append(sv.stage(stage))
        else:
            stages.append(_field_stage_maps(maps, i, stage))
    sv.add_to(maps)
    if ir.state is not None:
        _state_maps(maps, ir)
    leaves = [LeafEntry(0, default)]
    leaves += [_leaf_entry(leaf.state, leaf.decision) for leaf in ir.leaves]
    _leaf_maps(maps, ir, leaves)
    _broker_maps(maps, leaves)
    return MapsDoc(
        program=MAIN_FILE,
        functions={"xdp": "subc_xdp", "tc": "subc_tc", "xdp_more": "subc_xdp_more", "tc_more": "subc_tc_more"},
        moldudp64=plan.moldudp64,
        generation_bit=L.GEN_BIT,
        ports=tuple(p for p, _ in plan.ports),
        field_order=tuple(ir.field_order),
        root_state=ir.root_state,
        default_action=default,
        max_endpoints=DEFAULT_MAX_ENDPOINTS,
        stats=tuple(L.STATS),
        stages=tuple(stages),
        subscribers=tuple(sorted({s for e in leaves for s in e.subscribers or ()})),
        maps=tuple(maps),
        state=state_doc(ir) if ir.state is not None else None,
    )


def state_doc(ir: SubscriptionIR) -> dict:
    """The ``state`` section of ``maps.json`` (docs/state.md "Stateful subscriptions"): ``time``
    (``field`` giving a message's time in ``unit_ns``, or null: ``bpf_ktime_get_ns`` when the
    datagram is taken), ``instances`` (``index``, ``kind``, ``field``, ``window_ns``,
    ``thresholds``; instance k of generation g is slot k, or capacity - 1 - k, of ``subc_agg``)
    ``values`` (``stage`` index, ``instance``, ``threshold``) and ``count_updates`` (``index``: bit
    of a leaf's mask in ``subc_cnt``, ``instance``, ``field`` added or null to add 1)."""
    st = ir.state
    assert st is not None  # called for a stateful rule set only
    return {
        "time": {"field": st.time_field.name if st.time_field else None, "unit_ns": st.time_unit_ns},
        "lock": "bpf_spin_lock per instance",
        "instances": [i.as_json() for i in st.instances],
        "values": [
            {"stage": st.boundary + j, "instance": v.instance, "threshold": v.threshold}
            for j, v in enumerate(st.values)
        ],
        "count_updates": [
            {"index": u.index, "instance": u.instance, "field": u.field.name if u.field else None}
            for u in st.count_updates
        ],
    }


def ebpf_plan(res: CompileResult) -> ParsePlan:
    """The parse plan of ``res``'s spec, with its fields checked (SubcError when unsupported)."""
    plan = plan_parser(res.spec)
    fields = [f for f in res.ir.field_order if not is_state_field(f)]
    sp = res.ir.state
    if sp is not None:
        fields += [i.field.name for i in sp.instances if i.field is not None]
        fields += [u.field.name for u in sp.count_updates if u.field is not None]
        fields += [sp.time_field.name] if sp.time_field is not None else []
    check_fields(res.spec, plan, list(dict.fromkeys(fields)))
    return plan


def report(res: CompileResult, doc: MapsDoc) -> dict:
    """``report.json`` of the eBPF target: states and entries per stage and per map, leaves (no
    timings, so that a compile's outputs are byte-identical from run to run).

    ``instructions`` is null at compile time (the counts exist only once the kernel has verified
    and rewritten the programs); ``subc load`` fills it with the XDP and TC programs' counts.
    """
    return {
        "target": "ebpf",
        "rules": len(res.rules),
        "diagram_states": res.diagram_states,
        "field_order": res.ir.field_order,
        "orders_tried": res.orders_tried,
        "stages": [s.to_json() for s in doc.stages],
        "maps": [
            {
                "name": m.name,
                "type": m.type,
                "role": m.role,
                "field": m.field,
                "entries": len(m.entries),
                "capacity": m.capacity,
            }
            for m in doc.maps
        ],
        "leaf_states": len(res.ir.leaves),
        "total_entries": sum(len(m.entries) for m in doc.maps if m.role != "root"),
        "multicast_groups": len(res.ir.port_sets),
        "instructions": None,
    }
