"""An independent model of random message-format specs, for testing subc's spec front ends and
spec-driven decoders (issue 13: "the spec is the one source of truth").

A :class:`SpecModel` describes a message format the way the Camus specs do: an Ethernet / IPv4 /
UDP prefix, a MoldUDP64 downstream header (session 80 bits, sequence number 64, message count 16)
and the 16-bit length of the first message block, then a *message-type header* (one field of 8 or
16 bits) whose value selects one of 1 to 4 message types; each message type extracts 1 or 2
headers of 1 to 6 fields of 1 to 64 bits at unaligned bit offsets (every header a whole number of
bytes).  A random subset of the message fields are query fields (range, exact or lpm, with or
without a width in the pragma).

From one model this module renders the spec as P4_16 (:func:`render_p4_16`) and as Camus's
P4_14 (:func:`render_p4_14`), and builds the bytes of messages and frames with scapy
(:func:`build_message`, :func:`build_frame`, :func:`binaryfile`), together with the decoded
fields a correct decoder must produce (:func:`reference_fields`, :func:`valid_instances`).

This is a checker: it must not share what it checks, so nothing here imports ``subc``.  Every
rendering choice (names, constant forms, pragma placement, ``latest.f`` or ``inst.f``) is part of
the model, so rendering is a pure function of the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from hypothesis import strategies as st

# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------

#: P4_16 keywords and reserved names (P4_16 Language Specification v1.2.4, section 6.4, and the
#: names of core.p4 / v1model.p4 a spec refers to).
P4_16_RESERVED = frozenset(
    """abstract action actions apply bit bool const control default else entries enum error exit
    extern false header header_union if in inout int key list match_kind package parser out
    priority return select state string struct switch table this transition true tuple type
    typedef value_set varbit verify void accept reject packet_in packet_out NoAction main
    standard_metadata_t V1Switch exact ternary lpm range optional selector""".split()
)

#: P4_14 keywords and reserved names (P4_14 Language Specification v1.0.5) and the primitive
#: actions whose names a front end might treat specially.
P4_14_RESERVED = frozenset(
    """action actions action_profile action_selector algorithm and apply attributes blackbox
    blackbox_type bytes calculated_field control counter current default direct direct_meter
    dynamic_action_selection else exact extract false field_list field_list_calculation fields
    header header_type hit if in input instance_count latest layout length lpm mask max_length
    max_size max_width metadata meter min_size min_width miss not or out output_width packets
    parse_error parser parser_exception parser_value_set payload primitive_action range reads
    register result return saturating select selection_key selection_mode selection_type
    set_metadata signed size static support_timeout table ternary true type update valid verify
    width ingress egress modify_field add_header remove_header copy_header drop no_op count
    set_field_to_hash_index truncate resubmit recirculate clone_ingress_pkt_to_egress
    standard_metadata intrinsic_metadata""".split()
)

#: Names of the rule language and of the P4 parser's parameters in the rendered specs.
OTHER_RESERVED = frozenset(
    """and or not in fwd drop nop hdr meta packet headers metadata standard_metadata latest
    define include ifdef ifndef endif pragma""".split()
)

RESERVED = P4_16_RESERVED | P4_14_RESERVED | OTHER_RESERVED

#: Realistic names mixed into the random ones (market data fields, framing words).
_WORDS = [
    "price", "shares", "stock", "side", "qty", "px", "ts", "seq", "kind", "flags", "attr",
    "symbol", "locate", "tracking", "order_ref", "mpid", "len_", "value", "x", "a1", "msgType",
    "itch", "add_order", "ao", "mold", "session", "data", "hi", "lo", "bits",
]

_ident = st.one_of(
    st.sampled_from(_WORDS),
    st.from_regex(r"[a-z][a-zA-Z0-9_]{0,9}", fullmatch=True),
)


def valid_name(name: str) -> bool:
    """True for a name the model may use: an identifier that is no keyword and no ``subc_`` name."""
    return (
        re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is not None
        and name not in RESERVED
        and not name.startswith("subc_")
        and not name.startswith("_")
    )


def _fresh(draw, used: set[str], base: str | None = None, suffix: str = "") -> str:
    """A name not in ``used`` (added to it): a drawn identifier (or ``base``) plus ``suffix``,
    with a counter appended when taken or reserved."""
    name = (base if base is not None else draw(_ident)) + suffix
    if name.startswith("subc_"):
        name = "m" + name
    cand, k = name, 1
    while cand in used or not valid_name(cand):
        cand = f"{name}_{k}"
        k += 1
    used.add(cand)
    return cand


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldModel:
    name: str
    width_bits: int

    @property
    def max_value(self) -> int:
        return (1 << self.width_bits) - 1


@dataclass
class HeaderModel:
    """A header type (``type_name``) with its one instance (``instance``) and fields in order."""

    type_name: str
    instance: str
    fields: list[FieldModel]

    @property
    def width_bits(self) -> int:
        return sum(f.width_bits for f in self.fields)

    @property
    def width_bytes(self) -> int:
        assert self.width_bits % 8 == 0
        return self.width_bits // 8

    def field(self, name: str) -> FieldModel:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def offsets(self) -> list[tuple[FieldModel, int]]:
        """(field, bit offset from the header's first bit, most significant bit first)."""
        out, off = [], 0
        for f in self.fields:
            out.append((f, off))
            off += f.width_bits
        return out

    def qualified(self) -> list[str]:
        return [f"{self.instance}.{f.name}" for f in self.fields]


@dataclass
class MessageType:
    """A message type: its code in the type field, the headers its parser state extracts (after
    the type header, in order; a header may be shared with another message type), the state's
    name, and how its code is written in a select case: ``dec``, ``hex`` or ``const`` (a named
    constant ``const_name``: ``const bit<W>`` in P4_16, ``#define`` in P4_14)."""

    code: int
    headers: list[HeaderModel]
    state: str = "parse_msg"
    code_style: str = "dec"
    const_name: str | None = None

    @property
    def width_bits(self) -> int:
        return sum(h.width_bits for h in self.headers)


QUERY_PRAGMAS = {"range": "query_field", "exact": "query_field_exact", "lpm": "query_field_lpm"}


@dataclass(frozen=True)
class QueryFieldModel:
    """A query field ``instance.field`` of ``width`` bits with its match kind (``range``,
    ``exact``, ``lpm``); ``explicit_width``: the pragma states the width."""

    instance: str
    field: str
    kind: str
    width: int
    explicit_width: bool

    @property
    def name(self) -> str:
        return f"{self.instance}.{self.field}"

    @property
    def pragma(self) -> str:
        return QUERY_PRAGMAS[self.kind]

    def pragma_line(self) -> str:
        w = f", {self.width}" if self.explicit_width else ""
        return f"@pragma {self.pragma}({self.name}{w})"


@dataclass
class Select:
    """How one framing select is written: the case constant's form (``dec``, ``hex``, ``const``
    with ``const_name``) and, in P4_14, ``latest.f`` (True) or ``inst.f`` (False)."""

    style: str = "hex"
    const_name: str | None = None
    latest: bool = True


@dataclass
class SpecModel:
    """A random message-format spec (see the module docstring).

    ``ethernet``, ``ipv4``, ``udp``: the framing prefix (standard layouts, random names);
    ``mold``: the MoldUDP64 downstream header (session 80, seq 64, count 16); ``mold_msg``: the
    first message block's 16-bit length; ``type_header``: one field of 8 or 16 bits selecting
    among ``messages``.  ``start_state``: the parser begins with a transition-only ``start``
    state (otherwise the Ethernet state is ``start``).  The rest are rendering choices."""

    udp_port: int
    ethernet: HeaderModel
    ipv4: HeaderModel
    udp: HeaderModel
    mold: HeaderModel
    mold_msg: HeaderModel
    type_header: HeaderModel
    messages: list[MessageType]
    query_fields: list[QueryFieldModel]
    start_state: bool = False
    parser_name: str = "P"
    states: dict[str, str] = field(default_factory=dict)  # role (eth/ipv4/udp/mold) -> name
    selects: dict[str, Select] = field(default_factory=dict)  # role (eth/ipv4/udp/type) -> form
    pragma_placement: str = "middle"  # top | middle | bottom | inline
    default_action: str | None = None  # None, "drop" or "nop": a query_default_action pragma
    hex_upper: bool = False
    p4_14_controls: bool = False  # an empty `control ingress { }` after the P4_14 parser

    # -- derived ----------------------------------------------------------------------------
    @property
    def type_field(self) -> FieldModel:
        return self.type_header.fields[0]

    @property
    def type_width(self) -> int:
        return self.type_field.width_bits

    @property
    def codes(self) -> list[int]:
        return [m.code for m in self.messages]

    def message(self, code: int) -> MessageType | None:
        for m in self.messages:
            if m.code == code:
                return m
        return None

    @property
    def framing(self) -> list[HeaderModel]:
        return [self.ethernet, self.ipv4, self.udp, self.mold, self.mold_msg]

    @property
    def message_headers(self) -> list[HeaderModel]:
        """Distinct headers of all message types, in order of first extraction."""
        out: list[HeaderModel] = []
        seen: set[str] = set()
        for m in self.messages:
            for h in m.headers:
                if h.instance not in seen:
                    seen.add(h.instance)
                    out.append(h)
        return out

    @property
    def headers(self) -> list[HeaderModel]:
        """Every header instance, in the order of the headers struct."""
        return self.framing + [self.type_header] + self.message_headers

    def header(self, instance: str) -> HeaderModel:
        for h in self.headers:
            if h.instance == instance:
                return h
        raise KeyError(instance)

    def field_width(self, qualified: str) -> int:
        inst, f = qualified.split(".", 1)
        return self.header(inst).field(f).width_bits

    @property
    def query_names(self) -> list[str]:
        return [q.name for q in self.query_fields]


# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------

_WIDTHS = [1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 15, 16, 17, 24, 31, 32, 33, 40, 48, 63, 64]
_width = st.one_of(st.sampled_from(_WIDTHS), st.integers(1, 64))

# Standard layouts; field names chosen among common spellings.
_ETH = [(("dstAddr", "dst_addr", "dmac", "dst"), 48), (("srcAddr", "src_addr", "smac", "src"), 48),
        (("etherType", "ether_type", "ethType"), 16)]
_IPV4 = [(("version",), 4), (("ihl",), 4), (("diffserv", "tos", "dscp_ecn"), 8),
         (("totalLen", "total_len"), 16), (("identification", "ident"), 16), (("flags", "frag_flags"), 3),
         (("fragOffset", "frag_offset"), 13), (("ttl",), 8), (("protocol", "proto"), 8),
         (("hdrChecksum", "hdr_checksum", "csum"), 16), (("srcAddr", "src_addr", "src"), 32),
         (("dstAddr", "dst_addr", "dst"), 32)]
_UDP = [(("srcPort", "src_port", "sport"), 16), (("dstPort", "dst_port", "dport"), 16),
        (("length_", "len", "udp_len", "hdr_length"), 16), (("checksum", "csum"), 16)]
_MOLD = [(("session", "session_id", "sess"), 80), (("seq", "sequence", "seq_num"), 64),
         (("msg_cnt", "msg_count", "n_msgs"), 16)]
_MOLD_MSG = [(("msg_len", "message_length", "len_"), 16)]


@st.composite
def _std_header(draw, used: set[str], layout, bases) -> HeaderModel:
    inst = _fresh(draw, used, draw(st.sampled_from(bases)) if draw(st.booleans()) else None)
    tname = _fresh(draw, used, inst, "_t")
    fields = [FieldModel(draw(st.sampled_from(names)), w) for names, w in layout]
    return HeaderModel(tname, inst, fields)


@st.composite
def _message_header(draw, used: set[str]) -> HeaderModel:
    inst = _fresh(draw, used)
    tname = _fresh(draw, used, draw(_ident) if draw(st.booleans()) else inst, "_t")
    n = draw(st.integers(1, 6))
    fnames: set[str] = set()
    widths = [draw(_width) for _ in range(n)]
    pad = -sum(widths) % 8
    if pad:
        if n < 6 and draw(st.booleans()):
            widths.append(pad)  # a final padding field
        elif widths[-1] + pad <= 64:
            widths[-1] += pad
        else:
            widths[-1] -= 8 - pad
    fields = [FieldModel(_fresh(draw, fnames), w) for w in widths]
    h = HeaderModel(tname, inst, fields)
    assert h.width_bits % 8 == 0 and 1 <= len(fields) <= 6
    return h


def _interesting(width: int):
    top = (1 << width) - 1
    edges = sorted(v for v in {0, 1, 2, top, top - 1, top >> 1, (top >> 1) + 1, 0x41, 0x46} if 0 <= v <= top)
    return st.sampled_from(edges)


@st.composite
def _select(draw, used_consts: set[str], base: str, styles=("dec", "hex", "const")) -> Select:
    style = draw(st.sampled_from(styles))
    name = None
    if style == "const":
        name = base
        k = 1
        while name in used_consts:
            name = f"{base}_{k}"
            k += 1
        used_consts.add(name)
    return Select(style, name, draw(st.booleans()))


@st.composite
def spec_models(draw, max_messages: int = 4) -> SpecModel:
    """A random :class:`SpecModel` (see the module docstring)."""
    used: set[str] = set()
    consts: set[str] = set()
    eth = draw(_std_header(used, _ETH, ["ethernet", "eth", "l2"]))
    ipv4 = draw(_std_header(used, _IPV4, ["ipv4", "ip", "l3"]))
    udp = draw(_std_header(used, _UDP, ["udp", "l4"]))
    mold = draw(_std_header(used, _MOLD, ["mold", "moldudp", "mold_hdr"]))
    mold_msg = draw(_std_header(used, _MOLD_MSG, ["mold_msg", "moldudp_msg", "block"]))
    type_inst = _fresh(draw, used, draw(st.sampled_from(["itch_msg_type", "kind", "msg"])) if draw(st.booleans()) else None)
    type_tname = _fresh(draw, used, type_inst, "_t")
    tname = draw(st.sampled_from(["kind", "msg_type", "msgType", type_inst])) if draw(st.booleans()) else _fresh(draw, set())
    type_header = HeaderModel(type_tname, type_inst, [FieldModel(tname, draw(st.sampled_from([8, 16])))])
    tw = type_header.fields[0].width_bits

    n_types = draw(st.integers(1, max_messages))
    codes = draw(
        st.lists(st.one_of(_interesting(tw), st.integers(0, (1 << tw) - 1)), min_size=n_types, max_size=n_types, unique=True)
    )
    messages: list[MessageType] = []
    pool: list[HeaderModel] = []
    for code in codes:
        hs: list[HeaderModel] = []
        for _ in range(draw(st.integers(1, 2))):
            if pool and draw(st.integers(0, 3)) == 0:
                h = draw(st.sampled_from(pool))  # shared with an earlier message type
                if h in hs:
                    continue
            else:
                h = draw(_message_header(used))
                pool.append(h)
            hs.append(h)
        state = _fresh(draw, used, "parse_" + draw(_ident))
        sel = draw(_select(consts, f"MSG_{state.upper()}"))
        messages.append(MessageType(code, hs, state, sel.style, sel.const_name))

    # query fields: the type field and message fields (all <= 64 bits)
    cands = [(type_header.instance, type_header.fields[0])] + [
        (h.instance, f) for h in pool for f in h.fields
    ]
    chosen = draw(st.lists(st.sampled_from(range(len(cands))), min_size=1, max_size=min(6, len(cands)), unique=True))
    queries = []
    for i in chosen:
        inst, f = cands[i]
        queries.append(QueryFieldModel(inst, f.name, draw(st.sampled_from(["range", "exact", "lpm"])),
                                       f.width_bits, draw(st.booleans())))

    start_state = draw(st.booleans())
    states = {}
    for role in ("eth", "ipv4", "udp", "mold"):
        if role == "eth" and not start_state:
            states[role] = "start"
        else:
            states[role] = _fresh(draw, used, "parse_" + draw(_ident))
    selects = {
        "eth": draw(_select(consts, "ETHERTYPE_IPV4")),
        "ipv4": draw(_select(consts, "IP_PROTO_UDP")),
        "udp": draw(_select(consts, "MSG_UDP_PORT")),
        "type": Select(latest=draw(st.booleans())),
    }
    return SpecModel(
        udp_port=draw(st.one_of(st.sampled_from([1234, 26400, 0x8000, 65535, 1]), st.integers(1, 65535))),
        ethernet=eth, ipv4=ipv4, udp=udp, mold=mold, mold_msg=mold_msg, type_header=type_header,
        messages=messages, query_fields=queries, start_state=start_state,
        parser_name=_fresh(draw, used, draw(st.sampled_from(["P", "MyParser", "ItchParser"])) if draw(st.booleans()) else None),
        states=states, selects=selects,
        pragma_placement=draw(st.sampled_from(["top", "middle", "bottom", "inline"])),
        default_action=draw(st.sampled_from([None, "drop", "nop"])),
        hex_upper=draw(st.booleans()),
        p4_14_controls=draw(st.booleans()),
    )


@st.composite
def messages_for(draw, model: SpecModel, allow_unknown: bool = False):
    """A (code, values) pair: a message type's code (or, with ``allow_unknown``, sometimes a code
    no message type has) and a value for every field of its headers (``instance.field`` -> raw
    integer), on and around interesting bounds (0, 1, the maximum, the middle) or random."""
    codes = model.codes
    if allow_unknown and len(codes) < (1 << model.type_width) and draw(st.integers(0, 4)) == 0:
        code = draw(st.integers(0, (1 << model.type_width) - 1).filter(lambda c: c not in codes))
    else:
        code = draw(st.sampled_from(codes))
    values: dict[str, int] = {}
    m = model.message(code)
    for h in m.headers if m else []:
        for f in h.fields:
            values[f"{h.instance}.{f.name}"] = draw(st.one_of(_interesting(f.width_bits), st.integers(0, f.max_value)))
    return code, values


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def _hex(model: SpecModel, v: int, digits: int = 0) -> str:
    s = f"{v:0{digits}x}"
    return "0x" + (s.upper() if model.hex_upper else s)


def _case(model: SpecModel, sel_style: str, const: str | None, v: int) -> str:
    if sel_style == "const":
        return const
    if sel_style == "hex":
        return _hex(model, v)
    return str(v)


def _framing_cases(model: SpecModel):
    """(role, header, field name, value, next role) of the three framing selects."""
    return [
        ("eth", model.ethernet, model.ethernet.fields[2].name, 0x0800, "ipv4"),
        ("ipv4", model.ipv4, model.ipv4.fields[8].name, 17, "udp"),
        ("udp", model.udp, model.udp.fields[1].name, model.udp_port, "mold"),
    ]


def _const_decls(model: SpecModel):
    """(name, width, value) of the named constants the spec declares."""
    out = []
    for role, h, fname, v, _ in _framing_cases(model):
        sel = model.selects[role]
        if sel.style == "const":
            out.append((sel.const_name, h.field(fname).width_bits, v))
    for m in model.messages:
        if m.code_style == "const":
            out.append((m.const_name, model.type_width, m.code))
    return out


def _pragmas(model: SpecModel) -> list[str]:
    lines = [q.pragma_line() for q in model.query_fields]
    if model.default_action:
        lines.append(f"@pragma query_default_action({model.default_action})")
    return lines


def render_p4_16(model: SpecModel) -> str:
    """The model as a P4_16 spec (headers, headers struct, empty metadata struct, pragmas and a
    parser), in the shape of ``examples/itch/spec.p4``."""
    out: list[str] = [
        "/* A random message-format spec (tests/spec_model.py), P4_16 form. */",
        "#include <core.p4>",
        "",
    ]
    pragmas = _pragmas(model)
    for name, w, v in _const_decls(model):
        out.append(f"const bit<{w}> {name} = {_hex(model, v)};")
    out.append("")
    if model.pragma_placement == "top":
        out += pragmas + [""]
    for h in model.headers:
        out.append(f"header {h.type_name} {{")
        out += [f"    bit<{f.width_bits}> {f.name};" for f in h.fields]
        out += ["}", ""]
    if model.pragma_placement == "inline":
        out += pragmas
    out.append("struct headers {")
    out += [f"    {h.type_name} {h.instance};" for h in model.headers]
    out += ["}", "", "struct metadata {", "}", ""]
    if model.pragma_placement == "middle":
        out += pragmas + [""]
    out.append(
        f"parser {model.parser_name}(packet_in packet,\n"
        f"         out headers hdr,\n"
        f"         inout metadata meta,\n"
        f"         inout standard_metadata_t standard_metadata) {{"
    )
    st_ = model.states
    if model.start_state:
        out += ["    state start {", f"        transition {st_['eth']};", "    }", ""]
    for role, h, fname, v, nxt in _framing_cases(model):
        sel = model.selects[role]
        out += [
            f"    state {st_[role]} {{",
            f"        packet.extract(hdr.{h.instance});",
            f"        transition select(hdr.{h.instance}.{fname}) {{",
            f"            {_case(model, sel.style, sel.const_name, v)}: {st_[nxt]};",
            "            default: accept;",
            "        }",
            "    }",
            "",
        ]
    th = model.type_header
    out += [f"    state {st_['mold']} {{"]
    out += [f"        packet.extract(hdr.{h.instance});" for h in (model.mold, model.mold_msg, th)]
    out.append(f"        transition select(hdr.{th.instance}.{model.type_field.name}) {{")
    for m in model.messages:
        out.append(f"            {_case(model, m.code_style, m.const_name, m.code)}: {m.state};")
    out += ["            default: accept;", "        }", "    }"]
    for m in model.messages:
        out += ["", f"    state {m.state} {{"]
        out += [f"        packet.extract(hdr.{h.instance});" for h in m.headers]
        out += ["        transition accept;", "    }"]
    out.append("}")
    if model.pragma_placement == "bottom":
        out += [""] + pragmas
    return "\n".join(out) + "\n"


def render_p4_14(model: SpecModel) -> str:
    """The model as a P4_14 spec in Camus's form: ``header_type`` declarations, ``header``
    instances, ``#define`` constants, pragmas and parser functions returning ``ingress``."""
    out: list[str] = ["/* A random message-format spec (tests/spec_model.py), P4_14 form. */", ""]
    pragmas = _pragmas(model)
    for name, _w, v in _const_decls(model):
        out.append(f"#define {name} {_hex(model, v)}")
    out.append("")
    if model.pragma_placement == "top":
        out += pragmas + [""]
    for h in model.headers:
        out += [f"header_type {h.type_name} {{", "    fields {"]
        out += [f"        {f.name} : {f.width_bits};" for f in h.fields]
        out += ["    }", "}", ""]
    by_inst: dict[str, list[str]] = {}
    for q in model.query_fields:
        by_inst.setdefault(q.instance, []).append(q.pragma_line())
    for h in model.headers:
        if model.pragma_placement == "inline":
            out += by_inst.get(h.instance, [])
        out.append(f"header {h.type_name} {h.instance};")
    out.append("")
    if model.pragma_placement == "inline" and model.default_action:
        out += [pragmas[-1], ""]
    if model.pragma_placement == "middle":
        out += pragmas + [""]
    st_ = model.states
    if model.start_state:
        out += ["parser start {", f"    return {st_['eth']};", "}", ""]
    for role, h, fname, v, nxt in _framing_cases(model):
        sel = model.selects[role]
        ref = f"latest.{fname}" if sel.latest else f"{h.instance}.{fname}"
        out += [
            f"parser {st_[role]} {{",
            f"    extract({h.instance});",
            f"    return select({ref}) {{",
            f"        {_case(model, sel.style, sel.const_name, v)} : {st_[nxt]};",
            "        default : ingress;",
            "    }",
            "}",
            "",
        ]
    th = model.type_header
    out.append(f"parser {st_['mold']} {{")
    out += [f"    extract({h.instance});" for h in (model.mold, model.mold_msg, th)]
    ref = f"latest.{model.type_field.name}" if model.selects["type"].latest else f"{th.instance}.{model.type_field.name}"
    out.append(f"    return select({ref}) {{")
    for m in model.messages:
        out.append(f"        {_case(model, m.code_style, m.const_name, m.code)} : {m.state};")
    out += ["        default : ingress;", "    }", "}"]
    for m in model.messages:
        out += ["", f"parser {m.state} {{"]
        out += [f"    extract({h.instance});" for h in m.headers]
        out += ["    return ingress;", "}"]
    if model.p4_14_controls:
        out += ["", "control ingress {", "}"]
    if model.pragma_placement == "bottom":
        out += [""] + pragmas
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# Bytes (scapy)
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def _scapy_header_class(widths: tuple[int, ...]):
    """A scapy Packet class with one BitField per width (fields f0, f1, ...: scapy's own
    attribute names never clash with the model's field names)."""
    from scapy.fields import BitField
    from scapy.packet import Packet

    name = "SpecModelHeader_" + "_".join(map(str, widths))
    return type(name, (Packet,), {"name": name, "fields_desc": [BitField(f"f{i}", 0, w) for i, w in enumerate(widths)]})


def _header_bytes(h: HeaderModel, values: dict[str, int]) -> bytes:
    cls = _scapy_header_class(tuple(f.width_bits for f in h.fields))
    pkt = cls()
    for i, f in enumerate(h.fields):
        pkt.setfieldval(f"f{i}", values.get(f"{h.instance}.{f.name}", 0) & f.max_value)
    data = bytes(pkt)
    assert len(data) == h.width_bytes
    return data


def build_message(model: SpecModel, code: int, values: dict[str, int]) -> bytes:
    """The bytes of one message: the type field (``code``) then the headers of its message type
    (none for an unknown code), each field's raw value from ``values`` (``instance.field``; 0
    when absent)."""
    data = _header_bytes(model.type_header, {f"{model.type_header.instance}.{model.type_field.name}": code})
    m = model.message(code)
    for h in m.headers if m else []:
        data += _header_bytes(h, values)
    return data


def message_length(model: SpecModel, code: int) -> int:
    """Bytes of a message of type ``code`` (type field included)."""
    m = model.message(code)
    return model.type_width // 8 + (m.width_bits // 8 if m else 0)


def moldudp64_payload(messages: list[bytes], session: bytes = b"SESSION001", seq: int = 1) -> bytes:
    """A MoldUDP64 downstream packet: session (10 bytes, space padded), sequence number of the
    first message, message count, then each message block (2-byte big-endian length, bytes)."""
    sess = session[:10].ljust(10, b" ")
    out = sess + seq.to_bytes(8, "big") + len(messages).to_bytes(2, "big")
    for m in messages:
        out += len(m).to_bytes(2, "big") + m
    return out


def build_frame(
    model: SpecModel,
    message_values: list[tuple[int, dict[str, int]]],
    session: bytes = b"SESSION001",
    seq: int = 1,
    dst_port: int | None = None,
) -> bytes:
    """An Ethernet / IPv4 / UDP frame (scapy) to ``dst_port`` (the model's port by default)
    whose payload is a MoldUDP64 packet carrying the messages ``[(code, values), ...]``."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    msgs = [build_message(model, code, values) for code, values in message_values]
    payload = moldudp64_payload(msgs, session, seq)
    port = model.udp_port if dst_port is None else dst_port
    frame = (
        Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01")
        / IP(src="10.0.0.1", dst="10.0.0.2", ttl=64)
        / UDP(sport=40000, dport=port)
        / Raw(payload)
    )
    return bytes(frame)


def binaryfile(messages: list[bytes]) -> bytes:
    """An ITCH-style BinaryFILE: each message preceded by its 2-byte big-endian length."""
    return b"".join(len(m).to_bytes(2, "big") + m for m in messages)


# --------------------------------------------------------------------------------------------
# What a correct decoder produces
# --------------------------------------------------------------------------------------------


def valid_instances(model: SpecModel, code: int, framing: bool = False) -> list[str]:
    """Header instances valid after parsing a message of type ``code`` (the type header, then the
    message type's headers; none of them for an unknown code); with ``framing``, the Ethernet,
    IPv4, UDP and MoldUDP64 instances first (as after parsing a whole frame)."""
    out = [h.instance for h in model.framing] if framing else []
    out.append(model.type_header.instance)
    m = model.message(code)
    for h in m.headers if m else []:
        out.append(h.instance)
    return out


def reference_fields(model: SpecModel, code: int, values: dict[str, int]) -> dict[str, int]:
    """``instance.field`` -> raw value of every field of the valid message headers (the type
    field and the message type's headers) for a message built by :func:`build_message`."""
    th = model.type_header
    out = {f"{th.instance}.{model.type_field.name}": code & model.type_field.max_value}
    m = model.message(code)
    for h in m.headers if m else []:
        for f in h.fields:
            k = f"{h.instance}.{f.name}"
            out[k] = values.get(k, 0) & f.max_value
    return out


__all__ = [
    "FieldModel", "HeaderModel", "MessageType", "QueryFieldModel", "Select", "SpecModel",
    "spec_models", "messages_for", "render_p4_16", "render_p4_14", "build_message",
    "build_frame", "binaryfile", "moldudp64_payload", "message_length", "reference_fields",
    "valid_instances", "valid_name", "RESERVED",
]
