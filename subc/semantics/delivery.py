"""Per-recipient delivery of MoldUDP64 datagrams: the semantics every target implements.

docs/ebpf.md "Delivery semantics".  A datagram to a feed port carries a MoldUDP64 header (MoldUDP64
Protocol Specification v1.00) and N messages; each message is classified on its own (a
:class:`~subc.semantics.reference.Decision`, or None when it is not decoded: the spec's parser
rejects it or its length differs from its type's).  A *recipient* is a subscriber (a ``fwd()``
port) or, on the host broker, the local stack (:data:`LOCAL`: messages whose action is ``nop``).
Each recipient of at least one message receives exactly one datagram holding exactly its
messages, in their original order, each with its 2-byte length; its MoldUDP64 header keeps the
session, carries the count of its messages and the recipient's own next sequence number, which
then advances by that count, so that every recipient sees a gap-free sequence from 1.  A heartbeat
(count 0) or end of session (count 0xFFFF) goes to every recipient with its next sequence number
(which does not advance).  A datagram whose framing disagrees with its bytes is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..errors import SubcError
from ..wire.moldudp64 import END_OF_SESSION, HEARTBEAT, decode_packet, encode_end_of_session, encode_packet
from .reference import Decision

#: The local stack as a recipient.
LOCAL = "local"


@dataclass(frozen=True)
class Copy:
    """One recipient's datagram: MoldUDP64 ``session`` (10 bytes), ``seq``, ``count`` (header
    field) and ``messages`` (bytes, in order)."""

    session: bytes
    seq: int
    count: int
    messages: tuple[bytes, ...]

    def payload(self) -> bytes:
        """The UDP payload: header, then each message with its 2-byte big-endian length."""
        if self.count == END_OF_SESSION:
            return encode_end_of_session(self.session, self.seq)
        return encode_packet(self.session, self.seq, list(self.messages))


def split_payload(payload: bytes) -> tuple[bytes, int, int, list[bytes]] | None:
    """(session, sequence number, count, messages) of a MoldUDP64 payload
    (:func:`~.moldudp64.decode_packet`), or None when its framing disagrees with its bytes."""
    try:
        p = decode_packet(payload)
    except SubcError:
        return None
    return p.session_bytes, p.seq, p.count, p.messages


def recipients_of(decision: Decision | None, broker: bool = True) -> set:
    """The recipients of a message with ``decision`` (None: not decoded): its ``fwd`` ports, or
    :data:`LOCAL` for ``nop`` on the host broker (``broker``), or none."""
    if decision is None:
        return set()
    if decision.ports:
        return set(decision.ports)
    if broker and decision.action and decision.action[0] == "nop":
        return {LOCAL}
    return set()


@dataclass
class Delivery:
    """The delivery state of a broker: every recipient's next sequence number (from 1).

    ``everyone``: the recipients a heartbeat goes to; ``decide``: message bytes -> the set of its
    recipients (see :func:`recipients_of`).
    """

    decide: Callable[[bytes], set]
    everyone: Iterable = ()
    next_seq: dict = field(default_factory=dict)

    def datagram(self, payload: bytes) -> dict | None:
        """The copies of one datagram: recipient -> :class:`Copy` (None: a malformed datagram)."""
        parts = split_payload(payload)
        if parts is None:
            return None
        session, _, count, msgs = parts
        if count in (HEARTBEAT, END_OF_SESSION):
            return {r: Copy(session, self.next_seq.get(r, 1), count, ()) for r in self.everyone}
        per: dict = {}
        for m in msgs:
            for r in self.decide(m):
                per.setdefault(r, []).append(m)
        out = {}
        for r, ms in per.items():
            seq = self.next_seq.get(r, 1)
            out[r] = Copy(session, seq, len(ms), tuple(ms))
            self.next_seq[r] = seq + len(ms)
        return out
