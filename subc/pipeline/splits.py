"""Where the messages of a trace file are: BinaryFILE splits and pcap/pcapng captures.

**BinaryFILE** (2-byte big-endian length, then the message; :mod:`subc.runtime.itch`) has no sync
marker, so a large file is cut into splits of about ``split_bytes`` and each split boundary is moved
forward to the first offset where :data:`SYNC_MESSAGES` consecutive frames are well formed: every
length equals the ITCH 5.0 length of the frame's message type (or is 0, the zero-length quirk,
followed by a known type), or the chain ends exactly at the end of the file.  Each task then walks
its split from its start; the walk must end exactly on the next split's start, else the task raises
(:func:`walk_binaryfile`), so a wrong split point is an error, never silently wrong data.  Pass
``split_bytes=0`` to read each file in one task.

**pcap / pcapng** captures are read one file per task (records and blocks here, every length checked
against the file size; frames decoded with ``dpkt``): frames are Ethernet, Linux cooked (SLL) or
raw IP; every UDP datagram (to ``udp_port`` when given) is decoded as a MoldUDP64 downstream packet
(:mod:`subc.runtime.moldudp64`) and each of its messages is a row.  Frames that are not UDP are
skipped; a malformed capture, link-layer header, truncated datagram or MoldUDP64 packet is an error
naming the file, the frame and the byte offset of its record.

Both produce a :class:`MessageBuffer`: the message bytes and, per message, its start offset in that
buffer, its length and its position in the source (BinaryFILE: byte offset of the length prefix;
pcap: 1-based frame number and message index in the packet).
"""

from __future__ import annotations

import os
import struct
from array import array
from dataclasses import dataclass

import numpy as np

from ..errors import SubcError
from ..runtime.itch import MESSAGE_LENGTHS
from ..runtime.moldudp64 import decode_packet

#: Consecutive well-formed frames that make a BinaryFILE split point.
SYNC_MESSAGES = 32
#: How far past a split boundary to look for a split point (bytes).
SYNC_WINDOW = 1 << 16
#: Default split size (bytes).
DEFAULT_SPLIT_BYTES = 64 << 20

_LEN = [0] * 256
for _t, _n in MESSAGE_LENGTHS.items():
    _LEN[_t[0]] = _n
_LEN_NP = np.array(_LEN, dtype=np.int32)

PCAP_MAGICS = {b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d"}
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"


@dataclass(frozen=True)
class Split:
    """A piece of a trace for one task: ``kind`` 'binaryfile' (bytes ``start`` to ``stop``) or 'pcap'
    (the whole file; ``start``/``stop`` unused); ``file_index`` indexes the job's file list."""

    file_index: int
    path: str
    kind: str
    start: int = 0
    stop: int = 0


@dataclass
class MessageBuffer:
    """Messages of one split: ``data`` (uint8), per message ``starts`` (int64, into ``data``),
    ``lengths`` (int32, bytes), ``positions`` (int64: BinaryFILE byte offset of the length prefix, or
    pcap frame number) and ``indexes`` (int32: message index in its MoldUDP64 packet, 0 for
    BinaryFILE) and ``zero_length`` (bool: the length prefix was 0 and the length was taken from the
    message type; None for pcap)."""

    data: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    positions: np.ndarray
    indexes: np.ndarray
    zero_length: np.ndarray | None = None

    @property
    def zero_length_fallbacks(self) -> int:
        return int(self.zero_length.sum()) if self.zero_length is not None else 0

    def __len__(self) -> int:
        return len(self.starts)


def file_kind(path: str) -> str:
    """'pcap' for pcap and pcapng captures (by magic number), else 'binaryfile'.

    Raises :class:`SubcError` when the file cannot be read."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise SubcError(f"cannot read trace {path}: {e}") from e
    return "pcap" if magic in PCAP_MAGICS or magic == PCAPNG_MAGIC else "binaryfile"


def _chain_ok(data: bytes, pos: int, count: int) -> bool:
    """True when ``count`` well-formed frames start at ``pos`` (or fewer that end exactly at the end)."""
    n = len(data)
    for _ in range(count):
        if pos == n:
            return True
        if pos + 3 > n:
            return False
        length = (data[pos] << 8) | data[pos + 1]
        expected = _LEN[data[pos + 2]]
        if not expected or (length and length != expected):
            return False
        pos += 2 + expected
        if pos > n:
            return False
    return True


def sync_point(path: str, boundary: int, size: int) -> int | None:
    """The first offset at or after ``boundary`` where :data:`SYNC_MESSAGES` well-formed frames
    start (``size`` = file size in bytes), or None within :data:`SYNC_WINDOW` bytes."""
    need = SYNC_WINDOW + SYNC_MESSAGES * (2 + max(MESSAGE_LENGTHS.values()))
    with open(path, "rb") as f:
        f.seek(boundary)
        data = f.read(need)
    at_end = boundary + len(data) >= size
    for i in range(min(SYNC_WINDOW, len(data))):
        if _chain_ok(data, i, SYNC_MESSAGES):
            if not at_end and i + SYNC_MESSAGES * (2 + max(MESSAGE_LENGTHS.values())) > len(data):
                return None
            return boundary + i
    return None


def plan_splits(paths: list[str], split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[Split]:
    """Splits of the trace files ``paths`` (in order); see the module docstring.

    ``split_bytes`` <= 0 reads every file in one split.  A boundary with no split point within
    :data:`SYNC_WINDOW` bytes is dropped (its bytes go to the previous split).  No byte is searched
    twice: a boundary at or before the last split point is dropped, and one inside the window of a
    boundary without a split point is searched from that window's end, so that the time is linear
    in the file size whatever ``split_bytes``.  Raises :class:`SubcError` when a file cannot be read."""
    out: list[Split] = []
    for i, path in enumerate(paths):
        kind = file_kind(path)
        size = os.path.getsize(path)
        if kind == "pcap":
            out.append(Split(i, path, "pcap", 0, size))
            continue
        points = [0]
        if split_bytes > 0:
            searched = 0  # no split point starts in [points[-1] + 1, searched)
            for b in range(split_bytes, size, split_bytes):
                if b <= points[-1]:
                    continue
                start = max(b, searched)
                p = sync_point(path, start, size) if start < size else None
                if p is None:
                    searched = start + SYNC_WINDOW
                elif p > points[-1] and p < size:
                    points.append(p)
        points.append(size)
        out.extend(Split(i, path, "binaryfile", a, b) for a, b in zip(points, points[1:]))
    return out


def walk_binaryfile(data: bytes, base: int, path: str, last: bool) -> MessageBuffer:
    """The messages of the BinaryFILE bytes ``data`` (file offset ``base``), which must end exactly
    at a frame end.

    ``last``: ``data`` ends at the end of the file, where a zero length marks the end of the
    session.  Raises :class:`SubcError` naming ``path`` and the byte offset for a truncated length,
    a zero length before an unknown type, a frame running past the end (for a split that is not
    the last: past the split point, which means the split heuristic failed; rerun with
    ``--split-bytes 0``), or a length that differs from the ITCH length of its message type.
    """
    starts = array("q")
    append = starts.append
    n = len(data)
    pos = 0
    LEN = _LEN
    last_pos = n - 1
    end = n
    d = np.frombuffer(data, dtype=np.uint8)
    while pos < last_pos:  # the hot loop: one length prefix per message, checks vectorised below
        length = (data[pos] << 8) | data[pos + 1]
        if not length:
            body = pos + 2
            if body >= n and last:
                end = pos  # end-of-session marker
                break
            mtype = data[body] if body < n else None
            length = LEN[mtype] if mtype is not None else 0
            if not length:
                _check_lengths(d, _array(starts), pos, base, path)  # an earlier bad length explains it
                raise SubcError(
                    f"{path}: zero length prefix followed by unknown message type "
                    f"{bytes([mtype]) if mtype is not None else b''!r} at byte offset {base + pos}"
                )
        append(pos + 2)
        pos += 2 + length
    st = _array(starts)
    if pos == last_pos and end == n:
        _check_lengths(d, st, pos, base, path)
        raise SubcError(f"{path}: truncated length prefix at byte offset {base + pos}")
    if pos > n:
        _check_lengths(d, st[:-1], int(st[-1]) - 2, base, path)
        at = int(st[-1]) - 2
        length = pos - at - 2
        if last:
            raise SubcError(
                f"{path}: message of {length} bytes at byte offset {base + at} runs past the end of the file "
                f"({base + n} bytes)"
            )
        raise SubcError(
            f"{path}: message of {length} bytes at byte offset {base + at} crosses the split point at byte "
            f"offset {base + n}: no safe split point there (rerun with --split-bytes 0)"
        )
    lengths = _check_lengths(d, st, min(pos, end), base, path)
    zero = (d[st - 2] == 0) & (d[st - 1] == 0) if len(st) else np.zeros(0, dtype=bool)
    return MessageBuffer(d, st, lengths, st - 2 + base, np.zeros(len(st), np.int32), zero)


def _array(starts: array) -> np.ndarray:
    return np.frombuffer(starts, dtype=np.int64).copy() if len(starts) else np.zeros(0, np.int64)


def _check_lengths(d: np.ndarray, st: np.ndarray, end: int, base: int, path: str) -> np.ndarray:
    """Lengths of the messages starting at ``st`` (the last one ending at ``end``); raises
    :class:`SubcError` at the first whose length differs from the ITCH length of its type."""
    lengths = (np.r_[st[1:] - 2, end] - st).astype(np.int32)
    expected = _LEN_NP[d[st]] if len(st) else np.zeros(0, np.int32)
    bad = np.flatnonzero((expected != 0) & (expected != lengths))
    if len(bad):
        k = int(bad[0])
        raise SubcError(
            f"{path}: message type {bytes([d[st[k]]])!r} at byte offset {base + int(st[k]) - 2} has length "
            f"{int(lengths[k])}, expected {int(expected[k])}"
        )
    return lengths


def read_split(split: Split, udp_port: int | None = None) -> MessageBuffer:
    """Read the messages of ``split`` (see :func:`walk_binaryfile` and :func:`read_pcap`)."""
    if split.kind == "pcap":
        return read_pcap(split.path, udp_port)
    try:
        with open(split.path, "rb") as f:
            f.seek(split.start)
            data = f.read(split.stop - split.start)
        size = os.path.getsize(split.path)
    except OSError as e:
        raise SubcError(f"cannot read trace {split.path}: {e}") from e
    return walk_binaryfile(data, split.start, split.path, split.stop >= size)


_PCAP_LE = {b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"}
_BOM_LE, _BOM_BE = b"\x4d\x3c\x2b\x1a", b"\x1a\x2b\x3c\x4d"
_NG_SHB, _NG_IDB, _NG_PB, _NG_SPB, _NG_EPB = 0x0A0D0D0A, 1, 2, 3, 6
#: Smallest length of a pcapng block by type (type, length, body, trailing length).
_NG_MIN = {_NG_SHB: 28, _NG_IDB: 20, _NG_PB: 32, _NG_SPB: 16, _NG_EPB: 32}


def _records(f, path: str):
    """Yield (byte offset of the record, link type, frame bytes) for every packet record of the pcap
    or pcapng capture open as ``f`` (pcapng: enhanced, simple and obsolete packet blocks; other
    blocks are skipped).  Lengths are checked against the file size before anything is read.

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
    if magic in PCAP_MAGICS:
        e = "<" if magic in _PCAP_LE else ">"
        linktype = struct.unpack(e + "I", take(24, 0, "the pcap file header")[20:24])[0] & 0xFFFF
        pos = 24
        while pos < size:
            caplen = struct.unpack(e + "I", take(16, pos, "the pcap record header")[8:12])[0]
            yield pos, linktype, take(caplen, pos + 16, f"the frame ({caplen} bytes)")
            pos += 16 + caplen
        return
    if magic != PCAPNG_MAGIC:
        raise SubcError(f"{path}: not a pcap or pcapng capture: magic number {magic!r} at byte offset 0")
    e, links, pos = "<", [], 0
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
            raise SubcError(f"{path}: pcapng block of type {btype:#x} at byte offset {pos} has length {blen}, "
                            f"less than {least}")
        if blen > size - pos:
            raise SubcError(f"{path}: pcapng block of {blen} bytes at byte offset {pos} runs past the end of the file "
                            f"({size} bytes)")
        block += f.read(blen - len(block))
        if struct.unpack(e + "I", block[-4:])[0] != blen:
            raise SubcError(f"{path}: pcapng block at byte offset {pos}: trailing length differs from {blen}")
        body = block[8:-4]
        frame = None
        if btype == _NG_IDB:
            links.append(struct.unpack(e + "HxxI", body[:8]))  # (link type, snap length)
        elif btype in (_NG_EPB, _NG_PB):
            iface, caplen = struct.unpack(e + "I8xI" if btype == _NG_EPB else e + "H10xI", body[:16])
            if caplen > len(body) - 20:
                raise SubcError(f"{path}: packet block at byte offset {pos} has a captured length of {caplen} "
                                f"bytes, more than the {len(body) - 20} it holds")
            frame = body[20 : 20 + caplen]
        elif btype == _NG_SPB:
            iface, orig = 0, struct.unpack(e + "I", body[:4])[0]
            snap = links[0][1] if links else 0
            frame = body[4 : 4 + min(orig, snap or orig)]
        if frame is not None:
            if iface >= len(links):
                raise SubcError(f"{path}: packet block at byte offset {pos} names interface {iface}, "
                                f"but {len(links)} are declared before it")
            yield pos, links[iface][0], frame
        pos += blen


def _udp(linktype: int, frame: bytes):
    """The UDP datagram (``dpkt.udp.UDP``) of a frame, or None when it is not UDP over IPv4/IPv6 (the
    link-layer header decodes, but what it carries is not IP, or dpkt cannot decode the IP header).

    Raises ``dpkt.UnpackError`` (``dpkt.NeedData`` for a short frame), ValueError or IndexError
    when dpkt cannot decode the link-layer header (or a layer it does not catch errors of)."""
    import dpkt

    if linktype == dpkt.pcap.DLT_EN10MB:
        ip = dpkt.ethernet.Ethernet(frame).data
    elif linktype == dpkt.pcap.DLT_LINUX_SLL:
        ip = dpkt.sll.SLL(frame).data
    elif linktype in (dpkt.pcap.DLT_RAW, 101):  # 101: LINKTYPE_RAW
        ip = dpkt.ip.IP(frame) if frame[:1] and frame[0] >> 4 == 4 else dpkt.ip6.IP6(frame)
    else:
        return None
    if not isinstance(ip, (dpkt.ip.IP, dpkt.ip6.IP6)):
        return None
    udp = ip.data
    return udp if isinstance(udp, dpkt.udp.UDP) else None


def read_pcap(path: str, udp_port: int | None = None) -> MessageBuffer:
    """Every MoldUDP64 message of the pcap or pcapng capture at ``path``.

    UDP datagrams (to ``udp_port`` when given) are decoded as MoldUDP64 downstream packets (the
    payload ends where the UDP length says); heartbeats and end-of-session packets carry no
    messages; frames that are not UDP over IPv4/IPv6 are skipped.  Raises :class:`SubcError`
    naming the file, the frame number and the byte offset of its record when the link-layer header
    does not decode, a datagram is truncated or is not a valid MoldUDP64 packet, or when the
    capture cannot be read (see :func:`_records`)."""
    import dpkt

    body = bytearray()
    starts, lengths, frames, indexes = array("q"), array("i"), array("q"), array("i")
    try:
        f = open(path, "rb")
    except OSError as e:
        raise SubcError(f"cannot read trace {path}: {e}") from e
    with f:
        for frame_no, (at, linktype, frame) in enumerate(_records(f, path), start=1):
            where = f"{path}: frame {frame_no}"
            try:
                udp = _udp(linktype, frame)
            except (dpkt.UnpackError, ValueError, IndexError) as e:
                raise SubcError(f"{where}: the link-layer header (link type {linktype}) does not decode: "
                                f"{str(e) or type(e).__name__}; the frame's record is at byte offset {at}") from None
            if udp is None or (udp_port is not None and udp.dport != udp_port):
                continue
            payload = bytes(udp.data)
            if udp.ulen:  # 0: IPv6 jumbogram, the payload is all there is
                if udp.ulen < 8 or udp.ulen - 8 > len(payload):
                    raise SubcError(f"{where}: UDP length {udp.ulen} but {8 + len(payload)} bytes captured "
                                    f"(truncated datagram); the frame's record is at byte offset {at}")
                payload = payload[: udp.ulen - 8]
            try:
                pkt = decode_packet(payload)
            except SubcError as e:
                raise SubcError(f"{where}: {e.message} (in the UDP payload); the frame's record is at byte "
                                f"offset {at}") from None
            for i, msg in enumerate(pkt.messages):
                starts.append(len(body))
                lengths.append(len(msg))
                frames.append(frame_no)
                indexes.append(i)
                body += msg

    def arr(a, dt):
        return np.frombuffer(a, dtype=dt).copy() if len(a) else np.zeros(0, dt)

    return MessageBuffer(np.frombuffer(bytes(body), dtype=np.uint8), arr(starts, np.int64), arr(lengths, np.int32),
                         arr(frames, np.int64), arr(indexes, np.int32))
