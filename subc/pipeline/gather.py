"""The spec's parser over many messages at once: NumPy gathers derived from the spec alone.

:class:`VectorDecoder` runs the same parse graph as :class:`~subc.runtime.decoder.MessageDecoder`
(:mod:`subc.compiler.parse_graph`) on every message of a :class:`~.splits.MessageBuffer` together:
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
in ``subc simulate``; rules that test them need ``subc simulate`` for captures.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..compiler.parse_graph import MOLD_PREFIX_BYTES, FieldSlot
from ..errors import SubcError
from ..runtime.decoder import DECODED, LENGTH_MISMATCH, REJECTED, UNKNOWN_TYPE, MessageDecoder

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
    padded by 8 bytes past the last field), as uint64."""
    byte = bit // 8
    r = (bit % 8).astype(np.int64)
    acc = np.zeros(len(bit), dtype=np.uint64)
    for k in range(8):
        acc = (acc << np.uint64(8)) | data[byte + k].astype(np.uint64)
    mask = np.uint64((1 << width) - 1) if width < 64 else np.uint64(2**64 - 1)
    fits = r + width <= 64
    out = np.zeros(len(bit), dtype=np.uint64)
    if fits.any():  # the field lies in the 8 bytes read
        shift = (64 - r[fits] - width).astype(np.uint64)
        out[fits] = (acc[fits] >> shift) & mask
    far = ~fits
    if far.any():  # it ends in the ninth byte: 64 - r bits from the 8, extra = r + width - 64 from the ninth
        rf = r[far].astype(np.uint64)
        extra = (r[far] + width - 64).astype(np.uint64)  # 1 to 7
        head = (acc[far] << rf) >> rf
        nine = data[byte[far] + 8].astype(np.uint64)
        out[far] = ((head << extra) | (nine >> (np.uint64(8) - extra))) & mask
    return out


class VectorDecoder:
    """The vectorised form of ``decoder`` (see the module docstring).  ``fields``: the
    ``instance.field`` names to give values of (default: the decoder's)."""

    def __init__(self, decoder: MessageDecoder, fields: list[str] | None = None):
        self.decoder = decoder
        g = decoder.graph
        self.graph = g
        self.feed = decoder.feed
        self.order = g.reachable(self.feed.entry)
        self.ids = {name: i for i, name in enumerate(self.order)}
        self.fields = list(decoder.fields if fields is None else fields)
        self.network = set(decoder.network_instances)
        for f in self.fields:
            slot = g.fields[f]
            if slot.instance not in self.network and slot.width > 64:
                raise SubcError(f"field '{f}' is {slot.width} bits wide; the vectorised decoder reads fields of up "
                                "to 64 bits", decoder.spec.query_fields[f].location if f in decoder.spec.query_fields
                                else None)
        for name in self.order:
            st = g.state(name)
            if st.key is not None:
                if st.key_width > 64:
                    raise SubcError(f"state '{name}': a select key of {st.key_width} bits (the vectorised decoder "
                                    "reads up to 64)", st.location)
                for f in st.key:
                    if f.instance in self.feed.framing:
                        raise SubcError(f"state '{name}' selects on the MoldUDP64 field '{f.ref}', which the "
                                        "vectorised decoder does not read", st.location)

    def decode(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> VectorDecoded:
        """Decode the messages at ``starts`` (int64 byte offsets into ``data``, uint8, padded by at
        least 9 bytes) of ``lengths`` bytes (see the module docstring)."""
        g = self.graph
        n = len(starts)
        base = starts.astype(np.int64) * 8 - MSG_BIT  # absolute bit of payload bit 0
        limit = (lengths.astype(np.int64) + MOLD_PREFIX_BYTES) * 8
        state = np.zeros(n, dtype=np.int64)  # index into self.order; terminal codes below 0
        cursor = np.zeros(n, dtype=np.int64)
        default = np.zeros(n, dtype=bool)
        type_key = np.full(n, -1, dtype=np.int64)
        inst_at: dict[str, np.ndarray] = {}
        valid: dict[str, np.ndarray] = {}
        for sid, name in enumerate(self.order):
            idx = np.flatnonzero(state == sid)
            if not len(idx):
                continue
            st = g.state(name)
            cur = cursor[idx]
            alive = np.ones(len(idx), dtype=bool)
            for inst in st.extracts:
                size = g.header_bits[inst]
                if size is None:
                    raise SubcError(f"state '{name}': header '{inst}' has a variable size", st.location)
                fits = cur + size <= limit[idx]
                short = alive & ~fits
                state[idx[short]] = _SHORT
                alive &= fits
                if inst not in inst_at:
                    inst_at[inst] = np.full(n, -1, dtype=np.int64)
                    valid[inst] = np.zeros(n, dtype=bool)
                inst_at[inst][idx[alive]] = cur[alive]
                valid[inst][idx[alive]] = True
                cur = cur + size
            cursor[idx] = cur
            live = idx[alive]
            if not len(live):
                continue
            if st.key is None:
                target = st.cases[0][1]
                state[live] = self._next(target)
                continue
            key = np.zeros(len(live), dtype=np.uint64)
            for f in st.key:
                v = self._gather(data, base[live] + inst_at[f.instance][live], f)
                key = (key << np.uint64(f.width)) | v if f.width < 64 else v
            first = type_key[live] < 0
            at_msg = inst_at[st.key[0].instance][live] + st.key[0].bit_offset >= MSG_BIT
            type_key[live[first & at_msg]] = key[first & at_msg].astype(np.int64)
            undecided = np.ones(len(live), dtype=bool)
            nxt = np.full(len(live), _REJECT, dtype=np.int64)
            for ks, target in st.cases:
                if ks.default:
                    m = undecided
                    default[live[m & (cursor[live] > MSG_BIT - 1)]] = True
                elif ks.mask is None:
                    m = undecided & (key >= np.uint64(ks.lo)) & (key <= np.uint64(ks.hi))
                else:
                    m = undecided & ((key & np.uint64(ks.mask)) == np.uint64(ks.value & ks.mask))
                nxt[m] = self._next(target)
                undecided &= ~m
            state[live] = nxt
        # statuses, as MessageDecoder.decode gives them
        parsed = cursor - MSG_BIT  # bits
        lengths = lengths.astype(np.int64) * 8
        status = np.full(n, REJECT, dtype=np.int8)
        acc = state == _ACCEPT
        known = ~default
        status[acc & known & (parsed == lengths)] = OK
        status[acc & known & (parsed != lengths)] = MISMATCH
        status[acc & ~known] = UNKNOWN
        status[(state == _SHORT) & known & (type_key >= 0)] = MISMATCH
        ok = status <= UNKNOWN
        values = {}
        for f in self.fields:
            slot = g.fields[f]
            if slot.instance in self.network:
                values[f] = np.zeros(n, dtype=np.uint64)
                continue
            out = np.zeros(n, dtype=np.uint64)
            v = valid.get(slot.instance)
            if v is not None:
                sel = np.flatnonzero(v & ok)
                out[sel] = self._gather(data, base[sel] + inst_at[slot.instance][sel], slot)
            values[f] = out
        valid_ok = {i: v & ok for i, v in valid.items()}
        for i in self.network:
            valid_ok[i] = ok.copy()
        return VectorDecoded(status, type_key, valid_ok, values)

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
