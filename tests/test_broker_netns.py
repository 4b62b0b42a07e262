"""End to end: the eBPF broker in network namespaces, fed the real ITCH sample over veth.

A publisher namespace replays ``ex20101224.TEST_ITCH_50`` to a broker namespace running the
compiled example rules (``subc load``); three subscriber namespaces listen on six endpoints and
save what they receive.  Every endpoint must receive exactly the Add Orders the reference
semantics assign to its subscriber: single-endpoint deliveries (XDP redirect), multi-endpoint
ones (TC clones), a VLAN-tagged message, while messages that match nothing, truncated and
malformed frames are never delivered and other traffic reaches the broker's own stack.  Then
``subc update`` swaps rule sets repeatedly under traffic with zero misdeliveries.

No verdict depends on speed: the tests wait for events (a listener says it is bound, the broker
has counted every frame sent, a listener got its end-of-session packet), never for a time; the
time limits below only stop a hung test.
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

from subc.spec.front_end import load_spec
from subc.lang.rules import parse_rules
from subc.workloads.itch_codec import decode_add_order, encode_add_order, read_binaryfile, stock_value
from subc.semantics.reference import reference_decision

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


HANG_GUARD = 120.0  # seconds: only a hung test waits this long for one event
# A listener ends on its end-of-session packet; its idle timeout only ends it after a test killed
# too hard to stop it (an endpoint may get nothing for most of a test: far longer than HANG_GUARD).
LISTENER_IDLE = 1800.0


def wait_until(cond, what: str, limit: float = HANG_GUARD) -> None:
    """Poll ``cond()`` until it is true; fail with ``what`` after ``limit`` seconds (a hang guard)."""
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, f"gave up after {limit:.0f} s waiting for {what}"
        time.sleep(0.05)


def wait_bound(listener: subprocess.Popen, ip: str, port: int) -> None:
    """Wait until ``subc listen`` says its socket is bound to ``ip:port``."""
    line = listener.stderr.readline()
    assert line.startswith(f"listening on {ip}:{port}"), line


def start_listeners(topo: Topology, tmp: Path) -> dict[tuple[int, int], subprocess.Popen]:
    """One ``subc listen`` per endpoint, each saving what it receives; returns once all are bound.
    They end on the end-of-session packet :func:`end_listeners` sends."""
    procs = {}
    for k, port in ALL_EPS:
        procs[(k, port)] = topo.popen_subc(topo.subs[k - 1], "listen", f"10.10.{k}.2:{port}", "--timeout",
                                           str(LISTENER_IDLE), "--json", "--save", str(tmp / f"got_{k}_{port}.bin"))
    try:
        for (k, port), p in procs.items():
            wait_bound(p, f"10.10.{k}.2", port)
    except BaseException:
        stop(procs.values())
        raise
    return procs


def broker_stats(topo: Topology) -> dict:
    """``subc stats --json`` of the broker."""
    return json.loads(topo.subc(topo.brk, "stats", "--iface", topo.b0, "--json").stdout)


def classified(topo: Topology) -> int:
    """Frames the broker's XDP program took as its own (spec port), all counters summed."""
    s = broker_stats(topo)["stats"]
    return s["rx"] - s["not_ours"]


def wait_classified(topo: Topology, n: int) -> None:
    """Wait until the broker has classified ``n`` frames of its own and TC has fanned out every
    frame XDP handed it: every copy is then queued on its subscriber's veth."""
    def done() -> bool:
        s = broker_stats(topo)["stats"]
        return s["rx"] - s["not_ours"] >= n and s["tc_packets"] + s["slot_lost"] >= s["to_tc"]

    wait_until(done, f"the broker to classify {n} frames")


def end_listeners(topo: Topology, endpoints) -> None:
    """Send an end-of-session packet to every listener from the broker's namespace: it goes out of
    the broker's veth to the subscriber, behind every copy the broker has already sent there."""
    eps = [(f"10.10.{k}.2", port) for k, port in endpoints]
    code = (
        "import socket\n"
        "from subc.wire.moldudp64 import encode_end_of_session\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"for ep in {eps!r}:\n"
        "    s.sendto(encode_end_of_session('SUBCEND000', 1), ep)\n"
    )
    sh(*topo.in_ns(topo.brk, sys.executable, "-c", code))


def stop(procs) -> None:
    """Kill the listeners (Popen objects; None is skipped) still running: a test failed before ending them."""
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
            p.communicate()


def replay_args(trace: Path, dest: str = "10.10.0.2:26400") -> list[str]:
    """``subc replay`` of ``trace`` to ``dest``, packed as a live feed (many messages per datagram:
    the broker classifies each and sends each subscriber only its own)."""
    return ["replay", str(trace), "--to", dest, "--json"]


def replay(topo: Topology, trace: Path, *args: str) -> int:
    """Replay ``trace`` from the publisher to the broker's feed port; the number of datagrams sent."""
    return json.loads(topo.subc(topo.pub, *replay_args(trace), *args).stdout)["datagrams"]


def received(procs, tmp: Path) -> dict[tuple[int, int], list[int]]:
    """Order reference numbers each endpoint received (a listener ends on its end-of-session packet)."""
    out = {}
    for ep, p in procs.items():
        stdout, stderr = p.communicate(timeout=HANG_GUARD)
        assert p.returncode == 0, stderr
        doc = json.loads(stdout)
        assert doc["end_of_session"], f"listener {ep} ended before its end-of-session packet"
        refs = [int.from_bytes(m[11:19], "big") for _, m in read_binaryfile(tmp / f"got_{ep[0]}_{ep[1]}.bin")
                if m[:1] in (b"A", b"F")]
        assert doc["by_type"].get("A", 0) + doc["by_type"].get("F", 0) == len(refs)
        out[ep] = refs
    return out


def expected_endpoints(rules, spec, msg: bytes) -> set[tuple[int, int]]:
    d = reference_decision(rules, spec, decode_add_order(msg))
    return {ep for s in d.ports for ep in ENDPOINTS[s]}


def send_frames_from_publisher(topo: Topology, frames_py: str) -> None:
    """Run scapy in the publisher namespace to send raw frames (the code builds a list ``frames``)."""
    code = (
        "from scapy.all import Ether, IP, UDP, Raw, sendp\n"
        "from subc.wire.moldudp64 import encode_packet\n"
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
    procs: dict = {}
    local = None
    try:
        base = classified(topo)
        procs = start_listeners(topo, tmp_path)
        local = topo.popen_subc(topo.brk, "listen", "10.10.0.2:9999", "--count", "20", "--timeout", str(LISTENER_IDLE),
                                "--json")
        wait_bound(local, "10.10.0.2", 9999)
        sample = real_sample()
        sent = replay(topo, sample, "--rate", "20000")
        # other traffic: MoldUDP64 to another port reaches the broker's own stack untouched
        topo.subc(topo.pub, *replay_args(sample, "10.10.0.2:9999"), "--count", "20")
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
        wait_classified(topo, base + sent + 4)
        end_listeners(topo, ALL_EPS)
        got = received(procs, tmp_path)
        local_doc = json.loads(local.communicate(timeout=HANG_GUARD)[0])
        stats = broker_stats(topo)
    finally:
        stop([*procs.values(), local])
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
        assert stats["subscribers"][str(sid)]["messages"] == sum(len(got[ep]) for ep in eps)
    s = stats["stats"]
    assert s["malformed"] == 1 and s["undecoded"] == 1 and s["errors"] == 0 and s["stale"] == 0
    assert s["no_match"] == 12012 - 4792  # messages no rule matched (the truncated one is not decoded)
    assert s["slot_lost"] == 0 and s["fanout_overflow"] == 0
    assert sh("ip", "-n", topo.brk, "link", "show", topo.b0).stdout.find("xdp") == -1, "XDP still attached after unload"


def permuted(text: str, perm: dict[int, int]) -> str:
    return re.sub(r"fwd\((\d+)\)", lambda m: f"fwd({perm[int(m.group(1))]})", text)


UPDATES = 4  # rule-set swaps under traffic


def split_trace(path: Path, tmp: Path, parts: int) -> list[Path]:
    """``path`` cut into ``parts`` consecutive BinaryFILEs of about the same number of messages."""
    msgs = [m for _, m in read_binaryfile(path)]
    out = []
    for k in range(parts):
        piece = msgs[len(msgs) * k // parts: len(msgs) * (k + 1) // parts]
        out.append(tmp / f"slice_{k}.bin")
        out[-1].write_bytes(b"".join(len(m).to_bytes(2, "big") + m for m in piece))
    return out


def test_update_under_traffic_never_misdelivers(topo, tmp_path):
    """Slices of the sample alternate: one under the live rule set alone (the broker counts every
    frame of it before anything changes), then one replayed while ``subc update`` swaps the rule
    set.  :data:`UPDATES` swaps happen whatever the machine's speed."""
    spec = load_spec(EXAMPLE / "spec.p4")
    text_a = (EXAMPLE / "rules.sub").read_text()
    text_b = permuted(text_a, {1: 2, 2: 3, 3: 4, 4: 5, 5: 1})
    rules_a, rules_b = parse_rules(text_a, spec, "a.sub"), parse_rules(text_b, spec, "b.sub")
    out_a = compile_out(tmp_path, "a", text_a)
    order = ",".join(json.loads((out_a / "report.json").read_text())["field_order"])
    out_b = compile_out(tmp_path, "b", text_b, order)
    subs = tmp_path / "subscribers.toml"
    subs.write_text(topo.subscribers_toml(ENDPOINTS))
    sample = real_sample()
    slices = split_trace(sample, tmp_path, 2 * UPDATES)
    topo.subc(topo.brk, "load", str(out_a), "--iface", topo.b0, "--subscribers", str(subs))
    updates = 0
    quiet_set = {}  # order reference number -> the rule set live for its whole slice ("a" or "b")
    procs: dict = {}
    pub = None
    try:
        sent = classified(topo)  # frames of its own the broker has counted, and then will have
        procs = start_listeners(topo, tmp_path)
        for k in range(UPDATES):
            quiet, busy = slices[2 * k], slices[2 * k + 1]
            sent += replay(topo, quiet, "--rate", "20000", "--session", f"QUIET{k}")
            wait_classified(topo, sent)
            quiet_set.update({int.from_bytes(m[11:19], "big"): "ab"[k % 2]
                              for _, m in read_binaryfile(quiet) if m[:1] in (b"A", b"F")})
            pub = topo.popen_subc(topo.pub, *replay_args(busy), "--rate", "1500", "--session", f"BUSY{k}")
            topo.subc(topo.brk, "update", str(out_b if k % 2 == 0 else out_a), "--iface", topo.b0)
            updates += 1
            stdout, stderr = pub.communicate(timeout=HANG_GUARD)
            assert pub.returncode == 0, stderr
            sent += json.loads(stdout)["datagrams"]
            wait_classified(topo, sent)
        end_listeners(topo, ALL_EPS)
        got = received(procs, tmp_path)
        stats = broker_stats(topo)
    finally:
        stop([*procs.values(), pub])
        topo.subc(topo.brk, "unload", "--iface", topo.b0)
    assert updates == UPDATES
    by_ref: dict[int, set] = {}
    for ep, refs in got.items():
        assert len(refs) == len(set(refs)), f"endpoint {ep} received a message twice"
        for ref in refs:
            by_ref.setdefault(ref, set()).add(ep)
    misdelivered = lost = not_live = 0
    outcomes = Counter()
    for _, msg in read_binaryfile(sample):
        if msg[:1] not in (b"A", b"F"):
            continue
        ref = int.from_bytes(msg[11:19], "big")
        seen = by_ref.get(ref, set())
        ea, eb = expected_endpoints(rules_a, spec, msg), expected_endpoints(rules_b, spec, msg)
        if ref in quiet_set and seen != {"a": ea, "b": eb}[quiet_set[ref]]:
            not_live += 1  # its slice was sent and classified between two updates
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
    assert not_live == 0, f"{not_live} orders sent between two updates not delivered as the live rule set says"
    assert outcomes["a"] > 0 and outcomes["b"] > 0, f"both rule sets must have carried traffic: {dict(outcomes)}"
    assert stats["stats"]["errors"] == 0
