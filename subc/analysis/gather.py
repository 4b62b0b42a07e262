"""The spec's parser over many messages at once: NumPy gathers derived from the spec alone.

:class:`VectorDecoder` runs the same parse graph as :class:`~subc.wire.decoder.MessageDecoder`
(:mod:`subc.spec.parse_graph`) on every message of a :class:`~.splits.MessageBuffer` together:
the states reachable from the feed's entry state are visited once each, in topological order;
per message it keeps the state it is in and the parser's cursor (bits from the start of the UDP
payload: the MoldUDP64 header and block length occupy bits 0 to 175 and are not in the buffer, the
message starts at bit 176), records where each header instance starts, gathers select keys and
field values at those offsets (any bit alignment, up to 64 bits), and gives every message the
status the scalar decoder gives it (``ok``, ``unknown_type``, ``length_mismatch``, ``rejected``).
The two decoders are tested against each other and against independently built messages.

Limits, each a :class:`~subc.errors.SubcError` naming the field or state: fields and select keys
of more than 64 bits; a select on a MoldUDP64 header field (the buffer holds the messages only).
Network header fields (Ethernet, IPv4, UDP) are valid with the value 0, as for a BinaryFILE message
in ``subc simulate``; rules that test them need ``subc simulate`` for captures.  MoldUDP64 header
fields read as 0 (the buffer holds the messages only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..spec.parse_graph import MOLD_PREFIX_BYTES, FieldSlot
from ..errors import SubcError
from ..wire.decoder import DECODED, LENGTH_MISMATCH, REJECTED, UNKNOWN_TYPE, MessageDecoder

#: Status codes of :attr:`VectorDecoded.status` (index -> the scalar decoder's status).
STATUSES = (DECODED, UNKNOWN_TYPE, LENGTH_MISMATCH, REJECTED)
OK, UNKNOWN, MISMATCH, REJECT = range(4)
#: Decision codes of messages not decoded, in the analyze job's aggregates.
LENGTH_MISMATCH_CODE, REJECTED_CODE = -2, -3
_ACCEPT, _REJECT, _SHORT = -1, -2, -3
MSG_BIT = MOLD_PREFIX_BYTES * 8


@dataclass
class VectorDecoded:
    """Per message: ``status`` (int8 index into :data:`STATUSES`), ``type_key`` (int64 key of the
    first select in the message, -1 when none), ``valid`` (instance -> bool array) and ``values``
    (field -> uint64 array, 0 where the field's instance is not valid)."""

    status: np.ndarray
    type_key: np.ndarray
    valid: dict[str, np.ndarray]
    values: dict[str, np.ndarray]

    def classified(self) -> np.ndarray:
        return self.status <= UNKNOWN


def gather_bits(data: np.ndarray, bit: np.ndarray, width: int) -> np.ndarray:
    """The unsigned big-endian ``width``-bit integers (1 to 64) at absolute bit offsets ``bit``
    (int64 array) of ``data`` (uint8; 9 bytes are read from each offset's byte, so ``data`` must be
    padded by 8 bytes past the last field), as uint64.

    One gather of 8 bytes per offset (:func:`byte_words`), shifted and masked; a field that
    ends in the ninth byte (``width`` above 57 at a bit offset that is not byte-aligned) takes its
    last bits from that byte."""
    byte = bit >> 3
    r = (bit & 7).astype(np.uint64)
    words = byte_words(data)[byte].astype(np.uint64)
    mask = np.uint64((1 << width) - 1)
    if width <= 57:  # r + width <= 64: the field lies in the 8 bytes read
        return (words >> (np.uint64(64 - width) - r)) & mask
    fits = r + np.uint64(width) <= np.uint64(64)
    out = np.zeros(len(bit), dtype=np.uint64)
    if fits.any():
        out[fits] = (words[fits] >> (np.uint64(64 - width) - r[fits])) & mask
    far = ~fits
    if far.any():  # it ends in the ninth byte: 64 - r bits from the 8, extra = r + width - 64 from the ninth
        rf = r[far]
        extra = rf - np.uint64(64 - width)  # 1 to 7
        head = (words[far] << rf) >> rf
        nine = data[byte[far] + 8].astype(np.uint64)
        out[far] = ((head << extra) | (nine >> (np.uint64(8) - extra))) & mask
    return out


def byte_words(data: np.ndarray) -> np.ndarray:
    """``data`` (uint8, at least 8 bytes) as overlapping big-endian 64-bit words, one per byte
    offset: word ``i`` holds bytes ``i`` to ``i + 7`` (a view, no copy when ``data`` is contiguous)."""
    data = np.ascontiguousarray(data, dtype=np.uint8)
    return np.ndarray((max(len(data) - 7, 0),), dtype=">u8", buffer=data, strides=(1,))


@dataclass
class _Walk:
    """The per-message arrays of one :meth:`VectorDecoder.decode` (n messages): ``data`` and
    ``base`` (absolute bit of each message's payload bit 0), ``limit`` (bits of payload it has),
    ``state`` (index into the decoder's order; terminal codes below 0), ``cursor`` (bits from
    the payload's start), ``default`` (took a ``default`` case in the message), ``type_key``,
    and per instance ``inst_at`` (where select-key instances start), ``valid``, and per output
    name ``values``."""

    data: np.ndarray
    base: np.ndarray
    limit: np.ndarray
    state: np.ndarray
    cursor: np.ndarray
    default: np.ndarray
    type_key: np.ndarray
    inst_at: dict[str, np.ndarray] = field(default_factory=dict)
    valid: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, np.ndarray] = field(default_factory=dict)


class VectorDecoder:
    """The vectorised form of ``decoder`` (see the module docstring).  ``fields``: the
    ``instance.field`` names to give values of (default: the decoder's); ``merged``: name -> fields
    whose values share one array (each message gets the value of the one its headers carry, 0 when
    none: for example every message type's ``timestamp``)."""

    def __init__(
        self, decoder: MessageDecoder, fields: list[str] | None = None, merged: dict[str, list[str]] | None = None
    ):
        self.decoder = decoder
        g = decoder.graph
        self.graph = g
        self.feed = decoder.feed
        self.order = g.reachable(self.feed.entry)
        self.ids = {name: i for i, name in enumerate(self.order)}
        self.fields = list(decoder.fields if fields is None else fields)
        self.merged = {k: list(v) for k, v in (merged or {}).items()}
        self.network = set(decoder.network_instances)
        for f in self.fields + [x for v in self.merged.values() for x in v]:
            slot = g.fields[f]
            if slot.instance not in self.network and slot.width > 64:
                raise SubcError(
                    f"field '{f}' is {slot.width} bits wide; the vectorised decoder reads fields of up to 64 bits",
                    decoder.spec.query_fields[f].location if f in decoder.spec.query_fields else None,
                )
        #: per instance, the (output name, field) pairs gathered when it is extracted
        self.reads: dict[str, list[tuple[str, FieldSlot]]] = {}
        outside = self.network | set(self.feed.framing)  # not in the buffer: their fields read as 0
        for f in self.fields:
            slot = g.fields[f]
            if slot.instance not in outside:
                self.reads.setdefault(slot.instance, []).append((f, slot))
        for name, fs in self.merged.items():
            for f in fs:
                if g.fields[f].instance not in outside:
                    self.reads.setdefault(g.fields[f].instance, []).append((name, g.fields[f]))
        self.key_instances = set()
        self.fast: dict[str, tuple | None] = {}
        for name in self.order:
            st = g.state(name)
            if st.key is None:
                continue
            if st.key_width > 64:
                raise SubcError(
                    f"state '{name}': a select key of {st.key_width} bits (the vectorised decoder reads up to 64)",
                    st.location,
                )
            for slot in st.key:
                if slot.instance in self.feed.framing:
                    raise SubcError(
                        f"state '{name}' selects on the MoldUDP64 field '{slot.ref}', which the "
                        "vectorised decoder does not read",
                        st.location,
                    )
                self.key_instances.add(slot.instance)
            self.fast[name] = self._exact_cases(st)

    def _exact_cases(self, st) -> tuple | None:
        """(sorted values, their target ids, default target id or None) when every case before the
        first ``default`` is an exact value (the common select on a type field), else None."""
        full = (1 << st.key_width) - 1
        values, targets, default = [], [], None
        for ks, target in st.cases:
            if ks.default:
                default = self._next(target)
                break
            if ks.mask != full:
                return None
            if ks.value not in values:  # the first case of a value wins
                values.append(ks.value)
                targets.append(self._next(target))
        order = np.argsort(np.array(values, dtype=np.uint64), kind="stable")
        return (np.array(values, dtype=np.uint64)[order], np.array(targets, dtype=np.int64)[order], default)

    def decode(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> VectorDecoded:
        """Decode the messages at ``starts`` (int64 byte offsets into ``data``, uint8, padded by at
        least 9 bytes) of ``lengths`` bytes (see the module docstring)."""
        g = self.graph
        n = len(starts)
        w = _Walk(
            data=data,
            base=starts.astype(np.int64) * 8 - MSG_BIT,  # absolute bit of payload bit 0
            limit=(lengths.astype(np.int64) + MOLD_PREFIX_BYTES) * 8,
            state=np.zeros(n, dtype=np.int64),  # index into self.order; terminal codes below 0
            cursor=np.zeros(n, dtype=np.int64),
            default=np.zeros(n, dtype=bool),
            type_key=np.full(n, -1, dtype=np.int64),
        )
        # the messages waiting in each state (the entry state: all); a state's messages are handed to the
        # states its transitions lead to, so each message is touched once per state on its path
        pending: dict[int, list[np.ndarray]] = {0: [np.arange(n, dtype=np.int64)]}
        for sid, name in enumerate(self.order):
            parts = pending.pop(sid, [])
            idx = np.concatenate(parts) if len(parts) > 1 else (parts[0] if parts else np.zeros(0, np.int64))
            if not len(idx):
                continue
            st = g.state(name)
            live = self._extract(w, name, st, idx)
            if not len(live):
                continue
            if st.key is None:
                next_id = self._next(st.cases[0][1])
                w.state[live] = next_id
                if next_id >= 0:
                    pending.setdefault(next_id, []).append(live)
                continue
            nxt = self._select(w, name, st, live)
            w.state[live] = nxt
            for next_id in np.unique(nxt):
                if next_id >= 0:
                    pending.setdefault(int(next_id), []).append(live[nxt == next_id])
        return self._decoded(w, lengths)

    def _extract(self, w: _Walk, name: str, st, idx: np.ndarray) -> np.ndarray:
        """State ``name`` (``st``) extracts its headers for messages ``idx``: marks them valid,
        records where select-key instances start, gathers the fields read, and advances the
        cursors; a message too short for a header ends in ``_SHORT``.  Returns the messages that
        are still alive."""
        g = self.graph
        n = len(w.state)
        cur = w.cursor[idx]
        alive = np.ones(len(idx), dtype=bool)
        for inst in st.extracts:
            size = g.header_bits[inst]
            if size is None:
                raise SubcError(f"state '{name}': header '{inst}' has a variable size", st.location)
            fits = cur + size <= w.limit[idx]
            w.state[idx[alive & ~fits]] = _SHORT
            alive &= fits
            here = idx[alive]
            if inst not in w.valid:
                w.valid[inst] = np.zeros(n, dtype=bool)
            w.valid[inst][here] = True
            if inst in self.key_instances:
                w.inst_at.setdefault(inst, np.full(n, -1, dtype=np.int64))[here] = cur[alive]
            for out_name, slot in self.reads.get(inst, ()):
                if out_name not in w.values:
                    w.values[out_name] = np.zeros(n, dtype=np.uint64)
                w.values[out_name][here] = self._gather(w.data, w.base[here] + cur[alive], slot)
            cur = cur + size
        w.cursor[idx] = cur
        return idx[alive]

    def _select(self, w: _Walk, name: str, st, live: np.ndarray) -> np.ndarray:
        """The next state ids of messages ``live`` at the select of state ``name`` (``st``): their
        key gathered (the first key in the message is recorded as its type key), matched against
        the cases in order; messages in the message that take the ``default`` case are marked."""
        key = np.zeros(len(live), dtype=np.uint64)
        for f in st.key:
            v = self._gather(w.data, w.base[live] + w.inst_at[f.instance][live], f)
            key = (key << np.uint64(f.width)) | v if f.width < 64 else v
        first = w.type_key[live] < 0
        at_msg = w.inst_at[st.key[0].instance][live] + st.key[0].bit_offset >= MSG_BIT
        w.type_key[live[first & at_msg]] = key[first & at_msg].astype(np.int64)
        in_msg = w.cursor[live] >= MSG_BIT
        fast = self.fast[name]
        if fast is not None:
            vals, targets, dflt = fast
            pos = np.minimum(np.searchsorted(vals, key), max(len(vals) - 1, 0))
            hit = (vals[pos] == key) if len(vals) else np.zeros(len(key), dtype=bool)
            nxt = np.where(hit, targets[pos] if len(vals) else _REJECT, _REJECT if dflt is None else dflt)
            if dflt is not None:
                w.default[live[~hit & in_msg]] = True
            return nxt
        undecided = np.ones(len(live), dtype=bool)
        nxt = np.full(len(live), _REJECT, dtype=np.int64)
        for ks, target in st.cases:
            if ks.default:
                m = undecided
                w.default[live[m & in_msg]] = True
            elif ks.mask is None:
                m = undecided & (key >= np.uint64(ks.lo)) & (key <= np.uint64(ks.hi))
            else:
                m = undecided & ((key & np.uint64(ks.mask)) == np.uint64(ks.value & ks.mask))
            nxt[m] = self._next(target)
            undecided &= ~m
        return nxt

    def _decoded(self, w: _Walk, lengths: np.ndarray) -> VectorDecoded:
        """The walk's result with statuses, as :meth:`MessageDecoder.decode` gives them: values
        and validity cleared for messages not classified; network instances valid for the rest."""
        n = len(w.state)
        state, valid, values = w.state, w.valid, w.values
        parsed = w.cursor - MSG_BIT  # bits
        lengths = lengths.astype(np.int64) * 8
        status = np.full(n, REJECT, dtype=np.int8)
        acc = state == _ACCEPT
        known = ~w.default
        fits = parsed == lengths
        for inst in self.graph.spec.payload_instances & set(valid):  # a payload follows its headers
            fits |= valid[inst] & (parsed < lengths)
        status[acc & known & fits] = OK
        status[acc & known & ~fits] = MISMATCH
        status[acc & ~known] = UNKNOWN
        status[(state == _SHORT) & known & (w.type_key >= 0)] = MISMATCH
        ok = status <= UNKNOWN
        bad = ~ok
        for name in list(self.fields) + list(self.merged):
            out = values.get(name)
            if out is None:
                values[name] = np.zeros(n, dtype=np.uint64)
            elif bad.any():
                out[bad] = 0
        valid_ok = {i: v & ok for i, v in valid.items()}
        for i in self.network:
            valid_ok[i] = ok.copy()
        return VectorDecoded(status, w.type_key, valid_ok, values)

    def _next(self, target: str) -> int:
        if target == "accept":
            return _ACCEPT
        if target == "reject":
            return _REJECT
        return self.ids[target]

    def _gather(self, data: np.ndarray, header_bit: np.ndarray, f: FieldSlot) -> np.ndarray:
        if not len(header_bit):
            return np.zeros(0, dtype=np.uint64)
        return gather_bits(data, header_bit + f.bit_offset, f.width)
