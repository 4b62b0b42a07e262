"""BMv2 ``simple_switch_grpc`` loaded and updated over P4Runtime while real Add Orders flow.

Skipped when ``simple_switch_grpc`` or ``p4c-bm2-ss`` is not on PATH (or without root and network
namespaces).  A namespace made for the test holds veth pairs ``s<p>``/``h<p>`` (switch port ``p``
on ``s<p>``); the switch runs there with its P4Runtime server on the namespace's loopback, and
tests/bmv2_p4rt_driver.py (in the namespace) loads rule set A, sends every packet, updates to B
while sending, sends every packet again and verifies.  Every copy that arrives is then checked
against the reference interpreter on the values the test decoded from the real sample with its
own ITCH codec: a packet sent under A reaches exactly A's ports, under B exactly B's, and one sent
during the update exactly A's or exactly B's (never a mix, never another port).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import EXAMPLE, real_sample
from netns_util import need_root_and_netns, sh

P4C = shutil.which("p4c-bm2-ss")
SWITCH = shutil.which("simple_switch_grpc")
HERE = Path(__file__).resolve().parent
NS = "subcp4rt"
PORTS = 5
UDP_PORT = 26400
GRPC = "127.0.0.1:9559"
ID_AT = 14 + 20 + 8 + 20 + 2 + 5  # the ITCH timestamp (6 bytes) of the datagram's one message

pytestmark = [pytest.mark.bmv2, pytest.mark.skipif(None in (P4C, SWITCH),
                                                   reason="p4c-bm2-ss or simple_switch_grpc not on PATH")]

RULES_B = """\
# B: the market maker now takes cheap ALC orders, block trades start at 500 shares,
# the CHAR desk takes every sell and large order; the ALC band and odd lots stay.
add_order.stock == "ALC" and add_order.price < 20 : fwd(1);
add_order.shares >= 500 : fwd(2);
stock == "CHAR" and (buy_sell_indicator == "S" or shares >= 500) : fwd(3);
stock == "ALC" and price >= 20 and price <= 25 : fwd(4);
stock in {"BOB", "CHAR", "ALC"} and shares < 100 : fwd(5);
"""


def _packets(n_add_orders: int):
    """(frames, per frame the decoded Add Order fields or None): real Add Orders of the sample,
    one per MoldUDP64 datagram, a few other messages, and a datagram to another UDP port.  The
    UDP checksum is 0 (none), so the driver may write send numbers into the sequence number."""
    from scapy.all import IP, UDP, Ether, Raw

    from subc.workloads.itch_codec import ADD_ORDER_TYPES, decode_add_order, read_binaryfile

    eth = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    ip = IP(src="10.0.0.1", dst="10.0.0.2")
    frames, fields, n = [], [], 0
    for k, (_, msg) in enumerate(read_binaryfile(real_sample())):
        mold = b"SESSION001" + bytes(8) + (1).to_bytes(2, "big") + len(msg).to_bytes(2, "big") + msg
        if msg[:1] in ADD_ORDER_TYPES:
            fields.append(decode_add_order(msg))
            n += 1
        elif msg[:1] == b"D" and k % 40 == 0:
            fields.append(None)
        else:
            continue
        frames.append(bytes(eth / ip / UDP(sport=40000, dport=UDP_PORT, chksum=0) / Raw(mold)))
        if n >= n_add_orders:
            break
    other = eth / ip / UDP(sport=40000, dport=9999, chksum=0) / Raw(b"SESSION001" + bytes(20))
    frames.append(bytes(other))
    fields.append(None)
    return frames, fields


def _compile(rules: Path, out: Path, order: str | None = None) -> None:
    cmd = [sys.executable, "-m", "subc.cli", "compile", str(rules), "--spec", str(EXAMPLE / "spec.p4"),
           "--target", "bmv2", "-o", str(out), "--capacity-factor", "3"]
    if order:
        cmd += ["--field-order", order]
    subprocess.run(cmd, check=True, capture_output=True)


def _reference_ports(rules, spec, fields) -> list[frozenset]:
    """Per frame, the ports the reference interpreter gives on its decoded fields (none for a
    frame without an Add Order)."""
    from subc.semantics.reference import reference_decision

    out = []
    for f in fields:
        if f is None:
            out.append(frozenset())
            continue
        packet = {q: 0 for q in spec.query_fields}
        packet.update(f)
        out.append(frozenset(reference_decision(rules, spec, packet).ports))
    return out


def _run_driver(namespace: str, tmp_path: Path, driver: str, args: list[str]) -> dict:
    """Run ``simple_switch_grpc`` in ``namespace`` and ``driver`` (with ``args``) there; the
    driver's result JSON."""
    log = open(tmp_path / "switch.log", "w")
    ifaces = [a for p in range(PORTS + 1) for a in ("-i", f"{p}@s{p}")]
    sw = subprocess.Popen(["ip", "netns", "exec", namespace, SWITCH, "--no-p4", *ifaces, "--",
                           "--grpc-server-addr", GRPC], stdout=log, stderr=subprocess.STDOUT)
    try:
        r = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, str(HERE / driver), "--grpc", GRPC,
                            *args, "--udp-port", str(UDP_PORT), "--id-at", str(ID_AT),
                            "--result", str(tmp_path / "result.json")],
                           capture_output=True, text=True, cwd=HERE.parent)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        sw.terminate()
        sw.wait(timeout=30)
        log.close()
    return json.loads((tmp_path / "result.json").read_text())


def _copies(res: dict) -> dict[int, set[int]]:
    """Send number -> the ports its copies arrived on (each port at most once)."""
    got: dict[int, set[int]] = defaultdict(set)
    for port, seen in res["arrivals"].items():
        for n in seen:
            assert int(port) not in got[n], f"send {n} arrived twice on port {port}"
            got[n].add(int(port))
    return got


@pytest.fixture
def namespace():
    need_root_and_netns()
    sh("ip", "netns", "del", NS, check=False)
    sh("ip", "netns", "add", NS)
    try:
        sh("ip", "-n", NS, "link", "set", "lo", "up")
        sh("ip", "netns", "exec", NS, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        sh("ip", "netns", "exec", NS, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
        for p in range(PORTS + 1):
            sh("ip", "-n", NS, "link", "add", f"s{p}", "type", "veth", "peer", "name", f"h{p}")
            for end in (f"s{p}", f"h{p}"):
                sh("ip", "-n", NS, "link", "set", end, "up")
        yield NS
    finally:
        sh("ip", "netns", "del", NS, check=False)


def test_load_and_update_under_traffic_deliver_as_the_reference_says(tmp_path, namespace):
    from subc.lang.rules import load_rules
    from subc.spec.front_end import load_spec

    spec = load_spec(EXAMPLE / "spec.p4")
    (tmp_path / "b.sub").write_text(RULES_B)
    _compile(EXAMPLE / "rules.sub", tmp_path / "a")
    order = ",".join(json.loads((tmp_path / "a" / "entries.json").read_text())["field_order"])
    _compile(tmp_path / "b.sub", tmp_path / "b", order)
    subprocess.run([P4C, "--std", "p4-16", str(tmp_path / "a" / "subc.p4"), "-o", str(tmp_path / "a.json")],
                   check=True, capture_output=True)

    frames, fields = _packets(150)
    want = {name: _reference_ports(load_rules(path, spec), spec, fields)
            for name, path in (("A", EXAMPLE / "rules.sub"), ("B", tmp_path / "b.sub"))}
    assert want["A"] != want["B"], "the update must change deliveries of the sample"
    sentinels: dict[str, dict[int, int]] = {"A": {}, "B": {}, "during": {}}
    for i in range(len(frames)):
        for p in range(1, PORTS + 1):
            for ph in ("A", "B"):
                if p in want[ph][i]:
                    sentinels[ph].setdefault(p, i)
            if p in want["A"][i] and p in want["B"][i]:
                sentinels["during"].setdefault(p, i)
    assert sentinels["A"] and sentinels["B"] and sentinels["during"]
    (tmp_path / "packets.json").write_text(json.dumps({"frames": [f.hex() for f in frames], "sentinels": sentinels}))

    res = _run_driver(namespace, tmp_path, "bmv2_p4rt_driver.py", [
        "--a", str(tmp_path / "a"), "--b", str(tmp_path / "b"), "--config", str(tmp_path / "a.json"),
        "--packets", str(tmp_path / "packets.json"), "--ports", str(PORTS)])
    assert "every entry" in res["verify"]
    got = _copies(res)
    phases = defaultdict(int)
    delivered = 0
    for n, i, phase in res["sends"]:
        ports = frozenset(got.pop(n, ()))
        allowed = [want["A"][i], want["B"][i]] if phase == "during" else [want[phase][i]]
        assert ports in allowed, (f"send {n} (packet {i}, phase {phase}) reached ports {sorted(ports)}; "
                                  f"the reference says {' or '.join(str(sorted(a)) for a in allowed)}")
        phases[phase] += 1
        delivered += len(ports)
    assert not got, f"copies of sends never made: {sorted(got)[:10]}"
    assert phases["A"] >= len(frames) and phases["B"] >= len(frames) and delivered > 100
    print(f"sends per phase {dict(phases)}, copies {delivered}; {res['update']}")


SENTINEL_CONDITION = 'add_order.stock == "ZZZZ"'
SERVE_OPS = [  # [source, condition] subscribes; [k] unsubscribes the k-th live one (mod their number)
    ["127.0.0.1", 'add_order.stock == "ALC" and add_order.price < 20'],
    ["127.0.0.2", "add_order.shares >= 500"],
    ["127.0.0.3", 'add_order.buy_sell_indicator == "S" and add_order.stock in {"CHAR", "BOB"}'],
    ["127.0.0.1", 'add_order.stock == "BOB" or add_order.shares < 100'],
    [1],
    ["127.0.0.2", "add_order.price > 25 and not add_order.stock == \"ALC\""],
    [0],
    ["127.0.0.3", "add_order.shares < 300"],
]


def test_serve_on_a_switch_delivers_as_the_reference_says(tmp_path, namespace):
    """``subc serve --p4runtime`` on BMv2 under traffic (tests/bmv2_serve_driver.py): a packet
    sent after a reply reaches exactly the ports of the live subscriptions' reference decision; one
    sent while a request is applied, exactly the decision before or after it."""
    from subc.lang.rules import parse_rules
    from subc.spec.front_end import load_spec
    from subc.workloads.itch_codec import decode_add_order

    spec = load_spec(EXAMPLE / "spec.p4")
    prog = tmp_path / "prog"
    subprocess.run([sys.executable, "-m", "subc.cli", "serve-program", "--spec", str(EXAMPLE / "spec.p4"),
                    "--ports", "1-3", "--capacity", "200", "-o", str(prog)], check=True, capture_output=True)
    subprocess.run([P4C, "--std", "p4-16", str(prog / "subc.p4"), "-o", str(tmp_path / "prog.json")],
                   check=True, capture_output=True)
    (tmp_path / "ports.txt").write_text("127.0.0.2/32 2\n127.0.0.3/32 3\n127.0.0.0/8 1\n")
    frames, fields = _packets(100)
    # the sentinel: a real Add Order with its stock (8 bytes at message offset 24) set to ZZZZ
    i = next(k for k, f in enumerate(fields) if f is not None)
    at = 14 + 20 + 8 + 20 + 2  # the message in the frame
    sentinel = bytearray(frames[i])
    sentinel[at + 24:at + 32] = b"ZZZZ    "
    frames.append(bytes(sentinel))
    fields.append(decode_add_order(bytes(sentinel[at:])))
    assert fields[-1]["add_order.stock"] != fields[i]["add_order.stock"]
    (tmp_path / "packets.json").write_text(json.dumps({
        "frames": [f.hex() for f in frames], "sentinel": len(frames) - 1,
        "sentinel_condition": SENTINEL_CONDITION, "ops": SERVE_OPS}))

    res = _run_driver(namespace, tmp_path, "bmv2_serve_driver.py", [
        "--spec", str(EXAMPLE / "spec.p4"), "--program", str(prog), "--config", str(tmp_path / "prog.json"),
        "--port-map", str(tmp_path / "ports.txt"), "--state", str(tmp_path / "state"),
        "--packets", str(tmp_path / "packets.json")])
    want = [_reference_ports(parse_rules("".join(f"{c} : fwd({p});\n" for c, p in live), spec, "live.sub"),
                             spec, fields) for live in res["live"]]  # after op k: per frame, the ports
    assert len({tuple(w) for w in want}) > 3, "the requests must change deliveries of the sample"
    got = _copies(res)
    phases, delivered = defaultdict(int), 0
    for n, i, phase, op in res["sends"]:
        ports = frozenset(got.pop(n, ()))
        allowed = [want[op - 1][i], want[op][i]] if phase == "during" else [want[op][i]]
        assert ports in allowed, (f"send {n} (packet {i}, {phase} op {op}: {SERVE_OPS[op - 1]}) reached ports "
                                  f"{sorted(ports)}; the reference says {' or '.join(str(sorted(a)) for a in allowed)}")
        phases[phase] += 1
        delivered += len(ports)
    assert not got, f"copies of sends never made: {sorted(got)[:10]}"
    assert phases["after"] == len(SERVE_OPS) * len(frames) + len(SERVE_OPS) * -(-len(frames) // 12)
    print(f"sends per phase {dict(phases)}, copies {delivered}")
