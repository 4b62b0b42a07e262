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
@given(batches=BATCHES, seg=st.sampled_from([1, 40, 200, 1 << 20]), reads=st.lists(
    st.tuples(st.integers(0, 120), st.integers(-1, 40), st.one_of(st.none(), st.integers(1, 300))), max_size=20))
def test_reads_give_the_messages_appended(tmp_path_factory, batches, seg, reads):
    for directory in (None, tmp_path_factory.mktemp("j")):
        with Journal(directory, segment_bytes=seg) as j:
            model = append_all(j, batches)
            assert j.next_seq == len(model) + 1 and j.first_seq == 1
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


def test_a_gap_or_a_long_message_is_refused(tmp_path):
    with Journal(tmp_path) as j:
        j.append(1, [b"a", b"b"])
        with pytest.raises(JournalError, match="expects sequence number 3"):
            j.append(5, [b"c"])
        with pytest.raises(JournalError, match="does not fit"):
            j.append(3, [b"ok", bytes(0xFFFF)])
        assert j.next_seq == 3 and j.read(1, 10) == [b"a", b"b"]  # nothing of the refused batch


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
