"""The user-space baseline of the throughput benchmark (bench/udp_broker.c) classifies as the
reference does, so that the eBPF-versus-sockets ratio compares brokers that do the same work.

Hypothesis rule sets over the eight message fields of the eBPF differential spec (every match
kind, unaligned fields up to 64 bits), then the real ITCH sample.  Needs a C compiler, not root.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLE, ROOT, real_sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import boundary_packets, rule_set
from test_ebpf import DIFF_SPEC_TEXT, MSG_LAYOUT

from subc.compiler.driver import compile_rules
from subc.compiler.rules import parse_rules
from subc.compiler.spec import load_spec, parse_spec
from subc.compiler.targets import target_files
from subc.compiler.targets.ebpf_parse import plan_parser
from subc.runtime.reference import reference_decision

sys.path.insert(0, str(ROOT / "bench"))
from udp_tables import build_udp_broker, payloads_file, tables_text

SPEC = parse_spec(DIFF_SPEC_TEXT.replace("@pragma query_field_lpm(ip.dstAddr)\n", ""), "udp_diff.p4")
QS = dict(SPEC.query_fields)
SUBSCRIBERS = range(1, 7)
ENDPOINTS = {s: [(f"10.0.{s}.2", 5000 + s)] for s in SUBSCRIBERS}


@pytest.fixture(scope="module")
def udp_broker(tmp_path_factory) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("a C compiler (cc) is needed to build bench/udp_broker.c (apt-get install gcc)")
    return build_udp_broker(tmp_path_factory.mktemp("udp") / "udp_broker")


def classify(binary: Path, tmp: Path, rules, spec, payloads: list[bytes], port: int) -> list[tuple]:
    """(leaf kind, subscribers) per payload, from the baseline's classify command."""
    res = compile_rules(rules, spec, "ebpf")
    files, _ = target_files(res, "gen.sub")
    doc = json.loads(files["maps.json"])
    (tmp / "tables").write_text(tables_text(doc, plan_parser(spec), port, ENDPOINTS))
    (tmp / "payloads").write_bytes(payloads_file(payloads))
    out = subprocess.run([str(binary), "classify", str(tmp / "tables"), str(tmp / "payloads")],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    got = []
    for line in out[: len(payloads)]:
        _, kind, *eps = map(int, line.split())
        got.append((kind, tuple(sorted(list(SUBSCRIBERS)[e] for e in eps))))  # one endpoint each
    assert len(got) == len(payloads)
    return got


def expected(decision, spec) -> tuple:
    if decision.ports:
        return (2, decision.ports)
    return (0 if decision.action[0] == "drop" else 1, ())


def diff_payload(pkt: dict[str, int], kind: int = 1) -> bytes:
    bits = "".join(format(pkt.get(f"m.{n}", 0), f"0{w}b") for n, w in MSG_LAYOUT)
    return bytes([kind]) + int(bits, 2).to_bytes(len(bits) // 8, "big")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(rule_set(QS, allow_drop=False, max_port=6), st.data())
def test_baseline_agrees_with_reference(udp_broker, tmp_path, fields_text, data):
    _, text = fields_text
    rules = parse_rules(text, SPEC, "gen.sub")
    pkts = boundary_packets(rules, QS, data.draw)[:40]
    payloads = [diff_payload(p) for p in pkts]
    # and the same packets with the message header missing or cut short: the default action
    payloads += [diff_payload(pkts[0], kind=2), diff_payload(pkts[0])[:9]]
    got = classify(udp_broker, tmp_path, rules, SPEC, payloads, 7000)
    want = [expected(reference_decision(rules, SPEC, p), SPEC) for p in pkts]
    want += [expected(reference_decision([], SPEC, {}), SPEC)] * 2
    assert got == want, text


def test_baseline_on_the_real_sample(udp_broker, tmp_path):
    from subc.workloads.itch_codec import decode_add_order, read_binaryfile
    from subc.runtime.moldudp64 import encode_packet

    spec = load_spec(EXAMPLE / "spec.p4")
    rules = parse_rules((EXAMPLE / "rules.sub").read_text(), spec, "rules.sub")
    msgs = [m for _, m in read_binaryfile(real_sample())]
    payloads = [encode_packet("SESSION001", n + 1, [m]) for n, m in enumerate(msgs)]
    got = classify(udp_broker, tmp_path, rules, spec, payloads, 26400)
    for n, (m, g) in enumerate(zip(msgs, got)):
        pkt = decode_add_order(m) if m[:1] in (b"A", b"F") else None
        ref = reference_decision(rules, spec, pkt) if pkt else reference_decision([], spec, {})
        assert g == expected(ref, spec), f"message {n}: {g} vs {ref}"
    assert sum(1 for k, _ in got if k == 2) == 4792
