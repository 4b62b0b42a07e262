"""The capture reader (subc.wire.capture), replay of captures as captured, and the feed packer.

Captures are built with scapy: mixed traffic (ARP, LLDP, STP, HSRP, TCP, IPv4 fragments, IPv6),
VLAN tags (802.1Q, 802.1ad), frames cut by the snap length, malformed IP and MoldUDP64, zeroed
sessions, many messages per datagram.  No verdict depends on the machine's speed: listeners stop
after a count of datagrams, and pacing is only checked from below.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from subc.cli import main
from subc.errors import SubcError
from subc.analysis.splits import read_pcap
from subc.wire.capture import FRAME_KINDS, CaptureStats, detect_feed_ports, iter_moldudp64, read_datagrams
from subc.wire.pcap_records import read_records
from subc.workloads.itch_codec import encode_add_order, read_binaryfile, stock_value
from subc.wire.moldudp64 import HEADER_LEN, MAX_COUNT, decode_packet, encode_packet
from subc.traffic.replay import replay
from subc.workloads.feed import DEFAULT_WINDOW_NS, feed_datagrams, message_timestamp, pack_messages

from conftest import real_sample

LOOPBACK = "127.0.0.1"
FEED = 26477
T0 = 1_700_000_000
MAC = dict(src="02:00:00:00:00:01", dst="01:00:5e:36:0c:6f")
HANG_GUARD = 120  # seconds: only a hung test waits this long


def msg(k: int) -> bytes:
    """An Add Order with order reference ``k`` and timestamp ``k`` µs after 09:30."""
    return encode_add_order({"add_order.order_ref_number": k, "add_order.timestamp": 34_200 * 10**9 + k * 1000,
                             "add_order.stock": stock_value("AAPL"), "add_order.shares": 100,
                             "add_order.price": 1_500_000 + k, "add_order.buy_sell_indicator": ord("B")})


MSGS = [msg(k) for k in range(100)]
ZERO = bytes(10)


def eth_udp(payload: bytes, dport: int = FEED, vlans: tuple = (), sport: int = 40000, src: str = "10.0.0.1",
            dst: str = "233.54.12.111"):
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Dot1AD, Dot1Q, Ether
    from scapy.packet import Raw

    pkt = Ether(**MAC)
    for i, v in enumerate(vlans):
        pkt = pkt / (Dot1AD(vlan=v) if i < len(vlans) - 1 else Dot1Q(vlan=v))
    return pkt / IP(src=src, dst=dst) / UDP(sport=sport, dport=dport) / Raw(payload)


def mixed_frames():
    """The mixed capture: (scapy frames, the feed payloads that are valid MoldUDP64, in order)."""
    from scapy.layers.hsrp import HSRP
    from scapy.layers.inet import IP, TCP, UDP, fragment
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import ARP, LLC, STP, Dot3, Ether
    from scapy.packet import Raw

    good = [encode_packet("S1", 1, MSGS[0:3]), encode_packet("S1", 4, MSGS[3:5]),
            encode_packet(ZERO, 6, MSGS[5:43]), encode_packet("S1", 44, []), encode_packet("S1", 44, MSGS[43:44])]
    count_lies = encode_packet("S1", 45, MSGS[44:47])
    count_lies = count_lies[:18] + (4).to_bytes(2, "big") + count_lies[20:]  # says 4 messages, holds 3
    big = eth_udp(encode_packet("S1", 50, MSGS[50:60]))
    cut = Ether(bytes(big)[:70])
    cut.wirelen = len(big)
    frags = [Ether(**MAC) / f for f in fragment(IP(src="10.0.0.1", dst="233.54.12.111")
                                                 / UDP(sport=40000, dport=FEED) / Raw(encode_packet("S1", 60, MSGS[60:70])),
                                                 fragsize=256)]
    assert len(frags) == 2
    frames = [
        eth_udp(good[0]),                                                    # 1 feed
        eth_udp(good[1], vlans=(10,)),                                       # 2 feed, 802.1Q
        eth_udp(good[2], vlans=(100, 20)),                                   # 3 feed, 802.1ad + 802.1Q, zeroed session
        Ether(**MAC) / IP(src="10.0.0.2", dst="224.0.0.2") / UDP(sport=1985, dport=1985) / HSRP(),  # 4 other UDP
        Ether(src=MAC["src"], dst="ff:ff:ff:ff:ff:ff") / ARP(psrc="10.0.0.1", pdst="10.0.0.9"),     # 5 not IP
        Ether(src=MAC["src"], dst="01:80:c2:00:00:0e", type=0x88CC) / Raw(b"\x02\x07\x04" + bytes(7)),  # 6 LLDP
        Dot3(src=MAC["src"], dst="01:80:c2:00:00:00") / LLC() / STP(),       # 7 STP (802.3 + LLC)
        Ether(**MAC) / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(dport=FEED) / Raw(good[0]),  # 8 not UDP
        *frags,                                                              # 9, 10 IP fragments
        cut,                                                                 # 11 truncated (snap length)
        eth_udp(count_lies),                                                 # 12 feed, malformed MoldUDP64
        eth_udp(good[0] + b"\x00\x01"),                                      # 13 feed, bytes after the last block
        eth_udp(good[3]),                                                    # 14 feed, heartbeat
        Ether(**MAC) / IPv6(src="fd00::1", dst="ff02::1") / UDP(sport=40000, dport=FEED) / Raw(good[4]),  # 15 feed
        eth_udp(encode_packet("OTHER", 1, MSGS[:2]), dport=9999),            # 16 other UDP
        Ether(**MAC, type=0x0800) / Raw(b"\x43" + bytes(30)),                # 17 malformed IP (header length 12)
        Raw(bytes(10)),                                                      # 18 runt: undecodable link layer
        eth_udp(good[0])                                                     # 19 UDP length past the IP payload
    ]
    frames[-1]["UDP"].len = 1400
    for k, f in enumerate(frames):
        f.time = T0 + k * 0.125
    return frames, good


MIXED_COUNTS = {"frames": 19, "feed_datagrams": 7, "other_udp": 2, "not_udp": 1, "not_ip": 3, "ip_fragments": 2,
                "truncated": 1, "malformed_ip": 2, "undecodable_link": 1, "moldudp64_packets": 5,
                "malformed_moldudp64": 2, "messages": 44}
FEED_FRAMES = [1, 2, 3, 14, 15]


def write(path: Path, frames, ng: bool = False, **kw) -> Path:
    from scapy.utils import PcapNgWriter, PcapWriter

    with (PcapNgWriter(str(path)) if ng else PcapWriter(str(path), **kw)) as w:
        for f in frames:
            w.write(f)
    return path


@pytest.fixture(params=["pcap", "pcapng"])
def mixed(request, tmp_path):
    frames, good = mixed_frames()
    return write(tmp_path / f"mixed.{request.param}", frames, ng=request.param == "pcapng"), good


# ------------------------------------------------------------------------------ the reader


def test_mixed_capture_counts_every_kind(mixed):
    path, good = mixed
    stats = CaptureStats()
    assert detect_feed_ports(path, stats) == [FEED]
    assert stats.detected_ports == {FEED: 5, 9999: 1}
    out = list(iter_moldudp64(read_datagrams(path, [FEED], stats), stats))
    assert {k: getattr(stats, k) for k in MIXED_COUNTS} == MIXED_COUNTS
    assert stats.frames == sum(getattr(stats, k) for k in FRAME_KINDS)
    assert [dg.payload for dg, _ in out] == good  # byte for byte, only valid feed datagrams
    assert [dg.frame for dg, _ in out] == FEED_FRAMES
    assert [dg.vlans for dg, _ in out] == [(), (10,), (100, 20), (), ()]
    assert [dg.time_ns for dg, _ in out] == [T0 * 10**9 + (f - 1) * 125_000_000 for f in FEED_FRAMES]
    assert out[0][0].src == ("10.0.0.1", 40000) and out[0][0].dst == ("233.54.12.111", FEED)
    assert out[4][0].src == ("fd00::1", 40000) and out[4][0].dst == ("ff02::1", FEED)
    assert out[2][1].session == "0x" + "00" * 10 and out[2][1].session_bytes == ZERO and len(out[2][1].messages) == 38
    ex = {k: [f for f, _, _ in v] for k, v in stats.examples.items()}
    assert ex == {"other_udp": [4, 16], "not_ip": [5, 6, 7], "not_udp": [8], "ip_fragments": [9, 10],
                  "truncated": [11], "malformed_moldudp64": [12, 13], "malformed_ip": [17, 19],
                  "undecodable_link": [18]}
    msgs = {m for _, k, m in sum(stats.examples.values(), []) if k in ("not_ip", "other_udp", "not_udp")}
    assert {"ethertype 0x0806 (ARP)", "ethertype 0x88cc (LLDP)", "IP protocol 6 (TCP)"} <= msgs
    assert any("10.0.0.2:1985 -> 224.0.0.2:1985" in m for m in msgs)
    assert stats.other_udp_ports == {1985: 1, 9999: 1}
    doc = stats.as_json()
    assert doc["feed_ports"] == [FEED] and len(doc["examples"]) == 14 and doc["other_udp_ports"] == {"1985": 1, "9999": 1}
    line = stats.summary()
    assert line.startswith("19 frames: 7 feed datagrams (UDP port 26477), 2 other UDP (port 1985: 1, port 9999: 1)")
    assert "2 malformed MoldUDP64 (first: frame 12:" in line


def test_all_udp_when_no_ports(mixed):
    path, _ = mixed
    stats = CaptureStats()
    dgs = list(read_datagrams(path, None, stats))
    assert [d.frame for d in dgs] == [1, 2, 3, 4, 12, 13, 14, 15, 16]
    assert stats.feed_datagrams == 9 and stats.other_udp == 0 and stats.feed_ports is None


def test_read_pcap_has_no_garbage_rows(mixed):
    path, good = mixed
    stats = CaptureStats()
    buf = read_pcap(str(path), stats=stats)  # feed port detected
    want = [m for p in good for m in decode_packet(p).messages]
    assert [bytes(buf.data[s : s + n]) for s, n in zip(buf.starts, buf.lengths)] == want == MSGS[:44]
    assert buf.positions.tolist() == [1] * 3 + [2] * 2 + [3] * 38 + [15]
    assert {k: getattr(stats, k) for k in MIXED_COUNTS} == MIXED_COUNTS


def test_strict_names_file_frame_and_offset(mixed):
    path, _ = mixed
    with open(path, "rb") as f:
        offsets = [r.offset for r in read_records(f, str(path))]
    with pytest.raises(SubcError) as err:
        list(read_datagrams(path, [FEED], strict=True))
    assert err.value.message.startswith(f"{path}: frame 4: other_udp: UDP 10.0.0.2:1985 -> 224.0.0.2:1985")
    assert err.value.message.endswith(f"byte offset {offsets[3]}")
    only_udp = list(read_datagrams(path, [FEED]))
    with pytest.raises(SubcError, match=rf"frame 12: malformed_moldudp64: MoldUDP64: .*byte offset {offsets[11]}$"):
        list(iter_moldudp64(only_udp, strict=True, path=str(path)))
    with pytest.raises(SubcError, match=r"frame 4: other_udp"):
        read_pcap(str(path), strict=True)


def test_broken_capture_file_stays_an_error(mixed, tmp_path):
    path, _ = mixed
    data = path.read_bytes()
    cut = tmp_path / ("cut" + path.suffix)
    cut.write_bytes(data[:-7])
    with pytest.raises(SubcError, match=r"cut\.pcap(ng)?: .* at byte offset \d+ runs past the end"):
        list(read_datagrams(cut))
    with pytest.raises(SubcError, match="not a pcap or pcapng capture"):
        list(read_datagrams(Path(__file__)))


def test_sll_and_raw_ip_links(tmp_path):
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import CookedLinux
    from scapy.packet import Raw

    p = [encode_packet("L", 1, MSGS[:2]), encode_packet("L", 3, MSGS[2:3])]
    sll = write(tmp_path / "sll.pcap", [CookedLinux(proto=0x0800) / IP() / UDP(dport=FEED) / Raw(p[0]),
                                        CookedLinux(proto=0x0806) / Raw(bytes(28)),
                                        CookedLinux(proto=0x86DD) / IPv6() / UDP(dport=FEED) / Raw(p[1])])
    raw = write(tmp_path / "raw.pcap", [IP() / UDP(dport=FEED) / Raw(p[0]), IPv6() / UDP(dport=FEED) / Raw(p[1])],
                linktype=101)
    for path, not_ip in ((sll, 1), (raw, 0)):
        stats = CaptureStats()
        assert [d.payload for d in read_datagrams(path, [FEED], stats)] == p
        assert (stats.frames, stats.feed_datagrams, stats.not_ip) == (2 + not_ip, 2, not_ip)


def _ng_block(btype: int, body: bytes) -> bytes:
    body += bytes(-len(body) % 4)
    return struct.pack("<II", btype, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))


@pytest.mark.parametrize("tsresol, mul, div", [(None, 1000, 1), (9, 1, 1), (3, 10**6, 1), (12, 1, 1000),
                                               (0x8A, 10**9, 1024)])
def test_pcapng_timestamp_resolution(tmp_path, tsresol, mul, div):
    frame = bytes(eth_udp(encode_packet("T", 1, MSGS[:1])))
    opts = b"" if tsresol is None else struct.pack("<HH", 9, 1) + bytes([tsresol, 0, 0, 0]) + bytes(4)
    ticks = 1_700_000_000_123_456
    data = (_ng_block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
            + _ng_block(1, struct.pack("<HHI", 1, 0, 0) + opts)
            + _ng_block(6, struct.pack("<IIIII", 0, ticks >> 32, ticks & 0xFFFFFFFF, len(frame), len(frame)) + frame))
    path = tmp_path / "t.pcapng"
    path.write_bytes(data)
    (dg,) = read_datagrams(path)
    assert dg.time_ns == ticks * mul // div


def test_pcap_nanosecond_timestamps(tmp_path):
    f = eth_udp(encode_packet("T", 1, MSGS[:1]))
    f.time = T0 + 0.5
    path = write(tmp_path / "ns.pcap", [f], nano=True)
    (dg,) = read_datagrams(path)
    assert dg.time_ns == T0 * 10**9 + 500_000_000


# ------------------------------------------------------------------------------ subc replay: exit statuses


@pytest.fixture
def sink():
    """A bound UDP socket on loopback that replays can send to (nobody reads it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        s.bind((LOOPBACK, 0))
        yield f"{LOOPBACK}:{s.getsockname()[1]}"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_replay_mixed_capture_reports_kinds(mixed, sink):
    path, good = mixed
    r = run("replay", path, "--to", sink, "--max", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["source"], doc["datagrams"], doc["messages"]) == ("capture", 5, 44)
    assert doc["bytes"] == sum(map(len, good)) and doc["messages_per_datagram"] == {"mean": 8.8, "max": 38}
    assert {k: doc["capture"][k] for k in MIXED_COUNTS} == MIXED_COUNTS
    assert f"feed port {FEED}" in r.stderr
    r = run("replay", path, "--to", sink, "--max")
    assert r.exit_code == 0 and "sent 44 messages in 5 datagrams (8.80 messages per datagram, max 38;" in r.stdout
    assert "capture: 19 frames: 7 feed datagrams (UDP port 26477)" in r.stdout
    r = run("replay", path, "--to", sink, "--max", "--count", "2", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["datagrams"] == 2


def test_replay_strict_is_fatal_with_frame_number(mixed, sink):
    path, _ = mixed
    r = run("replay", path, "--to", sink, "--max", "--strict")
    assert r.exit_code == 2 and f"{path}: frame 4: other_udp" in r.stderr and "byte offset" in r.stderr


def test_replay_sends_nothing_exits_1_saying_why(tmp_path, sink):
    from scapy.layers.hsrp import HSRP
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import ARP, Ether

    path = write(tmp_path / "router.pcap", [Ether(**MAC) / IP() / UDP(sport=1985, dport=1985) / HSRP(),
                                            Ether(**MAC) / ARP(), Ether(**MAC) / IP() / UDP(dport=FEED) / b"junk"])
    r = run("replay", path, "--to", sink, "--max")
    assert r.exit_code == 1
    assert "nothing sent" in r.stderr and "3 frames: 0 feed datagrams (no feed port), 2 other UDP" in r.stderr
    assert "1 not IP" in r.stderr
    r = run("replay", path, "--to", sink, "--max", "--udp-port", FEED, "--json")
    assert r.exit_code == 1 and json.loads(r.stdout)["capture"]["malformed_moldudp64"] == 1
    empty = tmp_path / "empty.itch"
    empty.write_bytes(b"")
    r = run("replay", empty, "--to", sink)
    assert r.exit_code == 1 and "holds no messages" in r.stderr


def test_replay_zeroed_session_capture_is_sent(tmp_path, sink):
    frames = [eth_udp(encode_packet(ZERO, 1 + 10 * k, MSGS[10 * k : 10 * k + 10])) for k in range(5)]
    path = write(tmp_path / "zero.pcap", frames)
    r = run("replay", path, "--to", sink, "--max", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["datagrams"] == 5 and json.loads(r.stdout)["messages"] == 50


@pytest.mark.parametrize("args, why", [
    (["--batch", "3"], "only a BinaryFILE takes: batch"),
    (["--session", "X", "--window", "5"], "only a BinaryFILE takes: session, window"),
    (["--rate", "10", "--pps", "10"], "exclude each other"),
])
def test_replay_bad_options_exit_2(mixed, sink, args, why):
    r = run("replay", mixed[0], "--to", sink, *args)
    assert r.exit_code == 2 and why in r.stderr


def test_replay_paces_at_captured_speed(tmp_path):
    frames = [eth_udp(encode_packet("P", k + 1, MSGS[k : k + 1])) for k in range(4)]
    for k, f in enumerate(frames):
        f.time = T0 + k * 0.125
    path = write(tmp_path / "paced.pcap", frames)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind((LOOPBACK, 0))
        st = replay(path, rx.getsockname(), speed=2.0)
        assert st.trace_seconds == 0.375
        assert st.seconds >= 0.375 / 2  # sleeps never end early: a lower bound only
        fast = replay(path, rx.getsockname(), pps=1e9)
    assert st.datagrams == fast.datagrams == 4 and st.sha256 == fast.sha256


# ------------------------------------------------------------------------------ replay -> listen on loopback


def subc(*args) -> list[str]:
    return [sys.executable, "-m", "subc.cli", *map(str, args)]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def replay_to_listener(tmp_path: Path, trace: Path, n: int, *replay_args) -> tuple[dict, dict, Path]:
    """``subc listen --count n --save-pcap`` in a subprocess, then ``subc replay``: both JSON documents
    and the listener's pcap."""
    port, saved = free_port(), tmp_path / "got.pcap"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    lis = subprocess.Popen(subc("listen", f"{LOOPBACK}:{port}", "--count", n, "--timeout", HANG_GUARD, "--json",
                                "--save-pcap", saved), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert lis.stderr.readline().startswith(f"listening on {LOOPBACK}:{port}")  # bound: an event, not a delay
        rep = subprocess.run(subc("replay", trace, "--to", f"{LOOPBACK}:{port}", "--json", *replay_args),
                             capture_output=True, text=True, env=env, timeout=HANG_GUARD)
        assert rep.returncode == 0, rep.stderr
        out, err = lis.communicate(timeout=HANG_GUARD)
        assert lis.returncode == 0, err
    finally:
        if lis.poll() is None:
            lis.kill()
            lis.communicate()
    return json.loads(rep.stdout), json.loads(out), saved


def test_replay_reproduces_capture_byte_for_byte(tmp_path):
    from scapy.layers.l2 import ARP, Ether

    payloads = [encode_packet(ZERO if k % 3 == 0 else "NASDAQ01", 1 + 38 * k, MSGS[k % 60 : k % 60 + 38])
                for k in range(40)]
    payloads.insert(7, encode_packet("NASDAQ01", 1 + 38 * 7, []))  # a heartbeat
    frames = []
    for k, p in enumerate(payloads):
        frames.append(eth_udp(p, vlans=(5,) if k % 2 else ()))
        if k % 10 == 0:
            frames.append(Ether(**MAC) / ARP())
    path = write(tmp_path / "feed.pcap", frames)
    sent, got, saved = replay_to_listener(tmp_path, path, len(payloads), "--speed", "0")
    assert sent["datagrams"] == got["received"] == len(payloads)
    assert sent["capture"]["not_ip"] == 5
    received = [d.payload for d in read_datagrams(saved)]
    assert received == payloads  # byte for byte, in order (one sender, loopback: no reordering)
    assert sent["sha256"] == got["sha256"]
    assert got["sessions"] == {"0x" + "00" * 10: 1 + 38 * 39 + 38, "NASDAQ01": 1 + 38 * 38 + 38}
    assert got["malformed"] == 0 and got["messages"] == sent["messages"] == 40 * 38


def test_packed_sample_to_listener(tmp_path):
    """The first 400 messages of the sample, packed: few enough datagrams that the listener's socket
    buffer holds them all however slowly it reads (the verdict does not depend on speed)."""
    path = real_sample()
    msgs = [m for _, m in read_binaryfile(path)][:400]
    n = len(list(feed_datagrams(msgs, "SUBC000001")))
    sent, got, saved = replay_to_listener(tmp_path, path, n, "--max", "--count", len(msgs))
    assert sent["datagrams"] == got["received"] == n and got["messages"] == len(msgs)
    assert (got["gaps"], got["duplicates"], got["malformed"]) == (0, 0, 0)
    assert sent["sha256"] == got["sha256"]
    assert [m for d in read_datagrams(saved) for m in decode_packet(d.payload).messages] == msgs


# ------------------------------------------------------------------------------ the packer


def itch_like(k: int, ts: int | None, body: int) -> bytes:
    if ts is None:
        return b"Z" + bytes([k % 256]) * min(body, 9)  # too short for a timestamp
    return b"A" + k.to_bytes(4, "big") + ts.to_bytes(6, "big") + bytes([k % 256]) * body


@st.composite
def feeds(draw):
    n = draw(st.integers(0, 120))
    ts, out = draw(st.integers(0, 10**9)), []
    for k in range(n):
        ts = max(0, ts + draw(st.sampled_from([0, 1, 500, 20_000, 99_999, 100_000, 100_001, 2_000_000, -50_000])))
        out.append(itch_like(k, None if draw(st.integers(0, 15)) == 0 else ts, draw(st.integers(0, 60))))
    return out


@settings(max_examples=300, deadline=None)
@given(feeds(), st.integers(0, 300_000), st.integers(HEADER_LEN + 2 + 71, 1500), st.integers(1, 2**40))
def test_packer_round_trip_and_rules(messages, window, max_payload, start):
    dgs = list(feed_datagrams(messages, "PACK", start, window, max_payload))
    assert [m for d in dgs for m in d.messages] == messages
    seq = start
    for d in dgs:
        pkt = decode_packet(d.payload)
        assert (pkt.session, pkt.seq, pkt.messages) == ("PACK", seq, d.messages)
        assert len(d.payload) <= max_payload and 1 <= len(d.messages) <= MAX_COUNT
        seq += len(d.messages)
    eff, last = [], None  # each message's timestamp, or its predecessor's
    for m in messages:
        last = message_timestamp(m) if message_timestamp(m) is not None else last
        eff.append(last)
    i = 0
    for k, d in enumerate(dgs):
        mine = eff[i : i + len(d.messages)]
        first = next((t for t in mine if t is not None), None)
        assert all(t - first <= window for t in mine if t is not None)  # the window rule
        i += len(d.messages)
        if k + 1 < len(dgs):  # why it closed: the next message is out of the window, or does not fit
            nxt = messages[i]
            assert (first is not None and eff[i] is not None and eff[i] - first > window) \
                or len(d.payload) + 2 + len(nxt) > max_payload
        if d.time_ns is not None:
            assert d.time_ns == mine[-1]


def test_packer_batch_and_oversized_message():
    dgs = list(feed_datagrams(MSGS[:10], "B", batch=4))
    assert [len(d.messages) for d in dgs] == [4, 4, 2] and [d.seq for d in dgs] == [1, 5, 9]
    huge = b"A" + bytes(2000)
    assert [d.messages for d in feed_datagrams([MSGS[0], huge, MSGS[1]], "B")] == [[MSGS[0]], [huge], [MSGS[1]]]
    with pytest.raises(ValueError):
        list(pack_messages(MSGS, window_ns=-1))
    # 100 Add Orders 1 µs apart: full 1,400-byte datagrams of 36 messages (20 + 36 x 38 bytes)
    assert [len(g) for g, _ in pack_messages(MSGS)] == [36, 36, 28]


def test_packed_real_sample_messages_per_datagram():
    """The shared sample (every length prefix 0) packed with the defaults: its timestamps are far
    apart (median gap 0.58 s), so most datagrams carry one message, as a quiet feed does."""
    msgs = [m for _, m in read_binaryfile(real_sample())]
    sizes = [len(g) for g, _ in pack_messages(msgs)]
    assert DEFAULT_WINDOW_NS == 100_000
    assert (len(msgs), len(sizes), max(sizes)) == (12012, 11714, 4)
    assert round(len(msgs) / len(sizes), 3) == 1.025
    wide = [len(g) for g, _ in pack_messages(msgs, window_ns=10**7)]  # 10 ms: the payload limit binds
    assert (len(wide), max(wide)) == (9144, 30)
