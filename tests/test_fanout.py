"""The XDP fan-out's device maps (subc/runtime/fanout.py), checked without a kernel: for random
subscriber sets, every datagram recipient set has a device map that clones it exactly once per
recipient endpoint on the right interface (one group), or the ALL map, and the groups partition
the endpoints by interface."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from subc.compiler.targets import ebpf_layout as L
from subc.runtime.fanout import ALL_INDEX, endpoint_groups, fan_plan
from subc.runtime.subscribers import Endpoint, Subscribers


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
