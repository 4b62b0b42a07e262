"""MoldUDP64 encoding, trace reading (BinaryFILE, pcap, pcapng), replay and listen on 127.0.0.1."""

from __future__ import annotations

import math
import socket
import threading
import time

import pytest

from subc.errors import SubcError
from subc.workloads.itch_codec import read_binaryfile
from subc.traffic.listen import listen
from subc.wire.moldudp64 import END_OF_SESSION, HEADER_LEN, decode_packet, encode_end_of_session, encode_packet
from subc.traffic.replay import MAX_PAYLOAD, iter_trace_messages, replay

from conftest import real_sample

LOOPBACK = "127.0.0.1"
MSGS = [b"S" + bytes(11), b"A" + bytes(range(1, 36)), b"X" * 23]


def free_port() -> int:
    """An ephemeral UDP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def start_listener(**kwargs):
    """Run listen() in a thread on a free loopback port; returns (port, thread, result holder)."""
    port = free_port()
    ready = threading.Event()
    result: dict = {}

    def run():
        try:
            result["stats"] = listen((LOOPBACK, port), on_ready=ready.set, **kwargs)
        except BaseException as e:  # surfaced by the test
            result["error"] = e
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(5), "listener did not start"
    assert "error" not in result, result.get("error")
    return port, thread, result


def finish(thread, result):
    thread.join(30)
    assert not thread.is_alive(), "listener did not stop"
    assert "error" not in result, result.get("error")
    return result["stats"]


def sample_messages(path):
    return [msg for _off, msg in read_binaryfile(path)]


def add_order_refs(messages) -> set[int]:
    return {int.from_bytes(m[11:19], "big") for m in messages if m[:1] in (b"A", b"F")}


# ---------------------------------------------------------------- MoldUDP64 packets


def test_round_trip_bytes_and_fields():
    data = encode_packet("SESS1", 42, MSGS)
    assert data[:10] == b"SESS1     "
    assert int.from_bytes(data[10:18], "big") == 42
    assert int.from_bytes(data[18:20], "big") == 3
    assert data[20:22] == (12).to_bytes(2, "big") and data[22:34] == MSGS[0]
    assert len(data) == HEADER_LEN + sum(2 + len(m) for m in MSGS)
    pkt = decode_packet(data)
    assert (pkt.session, pkt.seq, pkt.count, pkt.messages) == ("SESS1", 42, 3, MSGS)
    assert not pkt.is_heartbeat and not pkt.is_end_of_session
    assert decode_packet(encode_packet(b"ABCDEFGHIJ", 2**64 - 1, [b""])).messages == [b""]


def test_heartbeat_and_end_of_session():
    hb = encode_packet("S", 7, [])
    assert len(hb) == HEADER_LEN
    pkt = decode_packet(hb)
    assert pkt.is_heartbeat and pkt.count == 0 and pkt.seq == 7 and pkt.messages == []
    eos = encode_end_of_session("S", 8)
    assert eos[18:20] == b"\xff\xff" and len(eos) == HEADER_LEN
    pkt = decode_packet(eos)
    assert pkt.is_end_of_session and pkt.count == END_OF_SESSION and pkt.seq == 8 and pkt.messages == []


@pytest.mark.parametrize(
    "data, offset",
    [
        (encode_packet("S", 1, MSGS)[:19], "byte offset 0"),  # short header
        (encode_packet("S", 1, MSGS)[:21], "byte offset 20"),  # half a length prefix
        (encode_packet("S", 1, MSGS)[:30], "byte offset 20"),  # first message cut
        (encode_packet("S", 1, MSGS)[:-1], "byte offset 72"),  # last message cut
        (encode_packet("S", 1, MSGS) + b"\x00", f"byte offset {20 + sum(2 + len(m) for m in MSGS)}"),  # trailing
        (encode_end_of_session("S", 1) + b"\x00\x01x", "byte offset 20"),  # data after end of session
        (b"\x00" * 10 + bytes(8) + b"\x00\x01", "byte offset 20"),  # zeroed session, a missing message
    ],
    ids=["short-header", "half-length", "first-cut", "last-cut", "trailing", "eos-trailing", "zero-session-cut"],
)
def test_malformed_packets_raise_with_offset(data, offset):
    with pytest.raises(SubcError) as err:
        decode_packet(data)
    assert offset in str(err.value)


def test_zeroed_and_binary_sessions_decode():
    """Real captures carry zeroed sessions: kept as raw bytes, named by their hex digits."""
    pkt = decode_packet(bytes(10) + (5).to_bytes(8, "big") + (1).to_bytes(2, "big") + (12).to_bytes(2, "big") + MSGS[0])
    assert (pkt.session, pkt.session_bytes, pkt.seq, pkt.messages) == ("0x" + "00" * 10, bytes(10), 5, MSGS[:1])
    raw = b"\x01SESS\xff\x00   "
    pkt = decode_packet(encode_packet(raw, 9, MSGS))
    assert pkt.session_bytes == raw and pkt.session == "0x" + raw.hex()
    assert encode_packet(pkt.session_bytes, pkt.seq, pkt.messages) == encode_packet(raw, 9, MSGS)
    assert decode_packet(encode_packet("AB", 1, [])).session_bytes == b"AB        "


def test_encode_rejects_bad_input():
    with pytest.raises(SubcError):
        encode_packet("ELEVENCHARS", 1, [])
    with pytest.raises(SubcError):
        encode_packet("S", -1, [])
    with pytest.raises(SubcError):
        encode_packet("S", 1, [bytes(70000)])


# ---------------------------------------------------------------- traces


def write_capture(path, writer_cls):
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    def udp(payload, dport=30001):
        return Ether() / IP(src="10.0.0.1", dst="233.54.12.111") / UDP(sport=40000, dport=dport) / Raw(payload)

    frames = [
        udp(encode_packet("SESS", 1, MSGS[:2])),
        udp(b"not MoldUDP64 at all, just text", dport=53),
        Ether() / IP() / TCP(sport=1, dport=30001) / Raw(encode_packet("SESS", 3, [b"T" * 5])),
        udp(encode_packet("SESS", 3, [])),  # heartbeat
        udp(encode_packet("SESS", 3, MSGS[2:] + MSGS[:1])),
        udp(encode_end_of_session("SESS", 5)),
    ]
    with writer_cls(str(path)) as w:
        for f in frames:
            w.write(f)


@pytest.mark.parametrize("kind", ["pcap", "pcapng"])
def test_capture_messages_in_order(tmp_path, kind):
    from scapy.utils import PcapNgWriter, PcapWriter

    path = tmp_path / f"trace.{kind}"
    write_capture(path, PcapWriter if kind == "pcap" else PcapNgWriter)
    assert path.read_bytes()[:4] in (bytes.fromhex("d4c3b2a1"), bytes.fromhex("a1b2c3d4"), bytes.fromhex("0a0d0d0a"))
    assert list(iter_trace_messages(path)) == MSGS + MSGS[:1]


def test_binaryfile_trace_is_the_itch_reader():
    path = real_sample()
    msgs = list(iter_trace_messages(path))
    assert len(msgs) == 12012
    assert msgs == sample_messages(path)


def test_unreadable_trace():
    with pytest.raises(SubcError):
        list(iter_trace_messages("/nonexistent/trace.pcap"))


# ---------------------------------------------------------------- replay and listen


def test_replay_real_sample_to_listener():
    path = real_sample()
    msgs = sample_messages(path)
    port, thread, result = start_listener(count=len(msgs), timeout=5, keep=True)
    sent = replay(path, (LOOPBACK, port), rate=50000, batch=1)
    stats = finish(thread, result)
    assert sent.datagrams == sent.messages == len(msgs) == 12012
    assert sent.bytes == sum(HEADER_LEN + 2 + len(m) for m in msgs)
    assert stats.received == len(msgs)
    assert stats.messages == len(msgs) and stats.bytes == sent.bytes
    assert stats.by_type["A"] + stats.by_type["F"] == 5000
    assert (stats.gaps, stats.missing_messages, stats.duplicates, stats.malformed) == (0, 0, 0, 0)
    assert (stats.first_seq, stats.last_seq) == (1, len(msgs))
    assert stats.sessions == {"SUBC000001": len(msgs) + 1}
    assert sum(stats.by_type.values()) == len(msgs)
    assert stats.kept == msgs
    assert add_order_refs(stats.kept) == add_order_refs(msgs)
    j = stats.as_json()
    for key in ("received", "messages", "by_type", "not_decoded", "bytes", "gaps", "missing_messages",
                "duplicates", "malformed", "sessions", "first_seq", "last_seq", "seconds"):
        assert key in j
    assert j["by_type"]["A"] + j["by_type"].get("F", 0) == 5000


def test_replay_batches_contiguous_with_end_of_session():
    path = real_sample()
    n, batch = 3001, 7
    port, thread, result = start_listener(timeout=5)
    sent = replay(path, (LOOPBACK, port), batch=batch, count=n, start_seq=100, session="B", end_of_session=True)
    stats = finish(thread, result)  # stopped by the end-of-session packet
    assert sent.messages == n
    assert sent.datagrams == math.ceil(n / batch) + 1
    assert stats.received == math.ceil(n / batch) + 1
    assert stats.end_of_session
    assert stats.messages == n
    assert (stats.gaps, stats.missing_messages, stats.duplicates) == (0, 0, 0)
    assert (stats.first_seq, stats.last_seq) == (100, 100 + n - 1)
    assert stats.sessions == {"B": 100 + n}


def test_replay_splits_batches_at_max_payload():
    path = real_sample()
    n = 2000
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        rx.bind((LOOPBACK, 0))
        rx.settimeout(2)
        sent = replay(path, rx.getsockname(), batch=1000, count=n)
        packets = [decode_packet(rx.recv(65535)) for _ in range(sent.datagrams)]
    sizes = [HEADER_LEN + sum(2 + len(m) for m in p.messages) for p in packets]
    assert max(sizes) <= MAX_PAYLOAD
    assert min(len(p.messages) for p in packets[:-1]) > 1
    assert len(packets) >= math.ceil(sum(2 + len(m) for m in sample_messages(path)[:n]) / (MAX_PAYLOAD - HEADER_LEN))
    seq = 1
    for p in packets:
        assert p.seq == seq
        seq += len(p.messages)
    assert seq == n + 1
    assert [m for p in packets for m in p.messages] == sample_messages(path)[:n]


def test_replay_rate_is_paced_without_busy_waiting():
    path = real_sample()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind((LOOPBACK, 0))
        cpu = time.process_time()
        sent = replay(path, rx.getsockname(), rate=100, count=31, batch=1)
        cpu = time.process_time() - cpu
    assert sent.messages == 31
    assert 0.29 <= sent.seconds < 3.0  # message i is due at i/100 s (10x margin: a busy machine oversleeps)
    assert cpu < 0.5 * sent.seconds


def test_listen_counts_gap_duplicate_and_malformed():
    port, thread, result = start_listener(timeout=5, count=6)
    a = b"A" + bytes(10) + (1234).to_bytes(8, "big") + bytes(17)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        for data in (
            encode_packet("G", 1, [a]),  # next expected: 2
            encode_packet("G", 5, [MSGS[0], a]),  # gap: 2, 3, 4 missing; next expected: 7
            b"junk",
            encode_packet("G", 1, [MSGS[2]])[:-3],  # truncated
            encode_packet("G", 6, [MSGS[2]]),  # below 7: duplicate
            encode_packet("G", 7, []),  # heartbeat in sequence
        ):
            tx.sendto(data, (LOOPBACK, port))
    stats = finish(thread, result)
    assert stats.received == 6
    assert stats.malformed == 2
    assert (stats.gaps, stats.missing_messages, stats.duplicates) == (1, 3, 1)
    assert stats.messages == 4 and stats.heartbeats == 1
    assert stats.by_type == {"A": 2, "S": 1, "X": 1}
    assert (stats.first_seq, stats.last_seq) == (1, 6)
    assert stats.kept == []  # keep=False


def test_listen_idle_timeout():
    t0 = time.perf_counter()
    port, thread, result = start_listener(timeout=0.3)
    stats = finish(thread, result)
    assert time.perf_counter() - t0 >= 0.25  # it waited; no upper bound: a loaded machine may be slow
    assert stats.received == 0 and stats.first_seq is None
