"""The packet parser of the eBPF target, planned from the spec's P4 parser.

The eBPF program parses the network headers natively, in C, so that it can do what a P4 parser
of fixed headers cannot: Ethernet with or without one 802.1Q tag, IPv4 with options (skipped by
IHL; fragments are not parsed), and UDP bounded by its length field.  The spec must reach the
message headers the same way: its ``start`` state extracts an Ethernet header (112 bits) and
selects IPv4 on the EtherType, the IPv4 state (a 160-bit header) selects UDP on the protocol, and
the UDP state (64 bits) selects on the destination port.  Everything after that port select (the
*message states*: MoldUDP64 and ITCH in the example) is translated state by state: a state's
``extract`` statements advance over fixed-size headers, and its ``select`` on one header field,
with constant keysets and ``default``, becomes a chain of comparisons.

Raises :class:`~subc.errors.SubcError` for specs outside this subset (what is unsupported is
named), so the eBPF target never silently parses differently from the P4 targets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...errors import Location, SubcError
from ...spec.const_expr import ConstExprError
from ...spec.parse_graph import ParseGraph
from ...spec.model import ParserState, Spec

ETH_BITS, IPV4_BITS, UDP_BITS = 112, 160, 64
ETHERTYPE_IPV4, IPPROTO_UDP = 0x0800, 17
MAX_EBPF_FIELD_WIDTH = 64


@dataclass(frozen=True)
class FieldLayout:
    """Where a header field lies: ``bit_offset`` from the start of its header, ``width`` in bits."""

    instance: str
    name: str
    bit_offset: int
    width: int

    @property
    def byte_offset(self) -> int:
        return self.bit_offset // 8

    @property
    def n_bytes(self) -> int:
        """Bytes to load to hold the field (1 to 8)."""
        return (self.bit_offset % 8 + self.width + 7) // 8

    @property
    def shift(self) -> int:
        """Right shift that aligns the loaded bytes on the field's last bit."""
        return self.n_bytes * 8 - self.bit_offset % 8 - self.width


@dataclass
class MessageState:
    """A message state: header instances extracted in order, then a select (or a direct transition).

    ``select`` is the field selected on (None: direct); ``cases`` are (value or None for default,
    next state name, 'accept' or 'reject').
    """

    name: str
    extracts: list[str]
    select: FieldLayout | None
    cases: list[tuple[int | None, str]]
    implicit_reject: bool = False


@dataclass
class ParsePlan:
    """What the eBPF parser does (see the module docstring).

    ``eth``, ``ipv4``, ``udp``: the spec's instances of the network headers; ``ports``: (UDP
    destination port, first message state); ``states``: message states, reachable ones only, in
    spec order; ``header_bytes``: size of every instance in bytes; ``bit``: validity bit of every
    instance.
    """

    eth: str
    ipv4: str
    udp: str
    ports: list[tuple[int, str]]
    states: list[MessageState]
    header_bytes: dict[str, int]
    bit: dict[str, int] = field(default_factory=dict)
    layouts: dict[tuple[str, str], FieldLayout] = field(default_factory=dict)
    moldudp64: bool = False
    mold_header: dict[str, list[str]] = field(default_factory=dict)

    def field(self, name: str) -> FieldLayout:
        """Layout of the field ``instance.member``."""
        inst, member = name.split(".", 1)
        return self.layouts[(inst, member)]


def _error(spec: Spec, msg: str, where: Location | None = None) -> SubcError:
    """An error located at ``where`` (a state or transition of the spec), else the spec's first line."""
    return SubcError(f"--target ebpf: {msg}", where or Location.from_line_col(spec.path, spec.text, 1, 1))


def _layouts(spec: Spec) -> tuple[dict[str, int], dict[tuple[str, str], FieldLayout], dict[str, int]]:
    sizes: dict[str, int] = {}
    layouts: dict[tuple[str, str], FieldLayout] = {}
    widths: dict[str, int] = {}
    for inst, tname in spec.instances.items():
        h = spec.headers[tname]
        off = 0
        for fname, w in h.fields:
            if w is None:
                break  # a field of no fixed width: nor has the header
            layouts[(inst, fname)] = FieldLayout(inst, fname, off, w)
            off += w
        else:
            widths[inst] = off
            if off % 8 == 0:
                sizes[inst] = off // 8
    return sizes, layouts, widths


def _keyset(spec: Spec, text: str, where: Location | None = None) -> int | None:
    t = text.strip()
    if t in ("default", "_"):
        return None
    try:
        return spec.constant(t)
    except ConstExprError:
        raise _error(spec, f"unsupported select keyset '{t}' (constants and 'default' only)", where) from None


def _select_field(spec: Spec, st: ParserState, layouts) -> FieldLayout | None:
    sel = st.transition.select_text
    if sel is None:
        return None
    assert spec.parser is not None  # called by plan_parser, which checked
    hdr = spec.parser.hdr
    m = re.fullmatch(rf"{re.escape(hdr)}\s*\.\s*(\w+)\s*\.\s*(\w+)", sel.strip())
    where = st.transition.location or st.location
    if not m or (m.group(1), m.group(2)) not in layouts:
        raise _error(
            spec, f"state '{st.name}': select on '{sel.strip()}' is not supported (one header field only)", where
        )
    fl = layouts[(m.group(1), m.group(2))]
    if fl.width > MAX_EBPF_FIELD_WIDTH or fl.n_bytes > 8:
        raise _error(spec, f"state '{st.name}': select field '{sel.strip()}' is wider than 64 bits", where)
    return fl


def _one_extract(spec: Spec, st: ParserState, bits: int, widths: dict[str, int], what: str) -> str:
    if len(st.extracts) != 1 or widths.get(st.extracts[0]) != bits:
        raise _error(spec, f"state '{st.name}' must extract one {what} header of {bits} bits", st.location)
    return st.extracts[0]


def _case_to(spec: Spec, st: ParserState, value: int, what: str) -> str:
    for keyset, target in st.transition.cases:
        if _keyset(spec, keyset) == value:
            return target
    raise _error(spec, f"state '{st.name}' has no select case for {what} {value:#x}", st.transition.location)


def plan_parser(spec: Spec) -> ParsePlan:
    """Plan the eBPF parser of ``spec`` (see the module docstring); raises SubcError."""
    p = spec.parser
    if p is None or not spec.whole_program:
        raise _error(spec, "the spec needs header declarations and a parser (pragma-only specs are for P4 targets)")
    sizes, layouts, widths = _layouts(spec)
    states = {s.name: s for s in p.states}

    def state(name: str) -> ParserState:
        if name not in states:
            raise _error(spec, f"the parser has no state '{name}'", p.states[0].location if p.states else None)
        return states[name]

    start = state("start")
    hops = 0
    while not start.extracts and start.transition.select_text is None and hops < len(states):
        start = state(start.transition.cases[0][1])  # transition-only states before Ethernet
        hops += 1
    eth = _one_extract(spec, start, ETH_BITS, widths, "Ethernet")
    sel = _select_field(spec, start, layouts)
    if sel is None or (sel.instance, sel.bit_offset, sel.width) != (eth, 96, 16):
        raise _error(spec, f"state '{start.name}' must select on the EtherType", start.location)
    ip_state = state(_case_to(spec, start, ETHERTYPE_IPV4, "EtherType"))
    ipv4 = _one_extract(spec, ip_state, IPV4_BITS, widths, "IPv4")
    sel = _select_field(spec, ip_state, layouts)
    if sel is None or (sel.instance, sel.bit_offset, sel.width) != (ipv4, 72, 8):
        raise _error(spec, f"state '{ip_state.name}' must select on the IPv4 protocol", ip_state.location)
    udp_state = state(_case_to(spec, ip_state, IPPROTO_UDP, "IP protocol"))
    udp = _one_extract(spec, udp_state, UDP_BITS, widths, "UDP")
    sel = _select_field(spec, udp_state, layouts)
    if sel is None or (sel.instance, sel.bit_offset, sel.width) != (udp, 16, 16):
        raise _error(spec, f"state '{udp_state.name}' must select on the UDP destination port", udp_state.location)
    ports = []
    for keyset, target in udp_state.transition.cases:
        v = _keyset(spec, keyset)
        if v is not None and target not in ("accept", "reject"):
            ports.append((v, target))
    if not ports:
        raise _error(spec, f"state '{udp_state.name}' selects no message state on any UDP port", udp_state.location)

    plan = ParsePlan(eth, ipv4, udp, ports, [], {})
    order = [s.name for s in p.states]
    seen: set[str] = set()
    todo = [t for _, t in ports]
    while todo:
        name = todo.pop()
        if name in seen or name in ("accept", "reject"):
            continue
        seen.add(name)
        st = state(name)
        for stmt in st.statements:
            if ".extract(" not in stmt.replace(" ", ""):
                raise _error(
                    spec, f"state '{name}': statement '{stmt.strip()}' is not supported (extract only)", st.location
                )
        for inst in st.extracts:
            if inst not in sizes:
                raise _error(spec, f"state '{name}': header '{inst}' is not a whole number of bytes", st.location)
        todo.extend(t for _, t in st.transition.cases)
    for name in order:
        if name not in seen:
            continue
        st = states[name]
        sel = _select_field(spec, st, layouts)
        cases = [
            (_keyset(spec, k, st.transition.location) if sel is not None else None, t) for k, t in st.transition.cases
        ]
        implicit = sel is not None and all(v is not None for v, _ in cases)
        if implicit:
            cases.append((None, "reject"))  # P4: no matching case is a parser error
        plan.states.append(MessageState(name, list(st.extracts), sel, cases, implicit))
    _check_acyclic(spec, plan)
    for ms in plan.states:
        if ms.select is not None and not any(ms.select.instance in s.extracts for s in plan.states):
            raise _error(spec, f"state '{ms.name}' selects on '{ms.select.instance}', which no message state extracts")
    insts = [eth, ipv4, udp] + [i for s in plan.states for i in s.extracts]
    plan.header_bytes = {i: sizes[i] for i in dict.fromkeys(insts)}
    plan.bit = {i: n for n, i in enumerate(plan.header_bytes)}
    if len(plan.bit) > 32:
        raise _error(spec, "more than 32 header instances")
    plan.layouts = {k: v for k, v in layouts.items() if k[0] in plan.bit}
    _plan_moldudp64(spec, plan, widths)
    return plan


def _plan_moldudp64(spec: Spec, plan: ParsePlan, widths: dict[str, int]) -> None:
    """Mark ``plan`` MoldUDP64-framed when every feed port's entry state is (parse graph's test):
    each message of a datagram is then parsed on its own, from the entry state, and the instances
    that extract the payload's first 160 bits (the MoldUDP64 header) are read from the datagram's
    header (``mold_header``: state -> those of its instances)."""
    graph = ParseGraph(spec)
    if graph.feed() is None:
        return
    framings = {e: graph.moldudp64_framing(e) for e in sorted({s for _, s in plan.ports})}
    if not any(ok for ok, _ in framings.values()):
        return
    if not all(ok for ok, _ in framings.values()):
        assert spec.parser is not None  # called by plan_parser, which checked
        raise _error(
            spec,
            "the feed ports' entry states differ in framing (MoldUDP64 on some ports only)",
            spec.parser.states[0].location if spec.parser.states else None,
        )
    plan.moldudp64 = True
    header: set[str] = set()
    for _, insts in framings.values():
        end = 0
        for inst in insts:
            end += widths[inst]
            if end <= 160:
                header.add(inst)
    for st in plan.states:
        fixed = [i for i in st.extracts if i in header]
        if fixed:
            plan.mold_header[st.name] = fixed


def _check_acyclic(spec: Spec, plan: ParsePlan) -> None:
    nxt = {s.name: [t for _, t in s.cases if t not in ("accept", "reject")] for s in plan.states}
    color: dict[str, int] = {}

    def visit(n: str) -> None:
        color[n] = 1
        for m in nxt.get(n, []):
            if color.get(m) == 1:
                raise _error(spec, f"parser loop through state '{m}' (header stacks are not supported)")
            if m not in color:
                visit(m)
        color[n] = 2

    for n in nxt:
        if n not in color:
            visit(n)


def check_fields(spec: Spec, plan: ParsePlan, fields: list[str]) -> None:
    """Raise SubcError unless every query field in ``fields`` is parsed and at most 64 bits wide."""
    for f in fields:
        q = spec.query_fields[f]
        if q.width > MAX_EBPF_FIELD_WIDTH:
            raise SubcError(
                f"--target ebpf: field '{f}' is {q.width} bits wide; the eBPF target supports fields of up to "
                f"{MAX_EBPF_FIELD_WIDTH} bits",
                q.location,
            )
        if plan.field(f).n_bytes > 8 if q.header in plan.bit else False:
            raise SubcError(f"--target ebpf: field '{f}' spans more than 8 bytes", q.location)
        if q.header not in plan.bit:
            raise SubcError(f"--target ebpf: header '{q.header}' of field '{f}' is never parsed", q.location)
