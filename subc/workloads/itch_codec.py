"""An ITCH 5.0 codec for the workloads and the tests, independent of any spec.

subc's commands decode messages with the spec (:mod:`subc.wire.decoder`); this module knows the
ITCH 5.0 layout itself, for what must not depend on a spec: the workload generators, the tests'
independent references (a checker must not share what it checks), and ``subc replay`` of a
BinaryFILE without ``--spec``.

BinaryFILE framing (Nasdaq): each message is preceded by a 2-byte big-endian length; a zero
length normally ends a session.  Some tools write every length as zero (the shared RITCH
sample does): when a zero length is followed by a known message type with enough bytes left,
the reader takes the length from the message type (ITCH 5.0 section 1.3, message formats) and
counts the fallback.  All integers are unsigned big-endian.

Add Order ``A`` (36 bytes) and Add Order with MPID ``F`` (40 bytes) decode into the fields of
the example spec (``examples/itch/spec.p4``): ``add_order.stock_locate``, ``tracking_number``,
``timestamp`` (ns since midnight, 48 bits), ``order_ref_number``, ``buy_sell_indicator``,
``shares``, ``stock`` (8 ASCII bytes as an integer) and ``price`` (Price(4), raw integer).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..errors import SubcError
from ..wire.binaryfile import iter_frames

#: Message length in bytes by type (ITCH 5.0 section 1.3).
MESSAGE_LENGTHS = {
    b"S": 12,
    b"R": 39,
    b"H": 25,
    b"Y": 20,
    b"L": 26,
    b"V": 35,
    b"W": 12,
    b"K": 28,
    b"J": 35,
    b"h": 21,
    b"A": 36,
    b"F": 40,
    b"E": 31,
    b"C": 36,
    b"X": 23,
    b"D": 19,
    b"U": 35,
    b"P": 44,
    b"Q": 40,
    b"B": 19,
    b"I": 50,
    b"N": 20,
    b"O": 48,
}
ADD_ORDER_TYPES = (b"A", b"F")


@dataclass
class ReadStats:
    """Counts from reading a BinaryFILE: messages by type, zero-length fallbacks."""

    by_type: Counter = field(default_factory=Counter)
    zero_length_fallbacks: int = 0

    @property
    def messages(self) -> int:
        return sum(self.by_type.values())


def iter_binaryfile(
    data: bytes, path: str = "<data>", stats: ReadStats | None = None, length_of=None
) -> Iterator[tuple[int, bytes]]:
    """Yield (byte offset of the length prefix, message bytes) for every message of ``data``.

    ``length_of(data, pos)``: the length of the message at ``pos`` by its type, for zero length
    prefixes (default: the ITCH 5.0 lengths, whose lengths are then also checked; a spec's
    :meth:`~subc.wire.decoder.TypeTable.length_of` checks nothing here, the spec's decoder does).
    Raises :class:`SubcError` naming ``path`` and the byte offset when a length runs past the end
    of the data or a zero-length message has an unknown type.
    """
    stats = stats if stats is not None else ReadStats()

    def fallback() -> None:
        stats.zero_length_fallbacks += 1

    frames = iter_frames(data, path, length_of or _itch_length_of, fallback)
    for pos, msg in frames:
        expected = MESSAGE_LENGTHS.get(msg[:1]) if length_of is None else None
        if expected is not None and expected != len(msg):
            raise SubcError(
                f"{path}: message type {msg[:1]!r} at byte offset {pos} has length {len(msg)}, expected {expected}"
            )
        stats.by_type[msg[:1].decode("latin-1")] += 1
        yield pos, msg


def _itch_length_of(data: bytes, pos: int) -> int | None:
    """The ITCH 5.0 length of the message at byte ``pos`` of ``data`` by its type."""
    return MESSAGE_LENGTHS.get(data[pos : pos + 1])


def read_binaryfile(path: str | Path, stats: ReadStats | None = None, length_of=None) -> Iterator[tuple[int, bytes]]:
    """:func:`iter_binaryfile` over the file at ``path`` (unreadable: SubcError)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SubcError(f"cannot read trace {path}: {e}") from e
    return iter_binaryfile(data, str(path), stats, length_of)


def decode_add_order(msg: bytes) -> dict[str, int]:
    """Decode an Add Order (``A`` or ``F``) into ``{'add_order.<field>': raw value}``.

    Raises ValueError for another message type or a short message.
    """
    if msg[:1] not in ADD_ORDER_TYPES or len(msg) < 36:
        raise ValueError("not an Add Order message")
    be = int.from_bytes
    return {
        "itch.msg_type": msg[0],
        "add_order.stock_locate": be(msg[1:3], "big"),
        "add_order.tracking_number": be(msg[3:5], "big"),
        "add_order.timestamp": be(msg[5:11], "big"),
        "add_order.order_ref_number": be(msg[11:19], "big"),
        "add_order.buy_sell_indicator": msg[19],
        "add_order.shares": be(msg[20:24], "big"),
        "add_order.stock": be(msg[24:32], "big"),
        "add_order.price": be(msg[32:36], "big"),
    }


def encode_add_order(fields: dict[str, int], mpid: bytes | None = None) -> bytes:
    """The bytes of an Add Order message with ``fields`` as :func:`decode_add_order` returns them
    (missing fields are 0): 36 bytes (``A``), or 40 (``F``) when an ``mpid`` of 4 bytes is given.

    Raises ValueError when a value does not fit its field.
    """
    g = lambda n: fields.get("add_order." + n, 0)  # noqa: E731
    msg = (
        (b"F" if mpid is not None else b"A")
        + g("stock_locate").to_bytes(2, "big")
        + g("tracking_number").to_bytes(2, "big")
        + g("timestamp").to_bytes(6, "big")
        + g("order_ref_number").to_bytes(8, "big")
        + g("buy_sell_indicator").to_bytes(1, "big")
        + g("shares").to_bytes(4, "big")
        + g("stock").to_bytes(8, "big")
        + g("price").to_bytes(4, "big")
    )
    if mpid is not None:
        if len(mpid) != 4:
            raise ValueError("an MPID has 4 bytes")
        msg += mpid
    return msg


def stock_value(symbol: str) -> int:
    """The raw ``stock`` value of a symbol (8 ASCII bytes, space padded)."""
    return int.from_bytes(symbol.encode("ascii").ljust(8, b" "), "big")


def stock_symbol(value: int) -> str:
    """The symbol of a raw ``stock`` value (8 ASCII bytes, trailing spaces removed)."""
    return value.to_bytes(8, "big").decode("ascii", "replace").rstrip()
