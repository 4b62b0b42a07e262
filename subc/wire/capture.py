"""The one capture reader: pcap/pcapng records -> UDP datagrams -> MoldUDP64 packets.

Every command that reads a capture (``simulate``, ``analyze``, ``replay``, ``listen``'s output)
goes through here, in three layers:

* :func:`read_records`: the packet records of a pcap or pcapng file, every length checked against
  the file size before anything is read (a broken *file* is a :class:`SubcError` naming the file and
  the byte offset).
* :func:`read_datagrams`: the UDP datagrams (IPv4, IPv6) of the frames, decoded here with bounds
  checks: Ethernet with any number of 802.1Q (0x8100) / 802.1ad (0x88a8) / 0x9100 / 0x9200 tags,
  Linux cooked SLL and SLL2, BSD loopback, raw IP.  Every frame is counted in exactly one *kind* of
  :class:`CaptureStats`; frames that are not datagrams to a feed port (ARP, LLDP, STP, HSRP on UDP
  1985, TCP, IP fragments, cut frames, ...) are counted and skipped, or with ``strict`` are a
  SubcError naming the file, the frame number, the kind and the byte offset of the frame's record.
* :func:`iter_moldudp64`: the datagrams as MoldUDP64 downstream packets; a datagram whose header
  and message blocks disagree with its bytes is counted as ``malformed_moldudp64`` (with its frame
  number among the examples) and skipped, never decoded into garbage.

IP fragments are counted, not reassembled.  Nothing here knows about ITCH.
"""

from __future__ import annotations

import os
import socket
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, NamedTuple

from ..errors import SubcError
from .moldudp64 import MoldPacket, decode_packet

PCAP_MAGICS = {b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d"}
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
_PCAP_LE = {b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"}
_PCAP_NANO = {b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d"}
_BOM_LE, _BOM_BE = b"\x4d\x3c\x2b\x1a", b"\x1a\x2b\x3c\x4d"
_NG_SHB, _NG_IDB, _NG_PB, _NG_SPB, _NG_EPB = 0x0A0D0D0A, 1, 2, 3, 6
#: Smallest length of a pcapng block by type (type, length, body, trailing length).
_NG_MIN = {_NG_SHB: 28, _NG_IDB: 20, _NG_PB: 32, _NG_SPB: 16, _NG_EPB: 32}

#: The kinds a frame is counted as (each frame in exactly one), in report order.
FRAME_KINDS = (
    "feed_datagrams",
    "other_udp",
    "not_udp",
    "not_ip",
    "ip_fragments",
    "truncated",
    "malformed_ip",
    "undecodable_link",
)
#: Kinds that are problems with the feed (the rest is foreign traffic).
PROBLEM_KINDS = ("ip_fragments", "truncated", "malformed_ip", "undecodable_link", "malformed_moldudp64")
#: Examples kept per kind.
MAX_EXAMPLES = 10


def is_capture(path: str | Path) -> bool:
    """Whether the file at ``path`` starts with a pcap or pcapng magic number (unreadable: SubcError)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise SubcError(f"cannot read trace {path}: {e}") from e
    return magic in PCAP_MAGICS or magic == PCAPNG_MAGIC


# ------------------------------------------------------------------------------ records


class Record(NamedTuple):
    """One packet record: ``offset`` (byte offset of the record in the file), ``linktype`` (LINKTYPE_*),
    ``frame`` (the captured bytes), ``time_ns`` (capture time, ns since the epoch; None for a pcapng
    simple packet block, which has none) and ``wire_len`` (the frame's length on the wire, bytes)."""

    offset: int
    linktype: int
    frame: bytes
    time_ns: int | None
    wire_len: int


def _tsresol(body: bytes, e: str) -> tuple[int, int, int]:
    """(multiplier, divisor, offset in ns) turning an interface's timestamps into ns, from the
    if_tsresol (code 9) and if_tsoffset (code 14) options of its description block ``body``."""
    mul, div, off, i = 1000, 1, 0, 8  # default resolution: microseconds
    while i + 4 <= len(body):
        code, olen = struct.unpack_from(e + "HH", body, i)
        if code == 0:
            break
        value = body[i + 4 : i + 4 + olen]
        if code == 9 and value:
            v = value[0]
            if v & 0x80:
                mul, div = 10**9, 1 << (v & 0x7F)
            elif v <= 9:
                mul, div = 10 ** (9 - v), 1
            else:
                mul, div = 1, 10 ** (v - 9)
        elif code == 14 and len(value) >= 8:
            off = struct.unpack_from(e + "q", value)[0] * 10**9
        i += 4 + olen + (-olen % 4)
    return mul, div, off


def read_records(f: BinaryIO, path: str) -> Iterator[Record]:
    """Yield a :class:`Record` for every packet record of the pcap or pcapng capture open as ``f``
    (pcapng: enhanced, simple and obsolete packet blocks; other blocks are skipped).  Lengths are
    checked against the file size before anything is read.  Timestamps: pcap in µs or ns (by the
    magic number), pcapng in the interface's if_tsresol (default µs) plus its if_tsoffset.

    Raises :class:`SubcError` naming ``path`` and the byte offset for an unknown magic number, a
    truncated header, record or block, a pcapng block length that is too small, runs past the end
    or differs from the block's trailing length, or a packet of an undeclared interface."""
    size = os.fstat(f.fileno()).st_size

    def take(n: int, at: int, what: str) -> bytes:
        if n > size - at:
            raise SubcError(f"{path}: {what} at byte offset {at} runs past the end of the file ({size} bytes)")
        return f.read(n)

    magic = f.read(4)
    f.seek(0)
    frame: bytes | None  # a record's frame (pcapng: None for a block that is no packet)
    if magic in PCAP_MAGICS:
        e = "<" if magic in _PCAP_LE else ">"
        frac = 1 if magic in _PCAP_NANO else 1000
        linktype = struct.unpack(e + "I", take(24, 0, "the pcap file header")[20:24])[0] & 0xFFFF
        pos = 24
        while pos < size:
            sec, sub, caplen, wire = struct.unpack(e + "IIII", take(16, pos, "the pcap record header"))
            frame = take(caplen, pos + 16, f"the frame ({caplen} bytes)")
            yield Record(pos, linktype, frame, sec * 10**9 + sub * frac, wire)
            pos += 16 + caplen
        return
    if magic != PCAPNG_MAGIC:
        raise SubcError(f"{path}: not a pcap or pcapng capture: magic number {magic!r} at byte offset 0")
    e, pos = "<", 0
    links: list[tuple[int, ...]] = []  # per interface: (link type, snap length, mul, div, offset)
    while pos < size:
        block = take(8, pos, "the pcapng block header")
        if block[:4] == PCAPNG_MAGIC:  # section header block: its byte-order magic sets the byte order
            block += take(4, pos + 8, "the byte-order magic of the section header block")
            if block[8:] not in (_BOM_LE, _BOM_BE):
                raise SubcError(f"{path}: bad byte-order magic {block[8:]!r} at byte offset {pos + 8}")
            e, links = ("<" if block[8:] == _BOM_LE else ">"), []
        btype, blen = struct.unpack(e + "II", block[:8])
        least = _NG_MIN.get(btype, 12)
        if blen < least:
            raise SubcError(
                f"{path}: pcapng block of type {btype:#x} at byte offset {pos} has length {blen}, less than {least}"
            )
        if blen > size - pos:
            raise SubcError(
                f"{path}: pcapng block of {blen} bytes at byte offset {pos} runs past the end of the file "
                f"({size} bytes)"
            )
        block += f.read(blen - len(block))
        if struct.unpack(e + "I", block[-4:])[0] != blen:
            raise SubcError(f"{path}: pcapng block at byte offset {pos}: trailing length differs from {blen}")
        body = block[8:-4]
        frame = stamp = None
        if btype == _NG_IDB:
            links.append(struct.unpack(e + "HxxI", body[:8]) + _tsresol(body, e))  # (link, snap, mul, div, off)
        elif btype in (_NG_EPB, _NG_PB):
            iface, hi, lo, caplen, wire = struct.unpack(e + "IIIII" if btype == _NG_EPB else e + "HxxIIII", body[:20])
            if caplen > len(body) - 20:
                raise SubcError(
                    f"{path}: packet block at byte offset {pos} has a captured length of {caplen} "
                    f"bytes, more than the {len(body) - 20} it holds"
                )
            frame, stamp = body[20 : 20 + caplen], (hi << 32) | lo
        elif btype == _NG_SPB:
            iface, wire = 0, struct.unpack(e + "I", body[:4])[0]
            snap = links[0][1] if links else 0
            frame = body[4 : 4 + min(wire, snap or wire)]
        if frame is not None:
            if iface >= len(links):
                raise SubcError(
                    f"{path}: packet block at byte offset {pos} names interface {iface}, "
                    f"but {len(links)} are declared before it"
                )
            link, _snap, mul, div, off = links[iface]
            yield Record(pos, link, frame, None if stamp is None else stamp * mul // div + off, wire)
        pos += blen


# ------------------------------------------------------------------------------ statistics


@dataclass
class CaptureStats:
    """What reading a capture found, by kind (counts of frames, bytes not involved).

    Every frame is counted in ``frames`` and in exactly one of :data:`FRAME_KINDS`:
    ``feed_datagrams`` (UDP to a feed port, or any UDP when no ports were given), ``other_udp`` (UDP
    to another port, e.g. HSRP on 1985), ``not_udp`` (IP carrying another protocol), ``not_ip`` (ARP,
    LLDP, STP/LLC, ...), ``ip_fragments`` (any IPv4/IPv6 fragment; not reassembled), ``truncated``
    (captured bytes shorter than the IP or UDP headers or than the UDP length says),
    ``malformed_ip`` (inconsistent IP/UDP headers: bad version or header length, a UDP length below
    8 or past the IP payload) and ``undecodable_link`` (a link-layer header that does not decode, or
    an unsupported link type).  At the MoldUDP64 level (:func:`iter_moldudp64`), of the feed
    datagrams: ``moldudp64_packets`` decoded (carrying ``messages``) and ``malformed_moldudp64``.

    ``feed_ports``: the feed ports (None: all UDP); ``detected_ports``: MoldUDP64 datagrams per
    destination port when the feed port was detected (:func:`detect_feed_ports`); ``other_udp_ports``:
    other UDP datagrams per destination port; ``examples``: per kind other than ``feed_datagrams``
    the first :data:`MAX_EXAMPLES` ``(frame number, kind, message)``; ``path``: the capture last read.
    """

    frames: int = 0
    feed_datagrams: int = 0
    other_udp: int = 0
    not_udp: int = 0
    not_ip: int = 0
    ip_fragments: int = 0
    truncated: int = 0
    malformed_ip: int = 0
    undecodable_link: int = 0
    moldudp64_packets: int = 0
    messages: int = 0
    malformed_moldudp64: int = 0
    feed_ports: list[int] | None = None
    detected_ports: dict[int, int] = field(default_factory=dict)
    other_udp_ports: Counter = field(default_factory=Counter)
    examples: dict[str, list[tuple[int, str, str]]] = field(default_factory=dict)
    path: str | None = None

    def count(self, kind: str, frame: int, message: str) -> None:
        """Count one frame (or, for ``malformed_moldudp64``, one datagram) of ``kind`` and keep it as an
        example if fewer than :data:`MAX_EXAMPLES` of that kind are kept."""
        setattr(self, kind, getattr(self, kind) + 1)
        kept = self.examples.setdefault(kind, [])
        if len(kept) < MAX_EXAMPLES:
            kept.append((frame, kind, message))

    @property
    def foreign(self) -> int:
        """Frames that are not feed datagrams."""
        return self.frames - self.feed_datagrams

    @property
    def problems(self) -> int:
        """Frames and datagrams of the :data:`PROBLEM_KINDS`."""
        return sum(getattr(self, k) for k in PROBLEM_KINDS)

    def merge(self, other: "CaptureStats") -> "CaptureStats":
        """Add the counts and examples of ``other`` (another file or task) to these; returns self."""
        for k in ("frames", *FRAME_KINDS, "moldudp64_packets", "messages", "malformed_moldudp64"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        if other.feed_ports is not None:
            self.feed_ports = sorted(set(self.feed_ports or ()) | set(other.feed_ports))
        for port, n in other.detected_ports.items():
            self.detected_ports[port] = self.detected_ports.get(port, 0) + n
        self.other_udp_ports.update(other.other_udp_ports)
        for kind, kept in other.examples.items():
            mine = self.examples.setdefault(kind, [])
            mine.extend(kept[: MAX_EXAMPLES - len(mine)])
        return self

    def as_json(self) -> dict:
        """The counts as a JSON-ready dict: every kind, ``feed_ports``, ``detected_ports`` and the ten most
        common ``other_udp_ports`` (port numbers as strings), and ``examples`` as a list of
        ``{"frame", "kind", "message"}`` in kind order."""
        doc = {
            k: getattr(self, k)
            for k in ("frames", *FRAME_KINDS, "moldudp64_packets", "messages", "malformed_moldudp64")
        }
        doc["feed_ports"] = self.feed_ports
        doc["detected_ports"] = {str(p): n for p, n in sorted(self.detected_ports.items())}
        doc["other_udp_ports"] = {str(p): n for p, n in self.other_udp_ports.most_common(10)}
        doc["examples"] = [
            {"frame": fr, "kind": k, "message": m}
            for kind in (*FRAME_KINDS, "malformed_moldudp64")
            for fr, k, m in self.examples.get(kind, [])
        ]
        return doc

    def summary(self) -> str:
        """One line: the frames by kind, e.g. ``12 frames: 9 feed datagrams (UDP port 26477), 2 other UDP
        (port 1985: 2), 1 not IP; 1 malformed MoldUDP64 (frame 7: ...)``."""
        ports = (
            "all UDP"
            if self.feed_ports is None
            else ("UDP port " + ", ".join(map(str, self.feed_ports)) if self.feed_ports else "no feed port")
        )
        parts = [f"{self.feed_datagrams} feed datagrams ({ports})"]
        names = {
            "other_udp": "other UDP",
            "not_udp": "IP not UDP",
            "not_ip": "not IP",
            "ip_fragments": "IP fragments",
            "truncated": "truncated",
            "malformed_ip": "malformed IP/UDP",
            "undecodable_link": "undecodable link layer",
        }
        for kind, name in names.items():
            n = getattr(self, kind)
            if n:
                extra = ""
                if kind == "other_udp":
                    extra = " (" + ", ".join(f"port {p}: {c}" for p, c in self.other_udp_ports.most_common(3)) + ")"
                elif kind in PROBLEM_KINDS:
                    fr, _, msg = self.examples[kind][0]
                    extra = f" (first: frame {fr}: {msg})"
                parts.append(f"{n} {name}{extra}")
        line = f"{self.frames} frames: " + ", ".join(parts)
        if self.malformed_moldudp64:
            fr, _, msg = self.examples["malformed_moldudp64"][0]
            line += f"; {self.malformed_moldudp64} malformed MoldUDP64 (first: frame {fr}: {msg})"
        return line


# ------------------------------------------------------------------------------ frames


@dataclass(frozen=True)
class Datagram:
    """A UDP datagram of a capture: ``frame`` (1-based frame number), ``offset`` (byte offset of the
    frame's record in the file), ``time_ns`` (capture time, ns since the epoch; None when the record
    has none), ``src``/``dst`` ((IP address string, UDP port)), ``vlans`` (VLAN ids of the tags, outer
    first) and ``payload`` (the UDP payload, cut to the UDP length: link-layer padding dropped)."""

    frame: int
    offset: int
    time_ns: int | None
    src: tuple[str, int]
    dst: tuple[str, int]
    vlans: tuple[int, ...]
    payload: bytes


class _Skip(Exception):
    """A frame that is not a feed datagram: ``kind`` (one of :data:`FRAME_KINDS`) and why."""

    def __init__(self, kind: str, message: str, port: int | None = None):
        super().__init__(message)
        self.kind, self.message, self.port = kind, message, port


_VLAN_TYPES = {0x8100, 0x88A8, 0x9100, 0x9200}
_ETHERTYPES = {
    0x0806: "ARP",
    0x8035: "RARP",
    0x88CC: "LLDP",
    0x8809: "slow protocols (LACP)",
    0x888E: "EAPOL",
    0x8847: "MPLS",
    0x8848: "MPLS",
    0x88F7: "PTP",
    0x8863: "PPPoE",
    0x8864: "PPPoE",
    0x9000: "loopback",
}
_PROTOCOLS = {
    1: "ICMP",
    2: "IGMP",
    6: "TCP",
    47: "GRE",
    50: "ESP",
    58: "ICMPv6",
    89: "OSPF",
    103: "PIM",
    112: "VRRP",
    132: "SCTP",
}
_RAW_LINKS = {101: None, 12: None, 14: None, 228: 4, 229: 6}
_LINK_NAMES = {1: "Ethernet", 113: "Linux cooked (SLL)", 276: "Linux cooked (SLL2)"}


def _link(linktype: int, frame: bytes) -> tuple[int, int, tuple[int, ...]]:
    """(IP version 4 or 6, offset of the IP header, VLAN ids) of a frame, or raises :class:`_Skip`."""
    n = len(frame)
    if linktype in _RAW_LINKS:
        if not n:
            raise _Skip("truncated", "empty raw IP frame")
        return _RAW_LINKS[linktype] or frame[0] >> 4, 0, ()
    if linktype in (0, 108):  # BSD loopback: address family, host byte order (0) or network byte order (108)
        if n < 4:
            raise _Skip("undecodable_link", f"frame of {n} bytes is shorter than the 4-byte loopback header")
        fams = {int.from_bytes(frame[:4], "big")} | ({int.from_bytes(frame[:4], "little")} if linktype == 0 else set())
        if 2 in fams:
            return 4, 4, ()
        if fams & {10, 24, 28, 30}:
            return 6, 4, ()
        raise _Skip("not_ip", f"loopback address family {int.from_bytes(frame[:4], 'big'):#x}")
    head = {1: (14, 12), 113: (16, 14), 276: (20, 0)}.get(linktype)
    if head is None:
        raise _Skip(
            "undecodable_link",
            f"link type {linktype} is not supported (Ethernet, Linux cooked SLL/SLL2, BSD loopback and raw IP are)",
        )
    hlen, at = head
    if n < hlen:
        raise _Skip(
            "undecodable_link", f"frame of {n} bytes is shorter than the {hlen}-byte {_LINK_NAMES[linktype]} header"
        )
    etype, off, vlans = int.from_bytes(frame[at : at + 2], "big"), hlen, []
    while etype in _VLAN_TYPES:
        if off + 4 > n:
            raise _Skip("undecodable_link", f"VLAN tag {etype:#06x} at frame byte {off} cut short ({n} bytes)")
        vlans.append(int.from_bytes(frame[off : off + 2], "big") & 0xFFF)
        etype = int.from_bytes(frame[off + 2 : off + 4], "big")
        off += 4
    if etype == 0x0800:
        return 4, off, tuple(vlans)
    if etype == 0x86DD:
        return 6, off, tuple(vlans)
    if etype < 0x0600:
        raise _Skip("not_ip", f"IEEE 802.3 frame with an LLC header (e.g. STP), length field {etype}")
    name = _ETHERTYPES.get(etype)
    raise _Skip("not_ip", f"ethertype {etype:#06x}" + (f" ({name})" if name else ""))


def _ip(version: int, frame: bytes, off: int) -> tuple[str, str, int, int]:
    """(source, destination, offset of the UDP header, end of the IP payload) of the IP packet at
    ``off``, or raises :class:`_Skip` (not UDP, fragment, truncated, malformed)."""
    n = len(frame)
    if version == 4:
        if n - off < 20:
            raise _Skip("truncated", f"IPv4 header cut: {n - off} of 20 bytes captured")
        if frame[off] >> 4 != 4:
            raise _Skip("malformed_ip", f"IP version {frame[off] >> 4} where IPv4 was expected")
        ihl = (frame[off] & 15) * 4
        if ihl < 20:
            raise _Skip("malformed_ip", f"IPv4 header length {ihl} bytes, less than 20")
        if n - off < ihl:
            raise _Skip("truncated", f"IPv4 header cut: {n - off} of {ihl} bytes captured")
        total, ident, frag, _ttl, proto = struct.unpack_from("!HHHBB", frame, off + 2)
        if total == 0:  # segmentation offload: the length was never filled in
            total = n - off
        if total < ihl:
            raise _Skip("malformed_ip", f"IPv4 total length {total} is less than its header length {ihl}")
        src, dst = socket.inet_ntoa(frame[off + 12 : off + 16]), socket.inet_ntoa(frame[off + 16 : off + 20])
        if frag & 0x3FFF:
            raise _Skip(
                "ip_fragments",
                f"IPv4 fragment {src} -> {dst} id {ident} at fragment offset "
                f"{(frag & 0x1FFF) * 8}{' (more follow)' if frag & 0x2000 else ''}: "
                "not reassembled",
            )
        if proto != 17:
            raise _Skip("not_udp", f"IP protocol {proto}" + (f" ({_PROTOCOLS[proto]})" if proto in _PROTOCOLS else ""))
        return src, dst, off + ihl, off + total
    if version != 6:
        raise _Skip("malformed_ip", f"IP version {version} (neither 4 nor 6)")
    if n - off < 40:
        raise _Skip("truncated", f"IPv6 header cut: {n - off} of 40 bytes captured")
    if frame[off] >> 4 != 6:
        raise _Skip("malformed_ip", f"IP version {frame[off] >> 4} where IPv6 was expected")
    plen, nh = struct.unpack_from("!HB", frame, off + 4)
    src = socket.inet_ntop(socket.AF_INET6, frame[off + 8 : off + 24])
    dst = socket.inet_ntop(socket.AF_INET6, frame[off + 24 : off + 40])
    pos = off + 40
    end = pos + plen if plen else n  # 0: jumbogram, the payload is what follows
    while nh in (0, 43, 44, 51, 60):  # hop-by-hop, routing, fragment, authentication, destination options
        if pos + 8 > n:
            raise _Skip("truncated", f"IPv6 extension header {nh} cut at frame byte {pos}")
        if nh == 44:
            fo = int.from_bytes(frame[pos + 2 : pos + 4], "big")
            if fo & 0xFFF9:  # an offset or more fragments: a real fragment (not an atomic one)
                raise _Skip(
                    "ip_fragments", f"IPv6 fragment {src} -> {dst} at fragment offset {fo & 0xFFF8}: not reassembled"
                )
            step = 8
        else:
            step = (frame[pos + 1] + 2) * 4 if nh == 51 else (frame[pos + 1] + 1) * 8
        nh, pos = frame[pos], pos + step
    if nh != 17:
        raise _Skip("not_udp", f"IPv6 next header {nh}" + (f" ({_PROTOCOLS[nh]})" if nh in _PROTOCOLS else ""))
    return src, dst, pos, end


def _decode_frame(linktype: int, frame: bytes, ports: frozenset[int] | None) -> tuple:
    """``(src, dst, vlans, payload)`` of a frame that is a UDP datagram to one of ``ports`` (any port
    when None), as in :class:`Datagram`.  Raises :class:`_Skip` with the frame's kind and a
    description otherwise."""
    version, off, vlans = _link(linktype, frame)
    src, dst, l4, ip_end = _ip(version, frame, off)
    n = len(frame)
    if l4 + 8 > n:
        raise _Skip("truncated", f"UDP header cut: {max(0, n - l4)} of 8 bytes captured")
    sport, dport, ulen = struct.unpack_from("!HHH", frame, l4)
    if ports is not None and dport not in ports:
        raise _Skip("other_udp", f"UDP {src}:{sport} -> {dst}:{dport}", dport)
    if ulen == 0 and version == 6:  # jumbogram
        ulen = ip_end - l4
    if ulen < 8:
        raise _Skip("malformed_ip", f"UDP length {ulen}, less than the 8-byte header")
    if l4 + ulen > ip_end:
        raise _Skip("malformed_ip", f"UDP length {ulen} runs past the end of the IP payload ({ip_end - l4} bytes)")
    if l4 + ulen > n:
        raise _Skip("truncated", f"UDP length {ulen} but {n - l4} bytes of the datagram captured")
    return (src, sport), (dst, dport), vlans, frame[l4 + 8 : l4 + ulen]


def read_datagrams(
    path: str | Path, ports: Iterable[int] | None = None, stats: CaptureStats | None = None, strict: bool = False
) -> Iterator[Datagram]:
    """Every UDP datagram of the pcap/pcapng capture at ``path`` whose destination port is in ``ports``
    (every UDP datagram when None), in capture order, as :class:`Datagram`.

    Every frame is counted in ``stats`` (see :class:`CaptureStats`).  Frames that are not such
    datagrams are skipped; with ``strict`` the first one raises :class:`SubcError` naming the file,
    the frame number, the kind and the byte offset of the frame's record.  A capture file that
    cannot be read (unknown magic, truncated record, ...) raises SubcError as :func:`read_records`."""
    stats = stats if stats is not None else CaptureStats()
    feed = None if ports is None else frozenset(ports)
    stats.path = str(path)
    if feed is not None:
        stats.feed_ports = sorted(set(stats.feed_ports or ()) | feed)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise SubcError(f"cannot read trace {path}: {e}") from e
    with f:
        for number, rec in enumerate(read_records(f, str(path)), start=1):
            stats.frames += 1
            try:
                src, dst, vlans, payload = _decode_frame(rec.linktype, rec.frame, feed)
            except _Skip as s:
                stats.count(s.kind, number, s.message)
                if s.port is not None:
                    stats.other_udp_ports[s.port] += 1
                if strict:
                    raise SubcError(
                        f"{path}: frame {number}: {s.kind}: {s.message} (--strict: only datagrams to "
                        f"the feed port are allowed); the frame's record is at byte offset "
                        f"{rec.offset}"
                    ) from None
                continue
            stats.feed_datagrams += 1
            yield Datagram(number, rec.offset, rec.time_ns, src, dst, vlans, payload)


def iter_moldudp64(
    datagrams: Iterable[Datagram], stats: CaptureStats | None = None, strict: bool = False, path: str | None = None
) -> Iterator[tuple[Datagram, MoldPacket]]:
    """``(datagram, packet)`` for every datagram whose payload is a MoldUDP64 downstream packet
    (:func:`subc.wire.moldudp64.decode_packet`; any session bytes, printable or not).

    A datagram whose header and message blocks disagree with its bytes (short header, truncated
    block, bytes after the last block) is counted in ``stats.malformed_moldudp64`` with its frame
    number and the decoder's message among the examples, and skipped; with ``strict`` it raises
    :class:`SubcError` naming the file (``path``, else ``stats.path``), the frame and the record's
    byte offset."""
    stats = stats if stats is not None else CaptureStats()
    for dg in datagrams:
        try:
            pkt = decode_packet(dg.payload)
        except SubcError as e:
            stats.count("malformed_moldudp64", dg.frame, e.message)
            if strict:
                raise SubcError(
                    f"{path or stats.path}: frame {dg.frame}: malformed_moldudp64: {e.message} (in the "
                    f"UDP payload); the frame's record is at byte offset {dg.offset}"
                ) from None
            continue
        stats.moldudp64_packets += 1
        stats.messages += len(pkt.messages)
        yield dg, pkt


def detect_feed_ports(path: str | Path, stats: CaptureStats | None = None) -> list[int]:
    """The feed port of the capture at ``path``: ``[port]``, the UDP destination port whose datagrams
    that decode as MoldUDP64 carry the most messages (then: the most such datagrams; then the lowest
    port), or ``[]`` when none decodes.  One pass over
    the capture; records the MoldUDP64 datagrams per port in ``stats.detected_ports``.  Raises
    :class:`SubcError` when the capture cannot be read."""
    per_port: Counter = Counter()
    per_port_msgs: Counter = Counter()
    for dg, pkt in iter_moldudp64(read_datagrams(path)):
        per_port[dg.dst[1]] += 1
        per_port_msgs[dg.dst[1]] += len(pkt.messages)
    if stats is not None:
        stats.detected_ports = dict(sorted(per_port.items()))
    if not per_port:
        return []
    # messages first: 20-byte payloads of other protocols (HSRP hellos, zeros) can read as heartbeats
    return [min(per_port, key=lambda p: (-per_port_msgs[p], -per_port[p], p))]


def choose_feed_ports(
    path: str | Path, spec_ports: Iterable[int], udp_port: int | None = None, stats: CaptureStats | None = None
) -> list[int]:
    """The feed ports to read the capture at ``path`` with: ``[udp_port]`` when given; else the
    spec's ``spec_ports`` when any MoldUDP64 datagram of the capture goes to one of them; else the
    detected port (:func:`detect_feed_ports`: a real feed may use another port than the spec's,
    e.g. Nasdaq TotalView on 26477); else the spec's ports.  The choice is recorded in
    ``stats.feed_ports`` and ``stats.detected_ports``.  Raises SubcError for an unreadable capture."""
    if udp_port is not None:
        return [udp_port]
    spec_ports = sorted(set(spec_ports))
    probe = CaptureStats()
    detected = detect_feed_ports(path, probe)
    if stats is not None:
        stats.detected_ports = probe.detected_ports
    if any(p in probe.detected_ports for p in spec_ports) or not detected:
        return spec_ports
    return detected


# ------------------------------------------------------------------------------ writing


class UdpPcapWriter:
    """Write UDP datagrams as a pcap file (nanosecond timestamps, LINKTYPE_ETHERNET): per datagram an
    Ethernet header (zero MAC addresses), an IPv4 (or IPv6, for IPv6 addresses) header with its
    checksum and a UDP header (checksum 0), then the payload unchanged.  ``f``: a binary file open
    for writing.  Payloads must fit an IP packet (at most 65,507 bytes over IPv4)."""

    def __init__(self, f: BinaryIO):
        self.f = f
        f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, 1))

    def write(self, payload: bytes, src: tuple[str, int], dst: tuple[str, int], time_ns: int) -> None:
        """Append one datagram ``src`` -> ``dst`` ((IP address, port)) captured at ``time_ns`` (ns since the epoch)."""
        udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0)
        if ":" in src[0] or ":" in dst[0]:
            ip = struct.pack("!IHBB", 0x60000000, len(udp) + len(payload), 17, 64) + _in6(src[0]) + _in6(dst[0])
            etype = 0x86DD
        else:
            head = struct.pack(
                "!BBHHHBBH4s4s",
                0x45,
                0,
                28 + len(payload),
                0,
                0x4000,
                64,
                17,
                0,
                socket.inet_aton(src[0]),
                socket.inet_aton(dst[0]),
            )
            ip = head[:10] + _checksum(head).to_bytes(2, "big") + head[12:]
            etype = 0x0800
        frame = bytes(12) + etype.to_bytes(2, "big") + ip + udp + payload
        sec, ns = divmod(time_ns, 10**9)
        self.f.write(struct.pack("<IIII", sec, ns, len(frame), len(frame)) + frame)


def _in6(addr: str) -> bytes:
    if ":" not in addr:
        addr = "::ffff:" + addr
    return socket.inet_pton(socket.AF_INET6, addr.split("%")[0])


def _checksum(header: bytes) -> int:
    s = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF
