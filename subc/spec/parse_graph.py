"""The spec's parser as a graph: the one source of every field's place and of message framing.

Every reader of packets and messages (``simulate``, ``analyze``, ``listen``, ``replay``'s checks,
``check``'s example packets, the references and the eBPF parser plan) decodes with this graph,
derived from the spec alone (P4_16 Language Specification v1.2.4, section 12: parsers):

* **Headers.** Every header instance's fields lie at bit offsets from the start of the instance, in
  declaration order (:attr:`ParseGraph.fields`); a parsed header starts where the parser's cursor
  was when it was extracted.
* **States.** Each state extracts its instances in order, then selects on the concatenation of
  header fields, with keysets ``value``, ``value &&& mask``, ``lo .. hi``, tuples of these, ``_``
  and ``default``, in order (the first match wins; no match is a parser error: ``reject``); the
  keysets, field slots and resolved states are :mod:`.parse_states`'.
* **The feed.** The network prefix is found by structure, not by name: a 112-bit header selected
  on its bits 96..111 (EtherType) with the case 0x0800 leads to a 160-bit header (IPv4) selected on
  bits 72..79 (protocol) with the case 17, leading to a 64-bit header (UDP) selected on bits 16..31
  (destination port): its constant cases are the *feed ports* and their targets the *entry states*,
  where the UDP payload starts.  Transition-only states (``state start { transition x; }``) and
  other branches (ARP, VLAN) are followed or left alone.
* **MoldUDP64 framing** (MoldUDP64 Protocol Specification v1.00) is recognised when the entry state
  extracts the payload's first 176 bits before any select, with field boundaries at bits 80, 144,
  160 and 176 (session, sequence number, message count, message block length): a message then
  starts at payload byte 22, and a message of a BinaryFILE or of a datagram of several messages is
  decoded as the one message of a datagram whose header and block length are given.
* **Message types.** A message's path through the states from its start decides its type: a path
  that ends in ``accept`` without taking a ``default`` case in the message has a *known type*, whose
  length is the bits the path extracted (:meth:`ParseGraph.walk`); a path through ``default`` is a
  type the spec does not parse.

What the graph cannot follow (a select on an expression or a lookahead, a parser loop, a header
of variable size on the message path) is a :class:`~subc.errors.SubcError` at the state's line and
column, raised where a decoder needs it, never a silently missing field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from ..errors import Location, SubcError
from .model import Spec
from .parse_states import FieldSlot, GraphState, Keyset, KeysetError, parse_keyset

ETH_BITS, IPV4_BITS, UDP_BITS = 112, 160, 64
ETHERTYPE_IPV4, IPPROTO_UDP = 0x0800, 17
#: MoldUDP64: header (session 80, sequence number 64, message count 16) then a 16-bit block length.
MOLD_BOUNDARIES = (80, 144, 160, 176)
MOLD_PREFIX_BYTES = 22
ACCEPT, REJECT = "accept", "reject"


@dataclass
class Walk:
    """The result of :meth:`ParseGraph.walk`: ``valid`` instances -> bit offset where each starts,
    ``end`` (bits consumed), ``status`` ('accept', 'reject' or 'short': the data ended inside a
    header), ``states`` visited, ``default_at`` (bit offsets of selects that took ``default``) and
    ``keys`` ((state, bit offset of the key, key value) of every select taken)."""

    valid: dict[str, int] = field(default_factory=dict)
    end: int = 0
    status: str = ACCEPT
    states: list[str] = field(default_factory=list)
    default_at: list[int] = field(default_factory=list)
    keys: list[tuple[str, int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class Feed:
    """Where a spec's messages arrive: UDP ``ports`` -> entry state (the state where the UDP
    payload starts), the network instances (``eth``, ``ipv4``, ``udp``), and whether the payload is
    MoldUDP64-framed (``moldudp64``); ``framing`` the instances of the MoldUDP64 header and block
    length (all extracted before the first message byte)."""

    ports: tuple[tuple[int, str], ...]
    eth: str
    ipv4: str
    udp: str
    moldudp64: bool
    framing: tuple[str, ...]

    @property
    def entry(self) -> str:
        """The entry state of the first feed port (BinaryFILE messages are decoded from it)."""
        return self.ports[0][1]


def spec_start(spec: Spec) -> Location:
    """The location of the spec's first line (for errors about the spec as a whole)."""
    return Location.from_line_col(spec.path, spec.text, 1, 1)


def _error(where: Location | None, spec: Spec, msg: str) -> SubcError:
    return SubcError(msg, where or spec_start(spec))


class ParseGraph:
    """The parser of ``spec`` as a graph (see the module docstring).

    ``fields`` maps ``instance.field`` to its :class:`FieldSlot`; ``header_bits`` gives each
    instance's size in bits (None: variable size); ``states`` the :class:`GraphState` by name.
    Raises SubcError (located) when the spec has no parser (a pragma-only spec) or a state names a
    state that does not exist.
    """

    def __init__(self, spec: Spec):
        if spec.parser is None or not spec.whole_program:
            raise _error(
                None,
                spec,
                "the spec declares no headers and parser (a pragma-only spec): messages cannot be decoded with it",
            )
        self.spec = spec
        self.fields: dict[str, FieldSlot] = {}
        self.header_bits: dict[str, int | None] = {}
        for inst, tname in spec.instances.items():
            off: int | None = 0
            for fname, w in spec.headers[tname].fields:
                if w is None or off is None:
                    off = None
                    continue
                self.fields[f"{inst}.{fname}"] = FieldSlot(inst, fname, off, w)
                off += w
            self.header_bits[inst] = off
        self._raw = {s.name: s for s in spec.parser.states}
        self.states: dict[str, GraphState] = {}
        self._feed: Feed | None | Literal[False] = False

    # -- states ----------------------------------------------------------------------------
    def state(self, name: str, where: Location | None = None) -> GraphState:
        """The state ``name`` with its select key and keysets resolved (cached).  Raises SubcError
        for an unknown state, a select on something other than header fields, a keyset that is not
        constant, or a key wider than 128 bits."""
        if name in self.states:
            return self.states[name]
        st = self._raw.get(name)
        if st is None:
            raise _error(where, self.spec, f"the parser has no state '{name}'")
        for stmt in st.statements:
            if not re.fullmatch(r"\s*\w+\s*\.\s*extract\s*\(.*\)\s*;\s*", stmt, re.S):
                raise _error(
                    st.location,
                    self.spec,
                    f"state '{name}': statement '{stmt.strip()}' cannot be "
                    "decoded (only extract statements are followed)",
                )
        for inst in st.extracts:
            if inst not in self.header_bits:
                raise _error(
                    st.location,
                    self.spec,
                    f"state '{name}' extracts '{inst}', which is not a header instance of the headers struct",
                )
        n_extract = sum(".extract" in s.replace(" ", "") for s in st.statements)
        if n_extract != len(st.extracts):
            raise _error(
                st.location,
                self.spec,
                f"state '{name}': an extract this decoder cannot follow (a header stack or a variable-size extract)",
            )
        tr = st.transition
        where = tr.location or st.location
        if tr.select_text is None:
            gs = GraphState(name, tuple(st.extracts), None, ((Keyset(default=True), tr.cases[0][1]),), st.location)
        else:
            if tr.fields is None:
                raise _error(
                    where,
                    self.spec,
                    f"state '{name}': select on '{tr.select_text}' cannot be decoded (header fields only)",
                )
            key = []
            for ref in tr.fields:
                if ref not in self.fields:
                    raise _error(where, self.spec, f"state '{name}': select on unknown field '{ref}'")
                key.append(self.fields[ref])
            widths = [f.width for f in key]
            if sum(widths) > 128:
                raise _error(where, self.spec, f"state '{name}': select key of {sum(widths)} bits (at most 128)")
            parsed = []
            for k, (ks, t) in enumerate(tr.cases):
                try:
                    parsed.append((parse_keyset(ks, widths, self.spec.constant), t))
                except KeysetError as e:
                    at = tr.case_locations[k] if k < len(tr.case_locations) else where
                    raise _error(at, self.spec, f"state '{name}': {e}") from None
            cases = tuple(parsed)
            gs = GraphState(name, tuple(st.extracts), tuple(key), cases, st.location)
        self.states[name] = gs
        return gs

    def _try_state(self, name: str) -> bool:
        try:
            self.state(name)
            return True
        except SubcError:
            return False

    def successors(self, name: str) -> list[str]:
        return [t for _, t in self.state(name).cases if t not in (ACCEPT, REJECT)]

    def reachable(self, start: str, strict: bool = True) -> list[str]:
        """States reachable from ``start`` in topological order; raises SubcError on a parser loop,
        or (``strict``) on a state the graph cannot follow (else such a state ends its branch)."""
        order: list[str] = []
        color: dict[str, int] = {}

        def succ(n: str) -> list[str]:
            if strict:
                return self.successors(n)
            try:
                return [t for t in self.successors(n) if self._try_state(t)]
            except SubcError:
                return []

        def visit(n: str, where) -> None:
            stack = [(n, iter(succ(n)))]
            color[n] = 1
            while stack:
                cur, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    color[cur] = 2
                    order.append(cur)
                    stack.pop()
                    continue
                if color.get(nxt) == 1:
                    raise _error(
                        self.state(cur).location,
                        self.spec,
                        f"parser loop through state '{nxt}' (header stacks are not supported)",
                    )
                if nxt not in color:
                    self.state(nxt, self.state(cur).location)
                    color[nxt] = 1
                    stack.append((nxt, iter(succ(nxt))))

        self.state(start)
        visit(start, None)
        return order[::-1]

    # -- decoding ----------------------------------------------------------------------------
    def walk(self, data: bytes, start: str, bit: int = 0, limit: int | None = None) -> Walk:
        """Run the parser from state ``start`` at bit ``bit`` of ``data`` (up to ``limit`` bits,
        default all): which instances become valid where, and how the walk ended (:class:`Walk`).
        Raises SubcError (located) for a construct the graph cannot follow."""
        limit = len(data) * 8 if limit is None else limit
        w = Walk()
        name = start
        seen = 0
        while name not in (ACCEPT, REJECT):
            seen += 1
            if seen > len(self._raw) + 1:
                raise _error(self.state(name).location, self.spec, f"parser loop through state '{name}'")
            st = self.state(name)
            w.states.append(name)
            for inst in st.extracts:
                size = self.header_bits[inst]
                if size is None:
                    raise _error(st.location, self.spec, f"state '{name}': header '{inst}' has a variable size")
                if bit + size > limit:
                    w.status, w.end = "short", bit
                    return w
                w.valid[inst] = bit
                bit += size
            if st.key is None:
                name = st.cases[0][1]
                continue
            key = 0
            for f in st.key:
                if f.instance not in w.valid:
                    raise _error(
                        st.location,
                        self.spec,
                        f"state '{name}' selects on '{f.ref}' before '{f.instance}' is extracted",
                    )
                key = (key << f.width) | bits_at(data, w.valid[f.instance] + f.bit_offset, f.width)
            w.keys.append((name, w.valid[st.key[0].instance] + st.key[0].bit_offset, key))
            name = REJECT
            for ks, target in st.cases:
                if ks.matches(key):
                    if ks.default:
                        w.default_at.append(bit)
                    name = target
                    break
        w.status, w.end = name, bit
        return w

    def values(self, data: bytes, walk: Walk, refs) -> dict[str, int]:
        """``{ref: value}`` of the fields ``refs`` whose instances ``walk`` made valid."""
        out = {}
        for ref in refs:
            f = self.fields[ref]
            if f.instance in walk.valid:
                out[ref] = bits_at(data, walk.valid[f.instance] + f.bit_offset, f.width)
        return out

    # -- the feed ------------------------------------------------------------------------------
    def feed(self) -> Feed | None:
        """The :class:`Feed` of the spec, or None when its parser reaches no UDP port select (see the
        module docstring).  Raises SubcError for a construct on that path the graph cannot follow."""
        if self._feed is not False:
            return self._feed
        self._feed = None
        for name in self.reachable("start", strict=False):
            st = self.state(name)
            udp = _selects(st, self, UDP_BITS, 16, 16)
            if udp is None:
                continue
            ipv4 = self._predecessor(name, IPV4_BITS, 72, 8, IPPROTO_UDP)
            eth = self._predecessor(ipv4[0], ETH_BITS, 96, 16, ETHERTYPE_IPV4) if ipv4 else None
            if ipv4 is None or eth is None:
                continue
            ports = tuple(
                (ks.value, t)
                for ks, t in st.cases
                if not ks.default and ks.mask == 0xFFFF and t not in (ACCEPT, REJECT)
            )
            if not ports:
                continue
            mold, framing = self.moldudp64_framing(ports[0][1])
            self._feed = Feed(ports, eth[1], ipv4[1], udp, mold, framing)
            break
        return self._feed

    def _predecessor(self, target: str, bits: int, off: int, width: int, value: int) -> tuple[str, str] | None:
        """(state, instance) of a state that selects ``value`` on bits ``off``..``off+width`` of an
        extracted header of ``bits`` bits and leads to ``target`` (directly or through
        transition-only states)."""
        for name in self.reachable("start", strict=False):
            st = self.state(name)
            inst = _selects(st, self, bits, off, width)
            if inst is None:
                continue
            for ks, t in st.cases:
                if not ks.default and ks.matches(value) and self._leads_to(t, target):
                    return name, inst
        return None

    def _leads_to(self, name: str, target: str) -> bool:
        while name not in (ACCEPT, REJECT):
            if name == target:
                return True
            st = self.state(name)
            if st.key is not None or st.extracts:
                return False
            name = st.cases[0][1]
        return False

    def moldudp64_framing(self, entry: str) -> tuple[bool, tuple[str, ...]]:
        """(whether the UDP payload that starts in state ``entry`` is MoldUDP64-framed, the instances
        that extract its first 176 bits in order) -- see the module docstring."""
        bounds, insts, bit, name = set(), [], 0, entry
        while bit < MOLD_BOUNDARIES[-1] and name not in (ACCEPT, REJECT):
            st = self.state(name)
            for inst in st.extracts:
                if bit >= MOLD_BOUNDARIES[-1]:
                    break
                size = self.header_bits[inst]
                if size is None:
                    return False, ()
                insts.append(inst)
                for f in self.fields.values():
                    if f.instance == inst:
                        bounds.add(bit + f.bit_offset + f.width)
                bit += size
            if bit < MOLD_BOUNDARIES[-1]:
                if st.key is not None:
                    return False, ()
                name = st.cases[0][1]
        ok = bit >= MOLD_BOUNDARIES[-1] and all(b in bounds for b in MOLD_BOUNDARIES)
        return ok, tuple(insts) if ok else ()

    def message_instances(self) -> list[str]:
        """Instances a message can make valid (extracted from the MoldUDP64 message start on)."""
        feed = self.feed()
        if feed is None:
            return []
        out: list[str] = []
        for name in self.reachable(feed.entry):
            out.extend(i for i in self.state(name).extracts if i not in feed.framing)
        return list(dict.fromkeys(out))


def check_parsed(spec: Spec, fields: list[str]) -> None:
    """Raise SubcError unless the spec's parser extracts the header of every field in ``fields``
    (``instance.field``) on some path from ``start``: at the state the decoder cannot follow on the
    way (a select on an expression, a lookahead, a state that does not exist), or at the query field
    whose header no state extracts.  A pragma-only spec (no parser) passes: it has nothing to
    follow.  This is the compile-time check that no field is ever silently missing."""
    if spec.parser is None or not spec.whole_program:
        return
    g = ParseGraph(spec)
    reachable = g.reachable("start", strict=False)
    extracted = {i for name in reachable for i in g.state(name).extracts}
    for f in fields:
        inst = f.split(".", 1)[0]
        if inst in extracted:
            continue
        g.reachable("start")  # a state on the way the decoder cannot follow: its located error
        raise SubcError(
            f"field '{f}': the parser never extracts header '{inst}', so no packet can carry it",
            spec.query_fields[f].location if f in spec.query_fields else None,
        )


def _selects(st: GraphState, g: ParseGraph, bits: int, off: int, width: int) -> str | None:
    """The instance whose bits ``off``..``off+width`` ``st`` selects on, when it extracts exactly one
    header of ``bits`` bits (a network header recognised by structure), else None."""
    if st.key is None or len(st.key) != 1 or len(st.extracts) != 1:
        return None
    inst = st.extracts[0]
    f = st.key[0]
    if g.header_bits.get(inst) != bits or f.instance != inst or (f.bit_offset, f.width) != (off, width):
        return None
    return inst


def bits_at(data: bytes, bit: int, width: int) -> int:
    """The unsigned big-endian integer of ``width`` bits at bit offset ``bit`` of ``data``."""
    first, last = bit // 8, (bit + width + 7) // 8
    chunk = int.from_bytes(data[first:last], "big")
    return (chunk >> (last * 8 - bit - width)) & ((1 << width) - 1)


def put_bits(data: bytearray, bit: int, width: int, value: int) -> None:
    """Write ``value`` as the ``width``-bit big-endian integer at bit offset ``bit`` of ``data`` (the
    inverse of :func:`bits_at`; the other bits are kept)."""
    for i in range(width):
        b = bit + i
        mask = 0x80 >> (b % 8)
        if value >> (width - 1 - i) & 1:
            data[b // 8] |= mask
        else:
            data[b // 8] &= ~mask & 0xFF
