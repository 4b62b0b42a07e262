"""Binary layouts of the eBPF target's BPF map keys and values, shared by C and Python.

One description per struct gives both the C declaration rendered into ``subc_filter.bpf.c`` and
the byte packing the loader writes into the maps, so the two cannot drift apart.  Fields are
naturally aligned with explicit padding; ``u*`` fields are in host byte order (what the program
compares), ``be*`` fields in network byte order (packet words and LPM trie data, which the
kernel matches most significant bit first).

States in map keys carry the *generation* bit (bit 31, :data:`GEN_BIT`): a rule-set update
writes the new generation's entries next to the old ones and switches the one root entry last.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass, field
from typing import Any

GEN_BIT = 1 << 31
STATE_MASK = GEN_BIT - 1
META_MAGIC = 0x53554243  # 'SUBC'

#: ``struct subc_leaf.flags``: the leaf's messages also go to the local stack.
LEAF_PASS_LOCAL = 1
#: Subscriber ids are ``fwd()`` ports 0..511; a leaf's subscribers are a 512-bit set of 8 words.
SUB_WORDS = 8
MAX_SUBSCRIBERS = 64 * SUB_WORDS
#: Recipient index of the local stack (its sequence number and counters follow the subscribers').
LOCAL = MAX_SUBSCRIBERS
RECIPIENTS = MAX_SUBSCRIBERS + 1
#: Leaf state of a message that is delivered to no one (the spec's parser rejects it, or its length
#: differs from its type's): never a key of ``subc_leaf``.
UNDECODED = 0xFFFFFFFF

#: Global counters (``subc_stats`` index -> name), in order.  Datagram counters unless "messages".
STATS = [
    "rx",  # frames seen by XDP
    "not_ours",  # passed to the stack untouched: not IPv4/UDP to a spec port, or a fragment
    "malformed",  # UDP to a spec port with a bad length or MoldUDP64 framing: dropped
    "too_big",  # beyond the broker's limits (messages or payload bytes): passed whole to the local stack
    "heartbeats",  # heartbeats and end-of-session datagrams (copied to every recipient)
    "messages",  # messages classified
    "undecoded",  # messages the spec's parser rejects, or whose length differs from their type's: sent nowhere
    "truncated",  # (datagram = one message) message headers run past the payload: default action
    "no_match",  # messages no rule matched: default action
    "dropped",  # datagrams none of whose messages goes anywhere
    "xdp_unicast",  # copies sent from XDP to a datagram's one recipient (whole, or its messages repacked in place)
    "to_tc",  # datagrams handed to TC to build copies
    "tc_packets",  # datagrams TC built copies of
    "tc_clones",  # copies TC sent (bpf_clone_redirect; the datagram's last copy by bpf_redirect)
    "passed_local",  # copies passed to the local stack
    "stale",  # a leaf of a retired generation (its message is sent nowhere)
    "slot_lost",  # TC found XDP's results for the datagram overwritten: dropped
    "fanout_overflow",  # recipients of one datagram beyond the program's limit: their copies not sent
    "errors",  # rewrite, resize or redirect failures
    "to_fan",  # datagrams fanned out from XDP through the devmap (copies built by the egress programs)
    "fan_copies",  # copies the devmap egress programs built and sent
    "fan_skipped",  # ALL-broadcast clones dropped in egress (their endpoint was no recipient)
    "fan_set_miss",  # datagrams whose recipients span interfaces with no recipient-set map yet (noted for subc fanout)
    "to_fan_set",  # datagrams fanned out through their exact recipient-set map (installed by subc fanout)
    "journal_lost",  # copies sent but not journaled: the journal's ring buffer was full (subc load --journal)
    "fenced",  # datagrams that reached a fenced broker (subc serve --cluster past its lease): journaled, not sent
]

_SIZES = {"u8": 1, "u16": 2, "u32": 4, "u64": 8, "be16": 2, "be32": 4, "be64": 8, "pad": 1}
_CTYPES = {
    "u8": "__u8",
    "u16": "__u16",
    "u32": "__u32",
    "u64": "__u64",
    "be16": "__be16",
    "be32": "__be32",
    "be64": "__be64",
    "pad": "__u8",
}


@dataclass(frozen=True)
class Struct:
    """A C struct: ``fields`` are (name, kind, count) with kind in u8/u16/u32/u64/be16/be32/be64/pad."""

    name: str
    fields: tuple[tuple[str, str, int], ...]
    #: the compiled packers (:func:`_compile`), set by ``__post_init__``
    _packer: list[tuple[struct.Struct, list]] = field(init=False, repr=False, compare=False)

    @property
    def size(self) -> int:
        """Size in bytes (a multiple of the largest member's alignment)."""
        off, align = 0, 1
        for _, kind, count in self.fields:
            a = _SIZES[kind]
            assert off % a == 0, f"{self.name}: misaligned field"
            off += a * count
            align = max(align, a)
        assert off % align == 0, f"{self.name}: size not a multiple of its alignment"
        return off

    def reader(self, name: str):
        """A fast function from a struct's bytes to the value of its scalar integer field ``name``
        (what :meth:`unpack` gives for it, without decoding the other fields).  KeyError for a
        field it does not have, ValueError for an array or padding."""
        off = 0
        for fname, kind, count in self.fields:
            if fname == name:
                if count != 1 or kind == "pad":
                    raise ValueError(f"{self.name}.{name}: not a scalar integer field")
                fmt = (">" if kind.startswith("be") else "=") + {1: "B", 2: "H", 4: "I", 8: "Q"}[_SIZES[kind]]
                st, at = struct.Struct(fmt), off
                return lambda data: st.unpack_from(data, at)[0]
            off += _SIZES[kind] * count
        raise KeyError(f"{self.name} has no field {name}")

    def c_decl(self) -> str:
        """The C declaration."""
        self.size  # noqa: B018 - checks alignment
        lines = [f"struct {self.name} {{"]
        for name, kind, count in self.fields:
            suffix = f"[{count}]" if count > 1 else ""
            lines.append(f"    {_CTYPES[kind]} {name}{suffix};")
        lines.append("};")
        return "\n".join(lines)

    def __post_init__(self):
        object.__setattr__(self, "_packer", _compile(self.fields))

    def pack(self, **values) -> bytes:
        """Bytes of a struct with ``values`` by field name (missing: 0; arrays: bytes or list of ints).

        Raises ValueError for a value that does not fit its field.
        """
        segments = self._packer
        try:
            if len(segments) == 1:
                st, plan = segments[0]
                return st.pack(*_args(plan, values))
            return b"".join(st.pack(*_args(plan, values)) for st, plan in segments)
        except (struct.error, TypeError, ValueError, IndexError):
            return self._pack_checked(values)  # the error names the field (or it was a corner case)

    def packer(self):
        """A fast packing function of this struct taking every field's value positionally, in
        field order, arrays spread out (``BOUND.packer()(lo, next, 0)``): ``struct.Struct.pack``
        (raises struct.error for a value that does not fit).  ValueError for structs with fields
        in both byte orders or with byte arrays."""
        segments = self._packer
        if len(segments) != 1 or any(how == 1 for _, how, _ in segments[0][1]):
            raise ValueError(f"{self.name}: no positional packer (byte arrays or mixed byte orders)")
        return segments[0][0].pack

    def _pack_checked(self, values: dict) -> bytes:
        """:meth:`pack`, field by field (the reference for the compiled packers)."""
        out = bytearray()
        for name, kind, count in self.fields:
            v = values.get(name, 0)
            size = _SIZES[kind]
            order = "big" if kind.startswith("be") else sys.byteorder
            if count == 1 and kind != "pad":
                if isinstance(v, (list, tuple)):  # an array of one element
                    v = v[0] if v else 0
                out += int(v).to_bytes(size, order)
            elif kind in ("u8", "pad"):
                b = bytes(v) if v else bytes(count)
                if len(b) != count:
                    raise ValueError(f"{self.name}.{name}: {len(b)} bytes, expected {count}")
                out += b
            else:
                items = list(v or [])
                if len(items) > count:
                    raise ValueError(f"{self.name}.{name}: {len(items)} items, at most {count}")
                for x in items + [0] * (count - len(items)):
                    out += int(x).to_bytes(size, order)
        return bytes(out)

    def unpack(self, data: bytes) -> dict:
        """Field values of ``data`` (arrays as lists, u8 arrays as bytes)."""
        res: dict[str, Any] = {}
        off = 0
        for name, kind, count in self.fields:
            size = _SIZES[kind]
            order = "big" if kind.startswith("be") else sys.byteorder
            if kind == "pad" or (kind == "u8" and count > 1):
                res[name] = bytes(data[off : off + count])
                off += count
            elif count == 1:
                res[name] = int.from_bytes(data[off : off + size], order)
                off += size
            else:
                res[name] = [int.from_bytes(data[off + i * size : off + (i + 1) * size], order) for i in range(count)]
                off += size * count
        return res

    def as_json(self) -> dict:
        return {
            "struct": self.name,
            "size": self.size,
            "fields": [{"name": n, "type": k, "count": c} for n, k, c in self.fields],
        }


_CODES = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "be16": "H", "be32": "I", "be64": "Q"}


def _compile(fields: tuple[tuple[str, str, int], ...]) -> list[tuple[struct.Struct, list]]:
    """Packers of ``fields``: segments of consecutive fields in one byte order, each a
    :class:`struct.Struct` with its plan ((name, how, count): 0 a scalar, 1 bytes, 2 an array)."""
    segments: list[tuple[str | None, list[str], list]] = []
    for name, kind, count in fields:
        if kind == "pad" or (kind == "u8" and count > 1):
            order, code, how = None, f"{count}s", 1
        else:
            order = ">" if kind.startswith("be") else "="
            code = f"{count}{_CODES[kind]}" if count > 1 else _CODES[kind]
            how = 2 if count > 1 else 0
        if not segments or (order is not None and segments[-1][0] not in (None, order)):
            segments.append((order, [], []))
        seg = segments[-1]
        if seg[0] is None and order is not None:
            segments[-1] = seg = (order, seg[1], seg[2])
        seg[1].append(code)
        seg[2].append((name, how, count))
    return [(struct.Struct((order or "=") + "".join(codes)), plan) for order, codes, plan in segments]


def _args(plan: list, values: dict) -> list:
    """The arguments of a compiled packer for ``values`` (raises ValueError or IndexError where
    :meth:`Struct._pack_checked` would raise or convert differently)."""
    args: list = []
    for name, how, count in plan:
        v = values.get(name, 0)
        if how == 0:
            args.append(v if v.__class__ is int else int(v))
        elif how == 1:
            b = bytes(v) if v else bytes(count)
            if len(b) != count:
                raise ValueError(name)
            args.append(b)
        else:
            items = list(v) if v else []
            if len(items) > count:
                raise ValueError(name)
            args.extend(items)
            args.extend([0] * (count - len(items)))
    return args


U32 = Struct("u32", (("v", "u32", 1),))
U64 = Struct("u64", (("v", "u64", 1),))
INFO = Struct("subc_info", (("a", "u32", 1), ("b", "u32", 1)))
BOUND = Struct("subc_bound", (("lo", "u64", 1), ("next", "u32", 1), ("pad", "u32", 1)))
EXACT_KEY = Struct("subc_exact_key", (("state", "u32", 1), ("pad", "u32", 1), ("value", "u64", 1)))
LPM_KEY = Struct("subc_lpm_key", (("prefixlen", "u32", 1), ("state", "be32", 1), ("value", "be64", 1)))
#: ``struct subc_leaf`` (``subc_leaf``, an array indexed by the leaf's slot:
#: :func:`subc.dataplane.ebpf.install.state_slot`).  ``set``: index of the leaf's subscriber set in
#: ``subc_leaf_set`` (an array map, so that the copy builders test a message's recipients with an
#: array lookup): the leaf's own slot.
LEAF = Struct(
    "subc_leaf",
    (("flags", "u32", 1), ("nsubs", "u32", 1), ("sub", "u32", 1), ("set", "u32", 1), ("subs", "u64", SUB_WORDS)),
)
SUBSET = Struct("subc_set", (("subs", "u64", SUB_WORDS), ("local", "u32", 1), ("pad", "u32", 1)))
ENDPOINT = Struct(
    "subc_endpoint",
    (
        ("ifindex", "u32", 1),
        ("subscriber", "u32", 1),
        ("saddr", "be32", 1),
        ("daddr", "be32", 1),
        ("dport", "be16", 1),
        ("smac", "u8", 6),
        ("dmac", "u8", 6),
        ("group", "u16", 1),
    ),
)
COUNTER = Struct("subc_counter", (("messages", "u64", 1), ("bytes", "u64", 1)))
SUB_COUNTER = Struct("subc_sub_counter", (("datagrams", "u64", 1), ("messages", "u64", 1), ("bytes", "u64", 1)))
#: XDP metadata of a datagram handed on (to TC, or to the fan-out's devmap egress programs): ``mode``
#: is one of the ``FAN_*`` values (0: TC builds the copies).
META = Struct("subc_meta", (("magic", "u32", 1), ("slot", "u32", 1), ("tag", "u32", 1), ("mode", "u32", 1)))
#: Fan-out modes (``subc_meta.mode``): a clone serves the datagram's next recipient endpoint on its
#: interface (``FAN_LIST``), or the interface's next endpoint when that is a recipient (``FAN_ALL``),
#: or the datagram's next recipient endpoint on the clone's interface, over a map holding one entry
#: per recipient endpoint, on several interfaces (``FAN_SET``).
FAN_TC, FAN_LIST, FAN_ALL, FAN_SET = 0, 1, 2, 3
#: Endpoints a broker can fan out to from XDP (more: copies are built in TC), and interfaces.
FAN_SLOTS = 64
#: Recipient-set device maps (``FAN_SET``) a broker holds at once (``subc fanout`` installs them).
FAN_SETS = 4096
#: Recipient sets without a map that XDP notes for ``subc fanout`` (``subc_fan_miss``) at once.
FAN_MISSES = 256
#: ``subc_fan_cfg``: endpoints (0: fan-out off), the ALL map's index in ``subc_fan`` (or
#: ``NO_FAN``), and the largest endpoints-per-recipient ratio for which an ALL broadcast (a clone
#: per endpoint, non-recipients dropped in egress) is preferred to TC copies.
FAN_CFG = Struct("subc_fan_cfg", (("n_eps", "u32", 1), ("all", "u32", 1), ("ratio", "u32", 1), ("pad", "u32", 1)))
NO_FAN = 0xFFFFFFFF


def sub_struct(max_endpoints: int) -> Struct:
    """``struct subc_sub``: a subscriber's endpoint indexes (``count`` of ``max_endpoints`` used)."""
    return Struct("subc_sub", (("count", "u32", 1), ("ep", "u32", max_endpoints)))


def agg_struct(n_thresholds: int) -> Struct:
    """``struct subc_agg``: one aggregate instance's registers (docs/state.md "Stateful subscriptions"):
    a ``struct bpf_spin_lock`` (4 bytes, written here as ``lock``), the window id, count, sum
    (saturating), extreme (min or max) and one signed excess per ``avg`` threshold (at least 1).
    The C declaration is the template's (with the lock's type)."""
    return Struct(
        "subc_agg",
        (
            ("lock", "u32", 1),
            ("pad", "u32", 1),
            ("wid", "u64", 1),
            ("count", "u64", 1),
            ("total", "u64", 1),
            ("extreme", "u64", 1),
            ("excess", "u64", max(1, n_thresholds)),
        ),
    )


def mask_word_count(bits: int) -> int:
    """64-bit words of a mask of ``bits`` bits (at least 1)."""
    return max(1, -(-bits // 64))


def mask_struct(name: str, bits: int) -> Struct:
    """A bit mask of ``bits`` bits (at least 1) in 64-bit words: bit k is bit ``k % 64`` of word
    ``k // 64`` (``struct subc_umask``: the instances a message updates; ``struct subc_cmask``: the
    named-counter updates a leaf applies).  The C declaration is the template's."""
    return Struct(name, (("w", "u64", mask_word_count(bits)),))


def bases_struct(stages: int) -> Struct:
    """``struct subc_sv_bases``: the first ``subc_sv_info`` slot of each of ``stages`` state-value
    stages (at least 1), one value per generation."""
    return Struct("subc_sv_bases", (("b", "u32", max(1, stages)),))


def mask_words(mask: int, words: int) -> list[int]:
    """``mask`` (a non-negative int) as ``words`` 64-bit words, least significant first (ValueError
    when it needs more)."""
    if mask >> (64 * words):
        raise ValueError(f"mask {mask:#x} does not fit {words} 64-bit words")
    return [mask >> (64 * i) & ((1 << 64) - 1) for i in range(words)]


#: A cluster's root switch at a feed position (``subc_sched``'s entries, bpf/subc_cluster.h): the
#: MoldUDP64 session's 10 bytes as ``s0`` (bytes 0-7) and ``s1`` (8-9) in memory order, the
#: position's sequence number, the root slot.
SCHED_ENTRY = Struct(
    "subc_sched_entry",
    (("seq", "u64", 1), ("s0", "u64", 1), ("s1", "u16", 1), ("pad1", "u16", 1), ("root", "u32", 1)),
)
#: ``struct subc_sched`` (static C: it holds a spin lock): lock, entry count, on (a cluster's
#: broker), padding, then the entries.
SCHED_ENTRIES = 16
SCHED_HEAD = struct.Struct("=IIII")
SCHED_BYTES = SCHED_HEAD.size + SCHED_ENTRIES * SCHED_ENTRY.size
#: The feed's position (``subc_pos``, per CPU): the next sequence number, the session, when seen (ns).
POS = Struct(
    "subc_pos",
    (("next", "u64", 1), ("s0", "u64", 1), ("s1", "u16", 1), ("pad1", "u16", 1), ("pad2", "u32", 1), ("ts", "u64", 1)),
)
POS_BYTES = POS.size

STRUCTS = [
    INFO,
    BOUND,
    EXACT_KEY,
    LPM_KEY,
    LEAF,
    SUBSET,
    ENDPOINT,
    COUNTER,
    SUB_COUNTER,
    META,
    FAN_CFG,
    SCHED_ENTRY,
    POS,
]
