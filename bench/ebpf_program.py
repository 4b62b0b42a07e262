#!/usr/bin/env python3
"""Size of the eBPF target's program: generated lines and verifier instruction counts per variant.

For each variant (MoldUDP64 or one message per datagram; no state, state on arrival time, state
on a spec time field with named counters), compile a small rule set with subc (``--target ebpf``)
and print, as JSON lines: the lines of C the code generator wrote (``generated_lines``: the
generated files only, not the static C they include) and, when run as root, the instruction
counts of the loaded programs (``xlated_insns``: instructions after the verifier's rewriting;
``verified_insns``: instructions the verifier processed, Linux 5.16+), per program.  The figures
compare code generators and kernels, not machines: they do not depend on speed.

    sudo python3 bench/ebpf_program.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import subc  # noqa: E402

ITCH_SPEC = ROOT / "examples" / "itch" / "spec.p4"
# One message per datagram after Ethernet, IPv4 and UDP (port 7000): a field of each match kind.
SINGLE_SPEC = """
#include <core.p4>
header ethernet_t { bit<48> dst; bit<48> src; bit<16> etherType; }
header ipv4_t { bit<4> version; bit<4> ihl; bit<8> diffserv; bit<16> totalLen; bit<16> identification;
                bit<3> flags; bit<13> fragOffset; bit<8> ttl; bit<8> protocol; bit<16> hdrChecksum;
                bit<32> srcAddr; bit<32> dstAddr; }
header udp_t { bit<16> srcPort; bit<16> dstPort; bit<16> len; bit<16> checksum; }
header msg_t { bit<8> a; bit<16> b; bit<8> c; bit<64> g; }
struct headers { ethernet_t eth; ipv4_t ip; udp_t udp; msg_t m; }
struct metadata { }
@pragma query_field(m.a)
@pragma query_field(m.b)
@pragma query_field_exact(m.c)
@pragma query_field(m.g)
@pragma query_field_lpm(ip.dstAddr)
parser P(packet_in pkt, out headers hdr, inout metadata meta, inout standard_metadata_t sm) {
    state start { pkt.extract(hdr.eth); transition select(hdr.eth.etherType) { 0x0800: parse_ip; default: accept; } }
    state parse_ip { pkt.extract(hdr.ip); transition select(hdr.ip.protocol) { 17: parse_udp; default: accept; } }
    state parse_udp { pkt.extract(hdr.udp); transition select(hdr.udp.dstPort) { 7000: parse_m; default: accept; } }
    state parse_m { pkt.extract(hdr.m); transition accept; }
}
"""
SINGLE_RULES = "m.a > 3 and m.c == 7 : fwd(1);\nm.b < 900 and ip.dstAddr == 10.0.0.0/8 : fwd(2);\nm.g > 5 : fwd(1, 3);\n"

VARIANTS = {
    "mold": (ITCH_SPEC, "", (ROOT / "examples" / "itch" / "rules.sub").read_text()),
    "mold-state-arrival": (
        ITCH_SPEC,
        "",
        'add_order.stock == "GOOGL" and avg(add_order.price, window=1000) > 50 : fwd(1);\n'
        'add_order.shares > 100 and count(window=0) >= 3 : fwd(2);\n',
    ),
    "mold-state-time": (
        ITCH_SPEC,
        "@pragma query_field(add_order.timestamp)\n@pragma query_time(add_order.timestamp, ns)\n@pragma query_counter(c1, 1000)\n",
        'add_order.stock == "GOOGL" and c1 < 5 : fwd(1), inc(c1);\n'
        'add_order.shares > 100 and max(add_order.price, window=10) > 7 : fwd(2);\n',
    ),
    "single": (None, "", SINGLE_RULES),
    "single-state-arrival": (None, "", "m.a > 3 and count(window=1000) >= 2 : fwd(1);\nm.c == 7 : fwd(2);\n"),
    "single-state-time": (
        None,
        "@pragma query_time(m.g, ns)\n",
        "m.a > 3 and sum(m.b, window=10) > 100 : fwd(1);\nm.c == 7 : fwd(2);\n",
    ),
}


def variant_files(name: str) -> dict[str, str]:
    """The eBPF target's output files (name -> text) for variant ``name``."""
    spec_path, extra, rules = VARIANTS[name]
    text = spec_path.read_text() if spec_path else SINGLE_SPEC
    spec = subc.parse_spec(text + extra, str(spec_path or "single.p4"))
    return subc.compile(subc.parse_rules(rules, spec), spec, "ebpf").files


def measure(name: str) -> dict:
    """Generated line counts and (as root) instruction counts of variant ``name``."""
    files = variant_files(name)
    try:
        from subc.backends.ebpf.source import GENERATED_FILES, program_source
    except ImportError:  # before the static C (issue 39): one generated file
        GENERATED_FILES, program_source = ("subc_filter.bpf.c",), lambda f: f["subc_filter.bpf.c"]

    row = {"variant": name, "generated_lines": sum(files[f].count("\n") for f in GENERATED_FILES if f in files)}
    if os.geteuid() == 0:
        from subc.backends.ebpf.maps_doc import MapsDoc
        from subc.dataplane.ebpf.broker import LoadedFilter

        doc = MapsDoc.from_json(json.loads(files["maps.json"]))
        with LoadedFilter.build(doc, program_source(files), None) as lf:
            from subc.dataplane.ebpf.bpf_objects import prog_info

            for fn in ("xdp", "tc"):
                info = prog_info(getattr(lf.program, fn).fd)
                row[f"subc_{fn}"] = {k: info[k] for k in ("xlated_insns", "verified_insns")}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated variants")
    args = ap.parse_args()
    rows = []
    for name in args.variants.split(","):
        row = measure(name)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
