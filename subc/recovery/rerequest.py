"""The MoldUDP64 request server: a subscriber re-requests the messages of its own stream that it
lost, and gets them from the stream's journal (:mod:`.journal`) as one downstream packet.

Answers, by request (:mod:`subc.wire.moldudp64_request`), each counted in :attr:`RequestServer.counters`:

* malformed (not 20 or 28 bytes): nothing (``malformed``);
* over the source's rate (token bucket per source host): nothing (``rate_limited``);
* a source that has not proven its address (no cookie, or a wrong or stale one): one 20-byte
  cookie packet, never more bytes than the request (``cookie_sent``);
* a source address at which no subscriber receives: nothing (``not_authorized``) -- a request
  is answered from the journal of the subscriber receiving at its source, so it never returns
  another subscriber's messages;
* messages asked for that are before the journal's retention, or in a hole (sent but never
  journaled), are gone: ``unanswered_messages`` counts them, and the answer starts at the next
  journaled message (so a packet starting later than asked tells the client that the messages
  between are gone); a request with nothing left to answer (all gone, not sent yet, a count of
  0, messages of another session) gets nothing (``unanswered``);
* otherwise the messages from the first one asked (or retained), as many as fit in a downstream
  packet of at most ``max_payload`` bytes (1,400: a request for more is served in part, the client
  asks again for the rest) (``served``, ``served_messages``).

So no reply to an unproven source is larger than its request (amplification factor 1), and a
proven one gets at most ``max_payload`` bytes per request, at the rate its bucket allows.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from ..errors import SubcError
from ..ratelimit import RateLimiter
from ..wire.moldudp64 import HEADER_LEN, encode_packet
from ..wire.moldudp64_request import decode_request, encode_cookie
from .cookies import Cookies
from .journal import Journal

#: Largest UDP payload of a reply (bytes).
MAX_PAYLOAD = 1400
#: Packet overhead a message adds to a downstream packet beyond its bytes: its 2-byte length.
BLOCK_OVERHEAD = 2
#: A journal packet's overhead (SoupBinTCP: 2-byte length and the type byte).
JOURNAL_OVERHEAD = 3


@dataclass
class Stream:
    """One subscriber's stream as the server sees it: its ``journal`` and the ``addresses``
    ((host, port)) its subscriber receives at, the only ones allowed to re-request it."""

    journal: Journal
    addresses: set[tuple[str, int]] = field(default_factory=set)


class RequestServer:
    """Answers MoldUDP64 requests (see the module docstring).  ``streams``: the stream of the
    subscriber receiving at a source address ((host, port)), or None; ``rate``: requests per
    second and source host (burst as many)."""

    def __init__(
        self,
        streams: Callable[[tuple[str, int]], Stream | None],
        cookies: Cookies | None = None,
        rate: float = 100.0,
        max_payload: int = MAX_PAYLOAD,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_payload < HEADER_LEN + BLOCK_OVERHEAD:
            raise SubcError(f"a reply of {max_payload} bytes holds no message")
        self.streams = streams
        self.cookies = cookies or Cookies()
        self.limiter = RateLimiter(rate, clock)
        self.max_payload = max_payload
        self.counters: Counter = Counter()
        self.lock = threading.Lock()  # held while a reply reads a journal (the journal's writer takes it too)
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def handle(self, data: bytes, addr: tuple[str, int]) -> bytes | None:
        """The reply to request ``data`` from ``addr`` ((host, port)), or None."""
        self.counters["requests"] += 1
        try:
            req = decode_request(data)
        except SubcError:
            self.counters["malformed"] += 1
            return None
        if not self.limiter.allow(addr[0]):
            self.counters["rate_limited"] += 1
            return None
        if not self.cookies.check(addr, req.cookie):
            self.counters["cookie_sent"] += 1
            return encode_cookie(req.session_bytes, self.cookies.issue(addr))
        stream = self.streams(addr)
        if stream is None or addr not in stream.addresses:
            self.counters["not_authorized"] += 1
            return None
        with self.lock:
            return self._answer(stream.journal, req.session_bytes, req.seq, req.count)

    def _answer(self, j: Journal, session: bytes, seq: int, count: int) -> bytes | None:
        end = seq + count  # past the last message asked
        sent_end = min(end, j.next_seq)  # past the last one asked that was sent
        start = max(seq, j.first_seq)
        first = j.available_from(start) if count and start < sent_end else None
        if first is not None and (first >= sent_end or j.session_of(first) != session):
            first = None  # nothing journaled in the range, or another session's messages
        gone_end = first if first is not None else sent_end
        lo = max(seq, 1)  # sequence number 0 is never sent
        if gone_end > lo:  # sent, but before retention or in a hole: counted; the rest answered
            self.counters["unanswered_messages"] += gone_end - lo
        if first is None:
            self.counters["unanswered"] += 1
            return None
        # a journal packet is one byte longer than the message's block: the budget in its terms
        room = self.max_payload - HEADER_LEN
        messages: list[bytes] = []
        used = 0
        for m in j.read(first, end - first, room + room // BLOCK_OVERHEAD, session):
            if used + BLOCK_OVERHEAD + len(m) > room:
                break
            messages.append(m)
            used += BLOCK_OVERHEAD + len(m)
        if not messages:  # a message larger than a reply: unanswerable over UDP
            self.counters["unanswered"] += 1
            return None
        self.counters["served"] += 1
        self.counters["served_messages"] += len(messages)
        return encode_packet(session, first, messages)

    # -- the socket ----------------------------------------------------------------------------

    def start(self, host: str, port: int) -> tuple[str, int]:
        """Serve on UDP ``host``:``port`` (0: any free port) in a thread; returns the address."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((host, port))
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="subc-rerequest", daemon=True)
        self._thread.start()
        return sock.getsockname()

    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            try:
                data, addr = sock.recvfrom(2048)
            except OSError:
                return  # closed
            reply = self.handle(data, addr)
            if reply is not None:
                try:
                    sock.sendto(reply, addr)
                except OSError:
                    self.counters["send_errors"] += 1

    def stop(self) -> None:
        """Close the socket and end the thread."""
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
