"""End to end: the eBPF broker in network namespaces, fed the real ITCH sample over veth.

A publisher namespace replays ``ex20101224.TEST_ITCH_50`` to a broker namespace running the
compiled example rules (``subc load``); three subscriber namespaces listen on six endpoints and
save what they receive.  Every endpoint must receive exactly the Add Orders the reference
semantics assign to its subscriber: single-endpoint deliveries (XDP redirect), multi-endpoint
ones (TC clones), a VLAN-tagged message, while messages that match nothing, truncated and
malformed frames are never delivered and other traffic reaches the broker's own stack.  Then
``subc update`` swaps rule sets repeatedly under traffic with zero misdeliveries.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from subc.compiler.spec import load_spec
from subc.compiler.rules import parse_rules
from subc.runtime.itch import decode_add_order, encode_add_order, read_binaryfile, stock_value
from subc.runtime.reference import reference_decision

from conftest import EXAMPLE, real_sample
from netns_util import SUBC, Topology, need_root_and_netns, sh

# subscriber id -> endpoints (subscriber namespace, UDP port); 4 has two endpoints
ENDPOINTS = {1: [(1, 5001)], 2: [(2, 5001)], 3: [(3, 5001)], 4: [(1, 5004), (2, 5004)], 5: [(3, 5005)]}
ALL_EPS = sorted({ep for eps in ENDPOINTS.values() for ep in eps})


@pytest.fixture(scope="module")
def topo():
    need_root_and_netns()
    t = Topology("sct")
    yield t
    t.remove()


def compile_out(tmp: Path, name: str, rules_text: str, order: str | None = None) -> Path:
    rules = tmp / f"{name}.sub"
    rules.write_text(rules_text)
    out = tmp / name
    args = [*SUBC, "compile", str(rules), "--spec", str(EXAMPLE / "spec.p4"), "--target", "ebpf", "-o", str(out)]
    if order:
        args += ["--field-order", order]
    sh(*args)
    return out


def start_listeners(topo: Topology, tmp: Path, idle: float) -> dict[tuple[int, int], subprocess.Popen]:
    procs = {}
    for k, port in ALL_EPS:
        procs[(k, port)] = topo.popen_subc(topo.subs[k - 1], "listen", f"10.10.{k}.2:{port}", "--timeout", str(idle),
                                           "--json", "--save", str(tmp / f"got_{k}_{port}.bin"))
    time.sleep(1.0)
    return procs


def received(procs, tmp: Path) -> dict[tuple[int, int], list[int]]:
    """Order reference numbers each endpoint received (a listener ends after its idle timeout)."""
    out = {}
    for ep, p in procs.items():
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        doc = json.loads(stdout)
        refs = [int.from_bytes(m[11:19], "big") for _, m in read_binaryfile(tmp / f"got_{ep[0]}_{ep[1]}.bin")
                if m[:1] in (b"A", b"F")]
        assert doc["add_orders"] == len(refs)
        out[ep] = refs
    return out


def expected_endpoints(rules, spec, msg: bytes) -> set[tuple[int, int]]:
    d = reference_decision(rules, spec, decode_add_order(msg))
    return {ep for s in d.ports for ep in ENDPOINTS[s]}


def send_frames_from_publisher(topo: Topology, frames_py: str) -> None:
    """Run scapy in the publisher namespace to send raw frames (the code builds a list ``frames``)."""
    code = (
        "from scapy.all import Ether, IP, UDP, Raw, sendp\n"
        "from subc.runtime.moldudp64 import encode_packet\n"
        f"{frames_py}\n"
        f"sendp(frames, iface='{topo.tag}p0', verbose=False)\n"
    )
    sh(*topo.in_ns(topo.pub, sys.executable, "-c", code))


def test_broker_delivers_exactly_the_reference(topo, tmp_path):
    spec = load_spec(EXAMPLE / "spec.p4")
    rules_text = (EXAMPLE / "rules.sub").read_text()
    rules = parse_rules(rules_text, spec, "rules.sub")
    out = compile_out(tmp_path, "a", rules_text)
    subs = tmp_path / "subscribers.toml"
    subs.write_text(topo.subscribers_toml(ENDPOINTS))
    r = topo.subc(topo.brk, "load", str(out), "--iface", topo.b0, "--subscribers", str(subs))
    assert re.search(r"XDP \d+ instructions", r.stdout)
    insns = json.loads((out / "report.json").read_text())["instructions"]  # filled in by the load
    for prog in ("xdp", "tc"):
        assert insns[prog]["xlated_insns"] > 100 and insns[prog]["verified_insns"] > 0
        assert insns[prog]["jited_bytes"] > 0
    try:
        procs = start_listeners(topo, tmp_path, idle=3)
        local = topo.popen_subc(topo.brk, "listen", "10.10.0.2:9999", "--timeout", "3", "--json")
        sample = real_sample()
        topo.subc(topo.pub, "replay", str(sample), "--to", "10.10.0.2:26400", "--rate", "20000")
        # other traffic: MoldUDP64 to another port reaches the broker's own stack untouched
        topo.subc(topo.pub, "replay", str(sample), "--to", "10.10.0.2:9999", "--count", "20")
        # VLAN-tagged frames: one order for subscribers 1 and 5 (TC clones), one for 1 only (XDP)
        orders = [encode_add_order({"add_order.stock": stock_value("BOB"), "add_order.shares": n,
                                    "add_order.order_ref_number": ref, "add_order.buy_sell_indicator": ord("B")})
                  for ref, n in ((900001, 50), (900002, 150))]
        send_frames_from_publisher(topo, (
            "from scapy.all import Dot1Q\n"
            f"e = Ether(dst='{topo.b0_mac}') / Dot1Q(vlan=7) / IP(src='10.10.0.1', dst='10.10.0.2')\n"
            f"frames = [e / UDP(sport=4000, dport=26400) / Raw(encode_packet('S', 1, [m])) for m in {orders!r}]"
        ))
        # a malformed frame (UDP length past the frame) and a truncated Add Order: never delivered
        bob = encode_add_order({"add_order.stock": stock_value("BOB"), "add_order.shares": 50,
                                "add_order.order_ref_number": 900003})
        send_frames_from_publisher(topo, (
            f"e = Ether(dst='{topo.b0_mac}') / IP(src='10.10.0.1', dst='10.10.0.2')\n"
            f"bad = e / UDP(sport=4000, dport=26400, len=1400) / Raw(encode_packet('S', 1, [{bob!r}]))\n"
            f"short = e / UDP(sport=4000, dport=26400) / Raw(encode_packet('S', 2, [{bob[:20]!r}]))\n"
            "frames = [bad, short]"
        ))
        got = received(procs, tmp_path)
        local_doc = json.loads(local.communicate(timeout=60)[0])
        stats = json.loads(topo.subc(topo.brk, "stats", "--iface", topo.b0, "--json").stdout)
    finally:
        topo.subc(topo.brk, "unload", "--iface", topo.b0)

    want: dict[tuple[int, int], list[int]] = {ep: [] for ep in ALL_EPS}
    for _, msg in read_binaryfile(sample):
        if msg[:1] in (b"A", b"F"):
            for ep in expected_endpoints(rules, spec, msg):
                want[ep].append(int.from_bytes(msg[11:19], "big"))
    for ep in ENDPOINTS[1] + ENDPOINTS[5]:
        want[ep].append(900001)
    want[ENDPOINTS[1][0]].append(900002)
    for ep in ALL_EPS:
        assert sorted(got[ep]) == sorted(want[ep]), f"endpoint {ep}: {len(got[ep])} received, {len(want[ep])} expected"
    assert sum(len(v) for v in want.values()) > 5000  # every subscriber got traffic; 4 and 5 via TC clones
    assert local_doc["received"] == 20
    # counters agree with what the subscribers received
    for sid, eps in ENDPOINTS.items():
        assert stats["subscribers"][str(sid)]["packets"] == sum(len(got[ep]) for ep in eps)
    s = stats["stats"]
    assert s["xdp_unicast"] + s["tc_clones"] == sum(len(v) for v in got.values())
    assert s["malformed"] == 1 and s["truncated"] == 1 and s["errors"] == 0 and s["stale"] == 0
    assert s["no_match"] == 12012 - 4792 + 1  # messages no rule matched, and the truncated one
    assert sh("ip", "-n", topo.brk, "link", "show", topo.b0).stdout.find("xdp") == -1, "XDP still attached after unload"


def permuted(text: str, perm: dict[int, int]) -> str:
    return re.sub(r"fwd\((\d+)\)", lambda m: f"fwd({perm[int(m.group(1))]})", text)


def test_update_under_traffic_never_misdelivers(topo, tmp_path):
    spec = load_spec(EXAMPLE / "spec.p4")
    text_a = (EXAMPLE / "rules.sub").read_text()
    text_b = permuted(text_a, {1: 2, 2: 3, 3: 4, 4: 5, 5: 1})
    rules_a, rules_b = parse_rules(text_a, spec, "a.sub"), parse_rules(text_b, spec, "b.sub")
    out_a = compile_out(tmp_path, "a", text_a)
    order = ",".join(json.loads((out_a / "report.json").read_text())["field_order"])
    out_b = compile_out(tmp_path, "b", text_b, order)
    subs = tmp_path / "subscribers.toml"
    subs.write_text(topo.subscribers_toml(ENDPOINTS))
    topo.subc(topo.brk, "load", str(out_a), "--iface", topo.b0, "--subscribers", str(subs))
    updates = 0
    try:
        procs = start_listeners(topo, tmp_path, idle=3)
        sample = real_sample()
        pub = topo.popen_subc(topo.pub, "replay", str(sample), "--to", "10.10.0.2:26400", "--rate", "3000")
        while pub.poll() is None:
            topo.subc(topo.brk, "update", str(out_b if updates % 2 == 0 else out_a), "--iface", topo.b0)
            updates += 1
        assert pub.returncode == 0, pub.stderr.read()
        got = received(procs, tmp_path)
        stats = json.loads(topo.subc(topo.brk, "stats", "--iface", topo.b0, "--json").stdout)
    finally:
        topo.subc(topo.brk, "unload", "--iface", topo.b0)
    assert updates >= 4, f"only {updates} updates while the replay ran"
    by_ref: dict[int, set] = {}
    for ep, refs in got.items():
        assert len(refs) == len(set(refs)), f"endpoint {ep} received a message twice"
        for ref in refs:
            by_ref.setdefault(ref, set()).add(ep)
    misdelivered = lost = 0
    outcomes = Counter()
    for _, msg in read_binaryfile(sample):
        if msg[:1] not in (b"A", b"F"):
            continue
        ref = int.from_bytes(msg[11:19], "big")
        seen = by_ref.get(ref, set())
        ea, eb = expected_endpoints(rules_a, spec, msg), expected_endpoints(rules_b, spec, msg)
        if seen == ea == eb:
            outcomes["same"] += 1
        elif seen == ea:
            outcomes["a"] += 1
        elif seen == eb:
            outcomes["b"] += 1
        elif not seen:
            lost += 1
        else:
            misdelivered += 1
    assert misdelivered == 0 and lost == 0, f"{misdelivered} misdelivered, {lost} lost; {dict(outcomes)}"
    assert outcomes["a"] > 0 and outcomes["b"] > 0, f"both rule sets must have carried traffic: {dict(outcomes)}"
    assert stats["stats"]["errors"] == 0
