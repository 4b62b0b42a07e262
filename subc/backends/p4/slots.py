"""Multi-message classification on the P4 targets: the slot plan (docs/p4-messages.md).

A MoldUDP64 datagram (MoldUDP64 Protocol Specification v1.00: a 20-byte header -- session 80
bits, sequence number 64, message count 16 -- then message blocks of a 16-bit length and the
message) carries N messages.  The P4 programs parse up to ``K`` of them (``--max-messages``) into
*slots*: slot ``i`` holds its own copy of the block-length header(s) and of every message header
instance the spec's parser extracts after the block length, in a struct ``subc_slot_t``
(``hdr.subc_s<i>.<instance>``), parsed by per-slot clones of the spec's own message states
(taken from the parse graph, :mod:`subc.spec.parse_graph`: nothing about ITCH is known here).
The clones are unfolded by the number of message bits extracted so far, so that every ``accept``
of a known message type knows its length in bytes; the slot's block length is then checked
against it.  A case that takes ``default`` (a type the spec does not parse), a ``reject``, or a
block length that differs from the type's, makes the datagram *unframed*: the switch cannot find
the next message, so the datagram goes whole to the overflow port, counted.

Each slot is classified by its own copy of the stage tables (same entries; P4_16 allows one
``apply`` per table, P4_16 spec v1.2.4 section 14.2.2), whose leaf entries set the slot's port
bitmap (bit ``j``: the ``j``-th port of :attr:`SlotPlan.ports`, the sorted ports of the rules'
``fwd``) or, for a non-forwarding decision (``drop()``, ``nop``, a spec action), a *held* code
counted per slot: on a switch a message is delivered to its ``fwd`` ports only
(:func:`subc.semantics.delivery.recipients_of` with ``broker=False``); a spec action's body is not
run per message (its effects would land on the headers every copy shares).  The union of the
bitmaps picks the copies: one port is a unicast, several the multicast group of all subscriber
ports with egress pruning; egress removes the slots a copy must not carry and rewrites counts,
lengths, checksums and the per-port sequence number.

Raises nothing for specs it cannot slot: :func:`slot_plan` returns the reason, and the program
stays single-message (one message per datagram, as before).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property

from ...errors import SubcError
from ...ir.aggregates import UPDATE_ATOM
from ...ir.decisions import COUNT_ATOM
from ...spec.parse_graph import ACCEPT, MOLD_BOUNDARIES, REJECT, ParseGraph
from .tables import Entry, Pipeline, Table
from ..safety import identifier

#: The default of ``--max-messages``.
DEFAULT_MAX_MESSAGES = 8
#: Largest K accepted (a datagram of 1,500 bytes holds at most 484 messages of 1 byte).
MAX_MAX_MESSAGES = 512
#: Ports a v1model ``egress_spec`` / TNA ``PortId_t`` can name (9 bits); BMv2 drops on 511.
MAX_PORT = 510
#: Unfolded parser states per slot (a spec whose message states unfold to more is not slotted).
MAX_SLOT_STATES = 2048
#: The multicast group of all subscriber ports.
ALL_PORTS_GROUP = 1
#: Indexes of the datagram counter ``subc_datagrams``.
COUNTERS = ("classified", "heartbeat", "too_many", "unframed", "malformed", "not_feed")
#: Datagram kinds carried to egress (``meta.subc_kind``).
KIND_NONE, KIND_DATA, KIND_HEARTBEAT = 0, 1, 2


@dataclass
class SlotState:
    """One parser state of the program: ``statements`` (P4 text), then a transition:
    ``select`` (P4 expression, or None for a direct one) and ``cases`` ((keyset text, target))."""

    name: str
    statements: list[str]
    select: str | None
    cases: list[tuple[str, str]]


@dataclass
class SlotPlan:
    """What the multi-message P4 program needs (see the module docstring).

    ``max_messages``: K slots; ``overflow_port``: where datagrams the switch cannot handle go
    (None: dropped, still counted); ``ports``: the subscriber ports (bit ``j`` of a bitmap is
    ``ports[j]``); ``held``: the non-forwarding decisions with their codes ((action, params) ->
    code, codes from 1); ``top``: header instances outside the slots (struct order); ``slot``:
    instances of one slot (block length first); ``top_states``/``slot_states``: parser states
    (``slot_states[i]`` of slot i); ``f``: P4 expressions of the fields rewritten (``ip_len``,
    ``ip_csum``, ``udp_len``, ``udp_csum``, ``count``, ``seq``, ``block_len`` with ``{i}`` for
    the slot, the IPv4 and UDP checksum inputs ``ip_fields``/``pseudo``).
    """

    max_messages: int
    overflow_port: int | None
    ports: list[int]
    held: dict[tuple, int]
    top: list[tuple[str, str]]
    slot: list[tuple[str, str]]
    top_states: list[SlotState]
    slot_states: list[list[SlotState]]
    f: dict = field(default_factory=dict)
    slot_bits: int = 0

    @property
    def port_bits(self) -> int:
        """Width of a port bitmap in bits (at least 1)."""
        return max(1, len(self.ports))

    @cached_property
    def _port_bit(self) -> dict[int, int]:
        """Port -> its bitmap bit (built once: a compile asks for every port of every leaf)."""
        return {p: 1 << j for j, p in enumerate(self.ports)}

    def bit_of(self, port: int) -> int:
        """The bitmap bit of ``port``."""
        return self._port_bit[port]

    @cached_property
    def _bitmaps(self) -> dict[int, tuple]:
        return {}

    def bitmap(self, ports) -> int:
        """The bitmap of ``ports`` (each one of :attr:`ports`; cached per ports object: every entry
        of a multicast leaf asks for its group's)."""
        hit = self._bitmaps.get(id(ports))
        if hit is not None and hit[0] is ports:
            return hit[1]
        out = sum(map(self._port_bit.__getitem__, set(ports)))  # distinct bits: the sum is the OR
        self._bitmaps[id(ports)] = (ports, out)  # (keeps the object: its id stays its own)
        return out


def check_options(max_messages: int, overflow_port: int | None) -> None:
    """Raise SubcError unless 1 <= ``max_messages`` <= :data:`MAX_MAX_MESSAGES` and
    ``overflow_port`` is None or a port 0..:data:`MAX_PORT`."""
    if isinstance(max_messages, bool) or not isinstance(max_messages, int) or not 1 <= max_messages <= MAX_MAX_MESSAGES:
        raise SubcError(
            f"--max-messages {max_messages!r}: the P4 targets classify 1 to {MAX_MAX_MESSAGES} messages per datagram"
        )
    if overflow_port is not None and (
        isinstance(overflow_port, bool) or not isinstance(overflow_port, int) or not 0 <= overflow_port <= MAX_PORT
    ):
        raise SubcError(
            f"--overflow-port {overflow_port!r}: a switch port is 0 to {MAX_PORT} (9 bits; BMv2 drops on 511)"
        )


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


def leaf_ports(pipe: Pipeline) -> list[int]:
    """The sorted ports the leaf entries forward to (``subc_fwd`` and the multicast groups)."""
    ports: set[int] = set()
    for t in pipe.tables:
        for action, params in [(e.action, e.params) for e in t.entries] + [t.default_action]:
            if action == "subc_fwd":
                ports.add(dict(params)["port"])
            elif action == "subc_mcast":
                ports.update(pipe.mcast_groups[dict(params)["group"]])
    return sorted(ports)


def slot_plan(
    res, max_messages: int = DEFAULT_MAX_MESSAGES, overflow_port: int | None = None
) -> tuple[SlotPlan | None, str | None]:
    """(plan, None) for the multi-message program of ``res`` (a CompileResult), or (None, reason)
    when its spec cannot be slotted (not a MoldUDP64 feed, framing headers that straddle the
    MoldUDP64 header and block length, network headers without the fields to rewrite...).
    Raises SubcError for bad options (:func:`check_options`) or an overflow port that is also a
    subscriber port.

    Steps: the feed (:func:`_feed`), its framing and the network fields a copy rewrites
    (:func:`_framing`), the parser states above the feed and those of a message
    (:func:`_partition`), the top states, each slot's states (:func:`_slot_states`), and the
    actions a slot holds until its datagram's verdict."""
    check_options(max_messages, overflow_port)
    spec, pipe = res.spec, res.pipeline
    try:
        g, feed = _feed(spec)
        ports = leaf_ports(pipe)
        if overflow_port is not None and overflow_port in ports:
            raise SubcError(
                f"--overflow-port {overflow_port} is also a subscriber port of the rules: the overflow port "
                "must be a port no rule forwards to"
            )
        if len({e for _, e in feed.ports}) != 1:
            raise _NotSlottable("the feed ports lead to different parser states")
        hdr, meta = pipe.hdr, pipe.meta
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
    except _NotSlottable as e:
        return None, e.reason
    held: dict[tuple, int] = {}
    for t in pipe.tables:
        for action, params in [(e.action, e.params) for e in t.entries] + [t.default_action]:
            if action not in ("subc_fwd", "subc_mcast") + _PASSED:
                held.setdefault((action, tuple(params)), len(held) + 1)
    d = pipe.default_action
    held.setdefault((d[0], tuple(d[1])), len(held) + 1)
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
    return SlotPlan(
        max_messages, overflow_port, ports, held, top, slot, top_states, slot_states, f, bits_of_slot + 16
    ), None


class _NotSlottable(Exception):
    """The spec cannot be slotted, for ``reason``."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _TooBig(Exception):
    pass


def _feed(spec):
    """(the parse graph, its MoldUDP64 feed with one entry state)."""
    if spec.parser is None or not spec.whole_program:
        raise _NotSlottable("the spec has no parser (pragma-only)")
    try:
        g = ParseGraph(spec)
        feed = g.feed()
    except SubcError as e:
        raise _NotSlottable(f"the parse graph cannot follow the spec: {e}") from None
    if feed is None:
        raise _NotSlottable("the spec's parser reaches no UDP feed port")
    if not feed.moldudp64:
        raise _NotSlottable("the feed is not MoldUDP64-framed")
    return g, feed


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
    """The size in bits of header instance ``inst``; _NotSlottable when it has a variable size."""
    bits = g.header_bits[inst]
    if bits is None:
        raise _NotSlottable(f"header instance '{inst}' has a variable size")
    return bits


def _framing(g: ParseGraph, feed, hdr: str) -> _Framing:
    starts, bit = {}, 0
    for inst in feed.framing:  # (each of a fixed size: the feed is MoldUDP64-framed)
        starts[inst] = bit
        bit += _header_bits(g, inst)
    mold = [i for i in feed.framing if starts[i] + _header_bits(g, i) <= MOLD_BOUNDARIES[2]]
    block = [i for i in feed.framing if starts[i] >= MOLD_BOUNDARIES[2]]
    if len(mold) + len(block) != len(feed.framing) or bit != MOLD_BOUNDARIES[3]:
        raise _NotSlottable("a framing header straddles the MoldUDP64 header and the block length")

    def find(lo: int, width: int, insts) -> tuple[str, str] | None:
        for inst in insts:
            name = _field_at(g, inst, lo - starts[inst], width)
            if name is not None:
                return inst, name
        return None

    count, seq, blen = find(144, 16, mold), find(80, 64, mold), find(160, 16, block)
    if count is None or seq is None or blen is None:
        raise _NotSlottable(
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
            raise _NotSlottable(f"the IPv4/UDP header has no {w}-bit field at bit {off} to rewrite")
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
        raise _NotSlottable(f"the message states cannot be followed: {e}") from None
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
        raise _NotSlottable("a message state is also reached outside the feed")
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
            raise _NotSlottable("the framing is extracted with a select in between")
        name = st.cases[0][1]
    slot_insts = set(fr.block)
    for n in msg_states:
        exts = g.state(n).extracts if n != first_state else first_extracts
        if n in chain and n != first_state:
            continue
        slot_insts.update(exts)
    if slot_insts & set(fr.mold):
        raise _NotSlottable("a message state extracts a MoldUDP64 header instance")
    for n in top_names:
        if set(g.state(n).extracts) & slot_insts:
            raise _NotSlottable("a message header is also extracted outside the feed")
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
        raise _NotSlottable(
            f"the message states unfold to more than {MAX_SLOT_STATES} parser states per slot"
        ) from None
    bl = f"{hdr}.{pre}.{fr.blen[0]}.{fr.blen[1]}"
    nxt = f"{pre}_next"
    for n_bytes in sorted(lengths):
        states.append(SlotState(f"{pre}_len{n_bytes}", [], bl, [(str(n_bytes), nxt), ("default", "subc_unframed")]))
    if i + 1 < max_messages:
        states.append(SlotState(nxt, [], cnt, [(str(i + 1), ACCEPT), ("default", f"subc_s{i + 1}_start")]))
    else:
        states.append(SlotState(nxt, [], None, [("default", ACCEPT)]))
    return states, most


#: Actions that are the same in per-message form (they write a slot's state, code, update mask or
#: count mask).
_PASSED = ("subc_set_state", "subc_set_code", UPDATE_ATOM, COUNT_ATOM, "NoAction")


def message_action(plan: SlotPlan, pipe: Pipeline, action: tuple[str, tuple]) -> tuple[str, tuple]:
    """The per-message form of a leaf action: ``subc_msg_fwd(ports=bitmap)`` for ``subc_fwd`` and
    ``subc_mcast``, ``subc_msg_hold(code=c)`` for a non-forwarding action; others unchanged."""
    name, params = action
    if name == "subc_fwd":
        return "subc_msg_fwd", (("ports", plan.bit_of(dict(params)["port"])),)
    if name == "subc_mcast":
        return "subc_msg_fwd", (("ports", plan.bitmap(pipe.mcast_groups[dict(params)["group"]])),)
    if name in _PASSED:
        return action
    return "subc_msg_hold", (("code", plan.held[(name, tuple(params))]),)


def _message_action_name(name: str) -> str:
    if name in ("subc_fwd", "subc_mcast"):
        return "subc_msg_fwd"
    if name in _PASSED:
        return name
    return "subc_msg_hold"


def message_tables(plan: SlotPlan, pipe: Pipeline) -> list[Table]:
    """The logical tables of ``pipe`` with their leaf actions in per-message form
    (:func:`message_action`); every slot applies a copy of each with these entries."""
    out = []
    for t in pipe.tables:
        entries = []
        for e in t.entries:
            a, p = message_action(plan, pipe, (e.action, e.params))
            entries.append(Entry(e.match, a, p, e.priority))
        default = message_action(plan, pipe, t.default_action)
        declared = {_message_action_name(a) for a in t.actions}
        actions = sorted(({e.action for e in entries} | {default[0]} | declared) - {"NoAction"})
        out.append(replace(t, entries=entries, default_action=default, actions=actions))
    return out


def slot_table_name(name: str, i: int) -> str:
    """The name of slot ``i``'s copy of table ``name`` (``subc_x`` -> ``subc_s<i>_x``)."""
    return f"subc_s{i}_{name[5:]}" if name.startswith("subc_") else f"subc_s{i}_{name}"


def deliver_table(plan: SlotPlan) -> Table:
    """``subc_deliver`` (ingress): the union bitmap of one port -> unicast to it; otherwise the
    multicast group of all ports (default)."""
    from .tables import Key

    entries = [Entry((1 << j,), "subc_unicast", (("port", p),)) for j, p in enumerate(plan.ports)]
    return Table(
        "subc_deliver",
        [Key("meta.subc_union", "exact", plan.port_bits)],
        entries,
        ("subc_multicast", ()),
        "deliver",
        None,
        ["subc_unicast", "subc_multicast"],
    )


def port_bit_table(plan: SlotPlan, port_key: str) -> Table:
    """``subc_port_bit`` (egress): egress port -> its bitmap bit (default 0: a port no rule uses)."""
    from .tables import Key

    entries = [Entry((p,), "subc_set_port_bit", (("port_bit", 1 << j),)) for j, p in enumerate(plan.ports)]
    return Table(
        "subc_port_bit",
        [Key(port_key, "exact", 9)],
        entries,
        ("subc_set_port_bit", (("port_bit", 0),)),
        "egress",
        None,
        ["subc_set_port_bit"],
    )
