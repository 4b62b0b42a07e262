"""The Spark jobs end to end, in local mode: ``subc analyze`` against ``subc simulate`` on the real
sample, on a pcap with several messages per packet and on a corrupted file; ``subc validate``."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from subc.compiler.driver import compile_rules
from subc.lang.rules import load_rules
from subc.errors import SubcError
from subc.analysis.analyze import analyze
from subc.analysis.validate import pieces, statements, validate
from subc.workloads.itch_codec import decode_add_order, read_binaryfile
from subc.semantics.reference import Decision, reference_decision
from subc.sim.trace import simulate_trace

from conftest import EXAMPLE, real_sample


@pytest.fixture(scope="module")
def spark():
    from subc.analysis.session import get_session

    s = get_session("local[2]", "subc tests", {"spark.ui.enabled": "false"})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def compiled(example_spec):
    return compile_rules(load_rules(EXAMPLE / "rules.sub", example_spec), example_spec, "bmv2")


@pytest.mark.parametrize("name", ["ex20101224.TEST_ITCH_50", "ex20101224.TEST_ITCH_50.reframed"])
def test_analyze_real_sample_agrees_with_simulate(spark, compiled, tmp_path, name):
    trace = real_sample(name)
    sim = simulate_trace(compiled, trace)
    out = tmp_path / "analysis"
    s = analyze(compiled, [str(trace)], out, split_bytes=50_000, spark=spark)
    assert s["splits"] >= 9
    assert s["disagreements"] == 0 and s["disagreement_examples"] == []
    assert s["messages"] == sim.messages == 12012
    assert s["classified"] == sim.classified == 5000 and s["problems"] == {}
    assert s["by_type"] == dict(sim.by_type)
    assert s["zero_length_fallbacks"] == sim.zero_length_fallbacks
    assert (s["unicast"], s["multicast"], s["no_rule_matched"]) == (
        sim.unicast_deliveries, sim.multicast_deliveries, sim.default_action)
    subs = pd.read_parquet(out / "subscribers.parquet")
    assert dict(zip(subs["subscriber"], subs["messages"])) == dict(sim.per_port)
    assert s["deliveries"] == sum(sim.per_port.values())
    rules = pd.read_parquet(out / "rules.parquet")
    assert dict(zip(rules["rule"], rules["hits"])) == {r.index: sim.rule_hits.get(r.index, 0) for r in compiled.rules}
    msgs = pd.read_parquet(out / "messages.parquet")
    assert len(msgs) == 5000
    sent = msgs.explode("subscribers")["subscribers"].dropna().astype(int).value_counts().to_dict()
    assert sent == dict(sim.per_port)
    # bytes: each delivered Add Order (36 or 40 bytes) plus its 2-byte block length, per port
    assert s["bytes"]["filtered"] == int(subs["bytes"].sum())
    assert s["bytes"]["broadcast"] == (sum(len(m) for _, m in read_binaryfile(trace)) + 2 * 12012) * 5
    assert json.loads((out / "summary.json").read_text())["disagreements"] == 0
    for png in ("deliveries_per_subscriber.png", "messages_per_second.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_analyze_counts_disagreements(spark, compiled, tmp_path):
    """Entries broken to drop what goes to port 5 alone must show up as disagreements."""
    import copy

    from subc.backends.p4.tables import Entry

    broken = copy.deepcopy(compiled)
    changed = 0
    for t in broken.pipeline.tables:
        fwd5 = [(e.action, e.params) == ("subc_fwd", (("port", 5),)) for e in t.entries]
        t.entries = [Entry(e.match, "subc_drop", (), e.priority) if f else e for e, f in zip(t.entries, fwd5)]
        changed += sum(fwd5)
    assert changed > 0
    s = analyze(broken, [str(real_sample())], tmp_path / "a", split_bytes=0, spark=spark)
    only5 = 0
    for _, m in read_binaryfile(real_sample()):
        if m[:1] in (b"A", b"F"):
            packet = {f: 0 for f in compiled.spec.query_fields}
            packet.update(decode_add_order(m))
            only5 += reference_decision(compiled.rules, compiled.spec, packet) == Decision((5,))
    assert only5 > 0 and s["disagreements"] == only5
    assert len(s["disagreement_examples"]) == 10
    assert {e["tables"] for e in s["disagreement_examples"]} == {"drop()"}
    assert {e["reference"] for e in s["disagreement_examples"]} == {"fwd(5)"}


def test_analyze_pcap_with_several_messages_per_packet(spark, compiled, tmp_path):
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    from subc.wire.moldudp64 import encode_packet

    trace = real_sample()
    msgs = [m for _, m in read_binaryfile(trace)]
    frames = [
        Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1, dport=26400) / encode_packet("S1", k + 1, msgs[k : k + 9])
        for k in range(0, len(msgs), 9)
    ]
    wrpcap(str(tmp_path / "feed.pcap"), frames)
    a = analyze(compiled, [str(tmp_path / "feed.pcap")], tmp_path / "p", spark=spark)
    b = analyze(compiled, [str(trace)], tmp_path / "b", spark=spark)
    assert a["disagreements"] == 0 and a["splits"] == 1
    for k in ("messages", "classified", "by_type", "deliveries", "unicast", "multicast", "no_rule_matched"):
        assert a[k] == b[k], k
    rows = pd.read_parquet(tmp_path / "p" / "messages.parquet").sort_values(["position", "index"])
    assert rows["index"].max() == 8 and rows["position"].iloc[0] >= 1
    # one copy per port per datagram holding any message for it (the independent ITCH codec + rules)
    want: dict[str, int] = {}
    for k in range(0, len(msgs), 9):
        ports = set()
        for m in msgs[k:k + 9]:
            if m[:1] in (b"A", b"F"):
                ports |= set(reference_decision(compiled.rules, compiled.spec, decode_add_order(m)).ports)
        for p in ports:
            want[str(p)] = want.get(str(p), 0) + 1
    assert {p: n for p, n in a["copies_per_port"].items() if n} == want
    assert {p: n for p, n in a["copies_per_port"].items() if n} == \
        simulate_trace(compiled, tmp_path / "feed.pcap").as_json()["copies_per_port"]
    # a BinaryFILE message is its own datagram
    assert {p: n for p, n in b["copies_per_port"].items() if n} == \
        {str(p): n for p, n in sorted(simulate_trace(compiled, trace).per_port.items())}


def test_analyze_corrupted_file_names_file_and_offset(spark, compiled, tmp_path):
    trace = real_sample("ex20101224.TEST_ITCH_50.reframed")
    data = trace.read_bytes()
    at = next(o for o, _ in read_binaryfile(trace) if o >= 300_000)  # a frame in the fourth split
    bad = tmp_path / "bad.itch"
    bad.write_bytes(data[:at] + b"\x00\x05" + data[at + 2 :])
    with pytest.raises(SubcError, match=rf"bad\.itch: message type b'.' at byte offset {at} has length 5"):
        analyze(compiled, [str(bad)], tmp_path / "out", split_bytes=100_000, spark=spark)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.itch"]  # nothing half-written


def test_analyze_cli_reports_and_exits_2_on_a_bad_trace(tmp_path):
    bad = tmp_path / "bad.itch"
    bad.write_bytes(b"\x00\x24A" + b"\x00" * 10)
    r = subprocess.run([sys.executable, "-m", "subc.cli", "analyze", str(EXAMPLE / "rules.sub"), "--spec",
                        str(EXAMPLE / "spec.p4"), "--trace", str(bad), "-o", str(tmp_path / "out"),
                        "--master", "local[1]"], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: " + str(bad) + ": message of 36 bytes at byte offset 0 runs past the end of the file" in r.stderr
    assert not (tmp_path / "out").exists()


def test_validate_reports_every_error_with_its_line_and_statistics(spark, example_spec, tmp_path):
    from subc.workloads.itch_rules import itch_rules

    lines = itch_rules(3000, symbols=30, seed=2).splitlines()
    lines[4] = lines[4].replace("add_order.price", "add_order.prise")
    lines[2500] = lines[2500].replace(";", "")
    lines[1200] = "# a comment; with a semicolon\n" + lines[1200]
    lines.append(lines[10])
    lines.append(lines[11].replace(" and ", "  and  "))
    path = tmp_path / "big.sub"
    path.write_text("\n".join(lines) + "\n")
    other = tmp_path / "small.sub"
    other.write_text('add_order.stock == "AB" : fwd(1);\nadd_order.stock == "AB" : fwd(600);\n')
    rep = validate([str(path), str(other)], example_spec, piece_chars=20_000, spark=spark)
    assert rep["pieces"] > 10
    assert rep["errors"] == 3
    msgs = rep["error_messages"]
    assert msgs[0].startswith(f"{path}:5:") and "unknown field 'add_order.prise'" in msgs[0]
    assert msgs[1].startswith(f"{path}:2503:1: error: unexpected 'add_order'")  # the rule after the missing ';'
    assert msgs[2].startswith(f"{other}:2:31: error: port 600 is out of range")
    assert "^" in msgs[0].splitlines()[-1]
    assert rep["rules"] == 3000 + 2 - 1 - 2 + 1
    assert rep["rules_per_field"] == {"add_order.price": rep["rules"] - 1, "add_order.stock": rep["rules"]}
    assert sum(rep["predicates_per_rule"].values()) == rep["rules"]
    groups = [set(g) for g in rep["duplicate_groups"]]
    assert {f"{path}:11", f"{path}:3002"} in [g & {f"{path}:11", f"{path}:3002"} for g in groups]
    assert any({f"{path}:12", f"{path}:3003"} <= g for g in groups)


def test_pieces_cover_the_text_at_rule_ends():
    text = 'a == 1 : fwd(1); b == "x;y" : fwd(2);\n# c; d\nc == 2 :\n fwd(3);  // end;\nd == 3 : fwd(4);\n' * 50
    ps = pieces("r.sub", text, 60)
    assert "".join(p.text for p in ps) == text
    assert len(ps) > 10
    offsets = [p.line_offset for p in ps]
    assert offsets == [sum(q.text.count("\n") for q in ps[:i]) for i in range(len(ps))]
    assert all(p.text.endswith("\n") for p in ps[:-1])
    st = statements(ps[0])
    assert [s.text.strip().split(":")[0].strip() for s in st][:3] == ["a == 1", 'b == "x;y"', "# c; d\nc == 2"]


def test_validate_cli_exit_status(tmp_path):
    good = tmp_path / "ok.sub"
    good.write_text('add_order.stock == "AB" : fwd(1);\n')
    bad = tmp_path / "bad.sub"
    bad.write_text('add_order.stock == "AB" : fwd(1);\nadd_order.stok == 1 : fwd(2);\n')
    base = [sys.executable, "-m", "subc.cli", "validate", "--spec", str(EXAMPLE / "spec.p4"), "--master", "local[1]"]
    r = subprocess.run(base + [str(good), str(bad)], capture_output=True, text=True)
    assert r.returncode == 2
    assert f"{bad}:2:1: error: unknown field 'add_order.stok'" in r.stderr
    assert "rules:      2 valid, 1 error(s) in 2 file(s)" in r.stdout
    assert "duplicates: 1" in r.stdout


STATEFUL_EXTRA = ("\n@pragma query_field(add_order.timestamp)\n@pragma query_time(add_order.timestamp, ns)\n"
                  "@pragma query_counter(bob_seen, 1000000)\n@pragma query_counter(volume, 60000000)\n")
STATEFUL_SETS = {
    "aggregates": ('add_order.stock == "BOB" and avg(add_order.price) > 6.20 : fwd(1);\n'
                   "count(window=60000000) >= 3 and add_order.shares > 100 : fwd(2);\n"
                   'add_order.stock == "AAPL" : fwd(4);\n'
                   'max(add_order.shares, window=600000000) > 500 and add_order.buy_sell_indicator == "B" : fwd(5);\n'),
    "counters": ('add_order.stock == "BOB" and bob_seen < 3 : fwd(3), inc(bob_seen);\n'
                 'add_order.stock == "BOB" and avg(add_order.price) > 6.20 : fwd(1);\n'
                 "add_order.shares > 100 : volume <- sum(add_order.shares);\n"
                 'volume > 10000 and add_order.buy_sell_indicator == "S" : fwd(2);\n'),
}


@pytest.mark.parametrize("kind", sorted(STATEFUL_SETS))
@pytest.mark.parametrize("name", ["ex20101224.TEST_ITCH_50", "ex20101224.TEST_ITCH_50.reframed"])
def test_analyze_stateful_rules_decide_every_message_as_simulate(spark, tmp_path, name, kind):
    """Comparisons on state over the real sample's ITCH timestamps, in splits of 50 kB (the
    registers carried from split to split): every message's subscribers equal ``subc simulate``'s."""
    from subc.lang.rules import parse_rules
    from subc.spec.front_end import parse_spec

    spec = parse_spec((EXAMPLE / "spec.p4").read_text() + STATEFUL_EXTRA, str(tmp_path / "spec.p4"))
    res = compile_rules(parse_rules(STATEFUL_SETS[kind], spec), spec, "bmv2")
    trace = real_sample(name)
    sim = simulate_trace(res, trace, copies=True)
    out = tmp_path / "analysis"
    s = analyze(res, [str(trace)], out, split_bytes=50_000, spark=spark)
    assert s["splits"] >= 9 and s["disagreements"] == 0
    assert s["stateful"]["tables"] == ("one by one (named counters)" if kind == "counters" else "vectorised per split")
    assert (s["classified"], s["unicast"], s["multicast"], s["no_rule_matched"]) == (
        sim.classified, sim.unicast_deliveries, sim.multicast_deliveries, sim.default_action)
    msgs = pd.read_parquet(out / "messages.parquet").sort_values("position")
    at = dict(read_binaryfile(trace))  # byte offset of the length prefix -> message (the workload codec)
    sent: dict[int, list[bytes]] = {}
    for pos, subs in zip(msgs["position"], msgs["subscribers"]):
        for p in subs:
            sent.setdefault(int(p), []).append(at[int(pos)])
    # the copies simulate builds (a BinaryFILE message is its own datagram), in trace order
    want = {p: [m for c, _ in copies for m in c.messages] for p, copies in sim.port_copies.items()}
    assert sent == {p: v for p, v in want.items() if v}
    assert sum(len(v) for v in sent.values()) > 100
    rules = pd.read_parquet(out / "rules.parquet")
    assert dict(zip(rules["rule"], rules["hits"])) == {r.index: sim.rule_hits.get(r.index, 0) for r in res.rules}
    assert {p: n for p, n in s["copies_per_port"].items() if n} == sim.as_json()["copies_per_port"]


def test_analyze_cli_with_state(tmp_path):
    """Through the command line: comparisons on state decided in trace order (exit 0, the state
    line), and windows of arrival time over a BinaryFILE refused (exit 2, nothing written)."""
    spec = tmp_path / "spec.p4"
    spec.write_text((EXAMPLE / "spec.p4").read_text() + STATEFUL_EXTRA)
    rules = tmp_path / "r.sub"
    rules.write_text(STATEFUL_SETS["counters"])
    trace = real_sample()
    r = subprocess.run([sys.executable, "-m", "subc.cli", "analyze", str(rules), "--spec", str(spec), "--trace",
                        str(trace), "-o", str(tmp_path / "out"), "--master", "local[1]"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "state:           in trace order: tables one by one (named counters), reference one by one on" in r.stdout
    assert "disagreements:   0" in r.stdout
    arrival = tmp_path / "arrival.p4"
    arrival.write_text((EXAMPLE / "spec.p4").read_text())
    rules.write_text('add_order.stock == "BOB" and count(window=1000) > 2 : fwd(1);\n')
    r = subprocess.run([sys.executable, "-m", "subc.cli", "analyze", str(rules), "--spec", str(arrival), "--trace",
                        str(trace), "-o", str(tmp_path / "out2"), "--master", "local[1]"], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"error: {trace}: the rules' aggregates have windows of arrival time, and a BinaryFILE has no arrival" in r.stderr
    assert not (tmp_path / "out2").exists()


def test_validate_takes_comparisons_on_state(spark, tmp_path):
    """Rules with aggregates and named counters validate (they crashed the tasks before): the same
    comparison written another way is a duplicate, one with another window or counter is not; an
    equality and a range on one field (which crashed it too) likewise."""
    from subc.spec.front_end import parse_spec

    spec = parse_spec((EXAMPLE / "spec.p4").read_text() + STATEFUL_EXTRA, str(tmp_path / "spec.p4"))
    path = tmp_path / "state.sub"
    path.write_text('add_order.stock == "BOB" and avg(add_order.price) > 6.20 : fwd(1);\n'
                    '6.20 < avg(add_order.price) and add_order.stock == "BOB" : fwd(1);\n'
                    'add_order.stock == "BOB" and avg(add_order.price, window=5) > 6.20 : fwd(1);\n'
                    'add_order.stock == "BOB" and bob_seen < 3 : fwd(3), inc(bob_seen);\n'
                    'add_order.stock == "BOB" and volume < 3 : fwd(3), inc(volume);\n'
                    'add_order.stock == "BOB" and count(bob_seen) < 3 : fwd(3), inc(bob_seen);\n'
                    'add_order.stock == "BOB" and avg(add_order.prise) > 1 : fwd(1);\n'
                    # an equality and a range on one field (their canonical forms once failed to sort)
                    "add_order.price == 5 and add_order.price < 10 : fwd(2);\n"
                    "add_order.price < 10 and add_order.price == 5 : fwd(2);\n")
    rep = validate([str(path)], spec, spark=spark)
    assert rep["rules"] == 8 and rep["errors"] == 1
    assert f"{path}:7:" in rep["error_messages"][0] and "add_order.prise" in rep["error_messages"][0]
    assert sorted(sorted(g) for g in rep["duplicate_groups"]) == [
        sorted([f"{path}:1", f"{path}:2"]), sorted([f"{path}:4", f"{path}:6"]), sorted([f"{path}:8", f"{path}:9"])]
