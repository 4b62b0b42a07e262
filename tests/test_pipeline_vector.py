"""The data pipeline's vectorised parts, without Spark: differential tests of the NumPy table
evaluator against the table simulator and of the value-class reference against the per-packet
reference, and the trace readers against :mod:`subc.workloads.itch_codec` (an ITCH codec that does not use
the spec: the readers and the spec's decoder must agree with it on the example spec)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.backends.p4.entries import entries_doc
from subc.errors import SubcError
from subc.analysis.evaluate import representatives
from subc.analysis.messages import decode
from subc.analysis.reference_np import ValueClasses, evaluate_rules
from subc.analysis.splits import file_kind, plan_splits, read_pcap, read_split, walk_binaryfile
from subc.wire.capture import CaptureStats
from subc.analysis.tables_np import PipelineEvaluator
from subc.workloads.itch_codec import decode_add_order, read_binaryfile
from subc.semantics.reference import reference_decision
from subc.sim.switch import TableSimulator

from conftest import EXAMPLE, real_sample
from strategies import boundary_packets, rule_set
from test_differential import FIELDS, SPEC

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _example_vector():
    from subc.spec.front_end import load_spec
    from subc.analysis.gather import VectorDecoder
    from subc.wire.decoder import MessageDecoder

    return VectorDecoder(MessageDecoder(load_spec(EXAMPLE / "spec.p4")))


VECTOR = _example_vector()
TYPES = VECTOR.decoder.types


def _columns(pkts):
    return {f: np.array([p[f] for p in pkts], dtype=np.uint64) for f in FIELDS}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rule_set(FIELDS, allow_drop=True), st.sampled_from(["bmv2", "tofino"]), st.data())
def test_numpy_tables_agree_with_the_table_simulator_and_the_reference(fields_text, target, data):
    _, text = fields_text
    rules = parse_rules(text, SPEC, "gen.sub")
    try:
        res = compile_rules(rules, SPEC, target)
    except SubcError:
        return  # conflicting actions: covered by test_differential
    doc = entries_doc(res.pipeline, target)
    ev, sim = PipelineEvaluator(doc), TableSimulator(doc)
    pkts = boundary_packets(rules, FIELDS, data.draw)
    codes = ev.decide(_columns(pkts))
    for p, c in zip(pkts, codes):
        assert ev.decisions[c] == sim.process(p), p
        assert ev.decisions[c] == reference_decision(rules, SPEC, p), p


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rule_set(FIELDS), st.data())
def test_value_class_reference_agrees_with_the_per_packet_reference(fields_text, data):
    _, text = fields_text
    rules = parse_rules(text, SPEC, "gen.sub")
    pkts = boundary_packets(rules, FIELDS, data.draw)
    classes = ValueClasses(rules)
    keys = classes.key(_columns(pkts))
    uniq, inv = np.unique(keys, return_inverse=True)
    try:
        ref = evaluate_rules(rules, SPEC, representatives(classes, uniq), np.bincount(inv))
    except SubcError:
        with pytest.raises(SubcError):
            for p in pkts:
                reference_decision(rules, SPEC, p)
        return
    hits = np.zeros(len(rules), dtype=np.int64)
    for p, k in zip(pkts, inv):
        assert ref.decisions[k] == reference_decision(rules, SPEC, p), p
        for r in rules:
            from subc.lang.ast import evaluate

            hits[r.index] += evaluate(r.condition, p)
    assert hits.tolist() == ref.rule_hits.tolist()


def test_equality_index_matches_a_full_evaluation(example_spec):
    """Rules with a top-level ``==`` go through the per-value buckets; with the index disabled the
    same rules must give the same decisions and hits."""
    from subc.analysis import reference_np
    from subc.workloads.itch_codec import stock_value
    from subc.workloads.distributions import symbol_names
    from subc.workloads.itch_rules import itch_rules

    rules = parse_rules(itch_rules(400, symbols=20, seed=4) + itch_rules(100, symbols=20, seed=5, form="camus"),
                        example_spec)
    rng = np.random.default_rng(1)
    syms = np.array([stock_value(s) for s in symbol_names(25)], dtype=np.uint64)
    n = 4000
    cols = {f: np.zeros(n, np.uint64) for f in example_spec.query_fields}
    cols["add_order.stock"] = syms[rng.integers(0, 25, n)]
    cols["add_order.price"] = rng.integers(0, 2_000_000, n).astype(np.uint64)
    cols["add_order.shares"] = rng.integers(0, 1200, n).astype(np.uint64)
    classes = ValueClasses(rules)
    uniq, inv = np.unique(classes.key(cols), return_inverse=True)
    reps, counts = representatives(classes, uniq), np.bincount(inv)
    fast = evaluate_rules(rules, example_spec, reps, counts)
    orig = reference_np._index_column
    try:
        reference_np._index_column = lambda shape: None
        full = evaluate_rules(rules, example_spec, reps, counts)
    finally:
        reference_np._index_column = orig
    assert fast.decisions == full.decisions
    assert fast.rule_hits.tolist() == full.rule_hits.tolist()
    assert fast.rule_hits.sum() > 0


@pytest.mark.parametrize("name", ["ex20101224.TEST_ITCH_50", "ex20101224.TEST_ITCH_50.reframed"])
@pytest.mark.parametrize("split_bytes", [0, 7_000, 100_000])
def test_splits_read_every_message_once(name, split_bytes):
    path = real_sample(name)
    expected = [(o, m) for o, m in read_binaryfile(path)]
    splits = plan_splits([str(path)], split_bytes, TYPES)
    if split_bytes:
        assert len(splits) > 1
    got = []
    for sp in splits:
        buf = read_split(sp, TYPES)
        got.extend((int(p), bytes(buf.data[s : s + n])) for p, s, n in zip(buf.positions, buf.starts, buf.lengths))
    assert got == expected


def test_decoded_columns_equal_the_per_message_decoder():
    path = real_sample()
    buf = read_split(plan_splits([str(path)], 0, TYPES)[0], TYPES)
    batch, vd = decode(buf, 3, VECTOR)
    rows = batch.to_pylist()
    adds = [(o, decode_add_order(m)) for o, m in read_binaryfile(path) if m[:1] in (b"A", b"F")]
    got = [r for r in rows if r["type"] in ("A", "F")]
    assert len(got) == len(adds) == int(vd.valid["add_order"].sum()) == 5000
    assert {r["status"] for r in rows} == {"ok"} and len(rows) == 12012
    for r, (o, d) in zip(got, adds):
        assert r["file_index"] == 3 and r["position"] == o
        assert (r["add_order__shares"], r["add_order__price"]) == (d["add_order.shares"], d["add_order.price"])
        assert r["add_order__stock"] == d["add_order.stock"].to_bytes(8, "big").decode().rstrip()
        assert r["add_order__buy_sell_indicator"] == chr(d["add_order.buy_sell_indicator"])
    others = [r for r in rows if r["type"] not in ("A", "F")]
    assert all(r["add_order__shares"] is None for r in others)
    for f in ("add_order.shares", "add_order.price", "add_order.stock", "add_order.buy_sell_indicator"):
        assert vd.values[f][vd.valid["add_order"]].tolist() == [d[f] for _, d in adds]


def test_corrupt_binaryfile_names_the_file_and_byte_offset():
    data = real_sample("ex20101224.TEST_ITCH_50.reframed").read_bytes()
    bad = data[:14] + b"\x00\x26" + data[16:]  # the Stock Directory at byte 14 claims 38 bytes
    with pytest.raises(SubcError, match=r"day\.itch: message type b'R' at byte offset 14 has length 38, expected 39"):
        walk_binaryfile(bad, 0, "day.itch", True, TYPES)
    with pytest.raises(SubcError, match=r"day\.itch: message of 12 bytes at byte offset 465034 runs past the end"):
        walk_binaryfile(data[:-5], 0, "day.itch", True, TYPES)
    with pytest.raises(SubcError, match=r"crosses the split point at byte offset 465043"):
        walk_binaryfile(data[:-5], 0, "day.itch", False, TYPES)
    with pytest.raises(SubcError, match=r"zero length prefix followed by a message type the spec gives no length for "
                                        r"\(b'\\x07'\) at byte offset 14"):
        walk_binaryfile(data[:14] + b"\x00\x00\x07" + data[17:], 0, "day.itch", True, TYPES)


def test_pcap_with_several_messages_per_packet(tmp_path):
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    from subc.wire.moldudp64 import encode_packet

    msgs = [m for _, m in read_binaryfile(real_sample())][:50]
    frames = []
    for k in range(0, 50, 7):
        frames.append(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1, dport=26400)
                      / encode_packet("S1", k + 1, msgs[k : k + 7]))
    frames.append(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1, dport=53) / b"not mold")
    path = tmp_path / "feed.pcap"
    wrpcap(str(path), frames)
    buf = read_pcap(str(path), udp_port=26400)
    assert [bytes(buf.data[s : s + n]) for s, n in zip(buf.starts, buf.lengths)] == msgs
    assert buf.positions.tolist() == [1 + i // 7 for i in range(50)]
    assert buf.indexes.tolist() == [i % 7 for i in range(50)]
    # without a port the feed port is detected: the DNS-port datagram is counted, not read as MoldUDP64
    stats = CaptureStats()
    buf = read_pcap(str(path), stats=stats)
    assert [bytes(buf.data[s : s + n]) for s, n in zip(buf.starts, buf.lengths)] == msgs
    assert (stats.frames, stats.feed_datagrams, stats.other_udp, stats.feed_ports) == (9, 8, 1, [26400])
    with pytest.raises(SubcError, match=r"feed\.pcap: frame 9: other_udp: .* byte offset \d+"):
        read_pcap(str(path), strict=True)
    stats = CaptureStats()
    read_pcap(str(path), ports=[26400, 53], stats=stats)  # every UDP datagram read as MoldUDP64
    assert (stats.moldudp64_packets, stats.malformed_moldudp64) == (8, 1)
    assert stats.examples["malformed_moldudp64"][0][0] == 9
    with pytest.raises(SubcError, match=r"feed\.pcap: frame 9: malformed_moldudp64: MoldUDP64: truncated header"):
        read_pcap(str(path), ports=[26400, 53], strict=True)
    from scapy.utils import wrpcapng

    ng = tmp_path / "feed.pcapng"
    wrpcapng(str(ng), frames[:-1])
    assert file_kind(str(ng)) == "pcap"
    buf = read_pcap(str(ng))
    assert [bytes(buf.data[s : s + n]) for s, n in zip(buf.starts, buf.lengths)] == msgs


def test_a_frame_inside_a_message_that_ends_at_the_file_end_is_no_split_point(tmp_path):
    """One Add Order of 12 shares of "SPY": its bytes from the shares' low half on read as a
    well-formed 12-byte 'S' frame that ends exactly at the end of the file.  Splits of a few bytes
    must still read the one message (the planner took that "frame" for a split point, and the
    task then failed: "crosses the split point")."""
    from test_p4_multi_message import _itch_classes

    AddOrder = _itch_classes()[0]
    msg = bytes(AddOrder(type=b"A", timestamp=1, side=b"B", shares=12, stock=b"SPY".ljust(8), price=100))
    assert len(msg) == 36 and msg[22:25] == b"\x00\x0cS"  # the false frame: length 12, type 'S', to the end
    path = tmp_path / "one.itch"
    path.write_bytes(len(msg).to_bytes(2, "big") + msg)
    for split_bytes in (1, 8, 24):
        got = []
        for sp in plan_splits([str(path)], split_bytes, TYPES):
            buf = read_split(sp, TYPES)
            got += [bytes(buf.data[s : s + n]) for s, n in zip(buf.starts, buf.lengths)]
        assert got == [msg], split_bytes


def _walk(data: bytes, last: bool, native: bool):
    """walk_binaryfile's buffer as lists, or its error's text, with or without the C walk."""
    from subc.analysis import splits

    saved = splits.frame_walk
    if not native:
        splits.frame_walk = lambda: None
    try:
        buf = walk_binaryfile(data, 100, "t.itch", last, TYPES)
        return [a.tolist() for a in (buf.starts, buf.lengths, buf.positions, buf.indexes, buf.zero_length)]
    except SubcError as e:
        return str(e)
    finally:
        splits.frame_walk = saved


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(st.one_of(
    st.binary(min_size=1, max_size=40).map(lambda m: len(m).to_bytes(2, "big") + m),  # any length
    st.sampled_from([b"\x00\x00S" + bytes(11), b"\x00\x00A" + bytes(35), b"\x00\x00\x07"]),  # zero-length quirk
    st.sampled_from([b"\x00\x00", b"\x00", b"\x00\x05ab"])), max_size=30), last=st.booleans())
def test_the_c_frame_walk_equals_the_python_loop(frames, last):
    """Frames, zero-length prefixes before known and unknown types, an end-of-session marker, a
    truncated length, a message running past the end: the C walk and the Python loop give the
    same messages, or the same error."""
    from subc.analysis.splits import frame_walk

    assert frame_walk() is not None, "no C compiler: the C walk is not tested"
    data = b"".join(frames)
    assert _walk(data, last, True) == _walk(data, last, False)


@given(
    st.lists(st.tuples(st.integers(-1, 90), st.integers(-3, 40)), max_size=60),
    st.booleans(),
)
def test_type_decision_pairs_dense_and_sorted_agree(pairs, wide):
    """The dense count of (type, decision) cells and the sort it replaces give the same pairs in
    the same order and the same index per message (``wide``: type keys too far apart for cells)."""
    from subc.analysis import evaluate

    t = np.array([p[0] for p in pairs], np.int64) * (10**10 if wide else 1)  # type keys below 9 * 10**12
    d = np.array([p[1] for p in pairs], np.int64)
    key = (t + 1) * 1_000_003 + (d + 3)
    uniq, inv = np.unique(key, return_inverse=True)
    k_type, k_dec, k_inv = evaluate.type_decision_pairs(t, d)
    assert k_type.tolist() == (uniq // 1_000_003 - 1).tolist()
    assert k_dec.tolist() == (uniq % 1_000_003 - 3).tolist()
    assert k_inv.tolist() == inv.ravel().tolist()


def test_decision_codes_number_new_decisions_in_order_of_first_use():
    """One ``code_of`` per distinct object, in order of first appearance: new codes as one call
    per decision would give them."""
    from subc.analysis.analyze import decision_codes
    from subc.semantics.reference import Decision

    class Tables:
        def __init__(self):
            self.decisions: list = []

        def code_of(self, d):
            if d not in self.decisions:
                self.decisions.append(d)
            return self.decisions.index(d)

    a, b, c = Decision((1,), None), Decision((2, 3), None), Decision((1,), None)  # a == c, other objects
    seq = [b, a, b, c, a]
    one_by_one, at_once = Tables(), Tables()
    expected = [one_by_one.code_of(d) for d in seq]
    assert decision_codes(at_once, seq).tolist() == expected
    assert at_once.decisions == one_by_one.decisions
    assert decision_codes(Tables(), []).tolist() == []
