"""The journal of a stream (subc/recovery/journal.py) against a list of the messages appended.

Packets are built here from the SoupBinTCP 4.1 layout (2-byte big-endian length counting the type
byte, type 'S', the message), not with the journal's code.  Random batches, reads, byte budgets,
retention, reopening (after a torn write) and ``os.sendfile`` of the spans are checked."""

from __future__ import annotations

import os
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.recovery.journal import Journal, JournalError

MESSAGES = st.binary(min_size=0, max_size=60)
BATCHES = st.lists(st.lists(MESSAGES, min_size=1, max_size=8), min_size=1, max_size=25)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def soup(msg: bytes) -> bytes:
    return struct.pack(">H", len(msg) + 1) + b"S" + msg


def expected(model: list[bytes], first: int, seq: int, count: int, max_bytes: int | None) -> list[bytes]:
    """Messages seq .. seq + count - 1 of ``model`` (message k has sequence number k + 1) that a
    journal retaining from ``first`` holds, the leading ones within ``max_bytes`` (at least one)."""
    if count <= 0 or seq < first or seq > len(model):
        return []
    out = model[seq - 1 : seq - 1 + count]
    if max_bytes is None:
        return out
    kept, used = [], 0
    for m in out:
        if used + len(soup(m)) > max_bytes and kept:
            break
        kept.append(m)
        used += len(soup(m))
        if used > max_bytes:  # the first alone, larger than the budget
            break
    return kept


def append_all(j: Journal, batches: list[list[bytes]], now: float = 0.0) -> list[bytes]:
    model: list[bytes] = []
    for b in batches:
        j.append(len(model) + 1, b, now=now)
        model += b
    return model


@SETTINGS
@given(
    batches=BATCHES,
    seg=st.sampled_from([1, 40, 200, 1 << 20]),
    reads=st.lists(
        st.tuples(st.integers(0, 120), st.integers(-1, 40), st.one_of(st.none(), st.integers(1, 300))), max_size=20
    ),
)
def test_reads_give_the_messages_appended(tmp_path_factory, batches, seg, reads):
    for directory in (None, tmp_path_factory.mktemp("j")):
        with Journal(directory, segment_bytes=seg) as j:
            model = append_all(j, batches)
            assert j.next_seq == len(model) + 1 and j.first_seq == 1
            # a segment never grows past its size, unless one packet alone is larger
            assert all(sg.size <= max(seg, max(len(soup(m)) for m in model)) for sg in j.segments)
            for seq, count, budget in reads:
                want = expected(model, 1, seq, count, budget)
                assert j.read(seq, count, budget) == want, (seq, count, budget)
                sent = b"".join(os.pread(fd, n, off) for fd, off, n in j.spans(seq, count, budget))
                assert sent == b"".join(soup(m) for m in want)


@SETTINGS
@given(batches=BATCHES, seg=st.sampled_from([1, 64, 500]), torn=st.binary(min_size=1, max_size=30))
def test_a_reopened_journal_holds_every_whole_batch(tmp_path_factory, batches, seg, torn):
    d = tmp_path_factory.mktemp("j")
    with Journal(d, segment_bytes=seg) as j:
        model = append_all(j, batches)
    last = sorted(d.glob("*.seg"))[-1]
    with open(last, "ab") as f:  # a batch cut by a crash: a partial packet at the end
        f.write(struct.pack(">H", len(torn) + 10) + b"S" + torn)
    with Journal(d, segment_bytes=seg) as j:
        assert j.next_seq == len(model) + 1
        assert j.read(1, len(model) + 5) == model
        j.append(j.next_seq, [b"after"])
        assert j.read(len(model) + 1, 1) == [b"after"]


def test_a_number_journaled_already_or_a_long_message_is_refused(tmp_path):
    with Journal(tmp_path) as j:
        j.append(1, [b"a", b"b"])
        with pytest.raises(JournalError, match="expects sequence number 3"):
            j.append(2, [b"c"])
        with pytest.raises(JournalError, match="does not fit"):
            j.append(3, [b"ok", bytes(0xFFFF)])
        assert j.next_seq == 3 and j.read(1, 10) == [b"a", b"b"]  # nothing of the refused batch
        with pytest.raises(JournalError, match="2 messages expected"):
            j.append_packets(3, soup(b"x"), 2)


SESSIONS = st.sampled_from([b"SESSION001", b"SESSION002"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(MESSAGES, min_size=1, max_size=5), SESSIONS, st.integers(0, 3)),
        st.tuples(st.just("skip"), st.integers(1, 4)),
    ),
    min_size=1,
    max_size=30,
)


@SETTINGS
@given(ops=OPS, seg=st.sampled_from([1, 80, 1 << 20]), data=st.data())
def test_holes_and_sessions_are_never_served_as_messages(tmp_path_factory, ops, seg, data):
    """Appends under two sessions, some past the next number (a hole before them), and skips:
    every read returns exactly the journaled messages of the session asked, from the first asked,
    stopping at a hole or another session; a reopened directory says the same."""
    d = tmp_path_factory.mktemp("j")
    model: dict[int, tuple[bytes, bytes]] = {}  # seq -> (session, message)
    nxt = 1
    with Journal(d, segment_bytes=seg) as j:
        for op in ops:
            if op[0] == "append":
                _, msgs, session, gap = op
                j.append(nxt + gap, msgs, session=session)
                for k, m in enumerate(msgs):
                    model[nxt + gap + k] = (session, m)
                nxt += gap + len(msgs)
            else:
                j.skip(nxt + op[1])
                nxt += op[1]
        assert j.next_seq == nxt
        assert j.hole_messages == nxt - 1 - len(model)
    for reopened in (False, True):
        with Journal(d, segment_bytes=seg) as j:
            if not reopened:
                j.next_seq = nxt  # (the same journal's state; a reopened one ends at its last message)
            for seq in range(0, nxt + 2):
                want_session = model.get(seq, (None,))[0]
                assert j.session_of(seq) == want_session
                later = [s for s in model if s >= seq]
                assert j.available_from(seq) == (min(later) if later else None)
                session = data.draw(SESSIONS)
                count = data.draw(st.integers(1, 6))
                want = []
                for s in range(seq, seq + count):
                    if s not in model or model[s][0] != session:
                        break
                    want.append(model[s][1])
                assert j.read(seq, count, session=session) == want, (seq, count, session)


@SETTINGS
@given(batches=BATCHES, seg=st.sampled_from([50, 120]), bound=st.integers(0, 400))
def test_retention_bounds_the_bytes_and_keeps_the_newest(tmp_path_factory, batches, seg, bound):
    d = tmp_path_factory.mktemp("j")
    with Journal(d, segment_bytes=seg) as j:
        model = append_all(j, batches)
        dropped = j.retain(max_bytes=bound)
        on_disk = sum(p.stat().st_size for p in d.glob("*.seg"))
        assert on_disk == j.size
        newest = j.segments[-1].size
        assert j.size <= max(bound, 0) + newest  # the segment being written always stays
        first = j.first_seq
        assert dropped == j.dropped_messages == first - 1
        assert j.read(1, len(model)) == ([] if first > 1 else model)
        assert j.read(first, len(model)) == model[first - 1 :]


def test_retention_by_age_drops_old_segments_only(tmp_path):
    with Journal(tmp_path, segment_bytes=10) as j:
        j.append(1, [b"x" * 20], now=100.0)
        j.append(2, [b"y" * 20], now=200.0)
        j.append(3, [b"z" * 20], now=300.0)
        assert j.retain(max_age_s=150, now=320.0) == 1 and j.first_seq == 2
        assert j.retain(max_age_s=1, now=10_000.0) == 1 and j.first_seq == 3  # never the newest segment
        assert j.read(3, 1) == [b"z" * 20]


def test_spans_go_to_a_socket_with_sendfile(tmp_path):
    with Journal(tmp_path, segment_bytes=30) as j:
        msgs = [bytes([k]) * (k + 1) for k in range(12)]
        j.append(1, msgs)
        a, b = socket.socketpair()
        with a, b:
            for fd, off, n in j.spans(3, 8):
                while n:
                    sent = os.sendfile(a.fileno(), fd, off, n)
                    off, n = off + sent, n - sent
            a.shutdown(socket.SHUT_WR)
            got = b""
            while chunk := b.recv(4096):
                got += chunk
        assert got == b"".join(soup(m) for m in msgs[2:10])
