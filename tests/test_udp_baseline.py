"""The user-space baseline of the throughput benchmark (bench/udp_broker.c) does what the eBPF
broker does, so that the eBPF-versus-sockets ratio compares brokers that do the same work.

* Classification: hypothesis rule sets over the eight message fields of the eBPF differential
  spec (one message per datagram; every match kind, unaligned fields up to 64 bits), then every
  message of the real ITCH sample: each message gets the reference's decision.
* Per-subscriber repacking (docs/ebpf.md "Delivery semantics"): hypothesis rule sets over the Add Order
  fields of the ITCH spec and MoldUDP64 datagrams built with scapy from drawn values (Add Orders
  with and without MPID, other ITCH types, messages of a wrong length, unknown types, heartbeats,
  an end of session, malformed framing): every subscriber's copy must be, byte for byte, the
  datagram an independent reference builds (the rules evaluated on the values the messages were
  built from; its messages in order, its own gap-free sequence number, the count it holds).
* The broker itself, on loopback sockets: the copies it sends are those bytes (the kernel writes
  lengths and checksums), and every subscriber receives exactly its copies, in order.

Needs a C compiler, not root.  No verdict depends on speed: the socket test waits for each
expected copy (with a generous guard against a hang) before sending the next datagram.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLE, ROOT, real_sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.fields import BitField, ByteField, IntField, LongField, ShortField, StrFixedLenField
from scapy.packet import Packet
from strategies import boundary_packets, rule_set
from ebpf_util import DIFF_SPEC_TEXT, MSG_LAYOUT

from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.spec.front_end import load_spec, parse_spec
from subc.backends.files import target_files
from subc.backends.ebpf.parse_plan import plan_parser
from subc.semantics.reference import reference_decision

sys.path.insert(0, str(ROOT / "bench"))
from udp_tables import build_udp_broker, payloads_file, tables_text

SPEC = parse_spec(DIFF_SPEC_TEXT.replace("@pragma query_field_lpm(ip.dstAddr)\n", ""), "udp_diff.p4")
QS = dict(SPEC.query_fields)
SUBSCRIBERS = range(1, 7)
ENDPOINTS = {s: [(f"10.0.{s}.2", 5000 + s)] for s in SUBSCRIBERS}
ITCH = load_spec(EXAMPLE / "spec.p4")
# the example spec with raw integer fields (no text or fixed-point pragmas), for drawn rule sets, and
# without the IPv4 field (the socket baseline sees only the UDP payload)
RAW_ITCH = parse_spec("\n".join(ln for ln in (EXAMPLE / "spec.p4").read_text().splitlines()
                                if not re.match(r"\s*@pragma query_field_(alpha|scale|lpm)", ln)), "itch_raw.p4")
ITCH_QS = dict(RAW_ITCH.query_fields)
FEED_PORT = 26400
SESSION = b"TESTSESS01"
HANG_GUARD = 60.0  # seconds: only a hung broker takes this long


# -- scapy layouts, written from the specifications (MoldUDP64 v1.00; ITCH 5.0 section 1.3) --------
class MoldHeader(Packet):
    name = "MoldUDP64"
    fields_desc = [StrFixedLenField("session", b" " * 10, 10), LongField("seq", 0), ShortField("count", 0)]


class AddOrder(Packet):
    name = "ITCH Add Order"
    fields_desc = [StrFixedLenField("type", b"A", 1), ShortField("stock_locate", 0), ShortField("tracking_number", 0),
                   BitField("timestamp", 0, 48), LongField("order_ref_number", 0), ByteField("buy_sell_indicator", 0),
                   IntField("shares", 0), LongField("stock", 0), IntField("price", 0)]


def add_order(values: dict[str, int], mpid: bytes | None = None) -> bytes:
    """An Add Order ('A', or 'F' with its 4-byte attribution) with ``values`` by query field name."""
    f = {n.split(".", 1)[1]: v for n, v in values.items()}
    return bytes(AddOrder(type=b"F" if mpid else b"A", **f)) + (mpid or b"")


def mold(seq: int, messages: list[bytes], count: int | None = None) -> bytes:
    """A MoldUDP64 downstream packet of ``messages`` (``count``: the header's count, if not theirs)."""
    hdr = MoldHeader(session=SESSION, seq=seq, count=len(messages) if count is None else count)
    return bytes(hdr) + b"".join(len(m).to_bytes(2, "big") + m for m in messages)


# -- the baseline ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def udp_broker(tmp_path_factory) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("a C compiler (cc) is needed to build bench/udp_broker.c (apt-get install gcc)")
    return build_udp_broker(tmp_path_factory.mktemp("udp") / "udp_broker")


def write_tables(tmp: Path, rules, spec, port: int, endpoints=ENDPOINTS) -> Path:
    res = compile_rules(rules, spec, "ebpf")
    files, _ = target_files(res, "gen.sub")
    doc = json.loads(files["maps.json"])
    (tmp / "tables").write_text(tables_text(doc, plan_parser(spec), port, endpoints))
    return tmp / "tables"


def classify(binary: Path, tmp: Path, rules, spec, payloads: list[bytes], port: int) -> list[tuple]:
    """(leaf kind, subscribers) per message, from the baseline's classify command."""
    tables = write_tables(tmp, rules, spec, port)
    (tmp / "payloads").write_bytes(payloads_file(payloads))
    out = subprocess.run([str(binary), "classify", str(tables), str(tmp / "payloads")],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    got = []
    for line in out:
        _, kind, *ids = map(int, line.split())
        got.append((kind, tuple(sorted(ids))))
    return got


def expected(decision) -> tuple:
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
    want = [expected(reference_decision(rules, SPEC, p)) for p in pkts]
    want += [expected(reference_decision([], SPEC, {}))] * 2
    assert got == want, text


def test_baseline_on_the_real_sample(udp_broker, tmp_path):
    from subc.workloads.itch_codec import decode_add_order, read_binaryfile

    rules = parse_rules((EXAMPLE / "rules.sub").read_text(), ITCH, "rules.sub")
    msgs = [m for _, m in read_binaryfile(real_sample())]
    # every message of the sample, 1 to 40 per datagram
    rng, payloads, i = random.Random(3), [], 0
    while i < len(msgs):
        n = rng.randint(1, 40)
        payloads.append(mold(i + 1, msgs[i:i + n]))
        i += n
    got = classify(udp_broker, tmp_path, rules, ITCH, payloads, FEED_PORT)
    assert len(got) == len(msgs)
    for n, (m, g) in enumerate(zip(msgs, got)):
        pkt = decode_add_order(m) if m[:1] in (b"A", b"F") else None
        ref = reference_decision(rules, ITCH, pkt) if pkt else reference_decision([], ITCH, {})
        assert g == expected(ref), f"message {n}: {g} vs {ref}"
    assert sum(1 for k, _ in got if k == 2) == 4792


# -- per-subscriber repacking ------------------------------------------------------------------------
OTHER_TYPES = {b"D": 19, b"E": 31, b"X": 23, b"P": 44, b"S": 12}  # ITCH 5.0 lengths of some other types


@st.composite
def feed_message(draw, values: list[dict]) -> tuple[bytes, dict | None, str]:
    """(message bytes, the values of an Add Order or None, kind): kind 'add' (classified on its
    values), 'other' (a known type without the Add Order header: the default action), 'unknown'
    (a type the spec does not know: the default action), 'bad' (a known type of another length:
    undecoded, sent nowhere)."""
    kind = draw(st.sampled_from(["add", "add", "add", "add", "mpid", "other", "unknown", "bad"]))
    if kind in ("add", "mpid"):
        v = draw(st.sampled_from(values))
        return add_order(v, b"MPID" if kind == "mpid" else None), v, "add"
    if kind == "other":
        t, n = draw(st.sampled_from(sorted(OTHER_TYPES.items())))
        return t + draw(st.binary(min_size=n - 1, max_size=n - 1)), None, "other"
    if kind == "unknown":
        return b"z" + draw(st.binary(min_size=0, max_size=30)), None, "unknown"
    if draw(st.booleans()):  # an Add Order the rules would take, one byte too long or too short
        m = add_order(draw(st.sampled_from(values)), draw(st.sampled_from([None, b"MPID"])))
        return (m + b"\x00" if draw(st.booleans()) else m[:-1]), None, "bad"
    t, n = draw(st.sampled_from(sorted(OTHER_TYPES.items())))
    size = draw(st.sampled_from([n - 1, n + 1, 1]))
    return t + draw(st.binary(min_size=size - 1, max_size=size - 1)), None, "bad"


@st.composite
def feed(draw, values: list[dict]) -> list[tuple[bytes, list]]:
    """Datagrams (payload, [(message, values, kind)] or the string 'heartbeat'/'malformed')."""
    out, seq = [], 1
    for _ in range(draw(st.integers(1, 25))):
        what = draw(st.sampled_from(["data"] * 8 + ["heartbeat", "malformed"]))
        if what == "heartbeat":
            out.append((mold(seq, []), "heartbeat"))
            continue
        msgs = draw(st.lists(feed_message(values), min_size=1, max_size=30))
        payload = mold(seq, [m for m, _, _ in msgs])
        if what == "malformed":
            cut = draw(st.sampled_from(["count+1", "count-1", "tail"]))
            if cut == "tail":
                payload = payload[:-1]
            else:
                payload = mold(seq, [m for m, _, _ in msgs], len(msgs) + (1 if cut == "count+1" else -1))
            out.append((payload, "malformed"))
            continue
        out.append((payload, msgs))
        seq += len(msgs)
    out.append((bytes(MoldHeader(session=SESSION, seq=seq, count=0xFFFF)), "heartbeat"))
    return out


def reference_copies(rules, datagrams, subscribers, spec=RAW_ITCH) -> list:
    """Per datagram: 'malformed', or {subscriber id: its copy's payload}, built independently of
    the baseline (the rules evaluated on the values the messages were built from)."""
    default = reference_decision([], spec, {})
    nxt = {s: 1 for s in subscribers}
    out = []
    for payload, what in datagrams:
        if what == "malformed":
            out.append("malformed")
            continue
        if what == "heartbeat":
            out.append({s: bytes(MoldHeader(session=SESSION, seq=nxt[s], count=int.from_bytes(payload[18:20], "big")))
                        for s in subscribers})
            continue
        per: dict[int, list[bytes]] = {}
        for msg, values, kind in what:
            if kind == "bad":
                continue
            dec = reference_decision(rules, spec, values) if kind == "add" else default
            for s in dec.ports:
                per.setdefault(s, []).append(msg)
        copies = {}
        for s in sorted(per):
            copies[s] = mold(nxt[s], per[s])
            nxt[s] += len(per[s])
        out.append(copies)
    return out


def run_repack(binary: Path, tables: Path, tmp: Path, payloads: list[bytes]) -> tuple[list, dict]:
    (tmp / "feed").write_bytes(payloads_file(payloads))
    lines = subprocess.run([str(binary), "repack", str(tables), str(tmp / "feed")], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    got: list = [{} for _ in payloads]
    for line in lines[:-1]:
        i, what, *rest = line.split()
        if what in ("malformed", "too_big"):
            got[int(i)] = what
        else:
            assert int(what) not in got[int(i)], f"two copies for subscriber {what} of datagram {i}"
            got[int(i)][int(what)] = bytes.fromhex(rest[0])
    return got, json.loads(lines[-1])


def values_strategy():
    return st.fixed_dictionaries({n: st.integers(0, q.max_value) for n, q in ITCH_QS.items()})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(rule_set(ITCH_QS, allow_drop=False, max_port=6), st.data())
def test_repacking_agrees_with_reference(udp_broker, tmp_path, fields_text, data):
    _, text = fields_text
    rules = parse_rules(text, RAW_ITCH, "gen.sub")
    values = boundary_packets(rules, ITCH_QS, data.draw)[:30] + data.draw(st.lists(values_strategy(), max_size=5))
    datagrams = data.draw(feed(values))
    tables = write_tables(tmp_path, rules, RAW_ITCH, FEED_PORT)
    got, counters = run_repack(udp_broker, tables, tmp_path, [p for p, _ in datagrams])
    want = reference_copies(rules, datagrams, list(SUBSCRIBERS))
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"{text}\ndatagram {i}: got {g}\nwant {w}"
    n_bad = sum(1 for _, w in datagrams if isinstance(w, list) for _, _, k in w if k == "bad")
    assert counters["undecoded"] == n_bad
    assert counters["malformed"] == sum(1 for _, w in datagrams if w == "malformed")


def test_repacking_the_real_sample(udp_broker, tmp_path):
    """The sample in datagrams of 1 to 40 messages through the example's rules: the reference is
    subc's delivery semantics (semantics/delivery.py) with the ITCH codec of the workloads."""
    from subc.semantics.delivery import Delivery, recipients_of
    from subc.workloads.itch_codec import decode_add_order, read_binaryfile

    rules = parse_rules((EXAMPLE / "rules.sub").read_text(), ITCH, "rules.sub")
    msgs = [m for _, m in read_binaryfile(real_sample())]
    rng, payloads, i = random.Random(5), [], 0
    while i < len(msgs):
        n = rng.randint(1, 40)
        payloads.append(mold(i + 1, msgs[i:i + n]))
        i += n
    text = (EXAMPLE / "rules.sub").read_text()
    subs = sorted({int(x) for args in re.findall(r"fwd\(([^)]*)\)", text) for x in args.split(",")})
    eps = {s: [(f"10.0.{s}.2", 5000 + s)] for s in subs}
    tables = write_tables(tmp_path, rules, ITCH, FEED_PORT, eps)
    got, _ = run_repack(udp_broker, tables, tmp_path, payloads)

    def decide(m: bytes) -> set:
        if m[:1] in (b"A", b"F"):
            return recipients_of(reference_decision(rules, ITCH, decode_add_order(m)), broker=False)
        return recipients_of(reference_decision([], ITCH, {}), broker=False)

    ref = Delivery(decide, everyone=subs)
    for i, p in enumerate(payloads):
        want = {s: c.payload() for s, c in ref.datagram(p).items()}
        assert got[i] == want, f"datagram {i}"
    assert sum(len(g) for g in got) > len(payloads)  # copies really differ per subscriber


def test_broker_on_loopback_sockets(udp_broker, tmp_path):
    """``udp_broker broker`` on 127.0.0.1: each subscriber's socket receives exactly the reference
    copies, in order, ending with the end of session."""
    rng = random.Random(7)
    rules_text = "\n".join([
        'add_order.stock == "AAA" : fwd(1);',
        'add_order.stock == "BBB" and add_order.price > 100 : fwd(2);',
        'add_order.shares >= 500 : fwd(3);',
        'add_order.buy_sell_indicator == "S" : fwd(1, 4);',
    ])
    rules = parse_rules(rules_text, ITCH, "loop.sub")
    socks = {}
    for s in range(1, 5):
        sk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sk.bind(("127.0.0.1", 0))
        sk.settimeout(HANG_GUARD)
        socks[s] = sk
    eps = {s: [("127.0.0.1", sk.getsockname()[1])] for s, sk in socks.items()}
    tables = write_tables(tmp_path, rules, ITCH, FEED_PORT, eps)
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # a free port for the broker
    sym = {"AAA": int.from_bytes(b"AAA     ", "big"), "BBB": int.from_bytes(b"BBB     ", "big"),
           "CCC": int.from_bytes(b"CCC     ", "big")}
    datagrams, seq = [], 1
    for _ in range(60):
        msgs = []
        for _ in range(rng.randint(1, 30)):
            v = {"add_order.stock": sym[rng.choice(list(sym))], "add_order.price": rng.choice([50, 100, 101, 2000]),
                 "add_order.shares": rng.choice([1, 499, 500, 9000]), "add_order.buy_sell_indicator": ord(rng.choice("BS"))}
            msgs.append((add_order(v), v, "add"))
        datagrams.append((mold(seq, [m for m, _, _ in msgs]), msgs))
        seq += len(msgs)
    datagrams.append((bytes(MoldHeader(session=SESSION, seq=seq, count=0xFFFF)), "heartbeat"))
    want = reference_copies(rules, datagrams, list(socks), ITCH)
    broker = subprocess.Popen([str(udp_broker), "broker", str(tables), "127.0.0.1", str(port), "0", "64"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pub = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        received = {s: [] for s in socks}
        assert broker.stderr.readline().startswith("udp_broker: listening"), "the broker did not start"
        for (payload, _), copies in zip(datagrams, want):
            pub.sendto(payload, ("127.0.0.1", port))
            for s in copies:
                received[s].append(socks[s].recv(65536))
        for s, sk in socks.items():
            assert received[s] == [c[s] for c in want if s in c], f"subscriber {s}"
        # nothing more is queued: the end of session was each one's last
        for sk in socks.values():
            sk.setblocking(False)
            with pytest.raises(BlockingIOError):
                sk.recv(65536)
    finally:
        broker.terminate()
        out, err = broker.communicate(timeout=HANG_GUARD)
        pub.close()
        for sk in socks.values():
            sk.close()
    counters = json.loads(out)
    assert counters["received"] == len(datagrams) and counters["send_errors"] == 0, (counters, err)
    assert counters["sent_messages"] == sum(int.from_bytes(c[18:20], "big") for w in want for c in w.values()
                                            if c[18:20] != b"\xff\xff")
