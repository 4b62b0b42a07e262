"""Helpers for the eBPF tests: crafting frames (scapy), fake subscribers, and reading what the
loaded XDP program decided for one frame (BPF_PROG_TEST_RUN plus the per-leaf counters)."""

from __future__ import annotations

import json
import os

import pytest

from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.spec.front_end import parse_spec
from subc.backends.ebpf import layout as L
from subc.backends.files import target_files
from subc.backends.ebpf.maps_doc import MapsDoc
from subc.backends.ebpf.source import program_source
from subc.semantics.reference import Decision
from subc.dataplane.ebpf.subscribers import Endpoint, Subscribers

XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT = 1, 2, 3, 4

# A spec with fields of every match kind, widths from 2 to 64 bits and bit offsets that are not
# byte aligned, after Ethernet, IPv4 and UDP (port 7000) and a one-byte kind.
NET_HEADERS = """
#include <core.p4>
header ethernet_t { bit<48> dst; bit<48> src; bit<16> etherType; }
header ipv4_t { bit<4> version; bit<4> ihl; bit<8> diffserv; bit<16> totalLen; bit<16> identification;
                bit<3> flags; bit<13> fragOffset; bit<8> ttl; bit<8> protocol; bit<16> hdrChecksum;
                bit<32> srcAddr; bit<32> dstAddr; }
header udp_t { bit<16> srcPort; bit<16> dstPort; bit<16> len; bit<16> checksum; }
"""
DIFF_SPEC_TEXT = NET_HEADERS + """
header pre_t { bit<8> kind; }
header msg_t { bit<8> a; bit<16> b; bit<8> c; bit<3> x; bit<13> h; bit<2> f; bit<6> pad; bit<32> e;
               bit<64> g; bit<8> d; }
struct headers { ethernet_t eth; ipv4_t ip; udp_t udp; pre_t pre; msg_t m; }
struct metadata { }
@pragma query_field(m.a)
@pragma query_field(m.b)
@pragma query_field_exact(m.c)
@pragma query_field(m.h)
@pragma query_field_exact(m.f)
@pragma query_field(m.e)
@pragma query_field(m.g)
@pragma query_field_lpm(m.d)
@pragma query_field_lpm(ip.dstAddr)
parser P(packet_in pkt, out headers hdr, inout metadata meta, inout standard_metadata_t sm) {
    state start { pkt.extract(hdr.eth); transition select(hdr.eth.etherType) { 0x0800: parse_ip; default: accept; } }
    state parse_ip { pkt.extract(hdr.ip); transition select(hdr.ip.protocol) { 17: parse_udp; default: accept; } }
    state parse_udp { pkt.extract(hdr.udp); transition select(hdr.udp.dstPort) { 7000: parse_pre; default: accept; } }
    state parse_pre { pkt.extract(hdr.pre); transition select(hdr.pre.kind) { 1: parse_m; default: accept; } }
    state parse_m { pkt.extract(hdr.m); transition accept; }
}
"""
DIFF_SPEC = parse_spec(DIFF_SPEC_TEXT, "ebpf_diff.p4")
MSG_LAYOUT = [("a", 8), ("b", 16), ("c", 8), ("x", 3), ("h", 13), ("f", 2), ("pad", 6), ("e", 32), ("g", 64), ("d", 8)]


def diff_frame(pkt: dict[str, int], kind: int = 1) -> bytes:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    bits = "".join(format(pkt.get(f"m.{n}", 0), f"0{w}b") for n, w in MSG_LAYOUT)
    msg = int(bits, 2).to_bytes(len(bits) // 8, "big")
    dst = ".".join(str(b) for b in pkt["ip.dstAddr"].to_bytes(4, "big"))
    return bytes(Ether(src="02:00:00:00:00:aa", dst="02:00:00:00:00:bb") / IP(src="10.0.0.1", dst=dst)
                 / UDP(sport=1234, dport=7000) / Raw(bytes([kind]) + msg))


def compile_ebpf(text: str, spec, order=None):
    """(rules, maps.json document (read back from its text), C source) of ``text`` compiled for
    the eBPF target."""
    rules = parse_rules(text, spec, "gen.sub")
    res = compile_rules(rules, spec, "ebpf", field_order=order)
    files, _ = target_files(res, "gen.sub")
    return rules, MapsDoc.from_json(json.loads(files["maps.json"])), program_source(files)


def need_root():
    """Skip, with the reason, unless the eBPF tests can load programs: root, bcc (Debian's
    python3-bpfcc) and kernel headers.  CI runs as root with ``tests/run.sh``, which installs
    the rest, so there they always run."""
    if os.geteuid() != 0:
        pytest.skip("eBPF tests need root (CI runs them as root)")
    from subc.errors import SubcError
    from subc.dataplane.ebpf.bpf import check_kernel_headers, import_bcc

    try:
        import_bcc()
        check_kernel_headers()
    except SubcError as e:
        pytest.skip(f"eBPF tests: {e.message}")


def fake_subscribers(ids=range(1, 7), multi: dict[int, int] | None = None) -> Subscribers:
    """Subscribers with one endpoint each (``multi``: id -> number of endpoints) on interfaces
    that do not exist (ifindex 100 + id): test runs never send anything."""
    subs = Subscribers(path="<fake>")
    for sid in ids:
        eps = []
        for j in range((multi or {}).get(sid, 1)):
            eps.append(Endpoint(sid, f"10.99.{sid}.{j + 2}", 5000 + sid, f"02:00:00:00:{sid:02x}:{j + 2:02x}",
                                f"fake{sid}", ifindex=100 + sid, src_mac="02:00:00:00:00:01", src_ip="10.99.0.1"))
        subs.by_id[sid] = eps
    return subs


def leaf_totals(lf) -> dict[int, int]:
    """Messages per (tagged) leaf state of the live generation, summed over CPUs."""
    from subc.dataplane.ebpf.install import leaf_counters, tag

    return {tag(st, lf.gen): c["messages"] for st, c in leaf_counters(lf.maps, lf.doc, lf.gen, lf.caps).items()}


def stat_totals(lf) -> dict[str, int]:
    m = lf.maps["subc_stats"]
    return {name: sum(int.from_bytes(v[:8], "little") for v in m.lookup(L.U32.pack(v=i)) or [])
            for i, name in enumerate(L.STATS)}


class Runner:
    """Runs frames through a :class:`~subc.dataplane.ebpf.broker.LoadedFilter`'s XDP program and tells
    which leaf each reached (None: the frame was not classified)."""

    def __init__(self, lf):
        self.lf = lf
        self.before = leaf_totals(lf)

    def run(self, frame: bytes):
        from subc.dataplane.ebpf.bpf_objects import test_run

        ret, out, _ = test_run(self.lf.program.xdp.fd, frame)
        after = leaf_totals(self.lf)
        hit = [k for k, n in after.items() if n != self.before.get(k, 0)]
        self.before = after
        assert len(hit) <= 1, f"one frame counted on several leaves: {hit}"
        leaf = hit[0] & L.STATE_MASK if hit else None
        return ret, out, leaf

    def run_many(self, frame: bytes):
        """(XDP verdict, Counter of leaf state -> messages of the frame that reached it)."""
        from collections import Counter

        from subc.dataplane.ebpf.bpf_objects import test_run

        ret, _, _ = test_run(self.lf.program.xdp.fd, frame)
        after = leaf_totals(self.lf)
        hits = Counter({k & L.STATE_MASK: n - self.before.get(k, 0) for k, n in after.items()
                        if n != self.before.get(k, 0)})
        self.before = after
        return ret, hits

    def decision(self, leaf: int) -> Decision:
        """The decision ``maps.json`` gives leaf state ``leaf``."""
        e = next(e for e in self.lf.doc.to_json()["maps"] if e["name"] == "subc_leaf")
        e = next(e for e in e["entries"] if e["state"] == leaf)
        if e["action"] == "fwd":
            return Decision(tuple(e["subscribers"]), None)
        return Decision((), (e["action"],))


def expected_xdp(decision: Decision, subs: Subscribers) -> int:
    """The XDP return code a decision implies with subscribers ``subs``."""
    if not decision.ports:
        return XDP_PASS if decision.action == ("nop",) else XDP_DROP
    n = sum(len(subs.by_id[p]) for p in decision.ports)
    return XDP_REDIRECT if n == 1 else XDP_PASS


def check_rewrite(frame_out: bytes, ep: Endpoint) -> None:
    """The frame was rewritten for ``ep`` and its IPv4 and UDP checksums are right."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    p = Ether(frame_out)
    assert p.dst == ep.mac and p.src == ep.src_mac
    assert p[IP].dst == ep.ip and p[IP].src == ep.src_ip and p[UDP].dport == ep.port
    ip_sum, udp_sum = p[IP].chksum, p[UDP].chksum
    q = Ether(frame_out)
    del q[IP].chksum
    del q[UDP].chksum
    q = Ether(bytes(q))
    assert ip_sum == q[IP].chksum, "IPv4 checksum not updated right"
    assert udp_sum == 0 or udp_sum == q[UDP].chksum, "UDP checksum not updated right"
