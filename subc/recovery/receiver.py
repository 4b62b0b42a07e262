"""A MoldUDP64 receiver that recovers what the network lost: it delivers every message of one
stream once and in sequence order, re-requesting gaps from the stream's request server
(:mod:`.rerequest`), as Nassau's MoldUDP64 client does.

Downstream packets go to :meth:`RecoveringReceiver.packet` (live ones and the server's answers
alike); it returns the messages that became deliverable, in order.  A packet past the next
expected number is kept and opens a gap: a request for the messages from the next expected one to
the highest seen goes out (at most 65,534 messages, the server answers a packetful and the
receiver asks again for the rest).  :meth:`RecoveringReceiver.tick` repeats an unanswered request
after ``timeout_s``; after ``retries`` repeats without progress the gap's first message is given
up (:attr:`lost`, delivered past), and an answer that starts later than the first message asked
(the server answers from its oldest retained message) gives up the messages between at once: the
receiver knows exactly which messages are missing.  A cookie packet (the
server's address proof, :mod:`subc.wire.moldudp64_request`) makes the receiver send its request
again with the cookie, and every later request to that server carries it.

Several request servers (the brokers of a cluster, docs/cluster.md: any of them journaled the
stream): a request goes to the current server; after ``retries`` repeats without progress it
goes to the next one, and the gap's first message is given up only once every server was asked
``retries`` times.  Each server's cookie is its own.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from ..errors import SubcError
from ..wire.moldudp64 import END_OF_SESSION, HEARTBEAT, MAX_COUNT, decode_packet
from ..wire.moldudp64_request import cookie_of, encode_request


class RecoveringReceiver:
    """One stream's receiver (see the module docstring).  ``send``: sends a request packet to the
    request server, or one such function per server, tried in turn; ``session``: the stream's
    session (None: the first packet's); ``next_seq``: the first sequence number wanted;
    ``timeout_s`` and ``clock`` in seconds."""

    def __init__(
        self,
        send: Callable[[bytes], object] | Sequence[Callable[[bytes], object]],
        session: str | None = None,
        next_seq: int = 1,
        timeout_s: float = 0.1,
        retries: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.senders = [send] if callable(send) else list(send)
        if not self.senders:
            raise ValueError("a recovering receiver needs at least one request server")
        self.session, self.next_seq = session, next_seq
        self.timeout_s, self.retries, self.clock = timeout_s, retries, clock
        self.held: dict[int, bytes] = {}  # messages past a gap, by sequence number
        self.highest = next_seq - 1  # the highest sequence number seen
        self.cookies: dict[int, bytes] = {}  # server index -> its cookie
        self.server = 0  # the server requests go to now
        self.switches = 0  # times requests moved to the next server
        self._asked = 0  # servers asked for the current gap's first message
        self.session_bytes: bytes | None = None
        self.pending: tuple[int, int] | None = None  # the request out: (first, count)
        self.sent_at = 0.0
        self.tries = 0
        self.recovered = 0  # messages delivered that arrived in answer to a request
        self.requests = 0
        self.lost: list[tuple[int, int]] = []  # (first, last) given up
        self.duplicates = 0
        self.ended = False

    @property
    def cookie(self) -> bytes | None:
        """The current server's cookie (None: none yet)."""
        return self.cookies.get(self.server)

    def packet(self, data: bytes, answer: bool = False, server: int | None = None) -> list[tuple[int, bytes]]:
        """(sequence number, message) of every message ``data`` made deliverable, in order;
        ``answer``: the packet came from a request server (``server``: its index; None: the
        current one).  Packets of another session, and malformed ones, are ignored (SubcError is
        not raised: a receiver keeps receiving)."""
        cookie = cookie_of(data)
        if cookie is not None:
            src = self.server if server is None else server
            self.cookies[src] = cookie
            if self.pending is not None and src == self.server:
                self._request(*self.pending)
            return []
        try:
            p = decode_packet(data)
        except SubcError:
            return []
        if self.session is None:
            self.session = p.session
        if p.session != self.session:
            return []
        self.session_bytes = p.session_bytes
        if p.count == END_OF_SESSION:
            self.ended = True
            self.highest = max(self.highest, p.seq - 1)
        elif p.count == HEARTBEAT:
            self.highest = max(self.highest, p.seq - 1)
        else:
            if answer and self.pending is not None and self.pending[0] == self.next_seq < p.seq:
                self._give_up(self.next_seq, min(p.seq, self.pending[0] + self.pending[1]) - 1)
            for k, m in enumerate(p.messages):
                seq = p.seq + k
                if seq < self.next_seq or seq in self.held:
                    self.duplicates += 1
                    continue
                self.held[seq] = m
                self.highest = max(self.highest, seq)
                if answer:
                    self.recovered += 1
        out = self._drain()
        self._chase()
        return out

    def _drain(self) -> list[tuple[int, bytes]]:
        out = []
        while self.next_seq in self.held:
            out.append((self.next_seq, self.held.pop(self.next_seq)))
            self.next_seq += 1
        return out

    def _chase(self) -> None:
        """Request the gap from the next expected number to the highest seen, unless a request
        for it is out."""
        if self.highest < self.next_seq:
            self.pending = None
            return
        count = min(self.highest - self.next_seq + 1, MAX_COUNT)
        if self.pending is not None and self.pending[0] == self.next_seq:
            return  # that request is out: tick repeats it
        self.tries = 0
        self._asked = 0
        self._request(self.next_seq, count)

    def _request(self, first: int, count: int) -> None:
        self.pending = (first, count)
        self.sent_at = self.clock()
        self.requests += 1
        self.senders[self.server](encode_request(self.session_bytes or (self.session or ""), first, count, self.cookie))

    def tick(self) -> list[tuple[int, bytes]]:
        """Repeat a request unanswered for ``timeout_s``; after ``retries`` repeats send it to
        the next server, and once every server was asked give up its first message (recorded in
        :attr:`lost`) and return what that made deliverable."""
        if self.pending is None or self.clock() - self.sent_at < self.timeout_s:
            return []
        if self.tries < self.retries:
            self.tries += 1
            self._request(*self.pending)
            return []
        if self._asked + 1 < len(self.senders):
            self._asked += 1
            self.server = (self.server + 1) % len(self.senders)
            self.switches += 1
            self.tries = 0
            self._request(*self.pending)
            return []
        self._asked = 0
        self._give_up(self.next_seq, self.next_seq)
        self.pending = None
        out = self._drain()
        self._chase()
        return out

    def _give_up(self, first: int, last: int) -> None:
        """Record messages ``first`` .. ``last`` (the next expected ones) as lost and move past them."""
        if self.lost and self.lost[-1][1] == first - 1:
            self.lost[-1] = (self.lost[-1][0], last)
        else:
            self.lost.append((first, last))
        self.next_seq = last + 1

    @property
    def complete(self) -> bool:
        """Whether every message up to the highest seen has been delivered or given up."""
        return self.next_seq > self.highest and not self.held
