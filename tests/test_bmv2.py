"""The generated v1model program in the real tools: p4c compiles it and BMv2 forwards as the rules say.

Skipped when ``p4c-bm2-ss`` / ``simple_switch`` are not on PATH.  BMv2 runs with ``--use-files``:
packets are read from and written to pcap files (no network interfaces); the control plane is
loaded with ``simple_switch_CLI`` over the Thrift port on localhost.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter

import pytest

from bmv2_util import CLI, SWITCH, cli, start_switch, stop_switch
from conftest import EXAMPLE, real_sample

P4C = shutil.which("p4c-bm2-ss")
P4TEST = shutil.which("p4test")

pytestmark = pytest.mark.bmv2


def compile_example(tmp_path, target="bmv2", rules=EXAMPLE / "rules.sub"):
    out = tmp_path / target
    subprocess.run(
        [sys.executable, "-m", "subc.cli", "compile", str(rules), "--spec", str(EXAMPLE / "spec.p4"),
         "--target", target, "-o", str(out)],
        check=True, capture_output=True,
    )
    return out


@pytest.mark.skipif(P4TEST is None, reason="p4test not on PATH")
def test_p4test_accepts_v1model_program(tmp_path):
    out = compile_example(tmp_path)
    p = subprocess.run([P4TEST, "--std", "p4-16", str(out / "subc.p4")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@pytest.mark.skipif(P4C is None, reason="p4c-bm2-ss not on PATH")
def test_p4c_bm2_ss_compiles(tmp_path):
    out = compile_example(tmp_path)
    p = subprocess.run([P4C, "--std", "p4-16", str(out / "subc.p4"), "-o", str(out / "subc.json")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert (out / "subc.json").stat().st_size > 0


def _tna_include():
    """A folder holding Tofino's tna.p4 (from the open-source Tofino back end of p4c), if any:
    $SUBC_TNA_INCLUDE, or /opt/tna-include."""
    for d in (os.environ.get("SUBC_TNA_INCLUDE"), "/opt/tna-include"):
        if d and os.path.exists(os.path.join(d, "tna.p4")):
            return d
    return None


@pytest.mark.skipif(P4TEST is None or _tna_include() is None, reason="p4test or tna.p4 not available")
@pytest.mark.parametrize("range_form", ["direct", "code"])
def test_p4test_accepts_tna_program(tmp_path, range_form):
    """The TNA program type-checks against Tofino's tna.p4 (front and mid end of p4c)."""
    from subc.compiler.driver import compile_rules
    from subc.lang.rules import load_rules
    from subc.spec.front_end import load_spec
    from subc.backends.p4.program import render_program

    spec = load_spec(EXAMPLE / "spec.p4")
    res = compile_rules(load_rules(EXAMPLE / "rules.sub", spec), spec, "tofino", range_form=range_form)
    assert (range_form == "code") == any(t.role == "code" for t in res.pipeline.tables)
    _, src = render_program(res, "rules.sub")
    (tmp_path / "subc.p4").write_text(src)
    p = subprocess.run([P4TEST, "--std", "p4-16", "-D__TARGET_TOFINO__=1", "-I", _tna_include(), str(tmp_path / "subc.p4")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def _itch_packets(n_add_orders: int):
    """(scapy packets, order ref -> decoded fields) for the first Add Orders of the real sample,
    plus packets that are not Add Orders (another message type, another UDP port, ARP)."""
    from scapy.all import ARP, IP, UDP, Ether, Raw

    from subc.workloads.itch_codec import ADD_ORDER_TYPES, decode_add_order, read_binaryfile

    pkts, orders, seq = [], {}, 1
    eth = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    ip = IP(src="10.0.0.1", dst="10.0.0.2")
    for _, msg in read_binaryfile(real_sample()):
        mold = b"SESSION001" + seq.to_bytes(8, "big") + (1).to_bytes(2, "big") + len(msg).to_bytes(2, "big") + msg
        seq += 1
        if msg[:1] in ADD_ORDER_TYPES:
            fields = decode_add_order(msg)
            orders[fields["add_order.order_ref_number"]] = fields
            pkts.append(eth / ip / UDP(sport=40000, dport=26400) / Raw(mold))
            if len(orders) >= n_add_orders:
                break
        elif msg[:1] == b"D" and seq % 50 == 0:
            pkts.append(eth / ip / UDP(sport=40000, dport=26400) / Raw(mold))
    pkts.append(eth / ip / UDP(sport=40000, dport=9999) / Raw(b"not itch" * 4))
    pkts.append(Ether(src="02:00:00:00:00:01", dst="ff:ff:ff:ff:ff:ff") / ARP(pdst="10.0.0.2"))
    return pkts, orders


def _run_switch(out, tmp_path, wait: int) -> bool:
    """Run simple_switch on the pcap files of ``tmp_path`` (``--use-files wait``: it starts reading
    them ``wait`` s after it starts) with the entries of ``out`` loaded; False when loading them took
    longer than the wait (the outputs are then removed, to run again with a longer wait)."""
    for f in tmp_path.glob("p*_out.pcap"):
        f.unlink()
    started = time.time()
    sw, thrift = start_switch(out / "subc.json", tmp_path, wait, range(0, 6))
    try:
        cli(thrift, (out / "commands.txt").read_text())
        if time.time() - started >= wait - 2:
            return False  # the switch may have forwarded packets before its entries were in
        time.sleep(max(0.0, started + wait + 6 - time.time()))  # the wait, then the packets
        return True
    finally:
        stop_switch(sw)


@pytest.mark.skipif(None in (P4C, SWITCH, CLI), reason="p4c-bm2-ss, simple_switch or a runnable simple_switch_CLI not on PATH")
def test_bmv2_forwards_real_itch_as_the_rules_say(tmp_path):
    from scapy.all import rdpcap, wrpcap

    from subc.lang.rules import load_rules
    from subc.spec.front_end import load_spec
    from subc.semantics.reference import reference_decision

    out = compile_example(tmp_path)
    subprocess.run([P4C, "--std", "p4-16", str(out / "subc.p4"), "-o", str(out / "subc.json")], check=True)
    spec = load_spec(EXAMPLE / "spec.p4")
    rules = load_rules(EXAMPLE / "rules.sub", spec)
    pkts, orders = _itch_packets(300)
    wrpcap(str(tmp_path / "p0_in.pcap"), pkts)
    for port in range(1, 6):
        wrpcap(str(tmp_path / f"p{port}_in.pcap"), [])
    for wait in (20, 60, 180):  # a loaded machine gets a longer wait: the verdict never depends on speed
        if _run_switch(out, tmp_path, wait):
            break
    else:
        pytest.fail("the entries could not be loaded within 180 s")
    got = {port: Counter() for port in range(1, 6)}
    for port in range(1, 6):
        f = tmp_path / f"p{port}_out.pcap"
        if f.exists() and f.stat().st_size > 24:
            for pkt in rdpcap(str(f)):
                payload = bytes(pkt)[14 + 20 + 8:]
                msg = payload[22:]
                assert msg[:1] in (b"A", b"F"), "only Add Orders may leave the switch"
                got[port][int.from_bytes(msg[11:19], "big")] += 1
    want = {port: Counter() for port in range(1, 6)}
    for ref, fields in orders.items():
        packet = {q: 0 for q in spec.query_fields}
        packet.update(fields)
        for port in reference_decision(rules, spec, packet).ports:
            want[port][ref] += 1
    assert sum(sum(c.values()) for c in want.values()) > 100
    assert got == want


@pytest.mark.skipif(P4C is None, reason="p4c-bm2-ss not on PATH")
def test_p4c_compiles_lpm_spec_actions_and_default(tmp_path):
    """A spec with its own action and default action, rules on an lpm field: the program compiles."""
    spec = (EXAMPLE / "spec.p4").read_text().replace("@pragma query_default_action(drop)", "@pragma query_default_action(mark)")
    spec += "\naction mark() { hdr.ipv4.diffserv = 1; }\naction tag(bit<8> v) { hdr.ipv4.diffserv = v; }\n"
    (tmp_path / "spec.p4").write_text(spec)
    (tmp_path / "r.sub").write_text(
        'ipv4.dstAddr == 10.0.0.0/8 and stock == "BOB" : fwd(1, 2);\n'
        'ipv4.dstAddr == 10.1.0.0/16 : fwd(3);\n'
        'ipv4.dstAddr == 192.168.1.1 and shares > 5 : tag(7);\n'
    )
    out = tmp_path / "o"
    subprocess.run([sys.executable, "-m", "subc.cli", "compile", str(tmp_path / "r.sub"), "--spec", str(tmp_path / "spec.p4"),
                    "-o", str(out)], check=True, capture_output=True)
    src = (out / "subc.p4").read_text()
    # every message is classified on its own: a spec action withholds its message (counted by its
    # code) and its body is not run per message (docs/p4-messages.md "P4: every message of a datagram")
    assert "hdr.ipv4.dstAddr : lpm" in src and "action tag(" not in src
    doc = json.loads((out / "entries.json").read_text())
    held = {(h["action"], tuple(h["params"].items())) for h in doc["messages"]["held"]}
    assert held == {("tag", (("v", 7),)), ("mark", ())}
    assert doc["default_action"] == {"action": "subc_msg_hold", "params": {"code": next(
        h["code"] for h in doc["messages"]["held"] if h["action"] == "mark")}}
    p = subprocess.run([P4C, "--std", "p4-16", str(out / "subc.p4"), "-o", str(out / "subc.json")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
