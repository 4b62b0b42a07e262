"""Where the messages of a trace file are: BinaryFILE splits and pcap/pcapng captures.

**BinaryFILE** (2-byte big-endian length, then the message) has no sync marker, so a large file is
cut into splits of about ``split_bytes`` and each split boundary is moved forward to the first offset
where :data:`SYNC_MESSAGES` consecutive frames are well formed: every length equals the length the
spec gives the frame's message type (a :class:`~subc.wire.decoder.TypeTable`).  A zero length (the
quirk of some files: the type's own length) counts as no evidence there: two zero bytes before a
type letter are common inside messages (zero-padded fields), and chains of them made false split
points (a hypothesis-drawn trace of zero-filled Add Orders synced 18 bytes into a message).
Near the end of a file, where fewer frames follow
(a chain of a few frames ending exactly at the end of the file is too often found inside a
message: a 36-byte Add Order held a 12-byte "frame" ending there), and wherever no chain is found,
the split point is instead the first frame at or after the boundary found by walking the length
prefixes from the previous split point (exact; when that is at most :data:`WALK_LIMIT` bytes back).
Each task then walks
its split from its start; the walk must end exactly on the next split's start, else the task raises
(:func:`walk_binaryfile`), so a wrong split point is an error, never silently wrong data.  Pass
``split_bytes=0`` to read each file in one task.

**pcap / pcapng** captures are read one file per task by the one capture reader,
:mod:`subc.wire.capture`: every UDP datagram to the feed port (``udp_port``, else the most common
destination port of MoldUDP64 datagrams) is decoded as a MoldUDP64 downstream packet
(:mod:`subc.wire.moldudp64`) and each of its messages is a row.  Other frames (other protocols and
ports, fragments, cut frames) and malformed MoldUDP64 packets are counted by kind in a
:class:`~subc.wire.capture.CaptureStats` and skipped (``strict``: an error naming the file, the
frame and the byte offset of its record); a capture file that cannot be read is an error.

Both produce a :class:`MessageBuffer`: the message bytes and, per message, its start offset in that
buffer, its length and its position in the source (BinaryFILE: byte offset of the length prefix;
pcap: 1-based frame number and message index in the packet).
"""

from __future__ import annotations

import ctypes as ct
import os
from array import array
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import SubcError
from ..recovery.native import build
from ..wire.capture import CaptureStats, detect_feed_ports, iter_moldudp64, read_datagrams
from ..wire.pcap_records import PCAP_MAGICS, PCAPNG_MAGIC
from ..wire.decoder import TypeTable

#: Consecutive well-formed frames that make a BinaryFILE split point.
SYNC_MESSAGES = 32
#: How far past a split boundary to look for a split point (bytes).
SYNC_WINDOW = 1 << 16
#: Default split size (bytes).
DEFAULT_SPLIT_BYTES = 64 << 20
#: How far back from a boundary the planner walks frames from the previous split point (bytes).
WALK_LIMIT = 4 << 20


def type_lengths(types: TypeTable, d: np.ndarray, st: np.ndarray) -> np.ndarray:
    """The spec's length (int32, 0 when unknown) of the messages starting at byte offsets ``st`` of
    ``d`` (uint8), by their type key (``types``); keys past the end of ``d`` read as unknown."""
    if not len(st) or not types.lengths:
        return np.zeros(len(st), np.int32)
    from .gather import gather_bits

    need = (types.bit_offset + types.width + 7) // 8
    ok = st + need <= len(d)
    padded = np.concatenate([d, np.zeros(16, np.uint8)])
    keys = (
        gather_bits(padded, st.astype(np.int64) * 8 + types.bit_offset, max(types.width, 1))
        if types.width
        else np.zeros(len(st), np.uint64)
    )
    known = np.array(sorted(types.lengths), dtype=np.uint64)
    lens = np.array([types.lengths[int(k)] for k in known], dtype=np.int32)
    pos = np.minimum(np.searchsorted(known, keys), len(known) - 1)
    hit = ok & (known[pos] == keys)
    return np.where(hit, lens[pos], 0).astype(np.int32)


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
    message type; None for pcap) and ``times`` (int64: a capture's time of the message's frame in
    ns since the epoch, -1 when the record has none; None for BinaryFILE)."""

    data: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    positions: np.ndarray
    indexes: np.ndarray
    zero_length: np.ndarray | None = None
    times: np.ndarray | None = None

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


def _chain_ok(data: bytes, pos: int, count: int, types: TypeTable) -> bool:
    """True when ``count`` well-formed frames start at ``pos`` in ``data``."""
    n = len(data)
    for _ in range(count):
        if pos + 3 > n:
            return False
        length = (data[pos] << 8) | data[pos + 1]
        expected = types.length_of(data, pos + 2)
        if not expected or length != expected:  # a zero length (the quirk) is no sync evidence
            return False
        pos += 2 + expected
        if pos > n:
            return False
    return True


def sync_point(path: str, boundary: int, size: int, types: TypeTable) -> int | None:
    """The first offset at or after ``boundary`` where :data:`SYNC_MESSAGES` well-formed frames
    start (``size`` = file size in bytes), or None within :data:`SYNC_WINDOW` bytes (or when the
    spec gives no message type lengths, or fewer frames follow before the end of the file)."""
    if not types.lengths:
        return None
    longest = max(types.lengths.values())
    need = SYNC_WINDOW + SYNC_MESSAGES * (2 + longest)
    with open(path, "rb") as f:
        f.seek(boundary)
        data = f.read(need)
    for i in range(min(SYNC_WINDOW, len(data))):
        if _chain_ok(data, i, SYNC_MESSAGES, types):  # the whole chain lies in data (need covers it)
            return boundary + i
    return None


def walked_point(path: str, start: int, boundary: int, size: int, types: TypeTable) -> int | None:
    """The first frame start at or after ``boundary`` and before the end of the file (``size``
    bytes), walking the length prefixes from ``start`` (a frame start), as :func:`walk_binaryfile`
    does; None when ``boundary`` is more than :data:`WALK_LIMIT` bytes after ``start``, or the walk
    meets a zero length it cannot resolve or the end of the file first."""
    if boundary - start > WALK_LIMIT:
        return None
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(min(size, boundary + 2 + 0xFFFF) - start)
    n, pos, goal = len(data), 0, boundary - start
    while pos < goal:
        if pos + 2 > n:
            return None
        length = (data[pos] << 8) | data[pos + 1]
        if not length:  # the zero-length quirk: the type's length
            length = types.length_of(data, pos + 2) or 0 if pos + 2 < n else 0
            if not length:
                return None
        pos += 2 + length
    return start + pos if start + pos < size else None


def plan_splits(
    paths: list[str], split_bytes: int = DEFAULT_SPLIT_BYTES, types: TypeTable | None = None
) -> list[Split]:
    """Splits of the trace files ``paths`` (in order); see the module docstring.

    ``split_bytes`` <= 0 reads every file in one split.  A boundary with no split point within
    :data:`SYNC_WINDOW` bytes is dropped (its bytes go to the previous split).  No byte is searched
    twice: a boundary at or before the last split point is dropped, and one inside the window of a
    boundary without a split point is searched from that window's end, so that the time is linear
    in the file size whatever ``split_bytes``.  Where no chain is found, the boundary's split point
    is walked from the previous split point (:func:`walked_point`); a walk that fails is not
    tried again from the same split point.  ``types``: the spec's message type lengths (None:
    one split per file).  Raises :class:`SubcError` when a file cannot be read."""
    out: list[Split] = []
    for i, path in enumerate(paths):
        kind = file_kind(path)
        size = os.path.getsize(path)
        if kind == "pcap":
            out.append(Split(i, path, "pcap", 0, size))
            continue
        points = [0]
        if split_bytes > 0 and types is not None:
            searched = 0  # no split point starts in [points[-1] + 1, searched)
            walkable = True  # no walk from points[-1] has failed
            for b in range(split_bytes, size, split_bytes):
                if b <= points[-1]:
                    continue
                start = max(b, searched)
                p = sync_point(path, start, size, types) if start < size else None
                if p is None:
                    searched = start + SYNC_WINDOW
                    if walkable:
                        p = walked_point(path, points[-1], b, size, types)
                        walkable = p is not None
                if p is not None and points[-1] < p < size:
                    points.append(p)
                    walkable = True
        points.append(size)
        out.extend(Split(i, path, "binaryfile", a, b) for a, b in zip(points, points[1:]))
    return out


def walk_binaryfile(data: bytes, base: int, path: str, last: bool, types: TypeTable) -> MessageBuffer:
    """The messages of the BinaryFILE bytes ``data`` (file offset ``base``), which must end exactly
    at a frame end.

    ``last``: ``data`` ends at the end of the file, where a zero length marks the end of the
    session.  ``types``: the spec's message type lengths.  Raises :class:`SubcError` naming ``path``
    and the byte offset for a truncated length, a zero length before a type the spec gives no length
    for, or a frame running past the end (for a split that is not the last: past the split point,
    which means the split heuristic failed; rerun with ``--split-bytes 0``); such an error names the
    first earlier frame whose length differs from its type's, which is the likely cause.  A length
    that differs from its type's is otherwise no error here: the decoder counts it.
    """
    starts = array("q")
    append = starts.append
    n = len(data)
    pos = 0
    length_of = types.length_of
    last_pos = n - 1
    end = n
    d = np.frombuffer(data, dtype=np.uint8)
    fast = frame_walk()
    runs: list[np.ndarray] = []  # the starts found by the C walk, and by this loop before each run
    while pos < last_pos:  # the hot loop: one length prefix per message, checks vectorised below
        length = (data[pos] << 8) | data[pos + 1]
        if length and fast is not None:  # a run of non-zero lengths in C, then this loop again
            runs.append(_array(starts))
            starts = array("q")
            append = starts.append
            out = np.empty((n - pos) // 3 + 1, dtype=np.int64)  # a frame takes 3 bytes or more
            count = ct.c_int64(0)
            pos = int(fast(d.ctypes.data, n, pos, out.ctypes.data, len(out), ct.byref(count)))
            runs.append(out[: count.value].copy())
            continue
        if not length:
            body = pos + 2
            if body >= n and last:
                end = pos  # end-of-session marker
                break
            length = length_of(data, body) or 0 if body < n else 0
            if not length:
                st = np.concatenate([*runs, _array(starts)])
                _check_lengths(d, st, pos, base, path, types)  # an earlier bad length explains it
                raise SubcError(
                    f"{path}: zero length prefix followed by a message type the spec gives no length for "
                    f"({data[body : body + 1]!r}) at byte offset {base + pos}"
                )
        append(pos + 2)
        pos += 2 + length
    st = np.concatenate([*runs, _array(starts)]) if runs else _array(starts)
    if pos == last_pos and end == n:
        _check_lengths(d, st, pos, base, path, types)
        raise SubcError(f"{path}: truncated length prefix at byte offset {base + pos}")
    if pos > n:
        _check_lengths(d, st[:-1], int(st[-1]) - 2, base, path, types)
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
    lengths = (np.r_[st[1:] - 2, min(pos, end)] - st).astype(np.int32) if len(st) else np.zeros(0, np.int32)
    zero = (d[st - 2] == 0) & (d[st - 1] == 0) if len(st) else np.zeros(0, dtype=bool)
    return MessageBuffer(d, st, lengths, st - 2 + base, np.zeros(len(st), np.int32), zero)


@lru_cache(maxsize=1)
def frame_walk():
    """The C walk of :func:`walk_binaryfile`'s hot loop (``frame_walk.c``, built at first use by
    :func:`subc.recovery.native.build`) as a ctypes function, or None when it cannot be built
    here: the loop then runs in Python (the same frames, slower)."""
    lib = build(Path(__file__).with_name("frame_walk.c"))
    if lib is None:
        return None
    fn = lib.subc_frame_walk
    fn.restype = ct.c_int64
    fn.argtypes = [ct.c_void_p, ct.c_int64, ct.c_int64, ct.c_void_p, ct.c_int64, ct.POINTER(ct.c_int64)]
    return fn


def _array(starts: array) -> np.ndarray:
    return np.frombuffer(starts, dtype=np.int64).copy() if len(starts) else np.zeros(0, np.int64)


def _check_lengths(d: np.ndarray, st: np.ndarray, end: int, base: int, path: str, types: TypeTable) -> np.ndarray:
    """Lengths of the messages starting at ``st`` (the last one ending at ``end``); raises
    :class:`SubcError` at the first whose length differs from its type's length in the spec."""
    lengths = (np.r_[st[1:] - 2, end] - st).astype(np.int32)
    expected = type_lengths(types, d, st)
    bad = np.flatnonzero((expected != 0) & (expected != lengths))
    if len(bad):
        k = int(bad[0])
        raise SubcError(
            f"{path}: message type {bytes([d[st[k]]])!r} at byte offset {base + int(st[k]) - 2} has length "
            f"{int(lengths[k])}, expected {int(expected[k])}"
        )
    return lengths


def read_split(
    split: Split,
    types: TypeTable,
    udp_port: int | None = None,
    stats: CaptureStats | None = None,
    strict: bool = False,
    ports: list[int] | None = None,
) -> MessageBuffer:
    """Read the messages of ``split`` (see :func:`walk_binaryfile` and :func:`read_pcap`; ``stats`` and
    ``strict`` apply to captures only)."""
    if split.kind == "pcap":
        return read_pcap(split.path, udp_port, ports=ports, stats=stats, strict=strict)
    try:
        with open(split.path, "rb") as f:
            f.seek(split.start)
            data = f.read(split.stop - split.start)
        size = os.path.getsize(split.path)
    except OSError as e:
        raise SubcError(f"cannot read trace {split.path}: {e}") from e
    return walk_binaryfile(data, split.start, split.path, split.stop >= size, types)


def read_pcap(
    path: str, udp_port: int | None = None, ports=None, stats: CaptureStats | None = None, strict: bool = False
) -> MessageBuffer:
    """Every MoldUDP64 message of the pcap or pcapng capture at ``path`` (:mod:`subc.wire.capture`).

    The feed ports are ``udp_port`` and ``ports`` (an iterable of ints) when either is given, else the
    port :func:`~subc.wire.capture.detect_feed_ports` finds (the most common destination port of
    the datagrams that decode as MoldUDP64).  Datagrams to a feed port are decoded as MoldUDP64
    downstream packets (the payload ends where the UDP length says); heartbeats and end-of-session
    packets carry no messages.  Every other frame, and every feed datagram that is not a valid
    MoldUDP64 packet, is counted by kind in ``stats`` (a
    :class:`~subc.wire.capture.CaptureStats`, also made when None) and skipped; with ``strict``
    the first one raises :class:`SubcError` naming the file, the frame number and the byte offset
    of its record.  A capture that cannot be read raises SubcError with the byte offset (see
    :func:`~subc.wire.pcap_records.read_records`)."""
    stats = stats if stats is not None else CaptureStats()
    feed: set[int] | list[int]  # the feed ports
    if udp_port is not None or ports is not None:
        feed = set(ports or ()) | ({udp_port} if udp_port is not None else set())
    else:
        feed = detect_feed_ports(path, stats)
    body = bytearray()
    starts, lengths, frames, indexes, times = array("q"), array("i"), array("q"), array("i"), array("q")
    for dg, pkt in iter_moldudp64(read_datagrams(path, feed, stats, strict), stats, strict, path):
        t = dg.time_ns if dg.time_ns is not None else -1
        for i, msg in enumerate(pkt.messages):
            starts.append(len(body))
            lengths.append(len(msg))
            frames.append(dg.frame)
            indexes.append(i)
            times.append(t)
            body += msg

    def arr(a, dt):
        return np.frombuffer(a, dtype=dt).copy() if len(a) else np.zeros(0, dt)

    return MessageBuffer(
        np.frombuffer(bytes(body), dtype=np.uint8),
        arr(starts, np.int64),
        arr(lengths, np.int32),
        arr(frames, np.int64),
        arr(indexes, np.int32),
        times=arr(times, np.int64),
    )
