"""End to end: every message of every datagram, through the eBPF broker in network namespaces.

The real ITCH sample is packed into MoldUDP64 datagrams of 1 to 40 messages (random sizes, a fixed
seed), with heartbeats among them and an end of session last, built and sent with scapy from a
publisher namespace.  Each endpoint must receive, for each datagram holding at least one message
for its subscriber, one datagram with exactly those messages in their original order (the
reference semantics: the rules evaluated on values decoded by the independent ITCH codec), a
message count equal to what it holds, IPv4 and UDP checksums the receiving kernel accepts (it
drops a datagram with a wrong one), and its subscriber's own gap-free sequence numbers; every
heartbeat and the end of session reach every endpoint.

Copies are compared as multisets per endpoint: a datagram sent whole from XDP and a neighbour
copied in TC may reach a subscriber in either order (docs/ebpf.md, "Delivery semantics").  No verdict
depends on speed: listeners end on the end-of-session packet.
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from pathlib import Path

import pytest

from subc.lang.rules import parse_rules
from subc.spec.front_end import load_spec
from subc.semantics.delivery import Delivery, recipients_of, split_payload
from subc.semantics.reference import reference_decision
from subc.workloads.itch_codec import decode_add_order, read_binaryfile

from conftest import EXAMPLE, real_sample
from netns_util import Topology, need_root_and_netns, sh
from test_broker_netns import HANG_GUARD, LISTENER_IDLE, broker_stats, compile_out, stop, wait_bound

ENDPOINTS = {1: [(1, 6001)], 2: [(2, 6002)], 3: [(3, 6003)], 4: [(1, 6004), (2, 6004)], 5: [(3, 6005)]}
ALL_EPS = sorted({ep for eps in ENDPOINTS.values() for ep in eps})


@pytest.fixture(scope="module")
def topo():
    need_root_and_netns()
    t = Topology("sdl")
    yield t
    t.remove()


def pack(messages: list[bytes], rng: random.Random, most: int = 40) -> list[bytes]:
    """MoldUDP64 payloads of 1 to ``most`` messages each (at most 1,400 bytes), a heartbeat after
    every 50th, and an end of session; sequence numbers as a publisher numbers them."""
    from subc.wire.moldudp64 import encode_end_of_session, encode_packet

    out, i, seq = [], 0, 1
    while i < len(messages):
        n = rng.randint(1, most)
        batch = []
        while i < len(messages) and len(batch) < n and 20 + sum(2 + len(m) for m in batch + [messages[i]]) <= 1400:
            batch.append(messages[i])
            i += 1
        out.append(encode_packet("SUBCTEST01", seq, batch))
        seq += len(batch)
        if len(out) % 50 == 0:
            out.append(encode_packet("SUBCTEST01", seq, []))
    out.append(encode_end_of_session("SUBCTEST01", seq))
    return out


def send(topo: Topology, payloads: list[bytes], tmp: Path, dport: int = 26400) -> None:
    """Send the payloads as UDP datagrams to the broker's feed port ``dport`` (scapy, UDP checksums set)."""
    f = tmp / "payloads.json"
    f.write_text(json.dumps([p.hex() for p in payloads]))
    code = (
        "import json\n"
        "from scapy.all import Ether, IP, UDP, Raw, sendp\n"
        f"ps = [bytes.fromhex(h) for h in json.load(open({str(f)!r}))]\n"
        f"e = Ether(dst='{topo.b0_mac}') / IP(src='10.10.0.1', dst='10.10.0.2')\n"
        f"frames = [e / UDP(sport=4000, dport={dport}) / Raw(p) for p in ps]\n"
        f"sendp(frames, iface='{topo.tag}p0', verbose=False)\n"
    )
    sh(*topo.in_ns(topo.pub, sys.executable, "-c", code))


def received(procs, tmp: Path) -> dict:
    """The UDP payloads each endpoint received, in order (a listener ends on its end of session)."""
    from subc.wire.capture import read_datagrams

    out = {}
    for ep, p in procs.items():
        stdout, stderr = p.communicate(timeout=HANG_GUARD)
        assert p.returncode == 0, stderr
        assert json.loads(stdout)["end_of_session"], f"listener {ep} ended before its end of session"
        out[ep] = [dg.payload for dg in read_datagrams(str(tmp / f"got_{ep[0]}_{ep[1]}.pcap"), [ep[1]])]
    return out


def test_every_message_of_every_datagram(topo, tmp_path):
    check_feed(topo, tmp_path, (EXAMPLE / "rules.sub").read_text(), [])


#: Rules equivalent to examples/itch/rules.sub on the sample (reordered, rewritten, and one rule for
#: a symbol the sample does not hold), whose tables differ: a swap to them changes every map.
EQUIVALENT_RULES = """
add_order.stock == "ZZZZ" : fwd(3);
stock in {"BOB", "CHAR", "ALC"} and shares < 100 : fwd(5);
stock == "ALC" and price >= 20 and price < 25.0001 : fwd(4);
stock == "CHAR" and shares >= 500 : fwd(3);
stock == "CHAR" and buy_sell_indicator == "B" and price < 10.00 : fwd(3);
add_order.shares > 999 : fwd(2);
add_order.stock == "BOB" : fwd(1);
"""
SWAPS = 6


def test_every_message_during_update_swaps(topo, tmp_path):
    """The same feed while ``subc update`` swaps the live rule set :data:`SWAPS` times between two
    equivalent rule sets with different tables: nothing lost, nothing misdelivered, sequence
    numbers still gap-free (they belong to the subscriber, not to a generation)."""
    text_a = (EXAMPLE / "rules.sub").read_text()
    out_a = compile_out(tmp_path, "a", text_a)
    order = ",".join(json.loads((out_a / "report.json").read_text())["field_order"])
    out_b = compile_out(tmp_path, "b", EQUIVALENT_RULES, order)
    maps = lambda out: json.loads((out / "maps.json").read_text())["maps"]  # noqa: E731
    assert [m["entries"] for m in maps(out_a)] != [m["entries"] for m in maps(out_b)]
    check_feed(topo, tmp_path, text_a, [out_b if k % 2 == 0 else out_a for k in range(SWAPS)])


def check_feed(topo, tmp_path: Path, rules_text: str, updates: list[Path], most: int = 40,
               load_args: tuple[str, ...] = (), fanout_daemon: bool = False) -> None:
    """Send the packed sample (datagrams of 1 to ``most`` messages) to the broker loaded with
    ``rules_text`` (``subc load`` with ``load_args``), in ``len(updates) + 1`` consecutive parts
    with ``subc update`` to each of ``updates`` in between, and check every copy every endpoint
    received (see the module docstring).  With ``fanout_daemon``, ``subc fanout`` runs meanwhile."""
    load_broker(topo, tmp_path, rules_text, *(["--capacity-factor", "4"] if updates else []), *load_args)
    daemon = None
    try:
        if fanout_daemon:
            daemon = topo.popen_subc(topo.brk, "fanout", "--iface", topo.b0)
        messages = [m for _, m in read_binaryfile(real_sample())]
        feed_and_check(topo, tmp_path, rules_text, pack(messages, random.Random(14), most), updates)
        if daemon is not None:
            assert daemon.poll() is None, f"subc fanout exited: {daemon.communicate()}"
    finally:
        stop([daemon])
        topo.subc(topo.brk, "unload", "--iface", topo.b0, check=False)


def load_broker(topo, tmp_path: Path, rules_text: str, *load_args: str) -> Path:
    """``subc load`` of ``rules_text`` (compiled for eBPF) with :data:`ENDPOINTS` on the broker's
    feed interface; returns the output directory."""
    out = compile_out(tmp_path, "m", rules_text)
    subs = tmp_path / "subscribers.toml"
    subs.write_text(topo.subscribers_toml(ENDPOINTS))
    topo.subc(topo.brk, "load", str(out), "--iface", topo.b0, "--subscribers", str(subs), *load_args)
    return out


def feed_and_check(topo, tmp_path: Path, rules_text: str, payloads: list[bytes], updates: list[Path] = ()) -> None:
    """Send ``payloads`` (ending with an end of session) to the loaded broker, in ``len(updates) + 1``
    parts with ``subc update`` to each of ``updates`` in between, and check what every endpoint
    received against the reference, and the broker's counters over the run (the difference of
    ``subc stats`` before and after: a broker may have carried traffic before)."""
    spec = load_spec(EXAMPLE / "spec.p4")
    rules = parse_rules(rules_text, spec, "rules.sub")
    before = broker_stats(topo)
    procs = {}
    try:
        for k, port in ALL_EPS:
            procs[(k, port)] = topo.popen_subc(
                topo.subs[k - 1], "listen", f"10.10.{k}.2:{port}", "--timeout", str(LISTENER_IDLE), "--json",
                "--save-pcap", str(tmp_path / f"got_{k}_{port}.pcap"))
        for (k, port), p in procs.items():
            wait_bound(p, f"10.10.{k}.2", port)
        parts = len(updates) + 1
        for i in range(parts):
            send(topo, payloads[len(payloads) * i // parts: len(payloads) * (i + 1) // parts], tmp_path)
            if i < len(updates):
                topo.subc(topo.brk, "update", str(updates[i]), "--iface", topo.b0)
        got = received(procs, tmp_path)
        stats = broker_stats(topo)
    finally:
        stop(procs.values())

    def decide(msg: bytes) -> set:
        if msg[:1] not in (b"A", b"F"):
            return recipients_of(reference_decision([], spec, {}))  # no add_order header: default action
        return recipients_of(reference_decision(rules, spec, decode_add_order(msg)))

    ref = Delivery(decide, everyone=list(ENDPOINTS))
    want: dict = {sid: [] for sid in ENDPOINTS}
    for p in payloads:
        copies = ref.datagram(p)
        assert copies is not None
        for sid, c in copies.items():
            want[sid].append(c)
    n_multi = sum(1 for p in payloads if len({r for m in split_payload(p)[3] for r in decide(m)}) > 1)
    assert n_multi > 50, "the workload must have datagrams whose messages go to several subscribers"
    first_seq = {sid: before["subscribers"].get(str(sid), {}).get("next_seq", 1) for sid in ENDPOINTS}
    for sid, eps in ENDPOINTS.items():
        for ep in eps:
            copies = [split_payload(p) for p in got[ep]]
            assert all(c is not None for c in copies), f"endpoint {ep}: a malformed MoldUDP64 copy"
            # the same copies (messages in order, count, session), whatever order they arrived in
            assert Counter((c[0], c[2], tuple(c[3])) for c in copies) == \
                Counter((c.session, c.count, c.messages) for c in want[sid]), f"endpoint {ep} (subscriber {sid})"
            # gap-free sequence numbers: each data copy takes the subscriber's next len(messages) numbers
            data = sorted((c[1], len(c[3])) for c in copies if c[2] not in (0, 0xFFFF))
            nxt = first_seq[sid]
            for seq, n in data:
                assert seq == nxt, f"endpoint {ep}: sequence gap or overlap at {seq} (expected {nxt})"
                nxt += n
            # heartbeats and the end of session carry the subscriber's next number at that point
            assert [c[1] for c in copies if c[2] == 0xFFFF] == [nxt]
    s = {k: v - before["stats"][k] for k, v in stats["stats"].items()}
    assert s["errors"] == 0 and s["slot_lost"] == 0 and s["malformed"] == 0 and s["fanout_overflow"] == 0, s
    assert s["messages"] == sum(len(split_payload(p)[3]) for p in payloads)
    for sid in ENDPOINTS:
        c, c0 = stats["subscribers"][str(sid)], before["subscribers"].get(str(sid), {"messages": 0})
        assert c["messages"] - c0["messages"] == sum(len(x.messages) for x in want[sid]) * len(ENDPOINTS[sid])
        assert c["next_seq"] == first_seq[sid] + sum(len(x.messages) for x in want[sid])
