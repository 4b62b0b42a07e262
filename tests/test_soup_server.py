"""The SoupBinTCP 4.1 server (subc/recovery/soup_server.py) over loopback TCP, against journals
(subc/recovery/journal.py) whose contents the tests know.

Packets are built and read here with ``struct`` from the spec's layout (never with the codec under
test).  No verdict depends on timing: each test waits for an event (a packet, the end of the
stream, a counter of the server, a client seen stalled) under a generous hang guard, and the
timers (heartbeats, timeouts, stalls) run on a fake clock that the tests move.  "Nothing more
was sent" is checked by appending a sentinel message: the next Sequenced Data must be it."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.recovery.journal import Journal
from subc.recovery.soup_server import SoupServer

HANG_S = 30.0  # the hang guard: a test waiting longer than this has failed
BLANK = b" " * 10
PASSWORDS = {"alice": "secret", "bob": "hunter2"}


class FakeClock:
    """The server's clock, moved by the test."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def login_request(user: str, pw: str, session: bytes = BLANK, seq: int = 0) -> bytes:
    return struct.pack(
        ">Hc6s10s10s20s", 47, b"L", user.encode().ljust(6), pw.encode().ljust(10), session, b"%20d" % seq
    )


def packet(ptype: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">Hc", len(payload) + 1, ptype) + payload


class Client:
    """A SoupBinTCP client over a blocking socket (each read under the hang guard)."""

    def __init__(self, addr: tuple[str, int], rcvbuf: int | None = None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(HANG_S)
        self.sock.connect(addr)
        self.buf = b""

    @property
    def peer_name(self) -> str:
        host, port = self.sock.getsockname()
        return f"{host}:{port}"

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, n: int) -> bool:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return False
            self.buf += chunk
        return True

    def packet(self) -> tuple[bytes, bytes] | None:
        """The next packet (type, payload), or None at the end of the stream."""
        if not self._fill(2):
            assert self.buf == b"", "the stream ended inside a packet"
            return None
        (length,) = struct.unpack(">H", self.buf[:2])
        assert self._fill(2 + length), "the stream ended inside a packet"
        body, self.buf = self.buf[2 : 2 + length], self.buf[2 + length :]
        return body[:1], body[1:]

    def data_packet(self) -> tuple[bytes, bytes] | None:
        """The next packet that is not a Server Heartbeat, or None at the end of the stream."""
        while True:
            p = self.packet()
            if p is None or p[0] != b"H":
                return p

    def login(self, user: str, pw: str, session: bytes = BLANK, seq: int = 0) -> tuple[bytes, bytes]:
        self.send(login_request(user, pw, session, seq))
        p = self.data_packet()
        assert p is not None, "closed without an answer to the login"
        return p

    def accepted(self, user: str, pw: str, session: bytes = BLANK, seq: int = 0) -> tuple[bytes, int]:
        """Log in; the Login Accepted's (session, sequence number)."""
        ptype, payload = self.login(user, pw, session, seq)
        assert ptype == b"A", (ptype, payload)
        s, n = struct.unpack(">10s20s", payload)
        return s, int(n)

    def messages(self, n: int) -> list[bytes]:
        """The next ``n`` packets, which must be Sequenced Data (heartbeats between skipped)."""
        out = []
        for _ in range(n):
            p = self.data_packet()
            assert p is not None and p[0] == b"S", p
            out.append(p[1])
        return out

    def until_closed(self) -> list[tuple[bytes, bytes]]:
        """Every packet up to the end of the stream (the server closed the connection)."""
        out = []
        while (p := self.packet()) is not None:
            out.append(p)
        return out

    def close(self) -> None:
        self.sock.close()


def msgs(a: int, b: int, size: int = 0) -> list[bytes]:
    """Messages a .. b - 1 (message k's bytes name k)."""
    return [f"msg-{k}".encode().ljust(size, b".") for k in range(a, b)]


@pytest.fixture
def lock():
    return threading.Lock()


@pytest.fixture
def serve(lock):
    """serve(journals, **options) -> a started server whose users (PASSWORDS) map to themselves
    as keys and whose journals are ``journals`` (key -> Journal)."""
    servers = []

    def make(journals: dict, **kw) -> SoupServer:
        accounts = kw.pop("accounts", lambda u, p: u if PASSWORDS.get(u) == p else None)
        srv = SoupServer(accounts, journals.get, lock, **kw)
        srv.start("127.0.0.1", 0)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()
        assert not srv.errors, list(srv.errors)
        assert srv.counters["internal_errors"] == 0


def until(srv: SoupServer, predicate) -> None:
    assert srv.wait_for(predicate, HANG_S), "the awaited event did not happen"


def append(lock, j: Journal, messages: list[bytes], session: bytes = BLANK) -> None:
    with lock:
        j.append(j.next_seq, messages, session=session)


def append_batches(lock, j: Journal, messages: list[bytes], batch: int) -> None:
    for a in range(0, len(messages), batch):
        append(lock, j, messages[a : a + batch])


def finish(srv: SoupServer, lock, j: Journal, c: Client, marker: bytes = b"sentinel") -> None:
    """Nothing more is on its way to ``c``: a sentinel appended now is the next message it gets."""
    append(lock, j, [marker])
    srv.wake()
    assert c.messages(1) == [marker]


# -- backfill and live -------------------------------------------------------------------------


def test_login_at_1_gets_the_backfill_then_live(serve, lock):
    j = Journal(segment_bytes=300)
    append_batches(lock, j, msgs(1, 41), 7)
    assert len(j.segments) > 1
    srv = serve({"alice": j})
    c = Client(srv.address)
    assert c.accepted("alice", "secret", seq=1) == (BLANK, 1)
    assert c.messages(40) == msgs(1, 41)
    for a in range(41, 71, 10):  # live, batch by batch
        append(lock, j, msgs(a, a + 10))
        srv.wake()
        assert c.messages(10) == msgs(a, a + 10)
    finish(srv, lock, j, c)
    assert srv.counters["logins_accepted"] == 1
    until(srv, lambda: srv.sessions()[0]["next_seq"] == 72)  # the server's count follows its sendfile
    (info,) = srv.sessions()
    assert info["user"] == "alice" and info["key"] == "alice" and info["logged_in"]


def test_reconnect_mid_stream_gets_exactly_the_rest(serve, lock):
    j = Journal(segment_bytes=500)
    append_batches(lock, j, msgs(1, 101, 50), 9)
    srv = serve({"alice": j})
    c = Client(srv.address)
    c.accepted("alice", "secret", seq=1)
    got = c.messages(37)
    c.close()  # mid-stream: the server has sent more than that
    until(srv, lambda: srv.counters["disconnects"] == 1)
    append(lock, j, msgs(101, 121, 50))  # more while it was away
    c = Client(srv.address)
    assert c.accepted("alice", "secret", seq=len(got) + 1) == (BLANK, 38)
    got += c.messages(83)
    assert got == msgs(1, 121, 50)
    finish(srv, lock, j, c)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first=st.integers(1, 5),
    before=st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=5), max_size=6),
    after=st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=5), max_size=4),
    pick=st.integers(0, 40),
)
def test_any_login_sequence_number(serve, lock, first, before, after, pick):
    """Random messages before and after a login at a random number: rejected 'S' outside the
    journal, else Login Accepted with the right number and then exactly the messages from it."""
    j = Journal(first_seq=first, segment_bytes=200)
    srv = serve({"alice": j})
    try:
        check_login(srv, lock, j, first, before, after, pick)
    finally:
        srv.stop()
        j.close()


def check_login(srv, lock, j, first, before, after, pick) -> None:
    model = [m for b in before for m in b]
    for b in before:
        append(lock, j, b)
    nxt = first + len(model)
    seq = pick % (nxt + 3)
    c = Client(srv.address)
    if seq != 0 and not first <= seq <= nxt:
        assert c.login("alice", "secret", seq=seq) == (b"J", b"S")
        assert c.until_closed() == []
        return
    start = nxt if seq == 0 else seq
    assert c.accepted("alice", "secret", seq=seq) == (BLANK, start)
    for b in after:
        append(lock, j, b)
        model += b
        srv.wake()
    assert c.messages(first + len(model) - start) == model[start - first :]
    finish(srv, lock, j, c)
    c.send(packet(b"O"))
    assert [p for p in c.until_closed() if p[0] != b"H"] == []
    until(srv, lambda: srv.counters["disconnect:logout"] == 1)


def test_sendfile_carries_every_byte(serve, lock, monkeypatch):
    sent = []
    real = os.sendfile

    def counting_sendfile(out_fd, in_fd, offset, count):
        n = real(out_fd, in_fd, offset, count)
        sent.append(n)
        return n

    monkeypatch.setattr(os, "sendfile", counting_sendfile)
    j = Journal(segment_bytes=1000)
    append_batches(lock, j, msgs(1, 201, 30), 20)
    with lock:
        spans = j.spans(1, 200)
    srv = serve({"alice": j})
    c = Client(srv.address)
    c.accepted("alice", "secret", seq=1)
    assert c.messages(200) == msgs(1, 201, 30)
    append(lock, j, msgs(201, 211, 30))
    srv.wake()
    assert c.messages(10) == msgs(201, 211, 30)
    backfill = sum(n for _, _, n in spans)
    assert len(spans) > 1 and backfill == 200 * (3 + 30)
    until(srv, lambda: srv.counters["live_bytes"] == 10 * 33)
    assert srv.counters["backfill_bytes"] == backfill
    assert sum(sent) == backfill + 10 * 33 == srv.counters["backfill_bytes"] + srv.counters["live_bytes"]
    assert len(sent) == srv.counters["sendfile_calls"]


# -- login rejected ----------------------------------------------------------------------------


def test_a_sequence_number_before_retention_is_rejected_S(serve, lock):
    j = Journal(segment_bytes=100)
    append_batches(lock, j, msgs(1, 60, 20), 4)
    with lock:
        assert j.retain(max_bytes=400) > 0
    first = j.first_seq
    assert first > 1
    srv = serve({"alice": j})
    for seq in (1, first - 1, j.next_seq + 1):
        c = Client(srv.address)
        assert c.login("alice", "secret", seq=seq) == (b"J", b"S")
        assert c.until_closed() == []
    assert srv.counters["login_rejected_S:retention"] == 2 and srv.counters["login_rejected_S:future"] == 1
    c = Client(srv.address)  # inside retention: accepted, everything retained
    assert c.accepted("alice", "secret", seq=first) == (BLANK, first)
    assert c.messages(60 - first) == msgs(first, 60, 20)
    finish(srv, lock, j, c)
    assert srv.counters["login_rejected_S"] == 3


def test_a_bad_password_or_user_is_rejected_A(serve, lock):
    srv = serve({"alice": Journal()})
    for user, pw in (("alice", "wrong"), ("carol", "secret")):
        c = Client(srv.address)
        assert c.login(user, pw) == (b"J", b"A")
        assert c.until_closed() == []
    until(srv, lambda: srv.counters["disconnect:login rejected"] == 2)
    assert srv.counters["login_rejected_A"] == 2 and srv.counters["logins_accepted"] == 0


def test_an_unknown_session_is_rejected_S(serve, lock):
    j = Journal()
    append(lock, j, msgs(1, 4), session=b"TODAY     ")
    srv = serve({"alice": j, "bob": None})
    c = Client(srv.address)
    assert c.login("alice", "secret", session=b"YESTERDAY ", seq=1) == (b"J", b"S")
    assert c.until_closed() == []
    c = Client(srv.address)  # no journal for bob
    assert c.login("bob", "hunter2") == (b"J", b"S")
    c = Client(srv.address)  # the current session by name
    assert c.accepted("alice", "secret", session=b"TODAY     ", seq=2) == (b"TODAY     ", 2)
    assert c.messages(2) == msgs(2, 4)
    until(srv, lambda: srv.counters["login_rejected_S"] == 2)
    assert srv.counters["login_rejected_S:session"] == 1 and srv.counters["login_rejected_S:no journal"] == 1


def test_an_empty_journal_takes_its_session_from_session_of(serve, lock):
    j = Journal(first_seq=7)
    srv = serve({"alice": j}, session_of=lambda key: b"S-" + key.encode().ljust(8))
    c = Client(srv.address)
    assert c.accepted("alice", "secret", seq=7) == (b"S-alice   ", 7)
    append(lock, j, msgs(7, 9), session=b"S-alice   ")
    srv.wake()
    assert c.messages(2) == msgs(7, 9)


def test_a_login_to_an_empty_journal_follows_its_first_session(serve, lock):
    """A login before anything is journaled gets the blank session; the first message's session
    is then the stream's, not a new one (no End of Session)."""
    j = Journal()
    srv = serve({"alice": j})
    c = Client(srv.address)
    assert c.accepted("alice", "secret", seq=0) == (BLANK, 1)
    append(lock, j, msgs(1, 4), session=b"MONDAY    ")
    srv.wake()
    assert c.messages(3) == msgs(1, 4)
    append(lock, j, msgs(4, 6), session=b"MONDAY    ")
    srv.wake()
    assert c.messages(2) == msgs(4, 6)
    assert srv.counters["disconnects"] == 0 and srv.sessions()[0]["session"] == "MONDAY    "


def test_a_new_session_ends_the_old_one(serve, lock):
    j = Journal()
    append(lock, j, msgs(1, 6), session=b"MONDAY    ")
    srv = serve({"alice": j})
    c = Client(srv.address)
    assert c.accepted("alice", "secret", seq=2) == (b"MONDAY    ", 2)
    assert c.messages(4) == msgs(2, 6)
    append(lock, j, msgs(6, 9), session=b"TUESDAY   ")
    srv.wake()
    assert c.until_closed() == [(b"Z", b"")]
    c = Client(srv.address)  # the old session's messages are not the current session's
    assert c.login("alice", "secret", seq=3) == (b"J", b"S")
    c = Client(srv.address)
    assert c.accepted("alice", "secret", seq=6) == (b"TUESDAY   ", 6)
    assert c.messages(3) == msgs(6, 9)
    until(srv, lambda: srv.counters["disconnect:end of session"] == 1)


# -- holes -------------------------------------------------------------------------------------


def test_a_hole_disconnects_and_a_login_in_it_is_rejected(serve, lock):
    j = Journal()
    append(lock, j, msgs(1, 6))
    with lock:
        j.skip(9)  # 6, 7, 8 sent but never journaled
    append(lock, j, msgs(9, 13))
    srv = serve({"alice": j})
    c = Client(srv.address)
    c.accepted("alice", "secret", seq=2)
    assert c.messages(4) == msgs(2, 6)
    rest = c.until_closed()  # a Debug packet that says why, then the end
    assert [t for t, _ in rest] == [b"+"] and b"log in again at 9" in rest[0][1]
    until(srv, lambda: srv.counters["disconnect:hole"] == 1)
    for seq in (6, 8):
        c = Client(srv.address)
        assert c.login("alice", "secret", seq=seq) == (b"J", b"S")
    assert srv.counters["login_rejected_S:hole"] == 2
    c = Client(srv.address)
    with lock:
        resume = j.available_from(6)
    assert c.accepted("alice", "secret", seq=resume) == (BLANK, 9)
    assert c.messages(4) == msgs(9, 13)
    finish(srv, lock, j, c)


def test_a_hole_in_live_data_disconnects(serve, lock):
    j = Journal()
    append(lock, j, msgs(1, 3))
    srv = serve({"alice": j})
    c = Client(srv.address)
    assert c.accepted("alice", "secret") == (BLANK, 3)  # live only
    append(lock, j, msgs(3, 5))
    srv.wake()
    assert c.messages(2) == msgs(3, 5)
    with lock:
        j.skip(6)
    append(lock, j, msgs(6, 8))
    srv.wake()
    assert [t for t, _ in c.until_closed()] == [b"+"]
    until(srv, lambda: srv.counters["disconnect:hole"] == 1)


# -- heartbeats, timeouts, logout --------------------------------------------------------------


def test_heartbeats_when_idle_and_timeouts(serve, lock):
    clock = FakeClock()
    j = Journal()
    srv = serve({"alice": j}, clock=clock, heartbeat_s=1.0, client_timeout_s=15.0)
    c = Client(srv.address)
    assert c.accepted("alice", "secret") == (BLANK, 1)
    idle = Client(srv.address)  # connected, never logs in
    until(srv, lambda: len(srv.sessions()) == 2)
    for k in range(1, 4):
        clock.t += 1.0
        srv.wake()
        assert c.packet() == (b"H", b"")
        assert srv.counters["heartbeats_sent"] == k
    c.send(packet(b"R"))  # the client's heartbeat keeps it alive
    until(srv, lambda: srv.counters["client_heartbeats"] == 1)
    clock.t += 13.0  # 16 s after the login: the idle one timed out, the client sent 13 s ago
    srv.wake()
    assert idle.until_closed() == []
    until(srv, lambda: srv.counters["disconnect:login timeout"] == 1)
    assert [s["user"] for s in srv.sessions()] == ["alice"]
    clock.t += 2.1  # 15.1 s since the client's heartbeat
    srv.wake()
    assert set(t for t, _ in c.until_closed()) <= {b"H"}
    until(srv, lambda: srv.counters["disconnect:client timeout"] == 1)


def test_a_logout_closes_the_connection(serve, lock):
    srv = serve({"alice": Journal()})
    c = Client(srv.address)
    c.accepted("alice", "secret")
    c.send(packet(b"+", b"hello") + packet(b"O"))
    assert set(t for t, _ in c.until_closed()) <= {b"H"}
    until(srv, lambda: srv.counters["disconnect:logout"] == 1)
    assert srv.counters["debug_in"] == 1 and srv.sessions() == []


def test_end_session_comes_after_what_is_owed(serve, lock):
    j = Journal()
    append(lock, j, msgs(1, 51, 100))
    srv = serve({"alice": j})
    c = Client(srv.address)
    c.accepted("alice", "secret", seq=1)
    srv.end_session("alice")
    assert [p for p in c.until_closed() if p[0] != b"H"] == [(b"S", m) for m in msgs(1, 51, 100)] + [(b"Z", b"")]
    until(srv, lambda: srv.counters["disconnect:end of session"] == 1)


def test_malformed_input_is_a_protocol_error(serve, lock):
    srv = serve({"alice": Journal()})
    c = Client(srv.address)
    c.send(packet(b"U", b"too early"))
    rest = c.until_closed()
    assert [t for t, _ in rest] == [b"+"] and b"before login" in rest[0][1]
    c = Client(srv.address)
    c.accepted("alice", "secret")
    c.send(packet(b"S", b"a server's packet"))
    assert [t for t, _ in c.until_closed() if t != b"H"] == [b"+"]
    c = Client(srv.address)
    c.accepted("alice", "secret")
    c.send(login_request("alice", "secret"))
    assert [t for t, _ in c.until_closed() if t != b"H"] == [b"+"]
    until(srv, lambda: srv.counters["disconnect:protocol error"] == 3)
    assert srv.counters["protocol_errors"] == 3


# -- unsequenced data --------------------------------------------------------------------------


def test_unsequenced_data_round_trip(serve, lock):
    seen = []

    def on_unsequenced(key, payload):
        seen.append((key, payload))
        return None if payload == b"quiet" else b"echo:" + payload

    j = Journal()
    srv = serve({"alice": j}, on_unsequenced=on_unsequenced)
    c = Client(srv.address)
    c.accepted("alice", "secret")
    c.send(packet(b"U", b"hello"))
    assert c.data_packet() == (b"U", b"echo:hello")
    c.send(packet(b"U", b"quiet") + packet(b"U", b"x"))
    assert c.data_packet() == (b"U", b"echo:x")  # nothing for "quiet"
    append(lock, j, [b"seq"])  # sequenced data and replies share the stream, whole packets each
    srv.wake()
    assert c.data_packet() == (b"S", b"seq")
    assert seen == [("alice", b"hello"), ("alice", b"quiet"), ("alice", b"x")]
    assert srv.counters["unsequenced_in"] == 3 and srv.counters["unsequenced_out"] == 2


# -- a client that does not read ---------------------------------------------------------------


def socket_buffers() -> int:
    """Bytes the kernel may buffer for one loopback connection at most (send and receive)."""
    try:
        wmem = int(open("/proc/sys/net/ipv4/tcp_wmem").read().split()[2])
    except (OSError, ValueError, IndexError):
        wmem = 4 << 20
    return wmem + (1 << 20)


def test_a_stalled_client_is_cut_and_the_others_are_unaffected(serve, lock):
    clock = FakeClock()
    j = Journal()
    size = 4000
    count = 2 * socket_buffers() // size + 1000  # far more than the stalled client's buffers hold
    for a in range(1, count + 1, 1000):
        append(lock, j, msgs(a, min(a + 1000, count + 1), size))
    srv = serve({"alice": j}, clock=clock, heartbeat_s=1e6, client_timeout_s=1e6, stall_timeout_s=5.0)
    stalled = Client(srv.address, rcvbuf=4096)
    stalled.accepted("alice", "secret", seq=1)  # and never reads again
    reader = Client(srv.address)
    reader.accepted("alice", "secret", seq=1)
    got = reader.messages(count)  # while the stalled one takes nothing
    assert got == msgs(1, count + 1, size)
    name = stalled.peer_name
    until(srv, lambda: any(s["peer"] == name and s["stalled"] for s in srv.sessions()))
    assert srv.counters["disconnects"] == 0
    clock.t += 5.1
    srv.wake()
    until(srv, lambda: srv.counters["disconnect:stalled"] == 1)
    assert [d["peer"] for d in srv.disconnected] == [name]
    assert [s["peer"] for s in srv.sessions()] == [reader.peer_name]
    finish(srv, lock, j, reader)  # still served


# -- another implementation's client -----------------------------------------------------------


def test_the_nasdaq_protocols_client_logs_in_and_gets_backfill_and_live(serve, lock):
    soup = pytest.importorskip("nasdaq_protocols.soup", reason="pip install nasdaq-protocols==1.3.0")
    j = Journal(segment_bytes=200)
    append_batches(lock, j, msgs(1, 21), 6)
    srv = serve({"alice": j})

    async def session() -> list[bytes]:
        s = await asyncio.wait_for(soup.connect_async(srv.address, "alice", "secret", sequence=1), HANG_S)
        got = [(await asyncio.wait_for(s.receive_msg(), HANG_S)).data for _ in range(20)]
        append(lock, j, [b"live"])
        srv.wake()
        msg = await asyncio.wait_for(s.receive_msg(), HANG_S)
        assert isinstance(msg, soup.SequencedData) and s.sequence == 21
        got.append(msg.data)
        s.logout()
        await s.close()
        return got

    assert asyncio.run(session()) == msgs(1, 21) + [b"live"]
    until(srv, lambda: srv.counters["disconnect:logout"] == 1)
    assert srv.counters["logins_accepted"] == 1 and srv.counters["protocol_errors"] == 0
