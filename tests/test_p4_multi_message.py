"""Multi-message delivery on the P4 targets (docs/p4-messages.md "P4: every message of a datagram").

Datagrams of up to K messages of mixed types, more than K, heartbeats, end of session and
datagrams the switch cannot split are built with scapy from values (ITCH 5.0 layouts written
here, section 1.3 of the ITCH 5.0 specification, or random specs of ``tests/spec_model.py``); the
expected copies per port come from the rules evaluated on those values
(:func:`subc.lang.ast.evaluate`) and the delivery semantics written out here.  The v1model
program runs in BMv2 ``simple_switch`` (``--use-files``: pcap files, no network); the table
simulator's :class:`~subc.sim.switch.SwitchSimulator` must give the same copies.  Tests
that need p4c/BMv2 skip when they are absent; rendering, entries and options need nothing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from subc.backends.p4.entries_doc import EntriesDoc
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from bmv2_util import CLI, SWITCH, cli, run_on_pcaps
from conftest import EXAMPLE

P4C = shutil.which("p4c-bm2-ss")
P4TEST = shutil.which("p4test")
NEEDS_BMV2 = pytest.mark.skipif(None in (P4C, SWITCH, CLI), reason="p4c-bm2-ss, simple_switch or a runnable simple_switch_CLI not on PATH")

SPEC = EXAMPLE / "spec.p4"
K = 4
OVERFLOW = 7
SWITCH_PORTS = range(0, 8)
COUNTER_NAMES = ("classified", "heartbeat", "too_many", "unframed", "malformed", "not_feed")

# ------------------------------------------------------------------------------------------
# ITCH 5.0 messages with scapy (section 1.3: type, stock locate, tracking number, timestamp...)
# ------------------------------------------------------------------------------------------


def _itch_classes():
    from scapy.fields import BitField, IntField, LongField, ShortField, StrFixedLenField
    from scapy.packet import Packet

    common = [ShortField("locate", 0), ShortField("tracking", 0), BitField("timestamp", 0, 48)]

    class AddOrder(Packet):
        name = "ITCH Add Order"
        fields_desc = [StrFixedLenField("type", b"A", 1), *common, LongField("ref", 0),
                       StrFixedLenField("side", b"B", 1), IntField("shares", 0), StrFixedLenField("stock", b"", 8),
                       IntField("price", 0)]

    class AddOrderMPID(Packet):
        name = "ITCH Add Order MPID"
        fields_desc = AddOrder.fields_desc[:] + [StrFixedLenField("attribution", b"NSDQ", 4)]

    class Delete(Packet):
        name = "ITCH Order Delete"
        fields_desc = [StrFixedLenField("type", b"D", 1), *common, LongField("ref", 0)]

    class SystemEvent(Packet):
        name = "ITCH System Event"
        fields_desc = [StrFixedLenField("type", b"S", 1), *common, StrFixedLenField("event", b"O", 1)]

    return AddOrder, AddOrderMPID, Delete, SystemEvent


SYMBOLS = ["BOB", "CHAR", "ALC", "ZVZZT"]


@st.composite
def itch_messages(draw):
    """(message bytes, field values of add_order or None)."""
    AddOrder, AddOrderMPID, Delete, SystemEvent = _itch_classes()
    kind = draw(st.sampled_from(["A", "A", "A", "F", "D", "S"]))
    ref = draw(st.integers(0, 2**64 - 1))
    if kind in "AF":
        stock = draw(st.sampled_from(SYMBOLS)).encode().ljust(8)
        shares = draw(st.one_of(st.sampled_from([0, 1, 99, 100, 499, 500, 999, 1000, 5000]), st.integers(0, 2**32 - 1)))
        price = draw(st.one_of(st.sampled_from([0, 99999, 100000, 200000, 250000, 250001]), st.integers(0, 2**32 - 1)))
        side = draw(st.sampled_from([b"B", b"S"]))
        cls = AddOrder if kind == "A" else AddOrderMPID
        pkt = cls(type=kind.encode(), ref=ref, side=side, shares=shares, stock=stock, price=price)
        values = {"add_order.stock": int.from_bytes(stock, "big"), "add_order.shares": shares,
                  "add_order.price": price, "add_order.buy_sell_indicator": side[0]}
        return bytes(pkt), values
    if kind == "D":
        return bytes(Delete(ref=ref)), None
    return bytes(SystemEvent(event=b"Q")), None


@st.composite
def itch_rules(draw):
    """Rule text (1 to 5 rules over the Add Order fields, fwd to ports 1..5) and its fwd ports."""
    lines = []
    for _ in range(draw(st.integers(1, 5))):
        preds = []
        for _ in range(draw(st.integers(1, 2))):
            kind = draw(st.sampled_from(["stock", "stock_in", "shares", "price", "side"]))
            if kind == "stock":
                preds.append(f'stock == "{draw(st.sampled_from(SYMBOLS))}"')
            elif kind == "stock_in":
                s = draw(st.lists(st.sampled_from(SYMBOLS), min_size=1, max_size=3, unique=True))
                preds.append("stock in {" + ", ".join(f'"{x}"' for x in s) + "}")
            elif kind == "shares":
                preds.append(f"shares {draw(st.sampled_from(['<', '>', '>=', '<=']))} {draw(st.sampled_from([100, 500, 1000]))}")
            elif kind == "price":
                preds.append(f"price {draw(st.sampled_from(['<', '>']))} {draw(st.sampled_from([10, 20, 25]))}")
            else:
                preds.append(f'buy_sell_indicator == "{draw(st.sampled_from("BS"))}"')
        ports = draw(st.lists(st.integers(1, 5), min_size=1, max_size=2, unique=True))
        lines.append(f"{' and '.join(preds)} : fwd({', '.join(map(str, ports))});")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# Frames and the expected copies
# ------------------------------------------------------------------------------------------


def mold_payload(messages: list[bytes], seq: int, count: int | None = None, session: bytes = b"SESSION001",
                 lengths: list[int] | None = None) -> bytes:
    """MoldUDP64 downstream packet (MoldUDP64 v1.00): session, sequence number, count, blocks."""
    c = len(messages) if count is None else count
    lens = lengths or [len(m) for m in messages]
    return session + seq.to_bytes(8, "big") + c.to_bytes(2, "big") + b"".join(
        n.to_bytes(2, "big") + m for n, m in zip(lens, messages))


def frame(payload: bytes, dport: int) -> bytes:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.0.0.1", dst="10.0.0.2")
                 / UDP(sport=40000, dport=dport) / Raw(payload))


class Feed:
    """The input datagrams and, per port, the UDP payloads the switch must send, in order."""

    def __init__(self, ports: list[int], decide):
        self.ports, self.decide = ports, decide
        self.frames: list[bytes] = []
        self.payloads: list[bytes] = []
        self.feed_frame: list[bool] = []
        self.want: dict[int, list[bytes]] = {p: [] for p in list(ports) + [OVERFLOW]}
        self.next = {p: 1 for p in ports}
        self.counts = dict.fromkeys(COUNTER_NAMES, 0)
        self.seq = 1

    def add(self, payload: bytes, dport: int, feed: bool = True) -> None:
        self.frames.append(frame(payload, dport))
        self.payloads.append(payload)
        self.feed_frame.append(feed)

    def data(self, msgs: list[tuple[bytes, object]], dport: int) -> None:
        """A datagram of ``msgs`` ((bytes, values or None)); more than K: whole to the overflow port."""
        payload = mold_payload([m for m, _ in msgs], self.seq)
        self.seq += len(msgs)
        self.add(payload, dport)
        if len(msgs) > K:
            self.whole(payload, "too_many")
            return
        self.counts["classified"] += 1
        per: dict[int, list[bytes]] = {}
        for m, values in msgs:
            for p in self.decide(values):
                per.setdefault(p, []).append(m)
        for p, ms in sorted(per.items()):
            self.want[p].append(mold_payload(ms, self.next[p]))
            self.next[p] += len(ms)

    def heartbeat(self, dport: int, count: int = 0) -> None:
        payload = mold_payload([], self.seq, count)
        self.add(payload, dport)
        self.counts["heartbeat"] += 1
        for p in self.ports:
            self.want[p].append(mold_payload([], self.next[p], count))

    def whole(self, payload: bytes, reason: str) -> None:
        self.counts[reason] += 1
        self.want[OVERFLOW].append(payload)


def check_copy(raw: bytes, payload: bytes) -> None:
    """``raw`` (a frame the switch sent) carries ``payload`` with right lengths and checksums."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    e = Ether(raw)
    assert bytes(e[UDP].payload) == payload
    assert e[IP].len == 20 + 8 + len(payload) and e[UDP].len == 8 + len(payload)
    ip_sum, udp_sum = e[IP].chksum, e[UDP].chksum
    del e[IP].chksum, e[UDP].chksum
    again = Ether(bytes(e))
    assert ip_sum == again[IP].chksum, "IPv4 checksum"
    assert udp_sum == again[UDP].chksum, "UDP checksum"


# ------------------------------------------------------------------------------------------
# BMv2
# ------------------------------------------------------------------------------------------


def run_bmv2(out: Path, work: Path, frames: list[bytes], done) -> tuple[dict[int, list[bytes]], dict[str, int]]:
    """Run ``out/subc.json`` with ``out/commands.txt`` in simple_switch over pcap files in ``work``
    (:func:`bmv2_util.run_on_pcaps`): ``frames`` in on port 0; returns (port -> frames out,
    datagram counters) once ``done(outputs)`` holds."""

    def counters(thrift: int) -> dict[str, int]:
        cmds = "".join(f"counter_read SubcIngress.subc_datagrams {i}\n" for i in range(len(COUNTER_NAMES)))
        text = cli(thrift, cmds)
        counts = {COUNTER_NAMES[int(i)]: int(n) for i, n in re.findall(r"subc_datagrams\[(\d+)\]=\s*\(\d+ bytes, (\d+) packets\)", text)}
        assert len(counts) == len(COUNTER_NAMES), text
        return counts

    return run_on_pcaps(out, work, frames, SWITCH_PORTS, done, counters, separate_device=True)


def compile_p4(rules_path: Path, spec_path: Path, out: Path, k: int = K, overflow: int | None = OVERFLOW) -> dict:
    args = [sys.executable, "-m", "subc.cli", "compile", str(rules_path), "--spec", str(spec_path), "--target", "bmv2",
            "-o", str(out), "--max-messages", str(k)]
    if overflow is not None:
        args += ["--overflow-port", str(overflow)]
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads((out / "entries.json").read_text())


def decide_by_rules(rules, fields_used: set[str]):
    """values -> sorted ports: the union of the fwd ports of the rules the values match; a message
    without values (another type) or without a field the rules test gets the default action,
    which forwards nowhere."""
    from subc.lang.ast import evaluate

    def decide(values):
        if values is None or not fields_used <= set(values):
            return []
        ports = set()
        for r in rules:
            if evaluate(r.condition, values):
                ports.update(a[1] for a in r.atoms() if a[0] == "fwd")
        return sorted(ports)

    return decide


def verify(feed: Feed, outs: dict[int, list[bytes]], counts: dict[str, int]) -> None:
    for p in SWITCH_PORTS:
        got = outs.get(p, [])
        want = feed.want.get(p, [])
        assert len(got) == len(want), (p, len(got), len(want))
        for raw, payload in zip(got, want):
            check_copy(raw, payload)
    assert counts == feed.counts


def simulate(doc: dict, spec, feed: Feed) -> dict[int, list[bytes]]:
    """The table simulator's copies of the feed's datagrams (decoded by subc's decoder: the
    values side; the copies are compared with the test's own expectation)."""
    from subc.wire.decoder import MessageDecoder
    from subc.sim.switch import SwitchSimulator

    dec = MessageDecoder(spec)

    def decode(msg, network):
        d = dec.decode(msg, network=network)
        return (d.values, d.valid) if d.status == "ok" else None

    sim = SwitchSimulator(EntriesDoc.from_json(doc), decode)
    got: dict[int, list[bytes]] = {}
    for f, payload, ours in zip(feed.frames, feed.payloads, feed.feed_frame):
        if not ours:
            continue
        for p, copy in sim.datagram(payload, dec.network(f)).items():
            got.setdefault(p, []).append(copy)
    assert dict(sim.counters) == {k: v for k, v in feed.counts.items() if v and k != "not_feed"}
    return got


def load(rules_text: str, spec_path: Path, tmp: Path):
    """(spec, rules, fields the rules test) of ``rules_text`` over the spec at ``spec_path``."""
    from subc.lang.ast import predicates
    from subc.lang.rules import load_rules
    from subc.spec.front_end import load_spec

    spec = load_spec(spec_path)
    (tmp / "r.sub").write_text(rules_text)
    rules = load_rules(tmp / "r.sub", spec)
    return spec, rules, {p.field for r in rules for p in predicates(r.condition)}


def _tail(feed: Feed, msgs, dport: int) -> None:
    """Datagrams the switch cannot split, then the sentinels: end of session to every port, and
    an oversize datagram to the overflow port."""
    m0 = msgs[0][0]
    p = mold_payload([m0, b"Z" + m0[1:]], feed.seq)  # a type the spec does not parse
    feed.add(p, dport)
    feed.whole(p, "unframed")
    p = mold_payload([m0], feed.seq, lengths=[len(m0) + 1]) + b"\0"  # block length != type length
    feed.add(p, dport)
    feed.whole(p, "unframed")
    p = mold_payload([m0, m0], feed.seq, count=3)  # fewer messages than the count
    feed.add(p, dport)
    feed.whole(p, "malformed")
    p = mold_payload([m0, m0], feed.seq, count=1)  # bytes after the last message
    feed.add(p, dport)
    feed.whole(p, "malformed")
    feed.add(b"not a feed datagram", 9999, feed=False)
    feed.counts["not_feed"] += 1
    feed.heartbeat(dport, 0xFFFF)
    sentinel = mold_payload([m0] * (K + 1), feed.seq, session=b"SENTINEL00")
    feed.add(sentinel, dport)
    feed.whole(sentinel, "too_many")


def _done(feed: Feed):
    def done(outs):
        for p in feed.ports:
            if len(outs[p]) < len(feed.want[p]):
                return False
        return len(outs[OVERFLOW]) >= len(feed.want[OVERFLOW])
    return done


# ------------------------------------------------------------------------------------------
# Tests that need nothing (p4test when present)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["bmv2", "tofino"])
@pytest.mark.parametrize("k", [1, 3])
def test_program_entries_and_report(tmp_path, target, k):
    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "-m", "subc.cli", "compile", str(EXAMPLE / "rules.sub"), "--spec", str(SPEC),
                        "--target", target, "-o", str(out), "--max-messages", str(k), "--overflow-port", "9"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    src = (out / "subc.p4").read_text()
    doc = json.loads((out / "entries.json").read_text())
    rep = json.loads((out / "report.json").read_text())
    assert rep["messages"]["mode"] == "multi" and rep["messages"]["max_messages"] == k
    assert rep["messages"]["overflow_port"] == 9 and doc["messages"]["overflow_port"] == 9
    assert doc["messages"]["ports"] == [1, 2, 3, 4, 5]
    slots = sorted({t["slot"] for t in doc["tables"] if "slot" in t})
    assert slots == list(range(k))
    for i in range(k):
        assert f"subc_slot_t subc_s{i};" in src
    assert f"subc_slot_t subc_s{k};" not in src
    per_slot = [t for t in doc["tables"] if t.get("slot") == 0]
    assert len(doc["tables"]) == k * len(per_slot) + 2
    assert rep["messages"]["entries_installed"] == sum(len(t["entries"]) for t in doc["tables"])
    # every slot's leaf entries: port bitmaps over messages.ports
    for t in doc["tables"]:
        for e in t["entries"]:
            if e["action"] == "subc_msg_fwd":
                assert 0 < e["params"]["ports"] < 1 << 5
    assert doc["multicast_groups"] == [{"group": 1, "ports": [1, 2, 3, 4, 5]}]
    # the summary line describes the installed program, not one slot's tables
    assert (f"{len(doc['tables'])} tables ({len(per_slot)} per message slot, {k} slots), "
            f"{rep['messages']['entries_installed']} entries, 1 multicast groups") in p.stdout, p.stdout
    if P4TEST and target == "bmv2":
        r = subprocess.run([P4TEST, "--std", "p4-16", str(out / "subc.p4")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    tna = _tna_include()
    if P4TEST and tna and target == "tofino":
        r = subprocess.run([P4TEST, "--std", "p4-16", "-D__TARGET_TOFINO__=1", "-I", tna, str(out / "subc.p4")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def _tna_include():
    import os

    for d in (os.environ.get("SUBC_TNA_INCLUDE"), "/opt/tna-include"):
        if d and Path(d, "tna.p4").exists():
            return d
    return None


@pytest.mark.parametrize("args,message", [
    (["--max-messages", "0"], "--max-messages 0"),
    (["--max-messages", "-3"], "--max-messages -3"),
    (["--overflow-port", "511"], "--overflow-port 511"),
    (["--overflow-port", "3"], "also a subscriber port"),
])
def test_bad_options(tmp_path, args, message):
    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "-m", "subc.cli", "compile", str(EXAMPLE / "rules.sub"), "--spec", str(SPEC),
                        "-o", str(out), *args], capture_output=True, text=True)
    assert p.returncode == 2 and message in p.stderr and not out.exists()


def test_single_message_spec_keeps_single_program(tmp_path):
    """A spec whose feed is not MoldUDP64-framed keeps the one-message-per-packet program."""
    text = SPEC.read_text().replace("packet.extract(hdr.mold);\n        packet.extract(hdr.mold_msg);\n", "")
    (tmp_path / "spec.p4").write_text(text)
    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "-m", "subc.cli", "compile", str(EXAMPLE / "rules.sub"), "--spec",
                        str(tmp_path / "spec.p4"), "-o", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["messages"]["mode"] == "single" and "MoldUDP64" in rep["messages"]["reason"]
    assert "subc_slot_t" not in (out / "subc.p4").read_text()
    assert "messages" not in json.loads((out / "entries.json").read_text())


# ------------------------------------------------------------------------------------------
# BMv2: hypothesis rule sets and datagrams
# ------------------------------------------------------------------------------------------


@NEEDS_BMV2
@settings(max_examples=3, derandomize=True, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rules_text=itch_rules(), data=st.data())
def test_bmv2_itch_multi_message(tmp_path_factory, rules_text, data):
    """Random rules over the example spec; datagrams of 1 to K+2 mixed ITCH messages, heartbeats;
    every port's copies (bytes, lengths, checksums, gap-free sequence numbers) and the counters
    are as the rules and the delivery semantics say, in BMv2 and in the table simulator."""
    tmp = tmp_path_factory.mktemp("itch")
    spec, rules, used = load(rules_text, SPEC, tmp)
    try:
        doc = compile_p4(tmp / "r.sub", SPEC, tmp / "out")
    except AssertionError as e:
        assume("conflicting" not in str(e))
        raise
    ports = doc["messages"]["ports"]
    feed = Feed(ports, decide_by_rules(rules, used))
    dgrams = data.draw(st.lists(st.one_of(st.lists(itch_messages(), min_size=1, max_size=K + 2),
                                          st.just("heartbeat")), min_size=3, max_size=10))
    for d in dgrams:
        if d == "heartbeat":
            feed.heartbeat(26400)
        else:
            feed.data(d, 26400)
    any_msgs = next((d for d in dgrams if d != "heartbeat"), None) or [data.draw(itch_messages())]
    _tail(feed, any_msgs, 26400)
    assert set(ports) <= {a[1] for r in rules for a in r.atoms() if a[0] == "fwd"}
    sim = simulate(doc, spec, feed)
    for p in SWITCH_PORTS:
        assert sim.get(p, []) == feed.want.get(p, []), p
    subprocess.run([P4C, "--std", "p4-16", str(tmp / "out" / "subc.p4"), "-o", str(tmp / "out" / "subc.json")], check=True)
    outs, counts = run_bmv2(tmp / "out", tmp, feed.frames, _done(feed))
    verify(feed, outs, counts)


# ------------------------------------------------------------------------------------------
# BMv2: random specs
# ------------------------------------------------------------------------------------------


@st.composite
def spec_rules(draw, model):
    """Rules over the model's query fields (1 to 4 rules, fwd to ports 1..4)."""
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        preds = []
        for q in draw(st.lists(st.sampled_from(model.query_fields), min_size=1, max_size=2, unique=True)):
            top = (1 << q.width) - 1
            v = draw(st.one_of(st.sampled_from([0, 1, top, top >> 1]), st.integers(0, top)))
            op = draw(st.sampled_from([">", "<", "==", "!="] if q.kind == "range" else ["==", "!="]))
            preds.append(f"{q.name} {op} {v}")
        ports = draw(st.lists(st.integers(1, 4), min_size=1, max_size=2, unique=True))
        lines.append(f"{' and '.join(preds)} : fwd({', '.join(map(str, ports))});")
    return "\n".join(lines) + "\n"


@NEEDS_BMV2
@settings(max_examples=2, derandomize=True, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_bmv2_random_spec_multi_message(tmp_path_factory, data):
    """A random spec (tests/spec_model.py): datagrams of its message types built from values,
    through BMv2, against the rules evaluated on the values."""
    from spec_model import build_message, messages_for, reference_fields, render_p4_16, spec_models

    model = data.draw(spec_models())
    assume(model.udp_port != 9999)
    tmp = tmp_path_factory.mktemp("rspec")
    (tmp / "spec.p4").write_text(render_p4_16(model))
    rules_text = data.draw(spec_rules(model))
    (tmp / "r.sub").write_text(rules_text)
    spec, rules, used = load(rules_text, tmp / "spec.p4", tmp)
    try:
        doc = compile_p4(tmp / "r.sub", tmp / "spec.p4", tmp / "out")
    except AssertionError as e:
        assume("conflicting" not in str(e))
        raise
    ports = doc["messages"]["ports"]
    feed = Feed(ports, decide_by_rules(rules, used))

    def msg():
        code, values = data.draw(messages_for(model))
        return build_message(model, code, values), reference_fields(model, code, values)

    for _ in range(data.draw(st.integers(2, 6))):
        if data.draw(st.integers(0, 5)) == 0:
            feed.heartbeat(model.udp_port)
        else:
            feed.data([msg() for _ in range(data.draw(st.integers(1, K + 1)))], model.udp_port)
    # an unknown type code, when the type field has room for one
    m0 = msg()
    unknown = next((c for c in range(1 << model.type_width) if c not in model.codes), None)
    if unknown is not None:
        p = mold_payload([m0[0], build_message(model, unknown, {})], feed.seq)
        feed.add(p, model.udp_port)
        feed.whole(p, "unframed")
    feed.add(b"not a feed datagram", 9999, feed=False)
    feed.counts["not_feed"] += 1
    feed.heartbeat(model.udp_port, 0xFFFF)
    sentinel = mold_payload([m0[0]] * (K + 1), feed.seq, session=b"SENTINEL00")
    feed.add(sentinel, model.udp_port)
    feed.whole(sentinel, "too_many")
    sim = simulate(doc, spec, feed)
    for p in SWITCH_PORTS:
        assert sim.get(p, []) == feed.want.get(p, []), p
    r = subprocess.run([P4C, "--std", "p4-16", str(tmp / "out" / "subc.p4"), "-o", str(tmp / "out" / "subc.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    outs, counts = run_bmv2(tmp / "out", tmp, feed.frames, _done(feed))
    verify(feed, outs, counts)


def test_a_variable_size_message_header_keeps_the_single_message_program():
    """A message header of variable size (a P4_14 ``*`` field, varbit) cannot be copied into
    fixed message slots: the compile keeps the one-message program and says why, instead of
    failing (it raised a TypeError summing the header's unknown size)."""
    import subc

    from conftest import ROOT

    p4_14 = ROOT / "tests" / "specs" / "camus_itch_p4_14.p4"
    text = p4_14.read_text().replace("        price : 32;\n    }", "        price : 32;\n        extra : *;\n    }", 1)
    assert "extra : *;" in text
    spec = subc.parse_spec(text, "varbit.p4")
    rules = subc.parse_rules('add_order.stock == "GOOGL" : fwd(1);', spec)
    c = subc.compile(rules, spec, target="bmv2")
    assert c.report["messages"]["mode"] == "single", c.report["messages"]
    assert "variable size" in c.report["messages"]["reason"]
