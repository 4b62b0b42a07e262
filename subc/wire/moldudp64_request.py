"""MoldUDP64 re-requests (MoldUDP64 Protocol Specification v1.00, "Request packets") and subc's
address-proof extension.

A request is 20 bytes, all integers unsigned big-endian::

    offset  length  field
    0       10      session          the stream's session, as in its downstream packets
    10      8       sequence number  the first message wanted
    18      2       message count    how many messages are wanted

The request server answers with an ordinary downstream packet (:mod:`.moldudp64`) holding the
messages, sent to the request's source.  Because a UDP source address can be forged, subc's server
answers a source that has not proven it receives at its address with a 20-byte *cookie* packet
(no larger than the request, as DNS cookies, RFC 7873, and QUIC Retry do): the session, an 8-byte
cookie in the sequence-number field and the message count :data:`COOKIE_COUNT`, which no
downstream packet of 20 bytes can carry (a count of 0xFFFE needs message blocks), so a client that
does not know the extension ignores it.  The client repeats its request with the cookie appended
(28 bytes); the server then answers it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SubcError
from .moldudp64 import HEADER_LEN, SESSION_LEN, encode_packet, session_name

REQUEST_LEN = 20
COOKIE_LEN = 8
#: The message count of a cookie packet (never that of a 20-byte downstream packet).
COOKIE_COUNT = 0xFFFE


@dataclass(frozen=True)
class MoldRequest:
    """A decoded request: ``session`` (name, as :func:`~.moldudp64.session_name` gives it),
    ``seq`` (first sequence number wanted), ``count`` (messages wanted), ``cookie`` (8 bytes, or
    None for a plain MoldUDP64 request) and ``session_bytes`` (the 10 bytes as received)."""

    session: str
    seq: int
    count: int
    cookie: bytes | None
    session_bytes: bytes


def encode_request(session: bytes | str, seq: int, count: int, cookie: bytes | None = None) -> bytes:
    """The request packet (20 bytes, 28 with ``cookie``).  Raises SubcError for a session of
    more than 10 bytes, a ``seq`` outside 0..2**64-1, a ``count`` outside 0..65535 or a cookie
    that is not 8 bytes."""
    if not 0 <= count <= 0xFFFF:
        raise SubcError(f"MoldUDP64 request count {count} does not fit in 16 bits")
    if cookie is not None and len(cookie) != COOKIE_LEN:
        raise SubcError(f"a cookie is {COOKIE_LEN} bytes, not {len(cookie)}")
    header = encode_packet(session, seq, [])[:18] + count.to_bytes(2, "big")
    return header + (cookie or b"")


def decode_request(data: bytes) -> MoldRequest:
    """The request in UDP payload ``data``: SubcError unless it is 20 bytes (28 with a cookie)."""
    if len(data) not in (REQUEST_LEN, REQUEST_LEN + COOKIE_LEN):
        raise SubcError(
            f"MoldUDP64 request of {len(data)} bytes (a request is {REQUEST_LEN}, {REQUEST_LEN + 8} with a cookie)"
        )
    raw = bytes(data[:SESSION_LEN])
    cookie = bytes(data[REQUEST_LEN:]) if len(data) > REQUEST_LEN else None
    return MoldRequest(
        session_name(raw), int.from_bytes(data[10:18], "big"), int.from_bytes(data[18:20], "big"), cookie, raw
    )


def encode_cookie(session_bytes: bytes, cookie: bytes) -> bytes:
    """The 20-byte cookie packet for a request of session ``session_bytes`` (10 bytes as received)."""
    if len(session_bytes) != SESSION_LEN or len(cookie) != COOKIE_LEN:
        raise SubcError("a cookie packet takes a 10-byte session and an 8-byte cookie")
    return session_bytes + cookie + COOKIE_COUNT.to_bytes(2, "big")


def cookie_of(data: bytes) -> bytes | None:
    """The cookie of a cookie packet, or None when ``data`` is no cookie packet."""
    if len(data) == HEADER_LEN and int.from_bytes(data[18:20], "big") == COOKIE_COUNT:
        return bytes(data[10:18])
    return None
