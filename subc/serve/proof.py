"""Address proof for ``subc serve``'s UDP requests (issue 40): a request whose source address is
forged must make the broker send the victim nothing larger than the request, and never a feed.

A UDP source (address, port) proves that it receives at that address by returning a cookie the
broker sent there (as DTLS's HelloVerifyRequest, QUIC's Retry and DNS cookies, RFC 7873, do): a
keyed hash of the address under a secret that changes every 120 s
(:class:`~subc.recovery.cookies.Cookies`, shared with the MoldUDP64 request server), so a cookie is
good for one to two periods and only for the address it was sent to.  The rules, per request line
of a datagram (:meth:`AddressProof.datagram`):

* a line ending with ``COOKIE <hex>`` whose cookie is the source's is *proven* and processed as
  any request (the parser takes the cookie off); a cookie that is not the source's, or stale, is
  counted (``bad_cookie``) and the line is unproven;
* a ``SUBSCRIBE`` or ``SUB`` line with ``TO <ip>:<port> TOKEN <t>`` where a token grant of the ACL
  lets ``<t>`` direct deliveries to ``<ip>`` is proven by the token (``proven_token``); the ACL
  then decides ``TO`` as before;
* any other line is unproven (``requests_unproven``, except ``PING``): it is not parsed and changes
  nothing; the datagram gets at most one reply for all its unproven lines, the first one's:
  ``PONG`` for a ``PING``, else ``COOKIE <16 hex digits>`` (``cookies_sent``), and only when the
  reply with its newline is no longer than the datagram (24 bytes for a cookie); otherwise nothing
  (``too_short_unproven``).  Further unproven lines of the datagram get nothing
  (``unproven_unanswered``).

Nothing is remembered per source: every UDP request except ``PING`` carries its cookie, and one
without (or with a stale one) gets a new ``COOKIE`` line, which the client appends to the request
it sends again.  TCP requests are proven by the handshake and never come here.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from ..recovery.cookies import Cookies
from .acl import Acl
from .protocol import COOKIE, COOKIE_REPLY_BYTES, claimed_grant, split_cookie

#: The events counted in :attr:`AddressProof.counters` (and the daemon's metrics).
EVENTS = (
    "proven_cookie",
    "proven_token",
    "bad_cookie",
    "requests_unproven",
    "cookies_sent",
    "pings_unproven",
    "too_short_unproven",
    "unproven_unanswered",
)
PONG = "PONG"


def _is_ping(line: bytes) -> bool:
    return line.strip().upper() == b"PING"


class AddressProof:
    """The address check of UDP request lines (module docstring), with the ``acl``'s token grants
    and ``cookies``; ``counters`` counts :data:`EVENTS`, each also given to ``on_event`` (the
    daemon's metrics)."""

    def __init__(self, acl: Acl, cookies: Cookies | None = None, on_event: Callable[[str], None] | None = None):
        self.acl = acl
        self.cookies = cookies or Cookies()
        self.on_event = on_event
        self.counters: Counter = Counter()

    def _count(self, event: str) -> None:
        self.counters[event] += 1
        if self.on_event is not None:
            self.on_event(event)

    def cookie_line(self, source: tuple[str, int]) -> str:
        """The ``COOKIE <hex>`` reply line for ``source`` (without its newline)."""
        return f"{COOKIE} {self.cookies.issue(source).hex()}"

    def _by_token(self, line: bytes) -> bool:
        grant = claimed_grant(line)
        return grant is not None and self.acl.token_grants(grant[1], grant[0])

    def proven(self, raw: bytes, source: tuple[str, int]) -> bool:
        """Whether request line ``raw`` from ``source`` is proven (nothing counted)."""
        line, cookie = split_cookie(raw)
        return (cookie is not None and self.cookies.check(source, cookie)) or self._by_token(line)

    def datagram(self, lines: list[bytes], source: tuple[str, int], size: int) -> tuple[list[bytes], str | None]:
        """Of the request ``lines`` of one UDP datagram of ``size`` bytes from ``source``: the
        proven ones, to be processed, and the one reply line (without its newline) to the
        unproven others, or None."""
        proven: list[bytes] = []
        answer: str | None = None
        answered = False  # the datagram's one reply to its unproven lines is decided
        for raw in lines:
            line, cookie = split_cookie(raw)
            if cookie is not None:
                if self.cookies.check(source, cookie):
                    self._count("proven_cookie")
                    proven.append(raw)
                    continue
                self._count("bad_cookie")
            elif self._by_token(line):
                self._count("proven_token")
                proven.append(raw)
                continue
            ping = _is_ping(line)
            self._count("pings_unproven" if ping else "requests_unproven")
            if answered:
                self._count("unproven_unanswered")
                continue
            answered = True
            if (len(PONG) + 1 if ping else COOKIE_REPLY_BYTES) > size:
                self._count("too_short_unproven")
                continue
            if ping:
                answer = PONG
            else:
                answer = self.cookie_line(source)
                self._count("cookies_sent")
        return proven, answer
