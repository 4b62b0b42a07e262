"""The journal feed's fast path: the C walk of ``feed_walk.c`` (built by :mod:`.native`) over the
ring's memory, with one output buffer per journaled recipient, and the appends of what it took.

:class:`FastPath` is used by :class:`~.journal_feed.JournalFeed` only: the walk takes the copies
that continue their recipient's stream (the common case: in order, payload in the record, or
its payload record right after it) and stops at anything else, which the feed's Python path
handles (see feed_walk.c).
"""

from __future__ import annotations

import ctypes as ct
import os
from collections import Counter
from typing import Callable

import numpy as np

from .journal import Journal, JournalError
from .native import FeedOut, feed_walk, feed_write

#: Bytes of SoupBinTCP packets a recipient's buffer holds between two appends.
BUFFER_BYTES = 256 << 10


class FastPath:
    """The C walk for the recipients ``recipients`` (their journals from ``journal_of``) over
    ``ring`` (a reader with ``address`` and ``mask``: the ring's data pages, mapped twice).
    :attr:`ready` is False when the walk cannot be built here (no C compiler)."""

    def __init__(self, ring, journal_of: Callable[[int], Journal | None], recipients: list[int]):
        self.fn = feed_walk() if hasattr(ring, "address") else None
        self.write_fn = feed_write() if self.fn is not None else None
        self.ready = self.fn is not None
        self.ring, self.journal_of = ring, journal_of
        self.recipients = sorted(r for r in set(recipients) if r >= 0)
        n = (self.recipients[-1] + 1) if self.recipients else 0
        self.outs = (FeedOut * n)()
        # per recipient with a buffer: its FeedOut, its packets and offsets as views (which keep
        # the ctypes buffers the C side writes alive)
        self._views: dict[int, tuple[FeedOut, memoryview, np.ndarray]] = {}
        self._bound: dict[int, object] = {}  # the segment whose session outs[r].seg_session holds
        for r in self.recipients:
            j = journal_of(r)
            if j is not None:
                self.set_next(r, j.next_seq)
        self.errors: Counter = Counter()  # failed appends (the feed adds them to its counters)
        self._pos = ct.c_uint64(0)
        self._records = ct.c_uint64(0)

    def walk(self, pos: int, prod: int) -> tuple[int, int, int]:
        """Walk from ring position ``pos`` to ``prod``: (why it stopped: ``native.WALK_*``, the
        position of the first record not taken, records taken)."""
        assert self.fn is not None
        self._pos.value, self._records.value = pos, 0
        why = self.fn(
            self.ring.address,
            self.ring.mask,
            ct.byref(self._pos),
            prod,
            self.outs,
            len(self.outs),
            ct.byref(self._records),
        )
        return int(why), int(self._pos.value), int(self._records.value)

    def flush(self, now: float) -> int:
        """Append what the walk took to the journals (one write per recipient, made by the C
        side when the recipient's open segment takes it whole, else by the journal); returns
        the messages appended.  The caller holds the journals' lock.  A write that fails leaves the
        segment as it was and its messages a hole (:meth:`Journal.skip`), counted in
        :attr:`errors`."""
        active = []
        for r, (o, buf, offs) in self._views.items():
            if not o.n:
                continue
            j = self.journal_of(r)
            if j is None:  # (the walk takes a recipient's copies only while it has a journal)
                raise AssertionError(f"the fast path took copies of recipient {r}, which has no journal")
            seg = j.append_target(o.first_seq) if self.write_fn is not None else None
            if seg is not None:
                if seg is not self._bound.get(r):  # the segment's session, once
                    o.seg_session[:] = seg.session
                    self._bound[r] = seg
                o.fd, o.seg_size, o.seg_room = seg.fd, seg.size, j.segment_bytes - seg.size
            active.append((o, j, seg, buf, offs))
        if not active:
            return 0
        if self.write_fn is not None:
            self.write_fn(self.outs, len(self.outs))
        total = 0
        for o, j, seg, buf, offs in active:
            n = o.n
            try:
                if o.err:
                    raise OSError(o.err, os.strerror(o.err))
                if o.wrote and seg is not None:  # written by the C side: the offsets are the segment's
                    j.appended(seg, offs[:n], o.seg_size, now)
                else:
                    j.append_indexed(o.first_seq, buf[: o.len], offs[:n], now, bytes(o.session))
                total += n
            except (JournalError, OSError) as e:  # as the feed's Python path: the messages are a hole
                self.errors["write_errors"] += 1
                self.errors["write_error:" + str(e)[:60]] += 1
                j.skip(o.first_seq + n)
            o.n = o.len = o.wrote = o.err = 0
            o.fd = -1
        return total

    def set_next(self, r: int, seq: int) -> None:
        """Recipient ``r``'s next sequence number for the walk (0: the walk leaves its records);
        its output buffer is made on first use."""
        if not 0 <= r < len(self.outs):
            return
        if seq and r not in self._views:
            buf = ct.create_string_buffer(BUFFER_BYTES)
            offs = (ct.c_uint64 * (BUFFER_BYTES // 3))()
            o = self.outs[r]
            o.buf, o.offs = ct.addressof(buf), ct.addressof(offs)
            o.cap, o.offs_cap = BUFFER_BYTES, BUFFER_BYTES // 3
            o.fd = -1  # (set for subc_feed_write only)
            self._views[r] = (o, memoryview(buf), np.frombuffer(memoryview(offs), np.uint64))
        self.outs[r].next_seq = seq
