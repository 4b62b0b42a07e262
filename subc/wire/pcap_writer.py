"""Writing UDP datagrams as a pcap capture (``subc listen --save-pcap``, ``subc simulate``'s per-port copies)."""

from __future__ import annotations

import socket
import struct
from typing import BinaryIO


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
