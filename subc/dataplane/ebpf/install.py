"""Writing a compiled rule set (``maps.json``) into the BPF maps of the eBPF target, by generation.

A generation is a whole rule set in the maps: every state carries the generation bit
(:data:`~subc.backends.ebpf.layout.GEN_BIT` for generation 1, none for 0) in hash and
trie keys; in the arrays indexed by state (``stN_info``, ``subc_leaf``, ``subc_leaf_cnt``,
``subc_leaf_set``) and in the bounds arrays each generation has its region (generation 0 from the
bottom, generation 1 from the top: :func:`state_slot`); the program reads the generation from
``subc_root`` once per datagram.  :func:`install_generation` writes a generation without touching the live one, then
:func:`switch_root` publishes it with one 4-byte map write, and :func:`retire_generation`
deletes the old one.  No packet is ever classified with a mix of the two.

Leaf actions are resolved here: ``fwd`` to subscribers becomes the leaf's set of subscribers (a
512-bit set: the program sends each message to every subscriber of its leaf, one copy per
endpoint of each); ``nop`` (and, without a subscribers file, ``fwd``: filter mode) sends the
message to the local stack; ``drop`` sends it nowhere.  The subscribers' endpoints
(``subc_subs``) and sequence numbers (``subc_seq``) do not depend on the rule set: they are
written once, at load (:func:`install_subscribers`).

Comparisons on state (docs/state.md "Stateful subscriptions"): ``subc_upd`` (update masks) and
``subc_cnt`` (a leaf's named-counter updates) are arrays indexed by state like ``stN_info``;
``subc_agg`` holds instance k of generation 0 at slot k and of
generation 1 at capacity - 1 - k, and a generation's registers are written empty when it is
installed (a new rule set starts its aggregates afresh).  The state-value stages share one info
array (``subc_sv_info``, stage j's state s at ``base_j + s``; a state with one run holds its next
state instead of a bounds offset) and one bounds array (``subc_sv_bnd``); ``subc_sv_base`` holds
every ``base_j`` of generation g at index g.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...backends.ebpf import map_names as MN
from ...backends.ebpf import layout as L
from ...backends.ebpf.maps_doc import ENTRY_ROLES, MapDoc, MapsDoc
from ...errors import SubcError
from .bpf import Map, per_cpu
from .fanout import endpoint_groups
from .subscribers import Endpoint, Subscribers


@dataclass
class GenerationPlan:
    """What a generation writes: per map a list of (key bytes, value bytes); per array map with
    generation regions, the slots its region takes (``regions``: the bounds of a bounds array,
    the highest state + 1 of an array indexed by state)."""

    gen: int
    writes: dict[str, list[tuple[bytes, bytes]]] = field(default_factory=dict)
    regions: dict[str, int] = field(default_factory=dict)
    root: int = 0


def tag(state: int, gen: int) -> int:
    """``state`` with the generation bit of ``gen`` (0 or 1)."""
    return state | (L.GEN_BIT if gen else 0)


def state_slot(state: int, gen: int, cap: int) -> int:
    """The index of (untagged) ``state`` of generation ``gen`` in an array map of ``cap`` entries
    indexed by state: ``state`` for generation 0, ``cap - 1 - state`` for generation 1 (the C
    program's ``SUBC_SLOT``)."""
    return state if gen == 0 else cap - 1 - state


def _ip_be(ip: str) -> int:
    return int.from_bytes(bytes(int(x) for x in ip.split(".")), "big")


def _mac(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))


def endpoint_value(ep: Endpoint, group: int = 0) -> bytes:
    """``struct subc_endpoint`` of a resolved endpoint (``group``: its interface's fan-out group)."""
    return L.ENDPOINT.pack(
        ifindex=ep.ifindex,
        subscriber=ep.subscriber,
        saddr=_ip_be(ep.src_ip),
        daddr=_ip_be(ep.ip),
        dport=ep.port,
        smac=_mac(ep.src_mac),
        dmac=_mac(ep.mac),
        group=group,
    )


def plan_generation(doc: MapsDoc, gen: int, subs: Subscribers | None, caps: dict[str, int]) -> GenerationPlan:
    """The writes of ``doc``'s rule set as generation ``gen`` (see the module docstring).

    ``caps`` are the map capacities in the kernel.  Raises SubcError when a rule forwards to a
    subscriber the subscribers file lacks.
    """
    plan = GenerationPlan(gen)
    _plan_stages(plan, doc, caps)
    _plan_state_maps(plan, doc, caps)
    local = _plan_leaves(plan, doc, subs, caps)
    everyone = [sid for sid, eps in subs.by_id.items() if eps] if subs is not None else []
    plan.writes[MN.ALL] = [(L.U32.pack(v=gen), L.SUBSET.pack(subs=subscriber_words(everyone), local=int(local)))]
    plan.root = tag(doc.root_state, gen)
    return plan


def _plan_stages(plan: GenerationPlan, doc: MapsDoc, caps: dict[str, int]) -> None:
    """Add the writes of the field stages' maps to ``plan``: a range stage's info slots and bounds
    (this generation's bounds region: the front for generation 0, the back for 1), an exact
    stage's info slots and exact keys, an LPM stage's prefixes.  Raises SubcError when a bounds
    array is too small for the rule set."""
    gen, w, maps = plan.gen, plan.writes, doc.by_name
    done: set[str] = set()
    for st in doc.stages:
        if st.kind == "range" and st.maps[0] in done:
            continue  # the state-value stages share their maps: written with the first one
        done.update(st.maps)
        if st.kind == "range":
            info, bnd = (maps[n] for n in st.maps)
            n = len(bnd.entries)
            if n > caps[bnd.name]:
                raise SubcError(
                    f"bounds array {bnd.name} holds {caps[bnd.name]} entries, the rule set needs {n}: "
                    "load the rule set again (subc unload, subc load) or with a larger --capacity-factor"
                )
            base = 0 if gen == 0 else caps[bnd.name] - n
            plan.regions[bnd.name] = n
            _state_region(plan, info, caps)
            w[info.name] = [
                (
                    _slot_key(e.state, gen, caps[info.name]),
                    L.INFO.pack(a=e.next if e.next is not None else base + e.offset, b=e.count),
                )
                for e in info.entries
            ]
            w[bnd.name] = [(L.U32.pack(v=base + e.index), L.BOUND.pack(lo=e.lo, next=e.next)) for e in bnd.entries]
        elif st.kind == "exact":
            info, ex = (maps[n] for n in st.maps)
            _state_region(plan, info, caps)
            w[info.name] = [(_slot_key(e.state, gen, caps[info.name]), L.INFO.pack(a=e.miss)) for e in info.entries]
            w[ex.name] = [
                (L.EXACT_KEY.pack(state=tag(e.state, gen), value=e.value), L.U32.pack(v=e.next)) for e in ex.entries
            ]
        else:
            (lpm,) = (maps[n] for n in st.maps)
            width = st.width
            w[lpm.name] = [
                (
                    L.LPM_KEY.pack(
                        prefixlen=32 + e.prefix_len,
                        state=tag(e.state, gen),
                        value=(e.value << (64 - width)) & ((1 << 64) - 1),
                    ),
                    L.U32.pack(v=e.next),
                )
                for e in lpm.entries
            ]


def _plan_state_maps(plan: GenerationPlan, doc: MapsDoc, caps: dict[str, int]) -> None:
    """Add the writes of the maps of comparisons on state and named counters to ``plan`` (those
    ``doc`` has): update masks by state with this generation's registers emptied, the state-value
    stages' first info slots, the counter updates of each leaf's message."""
    gen, w, maps = plan.gen, plan.writes, doc.by_name
    if MN.UPD in maps:  # comparisons on state: update masks by state, this generation's registers emptied
        upd, agg = maps[MN.UPD], maps[MN.AGG]
        _state_region(plan, upd, caps)
        w[MN.UPD] = _mask_entries(upd, gen, caps)
        n, cap = doc.instances, caps[MN.AGG]
        empty = bytes(agg.value.size)
        w[MN.AGG] = [(L.U32.pack(v=k if gen == 0 else cap - 1 - k), empty) for k in range(n)]
        plan.regions[MN.AGG] = n
    if MN.SV_BASE in maps:  # the state-value stages' first info slots, this generation's
        bases = list(maps[MN.SV_BASE].entries[0].bases)
        w[MN.SV_BASE] = [(L.U32.pack(v=gen), L.bases_struct(len(bases)).pack(b=bases))]
    if MN.CNT in maps:  # named counters: the updates of each leaf's message
        cnt = maps[MN.CNT]
        _state_region(plan, cnt, caps)
        w[MN.CNT] = _mask_entries(cnt, gen, caps)


def _plan_leaves(plan: GenerationPlan, doc: MapsDoc, subs: Subscribers | None, caps: dict[str, int]) -> bool:
    """Add the writes of the leaves, their counters and their subscriber sets to ``plan`` (the
    three share the leaf's slot).  Returns whether a leaf passes its message to the local stack
    (``nop``, or any forwarding leaf without a subscribers file).  Raises SubcError when a rule
    forwards to a subscriber the subscribers file lacks."""
    gen, w = plan.gen, plan.writes
    leaves, counters, sets = [], [], []
    local = False
    leaf_cap = caps[MN.LEAF]
    _state_region(plan, doc.by_name[MN.LEAF], caps)
    for e in doc.leaves:
        # the leaf, its counters and its subscriber set share the leaf's slot
        set_index = state_slot(e.state, gen, leaf_cap)
        key = L.U32.pack(v=set_index)
        ids: list[int] = []
        if e.action == "drop":
            val = L.LEAF.pack(set=set_index)
        elif e.action == "nop" or subs is None:
            val = L.LEAF.pack(flags=L.LEAF_PASS_LOCAL, set=set_index)
            local = True
        else:
            ids = sorted(set(e.subscribers or ()))
            for sid in ids:
                if sid not in subs.by_id:
                    raise SubcError(f"{subs.path}: rules forward to subscriber {sid}, which the subscribers file lacks")
            ids = [sid for sid in ids if subs.receives(sid)]
            val = L.LEAF.pack(
                nsubs=len(ids), sub=ids[0] if len(ids) == 1 else 0, set=set_index, subs=subscriber_words(ids)
            )
        leaves.append((key, val))
        counters.append((key, L.COUNTER.pack()))
        sets.append((L.U32.pack(v=set_index), L.SUBSET.pack(subs=subscriber_words(ids))))
    w[MN.LEAF] = leaves
    w[MN.LEAF_CNT] = counters
    w[MN.LEAF_SET] = sets
    return local


def _slot_key(state: int, gen: int, cap: int) -> bytes:
    return L.U32.pack(v=state_slot(state, gen, cap))


def _mask_entries(m: MapDoc, gen: int, caps: dict[str, int]) -> list[tuple[bytes, bytes]]:
    """The writes of mask array ``m`` (``subc_upd``, ``subc_cnt``: by state) for generation
    ``gen``: each mask as its 64-bit words, host order."""
    words = m.value.size // 8
    st = L.mask_struct(m.value.struct, 64 * words)
    return [(_slot_key(e.state, gen, caps[m.name]), st.pack(w=L.mask_words(e.mask, words))) for e in m.entries]


def _state_region(plan: GenerationPlan, m: MapDoc, caps: dict[str, int]) -> None:
    """Record the region of array map ``m`` (indexed by its entries' states); raise SubcError when
    one generation alone does not fit."""
    n = m.state_count
    if n > caps[m.name]:
        raise SubcError(
            f"array {m.name} holds {caps[m.name]} states, the rule set needs {n}: load the rule set "
            "again (subc unload, subc load) or with a larger --capacity-factor"
        )
    plan.regions[m.name] = n


def subscriber_words(ids) -> list[int]:
    """The 512-bit subscriber set of ``ids`` (0..511) as 8 64-bit words (bit ``id % 64`` of word ``id // 64``)."""
    words = [0] * L.SUB_WORDS
    for sid in ids:
        words[sid // 64] |= 1 << (sid % 64)
    return words


def needed_endpoints(subs: Subscribers | None) -> int:
    """The most endpoints of one subscriber (1 without subscribers)."""
    if subs is None:
        return 1
    return max([1] + [len(eps) for eps in subs.by_id.values()])


def install_subscribers(maps: dict[str, Map], subs: Subscribers | None, max_endpoints: int) -> None:
    """Write the endpoints (``subc_eps``), each subscriber's endpoint indexes (``subc_subs``) and
    every recipient's first sequence number (1, ``subc_seq``).  Raises SubcError when a subscriber
    has more than ``max_endpoints`` endpoints."""
    if subs is not None:
        for i, (ep, group) in enumerate(zip(subs.endpoints, endpoint_groups(subs))):
            maps[MN.EPS].update(L.U32.pack(v=i), endpoint_value(ep, group))
        st = L.sub_struct(max_endpoints)
        for sid in subs.by_id:
            idx = subs.endpoint_indexes(sid)
            if len(idx) > max_endpoints:
                raise SubcError(
                    f"{subs.path}: subscriber {sid} has {len(idx)} endpoints; the program allows {max_endpoints}"
                )
            maps[MN.SUBS].update(L.U32.pack(v=sid), st.pack(count=len(idx), ep=idx))
    for r in range(L.RECIPIENTS):
        maps[MN.SEQ].update(L.U32.pack(v=r), L.U64.pack(v=1))


def capacities(doc: MapsDoc, factor: float, subs: Subscribers | None) -> dict[str, int]:
    """Map capacities for ``doc``: ``factor`` times the entries (two generations at 2.0); for the
    arrays indexed by state, ``factor`` times the highest state + 1 (the leaf counters and
    subscriber sets as many as the leaves: they share the leaf's slot)."""
    out = {}
    leaf = doc.map(MN.LEAF)
    for m in doc.maps:
        if m.role in ("state_info", "leaf", "update_masks"):
            out[m.name] = max(16, math.ceil(m.state_count * factor))
        elif m.role in ENTRY_ROLES:
            out[m.name] = max(16, math.ceil(len(m.entries) * factor))
        elif m.role in ("leaf_counters", "leaf_sets"):
            out[m.name] = max(16, math.ceil(leaf.state_count * factor))
        elif m.role == "endpoints":
            out[m.name] = max(m.capacity, len(subs.endpoints) if subs else 0)
        else:
            out[m.name] = m.capacity
    return out


def check_fits(plan: GenerationPlan, maps: dict[str, Map], caps: dict[str, int], live: dict[str, int]) -> None:
    """Raise SubcError when a map cannot hold ``plan`` next to ``live`` entries of the other
    generation (``live``: per tagged hash or trie map its entries, per array with generation
    regions the slots of the live region)."""
    for name, items in plan.writes.items():
        if name in plan.regions or name in (MN.ALL, MN.LEAF_CNT, MN.LEAF_SET):
            continue
        if len(items) + live.get(name, 0) > caps[name]:
            raise SubcError(
                f"map {name} holds {caps[name]} entries: the new rule set needs {len(items)} next to the "
                f"{live.get(name, 0)} live ones; load the rule set again (subc unload, subc load) or load "
                f"with a larger --capacity-factor"
            )
    for name, n in plan.regions.items():
        used = live.get(name, 0)
        if n + used > caps[name]:
            raise SubcError(
                f"array {name} ({caps[name]} entries) cannot hold {n} new entries next to {used} live "
                "ones: load the rule set again (subc unload, subc load) or with a larger --capacity-factor"
            )


def install_generation(plan: GenerationPlan, maps: dict[str, Map]) -> None:
    """Write every entry of ``plan`` except the root (the live generation is not touched)."""
    for name, items in plan.writes.items():
        m = maps[name]
        for k, v in items:
            m.update(k, v)


def switch_root(plan: GenerationPlan, maps: dict[str, Map]) -> None:
    """Publish ``plan``'s generation: one write of the root state."""
    maps[MN.ROOT].update(L.U32.pack(v=0), L.U32.pack(v=plan.root))


def key_generation(name: str, key: bytes) -> int:
    """The generation of a key of map ``name`` (tagged keys only)."""
    if name.endswith("_lpm"):
        state = int.from_bytes(key[4:8], "big")
    else:
        state = int.from_bytes(key[:4], "little")
    return 1 if state & L.GEN_BIT else 0


#: Maps whose keys carry the generation bit (hash and trie maps); arrays are never deleted from.
TAGGED_SUFFIXES = ("_ex", "_lpm")


def retire_generation(gen: int, maps: dict[str, Map]) -> int:
    """Delete every key of generation ``gen`` from the tagged maps; returns how many."""
    n = 0
    for name, m in maps.items():
        if name.endswith(TAGGED_SUFFIXES):
            for k in m.keys():
                if key_generation(name, k) == gen and m.delete(k):
                    n += 1
    return n


def live_counts(gen: int, maps: dict[str, Map], regions_used: dict[str, int]) -> dict[str, int]:
    """Entries of generation ``gen`` per tagged map, and ``regions_used`` (slots of the live
    generation per array with generation regions)."""
    out = dict(regions_used)
    for name, m in maps.items():
        if name.endswith(TAGGED_SUFFIXES):
            out[name] = sum(1 for k in m.keys() if key_generation(name, k) == gen)
    return out


def leaf_counters(maps: dict[str, Map], doc: MapsDoc, gen: int, caps: dict[str, int]) -> dict[int, dict[str, int]]:
    """Per leaf state of ``doc`` installed as generation ``gen``: its messages and bytes, summed
    over CPUs."""
    m, out = maps[MN.LEAF_CNT], {}
    for e in doc.leaves:
        vals = [L.COUNTER.unpack(v) for v in per_cpu(m.lookup(_slot_key(e.state, gen, caps[MN.LEAF])))]
        out[e.state] = {"messages": sum(v["messages"] for v in vals), "bytes": sum(v["bytes"] for v in vals)}
    return out
