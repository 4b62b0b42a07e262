"""`subc load` checks the subscribers' interfaces (subc/dataplane/ebpf/links.py), in network namespaces
made by the test (removed afterwards; addresses in 10.11.0.0/16 inside them only).

    lkpub: lkp0 --- lkb0 (feed, MTU 1500) lkbrk
    lkbrk: lkb1 --- lks1 (namespace lks1): peer GRO off, no XDP     -> reported; fixed with fix
           lkb2 --- lks2 (namespace lks2): peer GRO on             -> nothing
           lkb3 --- lkc3 (same namespace): peer GRO off, no XDP     -> reported; fixed with fix
           lkb4 --- lks4 (lks2): lkb4 down                           -> down
           lkb5 --- lks5 (lks2): MTU 1000, peer MTU 900 and down     -> mtu, peer-mtu, peer-down
           lkb6 --- lks6 (lks2): peer GRO off but an XDP program     -> nothing
           nosuch0: no such device                                   -> missing (an error)

GRO states are read back with the ethtool command, independently of the module.  Then `subc load`
end to end: a peer with GRO off is fixed, and a datagram sent whole from XDP (every message for
the one subscriber) reaches it.  No verdict depends on speed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from netns_util import SUBC, need_root_and_netns, sh
from test_broker_netns import HANG_GUARD, compile_out

NS = ["lkpub", "lkbrk", "lks1", "lks2"]
IFACES = ["lkb1", "lkb2", "lkb3", "lkb4", "lkb5", "lkb6", "nosuch0"]
XDP_PASS = "int pass(struct xdp_md *ctx) { return XDP_PASS; }"


def ns_cmd(ns: str, *args: str) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{ns}", *args]


def gro(ns: str, dev: str) -> bool:
    out = sh(*ns_cmd(ns, "ethtool", "-k", dev)).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("generic-receive-offload:"))
    return line.split(":")[1].split()[0] == "on"


def remove() -> None:
    if Path("/run/netns/lkbrk").exists():  # the broker's pins and state are keyed by its namespace
        sh(*ns_cmd("lkbrk", *SUBC, "unload", "--iface", "lkb0"), check=False)
    for ns in NS:
        sh("ip", "netns", "del", ns, check=False)


@pytest.fixture(scope="module")
def topo():
    need_root_and_netns()
    remove()
    try:
        for ns in NS:
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", "lkp0", "netns", "lkpub", "type", "veth", "peer", "name", "lkb0", "netns", "lkbrk")
        pairs = [("lkb1", "lks1", "lks1"), ("lkb2", "lks2", "lks2"), ("lkb3", "lkc3", "lkbrk"), ("lkb4", "lks4", "lks2"),
                 ("lkb5", "lks5", "lks2"), ("lkb6", "lks6", "lks2")]
        for b, s, ns in pairs:
            sh("ip", "link", "add", b, "netns", "lkbrk", "type", "veth", "peer", "name", s, "netns", ns)
        sh("ip", "-n", "lkpub", "addr", "add", "10.11.0.1/24", "dev", "lkp0")
        sh("ip", "-n", "lkbrk", "addr", "add", "10.11.0.2/24", "dev", "lkb0")
        sh("ip", "-n", "lkbrk", "addr", "add", "10.11.1.1/24", "dev", "lkb1")
        sh("ip", "-n", "lks1", "addr", "add", "10.11.1.2/24", "dev", "lks1")
        for ns, dev in [("lkpub", "lkp0"), ("lkbrk", "lkb0"), ("lkbrk", "lkb1"), ("lks1", "lks1"), ("lkbrk", "lkb2"),
                        ("lks2", "lks2"), ("lkbrk", "lkb3"), ("lkbrk", "lkc3"), ("lks2", "lks4"), ("lkbrk", "lkb5"),
                        ("lkbrk", "lkb6"), ("lks2", "lks6")]:
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", "lkbrk", "link", "set", "lkb5", "mtu", "1000")
        sh("ip", "-n", "lks2", "link", "set", "lks5", "mtu", "900")
        sh(*ns_cmd("lkpub", "ethtool", "-K", "lkp0", "tx", "off"))
        for ns, dev, on in [("lks1", "lks1", "off"), ("lks2", "lks2", "on"), ("lkbrk", "lkc3", "off"),
                            ("lks2", "lks4", "on"), ("lks2", "lks5", "on"), ("lks2", "lks6", "off")]:
            sh(*ns_cmd(ns, "ethtool", "-K", dev, "gro", on))
        # an XDP program on lks6 (and no GRO): redirected frames reach it
        code = ("import sys; sys.path.insert(0, %r); from subc.dataplane.ebpf.bpf import import_bcc; b = import_bcc(); "
                "p = b.BPF(text=%r); b.BPF.attach_xdp('lks6', p.load_func('pass', b.BPF.XDP), 0)") % (str(ROOT), XDP_PASS)
        sh(*ns_cmd("lks2", sys.executable, "-c", code))
        yield
    finally:
        remove()


def check(fix: bool) -> list[dict]:
    """check_links run in the broker's namespace (a separate process), as dicts."""
    code = ("import json, sys; sys.path.insert(0, %r); from subc.dataplane.ebpf.links import check_links; "
            "print(json.dumps([p.as_dict() for p in check_links(%r, 'lkb0', fix=%r)]))") % (str(ROOT), IFACES, fix)
    return json.loads(sh(*ns_cmd("lkbrk", sys.executable, "-c", code)).stdout)


WANT = {("lkb1", "veth-peer-drops-xdp"), ("lkb3", "veth-peer-drops-xdp"), ("lkb4", "down"), ("lkb5", "mtu"),
        ("lkb5", "peer-mtu"), ("lkb5", "peer-down"), ("nosuch0", "missing")}


def test_report_only(topo):
    got = check(fix=False)
    assert {(p["iface"], p["code"]) for p in got} == WANT, got
    assert not any(p["fixed"] for p in got)
    assert {p["iface"] for p in got if p["severity"] == "error"} == {"nosuch0"}
    msg = next(p["message"] for p in got if p["iface"] == "lkb1")
    assert "lks1" in msg and "neither an XDP program nor GRO" in msg and "ethtool -K lks1 gro on" in msg, msg
    assert not gro("lks1", "lks1") and not gro("lkbrk", "lkc3")  # nothing changed


def test_fix_turns_gro_on(topo):
    try:
        got = check(fix=True)
        assert {(p["iface"], p["code"]) for p in got} == WANT, got
        assert {p["iface"] for p in got if p["fixed"]} == {"lkb1", "lkb3"}
        assert gro("lks1", "lks1") and gro("lkbrk", "lkc3")
        assert {(p["iface"], p["code"]) for p in check(fix=False)} == WANT - {("lkb1", "veth-peer-drops-xdp"),
                                                                              ("lkb3", "veth-peer-drops-xdp")}
    finally:
        sh(*ns_cmd("lks1", "ethtool", "-K", "lks1", "gro", "off"))
        sh(*ns_cmd("lkbrk", "ethtool", "-K", "lkc3", "gro", "off"))


def test_load_fixes_the_peer_and_copies_arrive(topo, tmp_path):
    """`subc load` turns GRO on at lks1, and a datagram whose messages all go to subscriber 1 (sent
    whole from XDP by bpf_redirect) reaches it; `subc load` refuses a missing interface."""
    from subc.wire.moldudp64 import encode_packet
    from subc.workloads.itch_codec import encode_add_order, stock_value

    assert not gro("lks1", "lks1")
    out = compile_out(tmp_path, "lk", 'add_order.stock == "LINK" : fwd(1);\n')
    mac = json.loads(sh("ip", "-n", "lks1", "-j", "link", "show", "lks1").stdout)[0]["address"]
    subs = tmp_path / "subs.toml"
    subs.write_text(f'[[subscriber]]\nid = 1\nendpoints = [{{ ip = "10.11.1.2", port = 6001, mac = "{mac}", '
                    f'iface = "lkb1" }}]\n')
    bad = tmp_path / "bad.toml"
    bad.write_text(subs.read_text().replace('"lkb1"', '"nosuch0"'))
    r = sh(*ns_cmd("lkbrk", *SUBC, "load", str(out), "--iface", "lkb0", "--subscribers", str(bad)), check=False)
    assert r.returncode != 0 and "no interface 'nosuch0'" in r.stderr, r.stderr
    r = sh(*ns_cmd("lkbrk", *SUBC, "load", str(out), "--iface", "lkb0", "--subscribers", str(subs)))
    try:
        assert "fixed: veth lkb1: its peer lks1" in r.stderr and "turned GRO on at lks1" in r.stderr, r.stderr
        assert gro("lks1", "lks1")
        import subprocess

        listener = subprocess.Popen(ns_cmd("lks1", *SUBC, "listen", "10.11.1.2:6001", "--count", "1", "--json",
                                           "--timeout", str(HANG_GUARD)),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert listener.stderr.readline().startswith("listening on 10.11.1.2:6001")
        msgs = [encode_add_order({"add_order.stock": stock_value("LINK"), "add_order.shares": 100 + i}) for i in range(3)]
        payload = encode_packet("LINKTEST01", 1, msgs)
        b0 = json.loads(sh("ip", "-n", "lkbrk", "-j", "link", "show", "lkb0").stdout)[0]["address"]
        code = ("from scapy.all import Ether, IP, UDP, Raw, sendp\n"
                f"sendp(Ether(dst='{b0}') / IP(src='10.11.0.1', dst='10.11.0.2') / UDP(sport=4000, dport=26400) / "
                f"Raw(bytes.fromhex('{payload.hex()}')), iface='lkp0', verbose=False)\n")
        sh(*ns_cmd("lkpub", sys.executable, "-c", code))
        stdout, stderr = listener.communicate(timeout=HANG_GUARD + 10)
        got = json.loads(stdout)
        assert got["messages"] == 3, (got, stderr)
        stats = json.loads(sh(*ns_cmd("lkbrk", *SUBC, "stats", "--iface", "lkb0", "--json")).stdout)["stats"]
        assert stats["fan_copies"] == 1 and stats["to_tc"] == 0, stats  # the copy left from XDP (the fan-out)
    finally:
        sh(*ns_cmd("lkbrk", *SUBC, "unload", "--iface", "lkb0"), check=False)
