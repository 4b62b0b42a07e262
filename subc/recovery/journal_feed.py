"""The journal feed: the copies the eBPF data plane sent, read from its BPF ring buffer and
appended to each subscriber's journal (:mod:`.journal`), exactly: every copy sent is journaled
under the sequence number it was sent with, or named as a hole (sent, not journaled), never
anything else.

The records (``subc/backends/ebpf/bpf/subc_journal.h``; the C is the reference for the constants
below): one per copy, ``struct subc_jrec`` (recipient ``u32``, payload length ``u16``, flags
``u16``, then 248 bytes) holding the copy's UDP payload as sent (MoldUDP64 header with the
recipient's session, sequence number and count, then the message blocks) when it fits
(``PAYLOAD``), else its 20-byte MoldUDP64 header with the payload in a record of its own that
follows in the ring (``NEXT``; the payload record: a ``struct subc_jhdr`` with ``BODY``, then the
payload), or the header alone when the payload record found the ring full (``LOST``: those
messages are a hole).

Order and exactness.  A recipient's records can leave the ring out of sequence order (two CPUs
copying at once); the feed holds a record past the next expected number.  The kernel reserves a
record before taking its sequence number, so once the feed has read up to the producer position
it read after holding a record, a number still missing was never journaled (the ring was full:
the kernel counted it in ``journal_lost``): the feed records the hole and goes on.  No timeout is
involved.  The ring's space is released only up to the oldest record still held, so a feed that
is killed and restarted reads every record it had not journaled again (the journaled ones are
skipped as duplicates).
"""

from __future__ import annotations

import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from .feed_fast import FastPath
from .journal import Journal, JournalError
from .native import WALK_FULL, WALK_SLOW

#: ``struct subc_jrec`` / ``struct subc_jhdr``: recipient, payload length, flags.
JREC_HEAD = struct.Struct("<IHH")
#: Bytes of a ``struct subc_jrec`` (SUBC_JREC_INLINE payload bytes after its head).
JREC_INLINE = 248
JREC_BYTES = JREC_HEAD.size + JREC_INLINE
#: Record flags (subc_journal.h).
FLAG_PAYLOAD, FLAG_NEXT, FLAG_LOST, FLAG_BODY = 1, 2, 4, 8
#: MoldUDP64 downstream header: session (10 bytes), sequence number (8), message count (2).
MOLD_HEADER = struct.Struct(">10sQH")


class Ring(Protocol):
    """What the feed needs of a ring buffer (:class:`subc.dataplane.ebpf.ringbuf.RingReader`)."""

    @property
    def consumer(self) -> int: ...

    @property
    def producer(self) -> int: ...

    def read(self, pos: int, limit: int | None = None) -> tuple[list[tuple[int, memoryview]], int]: ...

    def release(self, pos: int) -> None: ...


@dataclass
class Copy:
    """One copy a recipient was sent: its session (10 bytes), first sequence number, message
    count, its message blocks as SoupBinTCP packets (None: not journaled, a hole) and the ring
    position of its record."""

    session: bytes
    seq: int
    count: int
    packets: bytes | None
    pos: int


#: Longest interval (s) between two reads of the kernel's next numbers while it counts no loss.
SENT_READ_S = 1.0


def soup_packets(payload: bytes | memoryview, count: int) -> bytes:
    """The SoupBinTCP Sequenced Data packets (2-byte length counting the type byte, ``S``, the
    message) of the ``count`` MoldUDP64 message blocks (2-byte length, the message) after the
    20-byte header of ``payload``.  Raises ValueError when the blocks are not ``count`` blocks
    filling the payload exactly."""
    out = bytearray()
    pos, end = MOLD_HEADER.size, len(payload)
    n = 0
    while pos < end:
        if pos + 2 > end:
            raise ValueError("a message block's length is cut")
        length = (payload[pos] << 8) | payload[pos + 1]
        if pos + 2 + length > end:
            raise ValueError("a message block runs past the payload")
        out += (length + 1).to_bytes(2, "big")
        out += b"S"
        out += payload[pos + 2 : pos + 2 + length]
        pos += 2 + length
        n += 1
    if n != count:
        raise ValueError(f"the header counts {count} messages, the payload holds {n}")
    return bytes(out)


def _joins(a: Copy, b: Copy) -> bool:
    """Whether copy ``b`` can be appended in one write with ``a`` (both journaled, one session)."""
    return a.packets is not None and b.packets is not None and a.session == b.session


class JournalFeed:
    """Reads ``ring`` and appends each recipient's copies to ``journal_of(recipient)`` (None:
    the recipient is not journaled, its records are counted and dropped).  ``lock`` is held while
    journals are written (the request server reads them under it).  ``sent_next``: the kernel's
    next sequence number per recipient (the ``subc_seq`` map), read when the ring is idle, so that
    a lost last copy is a hole too; ``lost_total``: the kernel's count of copies not journaled
    (``journal_lost``), which spares those reads while it stays put (:meth:`_read_sent`).  See
    the module docstring."""

    def __init__(
        self,
        ring: Ring,
        journal_of: Callable[[int], Journal | None],
        lock: threading.Lock | None = None,
        clock: Callable[[], float] = time.time,
        sent_next: Callable[[], dict[int, int]] | None = None,
        recipients: Iterable[int] = (),
        fast: bool = True,
        lost_total: Callable[[], int] | None = None,
    ):
        self.ring, self.journal_of, self.clock = ring, journal_of, clock
        self.sent_next, self.lost_total = sent_next, lost_total
        self._lost_seen: int | None = None
        self._reread, self._sent_at = True, 0.0
        self.lock = lock or threading.Lock()
        self.read_pos = ring.consumer
        self.counters: Counter = Counter()
        self._bodies: dict[tuple[int, int], Copy] = {}  # NEXT records awaiting their payload
        self._held: dict[int, dict[int, Copy]] = {}  # recipient -> seq -> copy past its next number
        self._marks: dict[int, tuple[int, int]] = {}  # recipient -> (end of its gap, producer position settling it)
        self._out: dict[int, list[Copy]] = {}  # copies to append in this pass, per recipient
        self._touched: set[int] = set()  # recipients the Python path handled since the last sync
        self._fast = FastPath(ring, journal_of, list(recipients)) if fast and recipients else None
        if self._fast is not None and not self._fast.ready:
            self._fast = None
        self.path = "c" if self._fast is not None else "python"

    # -- one pass ------------------------------------------------------------------------------

    def drain(self, limit: int | None = None) -> int:
        """Read the records committed so far (at most about ``limit``), journal what they
        complete, settle gaps, release the ring's space; returns the records read."""
        if self._fast is not None:
            n = self._drain_fast()
        else:
            records, self.read_pos = self.ring.read(self.read_pos, limit)
            for pos, rec in records:
                self._record(pos, rec)
            n = len(records)
        self._settle(idle=not n)
        self.counters["passes"] += 1
        with self.lock:
            self._write()
        self._sync()
        self._release()
        self.counters["records"] += n
        return n

    def _drain_fast(self) -> int:
        """The C walk takes each copy that continues its recipient's stream; every other record
        goes through :meth:`_record`, one at a time."""
        fast = self._fast
        assert fast is not None
        prod = self.ring.producer
        total = 0
        while True:
            why, pos, n = fast.walk(self.read_pos, prod)
            if pos != self.read_pos:
                with self.lock:
                    self.counters["journaled_messages"] += fast.flush(self.clock())
                if fast.errors:
                    self.counters.update(fast.errors)
                    fast.errors.clear()
                self.read_pos = pos
                total += n
            if why == WALK_FULL:
                continue
            if why != WALK_SLOW:
                return total
            records, self.read_pos = self.ring.read(self.read_pos, 1)
            for p, rec in records:
                self._record(p, rec)
            total += len(records)
            with self.lock:
                self._write()
            self._sync()

    def _sync(self) -> None:
        """Tell the C walk where the recipients the Python path handled stand: their next
        number, or 0 (theirs are the Python path's) while it holds copies or payloads of theirs."""
        if self._fast is None:
            self._touched.clear()
            return
        waiting = {r for r, _ in self._bodies}
        for r in self._touched:
            j = self.journal_of(r)
            busy = j is None or r in self._held or r in waiting
            self._fast.set_next(r, 0 if busy or j is None else self._next(r, j))
        self._touched.clear()

    def _release(self) -> None:
        oldest = min(
            [c.pos for c in self._bodies.values()] + [c.pos for h in self._held.values() for c in h.values()],
            default=self.read_pos,
        )
        self.ring.release(min(oldest, self.read_pos))

    def _record(self, pos: int, rec: memoryview) -> None:
        if len(rec) < JREC_HEAD.size:
            self.counters["bad_records"] += 1
            return
        r, length, flags = JREC_HEAD.unpack_from(rec, 0)
        self._touched.add(r)
        if flags & FLAG_BODY:
            payload = rec[JREC_HEAD.size : JREC_HEAD.size + length]
            if len(payload) < MOLD_HEADER.size:
                self.counters["bad_records"] += 1
                return
            _, seq, _ = MOLD_HEADER.unpack_from(payload, 0)
            head = self._bodies.pop((r, seq), None)
            if head is None:
                self.counters["orphan_payloads"] += 1
                return
            self._complete(r, head, payload)
            return
        if len(rec) < JREC_BYTES or length < MOLD_HEADER.size:
            self.counters["bad_records"] += 1
            return
        session, seq, count = MOLD_HEADER.unpack_from(rec, JREC_HEAD.size)
        copy = Copy(bytes(session), seq, count, None, pos)
        if flags & FLAG_PAYLOAD and length <= JREC_INLINE:
            self._complete(r, copy, rec[JREC_HEAD.size : JREC_HEAD.size + length])
        elif flags & FLAG_NEXT:
            self._bodies[(r, seq)] = copy
        else:  # LOST: the payload found the ring full
            self.counters["lost_payloads"] += 1
            self._deliver(r, copy)

    def _complete(self, r: int, copy: Copy, payload: memoryview) -> None:
        try:
            copy.packets = soup_packets(payload, copy.count)
        except ValueError as e:
            self.counters["bad_records"] += 1
            self.counters["bad_record:" + str(e)[:60]] += 1
            copy.packets = None  # journaled as a hole: the number was taken, the bytes are not usable
        self._deliver(r, copy)

    def _deliver(self, r: int, copy: Copy) -> None:
        """Queue ``copy`` for r's journal in sequence order (held when past the next number)."""
        j = self.journal_of(r)
        if j is None:
            self.counters["unjournaled_copies"] += 1
            return
        nxt = self._next(r, j)
        if copy.seq < nxt:
            self.counters["duplicates"] += 1  # journaled before a restart
            return
        if copy.seq > nxt:
            self._held.setdefault(r, {})[copy.seq] = copy
            return
        self._queue(r, copy)
        self._flush_held(r, j)

    def _next(self, r: int, j: Journal) -> int:
        out = self._out.get(r)
        return out[-1].seq + out[-1].count if out else j.next_seq

    def _queue(self, r: int, copy: Copy) -> None:
        self._out.setdefault(r, []).append(copy)

    def _flush_held(self, r: int, j: Journal) -> None:
        held = self._held.get(r)
        while held:
            c = held.pop(self._next(r, j), None)
            if c is None:
                return
            self._queue(r, c)
        self._held.pop(r, None)

    def _settle(self, idle: bool) -> None:
        """Holes: a number below ``end`` still missing once the feed has read past the producer
        position read after ``end`` was known (a held record's number, or the kernel's next
        number for the recipient, read when the ring is idle) was never journaled (module
        docstring)."""
        for r, (end, mark) in list(self._marks.items()):
            if self.read_pos >= mark:
                del self._marks[r]
                self._touched.add(r)
                j = self.journal_of(r)
                if j is not None:
                    self._settle_gap(r, j, end)
        sent = self.sent_next() if idle and self.sent_next is not None and self._read_sent() else {}
        prod = self.ring.producer  # read after the kernel's numbers: every record below them is before it
        for r, held in self._held.items():
            if r not in self._marks and held:
                self._marks[r] = (max(held), prod)
        for r, n in sent.items():
            j = self.journal_of(r)
            # a later end replaces a pending mark: settling it at the later position settles both
            # (every record below either end was reserved before it), and this read may not recur
            if j is not None and self._next(r, j) < n and self._marks.get(r, (0, 0))[0] < n:
                self._marks[r] = (n, prod)
                self._touched.add(r)

    def _read_sent(self) -> bool:
        """Whether this idle pass reads the kernel's next numbers (a syscall per recipient):
        always without ``lost_total``; with it, when the kernel's count of copies not journaled
        moved since the last read, on the idle pass after that (which sees a number taken just
        after the count moved: the record is reserved before the number), and at least every
        :data:`SENT_READ_S`.  Without a loss every number the kernel took has its record, so
        the reads would find nothing."""
        if self.lost_total is None:
            return True
        lost, now = self.lost_total(), time.monotonic()
        moved = lost != self._lost_seen
        if moved or self._reread or now - self._sent_at >= SENT_READ_S:
            self._reread = moved
            self._lost_seen, self._sent_at = lost, now
            return True
        return False

    def _settle_gap(self, r: int, j: Journal, end: int) -> None:
        while True:
            nxt = self._next(r, j)
            if nxt >= end:
                self._flush_held(r, j)  # the held copies from end on that now follow
                return
            held = self._held.get(r, {})
            if nxt in held:
                self._flush_held(r, j)
                continue
            stop = min([s for s in held if s > nxt] + [end])
            self.counters["hole_messages"] += stop - nxt
            self._queue(r, Copy(held[stop].session if stop in held else b"", nxt, stop - nxt, None, self.read_pos))

    def _write(self) -> None:
        now = self.clock()
        for r, copies in self._out.items():
            j = self.journal_of(r)
            if j is None:
                continue
            start = 0
            for i in range(1, len(copies) + 1):
                if i < len(copies) and _joins(copies[i - 1], copies[i]):
                    continue
                self._append(j, copies[start:i], now)  # one write per run of copies
                start = i
        self._out.clear()

    def _append(self, j: Journal, run: list[Copy], now: float) -> None:
        first = run[0]
        if first.packets is None:  # a hole
            j.skip(first.seq + first.count)
            return
        count = sum(c.count for c in run)
        try:
            j.append_packets(first.seq, b"".join(c.packets or b"" for c in run), count, now, first.session)
        except (JournalError, OSError) as e:
            self.counters["write_errors"] += 1
            self.counters["write_error:" + str(e)[:60]] += 1
            j.skip(first.seq + count)
            return
        self.counters["journaled_messages"] += count

    # -- a number that changes streams --------------------------------------------------------------

    def finish(self, r: int) -> None:
        """End recipient ``r``'s stream: the feed has read every record of it (the caller made
        sure), so its held copies go to its journal and its gaps are holes."""
        j = self.journal_of(r)
        held = self._held.get(r)
        if j is not None and held:
            self._settle_gap(r, j, max(held) + 1)
        self._held.pop(r, None)
        self._marks.pop(r, None)
        for k in [k for k in self._bodies if k[0] == r]:
            self.counters["unfinished_copies"] += 1
            del self._bodies[k]
        with self.lock:
            self._write()
        self._touched.add(r)
        self._sync()

    def restart(self, r: int) -> None:
        """Recipient ``r`` now feeds the journal ``journal_of(r)`` gives (a new stream, or its
        own journal reopened): the fast path takes its next number from there."""
        self._touched.add(r)
        self._sync()

    # -- state -------------------------------------------------------------------------------------

    @property
    def held(self) -> int:
        """Copies held past a gap, and payload records awaited."""
        return sum(len(h) for h in self._held.values()) + len(self._bodies)
