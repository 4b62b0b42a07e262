"""The journal feed (subc/recovery/journal_feed.py) against a model of the kernel's ring buffer.

The model runs the data plane's protocol (subc_journal.h) on two CPUs, step by step in a random
interleaving: reserve the copy's record (or find the ring full), take the recipient's next
sequence numbers (a shared counter), write the payload record when the payload is long (or find
the ring full), submit.  The consumer drains at random moments, seeing only the records committed
before the first one still reserved, as the kernel's ring buffer shows them.  Records are packed
here with ``struct`` from the C layout, and the payloads built here from the MoldUDP64 layout.

Checked: each journal holds exactly the messages sent with the numbers they were sent with; every
number whose record was lost is a hole, no other; nothing is journaled twice, even when the feed
is restarted on the same ring (its read position back at the released one)."""

from __future__ import annotations

import ctypes as ct
import os
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.recovery.journal import Journal
from subc.recovery.journal_feed import JournalFeed

SESSION = b"SESSION007"
HEAD = struct.Struct("<IHH")
INLINE = 248
PAYLOAD, NEXT, LOST, BODY = 1, 2, 4, 8


def mold(seq: int, msgs: list[bytes]) -> bytes:
    return struct.pack(">10sQH", SESSION, seq, len(msgs)) + b"".join(struct.pack(">H", len(m)) + m for m in msgs)


BUSY, DISCARD = 1 << 31, 1 << 30


class FakeRing:
    """The kernel's ring buffer, byte for byte as a reader maps it: records of an 8-byte header
    (length with the busy and discard bits) and the record, rounded up to 8 bytes, in ``size``
    bytes of data kept twice in a row (the kernel maps the data pages twice), so that the C walk
    reads it as it reads the real one; producer and consumer positions."""

    def __init__(self, size: int):
        self.size, self.mask = size, size - 1
        self.mem = ct.create_string_buffer(2 * size)
        self.address = ct.addressof(self.mem)
        self.view = memoryview(self.mem).cast("B")
        self.prod = self.cons = 0

    def _put(self, at: int, data: bytes) -> None:
        o = at & self.mask
        end = o + len(data)
        self.view[o:end] = data
        a, b = o, min(end, self.size)
        if a < b:
            self.view[a + self.size : b + self.size] = self.view[a:b]
        a, b = max(o, self.size), end
        if a < b:
            self.view[a - self.size : b - self.size] = self.view[a:b]

    def reserve(self, n: int) -> int | None:
        total = (n + 8 + 7) & ~7
        if self.prod + total - self.cons > self.size:
            return None
        pos = self.prod
        self._put(pos, struct.pack("<II", n | BUSY, 0))
        self.prod += total
        return pos

    def commit(self, pos: int, data: bytes, discard: bool = False) -> None:
        n = struct.unpack_from("<I", self.view, pos & self.mask)[0] & ~BUSY
        assert len(data) == n
        self._put(pos + 8, data)
        self._put(pos, struct.pack("<I", n | (DISCARD if discard else 0)))

    @property
    def consumer(self) -> int:
        return self.cons

    @property
    def producer(self) -> int:
        return self.prod

    def read(self, pos: int, limit: int | None = None):
        out = []
        while pos < self.prod and (limit is None or len(out) < limit):
            length = struct.unpack_from("<I", self.view, pos & self.mask)[0]
            if length & BUSY:
                break
            n = length & ~(BUSY | DISCARD)
            if not length & DISCARD:
                at = (pos & self.mask) + 8
                out.append((pos, self.view[at : at + n]))
            pos += (n + 8 + 7) & ~7
        return out, pos

    def release(self, pos: int) -> None:
        assert self.cons <= pos <= self.prod
        self.cons = pos


class Kernel:
    """Two CPUs sending copies (recipient, messages), each through the journal protocol."""

    def __init__(self, ring: FakeRing, rnd: random.Random, fail: float):
        self.ring, self.rnd, self.fail = ring, rnd, fail
        self.seq: dict[int, int] = {}
        self.sent: dict[int, dict[int, bytes]] = {}  # recipient -> seq -> message
        self.unjournaled: dict[int, set[int]] = {}
        self.lost = 0  # copies not journaled (journal_lost): counted in the step that takes the number

    def copy_steps(self, r: int, msgs: list[bytes]):
        """A generator: one step of the protocol per next()."""
        body_len = 20 + sum(2 + len(m) for m in msgs)
        full = self.rnd.random() < self.fail
        pos = None if full else self.ring.reserve(HEAD.size + INLINE)
        yield
        seq = self.seq.get(r, 1)
        self.seq[r] = seq + len(msgs)
        self.lost += pos is None  # (the kernel counts a failed reservation just before the number)
        for k, m in enumerate(msgs):
            self.sent.setdefault(r, {})[seq + k] = m
        payload = mold(seq, msgs)
        assert len(payload) == body_len
        yield
        if pos is not None and self.rnd.random() < self.fail / 4:  # the payload could not be loaded
            self.ring.commit(pos, bytes(HEAD.size + INLINE), discard=True)
            self.lost += 1
            pos = None
        if pos is None:
            self.unjournaled.setdefault(r, set()).update(range(seq, seq + len(msgs)))
            return
        if body_len <= INLINE:
            data = HEAD.pack(r, body_len, PAYLOAD) + payload + bytes(INLINE - body_len)
        else:
            bpos = None if self.rnd.random() < self.fail else self.ring.reserve(HEAD.size + body_len)
            if bpos is None:
                flags = LOST
                self.lost += 1
                self.unjournaled.setdefault(r, set()).update(range(seq, seq + len(msgs)))
            else:
                yield
                self.ring.commit(bpos, HEAD.pack(r, body_len, BODY) + payload)
                flags = NEXT
            data = HEAD.pack(r, body_len, flags) + payload[:20] + bytes(INLINE - 20)
        yield
        self.ring.commit(pos, data)


COPIES = st.lists(
    st.tuples(st.integers(1, 2), st.lists(st.binary(min_size=0, max_size=200), min_size=1, max_size=4)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    copies=COPIES,
    seed=st.integers(0, 2**32 - 1),
    fail=st.sampled_from([0.0, 0.1, 0.4]),
    capacity=st.sampled_from([1 << 20, 2048]),
    restart=st.booleans(),
    fast=st.booleans(),
    counted=st.booleans(),
)
def test_every_copy_is_journaled_or_a_hole_exactly(copies, seed, fail, capacity, restart, fast, counted):
    """Both paths of the feed: the C walk with the Python path for what it leaves (``fast``),
    and the Python path alone; with the kernel's loss count (``counted``: the kernel's next
    numbers are read only when it moved) and without."""
    rnd = random.Random(seed)
    ring = FakeRing(capacity)
    kernel = Kernel(ring, rnd, fail)
    journals = {r: Journal(None, segment_bytes=300) for r in (1, 2, 3)}
    reads = []
    sent_next = lambda: reads.append(1) or dict(kernel.seq)  # noqa: E731
    lost_total = (lambda: kernel.lost) if counted else None
    feed = JournalFeed(ring, journals.get, sent_next=sent_next, recipients=journals, fast=fast, lost_total=lost_total)
    assert feed.path == ("c" if fast else "python")
    todo = list(copies)
    cpus: list = [None, None]
    while todo or any(cpus):
        c = rnd.randrange(3)
        if c == 2:
            feed.drain(limit=rnd.choice([None, 1, 3]))
            if restart and rnd.random() < 0.3:  # a new feed on the same ring: from the released position
                feed = JournalFeed(
                    ring, journals.get, sent_next=sent_next, recipients=journals, fast=fast, lost_total=lost_total
                )
            continue
        if cpus[c] is None:
            if not todo:
                continue
            r, msgs = todo.pop(0)
            cpus[c] = kernel.copy_steps(r, msgs)
        try:
            next(cpus[c])
        except StopIteration:
            cpus[c] = None
    for _ in range(4):  # everything committed: the feed settles every gap
        feed.drain()
    assert feed.held == 0
    for r, j in journals.items():
        sent = kernel.sent.get(r, {})
        lost = kernel.unjournaled.get(r, set())
        end = max(sent, default=0) + 1
        assert j.next_seq == end
        for s in range(1, end):
            got = j.read(s, 1, session=SESSION)
            if s in lost:
                assert got == [] and j.session_of(s) is None, (r, s)
            else:
                assert got == [sent[s]], (r, s, got)
        assert j.hole_messages == len(lost)
    assert feed.counters["bad_records"] == 0 and feed.counters["orphan_payloads"] == 0
    if counted and kernel.lost == 0 and not restart:  # no loss: read on the first two idle passes only
        assert len(reads) <= 2


@pytest.mark.parametrize("fast", [True, False])
def test_payloads_in_records_of_their_own(fast):
    """Copies longer than a record holds (their payload in the next record, one CPU), mixed with
    short ones, ring wrapping: journaled exactly, by either path."""
    rnd = random.Random(7)
    ring = FakeRing(4096)
    kernel = Kernel(ring, rnd, 0.0)
    journals = {r: Journal(None, segment_bytes=500) for r in (1, 2)}
    feed = JournalFeed(ring, journals.get, sent_next=lambda: dict(kernel.seq), recipients=journals, fast=fast)
    for k in range(300):
        msgs = [bytes([k % 251]) * rnd.choice([10, 150, 300]) for _ in range(rnd.randint(1, 3))]
        for _ in kernel.copy_steps(1 + k % 2, msgs):
            pass
        if k % 3 == 0:
            feed.drain()
    feed.drain()
    for r, j in journals.items():
        sent = kernel.sent[r]
        assert j.next_seq == max(sent) + 1 and j.hole_messages == 0
        assert j.read(1, len(sent), session=SESSION) == [sent[s] for s in range(1, len(sent) + 1)]


@pytest.mark.parametrize("fast", [True, False])
def test_a_failed_write_is_a_hole_and_counted(fast):
    """A journal segment that refuses writes (here: its descriptor swapped for a read-only one):
    the copies the feed could not write become a hole, counted in ``write_errors``, and the
    feed goes on with the next segment."""
    rnd = random.Random(3)
    ring = FakeRing(1 << 16)
    kernel = Kernel(ring, rnd, 0.0)
    j = Journal(None, segment_bytes=1 << 20)
    feed = JournalFeed(ring, {1: j}.get, sent_next=lambda: dict(kernel.seq), recipients=[1], fast=fast)
    for _ in kernel.copy_steps(1, [b"first"]):
        pass
    feed.drain()
    assert j.next_seq == 2 and j.hole_messages == 0
    seg = j.segments[-1]
    good = seg.fd
    seg.fd = os.open("/dev/null", os.O_RDONLY)
    try:
        for k in range(3):
            for _ in kernel.copy_steps(1, [b"lost%d" % k, b"also"]):
                pass
        feed.drain()
    finally:
        os.close(seg.fd)
        seg.fd = good
    assert feed.counters["write_errors"] >= 1
    assert j.next_seq == 8 and j.hole_messages == 6 and j.holes == [(2, 7)]
    assert j.read(1, 1, session=SESSION) == [b"first"]
    assert j.read(2, 6, session=SESSION) == []
    for _ in kernel.copy_steps(1, [b"after"]):  # a new segment takes the next ones
        pass
    feed.drain()
    assert j.read(8, 1, session=SESSION) == [b"after"]
