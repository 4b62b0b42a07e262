"""MoldUDP64 downstream packets (MoldUDP64 Protocol Specification v1.00, "Downstream packets").

A downstream packet is a 20-byte header followed by message blocks; all integers are unsigned
big-endian::

    offset  length  field
    0       10      session          ASCII, padded on the right with spaces
    10      8       sequence number  sequence number of the first message in the packet
    18      2       message count    0 = heartbeat, 0xFFFF = end of session
    20      ...     message blocks   per message: length (2 bytes) then that many message bytes

In a heartbeat and in an end-of-session packet the sequence number is that of the next message
the publisher will send, and there are no message blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SubcError

HEADER_LEN = 20
SESSION_LEN = 10
END_OF_SESSION = 0xFFFF
HEARTBEAT = 0
#: Largest message count of a packet that carries messages (0xFFFF means end of session).
MAX_COUNT = END_OF_SESSION - 1
MAX_MESSAGE_LEN = 0xFFFF


@dataclass
class MoldPacket:
    """A decoded downstream packet.

    ``session`` is the session name without its space padding when the session field is printable
    ASCII, else ``0x`` and the 20 hex digits of its 10 bytes (real captures have zeroed sessions;
    22 characters, so it never equals a printable name); ``seq`` the sequence number of the first
    message (of the next message for heartbeats and end of session); ``count`` the header's message
    count (0 = heartbeat, :data:`END_OF_SESSION`); ``messages`` the message bytes in order (empty for
    heartbeats and end of session); ``session_bytes`` the 10 bytes of the session field as received.
    """

    session: str
    seq: int
    count: int
    messages: list[bytes] = field(default_factory=list)
    session_bytes: bytes = b""

    @property
    def is_heartbeat(self) -> bool:
        return self.count == HEARTBEAT

    @property
    def is_end_of_session(self) -> bool:
        return self.count == END_OF_SESSION


def _session_bytes(session: bytes | str) -> bytes:
    raw = session.encode("ascii") if isinstance(session, str) else bytes(session)
    if len(raw) > SESSION_LEN:
        raise SubcError(f"MoldUDP64 session {raw!r} is longer than {SESSION_LEN} bytes")
    return raw.ljust(SESSION_LEN, b" ")


def _header(session: bytes | str, seq: int, count: int) -> bytes:
    if not 0 <= seq < 1 << 64:
        raise SubcError(f"MoldUDP64 sequence number {seq} does not fit in 64 bits")
    return _session_bytes(session) + seq.to_bytes(8, "big") + count.to_bytes(2, "big")


def encode_packet(session: bytes | str, seq: int, messages: list[bytes]) -> bytes:
    """The downstream packet (bytes) carrying ``messages`` from sequence number ``seq`` on.

    ``session``: at most 10 ASCII characters (padded with spaces); no messages gives a
    heartbeat.  Raises :class:`SubcError` for a longer session, a ``seq`` outside 0..2**64-1,
    more than 65534 messages or a message longer than 65535 bytes.
    """
    if len(messages) > MAX_COUNT:
        raise SubcError(f"a MoldUDP64 packet holds at most {MAX_COUNT} messages, got {len(messages)}")
    parts = [_header(session, seq, len(messages))]
    for i, msg in enumerate(messages):
        if len(msg) > MAX_MESSAGE_LEN:
            raise SubcError(
                f"message {i} is {len(msg)} bytes, a MoldUDP64 message block holds at most {MAX_MESSAGE_LEN}"
            )
        parts.append(len(msg).to_bytes(2, "big"))
        parts.append(bytes(msg))
    return b"".join(parts)


def encode_end_of_session(session: bytes | str, next_seq: int) -> bytes:
    """The end-of-session packet (20 bytes, count 0xFFFF); ``next_seq`` = sequence number after the last message."""
    return _header(session, next_seq, END_OF_SESSION)


def decode_packet(data: bytes) -> MoldPacket:
    """Decode one downstream packet (the whole UDP payload ``data``).

    Any session bytes are accepted (see :class:`MoldPacket`).  Raises :class:`SubcError` naming the
    byte offset when the header is shorter than 20 bytes, a message block runs past the end, or
    bytes follow the last message block (or follow the header of a heartbeat or end-of-session
    packet).
    """
    n = len(data)
    if n < HEADER_LEN:
        raise SubcError(f"MoldUDP64: truncated header: {n} bytes, need {HEADER_LEN} (at byte offset 0)")
    raw_session = bytes(data[:SESSION_LEN])
    seq = int.from_bytes(data[10:18], "big")
    count = int.from_bytes(data[18:20], "big")
    messages: list[bytes] = []
    pos = HEADER_LEN
    for i in range(0 if count == END_OF_SESSION else count):
        if pos + 2 > n:
            raise SubcError(f"MoldUDP64: truncated length of message {i} of {count} at byte offset {pos} ({n} bytes)")
        length = int.from_bytes(data[pos : pos + 2], "big")
        if pos + 2 + length > n:
            raise SubcError(
                f"MoldUDP64: message {i} of {count} ({length} bytes) at byte offset {pos} runs past the end ({n} bytes)"
            )
        messages.append(bytes(data[pos + 2 : pos + 2 + length]))
        pos += 2 + length
    if pos != n:
        raise SubcError(f"MoldUDP64: {n - pos} unexpected bytes after the last message block at byte offset {pos}")
    return MoldPacket(session_name(raw_session), seq, count, messages, raw_session)


def session_name(raw: bytes) -> str:
    """The name of the 10-byte session field ``raw``: printable ASCII without its space padding, else
    ``0x`` and its hex digits (e.g. ``0x00000000000000000000`` for a zeroed session)."""
    if raw.isascii():
        text = raw.decode("ascii")
        if text.isprintable():  # ASCII 0x20..0x7e
            return text.rstrip(" ")
    return "0x" + raw.hex()
