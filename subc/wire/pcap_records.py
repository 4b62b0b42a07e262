"""The pcap and pcapng file readers: packet records, every length checked against the file size.

:func:`read_records` yields the packet records of a pcap (µs or ns timestamps, either byte order)
or pcapng file (sections of either byte order, interfaces with their own link type, snap length
and timestamp resolution and offset; enhanced, simple and obsolete packet blocks).  A broken
*file* is a :class:`SubcError` naming the file and the byte offset.  :func:`is_capture` tells a
capture from a BinaryFILE by its magic number.  The frames are decoded by :mod:`.frames`.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO, Iterator, NamedTuple

from ..errors import SubcError

PCAP_MAGICS = {b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d"}
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
_PCAP_LE = {b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"}
_PCAP_NANO = {b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d"}
_BOM_LE, _BOM_BE = b"\x4d\x3c\x2b\x1a", b"\x1a\x2b\x3c\x4d"
_NG_SHB, _NG_IDB, _NG_PB, _NG_SPB, _NG_EPB = 0x0A0D0D0A, 1, 2, 3, 6
#: Smallest length of a pcapng block by type (type, length, body, trailing length).
_NG_MIN = {_NG_SHB: 28, _NG_IDB: 20, _NG_PB: 32, _NG_SPB: 16, _NG_EPB: 32}


def is_capture(path: str | Path) -> bool:
    """Whether the file at ``path`` starts with a pcap or pcapng magic number (unreadable: SubcError)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise SubcError(f"cannot read trace {path}: {e}") from e
    return magic in PCAP_MAGICS or magic == PCAPNG_MAGIC


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
