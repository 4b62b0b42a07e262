"""The one message decoder: a spec's parser (:mod:`subc.spec.parse_graph`) run over messages.

A message (of a BinaryFILE, or one of the messages of a MoldUDP64 datagram) is decoded as the one
message of a MoldUDP64 datagram to the spec's first feed port: the parser runs from the feed's
entry state over the 20-byte MoldUDP64 header and 2-byte block length, then the message's bytes.
The network headers (Ethernet, IPv4, UDP) come from the datagram the message arrived in, decoded
by the same parser from its ``start`` state (:meth:`MessageDecoder.network`); a BinaryFILE message
has no datagram, so they are valid with every field 0.

A decoded message (:class:`Decoded`) has a ``status``:

* ``ok``: the parser accepted it on a *known type* (no ``default`` case taken after the message
  start) whose length equals the message's length, or is at most the message's length when the
  parser extracted a header the spec gives a payload (``@pragma query_payload``);
* ``unknown_type``: it took a ``default`` case (a type the spec does not parse): decoded as far as
  the parser went, which is the data plane's view of it;
* ``length_mismatch``: a known type whose length in the spec differs from the message's length:
  never decoded into values (``values`` is empty);
* ``rejected``: the parser rejected it (no select case matched): not decoded.

Only ``ok`` and ``unknown_type`` messages are classified; the other two are counted by the
commands that read traces and reported with their position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..spec.parse_graph import MOLD_PREFIX_BYTES, Feed, ParseGraph, put_bits, spec_start
from ..spec.model import Spec
from ..errors import SubcError

DECODED, UNKNOWN_TYPE, LENGTH_MISMATCH, REJECTED = "ok", "unknown_type", "length_mismatch", "rejected"


@dataclass
class Decoded:
    """A decoded message: ``status`` (see the module docstring), ``type_key`` (the key of the first
    select after the message start, the message type: an int, or None), ``length`` (bytes),
    ``expected`` (the known type's length in bytes, or None), ``valid`` (instances the parser made
    valid, network instances included) and ``values`` (``{'instance.field': raw value}`` of the
    decoder's fields whose instances are valid)."""

    status: str
    type_key: int | None
    length: int
    expected: int | None = None
    valid: frozenset = frozenset()
    values: dict[str, int] = field(default_factory=dict)

    @property
    def classified(self) -> bool:
        return self.status in (DECODED, UNKNOWN_TYPE)


@dataclass(frozen=True)
class TypeTable:
    """Lengths of the known message types, for framings that carry none (a BinaryFILE whose length
    prefixes are 0): the type key is ``width`` bits at bit ``bit_offset`` of the message, and
    ``lengths`` maps a key to its type's length in bytes."""

    bit_offset: int
    width: int
    lengths: dict[int, int]

    def length_of(self, data: bytes, pos: int) -> int | None:
        """The length of the message at byte ``pos`` of ``data`` by its type, or None (unknown type,
        or too few bytes to read the key)."""
        end = pos + (self.bit_offset + self.width + 7) // 8
        if end > len(data):
            return None
        chunk = int.from_bytes(data[pos:end], "big")
        key = (chunk >> ((end - pos) * 8 - self.bit_offset - self.width)) & ((1 << self.width) - 1)
        return self.lengths.get(key)

    def label(self, key: int | None) -> str:
        """A type key as a label: its character when 8 bits of printable ASCII, else hex; '' for None."""
        if key is None:
            return ""
        if self.width == 8 and 0x20 < key < 0x7F:
            return chr(key)
        return hex(key)


class MessageDecoder:
    """Decode messages and datagrams with ``spec`` (see the module docstring).

    ``fields`` are the ``instance.field`` names to give values of (default: the spec's query
    fields).  Raises :class:`SubcError` (located in the spec) when the spec has no parser, reaches
    no UDP feed port, is not MoldUDP64-framed, or has a construct the decoder cannot follow on the
    message path.
    """

    def __init__(self, spec: Spec, fields: list[str] | None = None):
        self.spec = spec
        self.graph = ParseGraph(spec)
        feed = self.graph.feed()
        if feed is None:
            raise SubcError(
                "the spec's parser reaches no UDP destination port select after Ethernet and IPv4, "
                "so it describes no message feed",
                spec_start(spec),
            )
        if not feed.moldudp64:
            raise SubcError(
                f"state '{feed.entry}' does not parse a MoldUDP64 header and message block length "
                "(fields ending at bits 80, 144, 160 and 176 of the UDP payload)",
                self.graph.state(feed.entry).location or spec_start(spec),
            )
        self.feed: Feed = feed
        self.fields = list(spec.query_fields) if fields is None else list(fields)
        self.graph.reachable(feed.entry)  # every state on the message path must be followable
        self.network_instances = (feed.eth, feed.ipv4, feed.udp)
        self.payload = frozenset(spec.payload_instances)
        self._net_zero = {f: 0 for f in self.fields if f.split(".", 1)[0] in self.network_instances}
        self.types = self._type_table()

    # -- messages ------------------------------------------------------------------------------
    def decode(
        self,
        msg: bytes,
        session: bytes = b" " * 10,
        seq: int = 0,
        count: int = 1,
        network: tuple[frozenset, dict[str, int]] | None = None,
    ) -> Decoded:
        """Decode ``msg`` (the message bytes, without its block length) as the one message of a
        datagram with MoldUDP64 ``session`` (10 bytes), sequence number ``seq`` and ``count``;
        ``network`` is (valid network instances, their field values) from :meth:`network`, or None
        for a message without a datagram."""
        prefix = (
            session[:10].ljust(10, b" ")
            + (seq & (2**64 - 1)).to_bytes(8, "big")
            + (count & 0xFFFF).to_bytes(2, "big")
            + (len(msg) & 0xFFFF).to_bytes(2, "big")
        )
        data = prefix + bytes(msg)
        start_bit = MOLD_PREFIX_BYTES * 8
        w = self.graph.walk(data, self.feed.entry)
        key = next((k for _, off, k in w.keys if off >= start_bit), None)
        known = not any(b >= start_bit for b in w.default_at)
        if w.status == "short":
            expected = self.types.lengths.get(key) if key is not None else None
            return Decoded(LENGTH_MISMATCH if known and key is not None else REJECTED, key, len(msg), expected)
        if w.status != "accept":
            return Decoded(REJECTED, key, len(msg))
        parsed = (w.end + 7) // 8 - MOLD_PREFIX_BYTES
        end = (MOLD_PREFIX_BYTES + len(msg)) * 8
        if known and w.end != end and not (w.end < end and self.payload.intersection(w.valid)):
            return Decoded(LENGTH_MISMATCH, key, len(msg), parsed)
        values = self.graph.values(data, w, self.fields)
        valid = set(w.valid)
        if network is None:
            valid.update(self.network_instances)
            values.update(self._net_zero)
        else:
            valid.update(network[0])
            values.update(network[1])
        return Decoded(
            DECODED if known else UNKNOWN_TYPE, key, len(msg), parsed if known else None, frozenset(valid), values
        )

    def network(self, frame: bytes) -> tuple[frozenset, dict[str, int]]:
        """(valid network instances, their fields' values) of an Ethernet ``frame`` (untagged, IPv4
        without options), by the spec's parser from ``start`` up to the UDP payload."""
        w = self.graph.walk(frame, "start", limit=min(len(frame) * 8, (14 + 20 + 8) * 8))
        valid = frozenset(i for i in w.valid if i in self.network_instances)
        vals = {f: v for f, v in self.graph.values(frame, w, self.fields).items() if f.split(".", 1)[0] in valid}
        return valid, vals

    # -- type lengths --------------------------------------------------------------------------
    def _type_table(self) -> TypeTable:
        """The known types' lengths by the key of the first select after the message start (for
        each constant case, the parser is run over a message of that key and zeros)."""
        start = MOLD_PREFIX_BYTES * 8
        probe = self.graph.walk(bytes(MOLD_PREFIX_BYTES + 4096), self.feed.entry)
        sel = next(((st, off) for st, off, _ in probe.keys if off >= start), None)
        if sel is None:
            n = probe.end // 8 - MOLD_PREFIX_BYTES if probe.status == "accept" else None
            if self.payload.intersection(probe.valid):
                n = None  # messages with a payload have no one length
            return TypeTable(0, 0, {0: n} if n else {})
        st = self.graph.state(sel[0])
        width = st.key_width
        lengths: dict[int, int] = {}
        for ks, _ in st.cases:
            if ks.default or ks.mask != (1 << width) - 1:
                continue
            data = bytearray(MOLD_PREFIX_BYTES + 4096)
            put_bits(data, sel[1], width, ks.value)
            w = self.graph.walk(bytes(data), self.feed.entry)
            if (
                w.status == "accept"
                and not any(b >= start for b in w.default_at)
                and not self.payload.intersection(w.valid)
            ):  # a type with a payload has no one length
                lengths.setdefault(ks.value, w.end // 8 - MOLD_PREFIX_BYTES)
        return TypeTable(sel[1] - start, width, lengths)
