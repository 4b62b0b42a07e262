"""The journal of one stream: every message a subscriber's session was sent, by sequence number,
in append-only segment files, as jetrelay keeps its feed ("Let the kernel do the work!").

A stream is one (subscriber, session): its messages carry consecutive MoldUDP64 sequence numbers
from 1 (the data plane numbers them; the journal refuses a gap).  Each message is stored as the
SoupBinTCP 4.1 *Sequenced Data* packet that carries it (section 2.2: a 2-byte big-endian packet
length that counts the type byte, the type ``S``, the message), so a login's backfill is a byte
range of a file, sent with ``os.sendfile`` (:meth:`Journal.spans`); a MoldUDP64 re-request reads
the messages back (:meth:`Journal.read`).

Storage: segments of about ``segment_bytes`` each, named by their first sequence number
(``<first>.seg`` under ``directory``), or anonymous memory files (``memfd_create``) without a
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

from ..errors import SubcError

#: SoupBinTCP Sequenced Data packet type (SoupBinTCP 4.1 section 2.2.6).
SEQUENCED_DATA = b"S"
#: Largest message a packet holds: its 2-byte length counts the type byte.
MAX_MESSAGE_BYTES = 0xFFFF - 1
#: Default segment size (bytes).
DEFAULT_SEGMENT_BYTES = 64 << 20
SUFFIX = ".seg"


class JournalError(SubcError):
    """A journal that cannot be opened or appended to as asked (a gap in the sequence numbers,
    a message too long for a packet, a damaged segment file)."""


@dataclass
class Segment:
    """One segment: its first sequence number, file descriptor, the offset of each message's
    packet (bytes from the segment's start), its size in bytes and the time of its last append
    (s since the epoch)."""

    first: int
    fd: int
    offsets: array = field(default_factory=lambda: array("Q"))
    size: int = 0
    last_append: float = 0.0
    path: Path | None = None

    @property
    def count(self) -> int:
        """Messages in the segment."""
        return len(self.offsets)

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
    message.  Raises JournalError for a directory whose segments do not follow each other."""

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
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._reopen()

    # -- opening -------------------------------------------------------------------------------

    def _reopen(self) -> None:
        assert self.directory is not None
        paths = sorted(self.directory.glob("*" + SUFFIX), key=lambda p: int(p.stem))
        for p in paths:
            first = int(p.stem)
            if self.segments and first != self.next_seq:
                raise JournalError(
                    f"{p}: starts at sequence number {first}, the segment before ends at {self.next_seq - 1}"
                )
            fd = os.open(p, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            offsets, size = _scan(data)
            if size < len(data):
                os.ftruncate(fd, size)  # a torn last packet: its batch never completed
            seg = Segment(first, fd, offsets, size, p.stat().st_mtime, p)
            self._add(seg)
            self.next_seq = first + seg.count

    def _add(self, seg: Segment) -> None:
        self.segments.append(seg)
        self._firsts.append(seg.first)

    def _new_segment(self, first: int) -> Segment:
        if self.directory is None:
            fd = os.memfd_create(f"{self.name}-{first}", os.MFD_CLOEXEC)
            seg = Segment(first, fd)
        else:
            path = self.directory / f"{first:020d}{SUFFIX}"
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
            seg = Segment(first, fd, path=path)
        self._add(seg)
        return seg

    # -- writing -------------------------------------------------------------------------------

    @property
    def first_seq(self) -> int:
        """The oldest retained sequence number (``next_seq`` when the journal holds none)."""
        return self.segments[0].first if self.segments else self.next_seq

    @property
    def size(self) -> int:
        """Bytes the retained segments take."""
        return sum(s.size for s in self.segments)

    def append(self, seq: int, messages: Sequence[bytes], now: float | None = None) -> None:
        """Store ``messages`` as sequence numbers ``seq``, ``seq + 1``, ...  Raises JournalError
        unless ``seq`` is :attr:`next_seq` (the journal never holds a gap) or when a message is
        too long for a packet (nothing is stored then)."""
        if seq != self.next_seq:
            raise JournalError(f"the journal expects sequence number {self.next_seq}, not {seq}")
        if not messages:
            return
        packets = [packet(m) for m in messages]
        now = time.time() if now is None else now
        seg = self.segments[-1] if self.segments else None
        if seg is None or seg.size >= self.segment_bytes:
            seg = self._new_segment(seq)
        blob = b"".join(packets)
        written = os.write(seg.fd, blob)
        while written < len(blob):  # a short write to a regular file: write the rest
            written += os.write(seg.fd, blob[written:])
        pos = seg.size
        for p in packets:
            seg.offsets.append(pos)
            pos += len(p)
        seg.size = pos
        seg.last_append = now
        self.next_seq += len(messages)

    # -- reading -------------------------------------------------------------------------------

    def _locate(self, seq: int) -> tuple[int, int]:
        """(segment index, message index in it) of retained ``seq``."""
        k = bisect_right(self._firsts, seq) - 1
        return k, seq - self.segments[k].first

    def spans(self, seq: int, count: int, max_bytes: int | None = None) -> list[tuple[int, int, int]]:
        """(file descriptor, offset, bytes) ranges of the packets of messages ``seq`` .. ``seq +
        count - 1`` that the journal holds (fewer when it ends earlier; none before
        :attr:`first_seq`), for ``os.sendfile``; with ``max_bytes``, only the leading whole
        packets that fit in that many bytes (at least one)."""
        if count <= 0 or seq < self.first_seq or seq >= self.next_seq:
            return []
        remaining = min(seq + count, self.next_seq) - seq
        out: list[tuple[int, int, int]] = []
        budget = max_bytes
        k, i = self._locate(seq)
        while remaining > 0:
            s = self.segments[k]
            j = min(s.count, i + remaining)  # the segment's packets i .. j - 1
            start, end = s.offsets[i], s.end_of(j - 1)
            if budget is not None and end - start > budget:
                e = i  # the first packet that does not fit
                while e < j and s.end_of(e) - start <= budget:
                    e += 1
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

    def read(self, seq: int, count: int, max_bytes: int | None = None) -> list[bytes]:
        """The messages ``seq`` .. ``seq + count - 1`` the journal holds, in order (see
        :meth:`spans`; ``max_bytes`` bounds their packets' bytes)."""
        return messages_of(self.spans(seq, count, max_bytes))

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
