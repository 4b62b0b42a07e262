"""A BPF ring buffer (BPF_MAP_TYPE_RINGBUF) read through its memory mapping, as libbpf's
``ring_buffer__consume`` does (kernel/bpf/ringbuf.c, tools/lib/bpf/ringbuf.c), with the positions
in the reader's hands: :meth:`RingReader.read` returns the committed records from a read position
without releasing them, :meth:`RingReader.release` gives their space back to the producers.  A
reader that has read up to the producer position it read *after* seeing a record knows it has
seen every record reserved before that one was committed (subc_journal.h "Order" relies on it).

Layout of the mapping (``mmap`` of the map's descriptor): the consumer position's page (read and
write, offset 0), then the producer position's page and the data pages, mapped twice in a row so
that a record that wraps reads as one piece (read only, offset one page).  A record is an 8-byte
header (length with BPF_RINGBUF_BUSY_BIT while reserved and BPF_RINGBUF_DISCARD_BIT when
discarded; page offset) and its bytes, rounded up to 8 bytes.
"""

from __future__ import annotations

import mmap
import os
import select
import struct
from pathlib import Path

from ...errors import SubcError
from .bpf import map_max_entries, obj_get

BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30
HDR_BYTES = 8
PAGE = mmap.PAGESIZE
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


class RingReader:
    """Reads the ring buffer of map descriptor ``fd`` holding ``size`` data bytes (a power of 2,
    a multiple of the page size).  Raises SubcError when it cannot be mapped."""

    def __init__(self, fd: int, size: int):
        if size <= 0 or size & (size - 1) or size % PAGE:
            raise SubcError(f"a BPF ring buffer of {size} bytes: not a power of 2 of pages")
        self.fd, self.size, self.mask = fd, size, size - 1
        try:
            self._cons = mmap.mmap(fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
            self._prod = mmap.mmap(fd, PAGE + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=PAGE)
        except OSError as e:
            raise SubcError(f"cannot map the BPF ring buffer ({size} bytes): {e}") from None
        self._data = memoryview(self._prod)[PAGE:]
        self._poll = select.epoll()
        self._poll.register(fd, select.EPOLLIN)

    @property
    def consumer(self) -> int:
        """The consumer position (bytes ever released)."""
        return int(_U64.unpack_from(self._cons, 0)[0])

    @property
    def producer(self) -> int:
        """The producer position (bytes ever reserved)."""
        return int(_U64.unpack_from(self._prod, 0)[0])

    def read(self, pos: int, limit: int | None = None) -> tuple[list[tuple[int, memoryview]], int]:
        """((position, bytes) of each record committed from position ``pos`` on, up to the first
        still reserved or to the producer position, discarded ones left out; the position after
        them).  ``limit`` bounds the records returned.  The memoryviews are valid until
        :meth:`release` passes them."""
        prod = self.producer
        out: list[tuple[int, memoryview]] = []
        data, mask = self._data, self.mask
        while pos < prod and (limit is None or len(out) < limit):
            at = pos & mask
            length = _U32.unpack_from(data, at)[0]
            if length & BUSY_BIT:
                break
            n = length & ~(BUSY_BIT | DISCARD_BIT)
            if not length & DISCARD_BIT:
                out.append((pos, data[at + HDR_BYTES : at + HDR_BYTES + n]))
            pos += (n + HDR_BYTES + 7) & ~7
        return out, pos

    def release(self, pos: int) -> None:
        """Give the space before position ``pos`` back to the producers (never backwards)."""
        if pos > self.consumer:
            _U64.pack_into(self._cons, 0, pos)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` s for the kernel's notice that records were committed."""
        return bool(self._poll.poll(timeout_s))

    def close(self) -> None:
        """Unmap the ring (the descriptor stays the caller's)."""
        self._data.release()
        self._poll.close()
        self._prod.close()
        self._cons.close()


def open_pinned_ring(path: str | os.PathLike) -> tuple[int, RingReader]:
    """(descriptor, reader) of the ring buffer pinned at ``path``; SubcError when there is none."""
    fd = obj_get(Path(path))
    try:
        return fd, RingReader(fd, map_max_entries(fd))
    except BaseException:
        os.close(fd)
        raise
