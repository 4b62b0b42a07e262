"""The journal of one stream: every message a subscriber's session was sent, by sequence number,
in append-only segment files, as jetrelay keeps its feed ("Let the kernel do the work!").

A stream is one subscriber's: its messages carry consecutive MoldUDP64 sequence numbers from 1
(the data plane numbers them), each sent under the feed's session; the journal keeps the session
of each segment (a new session starts a new segment).  A message that was sent but could not be
journaled leaves a *hole* (:meth:`Journal.skip`): the journal says exactly which numbers it lacks
and never serves one as another.  Each message is stored as the
SoupBinTCP 4.1 *Sequenced Data* packet that carries it (section 2.2: a 2-byte big-endian packet
length that counts the type byte, the type ``S``, the message), so a login's backfill is a byte
range of a file, sent with ``os.sendfile`` (:meth:`Journal.spans`); a MoldUDP64 re-request reads
the messages back (:meth:`Journal.read`).

Storage: segments of about ``segment_bytes`` each, named by their first sequence number and
session (``<first>-<session hex>.seg`` under ``directory``), or anonymous memory files (``memfd_create``) without a
directory.  A write goes to the page cache with one ``write`` per batch, so a process killed at any
point (``kill -9``) leaves every batch it returned from; reopening a directory scans the segments
and drops a torn last record (a batch cut by a crash of the machine).  Retention
(:meth:`Journal.retain`) drops whole segments from the oldest, never the one being written: disk
use stays below the byte bound plus one segment.
"""

from __future__ import annotations

import os
import time
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..errors import SubcError

#: SoupBinTCP Sequenced Data packet type (SoupBinTCP 4.1 section 2.2.6).
SEQUENCED_DATA = b"S"
#: Largest message a packet holds: its 2-byte length counts the type byte.
MAX_MESSAGE_BYTES = 0xFFFF - 1
#: Default segment size (bytes).
DEFAULT_SEGMENT_BYTES = 64 << 20
#: Holes a journal lists (the oldest forgotten beyond; :attr:`Journal.hole_messages` counts all).
MAX_HOLES = 1000
SUFFIX = ".seg"


#: A session name's bytes (MoldUDP64: 10 bytes, space-padded ASCII).
SESSION_BYTES = 10
NO_SESSION = b" " * SESSION_BYTES


class JournalError(SubcError):
    """A journal that cannot be opened or appended to as asked (a sequence number already
    journaled, a message too long for a packet, a damaged segment file)."""


class Index:
    """The offsets of a segment's packets (bytes from its start, increasing): a uint64 array
    that doubles when full, so that appending k offsets costs O(k) amortized (an ``array('Q')``
    grows by a sixteenth at a time, copying itself each time: that copying was most of the
    journal feed's index cost).  Reads like a sequence of ints; :meth:`bisect_right` and
    :meth:`bisect_left` search it as :mod:`bisect` would."""

    __slots__ = ("_a", "_n")

    def __init__(self, initial: Sequence[int] | array | np.ndarray = ()):
        a = np.asarray(initial, dtype=np.uint64)
        self._a = np.empty(max(64, 2 * len(a)), dtype=np.uint64)
        self._a[: len(a)] = a
        self._n = len(a)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> int:
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("index offset out of range")
        return int(self._a[i])

    def view(self) -> np.ndarray:
        """The offsets (a view: valid until the next :meth:`extend`)."""
        return self._a[: self._n]

    def extend(self, offsets: np.ndarray, base: int = 0) -> None:
        """Append ``offsets`` + ``base`` (uint64)."""
        end = self._n + len(offsets)
        if end > len(self._a):
            grown = np.empty(max(end, 2 * len(self._a)), dtype=np.uint64)
            grown[: self._n] = self._a[: self._n]
            self._a = grown
        if base:
            np.add(offsets, np.uint64(base), out=self._a[self._n : end], casting="unsafe")
        else:
            self._a[self._n : end] = offsets
        self._n = end

    def trim(self) -> None:
        """Give back the room beyond the offsets held (a segment no longer appended to)."""
        self._a = self._a[: self._n].copy()

    def bisect_right(self, x: int, lo: int = 0, hi: int | None = None) -> int:
        """The first index in [lo, hi) whose offset is > x (hi when none)."""
        hi = self._n if hi is None else hi
        return lo + int(np.searchsorted(self._a[lo:hi], np.uint64(x), side="right"))

    def bisect_left(self, x: int, lo: int = 0, hi: int | None = None) -> int:
        """The first index in [lo, hi) whose offset is >= x (hi when none)."""
        hi = self._n if hi is None else hi
        return lo + int(np.searchsorted(self._a[lo:hi], np.uint64(x), side="left"))


@dataclass
class Segment:
    """One segment: its first sequence number, file descriptor, session (10 bytes), the offset of
    each message's packet (bytes from the segment's start), its size in bytes and the time of its
    last append (s since the epoch)."""

    first: int
    fd: int
    session: bytes = NO_SESSION
    offsets: Index = field(default_factory=Index)
    size: int = 0
    last_append: float = 0.0
    path: Path | None = None

    @property
    def count(self) -> int:
        """Messages in the segment."""
        return len(self.offsets)

    @property
    def end(self) -> int:
        """The sequence number after its last message."""
        return self.first + len(self.offsets)

    def end_of(self, i: int) -> int:
        """The offset just past message ``i``'s packet."""
        return self.offsets[i + 1] if i + 1 < len(self.offsets) else self.size


def packet(message: bytes) -> bytes:
    """The SoupBinTCP Sequenced Data packet of ``message``; JournalError when it is too long."""
    if len(message) > MAX_MESSAGE_BYTES:
        raise JournalError(f"a message of {len(message)} bytes does not fit a SoupBinTCP packet")
    return (len(message) + 1).to_bytes(2, "big") + SEQUENCED_DATA + message


def _scan(data: bytes) -> tuple[array, int]:
    """(offsets of the whole packets of ``data``, bytes they take): a torn last packet is left out."""
    offsets = array("Q")
    pos, n = 0, len(data)
    while pos + 3 <= n:
        length = int.from_bytes(data[pos : pos + 2], "big")
        if length < 1 or data[pos + 2 : pos + 3] != SEQUENCED_DATA:
            break
        if pos + 2 + length > n:
            break
        offsets.append(pos)
        pos += 2 + length
    return offsets, pos


class Journal:
    """The messages of one stream by sequence number (see the module docstring).

    ``directory``: where its segments live (created when missing; reopened when it holds some),
    or None for memory files.  ``first_seq``: the sequence number of a new stream's first
    message.  Raises JournalError for a directory whose segments overlap."""

    def __init__(
        self,
        directory: str | Path | None = None,
        first_seq: int = 1,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        name: str = "subc-journal",
    ):
        self.directory = Path(directory) if directory is not None else None
        self.segment_bytes = segment_bytes
        self.name = name
        self.segments: list[Segment] = []
        self._firsts: list[int] = []
        self.next_seq = first_seq
        self.dropped_messages = 0  # messages removed by retention
        self.holes: list[tuple[int, int]] = []  # (first, last) sent but never journaled, oldest first
        self.hole_messages = 0  # messages in holes, ever
        self._open_new = False  # the next append starts a segment (after a hole)
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._reopen()

    # -- opening -------------------------------------------------------------------------------

    def _reopen(self) -> None:
        assert self.directory is not None
        paths = sorted(self.directory.glob("*" + SUFFIX), key=lambda p: int(p.stem.split("-")[0]))
        for p in paths:
            first_s, _, session_hex = p.stem.partition("-")
            first = int(first_s)
            try:
                session = bytes.fromhex(session_hex) if session_hex else NO_SESSION
            except ValueError:
                raise JournalError(f"{p}: not a journal segment name (<first>-<session hex>{SUFFIX})") from None
            if self.segments and first < self.next_seq:
                raise JournalError(
                    f"{p}: starts at sequence number {first}, the segment before ends at {self.next_seq - 1}"
                )
            if self.segments and first > self.next_seq:
                self._hole(self.next_seq, first)
            fd = os.open(p, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            offsets, size = _scan(data)
            if size < len(data):
                os.ftruncate(fd, size)  # a torn last packet: its batch never completed
            seg = Segment(first, fd, session, Index(offsets), size, p.stat().st_mtime, p)
            self._add(seg)
            self.next_seq = seg.end

    def _add(self, seg: Segment) -> None:
        self.segments.append(seg)
        self._firsts.append(seg.first)

    def _new_segment(self, first: int, session: bytes) -> Segment:
        if self.segments:
            self.segments[-1].offsets.trim()  # appends go to the new one from now on
        if self.directory is None:
            fd = os.memfd_create(f"{self.name}-{first}", os.MFD_CLOEXEC)
            seg = Segment(first, fd, session)
        else:
            path = self.directory / f"{first:020d}-{session.hex()}{SUFFIX}"
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
            seg = Segment(first, fd, session, path=path)
        self._add(seg)
        return seg

    def _hole(self, first: int, end: int) -> None:
        self.holes.append((first, end - 1))
        self.hole_messages += end - first
        del self.holes[: max(0, len(self.holes) - MAX_HOLES)]

    # -- writing -------------------------------------------------------------------------------

    @property
    def first_seq(self) -> int:
        """The oldest retained sequence number (``next_seq`` when the journal holds none)."""
        return self.segments[0].first if self.segments else self.next_seq

    @property
    def size(self) -> int:
        """Bytes the retained segments take."""
        return sum(s.size for s in self.segments)

    def skip(self, end: int) -> None:
        """Record that the messages from :attr:`next_seq` to ``end - 1`` were sent but are not
        journaled (a hole): the journal never answers for them."""
        if end <= self.next_seq:
            return
        self._hole(self.next_seq, end)
        self.next_seq = end
        self._open_new = True

    def append(
        self, seq: int, messages: Sequence[bytes], now: float | None = None, session: bytes = NO_SESSION
    ) -> None:
        """Store ``messages`` as sequence numbers ``seq``, ``seq + 1``, ... of ``session`` (10
        bytes).  A ``seq`` past :attr:`next_seq` leaves a hole before it (:meth:`skip`).  Raises
        JournalError for a ``seq`` before :attr:`next_seq` (journaled already) or a message too
        long for a packet (nothing is stored then)."""
        self.append_packets(seq, b"".join(packet(m) for m in messages), len(messages), now, session)

    def append_packets(
        self, seq: int, blob: bytes, count: int, now: float | None = None, session: bytes = NO_SESSION
    ) -> None:
        """:meth:`append` of ``count`` messages already framed as SoupBinTCP Sequenced Data
        packets in ``blob`` (one ``write``).  Raises JournalError also when ``blob`` is not
        exactly ``count`` whole packets."""
        if seq < self.next_seq:
            raise JournalError(f"the journal expects sequence number {self.next_seq}, not {seq}")
        if count == 0:
            return
        offsets, used = _scan(blob)
        if len(offsets) != count or used != len(blob):
            raise JournalError(
                f"{count} messages expected, the packets hold {len(offsets)} ({used} of {len(blob)} bytes)"
            )
        self.append_indexed(seq, blob, offsets, now, session)

    def append_indexed(
        self,
        seq: int,
        blob: bytes | memoryview,
        offsets: array | np.ndarray,
        now: float | None = None,
        session: bytes = NO_SESSION,
    ) -> None:
        """:meth:`append_packets` of packets whose offsets in ``blob`` (an ``array('Q')``, one
        per message, increasing from 0) the caller knows: ``blob`` is not parsed again (the feed's
        fast path wrote both).  Raises JournalError for a ``seq`` before :attr:`next_seq`."""
        if seq < self.next_seq:
            raise JournalError(f"the journal expects sequence number {self.next_seq}, not {seq}")
        count = len(offsets)
        if count == 0:
            return
        now = time.time() if now is None else now
        seg = self.open_segment(seq, session, len(blob))
        if seg is not None:  # the common case: the next numbers, all in the open segment
            self._write(seg, blob, np.frombuffer(offsets, dtype=np.uint64), now)
            self.next_seq = seq + count
            return
        if seq > self.next_seq:
            self.skip(seq)
        offs = np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)
        ends = np.append(offs[1:], len(blob))
        i = 0
        while i < count:  # a segment takes what keeps it within segment_bytes (at least one packet)
            seg = self.segments[-1] if self.segments else None
            if seg is None or seg.size >= self.segment_bytes or self._open_new or seg.session != session:
                seg = self._new_segment(seq + i, session)
                self._open_new = False
            room = self.segment_bytes - seg.size + int(offs[i])
            j = max(i + 1, int(np.searchsorted(ends, room, side="right")))
            j = min(j, count)
            if seg.size and j == i + 1 and ends[i] - offs[i] > self.segment_bytes - seg.size:
                self._open_new = True  # the next packet does not fit here: a new segment
                continue
            self._write(seg, blob[int(offs[i]) : int(ends[j - 1])], offs[i:j] - offs[i], now)
            i = j
        self.next_seq = seq + count

    def append_target(self, seq: int) -> Segment | None:
        """The segment that takes appends from ``seq`` on (the open one, when ``seq`` is
        :attr:`next_seq`), or None.  An append goes to it whole only under its session and
        within :attr:`segment_bytes` (see :meth:`open_segment`)."""
        if seq != self.next_seq or self._open_new or not self.segments:
            return None
        return self.segments[-1]

    def open_segment(self, seq: int, session: bytes, nbytes: int) -> Segment | None:
        """The segment that takes an append of ``nbytes`` bytes of packets from ``seq`` on under
        ``session`` whole (the open one: ``seq`` is :attr:`next_seq`, the session is its own,
        the bytes fit), or None (:meth:`append_indexed` then splits or starts segments)."""
        seg = self.append_target(seq)
        if seg is None or seg.session != session or seg.size + nbytes > self.segment_bytes:
            return None
        return seg

    def appended(self, seg: Segment, offsets: np.ndarray, size: int, now: float) -> None:
        """Record an append the caller wrote itself to ``seg`` (as :meth:`open_segment` gave it,
        the lock held since): packets at ``offsets`` (from the segment's start), the segment
        ``size`` bytes long after it."""
        seg.offsets.extend(offsets)
        seg.size = size
        seg.last_append = now
        self.next_seq += len(offsets)

    @staticmethod
    def _write(seg: Segment, blob: bytes | memoryview, offsets: np.ndarray, now: float) -> None:
        """Append ``blob`` (packets at ``offsets`` from its start) to ``seg``."""
        written = os.write(seg.fd, blob)
        while written < len(blob):  # a short write to a regular file: write the rest
            written += os.write(seg.fd, blob[written:])
        seg.offsets.extend(offsets, seg.size)
        seg.size += len(blob)
        seg.last_append = now

    # -- reading -------------------------------------------------------------------------------

    def _locate(self, seq: int) -> tuple[int, int] | None:
        """(segment index, message index in it) of ``seq``, or None when not journaled."""
        k = bisect_right(self._firsts, seq) - 1
        if k < 0 or seq >= self.segments[k].end:
            return None
        return k, seq - self.segments[k].first

    def session_of(self, seq: int) -> bytes | None:
        """The session ``seq`` was sent under, or None when it is not journaled."""
        at = self._locate(seq)
        return None if at is None else self.segments[at[0]].session

    def available_from(self, seq: int) -> int | None:
        """The first journaled sequence number at or after ``seq``, or None."""
        at = self._locate(seq)
        if at is not None:
            return seq
        k = bisect_right(self._firsts, seq)
        while k < len(self.segments) and not self.segments[k].count:
            k += 1
        return self.segments[k].first if k < len(self.segments) else None

    def spans(
        self, seq: int, count: int, max_bytes: int | None = None, session: bytes | None = None
    ) -> list[tuple[int, int, int]]:
        """(file descriptor, offset, bytes) ranges of the packets of messages ``seq`` .. ``seq +
        count - 1`` that the journal holds from ``seq`` on without a hole (fewer when it ends
        earlier; none when ``seq`` is not journaled), for ``os.sendfile``; with ``max_bytes``,
        only the leading whole packets that fit in that many bytes (at least one); with
        ``session``, only those sent under it."""
        at = self._locate(seq) if count > 0 else None
        if at is None:
            return []
        remaining = min(seq + count, self.next_seq) - seq
        out: list[tuple[int, int, int]] = []
        budget = max_bytes
        k, i = at
        while remaining > 0 and k < len(self.segments):
            s = self.segments[k]
            if (session is not None and s.session != session) or (out and s.first != self.segments[k - 1].end):
                break  # another session, or a hole
            j = min(s.count, i + remaining)  # the segment's packets i .. j - 1
            if j <= i:
                break
            start, end = s.offsets[i], s.end_of(j - 1)
            if budget is not None and end - start > budget:
                # the first packet that does not fit: packet e ends where e + 1 starts (the last
                # one, j - 1, does not fit: the whole range does not)
                e = s.offsets.bisect_right(start + budget, i + 1, j) - 1
                if e > i:
                    out.append((s.fd, start, s.end_of(e - 1) - start))
                elif not out:  # not even one fits: the first alone
                    out.append((s.fd, start, s.end_of(i) - start))
                break
            out.append((s.fd, start, end - start))
            if budget is not None:
                budget -= end - start
            remaining -= j - i
            k, i = k + 1, 0
        return out

    def read(self, seq: int, count: int, max_bytes: int | None = None, session: bytes | None = None) -> list[bytes]:
        """The messages ``seq`` .. ``seq + count - 1`` the journal holds, in order (see
        :meth:`spans`; ``max_bytes`` bounds their packets' bytes)."""
        return messages_of(self.spans(seq, count, max_bytes, session))

    # -- retention -----------------------------------------------------------------------------

    def retain(self, max_bytes: int | None = None, max_age_s: float | None = None, now: float | None = None) -> int:
        """Drop the oldest segments while the journal takes more than ``max_bytes`` or their last
        message is older than ``max_age_s`` (never the segment being written); returns the
        messages dropped (also added to :attr:`dropped_messages`)."""
        now = time.time() if now is None else now
        dropped = 0
        total = self.size
        while len(self.segments) > 1:
            s = self.segments[0]
            too_big = max_bytes is not None and total > max_bytes
            too_old = max_age_s is not None and now - s.last_append > max_age_s
            if not (too_big or too_old):
                break
            self.segments.pop(0)
            self._firsts.pop(0)
            os.close(s.fd)
            if s.path is not None:
                s.path.unlink(missing_ok=True)
            total -= s.size
            dropped += s.count
        self.dropped_messages += dropped
        return dropped

    def close(self) -> None:
        """Release the segments' descriptors (the files stay; memory files go)."""
        for s in self.segments:
            os.close(s.fd)
        self.segments.clear()
        self._firsts.clear()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def messages_of(spans: Iterable[tuple[int, int, int]]) -> list[bytes]:
    """The messages in the packets of ``spans`` (as :meth:`Journal.spans` gives them)."""
    out = []
    for fd, off, n in spans:
        data = os.pread(fd, n, off)
        offsets, size = _scan(data)
        for a, b in zip(offsets, list(offsets[1:]) + [size]):
            out.append(data[a + 3 : b])
    return out
