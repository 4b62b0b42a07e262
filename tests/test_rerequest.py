"""MoldUDP64 re-requests: the request server (subc/recovery/rerequest.py) and the recovering
receiver (subc/recovery/receiver.py), against packets built and parsed here with ``struct``
from the MoldUDP64 1.00 layout.

The server must answer only proven, authorised sources, with the messages the journal holds from
the first one asked, in at most 1,400 bytes, never more than the request to an unproven source;
the receiver must deliver every message once, in order, over a lossy path, and name exactly the
messages the server no longer has."""

from __future__ import annotations

import random
import select
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.recovery.journal import Journal
from subc.recovery.receiver import RecoveringReceiver
from subc.recovery.rerequest import RequestServer, Stream

SESSION = b"SUBC000001"
ME = ("127.0.0.1", 40001)
OTHER = ("127.0.0.1", 40002)


def request(session: bytes, seq: int, count: int, cookie: bytes = b"") -> bytes:
    return struct.pack(">10sQH", session, seq, count) + cookie


def parse(data: bytes) -> tuple[bytes, int, int, list[bytes]]:
    """(session, seq, count, messages) of a downstream packet (MoldUDP64 1.00)."""
    session, seq, count = struct.unpack(">10sQH", data[:20])
    msgs, pos = [], 20
    for _ in range(count if count not in (0, 0xFFFF) else 0):
        (n,) = struct.unpack(">H", data[pos : pos + 2])
        msgs.append(data[pos + 2 : pos + 2 + n])
        pos += 2 + n
    assert pos == len(data)
    return session, seq, count, msgs


def downstream(session: bytes, seq: int, msgs: list[bytes]) -> bytes:
    return struct.pack(">10sQH", session, seq, len(msgs)) + b"".join(struct.pack(">H", len(m)) + m for m in msgs)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def server_with(messages: list[bytes], retain_from: int = 1, **kw):
    j = Journal(None, segment_bytes=200)
    for k, m in enumerate(messages):  # one batch each: segments of about 200 bytes
        j.append(k + 1, [m], session=SESSION)
    if retain_from > 1:  # drop the segments wholly before retain_from
        while len(j.segments) > 1 and j.segments[1].first <= retain_from:
            j.retain(max_bytes=j.size - j.segments[0].size)
    streams = {ME: Stream(j, {ME})}
    return RequestServer(streams.get, **kw), j


def proven(srv: RequestServer, addr=ME) -> bytes:
    reply = srv.handle(request(SESSION, 1, 1), addr)
    assert reply is not None and len(reply) == 20
    session, cookie, count = struct.unpack(">10s8sH", reply)
    assert count == 0xFFFE and session == SESSION
    return cookie


MSGS = st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=80)


@settings(max_examples=60, deadline=None)
@given(msgs=MSGS, seq=st.integers(0, 90), count=st.integers(0, 0xFFFF))
def test_a_proven_subscriber_gets_its_messages_from_the_first_asked(msgs, seq, count):
    srv, j = server_with(msgs, clock=Clock())
    cookie = proven(srv)
    reply = srv.handle(request(SESSION, seq, count, cookie), ME)
    start = max(seq, 1)  # sequence number 0 was never sent: answered from the first message
    if count == 0 or seq > len(msgs) or seq + count - 1 < 1:
        assert reply is None
        return
    if reply is None:  # only when the first message alone does not fit in a reply
        assert 20 + 2 + len(msgs[start - 1]) > 1400
        return
    session, first, n, got = parse(reply)
    assert session == SESSION and first == start and len(reply) <= 1400
    assert got == msgs[start - 1 : start - 1 + n] and 1 <= n <= seq + count - start
    nxt = start - 1 + n
    if n < seq + count - start and nxt < len(msgs):  # served in part: the next message did not fit
        assert len(reply) + 2 + len(msgs[nxt]) > 1400


def test_an_unproven_source_gets_no_more_than_it_sent():
    srv, _ = server_with([b"x" * 100] * 30, clock=Clock())
    reply = srv.handle(request(SESSION, 1, 30), ME)
    assert reply is not None and len(reply) <= 20
    assert srv.handle(request(SESSION, 1, 30, b"\x00" * 8), ME) is not None  # a wrong cookie: a cookie again
    assert len(srv.handle(request(SESSION, 1, 30, b"\x00" * 8), ME)) == 20
    cookie = proven(srv, OTHER)
    assert srv.handle(request(SESSION, 1, 30, cookie), ME) is not None  # OTHER's cookie does not prove ME
    assert len(srv.handle(request(SESSION, 1, 30, cookie), ME)) == 20
    assert srv.counters["served"] == 0


def test_other_subscribers_sessions_and_bad_requests_get_nothing():
    srv, _ = server_with([b"m%d" % k for k in range(10)], clock=Clock())
    cookie = proven(srv, OTHER)
    assert srv.handle(request(SESSION, 1, 5, cookie), OTHER) is None  # no subscriber receives at OTHER
    cookie = proven(srv)
    assert srv.handle(request(b"SUBC000002", 1, 5, cookie), ME) is None  # not the session it was sent
    for bad in (b"", b"x" * 19, b"x" * 21, request(SESSION, 1, 5, cookie) + b"!"):
        assert srv.handle(bad, ME) is None
    assert srv.counters["not_authorized"] == 1 and srv.counters["malformed"] == 4
    assert srv.counters["unanswered"] == 1
    assert srv.counters["served"] == 0


def test_sequence_numbers_outside_retention_are_unanswered_and_counted():
    msgs = [bytes([k]) * 40 for k in range(40)]
    srv, j = server_with(msgs, retain_from=10, clock=Clock())
    first = j.first_seq
    assert first > 1
    cookie = proven(srv)
    assert srv.handle(request(SESSION, 1, 3, cookie), ME) is None  # all gone
    assert srv.counters["unanswered_messages"] == 3
    _, start, _, got = parse(srv.handle(request(SESSION, 1, first + 1, cookie), ME))  # answered from the oldest
    assert start == first and got[:2] == msgs[first - 1 : first + 1]
    assert srv.counters["unanswered_messages"] == 3 + first - 1
    assert srv.handle(request(SESSION, 41, 3, cookie), ME) is None  # not sent yet
    assert parse(srv.handle(request(SESSION, first, 1, cookie), ME))[3] == [msgs[first - 1]]


def test_requests_over_the_rate_are_dropped():
    clock = Clock()
    srv, _ = server_with([b"a"], rate=5, clock=clock)
    replies = [srv.handle(request(SESSION, 1, 1), ME) for _ in range(8)]
    assert sum(r is not None for r in replies) == 5 and srv.counters["rate_limited"] == 3
    clock.t = 1.0
    assert srv.handle(request(SESSION, 1, 1), ME) is not None


# -- over loopback: a lossy live path, the receiver recovers --------------------------------------


def run_stream(
    msgs: list[bytes], loss: float, seed: int, retain_from: int = 1, reorder: float = 0.0
) -> RecoveringReceiver:
    """Send ``msgs`` in packets of 1 to 4 messages to a receiver on loopback, dropping a
    fraction ``loss`` of the packets (never the last: the receiver learns the end from it) and
    sending a fraction ``reorder`` of them after the next one; the receiver re-requests gaps from
    a request server on loopback.  Returns the receiver after every message was delivered or
    given up."""
    rnd = random.Random(seed)
    j = Journal(None, segment_bytes=300)
    for k, m in enumerate(msgs):
        j.append(k + 1, [m], session=SESSION)
    if retain_from > 1:
        while len(j.segments) > 1 and j.segments[1].first <= retain_from:
            j.retain(max_bytes=j.size - j.segments[0].size)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    srv = RequestServer({rx.getsockname(): Stream(j, {rx.getsockname()})}.get, rate=10_000)
    srv_addr = srv.start("127.0.0.1", 0)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        receiver = RecoveringReceiver(lambda p: rx.sendto(p, srv_addr), timeout_s=0.05, retries=20)
        delivered: list[tuple[int, bytes]] = []
        seq, packets = 1, []
        while seq <= len(msgs):
            n = rnd.randint(1, 4)
            packets.append(downstream(SESSION, seq, msgs[seq - 1 : seq - 1 + n]))
            seq += n
        for k in range(len(packets) - 1):  # swap neighbours (never the last packet)
            if k + 1 < len(packets) - 1 and rnd.random() < reorder:
                packets[k], packets[k + 1] = packets[k + 1], packets[k]
        for k, p in enumerate(packets):
            if k == len(packets) - 1 or rnd.random() >= loss:
                tx.sendto(p, rx.getsockname())
        while not receiver.complete or receiver.highest < len(msgs):
            ready, _, _ = select.select([rx], [], [], 0.02)
            if ready:
                data, addr = rx.recvfrom(2048)
                delivered += receiver.packet(data, answer=addr == srv_addr)
            delivered += receiver.tick()
        assert [s for s, _ in delivered] == sorted(set(s for s, _ in delivered))  # once each, in order
        lost = {s for a, b in receiver.lost for s in range(a, b + 1)}
        assert {s for s, _ in delivered} | lost == set(range(1, len(msgs) + 1)) and not {s for s, _ in delivered} & lost
        assert all(m == msgs[s - 1] for s, m in delivered)
        receiver.delivered = delivered  # type: ignore[attr-defined]
        return receiver
    finally:
        srv.stop()
        rx.close()
        tx.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    msgs=st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=150),
    loss=st.sampled_from([0.0, 0.05, 0.3]),
    seed=st.integers(0, 2**16),
    reorder=st.sampled_from([0.0, 0.25]),
)
def test_the_receiver_delivers_every_message_once_in_order(msgs, loss, seed, reorder):
    r = run_stream(msgs, loss, seed, reorder=reorder)
    assert not r.lost and len(r.delivered) == len(msgs)
    assert r.recovered <= len(msgs)
    if loss == 0.0 and reorder == 0.0:
        assert r.recovered == 0 and r.requests == 0


def test_messages_past_retention_are_named_lost():
    msgs = [bytes([k]) * 30 for k in range(60)]
    rnd = random.Random(3)
    r = run_stream(msgs, 1.0, rnd.randint(0, 99), retain_from=20)  # only the last packet arrives live
    first_kept = min(s for s, _ in r.delivered)
    assert r.lost == [(1, first_kept - 1)]
    assert [s for s, _ in r.delivered] == list(range(first_kept, 61))


def test_without_recovery_the_loss_shows():
    """The same lossy path, the receiver never answered (no server): it sees the gap and, after its
    retries, names every lost message."""
    sent = []
    r = RecoveringReceiver(sent.append, timeout_s=0.0, retries=2, clock=Clock())
    got = r.packet(downstream(SESSION, 1, [b"a", b"b"])) + r.packet(downstream(SESSION, 5, [b"e"]))
    while not r.complete:
        got += r.tick()
    assert [s for s, _ in got] == [1, 2, 5] and r.lost == [(3, 4)]
    assert len(sent) == 6  # for 3, then for 4: each sent once and repeated twice
    assert struct.unpack(">10sQH", sent[0]) == (SESSION, 3, 3)  # from the next expected to the highest seen


@pytest.mark.parametrize("count", [1, 0xFFFF])
def test_a_huge_count_is_served_in_part(count):
    srv, _ = server_with([b"y" * 50] * 500, clock=Clock())
    cookie = proven(srv)
    reply = srv.handle(request(SESSION, 1, count, cookie), ME)
    _, first, n, got = parse(reply)
    assert first == 1 and n == min(count, (1400 - 20) // 52) and len(reply) <= 1400


def test_duplicates_and_other_sessions_are_not_delivered():
    r = RecoveringReceiver(lambda p: None, clock=Clock())
    assert [s for s, _ in r.packet(downstream(SESSION, 1, [b"a", b"b"]))] == [1, 2]
    assert r.packet(downstream(SESSION, 1, [b"a", b"b"])) == [] and r.duplicates == 2
    assert r.packet(downstream(b"OTHER     ", 3, [b"c"])) == []
    assert r.packet(b"garbage") == [] and r.complete
    assert [m for _, m in r.packet(downstream(SESSION, 2, [b"b", b"c"]))] == [b"c"] and r.duplicates == 3


def test_several_servers_are_tried_in_turn_each_with_its_cookie():
    """A gap asked of a server that never answers moves to the next server after its retries; the
    next server's cookie is its own; only after every server was asked is a message given up."""
    sent: list[tuple[int, bytes]] = []
    clock = Clock()
    r = RecoveringReceiver([lambda p: sent.append((0, p)), lambda p: sent.append((1, p))], timeout_s=0.0,
                           retries=2, clock=clock)
    r.packet(downstream(SESSION, 1, [b"a"]))
    r.packet(downstream(SESSION, 3, [b"c"]))
    assert [k for k, _ in sent] == [0]
    r.tick(), r.tick()
    assert [k for k, _ in sent] == [0, 0, 0]
    r.tick()  # server 0 had its retries: server 1 is asked, without server 0's cookie
    assert [k for k, _ in sent] == [0, 0, 0, 1] and r.switches == 1
    # server 1 asks us to prove our address (a cookie packet: the cookie in the sequence number
    # field, count 0xFFFE): the request goes again with its cookie, to it only
    ck = struct.pack(">10sQH", SESSION, 0x1122334455667788, 0xFFFE)
    assert r.packet(ck, answer=True, server=1) == []
    assert sent[-1][0] == 1 and len(sent[-1][1]) > len(sent[0][1]) and r.cookies == {1: ck[10:18]}
    got = r.packet(downstream(SESSION, 2, [b"b"]), answer=True, server=1)
    assert [s for s, _ in got] == [2, 3] and r.recovered == 1 and not r.lost
    # a gap no server answers: given up after both were asked
    r.packet(downstream(SESSION, 5, [b"e"]))
    n = len(sent)
    while not r.complete:
        r.tick()
    assert r.lost == [(4, 4)] and {k for k, _ in sent[n:]} == {0, 1}


@pytest.mark.parametrize("dead_first", [False, True])
def test_subc_listen_recover_over_loopback(tmp_path, dead_first):
    """``subc listen --recover``: a feed on loopback that loses every third packet, a request
    server with the stream's journal (after one that never answers, as a killed broker of a
    cluster); the saved BinaryFILE holds every message, once, in order."""
    import json
    import subprocess
    import sys

    msgs = [b"A" + k.to_bytes(4, "big") + bytes(k % 50) for k in range(300)]
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    j = Journal(None, segment_bytes=1000)
    j.append(1, msgs, session=SESSION)
    srv = RequestServer({("127.0.0.1", port): Stream(j, {("127.0.0.1", port)})}.get, rate=10_000)
    srv_addr = srv.start("127.0.0.1", 0)
    dead = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # bound, never read: no answer, no ICMP
    dead.bind(("127.0.0.1", 0))
    servers = [f"{srv_addr[0]}:{srv_addr[1]}"]
    if dead_first:
        servers.insert(0, f"127.0.0.1:{dead.getsockname()[1]}")
    save = tmp_path / "got.itch"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "subc.cli",
            "listen",
            f"127.0.0.1:{port}",
            "--recover",
            ",".join(servers),
            "--save",
            str(save),
            "--json",
            "--timeout",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()  # "listening on ...": the socket is bound
        assert "listening on" in line, line
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        seq, k = 1, 0
        while seq <= len(msgs):
            if k % 3 != 1:
                tx.sendto(downstream(SESSION, seq, msgs[seq - 1 : seq + 2]), ("127.0.0.1", port))
            seq, k = seq + 3, k + 1
        tx.sendto(struct.pack(">10sQH", SESSION, len(msgs) + 1, 0xFFFF), ("127.0.0.1", port))  # end of session
        tx.close()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        srv.stop()
        dead.close()
    assert proc.returncode == 0, err
    doc = json.loads(out)
    data, got, pos = save.read_bytes(), [], 0
    while pos < len(data):
        (n,) = struct.unpack(">H", data[pos : pos + 2])
        got.append(data[pos + 2 : pos + 2 + n])
        pos += 2 + n
    assert got == msgs
    assert (
        doc["messages"] == 300 and doc["lost"] == [] and doc["gaps"] > 0 and doc["recovered"] == doc["missing_messages"]
    )
