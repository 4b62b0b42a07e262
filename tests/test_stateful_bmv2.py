"""Comparisons on state in the BMv2 (v1model) programs (docs/state.md "Stateful subscriptions").

The window id ``floor(now / W)`` the P4 program computes without division is checked against
Python's integer division.  Hypothesis draws rule sets over the ITCH example spec (with
``query_time(add_order.timestamp, ns)``, so the test controls time) that mix header predicates
with aggregates, and MoldUDP64 datagrams of up to K timed messages (Add Orders and other types,
times stepping onto and around window boundaries, sometimes back), built with scapy from values.
The copies each port must get come from :class:`~subc.semantics.stateful_reference.StatefulReference`
evaluating the rules on those values in order; the multi-message program's table simulator
(which needs nothing) and, when p4c and ``simple_switch`` are on PATH, BMv2 itself must send
exactly those.  The single-message program is run through BMv2 with frames of the eBPF tests'
spec (one message each, identified by the IPv4 identification field).
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from conftest import EXAMPLE
from strategies import aggregate_comparison, counter_comparison
from subc.backends.p4.state import reciprocal
from subc.semantics.stateful_reference import StatefulReference
from bmv2_util import CLI, SWITCH
from test_p4_multi_message import (K, NEEDS_BMV2, P4C, SYMBOLS, Feed, _done, _itch_classes, _tail, compile_p4, load,
                                   run_bmv2, simulate, verify)

TIMED_SPEC = (EXAMPLE / "spec.p4").read_text() + (
    "\n@pragma query_field(add_order.timestamp)\n@pragma query_time(add_order.timestamp, ns)\n")
#: message values (price in its raw units of 1/10000, `query_field_scale(add_order.price, 4)`)
AGG_VALUES = {"add_order.shares": [0, 1, 100, 500, 1000], "add_order.price": [0, 100000, 250000, 250001, 4294967295]}
#: rule literals near them (price in dollars)
LITERALS = {"add_order.shares": [0, 1, 100, 500, 1000], "add_order.price": [0, 10, 25, 429496]}
PORT = 26400


@given(st.integers(1, 2**64 - 1), st.lists(st.integers(0, 2**64 - 1), max_size=20))
def test_window_id_reciprocal_is_floor_division(window_ns, nows):
    m, k = reciprocal(window_ns)
    assert m < 2**65
    for n in nows + [0, 1, window_ns - 1, window_ns, window_ns + 1, 2**64 - 1, (2**64 - 1) // window_ns * window_ns]:
        if n < 2**64:
            assert (n * m) >> k == n // window_ns, (n, window_ns)


def test_window_id_reciprocal_on_the_windows_users_write():
    """Windows of 1 us to 1 h (µs multiples), 100k random times each, and the worst cases."""
    rng = random.Random(7)
    for window_us in (1, 2, 3, 5, 7, 10, 100, 999, 1000, 1024, 60_000_000, 3_600_000_000):
        w = window_us * 1000
        m, k = reciprocal(w)
        for n in [rng.getrandbits(64) for _ in range(100_000)] + [w * q - 1 for q in (1, 2, 2**20)]:
            assert (n * m) >> k == n // w


# ------------------------------------------------------------------------------------------
# ITCH: rules, timed messages, the reference's copies
# ------------------------------------------------------------------------------------------


@st.composite
def itch_stateful_rules(draw):
    """1 to 4 rules: a header predicate on stock, shares or price and/or a comparison on an
    aggregate of shares or price (windows none, 0, 1, 5 us), fwd to ports 1..5."""
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        parts = []
        kind = draw(st.sampled_from(["stock", "shares", "price", "none"]))
        if kind == "stock":
            parts.append(f'add_order.stock == "{draw(st.sampled_from(SYMBOLS))}"')
        elif kind != "none":
            parts.append(f"add_order.{kind} {draw(st.sampled_from(['<', '>=']))} "
                         f"{draw(st.sampled_from(LITERALS['add_order.' + kind][1:]))}")
        for _ in range(draw(st.integers(1, 2))):
            parts.append(draw(aggregate_comparison(sorted(LITERALS), LITERALS)))
        joiner = draw(st.sampled_from([" and ", " and ", " or "]))
        ports = draw(st.lists(st.integers(1, 5), min_size=1, max_size=2, unique=True))
        lines.append(f"{joiner.join(parts)} : fwd({', '.join(map(str, ports))});")
    return "\n".join(lines) + "\n"


class Clock:
    """Message times (ns) stepping onto, before and after 1 us and 5 us boundaries, sometimes back."""

    def __init__(self, start: int):
        self.t = start

    def step(self, draw) -> int:
        self.t = max(0, self.t + draw(st.sampled_from([0, 1, 999, 1000, 1001, 2000, 4999, 5000, -1, -1000])))
        return self.t


@st.composite
def timed_itch_message(draw, clock: Clock):
    """(message bytes, field values or None for a type the rules do not test), with its time."""
    AddOrder, AddOrderMPID, Delete, _ = _itch_classes()
    kind = draw(st.sampled_from("AAAFD"))
    t = clock.step(draw)
    if kind == "D":
        return bytes(Delete(ref=draw(st.integers(0, 99)), timestamp=t)), None
    stock = draw(st.sampled_from(SYMBOLS)).encode().ljust(8)
    shares = draw(st.sampled_from(AGG_VALUES["add_order.shares"]))
    price = draw(st.sampled_from(AGG_VALUES["add_order.price"]))
    cls = AddOrder if kind == "A" else AddOrderMPID
    pkt = cls(type=kind.encode(), timestamp=t, side=b"B", shares=shares, stock=stock, price=price)
    return bytes(pkt), {"add_order.stock": int.from_bytes(stock, "big"), "add_order.shares": shares,
                        "add_order.price": price, "add_order.buy_sell_indicator": ord("B"),
                        "add_order.timestamp": t}


def stateful_decide(rules, spec):
    """values -> sorted ports, from the reference run over the classified messages in order."""
    ref = StatefulReference(rules, spec)

    def decide(values):
        if values is None:
            return []
        return sorted(ref.decide(values, values["add_order.timestamp"]).ports)

    return decide


def itch_feed(data, tmp, rules_text: str, spec_text: str = TIMED_SPEC):
    """(doc, spec, feed) of a drawn datagram sequence over ``rules_text`` (compiled for BMv2)."""
    spec_path = tmp / "spec.p4"
    spec_path.write_text(spec_text)
    spec, rules, _ = load(rules_text, spec_path, tmp)
    doc = compile_p4(tmp / "r.sub", spec_path, tmp / "out")
    assert "state" in doc and doc["state"]["time"]["field"] == "add_order.timestamp"
    feed = Feed(doc["messages"]["ports"], stateful_decide(rules, spec))
    clock = Clock(data.draw(st.integers(0, 3000)))
    for _ in range(data.draw(st.integers(2, 8))):
        if data.draw(st.integers(0, 6)) == 0:
            feed.heartbeat(PORT)
        else:
            feed.data([data.draw(timed_itch_message(clock)) for _ in range(data.draw(st.integers(1, K)))], PORT)
    return doc, spec, feed


SIM_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])


@SIM_SETTINGS
@given(rules_text=itch_stateful_rules(), data=st.data())
def test_multi_message_tables_agree_with_reference(tmp_path_factory, rules_text, data):
    """The multi-message program's entries in the table simulator (its register model between each
    slot's update table and state stages): every port's copies as the reference decides."""
    tmp = tmp_path_factory.mktemp("st")
    doc, spec, feed = itch_feed(data, tmp, rules_text)
    sim = simulate(doc, spec, feed)
    for p in feed.want:
        assert sim.get(p, []) == feed.want[p], (rules_text, p)


def test_equal_messages_of_one_datagram_are_decided_in_order(tmp_path):
    """``count() >= 2``: of three equal Add Orders in one datagram only the 2nd and 3rd match;
    the next datagram's window (1 us later) starts empty again."""
    AddOrder = _itch_classes()[0]
    rules_text = 'add_order.stock == "BOB" and count(window=1) >= 2 : fwd(3);\n'
    spec_path = tmp_path / "spec.p4"
    spec_path.write_text(TIMED_SPEC)
    spec, rules, _ = load(rules_text, spec_path, tmp_path)
    doc = compile_p4(tmp_path / "r.sub", spec_path, tmp_path / "out")
    feed = Feed(doc["messages"]["ports"], stateful_decide(rules, spec))

    def msg(t):
        b = bytes(AddOrder(timestamp=t, shares=1, stock=b"BOB".ljust(8), price=1))
        return b, {"add_order.stock": int.from_bytes(b"BOB".ljust(8), "big"), "add_order.shares": 1,
                   "add_order.price": 1, "add_order.buy_sell_indicator": ord("B"), "add_order.timestamp": t}

    feed.data([msg(5), msg(5), msg(5)], PORT)
    feed.data([msg(1005), msg(1006)], PORT)
    assert [len(feed.want[3]), feed.want[3][0][18:20], feed.want[3][1][18:20]] == [2, b"\0\2", b"\0\1"]
    sim = simulate(doc, spec, feed)
    assert sim[3] == feed.want[3]


COUNTER_SPEC = TIMED_SPEC + "@pragma query_counter(seen, 1)\n@pragma query_counter(volume, 0)\n"


@st.composite
def itch_counter_rules(draw):
    """1 to 4 rules with named counters: the rate limit ``stock == S and seen < n : fwd(p),
    inc(seen)`` (1 us windows), ``stock == S : volume <- sum(add_order.shares)`` (never ends), and
    comparisons on either counter with a header predicate."""
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        shape = draw(st.sampled_from(["limit", "sum", "compare"]))
        stock = draw(st.sampled_from(SYMBOLS))
        port = draw(st.integers(1, 5))
        if shape == "limit":
            lines.append(f'add_order.stock == "{stock}" and seen < {draw(st.integers(1, 3))} : fwd({port}), inc(seen);')
        elif shape == "sum":
            lines.append(f'add_order.stock == "{stock}" : volume <- sum(add_order.shares);')
        else:
            lines.append(f"{draw(counter_comparison(['seen', 'volume']))} and add_order.shares >= "
                         f"{draw(st.sampled_from(LITERALS['add_order.shares']))} : fwd({port});")
    return "\n".join(lines) + "\n"


@SIM_SETTINGS
@given(rules_text=itch_counter_rules(), data=st.data())
def test_multi_message_named_counters_agree_with_reference(tmp_path_factory, rules_text, data):
    """Named counters in the multi-message program's entries: each slot reads them at its update
    table and applies its leaf's updates at its count table, before the next slot's message."""
    tmp = tmp_path_factory.mktemp("ct")
    doc, spec, feed = itch_feed(data, tmp, rules_text, COUNTER_SPEC)
    sim = simulate(doc, spec, feed)
    for p in feed.want:
        assert sim.get(p, []) == feed.want[p], (rules_text, p)


# ------------------------------------------------------------------------------------------
# BMv2
# ------------------------------------------------------------------------------------------


def through_bmv2(tmp, feed) -> None:
    """Run ``feed`` (a sequence with some copy to send) through simple_switch with the program
    compiled into ``tmp / 'out'``, a sentinel datagram last; every port's copies and the datagram
    counters must be the reference's."""
    assume(any(feed.want[p] for p in feed.ports))
    AddOrder = _itch_classes()[0]
    _tail(feed, [(bytes(AddOrder(timestamp=0, shares=1, stock=b"ZVZZT".ljust(8), price=1)), None)], PORT)
    subprocess.run([P4C, "--std", "p4-16", str(tmp / "out" / "subc.p4"), "-o", str(tmp / "out" / "subc.json")],
                   check=True)
    outs, counts = run_bmv2(tmp / "out", tmp, feed.frames, _done(feed))
    verify(feed, outs, counts)


@NEEDS_BMV2
@settings(max_examples=3, derandomize=True, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rules_text=itch_stateful_rules(), data=st.data())
def test_bmv2_multi_message_timed_sequence(tmp_path_factory, rules_text, data):
    """A timed datagram sequence through simple_switch: every port's copies (bytes, counts,
    checksums, sequence numbers) as the reference decides, and the datagram counters."""
    tmp = tmp_path_factory.mktemp("stb")
    doc, spec, feed = itch_feed(data, tmp, rules_text)
    through_bmv2(tmp, feed)


@NEEDS_BMV2
@settings(max_examples=3, derandomize=True, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rules_text=itch_counter_rules(), data=st.data())
def test_bmv2_named_counters_timed_sequence(tmp_path_factory, rules_text, data):
    """Named counters through simple_switch (multi-message program): every port's copies as the
    reference decides."""
    tmp = tmp_path_factory.mktemp("ctb")
    doc, spec, feed = itch_feed(data, tmp, rules_text, COUNTER_SPEC)
    through_bmv2(tmp, feed)



# ------------------------------------------------------------------------------------------
# BMv2, the single-message program: one message per frame (the eBPF tests' spec)
# ------------------------------------------------------------------------------------------

SINGLE_PORTS = range(0, 7)
SENTINEL_RULE = "m.a == 254 : fwd(1, 2, 3, 4, 5, 6);\n"


def _numbered(pkt: dict, i: int) -> bytes:
    """The eBPF tests' frame of ``pkt`` with IPv4 identification ``i`` (not a query field)."""
    from scapy.layers.inet import IP
    from scapy.layers.l2 import Ether

    from ebpf_util import diff_frame

    e = Ether(diff_frame(pkt))
    e[IP].id = i
    del e[IP].chksum
    return bytes(e)


def run_single_bmv2(out, work, frames: list[bytes]) -> dict[int, list[int]]:
    """Run the program over ``frames`` (in on port 0, :func:`bmv2_util.run_on_pcaps`); per port
    the IPv4 identifications of the frames it sent, once every port has sent the last frame (the
    sentinel, which every port gets)."""
    from scapy.layers.inet import IP
    from scapy.layers.l2 import Ether

    from bmv2_util import run_on_pcaps

    last = len(frames) - 1
    outs, _ = run_on_pcaps(out, work, frames, SINGLE_PORTS,
                           lambda o: all(o[p] and Ether(o[p][-1])[IP].id == last for p in SINGLE_PORTS[1:]))
    return {p: [Ether(f)[IP].id for f in outs[p]] for p in SINGLE_PORTS[1:]}


@NEEDS_BMV2
@settings(max_examples=3, derandomize=True, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_bmv2_single_message_timed_sequence(tmp_path_factory, data):
    """Random stateful rules over the eBPF tests' spec (time in m.g, ns), one message per frame,
    through simple_switch: the frames each port sends are those the reference forwards to it."""
    from ebpf_util import DIFF_SPEC_TEXT
    from strategies import stateful_rules, timed_messages
    from subc.lang.rules import load_rules
    from subc.spec.front_end import load_spec

    values = {"m.a": [0, 1, 2, 5, 255], "m.b": [0, 3, 7, 100, 65535], "m.c": [0, 1, 2], "m.e": [0, 10, 20, 4294967295]}
    tmp = tmp_path_factory.mktemp("stb1")
    (tmp / "spec.p4").write_text(DIFF_SPEC_TEXT + "@pragma query_time(m.g, ns)\n")
    spec = load_spec(tmp / "spec.p4")
    fields = {n: spec.query_fields[n] for n in values}
    text = data.draw(stateful_rules(fields, ["m.a", "m.b", "m.e"], values, max_rules=4)) + "\n" + SENTINEL_RULE
    (tmp / "r.sub").write_text(text)
    rules = load_rules(tmp / "r.sub", spec)
    messages = data.draw(timed_messages(values, "m.g", 30))
    fixed = {"m.h": 0, "m.f": 0, "m.d": 0, "ip.dstAddr": 0x01020304}
    messages.append((messages[-1][0], {**messages[-1][1], "m.a": 254}))
    ref = StatefulReference(rules, spec)
    want: dict[int, list[int]] = {p: [] for p in SINGLE_PORTS[1:]}
    frames = []
    for i, (t, msg) in enumerate(messages):
        pkt = {**fixed, **msg}
        for p in ref.decide(pkt, t).ports:
            want[p].append(i)
        frames.append(_numbered(pkt, i))
    p = subprocess.run([sys.executable, "-m", "subc.cli", "compile", str(tmp / "r.sub"), "--spec", str(tmp / "spec.p4"),
                        "--target", "bmv2", "-o", str(tmp / "out")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    subprocess.run([P4C, "--std", "p4-16", str(tmp / "out" / "subc.p4"), "-o", str(tmp / "out" / "subc.json")],
                   check=True)
    got = run_single_bmv2(tmp / "out", tmp, frames)
    assert got == want, text


# ------------------------------------------------------------------------------------------
# Other specs, real messages: P4_14 and P4_16 with other names, the shared sample's Add Orders
# ------------------------------------------------------------------------------------------

OTHER_NAMES = {"add_order.stock": "ao.symbol", "add_order.shares": "ao.qty", "add_order.price": "ao.px",
               "add_order.timestamp": "ao.ts", "add_order.buy_sell_indicator": "ao.side"}


#: (spec file under tests/specs, pragmas added, feed port, field names by ITCH name, rules)
OTHER_SPEC_CASES = [
    ("camus_itch_p4_14.p4", "@pragma query_field(add_order.timestamp)\n@pragma query_time(add_order.timestamp, ns)\n",
     1234, {}, 'add_order.stock == "BOB" and avg(add_order.price, window=1000) > 56000 : fwd(1);\n'
               'count(window=500) >= 3 or max(add_order.shares) > 5000 : fwd(2);\n'),
    ("market_other_names.p4", "@pragma query_field(ao.ts, 48)\n@pragma query_time(ao.ts, ns)\n",
     26400, OTHER_NAMES, 'ao.symbol == "BOB" and avg(ao.px, window=1000) > 5.60 : fwd(1);\n'
                         'count(window=500) >= 3 or max(ao.qty) > 5000 : fwd(2);\n'),
    # named counters: a rate limit per 100 us and a volume summed by one rule, compared by another
    ("camus_itch_p4_14.p4", "@pragma query_field(add_order.timestamp)\n@pragma query_time(add_order.timestamp, ns)\n"
     "@pragma query_counter(seen, 100)\n@pragma query_field_counter(volume, 0)\n",
     1234, {}, 'add_order.stock == "BOB" and seen < 2 : fwd(1), inc(seen);\n'
               'add_order.shares > 100 : volume <- sum(add_order.shares);\n'
               'volume > 20000 and add_order.price > 250000 : fwd(2);\n'),
    ("market_other_names.p4", "@pragma query_field(ao.ts, 48)\n@pragma query_time(ao.ts, ns)\n"
     "@pragma query_counter(seen, 100)\n@pragma query_counter(volume)\n",
     26400, OTHER_NAMES, 'ao.symbol == "BOB" and seen < 2 : fwd(1), inc(seen);\n'
                         'ao.qty > 100 : volume <- sum(ao.qty);\n'
                         'count(volume) > 20000 and ao.px > 25 : fwd(2);\n'),
]


@pytest.mark.parametrize("spec_name, extra, port, names, rules_text", OTHER_SPEC_CASES)
def test_real_add_orders_on_other_specs(tmp_path, spec_name, extra, port, names, rules_text):
    """The shared sample's first 1,200 Add Orders (real timestamps, windows of 0.5 and 1 ms) in
    MoldUDP64 datagrams of 1 to 4 messages, over a P4_14 spec and a P4_16 spec with other names,
    with aggregates and with named counters: the multi-message program's copies (simulator; BMv2
    too when present) are the reference's on values decoded by the workload codec."""
    from pathlib import Path

    from conftest import real_sample
    from subc.workloads.itch_codec import decode_add_order, read_binaryfile

    spec_path = tmp_path / "spec.p4"
    spec_path.write_text((Path(__file__).parent / "specs" / spec_name).read_text() + "\n" + extra)
    spec, rules, _ = load(rules_text, spec_path, tmp_path)
    doc = compile_p4(tmp_path / "r.sub", spec_path, tmp_path / "out")
    assert "state" in doc
    time_field = names.get("add_order.timestamp", "add_order.timestamp")
    ref = StatefulReference(rules, spec)

    def decide(values):
        return sorted(ref.decide(values, values[time_field]).ports)

    feed = Feed(doc["messages"]["ports"], decide)
    adds = [m for _, m in read_binaryfile(real_sample()) if m[:1] == b"A"][:1200]
    rng = random.Random(5)
    i = 0
    while i < len(adds):
        n = rng.randint(1, K)
        batch = adds[i:i + n]
        feed.data([(m, {names.get(k, k): v for k, v in decode_add_order(m).items() if k != "itch.msg_type"})
                   for m in batch], port)
        i += n
    assert sum(len(v) for v in feed.want.values()) > 50 and feed.want[1] and feed.want[2]
    sim = simulate(doc, spec, feed)
    for p in feed.want:
        assert sim.get(p, []) == feed.want[p], p
    if None in (P4C, SWITCH, CLI):
        return
    _tail(feed, [(adds[0], None)], port)
    subprocess.run([P4C, "--std", "p4-16", str(tmp_path / "out" / "subc.p4"), "-o", str(tmp_path / "out" / "subc.json")],
                   check=True)
    outs, counts = run_bmv2(tmp_path / "out", tmp_path, feed.frames, _done(feed))
    verify(feed, outs, counts)
