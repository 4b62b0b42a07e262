"""Comparisons on state (docs/state.md "Stateful subscriptions"): language, spec pragmas, and the
differential test of the compiled tables with their register model against the reference.

Hypothesis draws rule sets that mix predicates on header fields with comparisons on aggregates
(``count``, ``sum``, ``avg``, ``min``, ``max``, windows of 0 to 5 us, every operator, under
``and``/``or``/``not``), and timed message sequences whose times step onto, just before and just
after window boundaries (sometimes backwards).  The table simulator over the emitted entries
(:mod:`subc.semantics.state_model` updating registers between the update table and the state-value
stages) must decide every message as :class:`~subc.semantics.stateful_reference.StatefulReference`
does, which keeps the aggregates as plain numbers (exact fractions for ``avg``).
"""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.ir.aggregates import stateless_part
from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.spec.front_end import parse_spec
from subc.backends.p4.entries import entries_doc
from subc.errors import SubcError
from subc.sim.switch import TableSimulator
from subc.semantics.stateful_reference import StatefulReference

from strategies import counter_probe, counter_rules, stateful_rules, timed_messages

HEADER_FIELDS = """
@pragma query_field(h.a, 8)
@pragma query_field(h.b, 16)
@pragma query_field_exact(h.c, 8)
@pragma query_field(h.e, 32)
@pragma query_field(h.t, 32)
"""
SPEC_TIMED = parse_spec(HEADER_FIELDS + "@pragma query_time(h.t, ns)\n", "timed.p4")
SPEC_ARRIVAL = parse_spec(HEADER_FIELDS + "@pragma query_window(2)\n", "arrival.p4")
FIELDS = {q.name: q for q in SPEC_TIMED.query_fields.values() if q.name != "h.t"}
#: small value sets, so that aggregates cross the rules' thresholds
VALUES = {"h.a": [0, 1, 2, 5, 255], "h.b": [0, 3, 7, 100, 65535], "h.c": [0, 1, 2], "h.e": [0, 10, 20, 4294967295]}
AGG_FIELDS = ["h.a", "h.b", "h.e"]


def run(spec, text, messages, timed: bool):
    rules = parse_rules(text, spec, "gen.sub")
    res = compile_rules(rules, spec, "bmv2")
    sim = TableSimulator(entries_doc(res.pipeline, "bmv2"))
    ref = StatefulReference(rules, spec)
    decisions = []
    for i, (t, msg) in enumerate(messages):
        want = ref.decide(msg, t)
        got = sim.process(msg) if timed else sim.process(msg, arrival_ns=t)
        assert got == want, f"{text}\nmessage {i} at {t} ns {msg}: reference {want}, tables {got}"
        decisions.append(got)
    return res, decisions


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(stateful_rules(FIELDS, AGG_FIELDS, VALUES), timed_messages(VALUES, "h.t"))
def test_tables_agree_with_reference_on_time_field(text, messages):
    run(SPEC_TIMED, text, messages, timed=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stateful_rules(FIELDS, AGG_FIELDS, VALUES), timed_messages(VALUES, "h.t"))
def test_tables_agree_with_reference_on_arrival_time(text, messages):
    run(SPEC_ARRIVAL, text, messages, timed=False)


def msgs(*rows):
    """(time, message) pairs from (time, a, e) rows."""
    return [(t, {"h.a": a, "h.b": 0, "h.c": 0, "h.e": e, "h.t": t}) for t, a, e in rows]


def test_avg_sees_its_own_message_and_windows_reset():
    """``h.a == 1 and avg(h.e) > 15``: the average of the window's h.a == 1 messages, this one
    included; a message in the next window (1 us) starts afresh; other messages do not count."""
    text = "h.a == 1 and avg(h.e, window=1) > 15 : fwd(1);"
    seq = msgs((0, 1, 10), (10, 1, 20), (20, 2, 0), (30, 1, 20), (999, 1, 0), (1000, 1, 20), (1001, 1, 0), (1002, 1, 10))
    # averages: 10, 15, -, 16.67, 12.5 | 20, 10, 10
    _, got = run(SPEC_TIMED, text, seq, timed=True)
    assert [bool(d.ports) for d in got] == [False, False, False, True, False, True, False, False]


def test_count_window_boundaries_and_time_going_back():
    text = "count(window=1) >= 2 : fwd(1);"
    seq = msgs((999, 0, 0), (1000, 0, 0), (1999, 0, 0), (2000, 0, 0), (1500, 0, 0), (1501, 0, 0))
    _, got = run(SPEC_TIMED, text, seq, timed=True)
    assert [bool(d.ports) for d in got] == [False, False, True, False, False, True]


def test_aggregate_a_message_does_not_update_keeps_its_window():
    """Time going back: a message of an earlier window that does not update the aggregate leaves
    it alone (docs/state.md "Stateful subscriptions", rule 1); one that updates it starts that window."""
    text = "h.a == 1 and count(window=1) >= 2 : fwd(1);"
    seq = msgs((1000, 1, 0), (1001, 1, 0), (500, 2, 0), (1002, 1, 0), (500, 1, 0), (1003, 1, 0), (1004, 1, 0))
    _, got = run(SPEC_TIMED, text, seq, timed=True)
    assert [bool(d.ports) for d in got] == [False, True, False, True, False, False, True]


def test_empty_window_makes_min_comparisons_false_and_count_zero_true():
    text = "h.a == 1 or min(h.e) < 5 or min(h.e) >= 5 : fwd(1);\nh.a == 3 or count() == 0 : fwd(2);"
    seq = msgs((0, 2, 0), (1, 1, 7), (2, 2, 0))
    _, got = run(SPEC_TIMED, text, seq, timed=True)
    # message 0: min's stateless part (true) matches, so min = 0 < 5; count() also updated: 1
    assert [d.ports for d in got] == [(1,), (1,), (1,)]


def test_rules_with_one_stateless_part_share_registers():
    text = ("h.a == 1 and avg(h.e) > 5 : fwd(1);\nh.a == 1 and avg(h.e) < 9 : fwd(2);\n"
            "h.a == 2 and avg(h.e) > 5 : fwd(3);")
    res = compile_rules(parse_rules(text, SPEC_TIMED), SPEC_TIMED, "bmv2")
    insts = res.ir.state.instances
    assert [(i.kind, i.thresholds, i.rules) for i in insts] == [("avg", (5, 9), (0, 1)), ("avg", (5,), (2,))]
    assert len(res.ir.state.values) == 3


def test_stateless_part():
    spec = SPEC_TIMED
    (r,) = parse_rules("(h.a == 1 and count() > 3) or (h.b == 2 and not count() > 3) : fwd(1);", spec)
    part = stateless_part(r.condition)
    # the packets that match for some truth of count() > 3: h.a == 1 or h.b == 2
    from subc.lang.ast import evaluate
    for a in (0, 1):
        for b in (0, 2):
            assert evaluate(part, {"h.a": a, "h.b": b}) == (a == 1 or b == 2)
    (r,) = parse_rules("count() > 3 or h.a == 1 : fwd(1);", spec)
    assert stateless_part(r.condition) is True


def test_reference_avg_is_exact():
    (r,) = parse_rules("avg(h.e) == 10 : fwd(1);", SPEC_TIMED)
    ref = StatefulReference([r], SPEC_TIMED)
    for e in (9, 11, 10):
        ref.decide({"h.a": 0, "h.b": 0, "h.c": 0, "h.e": e, "h.t": 0}, 0)
    assert ref.value(r, r.condition.agg) == Fraction(10)


@pytest.mark.parametrize("text, where, message", [
    ("avg() > 3 : fwd(1);", (1, 1), "avg() needs a field"),
    ("mean(h.a) > 3 : fwd(1);", (1, 1), "unknown aggregate 'mean'"),
    ("avg(h.a) in {1, 2} : fwd(1);", (1, 1), "not a set"),
    ("count(span=3) > 1 : fwd(1);", (1, 7), "unknown keyword argument 'span'"),
    ("count(window=1, window=2) > 1 : fwd(1);", (1, 17), "window= is given twice"),
    ("max(h.a) > 256 : fwd(1);", (1, 12), "does not fit"),
    ("count() > 1.5 : fwd(1);", (1, 11), "decimal"),
    ("sum(h.zz) > 1 : fwd(1);", (1, 5), "unknown field"),
])
def test_errors_point_at_the_offending_token(text, where, message):
    with pytest.raises(SubcError) as e:
        parse_rules(text, SPEC_TIMED, "bad.sub")
    assert (e.value.location.line, e.value.location.column) == where
    assert message in e.value.message


def test_too_many_comparisons_on_state():
    text = " and ".join(f"count() != {i}" for i in range(11)) + " : fwd(1);"
    with pytest.raises(SubcError, match="at most 10"):
        parse_rules(text, SPEC_TIMED)


@pytest.mark.parametrize("pragmas, message", [
    ("@pragma query_window(x)\n", "bad window"),
    ("@pragma query_time(h.zz)\n", "not a query field"),
    ("@pragma query_time(h.t, weeks)\n", "unknown time unit"),
    ("@pragma query_time(h.t)\n@pragma query_time(h.t)\n", "given twice"),
    ("@pragma query_counter(c, 100)\n@pragma query_counter(c, 5)\n", "declared twice"),
    ("@pragma query_counter(a)\n", "has the name of a query field"),
    ("@pragma query_counter(count, 1)\n", "reserved"),
    ("@pragma query_counter(subc_x, 1)\n", "reserved"),
    ("@pragma query_counter(c, 1, 2)\n", "takes a counter name"),
    ("@pragma query_counter(c, -1)\n", "bad window"),
])
def test_spec_pragma_errors(pragmas, message):
    with pytest.raises(SubcError, match=message):
        parse_spec(HEADER_FIELDS + pragmas, "bad.p4")


def test_camus_field_counter_pragma_sets_a_fields_window():
    spec = parse_spec("@pragma query_field(h.a, 8)\n@pragma query_field(h.n, 16)\n@pragma query_field_counter(h.n, 100)\n",
                      "camus.p4")
    assert spec.query_fields["h.n"].match_kind == "range" and spec.field_windows["h.n"] == 100_000
    (r,) = parse_rules("h.a == 1 and count(h.n) > 5 and sum(n) > 3 : fwd(1);", spec)
    aggs = {p.agg for p in r.condition.items[1:]}
    assert {a.window_ns for a in aggs} == {100_000}


PAPER_SPEC_EXTRA = "\n@pragma query_field(add_order.timestamp)\n@pragma query_time(add_order.timestamp, ns)\n"


@pytest.mark.parametrize("window_us", [0, 60_000_000, 600_000_000])
def test_paper_example_on_the_real_sample(tmp_path, window_us):
    """``stock == "BOB" and avg(price) > X : fwd(1)`` for several X (HotNets 2018, section 2) on
    the shared sample, against running averages computed straight from the messages decoded by the
    workload codec (not the spec's decoder), windows on the ITCH timestamps."""
    import json
    import subprocess
    import sys

    from conftest import EXAMPLE, real_sample
    from subc.workloads.itch_codec import ADD_ORDER_TYPES, decode_add_order, read_binaryfile, stock_symbol

    trace = real_sample()
    spec = tmp_path / "spec.p4"
    spec.write_text((EXAMPLE / "spec.p4").read_text() + PAPER_SPEC_EXTRA)
    thresholds = ["6.00", "6.20", "6.25", "6.50"]
    rules = tmp_path / "rules.sub"
    rules.write_text("".join(f'stock == "BOB" and avg(price, window={window_us}) > {x} : fwd({i});\n'
                             for i, x in enumerate(thresholds, 1)))
    expected = {}
    window, total, n = None, 0, 0
    for _, msg in read_binaryfile(trace):
        if msg[:1] not in ADD_ORDER_TYPES:
            continue
        m = decode_add_order(msg)
        if stock_symbol(m["add_order.stock"]) != "BOB":
            continue
        w = m["add_order.timestamp"] // (window_us * 1000) if window_us else 0
        if w != window:
            window, total, n = w, 0, 0
        total, n = total + m["add_order.price"], n + 1
        for i, x in enumerate(thresholds, 1):
            if total > int(x.replace(".", "")) * 100 * n:  # dollars with 2 decimals -> price units of 1e-4
                expected[str(i)] = expected.get(str(i), 0) + 1
    p = subprocess.run([sys.executable, "-m", "subc.cli", "simulate", str(rules), "--spec", str(spec), "--trace", str(trace),
                        "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["disagreements"] == 0
    assert doc["per_port"] == expected
    assert 0 < expected["2"] < 2482  # the thresholds split the BOB orders


def test_check_understands_comparisons_on_state(tmp_path):
    """``subc check``: a contradiction between comparisons on one aggregate is unsatisfiable (with
    the comparisons as written), the registers are reported, and a target without registers yet
    is an error."""
    from subc.checker.run import check

    from ebpf_util import DIFF_SPEC_TEXT

    spec = tmp_path / "s.p4"
    spec.write_text(DIFF_SPEC_TEXT + "@pragma query_time(m.g, us)\n")
    rules = tmp_path / "r.sub"
    rules.write_text("m.a == 1 and count() > 5 and count() < 3 : fwd(1);\nm.a == 2 and avg(m.e) > 7 : fwd(2);\n"
                     "m.a == 2 and avg(m.e) < 9 : fwd(3);\n")
    rep = check([str(rules)], str(spec), "ebpf", load_ebpf=False)
    (d,) = [d for d in rep.diagnostics if d.code == "unsatisfiable"]
    assert "'count() > 5' and 'count() < 3' contradict" in d.message and d.location.line == 1
    assert not [d for d in rep.diagnostics if d.severity == "error"]
    state = rep.target_fit["state"]
    assert [(i["kind"], i["thresholds"], i["rules"]) for i in state["instances"]] == [
        ("count", [], [0]), ("avg", [7, 9], [1, 2])]
    assert state["time"] == "m.g" and state["ebpf"]["entries"] == 4
    # count and avg: window ids and counts of 2 instances, the excess of 2 thresholds
    assert state["bmv2"]["registers"] == [{"name": "subc_agg_wid", "cells": 2, "bits": 64},
                                          {"name": "subc_agg_count", "cells": 2, "bits": 64},
                                          {"name": "subc_agg_excess", "cells": 2, "bits": 64}]
    assert state["bmv2"]["bytes"] == 48
    rep = check([str(rules)], str(spec), "bmv2")
    assert not [d for d in rep.diagnostics if d.severity == "error"]
    # Tofino: windows that never end need no divider; one of 1000 us over a time field in us does
    rep = check([str(rules)], str(spec), "tofino")
    assert not [d for d in rep.diagnostics if d.severity == "error"] and rep.target_fit["state"]["tofino"]
    rules.write_text("m.a == 1 and count(window=1000) > 5 : fwd(1);\n")
    rep = check([str(rules)], str(spec), "tofino")
    assert any(d.severity == "error" and "not a power of two" in d.message for d in rep.diagnostics)


def test_live_subscriptions_refuse_comparisons_on_state():
    """Live subscriptions do not keep registers yet: a SUBSCRIBE with an aggregate says so instead
    of deciding statelessly."""
    from subc.serve.protocol import ProtocolError, parse_request

    from conftest import EXAMPLE
    from subc.spec.front_end import load_spec

    itch = load_spec(EXAMPLE / "spec.p4")
    with pytest.raises(ProtocolError, match="comparisons on state"):
        parse_request(b'SUBSCRIBE stock == "BOB" and avg(price) > 5 TO 10.0.0.1:5000', itch)


@pytest.mark.parametrize("spec_name, rules_text", [
    ("camus_itch_p4_14.p4", 'add_order.stock == "BOB" and avg(add_order.price, window=1000) > 60000 : fwd(1);\n'
                            'count(window=500) >= 3 or max(add_order.shares) > 5000 : fwd(2);\n'),
    ("market_other_names.p4", 'ao.symbol == "BOB" and avg(ao.px, window=1000) > 6.00 : fwd(1);\n'
                              'count(window=500) >= 3 or max(ao.qty) > 5000 : fwd(2);\n'),
])
def test_real_shaped_feed_on_other_specs(tmp_path, spec_name, rules_text):
    """Stateful rules on a P4_14 spec and on a P4_16 spec with other names and layout, over the
    shared sample packed into MoldUDP64 datagrams (many messages each, written with scapy, capture
    times 100 us apart): windows on arrival time, every message through reference and tables."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    from conftest import real_sample
    from subc.workloads.feed import feed_datagrams
    from subc.workloads.itch_codec import read_binaryfile

    msgs = [m for _, m in read_binaryfile(real_sample())][:6000]
    frames = []
    for i, dg in enumerate(feed_datagrams(msgs, "SESSION001", batch=20)):
        f = Ether() / IP(src="10.0.0.1", dst="233.54.12.1") / UDP(sport=4000, dport=26400) / dg.payload
        f.time = 1_700_000_000 + i * 0.0001
        frames.append(f)
    pcap = tmp_path / "feed.pcap"
    wrpcap(str(pcap), frames)
    rules = tmp_path / "r.sub"
    rules.write_text(rules_text)
    spec = Path(__file__).parent / "specs" / spec_name
    p = subprocess.run([sys.executable, "-m", "subc.cli", "simulate", str(rules), "--spec", str(spec), "--trace", str(pcap),
                        "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["messages"] == 6000 and doc["disagreements"] == 0
    assert doc["per_port"].get("1", 0) > 0 and doc["per_port"].get("2", 0) > 0


# ------------------------------------------------------------------------------------------
# Tofino (TNA): Register/RegisterAction, what it cannot do, what `subc check` counts
# ------------------------------------------------------------------------------------------

def _tofino_spec(tmp_path, pragmas: str):
    from ebpf_util import DIFF_SPEC_TEXT

    p = tmp_path / "tofino.p4"
    p.write_text(DIFF_SPEC_TEXT + pragmas)
    return p


def test_tofino_program_keeps_state_in_register_actions(tmp_path):
    """Windows that are powers of two of a time field in us: one Register and one RegisterAction
    per quantity, each executed once; P4Info lists the registers; p4test (with Tofino's tna.p4,
    when present) accepts the program."""
    import os
    import shutil
    import subprocess

    from subc.spec.front_end import load_spec
    from subc.backends.files import target_files

    spec = load_spec(_tofino_spec(tmp_path, "@pragma query_time(m.g, us)\n@pragma query_window(1024)\n"))
    text = ("m.a == 1 and count() > 2 : fwd(1);\nm.a == 2 and avg(m.e) > 7 : fwd(2);\nm.a == 2 and avg(m.e) < 9 : fwd(3);\n"
            "m.b < 5 and sum(m.e, window=0) > 100 or max(m.b, window=2048) >= 7 : fwd(4);\n")
    res = compile_rules(parse_rules(text, spec), spec, "tofino")
    files, _ = target_files(res, "r.sub")
    src = files["subc.p4"]
    regs = re.findall(r"Register<bit<32>, bit<1>>\(1, 0\) (\w+);", src)
    # count: wid, count; avg (2 thresholds): wid, count, 2 x (lo, hi); sum: + lo, hi; max: + extreme
    assert len(regs) == 2 + 6 + 4 + 3 == len(set(regs))
    for r in regs:
        assert src.count(f"{r}_step.execute(") == 1, r
    assert "(bit<32>) (hdr.m.g >> 10)" in src and "(bit<32>) (hdr.m.g >> 11)" in src
    assert "/" not in "".join(line.split("//")[0] for line in src.splitlines() if "execute" in line or ">>" in line)
    for r in regs:
        assert f'name: "SubcIngress.{r}"' in files["p4info.txtpb"]
    p4test, tna = shutil.which("p4test"), os.environ.get("SUBC_TNA_INCLUDE", "/opt/tna-include")
    if p4test and os.path.exists(os.path.join(tna, "tna.p4")):
        (tmp_path / "subc.p4").write_text(src)
        p = subprocess.run([p4test, "--std", "p4-16", "-D__TARGET_TOFINO__=1", "-I", tna, str(tmp_path / "subc.p4")],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("pragmas, text, message", [
    ("@pragma query_time(m.g, us)\n", "m.a == 1 and count(window=1000) > 2 : fwd(1);", "not a power of two"),
    ("@pragma query_time(m.g, ns)\n", "m.a == 1 and count(window=1) > 2 : fwd(1);", "not a power of two"),
    ("", "m.a == 1 and count(window=1024) > 2 : fwd(1);", "arrival time"),
    ("@pragma query_time(m.g, us)\n", "m.a == 1 and sum(m.g, window=0) > 2 : fwd(1);", "32-bit cells"),
])
def test_what_tofino_cannot_keep_is_refused(tmp_path, pragmas, text, message):
    from subc.spec.front_end import load_spec
    from subc.backends.files import target_files

    spec = load_spec(_tofino_spec(tmp_path, pragmas))
    res = compile_rules(parse_rules(text, spec), spec, "tofino")
    with pytest.raises(SubcError, match=message):
        target_files(res, "r.sub")


def test_tofino_multi_message_state_needs_one_message_per_datagram(tmp_path):
    """A register is read-modified-written once per packet: --max-messages 1, or an error."""
    import subprocess
    import sys

    from conftest import EXAMPLE

    spec = tmp_path / "spec.p4"
    spec.write_text((EXAMPLE / "spec.p4").read_text() + "\n@pragma query_field(add_order.timestamp)\n"
                    "@pragma query_time(add_order.timestamp, us)\n@pragma query_window(1024)\n")
    (tmp_path / "r.sub").write_text('add_order.stock == "BOB" and avg(add_order.price) > 6.2 : fwd(1);\n')
    run = lambda *a: subprocess.run([sys.executable, "-m", "subc.cli", "compile", str(tmp_path / "r.sub"), "--spec",  # noqa: E731
                                     str(spec), "--target", "tofino", *a], capture_output=True, text=True)
    p = run("-o", str(tmp_path / "a"))
    assert p.returncode == 2 and "--max-messages 1" in p.stderr and not (tmp_path / "a").exists()
    p = run("-o", str(tmp_path / "b"), "--max-messages", "1")
    assert p.returncode == 0, p.stderr
    assert "subc_a0_excess0_hi_step.execute(0)" in (tmp_path / "b" / "subc.p4").read_text()


def test_check_counts_tofino_stateful_alus_and_stages(tmp_path):
    from subc.checker.run import check

    spec = _tofino_spec(tmp_path, "@pragma query_time(m.g, us)\n@pragma query_window(1024)\n")
    rules = tmp_path / "r.sub"
    rules.write_text("m.a == 1 and count() > 2 : fwd(1);\nm.a == 2 and avg(m.e) > 7 : fwd(2);\n"
                     "m.a == 2 and avg(m.e) < 9 : fwd(3);\n")
    rep = check([str(rules)], str(spec), "tofino")
    assert not [d for d in rep.diagnostics if d.severity == "error"]
    st = rep.target_fit["state"]["tofino"]
    # level 1: 2 window ids; level 2: 2 counts + 2 excess lows; level 3: 2 excess highs
    assert st["stateful_alus"] == 8 and st["per_level"] == [2, 4, 2] and st["stages"] == 1 + 1 + 1 + 3
    assert st["pipeline_stages"] == rep.target_fit["stages"]["needed"] + st["stages"]


# -- named counters ------------------------------------------------------------------------------

COUNTERS = "@pragma query_counter(c0, 1)\n@pragma query_field_counter(c1, 5)\n@pragma query_counter(c2, 0)\n"
SPEC_COUNTERS = parse_spec(HEADER_FIELDS + "@pragma query_time(h.t, ns)\n" + COUNTERS, "counters.p4")
SPEC_COUNTERS_ARRIVAL = parse_spec(HEADER_FIELDS + "@pragma query_window(2)\n" + COUNTERS, "counters_arrival.p4")


@SETTINGS
@given(counter_rules(FIELDS, AGG_FIELDS, VALUES, ["c0", "c1", "c2"], ["h.a", "h.b"]), timed_messages(VALUES, "h.t"))
def test_counters_tables_agree_with_reference_on_time_field(text, messages):
    run(SPEC_COUNTERS, text, messages, timed=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counter_rules(FIELDS, [], VALUES, ["c0", "c1", "c2"], ["h.e"]), timed_messages(VALUES, "h.t"))
def test_counters_tables_agree_with_reference_on_arrival_time(text, messages):
    run(SPEC_COUNTERS_ARRIVAL, text, messages, timed=False)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_counter_values_are_exact_in_the_tables(data):
    """A counter updated by one rule and compared with ``==`` by others, against values it takes
    on the sequence and one off (:func:`strategies.counter_probe`)."""
    messages = data.draw(timed_messages(VALUES, "h.t"))
    text = counter_probe(data, SPEC_COUNTERS, messages, ["c0", "c1", "c2"], ["h.a", "h.b", "h.e"], "h.c")
    run(SPEC_COUNTERS, text, messages, timed=True)


COUNTER_TEXT_ERRORS = [
    ("h.a == 1 : inc(nope);", (1, 16), "'nope' is not a counter"),
    ("h.a == 1 : nope <- count();", (1, 12), "'nope' is not a counter"),
    ("h.a == 1 : c0 <- avg(h.a);", (1, 18), "a counter adds"),
    ("h.a == 1 : c0 <- count(h.a);", (1, 24), "takes no field"),
    ("h.a == 1 : c0 <- sum(h.a, window=3);", (1, 18), "the counter's window applies"),
    ("h.a == 1 : fwd(c0);", (1, 16), "is not a value"),
    ("sum(c0) > 1 : fwd(1);", (1, 1), "is a named counter"),
    ("c0 > 1.5 : fwd(1);", (1, 6), "decimal"),
]


@pytest.mark.parametrize("text, where, message", COUNTER_TEXT_ERRORS)
def test_counter_errors_point_at_the_offending_token(text, where, message):
    with pytest.raises(SubcError) as e:
        parse_rules(text, SPEC_COUNTERS, "bad.sub")
    assert (e.value.location.line, e.value.location.column) == where, e.value
    assert message in e.value.message


def test_counter_sees_its_value_before_the_message_and_updates_apply_once():
    """``h.a == 1 and c0 < 2 : fwd(1), inc(c0)`` forwards the first two h.a == 1 messages of each
    1 us window; a second rule with ``inc(c0)`` matched by the same message adds nothing more;
    ``c2 <- sum(h.e)`` (never ending) is compared by a rule that does not update it."""
    text = ("h.a == 1 and c0 < 2 : fwd(1), inc(c0);\n"
            "h.a == 1 and h.e == 7 : inc(c0);\n"
            "h.a == 2 : c2 <- sum(h.e);\n"
            "count(c2) >= 30 : fwd(3);")
    seq = msgs((0, 1, 7), (1, 1, 0), (2, 1, 0), (3, 2, 20), (999, 2, 10), (1000, 1, 0), (1001, 1, 0), (1002, 1, 0))
    _, got = run(SPEC_COUNTERS, text, seq, timed=True)
    assert [d.ports for d in got] == [(1,), (1,), (), (), (), (1, 3), (1, 3), (3,)]


def test_counter_updates_neither_conflict_nor_decide(tmp_path):
    """Update actions are not forwarding actions: with fwd they conflict with nothing, alone they
    leave the default action; ``subc check`` reports no conflict and lists the counters."""
    import json

    from click.testing import CliRunner

    from subc.cli import main

    text = "h.a == 1 : fwd(1), inc(c0);\nh.a <= 2 : c1 <- sum(h.b);\nh.a == 1 : drop();\n"
    res, got = run(SPEC_COUNTERS, text.replace("drop()", "c0 <- count()"), msgs((0, 1, 0), (1, 2, 0), (2, 3, 0)),
                   timed=True)
    assert [str(d) for d in got] == ["fwd(1)", "drop()", "drop()"]
    assert [(i.kind, i.name) for i in res.ir.state.instances] == [("counter", "c0"), ("counter", "c1")]
    assert res.ir.state.values == ()  # updated, never compared
    spec = tmp_path / "s.p4"
    spec.write_text(HEADER_FIELDS + "@pragma query_time(h.t, ns)\n" + COUNTERS)
    rules = tmp_path / "r.sub"
    rules.write_text(text)
    out = CliRunner().invoke(main, ["check", str(rules), "--spec", str(spec), "--format", "json"])
    doc = json.loads(out.output)
    msgs_ = [d["message"] for d in doc["diagnostics"]]
    assert len(msgs_) == 1 and "drop() of this rule and fwd(1)" in msgs_[0], msgs_
    assert not any("inc(" in m or "<- sum" in m for m in msgs_), msgs_
    rules.write_text(text.replace("h.a == 1 : drop();\n", ""))  # no error: the targets' needs are reported
    out = CliRunner().invoke(main, ["check", str(rules), "--spec", str(spec), "--format", "json"])
    st = json.loads(out.output)["target_fit"]["state"]
    assert [i.get("name") for i in st["instances"]] == ["c0", "c1"]
    assert st["count_updates"] == [{"counter": "c0", "adds": 1}, {"counter": "c1", "adds": "h.b"}]


def test_tofino_refuses_named_counters(tmp_path):
    spec = _tofino_spec(tmp_path, "@pragma query_counter(hits, 0)\n")
    (tmp_path / "r.sub").write_text("m.a == 1 and hits < 3 : fwd(1), inc(hits);\n")
    from click.testing import CliRunner

    from subc.cli import main

    out = CliRunner().invoke(main, ["compile", str(tmp_path / "r.sub"), "--spec", str(spec), "--target", "tofino",
                                    "-o", str(tmp_path / "out")])
    assert out.exit_code == 2 and "named counter 'hits': not supported on Tofino" in out.output
    assert not (tmp_path / "out").exists()
