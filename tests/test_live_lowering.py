"""One lowering for batch and live (subc/ir/lowering.py): the entries ``subc serve`` writes for
its live subscriptions are, entry for entry, those ``subc compile`` gives the same rules.

Hypothesis draws subscriptions over fields of every match kind (DIFF_SPEC of ebpf_util: range,
exact of 2 and 8 bits, lpm of 8 and 32 bits) in a random field order, and a sequence of additions
and removals.  After every change, the live delivery diagram (subc/ir/incremental.py) is
written by the live eBPF writer (:class:`~subc.dataplane.ebpf.live_maps.LiveMaps`) into maps held in
memory, and the live rules ``condition : fwd(subscriber)`` are compiled for the eBPF target
(``maps.json``).  Walking both from the root pairs each live node with a compiled state (their
runs must have the same boundaries, and the pairing must be one to one); then every paired
state's bounds, exact entries with miss target, and LPM entries must be equal, next states
translated through the pairing, and every leaf's subscribers too.  No kernel is needed.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebpf_util import DIFF_SPEC
from strategies import condition
from subc.compiler.driver import compile_rules
from subc.ir.incremental import LiveDiagram
from subc.lang.rules import parse_rules
from subc.backends.ebpf import layout as L
from subc.backends.ebpf.program import live_program
from subc.backends.p4.entries_doc import EntriesDoc
from subc.backends.ebpf.target import build_maps, ebpf_plan
from subc.errors import SubcError
from subc.dataplane.ebpf.live_maps import LiveMaps

QS = {f: DIFF_SPEC.query_fields[f] for f in ("m.a", "m.b", "m.c", "m.f", "m.d", "ip.dstAddr")}


class MemoryMap:
    """A BPF map in memory: what :class:`LiveMaps` writes (key bytes -> value bytes)."""

    def __init__(self):
        self.d: dict[bytes, bytes] = {}

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        self.d[key] = value

    def update_batch(self, keys, values) -> None:
        self.d.update(zip(keys, values))

    def delete_batch(self, keys) -> None:
        for k in keys:
            self.d.pop(k, None)

    def lookup(self, key: bytes):
        return self.d.get(key)


def live_entries(maps: dict, stages: list[dict], level: int, state: int) -> dict:
    """What the maps hold for ``state`` of ``level`` in logical form (next states as written)."""
    if level == len(stages):
        raw = maps["subc_leaf"].lookup(L.U32.pack(v=state))
        words = L.LEAF.unpack(raw)["subs"] if raw else [0] * L.SUB_WORDS
        return {"subscribers": sorted(i for i in range(L.MAX_SUBSCRIBERS) if words[i // 64] >> (i % 64) & 1)}
    stg = stages[level]
    if stg["kind"] == "range":
        info = L.INFO.unpack(maps[stg["maps"][0]].lookup(L.U32.pack(v=state)))
        bounds = [L.BOUND.unpack(maps[stg["maps"][1]].lookup(L.U32.pack(v=info["a"] + j))) for j in range(info["b"])]
        return {"bounds": [(b["lo"], b["next"]) for b in bounds]}
    if stg["kind"] == "exact":
        info = L.INFO.unpack(maps[stg["maps"][0]].lookup(L.U32.pack(v=state)))
        ex = {}
        for k, v in maps[stg["maps"][1]].d.items():
            key = L.EXACT_KEY.unpack(k)
            if key["state"] == state:
                ex[key["value"]] = L.U32.unpack(v)["v"]
        return {"miss": info["a"], "exact": ex}
    width = stg["width"]
    lpm = set()
    for k, v in maps[stg["maps"][0]].d.items():
        key = L.LPM_KEY.unpack(k)
        if key["state"] == state:
            lpm.add((key["value"] >> (64 - width), key["prefixlen"] - 32, L.U32.unpack(v)["v"]))
    return {"lpm": lpm}


def batch_entries(doc: dict, level: int, state: int) -> dict:
    """What ``maps.json`` holds for ``state`` of ``level`` in the same logical form."""
    maps = {m["name"]: m for m in doc["maps"]}
    stages = doc["stages"]
    if level == len(stages):
        e = next((e for e in maps["subc_leaf"]["entries"] if e["state"] == state), {})
        return {"subscribers": sorted(e.get("subscribers", []))}
    stg = stages[level]
    names = stg["maps"]
    if stg["kind"] == "range":
        info = next(e for e in maps[names[0]]["entries"] if e["state"] == state)
        bounds = sorted(maps[names[1]]["entries"], key=lambda e: e["index"])
        return {"bounds": [(b["lo"], b["next"]) for b in bounds[info["offset"] : info["offset"] + info["count"]]]}
    if stg["kind"] == "exact":
        info = next(e for e in maps[names[0]]["entries"] if e["state"] == state)
        ex = {e["value"]: e["next"] for e in maps[names[1]]["entries"] if e["state"] == state}
        return {"miss": info["miss"], "exact": ex}
    return {"lpm": {(e["value"], e["prefix_len"], e["next"]) for e in maps[names[0]]["entries"] if e["state"] == state}}


def pair_states(root, ir, order: list[str]) -> list[dict]:
    """Per live level, live state -> compiled state, by walking the live diagram and the IR from
    their roots: runs with the same boundaries, the pairing one to one.  A field no live rule
    tests is not in the compiled IR: its live nodes have one run and pair with the compiled state
    below them."""
    by_field = {stage.field.name: {st.state: st for st in stage.states} for stage in ir.stages}
    pairs: list[dict] = [{} for _ in range(len(order) + 1)]
    todo = [(0, root, ir.root_state)]
    while todo:
        lv, node, s = todo.pop()
        live_state = 1 if node is root else node.state  # the root is written to slot 1 below
        if live_state in pairs[lv]:
            assert pairs[lv][live_state] == s, f"level {lv}: live state {live_state} is two compiled states"
            continue
        assert s not in pairs[lv].values(), f"level {lv}: compiled state {s} is two live states"
        pairs[lv][live_state] = s
        if lv == len(order) or (lv > 0 and live_state == 0):
            continue
        runs = list(node.runs)
        if order[lv] not in by_field:
            assert len(runs) == 1, f"level {lv}: a field no rule tests splits the values"
            todo.append((lv + 1, runs[0][2], s))
            continue
        compiled = by_field[order[lv]][s].runs
        assert [(lo, hi) for lo, hi, _ in runs] == [(lo, hi) for lo, hi, _ in compiled], f"level {lv}"
        for (_, _, child), (_, _, t) in zip(runs, compiled):
            todo.append((lv + 1, child, t))
    return pairs


def translate(entries: dict, to_batch: dict) -> dict:
    """Live entries with next states as the compiled states they pair with."""
    if "bounds" in entries:
        return {"bounds": [(lo, to_batch[n]) for lo, n in entries["bounds"]]}
    if "exact" in entries:
        return {"miss": to_batch[entries["miss"]], "exact": {v: to_batch[n] for v, n in entries["exact"].items()}}
    if "lpm" in entries:
        return {"lpm": {(v, p, to_batch[n]) for v, p, n in entries["lpm"]}}
    return entries


def step(parsed, regions, active: list[int], add: bool, pick: int) -> tuple:
    """The change of one scenario step: subscribe ``parsed[pick]`` (or, when ``add`` is false and
    some are live, unsubscribe the ``pick``-th live one); ``active`` is updated."""
    if add or not active:
        i = pick % len(parsed)
        active.append(i)
        return regions[i], parsed[i].actions[0].args[0], +1
    i = active.pop(pick % len(active))
    return regions[i], parsed[i].actions[0].args[0], -1


@st.composite
def scenario(draw):
    order = list(draw(st.permutations(sorted(QS))))[: draw(st.integers(1, 4))]
    qs = {f: QS[f] for f in order}
    subs = draw(st.lists(st.tuples(condition(order, qs), st.integers(0, 5)), min_size=1, max_size=8))
    steps = draw(st.lists(st.tuples(st.booleans(), st.integers(0, 100)), min_size=1, max_size=8))
    return order, subs, steps


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenario())
def test_live_ebpf_entries_equal_the_compiled_entries(sc):
    order, subs, steps = sc
    parsed = [parse_rules(f"{c} : fwd({sid});", DIFF_SPEC, "sub")[0] for c, sid in subs]
    live = LiveDiagram([QS[f] for f in order], capacity=[10_000] * len(order))
    regions = [live.region(r.condition) for r in parsed]
    live_doc, _, _ = live_program(DIFF_SPEC, order)
    stages = live_doc.stages
    active: list[int] = []
    for add, pick in steps:
        ch = live.change([step(parsed, regions, active, add, pick)])
        rules = [parsed[i] for i in active]
        if not rules:
            continue
        try:
            res = compile_rules(rules, DIFF_SPEC, "ebpf", field_order=order)
            doc = json.loads(json.dumps(build_maps(res, ebpf_plan(res)).to_json()))
        except SubcError as e:
            assert "entries for one run" in e.message, e.render()
            continue
        if res.ir.root_state == 0:
            continue
        # the live writer, into maps in memory: every node the root reaches, the root in slot 1
        maps = {m.name: MemoryMap() for m in live_doc.maps}
        caps = {m.name: 1 << 16 for m in live_doc.maps}
        writer = LiveMaps(maps, stages, caps, root_slots=2)
        seen, todo = set(), [ch.root]
        while todo:
            node = todo.pop()
            if id(node) in seen or (node.level > 0 and node.state == 0):
                continue
            seen.add(id(node))
            if node is ch.root:
                writer.write(node, 1)
            else:
                writer.write(node)
            if node.level < len(order):
                todo.extend(c for _, _, c in node.runs)
        writer.flush()
        pairs = pair_states(ch.root, res.ir, order)
        batch_level = {f: i for i, f in enumerate(doc["field_order"])}
        batch_level[None] = len(doc["field_order"])
        for lv, pairing in enumerate(pairs):
            f = order[lv] if lv < len(order) else None
            if f not in batch_level:
                continue
            to_batch = pairs[lv + 1] if lv < len(order) else {}
            for live_state, batch_state in pairing.items():
                if live_state == 0:
                    assert batch_state == 0
                    continue
                got = translate(live_entries(maps, [s.to_json() for s in stages], lv, live_state), {0: 0, **to_batch})
                want = batch_entries(doc, batch_level[f], batch_state)
                assert got == want, f"level {lv} ({order[lv] if lv < len(order) else 'leaf'}): live {got}, compiled {want}"


PORTS = list(range(6))  # the scenario's subscribers are switch ports 0..5


class NoSwitch:
    """What :class:`LiveEntries` reads of a P4Runtime session to be built: the P4Info's tables."""

    class p4info:  # noqa: N801 - the session attribute's name
        tables: list = []


def normal_action(action: tuple, groups: dict, to_batch: dict | None) -> tuple:
    """An entry's action in one form for both sides: a next state (through ``to_batch`` for the
    live side), a port set, or another action by name."""
    name, params = action[0], dict(action[1])
    if name == "subc_set_state":
        s = params["next_state"]
        return ("state", to_batch.get(s, s) if to_batch is not None else s)
    if name == "subc_fwd":
        return ("ports", (params["port"],))
    if name == "subc_mcast":
        return ("ports", tuple(params["ports"]) if "ports" in params else groups[params["group"]])
    return (name, tuple(sorted(params.items())))


def writer_state(action: tuple) -> int:
    """The next state of a live ``subc_set_state`` action."""
    assert action[0] == "subc_set_state", action
    return dict(action[1])["next_state"]


def compiled_p4_entries(pipe, field: str, state: int) -> dict:
    """{(role, key): action} of compiled ``state`` in the tables of ``field`` (the live writer's form)."""
    out = {}
    for t in pipe.tables:
        if t.field != field or t.role not in ("stage", "miss"):
            continue
        kinds = [k.match_kind for k in t.keys]
        for e in t.entries:
            if e.match[0] != state:
                continue
            if t.role == "miss":
                key = ("miss",)
            elif kinds[1] == "range":
                key = ("range", *e.match[1], e.priority)
            elif kinds[1] == "lpm":
                key = ("lpm", *e.match[1])
            else:
                key = ("exact", e.match[1])
            out[(t.role, key)] = normal_action((e.action, e.params), pipe.mcast_groups, None)
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenario())
def test_live_p4_entries_equal_the_compiled_entries(sc):
    """The same for P4: the live P4Runtime writer's entries of every node
    (:meth:`LiveEntries.entries_of`) are those of the paired state in the bmv2 tables a compile of
    the live rules gives (range in its direct form: specific runs above a fallback entry)."""
    from subc.backends.p4.serve_program import serve_program
    from subc.dataplane.p4rt.live_entries import LiveEntries

    order, subs, steps = sc
    parsed = [parse_rules(f"{c} : fwd({sid});", DIFF_SPEC, "sub")[0] for c, sid in subs]
    live = LiveDiagram([QS[f] for f in order], capacity=[10_000] * len(order))
    regions = [live.region(r.condition) for r in parsed]
    doc = json.loads(serve_program(DIFF_SPEC, order, PORTS, 100)["entries.json"])
    writer = LiveEntries(NoSwitch, EntriesDoc.from_json(doc), root_slots=2)
    active: list[int] = []
    for add, pick in steps:
        ch = live.change([step(parsed, regions, active, add, pick)])
        rules = [parsed[i] for i in active]
        if not rules:
            continue
        try:
            res = compile_rules(rules, DIFF_SPEC, "bmv2", field_order=order, range_form="direct")
        except SubcError as e:
            assert "entries for one run" in e.message, e.render()
            continue
        if res.ir.root_state == 0:
            continue
        pipe = res.pipeline
        pairs = pair_states(ch.root, res.ir, order)
        nodes = {}
        todo = [(0, ch.root)]
        while todo:
            lv, node = todo.pop()
            state = 1 if node is ch.root else node.state
            if (lv, state) in nodes or lv == len(order) or (lv > 0 and state == 0):
                continue
            nodes[(lv, state)] = node
            todo.extend((lv + 1, c) for _, _, c in node.runs)
        default = normal_action(writer.leaf_default, {}, None)

        def delivery_below(lv: int, state: int) -> tuple:
            """The delivery of live state ``state`` of level ``lv``, through levels of fields no
            rule tests (one run each), as a last compiled stage applies it."""
            if state == 0:
                return default
            node = nodes.get((lv, state))
            while node.level < len(order):
                (_, _, node), *more = list(node.runs)
                assert not more
            return ("ports", tuple(node.runs)) if node.runs else default

        for (lv, state), node in nodes.items():
            if order[lv] not in pipe.field_order:
                continue
            to_batch = {0: 0, **pairs[lv + 1]}
            got = {k: normal_action(a, {}, to_batch) for k, a in writer.entries_of(node).items()}
            if order[lv] == pipe.field_order[-1] and lv < len(order) - 1:  # the compiled last stage delivers
                got = {k: delivery_below(lv + 1, writer_state(a)) for k, a in writer.entries_of(node).items()}
            want = compiled_p4_entries(pipe, order[lv], pairs[lv][state])
            assert got == want, f"level {lv} ({order[lv]}): live {got}, compiled {want}"
