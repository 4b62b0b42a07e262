"""The XDP fan-out's device maps (subc/dataplane/ebpf/fanout.py), checked without a kernel: for random
subscriber sets, every datagram recipient set has a device map that clones it exactly once per
recipient endpoint on the right interface (one group), or the ALL map, and the groups partition
the endpoints by interface."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from subc.backends.ebpf import layout as L
from subc.dataplane.ebpf.fanout import ALL_INDEX, endpoint_groups, fan_plan
from subc.dataplane.ebpf.subscribers import Endpoint, Subscribers


@st.composite
def subscriber_sets(draw):
    n_ifaces = draw(st.integers(1, 5))
    subs = Subscribers()
    for sid in draw(st.lists(st.integers(0, 511), min_size=1, max_size=12, unique=True)):
        eps = []
        for _ in range(draw(st.integers(1, 3))):
            ifindex = 10 + draw(st.integers(0, n_ifaces - 1))
            eps.append(Endpoint(sid, "10.0.0.2", 5000, "02:00:00:00:00:01", f"if{ifindex}", ifindex=ifindex))
        subs.by_id[sid] = eps
    return subs


@settings(max_examples=200, deadline=None)
@given(subs=subscriber_sets(), data=st.data())
def test_every_recipient_set_has_its_device_map(subs, data):
    eps = subs.endpoints
    groups = endpoint_groups(subs)
    # groups partition the endpoints by interface
    for a in range(len(eps)):
        for b in range(len(eps)):
            assert (groups[a] == groups[b]) == (eps[a].ifindex == eps[b].ifindex)
    plan = fan_plan(subs)
    assert plan[ALL_INDEX] == [ep.ifindex for ep in eps]
    recipients = data.draw(st.sets(st.sampled_from(sorted(subs.by_id)), min_size=1))
    targets = [e for e, ep in enumerate(eps) if ep.subscriber in recipients]
    if len({groups[e] for e in targets}) == 1:
        g = groups[targets[0]]
        entries = plan[g * L.FAN_SLOTS + len(targets) - 1]
        assert entries == [eps[e].ifindex for e in targets]  # one clone per recipient endpoint, its interface


def test_groups_in_order_of_first_appearance():
    subs = Subscribers()
    subs.by_id[3] = [Endpoint(3, "10.0.0.2", 1, "02:00:00:00:00:01", "b", ifindex=7)]
    subs.by_id[1] = [Endpoint(1, "10.0.0.3", 1, "02:00:00:00:00:01", "a", ifindex=5),
                     Endpoint(1, "10.0.0.4", 1, "02:00:00:00:00:01", "b", ifindex=7)]
    assert endpoint_groups(subs) == [0, 1, 0]
    plan = fan_plan(subs)
    assert plan[0] == [7] and plan[1] == [7, 7] and plan[L.FAN_SLOTS] == [5]
    assert plan[ALL_INDEX] == [7, 5, 7]


class FakeMap:
    """An in-memory stand-in for a BPF map (keys and values as bytes), logging writes and deletes."""

    def __init__(self, name: str, log: list, percpu: int = 0):
        self.name, self.log, self.percpu, self.d = name, log, percpu, {}

    def lookup(self, key):
        v = self.d.get(key)
        return v if v is None or not self.percpu else [v] + [bytes(len(v))] * (self.percpu - 1)

    def update(self, key, value, flags=0):
        self.log.append(("update", self.name, key))
        self.d[key] = value

    def delete(self, key):
        self.log.append(("delete", self.name, key))
        return self.d.pop(key, None) is not None

    def keys(self):
        return list(self.d)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 4), rounds=st.lists(
    st.lists(st.sampled_from([0b011, 0b101, 0b110, 0b111, 0b1001, 0b1010, 0b1100]), max_size=5), min_size=1, max_size=12))
def test_set_cache_evicts_only_idle_sets_and_never_serves_a_stale_map(capacity, rounds):
    """Recipient sets (bit e: endpoint e) send datagrams in rounds, each followed by a pass of the
    control loop with a cache of ``capacity`` maps (idle after 0 s: a set with no datagram since the
    previous read): every published set's index holds a map of exactly its endpoints; a set that
    sent since the previous read keeps its map; an evicted set's key is deleted before its map,
    and its map before the index is reused; and a steady working set that fits gets its maps."""
    from subc.dataplane.ebpf import fanout

    ifindexes = [10, 11, 12, 13]
    log: list = []
    maps = {"subc_fan_sets": FakeMap("sets", log), "subc_fan_miss": FakeMap("miss", log),
            "subc_fan_hits": FakeMap("hits", log, percpu=2), "subc_fan": FakeMap("fan", log)}
    inner: dict[int, list[int]] = {}

    def put(maps_, index, ifs, egress_fd, name):
        inner[index] = list(ifs)
        maps_["subc_fan"].update(L.U32.pack(v=index), L.U32.pack(v=99))

    U32, U64 = L.U32, L.U64
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(L, "FAN_SETS", capacity)
        mp.setattr(fanout, "_put_devmap", put)
        cache = fanout.SetCache({}, idle_s=0.0)
        for sets in rounds:
            active = set(sets)
            for key in sets:  # XDP: one datagram of each
                raw = maps["subc_fan_sets"].lookup(U64.pack(v=key))
                if raw is not None:
                    index = U32.unpack(raw)["v"]
                    assert U32.pack(v=index) in maps["subc_fan"].d
                    assert inner[index] == [ifindexes[e] for e in range(4) if key >> e & 1]
                    h = U32.pack(v=index - fanout.SET_BASE)
                    old = maps["subc_fan_hits"].d.get(h)
                    maps["subc_fan_hits"].d[h] = U64.pack(v=(U64.unpack(old)["v"] if old else 0) + 1)
                else:
                    m = maps["subc_fan_miss"].d.get(U64.pack(v=key))
                    maps["subc_fan_miss"].d[U64.pack(v=key)] = U64.pack(v=(U64.unpack(m)["v"] if m else 0) + 1)
            before = dict(cache.used)
            used_since = {i for i, k in before.items() if k in active}
            start = len(log)
            res = fanout.install_missing_sets(maps, 5, ifindexes, cache)
            assert len(cache.used) <= capacity and res["sets"] == len(cache.used)
            assert {U32.unpack(v)["v"]: U64.unpack(k)["v"] for k, v in maps["subc_fan_sets"].d.items()} == cache.used
            for i in used_since:
                assert cache.used.get(i) == before[i], "a set in use lost its map"
            ops = log[start:]
            for i, key in before.items():
                if cache.used.get(i) != key:  # evicted: key, then map, then reuse
                    kd = ops.index(("delete", "sets", U64.pack(v=key)))
                    md = ops.index(("delete", "fan", U32.pack(v=i)))
                    assert kd < md
                    reuse = [n for n, op in enumerate(ops) if op == ("update", "fan", U32.pack(v=i))]
                    assert all(n > md for n in reuse)
        # then a steady working set that fits: idle sets give way, and it all has maps
        steady = sorted(set(rounds[-1]) or {0b011})[:capacity]
        for _ in range(3):
            for key in steady:
                if maps["subc_fan_sets"].lookup(U64.pack(v=key)) is None:
                    maps["subc_fan_miss"].d[U64.pack(v=key)] = U64.pack(v=1)
                else:
                    h = U32.pack(v=U32.unpack(maps["subc_fan_sets"].lookup(U64.pack(v=key)))["v"] - fanout.SET_BASE)
                    old = maps["subc_fan_hits"].d.get(h)
                    maps["subc_fan_hits"].d[h] = U64.pack(v=(U64.unpack(old)["v"] if old else 0) + 1)
            fanout.install_missing_sets(maps, 5, ifindexes, cache)
        assert set(steady) <= set(cache.used.values())
