"""SoupBinTCP 4.1 packets (Nasdaq, "SoupBinTCP 4.1": "SoupBinTCP Logical Packets", "Data Types",
"Logical Packets Sent by a SoupBinTCP Server", "Logical Packets Sent by the SoupBinTCP Client").

Every logical packet is a 2-byte big-endian *packet length*, which counts the type byte and the
payload (never itself), then the 1-byte *packet type*, then the payload::

    offset  length  field
    0       2       packet length    1 + len(payload), unsigned big-endian
    2       1       packet type      one ASCII character
    3       ...     payload          by type (below)

Types and payloads (alpha fields are ASCII, left-justified, padded on the right with spaces;
numeric fields are ASCII digits, right-justified, padded on the left with spaces)::

    type  name                 sent by  payload
    '+'   Debug                both     free text
    'A'   Login Accepted       server   session (10, alpha), sequence number (20, numeric):
                                        the number of the next Sequenced Data packet sent
    'J'   Login Rejected       server   reject reason code (1): 'A' not authorized,
                                        'S' session not available
    'S'   Sequenced Data       server   a message
    'H'   Server Heartbeat     server   none
    'Z'   End of Session       server   none
    'L'   Login Request        client   username (6, alpha), password (10, alpha),
                                        requested session (10, alpha; all spaces: the current one),
                                        requested sequence number (20, numeric; 0: only the
                                        messages generated from now on)
    'U'   Unsequenced Data     client   a message (subc's server sends it too: see below)
    'R'   Client Heartbeat     client   none
    'O'   Logout Request       client   none

Unsequenced Data is a free-form packet in 4.1; subc's server (:mod:`subc.recovery.soup_server`)
also sends it, as the reply to a client's Unsequenced Data, so :data:`FROM_SERVER` holds ``U``.

Decoding is strict where the layout is fixed: a packet length of 0, a type not allowed in the
direction decoded, or a payload whose size differs from its type's fixed size raises
:class:`~subc.errors.SubcError`.  One leniency: a numeric field may also be left-justified or
zero-padded (``"1" + 19 spaces`` is read as 1, as some clients send it), but it must hold digits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..errors import SubcError

# -- packet types ------------------------------------------------------------------------------

DEBUG = b"+"
LOGIN_ACCEPTED = b"A"
LOGIN_REJECTED = b"J"
SEQUENCED_DATA = b"S"
SERVER_HEARTBEAT = b"H"
END_OF_SESSION = b"Z"
LOGIN_REQUEST = b"L"
UNSEQUENCED_DATA = b"U"
CLIENT_HEARTBEAT = b"R"
LOGOUT_REQUEST = b"O"

#: Types a server sends (Unsequenced Data included: subc's server replies with it).
FROM_SERVER = frozenset({DEBUG, LOGIN_ACCEPTED, LOGIN_REJECTED, SEQUENCED_DATA, SERVER_HEARTBEAT, END_OF_SESSION,
                         UNSEQUENCED_DATA})  # fmt: skip
#: Types a client sends.
FROM_CLIENT = frozenset({DEBUG, LOGIN_REQUEST, UNSEQUENCED_DATA, CLIENT_HEARTBEAT, LOGOUT_REQUEST})
#: Every type of either direction.
ANY_TYPE = FROM_SERVER | FROM_CLIENT

#: Login Rejected reason codes.
REJECT_NOT_AUTHORIZED = b"A"
REJECT_SESSION_NOT_AVAILABLE = b"S"

#: Field sizes (bytes).
USERNAME_LEN = 6
PASSWORD_LEN = 10
SESSION_LEN = 10
SEQ_LEN = 20
#: The session field of a Login Request that asks for the current session.
BLANK_SESSION = b" " * SESSION_LEN
#: Largest payload: the 2-byte packet length also counts the type byte.
MAX_PAYLOAD = 0xFFFF - 1
#: Bytes before the payload: the packet length (2) and the type (1).
HEADER_LEN = 3

#: The payload size of each type whose payload has a fixed size (the others are free-form).
FIXED_PAYLOAD = {
    LOGIN_ACCEPTED: SESSION_LEN + SEQ_LEN,
    LOGIN_REJECTED: 1,
    SERVER_HEARTBEAT: 0,
    END_OF_SESSION: 0,
    LOGIN_REQUEST: USERNAME_LEN + PASSWORD_LEN + SESSION_LEN + SEQ_LEN,
    CLIENT_HEARTBEAT: 0,
    LOGOUT_REQUEST: 0,
}

_NAMES = {
    DEBUG: "Debug",
    LOGIN_ACCEPTED: "Login Accepted",
    LOGIN_REJECTED: "Login Rejected",
    SEQUENCED_DATA: "Sequenced Data",
    SERVER_HEARTBEAT: "Server Heartbeat",
    END_OF_SESSION: "End of Session",
    LOGIN_REQUEST: "Login Request",
    UNSEQUENCED_DATA: "Unsequenced Data",
    CLIENT_HEARTBEAT: "Client Heartbeat",
    LOGOUT_REQUEST: "Logout Request",
}


@dataclass(frozen=True)
class Packet:
    """One logical packet: ``type`` (1 byte, e.g. ``b"S"``) and ``payload`` (bytes)."""

    type: bytes
    payload: bytes = b""

    def encode(self) -> bytes:
        """The packet's bytes (:func:`encode_packet`)."""
        return encode_packet(self.type, self.payload)


@dataclass(frozen=True)
class LoginRequest:
    """A Login Request's fields: ``username`` and ``password`` (str, without their padding),
    ``session`` (the 10 bytes as sent; :data:`BLANK_SESSION` asks for the current session) and
    ``seq`` (the requested sequence number; 0: only messages generated from now on)."""

    username: str
    password: str
    session: bytes = BLANK_SESSION
    seq: int = 0


@dataclass(frozen=True)
class LoginAccepted:
    """A Login Accepted's fields: ``session`` (the 10 bytes) and ``seq`` (the sequence number of
    the next Sequenced Data packet the server sends)."""

    session: bytes
    seq: int


def type_name(ptype: bytes) -> str:
    """The spec's name of packet type ``ptype`` (``"Sequenced Data"``), or its repr when unknown."""
    return _NAMES.get(ptype, repr(ptype))


# -- fields ------------------------------------------------------------------------------------


def alpha(value: str | bytes, size: int, what: str) -> bytes:
    """An alpha field: ``value`` (ASCII) left-justified in ``size`` bytes, padded with spaces.
    Raises SubcError when it is longer than ``size`` or not ASCII."""
    try:
        raw = value.encode("ascii") if isinstance(value, str) else bytes(value)
    except UnicodeEncodeError:
        raise SubcError(f"SoupBinTCP {what} {value!r} is not ASCII") from None
    if len(raw) > size:
        raise SubcError(f"SoupBinTCP {what} {value!r} is longer than its {size}-byte field")
    return raw.ljust(size, b" ")


def numeric(value: int, size: int, what: str) -> bytes:
    """A numeric field: ``value`` in ASCII digits, right-justified in ``size`` bytes, padded with
    spaces.  Raises SubcError for a negative value or one with more than ``size`` digits."""
    text = str(value).encode("ascii")
    if value < 0 or len(text) > size:
        raise SubcError(f"SoupBinTCP {what} {value} does not fit a {size}-digit numeric field")
    return text.rjust(size, b" ")


def parse_numeric(field: bytes, what: str) -> int:
    """The number in numeric field ``field`` (ASCII digits padded with spaces on either side).
    Raises SubcError when it holds no digits, or anything but digits inside its padding."""
    digits = bytes(field).strip(b" ")
    if not digits or not digits.isdigit():
        raise SubcError(f"SoupBinTCP {what} {bytes(field)!r} is not an ASCII number")
    return int(digits)


def parse_alpha(field: bytes, what: str) -> str:
    """The text of alpha field ``field`` without its right padding.  Raises SubcError unless it
    is printable ASCII."""
    raw = bytes(field)
    if any(b < 0x20 or b > 0x7E for b in raw):
        raise SubcError(f"SoupBinTCP {what} {raw!r} is not printable ASCII")
    return raw.decode("ascii").rstrip(" ")


# -- packets -----------------------------------------------------------------------------------


def encode_packet(ptype: bytes, payload: bytes = b"") -> bytes:
    """The packet of type ``ptype`` (1 byte) with ``payload``: packet length (2 bytes, big-endian,
    ``1 + len(payload)``), type, payload.  Raises SubcError for a type of another size or a
    payload over :data:`MAX_PAYLOAD` bytes."""
    if len(ptype) != 1:
        raise SubcError(f"a SoupBinTCP packet type is 1 byte, not {ptype!r}")
    if len(payload) > MAX_PAYLOAD:
        raise SubcError(f"a SoupBinTCP payload holds at most {MAX_PAYLOAD} bytes, not {len(payload)}")
    return (len(payload) + 1).to_bytes(2, "big") + ptype + payload


def check_header(length: int, ptype: bytes, allowed: frozenset[bytes] = ANY_TYPE) -> None:
    """Raise SubcError unless a packet length of ``length`` and type ``ptype`` make a valid packet
    of the types ``allowed``: a length of at least 1 (the type byte), a known type, and the fixed
    payload size of that type when it has one."""
    if length < 1:
        raise SubcError(f"SoupBinTCP packet length {length}: it counts the type byte, so it is at least 1")
    if ptype not in allowed:
        known = "".join(sorted(t.decode("latin-1") for t in allowed))
        raise SubcError(f"unknown SoupBinTCP packet type {ptype!r} (expected one of {known!r})")
    size = FIXED_PAYLOAD.get(ptype)
    if size is not None and length - 1 != size:
        raise SubcError(
            f"SoupBinTCP {type_name(ptype)} packet with a {length - 1}-byte payload (its payload is {size} bytes)"
        )


def decode_packet(data: bytes, allowed: frozenset[bytes] = ANY_TYPE) -> Packet:
    """The one whole packet in ``data``.  Raises SubcError when ``data`` is shorter than a packet
    header (3 bytes), its packet length disagrees with its size, or :func:`check_header` fails."""
    if len(data) < HEADER_LEN:
        raise SubcError(f"a SoupBinTCP packet is at least {HEADER_LEN} bytes, not {len(data)}")
    length = int.from_bytes(data[:2], "big")
    ptype = bytes(data[2:3])
    check_header(length, ptype, allowed)
    if length + 2 != len(data):
        raise SubcError(f"SoupBinTCP packet length {length} means {length + 2} bytes, not {len(data)}")
    return Packet(ptype, bytes(data[3:]))


def encode_login_request(req: LoginRequest) -> bytes:
    """The Login Request packet of ``req`` (49 bytes).  Raises SubcError for a field that does not
    fit (username over 6 bytes, password over 10, session not 10 bytes, a negative ``seq``)."""
    if len(req.session) != SESSION_LEN:
        raise SubcError(f"a SoupBinTCP session is {SESSION_LEN} bytes, not {len(req.session)}")
    payload = (
        alpha(req.username, USERNAME_LEN, "username")
        + alpha(req.password, PASSWORD_LEN, "password")
        + bytes(req.session)
        + numeric(req.seq, SEQ_LEN, "requested sequence number")
    )
    return encode_packet(LOGIN_REQUEST, payload)


def decode_login_request(payload: bytes) -> LoginRequest:
    """The fields of a Login Request's 46-byte ``payload``.  Raises SubcError for another size, a
    username or password that is not printable ASCII, or a sequence number that is no number."""
    if len(payload) != FIXED_PAYLOAD[LOGIN_REQUEST]:
        raise SubcError(f"a SoupBinTCP Login Request payload is 46 bytes, not {len(payload)}")
    u, p = USERNAME_LEN, USERNAME_LEN + PASSWORD_LEN
    s = p + SESSION_LEN
    return LoginRequest(
        parse_alpha(payload[:u], "username"),
        parse_alpha(payload[u:p], "password"),
        bytes(payload[p:s]),
        parse_numeric(payload[s:], "requested sequence number"),
    )


def encode_login_accepted(session: bytes, seq: int) -> bytes:
    """The Login Accepted packet (33 bytes) of ``session`` (10 bytes) and ``seq`` (the number of
    the next Sequenced Data packet).  Raises SubcError when they do not fit their fields."""
    if len(session) != SESSION_LEN:
        raise SubcError(f"a SoupBinTCP session is {SESSION_LEN} bytes, not {len(session)}")
    return encode_packet(LOGIN_ACCEPTED, bytes(session) + numeric(seq, SEQ_LEN, "sequence number"))


def decode_login_accepted(payload: bytes) -> LoginAccepted:
    """The fields of a Login Accepted's 30-byte ``payload``.  Raises SubcError for another size or
    a sequence number that is no number."""
    if len(payload) != FIXED_PAYLOAD[LOGIN_ACCEPTED]:
        raise SubcError(f"a SoupBinTCP Login Accepted payload is 30 bytes, not {len(payload)}")
    return LoginAccepted(bytes(payload[:SESSION_LEN]), parse_numeric(payload[SESSION_LEN:], "sequence number"))


def encode_login_rejected(reason: bytes) -> bytes:
    """The Login Rejected packet (4 bytes) with reject reason code ``reason``
    (:data:`REJECT_NOT_AUTHORIZED` or :data:`REJECT_SESSION_NOT_AVAILABLE`); SubcError otherwise."""
    if reason not in (REJECT_NOT_AUTHORIZED, REJECT_SESSION_NOT_AVAILABLE):
        raise SubcError(f"SoupBinTCP reject reason code {reason!r} (it is b'A' or b'S')")
    return encode_packet(LOGIN_REJECTED, reason)


def encode_sequenced_data(message: bytes) -> bytes:
    """The Sequenced Data packet of ``message`` (at most :data:`MAX_PAYLOAD` bytes)."""
    return encode_packet(SEQUENCED_DATA, message)


def encode_unsequenced_data(message: bytes) -> bytes:
    """The Unsequenced Data packet of ``message`` (at most :data:`MAX_PAYLOAD` bytes)."""
    return encode_packet(UNSEQUENCED_DATA, message)


def encode_debug(text: bytes | str) -> bytes:
    """The Debug packet of ``text`` (str is encoded as ASCII, unencodable characters replaced)."""
    raw = text.encode("ascii", "replace") if isinstance(text, str) else bytes(text)
    return encode_packet(DEBUG, raw[:MAX_PAYLOAD])


#: The packets without payload (3 bytes each).
SERVER_HEARTBEAT_PACKET = encode_packet(SERVER_HEARTBEAT)
END_OF_SESSION_PACKET = encode_packet(END_OF_SESSION)
CLIENT_HEARTBEAT_PACKET = encode_packet(CLIENT_HEARTBEAT)
LOGOUT_REQUEST_PACKET = encode_packet(LOGOUT_REQUEST)


class PacketDecoder:
    """Whole packets out of a TCP byte stream, fed in pieces of any size.

    ``allowed``: the types accepted (:data:`FROM_CLIENT` on a server, :data:`FROM_SERVER` on a
    client).  :meth:`feed` keeps a partial packet for the next call.  A packet's header is checked
    as soon as its 3 bytes are in (:func:`check_header`), so a bad length, an unknown type or a
    wrong fixed payload size raises SubcError without waiting for the rest; the decoder is
    unusable after an error (the stream has lost its framing)."""

    def __init__(self, allowed: frozenset[bytes] = ANY_TYPE):
        self.allowed = allowed
        self._buf = bytearray()
        self._pos = 0
        self._failed: SubcError | None = None

    @property
    def pending(self) -> int:
        """Bytes held: the start of a packet not complete yet."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> Iterator[Packet]:
        """Take ``data`` (the next bytes of the stream) and return an iterator over the packets
        now complete, in order.  The bytes are taken at once; packets are cut as the iterator is
        consumed (those not consumed come out of the next call's iterator).  The iterator raises
        SubcError at the first malformed packet, after yielding the ones before it."""
        if self._failed is not None:
            raise self._failed
        self._buf += data
        return self._packets()

    def _packets(self) -> Iterator[Packet]:
        buf = self._buf
        while True:
            avail = len(buf) - self._pos
            if avail < 2:
                break
            length = int.from_bytes(buf[self._pos : self._pos + 2], "big")
            ptype = bytes(buf[self._pos + 2 : self._pos + 3])
            if length < 1 or ptype:  # a bad length is known from 2 bytes, the rest from 3
                self._check(length, ptype)
            if avail < 2 + max(length, 1):
                break
            start = self._pos
            self._pos += 2 + length
            yield Packet(ptype, bytes(buf[start + 3 : self._pos]))
        if self._pos:
            del buf[: self._pos]
            self._pos = 0

    def _check(self, length: int, ptype: bytes) -> None:
        """:func:`check_header`, remembered: the stream's framing is lost after an error."""
        try:
            check_header(length, ptype, self.allowed)
        except SubcError as e:
            self._failed = e
            raise
