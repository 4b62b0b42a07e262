"""`subc analyze` with comparisons on state (docs/state.md "Stateful subscriptions", "The data pipeline").

Hypothesis draws stateful rule sets over the ITCH example spec (aggregates; named counters with
rate limits and sums) and timed ITCH messages built with scapy from values (times stepping onto
and around window boundaries, sometimes back), written as one or two BinaryFILE traces (time in
the message, ``query_time``) or as a nanosecond pcap of MoldUDP64 datagrams (time = capture
time, no time field).  The job's tasks (:func:`~subc.analysis.evaluate.process_split`, run here
in a plain loop over splits as small as the planner allows) and the stateful pass must give every
message exactly the ports that :class:`~subc.semantics.stateful_reference.StatefulReference`
decides from the drawn values, in order, across splits and files.  The Spark job itself runs in
``tests/test_pipeline_spark.py``.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from subc.lang.ast import state_predicates
from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.spec.front_end import parse_spec
from subc.errors import SubcError
from subc.analysis.analyze import make_bundle
from subc.analysis.evaluate import process_split
from subc.analysis.stateful_pass import StatefulPass
from subc.semantics.stateful_reference import StatefulReference
from test_p4_multi_message import frame, mold_payload
from strategies import counter_rules, stateful_rules, timed_messages
from test_p4_multi_message import SYMBOLS
from test_stateful import AGG_FIELDS, FIELDS, VALUES
from test_stateful_bmv2 import (COUNTER_SPEC, LITERALS, OTHER_SPEC_CASES, TIMED_SPEC, Clock, itch_counter_rules, itch_stateful_rules,
                                timed_itch_message)

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
#: the spec without a time field: aggregates over windows of capture time
ARRIVAL_SPEC = TIMED_SPEC.replace("@pragma query_time(add_order.timestamp, ns)\n", "")


@st.composite
def with_stateless_rules(draw, stateful):
    """A ``stateful`` rule set (strategy) with 0 to 3 rules without state mixed in (a stock, or a
    range of shares), so that a message's decision combines rules decided one message at a time
    with rules decided by value class."""
    lines = draw(stateful).splitlines()
    for _ in range(draw(st.integers(0, 3))):
        port = draw(st.integers(1, 6))
        if draw(st.booleans()):
            lines.append(f'add_order.stock == "{draw(st.sampled_from(SYMBOLS))}" : fwd({port});')
        else:
            lines.append(f"add_order.shares >= {draw(st.sampled_from(LITERALS['add_order.shares']))} : fwd({port});")
    return "\n".join(draw(st.permutations(lines))) + "\n"


def run_job(res, traces: list[str], split_bytes: int, work, tasks: int = 3, runner=None) -> tuple[list[list[int]], object]:
    """Every classified message's ports (in trace order) from the job's tasks and stateful pass,
    whose one-at-a-time work runs as up to ``tasks`` groups (``runner``: how they run; by default
    one after another, last group first)."""
    bundle = make_bundle(res, traces, split_bytes)
    stage, final = work / "stage", work / "final"
    stage.mkdir()
    final.mkdir()
    ports = [d.ports for d in bundle.tables.decisions]
    spass = StatefulPass(res, bundle, traces, runner or reversed_runner, tasks)
    for i in range(len(bundle.splits)):
        process_split(bundle, i, str(stage), ports)
    for i in range(len(bundle.splits)):
        spass.split(i, stage / f"part-{i:05d}.parquet", final / f"part-{i:05d}.parquet")
    outcome = spass.finish()
    assert not list(stage.iterdir())
    rows = []
    for i in range(len(bundle.splits)):
        t = pq.read_table(final / f"part-{i:05d}.parquet")
        assert not [c for c in t.column_names if c.startswith("subc:")]
        rows += [sorted(p) for p in t.column("subscribers").to_pylist()]
    return rows, outcome


def reversed_runner(fn, tasks):
    """The tasks run last first (each task in its own order): groups must not depend on each other."""
    return [fn(t) for t in tasks[::-1]][::-1]


def binaryfile(msgs: list[bytes]) -> bytes:
    """A BinaryFILE: each message after its 2-byte big-endian length."""
    return b"".join(struct.pack(">H", len(m)) + m for m in msgs)


def drawn_messages(data, n_max: int = 60):
    clock = Clock(data.draw(st.integers(0, 3000), label="start"))
    return [data.draw(timed_itch_message(clock)) for _ in range(data.draw(st.integers(1, n_max), label="n"))]


def reference_ports(res, spec, msgs, times=None) -> list[list[int]]:
    """Per classified message, in order, the reference's ports: every message when the rules test
    no header (``count() > 2``), else the Add Orders (values not None)."""
    ref = StatefulReference(res.rules, spec)
    out = []
    for i, (_, values) in enumerate(msgs):
        if values is not None or not res.pipeline.headers:
            t = (values or {}).get("add_order.timestamp", 0) if times is None else times[i]
            out.append(sorted(ref.decide(values or {}, t).ports))
    return out


def compiled(spec_text: str, rules_text: str, tmp):
    spec = parse_spec(spec_text, str(tmp / "spec.p4"))
    rules = parse_rules(rules_text, spec)
    return spec, rules, compile_rules(rules, spec, "bmv2")


@SETTINGS
@given(rules_text=with_stateless_rules(st.one_of(itch_stateful_rules(), itch_counter_rules())), data=st.data())
def test_binaryfile_traces_agree_with_the_reference(tmp_path_factory, rules_text, data):
    tmp = tmp_path_factory.mktemp("an")
    spec_text = COUNTER_SPEC if "seen" in rules_text or "volume" in rules_text else TIMED_SPEC
    spec, rules, res = compiled(spec_text, rules_text, tmp)
    msgs = drawn_messages(data)
    cut = data.draw(st.integers(0, len(msgs)), label="second file from")  # one stream over two files
    traces = []
    for k, part in enumerate((msgs[:cut], msgs[cut:])):
        if part:
            p = tmp / f"t{k}.bin"
            p.write_bytes(binaryfile([m for m, _ in part]))
            traces.append(str(p))
    split_bytes = data.draw(st.sampled_from([0, 1, 200, 600]), label="split bytes")
    got, outcome = run_job(res, traces, split_bytes, tmp)
    assert got == reference_ports(res, spec, msgs)
    assert outcome.disagreements == 0


def nano_pcap(frames: list[tuple[int, bytes]]) -> bytes:
    """A nanosecond-resolution pcap (magic a1b23c4d) of Ethernet ``frames`` (time in ns, bytes)."""
    out = struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1)
    for t, f in frames:
        out += struct.pack("<IIII", t // 1_000_000_000, t % 1_000_000_000, len(f), len(f)) + f
    return out


@SETTINGS
@given(rules_text=with_stateless_rules(itch_stateful_rules()), data=st.data())
def test_capture_times_agree_with_the_reference(tmp_path_factory, rules_text, data):
    """No time field: each message's time is its datagram's capture time (ns), which the test
    writes into the pcap records; datagrams carry 1 to 3 messages."""
    tmp = tmp_path_factory.mktemp("an")
    spec, rules, res = compiled(ARRIVAL_SPEC, rules_text, tmp)
    msgs = drawn_messages(data)
    frames, times, seq, i = [], [], 1, 0
    t = 1_700_000_000_000_000_000 + data.draw(st.integers(0, 5000), label="t0")
    while i < len(msgs):
        k = data.draw(st.integers(1, 3), label="per datagram")
        t = max(0, t + data.draw(st.sampled_from([0, 1, 999, 1000, 1001, 5000, -1, -1000]), label="dt"))
        group = msgs[i:i + k]
        frames.append((t, frame(mold_payload([m for m, _ in group], seq), 26400)))
        times += [t] * len(group)
        seq += len(group)
        i += k
    p = tmp / "t.pcap"
    p.write_bytes(nano_pcap(frames))
    got, outcome = run_job(res, [str(p)], 0, tmp)
    assert got == reference_ports(res, spec, msgs, times)
    assert outcome.disagreements == 0


def test_a_split_boundary_inside_a_window_carries_the_registers(tmp_path):
    """avg over one window spanning every split: the 3rd and later BOB orders see the running
    average of all before them, whichever split they are in."""
    spec, rules, res = compiled(TIMED_SPEC, 'add_order.stock == "BOB" and avg(add_order.price) > 15 : fwd(1);\n',
                                tmp_path)
    from test_p4_multi_message import _itch_classes

    AddOrder = _itch_classes()[0]
    prices = [100000, 100000, 400000, 100000, 100000, 100000, 400000, 400000]  # $10, $10, $40, ...
    msgs = [bytes(AddOrder(type=b"A", timestamp=i, side=b"B", shares=1, stock=b"BOB".ljust(8), price=p))
            for i, p in enumerate(prices)]
    (tmp_path / "t.bin").write_bytes(binaryfile(msgs))
    got, _ = run_job(res, [str(tmp_path / "t.bin")], 40, tmp_path)
    avg = np.cumsum(prices) / np.arange(1, len(prices) + 1)
    assert got == [[1] if a > 150000 else [] for a in avg]
    assert make_bundle(res, [str(tmp_path / "t.bin")], 40).splits[1:]  # several splits


def test_windows_of_arrival_time_refuse_a_binaryfile(tmp_path):
    spec, rules, res = compiled(ARRIVAL_SPEC, "count(window=5) > 2 : fwd(1);\n", tmp_path)
    (tmp_path / "t.bin").write_bytes(b"")
    with pytest.raises(SubcError, match="no arrival times.*query_time"):
        make_bundle(res, [str(tmp_path / "t.bin")])


@pytest.mark.parametrize("spec_name, extra, port, names, rules_text", OTHER_SPEC_CASES)
def test_real_sample_on_other_specs(tmp_path, spec_name, extra, port, names, rules_text):
    """The shared sample as it is (12,012 messages of every type; its 3 Add Order MPID messages left
    out) over a P4_14 spec and a P4_16 spec with other names, aggregates and named counters, in
    splits of 20 kB: each Add Order's ports are the reference's on values decoded by the workload
    codec, in trace order."""
    from pathlib import Path

    from conftest import real_sample
    from subc.workloads.itch_codec import decode_add_order, read_binaryfile

    spec_text = (Path(__file__).parent / "specs" / spec_name).read_text() + "\n" + extra
    spec, rules, res = compiled(spec_text, rules_text, tmp_path)
    msgs = [m for _, m in read_binaryfile(real_sample()) if m[:1] != b"F"]
    trace = tmp_path / "sample.bin"
    trace.write_bytes(binaryfile(msgs))
    got, outcome = run_job(res, [str(trace)], 20_000, tmp_path)
    time_field = names.get("add_order.timestamp", "add_order.timestamp")
    ref = StatefulReference(rules, spec)
    want = []
    for m in msgs:
        if m[:1] == b"A":
            values = {names.get(k, k): v for k, v in decode_add_order(m).items() if k != "itch.msg_type"}
            want.append(sorted(ref.decide(values, values[time_field]).ports))
    assert len(want) == 4997 and sum(map(len, want)) > 100 and any(1 in w for w in want) and any(2 in w for w in want)
    assert got == want
    assert outcome.disagreements == 0


# -- a generic message format: every shape of condition, every aggregate, named counters ----------

#: A P4_16 spec whose message 'M' (0x4d) carries the fields of :mod:`test_stateful`'s rule
#: strategies (h.a 8, h.b 16, h.c 8 exact, h.e 32 bits; h.t 32-bit time) and whose message 'N'
#: (0x4e) carries another header (never classified).  Written for this test.
GENERIC_SPEC = """#include <core.p4>
header eth_t { bit<48> dst; bit<48> src; bit<16> type; }
header ip_t { bit<4> v; bit<4> ihl; bit<8> tos; bit<16> len; bit<16> id; bit<3> fl; bit<13> frag;
              bit<8> ttl; bit<8> proto; bit<16> csum; bit<32> src; bit<32> dst; }
header udp_t { bit<16> sport; bit<16> dport; bit<16> len; bit<16> csum; }
header mold_t { bit<80> session; bit<64> seq; bit<16> count; }
header blk_t { bit<16> len; }
header kind_t { bit<8> code; }
header h_t { bit<8> a; bit<16> b; bit<8> c; bit<32> e; bit<32> t; }
header n_t { bit<16> x; }
struct headers_t { eth_t eth; ip_t ip; udp_t udp; mold_t mold; blk_t blk; kind_t kind; h_t h; n_t n; }
struct meta_t { }
@pragma query_field(h.a, 8)
@pragma query_field(h.b, 16)
@pragma query_field_exact(h.c, 8)
@pragma query_field(h.e, 32)
@pragma query_field(h.t, 32)
@pragma query_time(h.t, ns)
@pragma query_counter(c0, 1)
@pragma query_field_counter(c1, 5)
@pragma query_counter(c2, 0)
parser GenericParser(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t std) {
    state start { pkt.extract(hdr.eth); transition select(hdr.eth.type) { 0x0800: parse_ip; default: accept; } }
    state parse_ip { pkt.extract(hdr.ip); transition select(hdr.ip.proto) { 17: parse_udp; default: accept; } }
    state parse_udp { pkt.extract(hdr.udp); transition select(hdr.udp.dport) { 5000: parse_mold; default: accept; } }
    state parse_mold {
        pkt.extract(hdr.mold); pkt.extract(hdr.blk); pkt.extract(hdr.kind);
        transition select(hdr.kind.code) { 0x4d: parse_m; 0x4e: parse_n; default: accept; }
    }
    state parse_m { pkt.extract(hdr.h); transition accept; }
    state parse_n { pkt.extract(hdr.n); transition accept; }
}
"""


def _generic_classes():
    from scapy.fields import ByteField, IntField, ShortField
    from scapy.packet import Packet

    class M(Packet):
        name = "M"
        fields_desc = [ByteField("code", 0x4D), ByteField("a", 0), ShortField("b", 0), ByteField("c", 0),
                       IntField("e", 0), IntField("t", 0)]

    class N(Packet):
        name = "N"
        fields_desc = [ByteField("code", 0x4E), ShortField("x", 0)]

    return M, N


@SETTINGS
@given(rules_text=st.one_of(stateful_rules(FIELDS, AGG_FIELDS, VALUES),
                            counter_rules(FIELDS, AGG_FIELDS, VALUES, ["c0", "c1", "c2"], ["h.a", "h.b"])),
       messages=timed_messages(VALUES, "h.t"), data=st.data())
def test_generic_format_agrees_with_the_reference(tmp_path_factory, rules_text, messages, data):
    """Every shape of condition (and, or, not over header predicates, aggregates of every kind and
    named counters) over a spec with other names and a message type the rules never classify,
    messages built with scapy into one BinaryFILE cut into splits of 0 to 200 bytes: every
    classified message's ports are the reference's, in trace order."""
    tmp = tmp_path_factory.mktemp("gen")
    spec, rules, res = compiled(GENERIC_SPEC, rules_text + "\n", tmp)
    assume(res.ir.state is not None)  # the drawn conditions may compare no state: the stateless job's tests
    M, N = _generic_classes()
    body, want = [], []
    ref = StatefulReference(rules, spec)
    for t, msg in messages:
        if data.draw(st.integers(0, 4), label="noise") == 0:
            body.append(bytes(N(x=data.draw(st.integers(0, 65535), label="x"))))
        body.append(bytes(M(a=msg["h.a"], b=msg["h.b"], c=msg["h.c"], e=msg["h.e"], t=t)))
        want.append(sorted(ref.decide(msg, t).ports))
    (tmp / "t.bin").write_bytes(binaryfile(body))
    split = data.draw(st.sampled_from([0, 1, 60, 200]), label="split bytes")
    got, outcome = run_job(res, [str(tmp / "t.bin")], split, tmp)
    assert got == want, rules_text
    assert outcome.disagreements == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["count", "sum", "min", "max", "avg"]), field=st.sampled_from(AGG_FIELDS),
       window=st.sampled_from([None, 0, 1, 5]), skip=st.sampled_from(VALUES["h.c"]),
       messages=timed_messages(VALUES, "h.t"), data=st.data())
def test_aggregate_values_are_exact(tmp_path_factory, kind, field, window, skip, messages, data):
    """An aggregate updated by the messages whose ``h.c`` differs from a drawn value and compared
    with ``==`` (``avg``: also ``>=``) against 1 to 3 values it takes on the sequence, or one off:
    an update that adds or keeps the wrong value, or a window moved at the wrong time, changes
    some decision of the job (splits of 0 to 200 bytes)."""
    from fractions import Fraction

    tmp = tmp_path_factory.mktemp("probe")
    args = ([] if kind == "count" else [field]) + ([f"window={window}"] if window is not None else [])
    call, cond = f"{kind}({', '.join(args)})", f"h.c != {skip}"
    spec = parse_spec(GENERIC_SPEC, str(tmp / "spec.p4"))
    probe = parse_rules(f"{cond} and {call} == 0 : fwd(1);\n", spec)[0]
    agg = state_predicates(probe.condition)[0].agg
    ref = StatefulReference([probe], spec)
    taken = []
    for t, msg in messages:
        ref.decide(msg, t)
        v = ref.value(probe, agg)
        if v is not None:
            taken.append(v)
    lines = []
    for k, v in enumerate(data.draw(st.lists(st.sampled_from(taken or [0]), min_size=1, max_size=3), label="values")):
        v = v + data.draw(st.sampled_from([0, 0, 1, -1]), label="off") if v >= 1 else v
        if kind in ("min", "max", "avg"):  # a literal fits the field
            v = min(v, (1 << spec.query_fields[field].width) - 1)
        if isinstance(v, Fraction) and v.denominator != 1:
            lines.append(f"{cond} and {call} >= {v.numerator // v.denominator} : fwd({k + 1});")
        else:
            lines.append(f"{cond} and {call} == {int(v)} : fwd({k + 1});")
    rules_text = "\n".join(lines) + "\n"
    spec, rules, res = compiled(GENERIC_SPEC, rules_text, tmp)
    M, _ = _generic_classes()
    (tmp / "t.bin").write_bytes(binaryfile([bytes(M(a=m["h.a"], b=m["h.b"], c=m["h.c"], e=m["h.e"], t=t))
                                            for t, m in messages]))
    want_ref = StatefulReference(rules, spec)
    want = [sorted(want_ref.decide(m, t).ports) for t, m in messages]
    got, _ = run_job(res, [str(tmp / "t.bin")], data.draw(st.sampled_from([0, 1, 60, 200]), label="split"), tmp)
    assert got == want, rules_text


def outcome_doc(outcome) -> dict:
    """What a stateful pass found, comparable between runs (counts as sorted rows)."""
    import pyarrow as pa

    counts = pa.Table.from_batches(outcome.counts).to_pylist() if outcome.counts else []
    return {
        "counts": sorted(counts, key=repr),
        "disagreements": outcome.disagreements,
        "examples": outcome.examples,
        "rule_hits": outcome.rule_hits.tolist(),
        "no_match": outcome.no_match,
        "value_classes": outcome.value_classes,
        "one_by_one": outcome.one_by_one,
        "simulated": outcome.simulated,
        "copies": dict(outcome.copies),
    }


@SETTINGS
@given(rules_text=with_stateless_rules(st.one_of(
    st.tuples(itch_stateful_rules(), itch_stateful_rules(), itch_counter_rules()).map("".join),
    st.tuples(itch_stateful_rules(), itch_stateful_rules()).map("".join))), data=st.data())
def test_groups_run_in_parallel_decide_as_the_sequential_pass(tmp_path_factory, rules_text, data):
    """The one-at-a-time work cut into groups that share no state (aggregates by rule, named
    counters, the tables' register footprints), run as up to 6 tasks in a shuffled order, gives
    exactly what one task in trace order gives (decisions, counts, hits, copies) and what the
    reference decides; with named counters only the messages whose footprint is not empty run
    through the table simulator."""
    tmp = tmp_path_factory.mktemp("par")
    spec_text = COUNTER_SPEC if "seen" in rules_text or "volume" in rules_text else TIMED_SPEC
    spec, rules, res = compiled(spec_text, rules_text, tmp)
    msgs = drawn_messages(data, 80)
    (tmp / "t.bin").write_bytes(binaryfile([m for m, _ in msgs]))
    traces = [str(tmp / "t.bin")]
    split_bytes = data.draw(st.sampled_from([0, 200, 600]), label="split bytes")
    order = data.draw(st.randoms(use_true_random=False), label="task order")

    def shuffled(fn, tasks):
        out = [None] * len(tasks)
        for k in order.sample(range(len(tasks)), len(tasks)):
            out[k] = fn(tasks[k])
        return out

    (tmp / "seq").mkdir()
    (tmp / "par").mkdir()
    seq_rows, seq = run_job(res, traces, split_bytes, tmp / "seq", tasks=1, runner=lambda fn, ts: [fn(t) for t in ts])
    par_rows, par = run_job(res, traces, split_bytes, tmp / "par", tasks=data.draw(st.integers(2, 6)), runner=shuffled)
    assert par_rows == seq_rows == reference_ports(res, spec, msgs)
    assert outcome_doc(par) == outcome_doc(seq)
    assert seq.disagreements == 0
    assert seq.tasks <= 2 and (par.tasks >= seq.tasks)
    if seq.tables_one_by_one:
        classified = sum(1 for _, v in msgs if v is not None)
        assert par.simulated <= classified
    event(f"tasks: {min(par.tasks, 3)}")


@st.composite
def per_symbol_rules(draw):
    """Rules that each test one stock, so that messages of different stocks share no aggregate:
    counts and averages per stock, rate limits sharing the counter ``seen`` and a volume counter
    summed on some stocks and compared on others (the counters join their stocks' groups)."""
    stocks = draw(st.lists(st.sampled_from(SYMBOLS), min_size=2, max_size=4, unique=True))
    lines = []
    for s in stocks:
        for _ in range(draw(st.integers(1, 2))):
            port = draw(st.integers(1, 5))
            shape = draw(st.sampled_from(["count", "avg", "limit", "sum", "volume"]))
            if shape == "count":
                lines.append(f'add_order.stock == "{s}" and count(window=5) > {draw(st.integers(0, 3))} : fwd({port});')
            elif shape == "avg":
                x = draw(st.sampled_from(LITERALS["add_order.price"][1:]))
                lines.append(f'add_order.stock == "{s}" and avg(add_order.price, window=5) > {x} : fwd({port});')
            elif shape == "limit":
                lines.append(f'add_order.stock == "{s}" and seen < {draw(st.integers(1, 3))} : fwd({port}), inc(seen);')
            elif shape == "sum":
                lines.append(f'add_order.stock == "{s}" : volume <- sum(add_order.shares);')
            else:
                v = draw(st.sampled_from([0, 100, 1000]))
                lines.append(f'add_order.stock == "{s}" and volume > {v} : fwd({port});')
    return stocks, "\n".join(lines) + "\n"


@st.composite
def dense_messages(draw, stocks):
    """Add Orders of ``stocks`` (and deletes) with times that mostly stay in one window."""
    from test_p4_multi_message import _itch_classes
    from test_stateful_bmv2 import AGG_VALUES

    AddOrder, _, Delete, _ = _itch_classes()
    t = draw(st.integers(0, 3000))
    out = []
    for _ in range(draw(st.integers(1, 80), label="n")):
        t = max(0, t + draw(st.sampled_from([0, 0, 1, 1, 7, 999, 1000, 5000, -1])))
        if draw(st.integers(0, 9)) == 0:
            out.append((bytes(Delete(ref=1, timestamp=t)), None))
            continue
        stock = draw(st.sampled_from(stocks)).encode().ljust(8)
        shares = draw(st.sampled_from(AGG_VALUES["add_order.shares"]))
        price = draw(st.sampled_from(AGG_VALUES["add_order.price"]))
        out.append((bytes(AddOrder(type=b"A", timestamp=t, side=b"B", shares=shares, stock=stock, price=price)),
                    {"add_order.stock": int.from_bytes(stock, "big"), "add_order.shares": shares,
                     "add_order.price": price, "add_order.buy_sell_indicator": ord("B"), "add_order.timestamp": t}))
    return out


@SETTINGS
@given(drawn=per_symbol_rules(), data=st.data())
def test_groups_per_stock_decide_as_the_sequential_pass(tmp_path_factory, drawn, data):
    """Groups per stock (joined by the counters they share) run as separate tasks, last first:
    the tables' and the reference's decisions, hits and counts are the sequential pass's."""
    stocks, rules_text = drawn
    tmp = tmp_path_factory.mktemp("grp")
    spec, rules, res = compiled(COUNTER_SPEC, rules_text, tmp)
    msgs = data.draw(dense_messages(stocks))
    (tmp / "t.bin").write_bytes(binaryfile([m for m, _ in msgs]))
    traces = [str(tmp / "t.bin")]
    split_bytes = data.draw(st.sampled_from([0, 200]), label="split bytes")
    (tmp / "seq").mkdir()
    (tmp / "par").mkdir()
    seq_rows, seq = run_job(res, traces, split_bytes, tmp / "seq", tasks=1, runner=lambda fn, ts: [fn(t) for t in ts])
    par_rows, par = run_job(res, traces, split_bytes, tmp / "par", tasks=4)
    assert par_rows == seq_rows == reference_ports(res, spec, msgs)
    assert outcome_doc(par) == outcome_doc(seq)
    assert par.disagreements == 0
    event(f"tasks: {min(par.tasks, 4)}")
