"""The parser of the multi-message P4 program: the slots' parser states (docs/p4-messages.md).

From the spec's parse graph (:mod:`subc.spec.parse_graph`), :func:`feed_of` finds the MoldUDP64
feed and :func:`slot_parser` the rest of what the program parses: the framing (the MoldUDP64
header's instances, bits 0..160, and the block length's, 160..176; the count, sequence number and
block length fields; the IPv4 and UDP fields a copy rewrites), the header instances above the feed
and those of one slot, the parser states above the slots, and each slot's clones of the spec's
message states, unfolded by the number of message bits extracted so far so that every ``accept``
of a known message type knows its length and checks the slot's block length against it (see
:mod:`.slots` for the plan as a whole).

Both raise :class:`NotSlottable` (with the reason) for a spec the program cannot slot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import SubcError
from ...spec.parse_graph import ACCEPT, MOLD_BOUNDARIES, REJECT, ParseGraph
from ..safety import identifier

#: Unfolded parser states per slot (a spec whose message states unfold to more is not slotted).
MAX_SLOT_STATES = 2048


@dataclass
class SlotState:
    """One parser state of the program: ``statements`` (P4 text), then a transition:
    ``select`` (P4 expression, or None for a direct one) and ``cases`` ((keyset text, target))."""

    name: str
    statements: list[str]
    select: str | None
    cases: list[tuple[str, str]]


class NotSlottable(Exception):
    """The spec cannot be slotted, for ``reason``."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _TooBig(Exception):
    """A slot's message states unfold to more than :data:`MAX_SLOT_STATES` states."""


def _field_at(g: ParseGraph, inst: str, off: int, width: int) -> str | None:
    for f in g.fields.values():
        if f.instance == inst and f.bit_offset == off and f.width == width:
            return f.name
    return None


def rename_instances(text: str, hdr: str, insts, prefix: str) -> str:
    """``text`` with every ``hdr.inst`` of ``insts`` written ``hdr.prefix.inst``."""
    for inst in insts:
        text = re.sub(rf"\b{re.escape(hdr)}\s*\.\s*{re.escape(inst)}\b", f"{hdr}.{prefix}.{inst}", text)
    return text


def feed_of(spec):
    """(the parse graph, its MoldUDP64 feed with one entry state)."""
    if spec.parser is None or not spec.whole_program:
        raise NotSlottable("the spec has no parser (pragma-only)")
    try:
        g = ParseGraph(spec)
        feed = g.feed()
    except SubcError as e:
        raise NotSlottable(f"the parse graph cannot follow the spec: {e}") from None
    if feed is None:
        raise NotSlottable("the spec's parser reaches no UDP feed port")
    if not feed.moldudp64:
        raise NotSlottable("the feed is not MoldUDP64-framed")
    return g, feed


@dataclass
class SlotParser:
    """What :func:`slot_parser` finds: ``top`` (header instances outside the slots, struct order)
    and ``slot`` (instances of one slot, block length first), as (instance, header type);
    ``top_states`` and ``slot_states`` (``slot_states[i]`` of slot i); ``slot_bits``: the most
    bits a message of a slot extracts; ``fields``: the P4 expressions of the fields a copy
    rewrites (:attr:`.slots.SlotPlan.f`)."""

    top: list[tuple[str, str]]
    slot: list[tuple[str, str]]
    top_states: list[SlotState]
    slot_states: list[list[SlotState]]
    slot_bits: int
    fields: dict[str, object]


def slot_parser(g: ParseGraph, feed, spec, hdr: str, meta: str, max_messages: int) -> SlotParser:
    """The parser of a program of ``max_messages`` slots over ``feed`` (from :func:`feed_of`;
    ``hdr``, ``meta``: the P4 names of the headers and metadata structs).  Raises
    :class:`NotSlottable` when the spec cannot be slotted, SubcError for a header instance whose
    name is no P4 identifier.

    Steps: the framing and the network fields a copy rewrites (:func:`_framing`), the parser
    states above the feed and those of a message (:func:`_partition`), the top states, each
    slot's states (:func:`_slot_states`)."""
    fr = _framing(g, feed, hdr)
    part = _partition(g, spec, feed, fr)
    top, slot = part.instances(spec, fr.block)
    msg_insts = [i for i, _ in slot]
    for i, _ in top + slot:
        identifier(i, "header instance")
    cnt = f"{hdr}.{fr.count[0]}.{fr.count[1]}"
    top_states = _top_states(g, spec, part, fr, hdr, meta, cnt, feed.entry)
    slot_states, bits_of_slot = [], 0
    for i in range(max_messages):
        states, bits = _slot_states(g, spec, part, fr, hdr, msg_insts, cnt, i, max_messages)
        slot_states.append(states)
        bits_of_slot = max(bits_of_slot, bits)
    return SlotParser(top, slot, top_states, slot_states, bits_of_slot, _rewritten(spec, feed, fr, hdr, cnt))


def _rewritten(spec, feed, fr: _Framing, hdr: str, cnt: str) -> dict[str, object]:
    """The P4 expressions of the fields a copy rewrites (``count``, ``seq``, ``block_len`` with
    ``{i}`` for the slot, the network fields), the framing instances, and the IPv4 and UDP
    checksum inputs ``ip_fields``/``udp_fields``."""
    net = fr.net
    f: dict[str, object] = dict(net)
    f.update(
        {
            "count": cnt,
            "seq": f"{hdr}.{fr.seq[0]}.{fr.seq[1]}",
            "block_len": f"{hdr}.subc_s{{i}}.{fr.blen[0]}.{fr.blen[1]}",
            "block": fr.block,
            "mold": fr.mold,
            "udp": feed.udp,
            "ipv4": feed.ipv4,
            "ip_fields": [
                f"{hdr}.{feed.ipv4}.{n}"
                for n, _ in spec.headers[spec.instances[feed.ipv4]].fields
                if f"{hdr}.{feed.ipv4}.{n}" != net["ip_csum"]
            ],
            "udp_fields": [
                f"{hdr}.{feed.udp}.{n}"
                for n, _ in spec.headers[spec.instances[feed.udp]].fields
                if f"{hdr}.{feed.udp}.{n}" != net["udp_csum"]
            ],
        }
    )
    return f


@dataclass
class _Framing:
    """The feed's framing: instances of the MoldUDP64 header (bits 0..160) and of the block length
    (160..176), the (instance, field) of the count, sequence number and block length, and the
    network fields a copy rewrites (key -> P4 expression)."""

    mold: list[str]
    block: list[str]
    count: tuple[str, str]
    seq: tuple[str, str]
    blen: tuple[str, str]
    net: dict[str, str]


def _header_bits(g: ParseGraph, inst: str) -> int:
    """The size in bits of header instance ``inst``; NotSlottable when it has a variable size."""
    bits = g.header_bits[inst]
    if bits is None:
        raise NotSlottable(f"header instance '{inst}' has a variable size")
    return bits


def _framing(g: ParseGraph, feed, hdr: str) -> _Framing:
    starts, bit = {}, 0
    for inst in feed.framing:  # (each of a fixed size: the feed is MoldUDP64-framed)
        starts[inst] = bit
        bit += _header_bits(g, inst)
    mold = [i for i in feed.framing if starts[i] + _header_bits(g, i) <= MOLD_BOUNDARIES[2]]
    block = [i for i in feed.framing if starts[i] >= MOLD_BOUNDARIES[2]]
    if len(mold) + len(block) != len(feed.framing) or bit != MOLD_BOUNDARIES[3]:
        raise NotSlottable("a framing header straddles the MoldUDP64 header and the block length")

    def find(lo: int, width: int, insts) -> tuple[str, str] | None:
        for inst in insts:
            name = _field_at(g, inst, lo - starts[inst], width)
            if name is not None:
                return inst, name
        return None

    count, seq, blen = find(144, 16, mold), find(80, 64, mold), find(160, 16, block)
    if count is None or seq is None or blen is None:
        raise NotSlottable(
            "the MoldUDP64 header lacks a 64-bit sequence number, 16-bit count or 16-bit block length field"
        )
    net = {}
    for key, inst, off, w in (
        ("ip_len", feed.ipv4, 16, 16),
        ("ip_csum", feed.ipv4, 80, 16),
        ("ip_proto", feed.ipv4, 72, 8),
        ("ip_src", feed.ipv4, 96, 32),
        ("ip_dst", feed.ipv4, 128, 32),
        ("udp_len", feed.udp, 32, 16),
        ("udp_csum", feed.udp, 48, 16),
    ):
        name = _field_at(g, inst, off, w)
        if name is None:
            raise NotSlottable(f"the IPv4/UDP header has no {w}-bit field at bit {off} to rewrite")
        net[key] = f"{hdr}.{inst}.{name}"
    return _Framing(mold, block, count, seq, blen, net)


@dataclass
class _Partition:
    """The parser states above the feed (``top_names``, from start, in order) and those of a
    message (``msg_states``); the state where the framing ends and its message extracts; the
    instances a slot holds."""

    top_names: list[str]
    msg_states: list[str]
    first_state: str
    first_extracts: list[str]
    slot_insts: set[str]

    def instances(self, spec, block: list[str]) -> tuple[list, list]:
        """(the instances above the feed, a slot's instances: the block length's first)."""
        top = [(i, spec.instances[i]) for i in spec.instances if i not in self.slot_insts]
        slot = [(i, spec.instances[i]) for i in block] + [
            (i, spec.instances[i]) for i in spec.instances if i in self.slot_insts and i not in block
        ]
        return top, slot


def _partition(g: ParseGraph, spec, feed, fr: _Framing) -> _Partition:
    entry = feed.entry
    try:
        msg_states = g.reachable(entry)
    except SubcError as e:
        raise NotSlottable(f"the message states cannot be followed: {e}") from None
    top_names: list[str] = []
    stack, seen = ["start"], set()
    while stack:
        n = stack.pop()
        if n in seen or n in (ACCEPT, REJECT) or n == entry:
            continue
        seen.add(n)
        top_names.append(n)
        try:
            stack.extend(reversed(g.successors(n)))
        except SubcError:
            pass
    if set(top_names) & set(msg_states):
        raise NotSlottable("a message state is also reached outside the feed")
    # the state in which the framing ends, and the message extracts of that state
    name = entry
    framing_left = list(feed.framing)
    chain = []
    while True:
        st = g.state(name)
        chain.append(name)
        rest = list(st.extracts)
        while rest and framing_left and rest[0] == framing_left[0]:
            rest.pop(0)
            framing_left.pop(0)
        if not framing_left:
            first_state, first_extracts = name, rest
            break
        if st.key is not None or rest:
            raise NotSlottable("the framing is extracted with a select in between")
        name = st.cases[0][1]
    slot_insts = set(fr.block)
    for n in msg_states:
        exts = g.state(n).extracts if n != first_state else first_extracts
        if n in chain and n != first_state:
            continue
        slot_insts.update(exts)
    if slot_insts & set(fr.mold):
        raise NotSlottable("a message state extracts a MoldUDP64 header instance")
    for n in top_names:
        if set(g.state(n).extracts) & slot_insts:
            raise NotSlottable("a message header is also extracted outside the feed")
    return _Partition(top_names, msg_states, first_state, first_extracts, slot_insts)


def _top_states(g: ParseGraph, spec, part: _Partition, fr: _Framing, hdr: str, meta: str, cnt: str, entry: str):
    """The parser states above the slots: the spec's up to the feed, then ``subc_mold`` (the
    MoldUDP64 header: heartbeats and end of session accept) and ``subc_unframed``."""
    raw = {s.name: s for s in spec.parser.states}
    out: list[SlotState] = []
    for n in part.top_names:
        rs = raw[n]
        out.append(
            SlotState(
                n,
                [f"{spec.parser.packet}.extract({hdr}.{i});" for i in g.state(n).extracts],
                rs.transition.select_text,
                [(ks, "subc_mold" if t == entry else t) for ks, t in rs.transition.cases],
            )
        )
    out.append(
        SlotState(
            "subc_mold",
            [f"{meta}.subc_feed = 1;"] + [f"{spec.parser.packet}.extract({hdr}.{i});" for i in fr.mold],
            cnt,
            [("0", ACCEPT), ("0xFFFF", ACCEPT), ("default", "subc_s0_start")],
        )
    )
    out.append(SlotState("subc_unframed", [f"{meta}.subc_unframed = 1;"], None, [("default", ACCEPT)]))
    return out


def _slot_states(
    g: ParseGraph,
    spec,
    part: _Partition,
    fr: _Framing,
    hdr: str,
    msg_insts: list[str],
    cnt: str,
    i: int,
    max_messages: int,
) -> tuple[list[SlotState], int]:
    """(the parser states of slot ``i``: the message states unfolded per bit offset, a state per
    message length checking the block length, and the step to the next slot; the most bits a
    message of the slot extracts)."""
    raw = {s.name: s for s in spec.parser.states}
    pre = f"subc_s{i}"
    states: list[SlotState] = []
    memo: dict[tuple[str, int], str] = {}
    lengths: set[int] = set()
    most = 0

    def target(t: str, bits: int) -> str:
        if t == ACCEPT:
            if bits % 8:
                return "subc_unframed"
            lengths.add(bits // 8)
            return f"{pre}_len{bits // 8}"
        if t == REJECT:
            return "subc_unframed"
        return clone(t, bits)

    def clone(n: str, bits: int, extracts=None, sname=None) -> str:
        nonlocal most
        key = (n, bits)
        if key in memo:
            return memo[key]
        if len(memo) >= MAX_SLOT_STATES:
            raise _TooBig()
        # slot 0 is parsed by the spec's own state names, slot i by subc_s<i>_<state>
        base = n if i == 0 else f"{pre}_{n}"
        sname = sname or (base if not any(k[0] == n for k in memo) else f"{base}_subc_b{bits}")
        memo[key] = sname
        gs = g.state(n)
        exts = gs.extracts if extracts is None else extracts
        stmts = [f"{spec.parser.packet}.extract({hdr}.{pre}.{x});" for x in exts]
        bits += sum(_header_bits(g, x) for x in exts)
        most = max(most, bits)
        st = SlotState(sname, stmts, None, [])
        states.append(st)
        rs = raw[n]
        if rs.transition.select_text is None:
            st.cases = [("default", target(gs.cases[0][1], bits))]
        else:
            st.select = rename_instances(rs.transition.select_text, hdr, msg_insts, pre)
            for (ks_text, _), (ks, t) in zip(rs.transition.cases, gs.cases):
                st.cases.append((ks_text, "subc_unframed" if ks.default else target(t, bits)))
        return sname

    try:
        start = f"{pre}_start"
        states.append(
            SlotState(
                start,
                [f"{spec.parser.packet}.extract({hdr}.{pre}.{x});" for x in fr.block],
                None,
                [("default", clone(part.first_state, 0, part.first_extracts))],
            )
        )
    except _TooBig:
        raise NotSlottable(f"the message states unfold to more than {MAX_SLOT_STATES} parser states per slot") from None
    bl = f"{hdr}.{pre}.{fr.blen[0]}.{fr.blen[1]}"
    nxt = f"{pre}_next"
    for n_bytes in sorted(lengths):
        states.append(SlotState(f"{pre}_len{n_bytes}", [], bl, [(str(n_bytes), nxt), ("default", "subc_unframed")]))
    if i + 1 < max_messages:
        states.append(SlotState(nxt, [], cnt, [(str(i + 1), ACCEPT), ("default", f"subc_s{i + 1}_start")]))
    else:
        states.append(SlotState(nxt, [], None, [("default", ACCEPT)]))
    return states, most
