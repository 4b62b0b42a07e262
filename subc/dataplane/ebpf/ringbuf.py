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

import ctypes as ct
import mmap
import os
import select
import struct
from pathlib import Path

from ...errors import SubcError
from .bpf_objects import map_max_entries, obj_get

BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30
HDR_BYTES = 8
PAGE = mmap.PAGESIZE
_U32 = struct.Struct("<I")


_libc = ct.CDLL(None, use_errno=True)
_libc.mmap.restype = ct.c_void_p
_libc.mmap.argtypes = [ct.c_void_p, ct.c_size_t, ct.c_int, ct.c_int, ct.c_int, ct.c_long]
_libc.munmap.restype = ct.c_int
_libc.munmap.argtypes = [ct.c_void_p, ct.c_size_t]
_MAP_FAILED = ct.c_void_p(-1).value


def _map(fd: int, length: int, prot: int, offset: int) -> int:
    addr = _libc.mmap(None, length, prot, mmap.MAP_SHARED, fd, offset)
    if addr in (None, _MAP_FAILED):
        raise OSError(ct.get_errno(), os.strerror(ct.get_errno()))
    return int(addr)


class RingReader:
    """Reads the ring buffer of map descriptor ``fd`` holding ``size`` data bytes (a power of 2,
    a multiple of the page size).  :attr:`address` is where the data pages start in this
    process (mapped twice in a row: ``2 * size`` bytes), for a reader in C.  Raises SubcError
    when it cannot be mapped."""

    def __init__(self, fd: int, size: int):
        if size <= 0 or size & (size - 1) or size % PAGE:
            raise SubcError(f"a BPF ring buffer of {size} bytes: not a power of 2 of pages")
        self.fd, self.size, self.mask = fd, size, size - 1
        try:
            self._cons_addr = _map(fd, PAGE, mmap.PROT_READ | mmap.PROT_WRITE, 0)
        except OSError as e:
            raise SubcError(f"cannot map the BPF ring buffer ({size} bytes): {e}") from None
        try:
            self._prod_addr = _map(fd, PAGE + 2 * size, mmap.PROT_READ, PAGE)
        except OSError as e:
            _libc.munmap(self._cons_addr, PAGE)
            raise SubcError(f"cannot map the BPF ring buffer ({size} bytes): {e}") from None
        self._cons = ct.c_uint64.from_address(self._cons_addr)
        self._prod = ct.c_uint64.from_address(self._prod_addr)
        self.address = self._prod_addr + PAGE
        self._data = memoryview((ct.c_char * (2 * size)).from_address(self.address)).cast("B")
        self._poll = select.epoll()
        self._poll.register(fd, select.EPOLLIN)
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # wake(): another thread has work
        self._poll.register(self._wake, select.EPOLLIN)

    @property
    def consumer(self) -> int:
        """The consumer position (bytes ever released)."""
        return int(self._cons.value)

    @property
    def producer(self) -> int:
        """The producer position (bytes ever reserved)."""
        return int(self._prod.value)

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
            self._cons.value = pos

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` s for the kernel's notice that records were committed, or
        :meth:`wake`."""
        events = self._poll.poll(timeout_s)
        for efd, _ in events:
            if efd == self._wake:
                try:
                    os.eventfd_read(self._wake)
                except BlockingIOError:
                    pass
        return bool(events)

    def wake(self) -> None:
        """End a :meth:`wait` of another thread now (thread-safe)."""
        os.eventfd_write(self._wake, 1)

    def close(self) -> None:
        """Unmap the ring (the descriptor stays the caller's)."""
        self._data.release()
        self._poll.close()
        os.close(self._wake)
        _libc.munmap(self._prod_addr, PAGE + 2 * self.size)
        _libc.munmap(self._cons_addr, PAGE)


def open_pinned_ring(path: str | os.PathLike) -> tuple[int, RingReader]:
    """(descriptor, reader) of the ring buffer pinned at ``path``; SubcError when there is none."""
    fd = obj_get(Path(path))
    try:
        return fd, RingReader(fd, map_max_entries(fd))
    except BaseException:
        os.close(fd)
        raise
