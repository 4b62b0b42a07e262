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
the next message, so the datagram goes whole to the overflow port, counted.  (The parser is built
in :mod:`.slot_parser`.)

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

from dataclasses import dataclass, field, replace
from functools import cached_property

from ...errors import SubcError
from ...ir.aggregates import UPDATE_ATOM
from ...ir.decisions import COUNT_ATOM
from .slot_parser import NotSlottable, SlotState, feed_of, slot_parser
from .tables import Entry, Pipeline, Table

#: The default of ``--max-messages``.
DEFAULT_MAX_MESSAGES = 8
#: Largest K accepted (a datagram of 1,500 bytes holds at most 484 messages of 1 byte).
MAX_MAX_MESSAGES = 512
#: Ports a v1model ``egress_spec`` / TNA ``PortId_t`` can name (9 bits); BMv2 drops on 511.
MAX_PORT = 510
#: The multicast group of all subscriber ports.
ALL_PORTS_GROUP = 1
#: Indexes of the datagram counter ``subc_datagrams``.
COUNTERS = ("classified", "heartbeat", "too_many", "unframed", "malformed", "not_feed")
#: Datagram kinds carried to egress (``meta.subc_kind``).
KIND_NONE, KIND_DATA, KIND_HEARTBEAT = 0, 1, 2


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
    #: (pipeline, its tables in per-message form): :func:`message_tables`'s, built once
    message_tables_of: tuple | None = field(default=None, repr=False, compare=False)

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
        """The bitmap of ``ports`` (distinct, each one of :attr:`ports`: a multicast group's ports,
        sorted and distinct as a decision's are; cached per ports object: every entry of a
        multicast leaf asks for its group's)."""
        hit = self._bitmaps.get(id(ports))
        if hit is not None and hit[0] is ports:
            return hit[1]
        out = sum(map(self._port_bit.__getitem__, ports))  # distinct ports, distinct bits: the sum is the OR
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

    Steps: the feed (:func:`.slot_parser.feed_of`), its parser (:func:`.slot_parser.slot_parser`:
    framing, the instances and parser states above the feed and of each slot, the fields a copy
    rewrites), and the actions a slot holds until its datagram's verdict."""
    check_options(max_messages, overflow_port)
    spec, pipe = res.spec, res.pipeline
    try:
        g, feed = feed_of(spec)
        ports = leaf_ports(pipe)
        if overflow_port is not None and overflow_port in ports:
            raise SubcError(
                f"--overflow-port {overflow_port} is also a subscriber port of the rules: the overflow port "
                "must be a port no rule forwards to"
            )
        if len({e for _, e in feed.ports}) != 1:
            raise NotSlottable("the feed ports lead to different parser states")
        parser = slot_parser(g, feed, spec, pipe.hdr, pipe.meta, max_messages)
    except NotSlottable as e:
        return None, e.reason
    held: dict[tuple, int] = {}
    for t in pipe.tables:
        for action, params in [(e.action, e.params) for e in t.entries] + [t.default_action]:
            if action not in ("subc_fwd", "subc_mcast") + _PASSED:
                held.setdefault((action, tuple(params)), len(held) + 1)
    d = pipe.default_action
    held.setdefault((d[0], tuple(d[1])), len(held) + 1)
    return SlotPlan(
        max_messages,
        overflow_port,
        ports,
        held,
        parser.top,
        parser.slot,
        parser.top_states,
        parser.slot_states,
        parser.fields,
        parser.slot_bits + 16,
    ), None


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
    (:func:`message_action`); every slot applies a copy of each with these entries.  Built once
    per (plan, pipeline): the program, its P4Info and its entries all read them."""
    cached = plan.message_tables_of
    if cached is not None and cached[0] is pipe:
        return list(cached[1])
    out = []
    groups, bitmap = pipe.mcast_groups, plan.bitmap
    for t in pipe.tables:
        entries = []
        for e in t.entries:
            params = e.params
            if e.action == "subc_mcast" and len(params) == 1 and params[0][0] == "group":  # (most leaves)
                a, p = "subc_msg_fwd", (("ports", bitmap(groups[params[0][1]])),)
            else:
                a, p = message_action(plan, pipe, (e.action, params))
            entries.append(Entry(e.match, a, p, e.priority))
        default = message_action(plan, pipe, t.default_action)
        declared = {_message_action_name(a) for a in t.actions}
        actions = sorted(({e.action for e in entries} | {default[0]} | declared) - {"NoAction"})
        out.append(replace(t, entries=entries, default_action=default, actions=actions))
    plan.message_tables_of = (pipe, out)
    return list(out)


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
