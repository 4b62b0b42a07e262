"""One captured frame -> a UDP datagram: the link layer, IPv4 or IPv6, and UDP, with bounds checks.

Link layers: Ethernet with any number of 802.1Q (0x8100) / 802.1ad (0x88a8) / 0x9100 / 0x9200
tags, Linux cooked SLL and SLL2, BSD loopback, raw IP.  A frame that is not a UDP datagram to a
feed port raises :class:`FrameSkipped` with its kind (one of :data:`.capture.FRAME_KINDS`) and
why: ARP, LLDP, STP, TCP, other UDP ports, IP fragments (not reassembled), cut frames, headers
that disagree with each other.  :mod:`.capture` counts them.
"""

from __future__ import annotations

import socket
import struct


class FrameSkipped(Exception):
    """A frame that is not a feed datagram: ``kind`` (one of :data:`.capture.FRAME_KINDS`), ``message``
    (why) and, for ``other_udp``, the destination ``port``."""

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
    """(IP version 4 or 6, offset of the IP header, VLAN ids) of a frame, or raises :class:`FrameSkipped`."""
    n = len(frame)
    if linktype in _RAW_LINKS:
        if not n:
            raise FrameSkipped("truncated", "empty raw IP frame")
        return _RAW_LINKS[linktype] or frame[0] >> 4, 0, ()
    if linktype in (0, 108):  # BSD loopback: address family, host byte order (0) or network byte order (108)
        if n < 4:
            raise FrameSkipped("undecodable_link", f"frame of {n} bytes is shorter than the 4-byte loopback header")
        fams = {int.from_bytes(frame[:4], "big")} | ({int.from_bytes(frame[:4], "little")} if linktype == 0 else set())
        if 2 in fams:
            return 4, 4, ()
        if fams & {10, 24, 28, 30}:
            return 6, 4, ()
        raise FrameSkipped("not_ip", f"loopback address family {int.from_bytes(frame[:4], 'big'):#x}")
    head = {1: (14, 12), 113: (16, 14), 276: (20, 0)}.get(linktype)
    if head is None:
        raise FrameSkipped(
            "undecodable_link",
            f"link type {linktype} is not supported (Ethernet, Linux cooked SLL/SLL2, BSD loopback and raw IP are)",
        )
    hlen, at = head
    if n < hlen:
        raise FrameSkipped(
            "undecodable_link", f"frame of {n} bytes is shorter than the {hlen}-byte {_LINK_NAMES[linktype]} header"
        )
    etype, off, vlans = int.from_bytes(frame[at : at + 2], "big"), hlen, []
    while etype in _VLAN_TYPES:
        if off + 4 > n:
            raise FrameSkipped("undecodable_link", f"VLAN tag {etype:#06x} at frame byte {off} cut short ({n} bytes)")
        vlans.append(int.from_bytes(frame[off : off + 2], "big") & 0xFFF)
        etype = int.from_bytes(frame[off + 2 : off + 4], "big")
        off += 4
    if etype == 0x0800:
        return 4, off, tuple(vlans)
    if etype == 0x86DD:
        return 6, off, tuple(vlans)
    if etype < 0x0600:
        raise FrameSkipped("not_ip", f"IEEE 802.3 frame with an LLC header (e.g. STP), length field {etype}")
    name = _ETHERTYPES.get(etype)
    raise FrameSkipped("not_ip", f"ethertype {etype:#06x}" + (f" ({name})" if name else ""))


def _ip(version: int, frame: bytes, off: int) -> tuple[str, str, int, int]:
    """(source, destination, offset of the UDP header, end of the IP payload) of the IP packet at
    ``off``, or raises :class:`FrameSkipped` (not UDP, fragment, truncated, malformed)."""
    n = len(frame)
    if version == 4:
        if n - off < 20:
            raise FrameSkipped("truncated", f"IPv4 header cut: {n - off} of 20 bytes captured")
        if frame[off] >> 4 != 4:
            raise FrameSkipped("malformed_ip", f"IP version {frame[off] >> 4} where IPv4 was expected")
        ihl = (frame[off] & 15) * 4
        if ihl < 20:
            raise FrameSkipped("malformed_ip", f"IPv4 header length {ihl} bytes, less than 20")
        if n - off < ihl:
            raise FrameSkipped("truncated", f"IPv4 header cut: {n - off} of {ihl} bytes captured")
        total, ident, frag, _ttl, proto = struct.unpack_from("!HHHBB", frame, off + 2)
        if total == 0:  # segmentation offload: the length was never filled in
            total = n - off
        if total < ihl:
            raise FrameSkipped("malformed_ip", f"IPv4 total length {total} is less than its header length {ihl}")
        src, dst = socket.inet_ntoa(frame[off + 12 : off + 16]), socket.inet_ntoa(frame[off + 16 : off + 20])
        if frag & 0x3FFF:
            raise FrameSkipped(
                "ip_fragments",
                f"IPv4 fragment {src} -> {dst} id {ident} at fragment offset "
                f"{(frag & 0x1FFF) * 8}{' (more follow)' if frag & 0x2000 else ''}: "
                "not reassembled",
            )
        if proto != 17:
            raise FrameSkipped(
                "not_udp", f"IP protocol {proto}" + (f" ({_PROTOCOLS[proto]})" if proto in _PROTOCOLS else "")
            )
        return src, dst, off + ihl, off + total
    if version != 6:
        raise FrameSkipped("malformed_ip", f"IP version {version} (neither 4 nor 6)")
    if n - off < 40:
        raise FrameSkipped("truncated", f"IPv6 header cut: {n - off} of 40 bytes captured")
    if frame[off] >> 4 != 6:
        raise FrameSkipped("malformed_ip", f"IP version {frame[off] >> 4} where IPv6 was expected")
    plen, nh = struct.unpack_from("!HB", frame, off + 4)
    src = socket.inet_ntop(socket.AF_INET6, frame[off + 8 : off + 24])
    dst = socket.inet_ntop(socket.AF_INET6, frame[off + 24 : off + 40])
    pos = off + 40
    end = pos + plen if plen else n  # 0: jumbogram, the payload is what follows
    while nh in (0, 43, 44, 51, 60):  # hop-by-hop, routing, fragment, authentication, destination options
        if pos + 8 > n:
            raise FrameSkipped("truncated", f"IPv6 extension header {nh} cut at frame byte {pos}")
        if nh == 44:
            fo = int.from_bytes(frame[pos + 2 : pos + 4], "big")
            if fo & 0xFFF9:  # an offset or more fragments: a real fragment (not an atomic one)
                raise FrameSkipped(
                    "ip_fragments", f"IPv6 fragment {src} -> {dst} at fragment offset {fo & 0xFFF8}: not reassembled"
                )
            step = 8
        else:
            step = (frame[pos + 1] + 2) * 4 if nh == 51 else (frame[pos + 1] + 1) * 8
        nh, pos = frame[pos], pos + step
    if nh != 17:
        raise FrameSkipped("not_udp", f"IPv6 next header {nh}" + (f" ({_PROTOCOLS[nh]})" if nh in _PROTOCOLS else ""))
    return src, dst, pos, end


def decode_frame(linktype: int, frame: bytes, ports: frozenset[int] | None) -> tuple:
    """``(src, dst, vlans, payload)`` of a frame that is a UDP datagram to one of ``ports`` (any port
    when None), as in :class:`.capture.Datagram`.  Raises :class:`FrameSkipped` with the frame's kind and a
    description otherwise."""
    version, off, vlans = _link(linktype, frame)
    src, dst, l4, ip_end = _ip(version, frame, off)
    n = len(frame)
    if l4 + 8 > n:
        raise FrameSkipped("truncated", f"UDP header cut: {max(0, n - l4)} of 8 bytes captured")
    sport, dport, ulen = struct.unpack_from("!HHH", frame, l4)
    if ports is not None and dport not in ports:
        raise FrameSkipped("other_udp", f"UDP {src}:{sport} -> {dst}:{dport}", dport)
    if ulen == 0 and version == 6:  # jumbogram
        ulen = ip_end - l4
    if ulen < 8:
        raise FrameSkipped("malformed_ip", f"UDP length {ulen}, less than the 8-byte header")
    if l4 + ulen > ip_end:
        raise FrameSkipped(
            "malformed_ip", f"UDP length {ulen} runs past the end of the IP payload ({ip_end - l4} bytes)"
        )
    if l4 + ulen > n:
        raise FrameSkipped("truncated", f"UDP length {ulen} but {n - l4} bytes of the datagram captured")
    return (src, sport), (dst, dport), vlans, frame[l4 + 8 : l4 + ulen]
