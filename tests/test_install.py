"""Generations in the BPF maps (subc/dataplane/ebpf/install.py), checked without a kernel.

For two random rule sets A and B, A is installed as generation 0 and B as generation 1 into
in-memory maps (arrays indexed by state slot, hash and trie maps keyed by tagged state), as
``subc update`` does.  Whenever :func:`check_fits` accepts B next to A, walking the maps the way
the XDP program does (a model of its lookups, written here) from each generation's root gives
every value the leaf its own IR gives, so writing B never disturbs the live A; when it refuses,
some map really lacks the room."""

from __future__ import annotations

from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.backends.ebpf import layout as L
from subc.errors import SubcError
from subc.dataplane.ebpf import install

from ebpf_util import DIFF_SPEC, compile_ebpf, fake_subscribers
from strategies import boundary_packets, rule_set

QS = dict(DIFF_SPEC.query_fields)
ORDER = sorted(QS)
# one rule on every field, so that both rule sets have every stage (one program)
ALL_FIELDS = " and ".join(f"{f} == 3" if f != "ip.dstAddr" else f"{f} == 1.2.3.4" for f in ORDER)


class FakeMap:
    """A BPF map in memory: bytes keys to bytes values (an array reads zeroes where never written)."""

    def __init__(self, kind: str, cap: int, value_size: int):
        self.kind, self.cap, self.value_size, self.items = kind, cap, value_size, {}

    def update(self, key: bytes, value: bytes) -> None:
        if "array" in self.kind:
            assert int.from_bytes(key, "little") < self.cap, "array index out of range"
        self.items[key] = value

    def get(self, key: bytes) -> bytes | None:
        if "array" in self.kind:
            i = int.from_bytes(key, "little")
            return self.items.get(key, bytes(self.value_size)) if i < self.cap else None
        return self.items.get(key)


def slot(state: int, cap: int) -> int:
    """The program's SUBC_SLOT, written out again."""
    return cap - 1 - (state & L.STATE_MASK) if state & L.GEN_BIT else state


def walk(maps: dict[str, FakeMap], doc: dict, root: int, pkt: dict[str, int]) -> dict:
    """The leaf the XDP program reaches for field values ``pkt`` from tagged ``root``."""
    state, gen = root, root & L.GEN_BIT
    for st in doc["stages"]:
        if not state & L.STATE_MASK:
            break
        v, nxt = pkt[st["field"]], 0
        if st["kind"] == "range":
            info, bnd = (maps[n] for n in st["maps"])
            raw = info.get(L.U32.pack(v=slot(state, info.cap)))
            i = L.INFO.unpack(raw)
            bounds = [L.BOUND.unpack(bnd.get(L.U32.pack(v=i["a"] + k))) for k in range(i["b"])]
            below = [b for b in bounds if b["lo"] <= v]
            nxt = below[-1]["next"] if below else (bounds[0]["next"] if bounds else 0)
        elif st["kind"] == "exact":
            info, ex = (maps[n] for n in st["maps"])
            hit = ex.get(L.EXACT_KEY.pack(state=state, value=v))
            nxt = L.U32.unpack(hit)["v"] if hit else L.INFO.unpack(info.get(L.U32.pack(v=slot(state, info.cap))))["a"]
        else:
            (lpm,) = (maps[n] for n in st["maps"])
            width = st["width"]
            best = -1
            for k, val in lpm.items.items():
                e = L.LPM_KEY.unpack(k)
                plen = e["prefixlen"] - 32
                if e["state"] == state and plen > best and (
                        plen == 0 or (e["value"] >> (64 - plen)) == ((v << (64 - width)) >> (64 - plen))):
                    best, nxt = plen, L.U32.unpack(val)["v"]
        state = gen | nxt
    leaf = maps["subc_leaf"]
    return L.LEAF.unpack(leaf.get(L.U32.pack(v=slot(state, leaf.cap))))


def ir_leaf(res, pkt) -> int:
    state = res.ir.root_state
    for stage in res.ir.stages:
        if not state:
            break
        runs = {s.state: s for s in stage.states}[state]
        state = runs.target(pkt[stage.field.name])
    return state


def expected_leaf(doc: dict, state: int, subs) -> dict:
    e = next(e for e in {m["name"]: m for m in doc["maps"]}["subc_leaf"]["entries"] if e["state"] == state)
    ids = sorted(e.get("subscribers", ())) if e["action"] == "fwd" else []
    return {"nsubs": len(ids), "subs": install.subscriber_words(ids)}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(rule_set(QS, allow_drop=True, max_port=6), rule_set(QS, allow_drop=True, max_port=6), st.data())
def test_a_new_generation_never_disturbs_the_live_one(a, b, data):
    subs = fake_subscribers()
    docs, results = [], []
    for _, text in (a, b):
        text = f"{text}\n{ALL_FIELDS} : fwd(6);"  # every rule set has every stage: one program
        try:
            rules, doc, _ = compile_ebpf(text, DIFF_SPEC, ORDER)
        except SubcError:
            reject()  # conflicting actions: not this test's business
        docs.append(doc)
        results.append((rules, compile_rules(rules, DIFF_SPEC, "ebpf", field_order=ORDER)))
    caps = install.capacities(docs[0], 2.0, subs)
    maps = {m["name"]: FakeMap(m["type"], caps[m["name"]], m["value"]["size"]) for m in docs[0].to_json()["maps"]}
    plan0 = install.plan_generation(docs[0], 0, subs, caps)
    install.install_generation(plan0, maps)
    live = dict(plan0.regions)
    for name in maps:
        if name.endswith(install.TAGGED_SUFFIXES):
            live[name] = len(plan0.writes.get(name, []))
    try:
        plan1 = install.plan_generation(docs[1], 1, subs, caps)
        install.check_fits(plan1, maps, caps, live)
    except SubcError:
        # refused: some map lacks the room for both generations
        n1 = {m["name"]: (max((e["state"] for e in m["entries"]), default=0) + 1 if m["type"] == "array"
                          and m["role"] in ("state_info", "leaf") else len(m["entries"])) for m in docs[1].to_json()["maps"]}
        assert any(n1[n] + live.get(n, 0) > caps[n] for n in n1 if n in live), "refused although everything fits"
        return
    install.install_generation(plan1, maps)
    for (rules, res), doc, root in ((results[0], docs[0], plan0.root), (results[1], docs[1], plan1.root)):
        jdoc = doc.to_json()  # the model reads the document as maps.json has it
        for pkt in boundary_packets(rules, QS, data.draw)[:20]:
            got = walk(maps, jdoc, root, pkt)
            want = expected_leaf(jdoc, ir_leaf(res, pkt), subs)
            assert (got["nsubs"], got["subs"]) == (want["nsubs"], want["subs"]), f"{pkt}: {got} != {want}"


def test_state_slots_of_two_generations_meet_only_when_full():
    cap = 16
    gen0 = {install.state_slot(s, 0, cap) for s in range(10)}
    gen1 = {install.state_slot(s, 1, cap) for s in range(6)}
    assert not gen0 & gen1 and max(gen1) == cap - 1
    assert {install.state_slot(s, 1, cap) for s in range(7)} & gen0
