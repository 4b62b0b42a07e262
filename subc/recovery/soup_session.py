"""The state of one SoupBinTCP connection on subc's server (:mod:`.soup_server`): who it is, the
sequence number it gets next, and its send queue, in which journal byte ranges (sent with
``os.sendfile``) and the server's own packets (Login Accepted, heartbeats, replies) take turns
whole, so packets never interleave.

A journal range is taken on a descriptor of its own (``os.dup`` of the segment's, made under the
journal's lock), so retention may close and delete the segment while the range is being sent: the
bytes sent are the ones the range named.
"""

from __future__ import annotations

import os
import socket
import time
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass

from ..wire import soupbintcp as sb
from ..wire.soupbintcp import PacketDecoder
from .journal import Journal, JournalError


@dataclass
class Span:
    """A byte range of a journal segment to send: ``fd`` (our own descriptor of the segment),
    ``offset`` and ``remaining`` (bytes), the sequence numbers of its packets (``first``,
    ``count`` of them), and whether it is ``live`` (journaled after the login) or backfill."""

    fd: int
    offset: int
    remaining: int
    first: int
    count: int
    live: bool

    def close(self) -> None:
        """Release the descriptor."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SoupClient:
    """One connection: the socket (non-blocking), its peer (host, port), the decoder of what it
    sends, and once logged in its ``user``, stream ``key``, ``journal``, ``session`` (10 bytes)
    and ``next_seq`` (the sequence number of the next Sequenced Data packet it gets).

    Times (``now`` arguments, ``last_sent``, ``last_recv``, ``stalled_since``) are in seconds of
    the server's clock; ``connected_since`` is wall time (seconds since the epoch)."""

    def __init__(self, sock: socket.socket, peer: tuple[str, int], decoder: PacketDecoder, now: float):
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.decoder = decoder
        self.connected_at = now
        self.connected_since = time.time()
        self.last_sent = now
        self.last_recv = now
        self.stalled_since: float | None = None  # when a send last found the socket full
        self.user: str | None = None
        self.key: Hashable | None = None
        self.journal: Journal | None = None
        self.session = b""
        self.next_seq = 0
        self.backfill_end = 0  # the journal's next number at login: below it, backfill
        self.end_at: int | None = None  # End of Session once next_seq reaches it
        self.closing: str | None = None  # the reason to close once the queue is sent
        self.closed = False
        self.want_write = False  # registered for writability
        self.bytes_sent = 0
        self.items: deque[bytes | memoryview | Span] = deque()

    @property
    def logged_in(self) -> bool:
        """Whether its login was accepted."""
        return self.journal is not None

    @property
    def queued_spans(self) -> bool:
        """Whether journal ranges are queued."""
        return any(isinstance(i, Span) for i in self.items)

    def queue(self, packet: bytes) -> None:
        """Queue one of the server's own packets (whole) after what is queued."""
        self.items.append(packet)

    def send(self, budget: int, now: float, counters: Counter) -> tuple[int, bool]:
        """Send the queue, in order, until it is empty or ``budget`` bytes went; returns (bytes
        sent, blocked: the socket took no more).  Journal ranges go with ``os.sendfile`` (counted
        in ``counters``: ``backfill_bytes`` or ``live_bytes``, ``sendfile_calls``); a range done
        advances :attr:`next_seq`.  Raises OSError when the connection fails."""
        total = 0
        while self.items and total < budget:
            item = self.items[0]
            try:
                if isinstance(item, Span):
                    n = os.sendfile(self.fd, item.fd, item.offset, min(item.remaining, budget - total))
                    counters["sendfile_calls"] += 1
                    if n == 0:
                        raise OSError("a journal segment ended inside a range being sent")
                    counters["live_bytes" if item.live else "backfill_bytes"] += n
                    item.offset += n
                    item.remaining -= n
                    if item.remaining == 0:
                        self.items.popleft()
                        self.next_seq = item.first + item.count
                        item.close()
                else:
                    n = self.sock.send(item)
                    if n < len(item):
                        self.items[0] = memoryview(item)[n:]
                    else:
                        self.items.popleft()
            except BlockingIOError:
                if self.stalled_since is None:
                    self.stalled_since = now
                return total, True
            total += n
            self.bytes_sent += n
            self.last_sent = now
            self.stalled_since = None
        return total, False

    def close(self) -> None:
        """Close the socket and release the queued ranges' descriptors."""
        if self.closed:
            return
        self.closed = True
        for item in self.items:
            if isinstance(item, Span):
                item.close()
        self.items.clear()
        try:
            self.sock.close()
        except OSError:
            pass

    def info(self) -> dict:
        """Its figures: ``peer`` ("host:port"), ``user``, ``key``, ``session`` (str), ``logged_in``,
        ``next_seq``, ``bytes_sent``, ``connected_since`` (wall time, s), ``stalled`` (a send found
        its socket full and nothing went since), ``pending`` (items queued)."""
        return {
            "peer": f"{self.peer[0]}:{self.peer[1]}",
            "user": self.user,
            "key": self.key,
            "session": self.session.decode("latin-1"),
            "logged_in": self.logged_in,
            "next_seq": self.next_seq,
            "bytes_sent": self.bytes_sent,
            "connected_since": self.connected_since,
            "stalled": self.stalled_since is not None,
            "pending": len(self.items),
        }


def own_spans(j: Journal, seq: int, spans: list[tuple[int, int, int]], live: bool) -> list[Span]:
    """:class:`Span` s of the ranges ``spans`` that ``j.spans(seq, ...)`` gave: each with its
    own descriptor (``os.dup``) and the sequence numbers of its packets.  Call it under the
    journal's lock (the segments must not change meanwhile).  Raises JournalError when a range
    does not start at the packet of the sequence number it should (nothing is kept open then)."""
    out: list[Span] = []
    try:
        for fd, offset, n in spans:
            k = bisect_right(j.segments, seq, key=lambda s: s.first) - 1
            seg = j.segments[k]
            i = seq - seg.first
            if k < 0 or seg.fd != fd or seg.offsets[i] != offset:
                raise JournalError(f"journal range ({fd}, {offset}, {n}) is not that of sequence number {seq}")
            count = seg.offsets.bisect_left(offset + n, lo=i) - i
            out.append(Span(os.dup(fd), offset, n, seq, count, live))
            seq += count
    except BaseException:
        for s in out:
            s.close()
        raise
    return out


def admit(j: Journal, req: sb.LoginRequest, current: bytes) -> tuple[str | None, bytes, int, int]:
    """A Login Request against journal ``j`` whose current session is ``current`` (the caller
    holds the journal's lock): (why it is rejected ``S`` or None, the session, the first sequence
    number to send, the journal's next number: the end of the backfill).  SoupBinTCP 4.1, "Login
    Request Packet": sequence number 0 means the next one generated."""
    nxt, first = j.next_seq, j.first_seq
    seq = nxt if req.seq == 0 else req.seq
    if req.session not in (sb.BLANK_SESSION, current):
        why: str | None = "session"
    elif seq > nxt:
        why = "future"
    elif seq < first:
        why = "retention"
    elif seq < nxt and j.session_of(seq) != current:
        why = "hole" if j.session_of(seq) is None else "session"
    else:
        why = None
    return why, current, seq, nxt


def why_not(j: Journal, c: SoupClient) -> str:
    """Why the journal gives no range at ``c.next_seq`` (below its next number)."""
    session = j.session_of(c.next_seq)
    if session is None:
        return "retention" if c.next_seq < j.first_seq else "hole"
    return "end of session" if session != c.session else "internal"
