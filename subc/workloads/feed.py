"""Pack ITCH 5.0 messages into MoldUDP64 datagrams the way a live feed does.

A BinaryFILE has no datagrams, so :func:`pack_messages` makes them: consecutive messages share a
downstream packet (MoldUDP64 Protocol Specification v1.00) until

* the next message's timestamp is more than ``window_ns`` after the packet's first message, or
* adding it would make the UDP payload exceed ``max_payload`` bytes, or the count 65,534.

The only ITCH knowledge used is the common message header (ITCH 5.0 section 1.3): every message
carries a 6-byte big-endian timestamp, ns since midnight, at byte offset 5.  A message shorter than
11 bytes has none and counts as sent at its predecessor's time.

Defaults.  ``max_payload`` = 1,400 bytes of UDP payload: with the 8-byte UDP and 20-byte IPv4
headers a frame stays under a 1,500-byte MTU with room for tunnels and VLAN tags (Nasdaq's MoldUDP64
feeds stay under the MTU: no IP fragments).  ``window_ns`` = 100 µs (:data:`DEFAULT_WINDOW_NS`): a
publisher flushes its packet when it is full or shortly after its first message; Nasdaq does not
publish that interval, so it is an assumption sized by what captures show.  At the open TotalView
carries bursts of well over one message per µs, and a captured packet then holds 38 messages (about
1,400 bytes): those messages span less than 100 µs, so the size limit, not the window, closes such
packets.  In quiet periods messages are milliseconds apart and go one per packet, as captured.  A
window much shorter (10 µs) would split bursts below the sizes seen at the open; a much longer one
(1 ms) would group messages that a live feed sends apart and delay them by up to a millisecond.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from ..wire.moldudp64 import HEADER_LEN, MAX_COUNT, encode_packet

#: Byte offset and length of the ITCH 5.0 timestamp in every message (ns since midnight).
TIMESTAMP_OFFSET, TIMESTAMP_LEN = 5, 6
#: Default packing window (ns): see the module docstring.
DEFAULT_WINDOW_NS = 100_000
#: Default largest UDP payload of a packed datagram (bytes).
DEFAULT_MAX_PAYLOAD = 1400


def message_timestamp(msg: bytes) -> int | None:
    """The ITCH timestamp of ``msg`` (ns since midnight), or None for a message shorter than 11 bytes."""
    end = TIMESTAMP_OFFSET + TIMESTAMP_LEN
    return int.from_bytes(msg[TIMESTAMP_OFFSET:end], "big") if len(msg) >= end else None


def pack_messages(
    messages: Iterable[bytes], window_ns: int = DEFAULT_WINDOW_NS, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> Iterator[tuple[list[bytes], int | None]]:
    """Group ``messages`` in order into ``(messages of one datagram, send time)`` by the rules of the
    module docstring; the send time is the timestamp (ns since midnight) of the datagram's last
    message that has one (None if none has), when a live publisher has all of its messages.

    Every message is in exactly one group, in order; a group's MoldUDP64 packet is at most
    ``max_payload`` bytes unless it is one message too long for that on its own; no message of a
    group is more than ``window_ns`` after the group's first timestamp (timestamps that go back,
    e.g. after midnight, are not "after").  Raises ValueError for a negative ``window_ns``."""
    if window_ns < 0:
        raise ValueError(f"the packing window must not be negative, got {window_ns} ns")
    group: list[bytes] = []
    size = HEADER_LEN
    first = last = None  # timestamps of the group's first message and of the latest message
    for msg in messages:
        ts = message_timestamp(msg)
        ts = last if ts is None else ts
        if group and (
            size + 2 + len(msg) > max_payload
            or len(group) >= MAX_COUNT
            or (first is not None and ts is not None and ts - first > window_ns)
        ):
            yield group, last
            group, size, first = [], HEADER_LEN, None
        if first is None:
            first = ts
        group.append(msg)
        size += 2 + len(msg)
        last = ts
    if group:
        yield group, last


@dataclass(frozen=True)
class FeedDatagram:
    """One packed datagram: ``seq`` (sequence number of its first message), ``messages``, ``time_ns``
    (send time, ns since midnight, or None; see :func:`pack_messages`) and ``payload`` (the
    MoldUDP64 downstream packet, bytes)."""

    seq: int
    messages: list[bytes]
    time_ns: int | None
    payload: bytes


def feed_datagrams(
    messages: Iterable[bytes],
    session: str | bytes,
    start_seq: int = 1,
    window_ns: int = DEFAULT_WINDOW_NS,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    batch: int | None = None,
) -> Iterator[FeedDatagram]:
    """The MoldUDP64 datagrams of ``messages``: packed by :func:`pack_messages`, or with ``batch`` exactly
    ``batch`` consecutive messages each (fewer when the payload would exceed ``max_payload``);
    sequence numbers from ``start_seq`` on, gap-free.  Raises :class:`~subc.errors.SubcError` for a
    bad session or sequence number (:func:`~subc.wire.moldudp64.encode_packet`), ValueError for a
    negative window."""
    groups = (
        pack_messages(messages, window_ns, max_payload) if batch is None else _batches(messages, batch, max_payload)
    )
    seq = start_seq
    for group, when in groups:
        yield FeedDatagram(seq, group, when, encode_packet(session, seq, group))
        seq += len(group)


def _batches(messages: Iterable[bytes], batch: int, max_payload: int) -> Iterator[tuple[list[bytes], int | None]]:
    group: list[bytes] = []
    size, last = HEADER_LEN, None
    for msg in messages:
        if group and (len(group) >= batch or size + 2 + len(msg) > max_payload):
            yield group, last
            group, size = [], HEADER_LEN
        group.append(msg)
        size += 2 + len(msg)
        ts = message_timestamp(msg)
        last = last if ts is None else ts
    if group:
        yield group, last
