"""Protobuf wire framing for P4Runtime requests built from serialized parts.

Pure-Python protobuf (p4runtime-shell pins protobuf below 3.21, which has no C implementation
for Python 3.11) spends most of a P4Runtime writer's time building and serializing messages.
Two properties of the protobuf encoding (encoding guide, "Message Structure" and "Last One
Wins"/"Packed Repeated Fields") let a writer serialize less: a message's fields may come in any
order, and a repeated or embedded message field is its key, its length and its bytes.  So a
WriteRequest is the serialization of its other fields followed by each update framed as the
``updates`` field (:meth:`~.session.Session.write`), and the copies of one entry in the tables of
a multi-message program's slots, which differ only in ``table_id``, are one serialized TableEntry
without it, prefixed by each table's id (:func:`~.requests.slot_updates`).  Field numbers come
from the messages' descriptors, never from here.
"""

from __future__ import annotations


def varint(n: int) -> bytes:
    """Base-128 varint of ``n`` >= 0 (least significant group first)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def varint_field(field: int, value: int) -> bytes:
    """Field ``field`` of wire type 0 (varint) holding ``value`` >= 0."""
    return varint(field << 3) + varint(value)


def length_delimited(field: int, payload: bytes) -> bytes:
    """``payload`` as field ``field`` of wire type 2 (length-delimited): key, length, bytes."""
    return varint((field << 3) | 2) + varint(len(payload)) + payload
