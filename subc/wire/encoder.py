"""Messages built from field values with the spec: the inverse of :mod:`.decoder`.

:class:`MessageEncoder` finds a path of the spec's parser from the message start (the feed's entry
state, past the MoldUDP64 header and block length) to ``accept`` on which every header that the
given fields belong to is extracted, writes each select key on that path with a value of the case
the path takes and each given field at its offset, and checks the result by decoding it with
:class:`~.decoder.MessageDecoder`.  ``subc check`` uses it to show a conflict's example packet as
the message bytes a publisher would send.
"""

from __future__ import annotations

from ..spec.parse_graph import ACCEPT, MOLD_PREFIX_BYTES, REJECT, Keyset, put_bits
from .decoder import MessageDecoder

#: Parser paths examined at most (a spec with many message types has one path per type).
MAX_PATHS = 4096


class MessageEncoder:
    """Build messages for ``decoder``'s spec (see the module docstring)."""

    def __init__(self, decoder: MessageDecoder):
        self.decoder = decoder
        self.graph = decoder.graph
        self._check = MessageDecoder(decoder.spec, list(decoder.graph.fields))  # reads back every field
        self._paths = list(self._enumerate())

    def _enumerate(self):
        """(instances -> bit offset, [(state, keyset)], end bit) of the paths from the entry to accept."""
        g = self.graph
        stack: list[tuple[str, int, dict[str, int], list[tuple[str, int]]]] = [(self.decoder.feed.entry, 0, {}, [])]
        n = 0
        while stack and n < MAX_PATHS:
            name, bit, insts, picks = stack.pop()
            if name == ACCEPT:
                n += 1
                yield insts, picks, bit
                continue
            if name == REJECT:
                continue
            st = g.state(name)
            insts = dict(insts)
            for inst in st.extracts:
                insts[inst] = bit
                bit += g.header_bits[inst] or 0
            cases = list(st.cases)
            for i in range(len(cases) - 1, -1, -1):
                ks, target = cases[i]
                stack.append((target, bit, insts, picks + ([(name, i)] if st.key is not None else [])))

    def encode(self, values: dict[str, int]) -> bytes | None:
        """The bytes of a message (without its block length) whose decoding gives ``values`` (fields of
        message headers; network header fields are ignored), or None when no parser path carries
        them all or the values contradict every path's selects."""
        g = self.graph
        skip = set(self.decoder.network_instances)
        wanted = {f: v for f, v in values.items() if g.fields[f].instance not in skip}
        need = {g.fields[f].instance for f in wanted}
        for insts, picks, end in self._paths:
            if not need <= set(insts):
                continue
            data = bytearray(end // 8 + 1)
            for name, i in picks:
                st = g.state(name)
                value = self._key_value(st, i)
                if value is None:
                    break
                shift = st.key_width
                assert st.key is not None  # only states with a key are picks (_enumerate)
                for key in st.key:
                    shift -= key.width
                    put_bits(
                        data, insts[key.instance] + key.bit_offset, key.width, (value >> shift) & ((1 << key.width) - 1)
                    )
            else:
                for f, v in wanted.items():
                    slot = g.fields[f]
                    put_bits(data, insts[slot.instance] + slot.bit_offset, slot.width, v)
                msg = bytes(data[MOLD_PREFIX_BYTES : (end + 7) // 8])
                d = self._check.decode(msg)
                if d.classified and all(d.values.get(f) == v for f, v in wanted.items()):
                    return msg
        return None

    def _key_value(self, st, i: int) -> int | None:
        """A key value that takes case ``i`` of state ``st`` (the first match wins), or None."""
        ks: Keyset = st.cases[i][0]
        earlier = [k for k, _ in st.cases[:i]]
        width = st.key_width
        if not ks.default:
            candidates = [ks.lo] if ks.mask is None else [ks.value & ks.mask]
        else:
            candidates = list(range(min(1 << width, 1 << 12)))
        for v in candidates:
            if not any(k.matches(v) for k in earlier):
                return v
        return None
