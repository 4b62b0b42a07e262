"""The one interface of the live writers: what :class:`~subc.dataplane.live_broker.LiveBroker`
needs of a data plane to publish a live diagram's changes (docs/serve.md "Live subscriptions").

Two writers implement it: :class:`~subc.dataplane.ebpf.live_maps.LiveMaps` (BPF map entries of
the program of ``subc serve``) and :class:`~subc.dataplane.p4rt.live_entries.LiveEntries` (table
entries of a ``subc serve-program`` switch, over P4Runtime).  Both lower a delivery node with
:mod:`subc.ir.lowering`, as the batch compiler does (tests/test_live_lowering.py).
"""

from __future__ import annotations

from typing import Protocol

from ..ir.incremental import Node


class LiveWriter(Protocol):
    """Writes delivery nodes of a live diagram into a data plane.

    ``root_slots``: the versions of the root (root states 1..root_slots) a change may write into
    while packets read another.  :meth:`write` and :meth:`clear` buffer; :meth:`flush` applies the
    buffer (raising SubcError, with nothing applied or everything undone, when the data plane
    refuses); :meth:`write_root` makes a root slot encode a root node (:meth:`refresh_root` part
    of the way, ahead of time); :meth:`switch` makes a slot the live root with one atomic write."""

    root_slots: int

    def write(self, node: Node, state: int | None = None) -> None:
        """Buffer every entry of (new) ``node`` under its state, or under root slot ``state``."""
        ...

    def clear(self, node: Node, state: int | None = None) -> None:
        """Buffer the deletion of freed ``node``'s entries (under its state or ``state``)."""
        ...

    def flush(self) -> None:
        """Apply the buffered writes and deletions."""
        ...

    def write_root(self, slot: int, root: Node, spans: list[tuple[int, int]] | None) -> None:
        """Make root slot ``slot`` encode ``root``; ``spans``: the level-0 values whose entries
        may differ from what the slot held (None: anywhere)."""
        ...

    def refresh_root(self, slot: int, root: Node, limit: int) -> int | None:
        """Buffer at most ``limit`` of the writes that make free root slot ``slot`` encode
        ``root`` (the slot is not live: done off the path of changes, so that the change that
        next takes the slot has little left to write).  Returns the writes buffered (0: the slot
        encodes ``root``), or None when this writer does not refresh (its root writes are cheap)."""
        ...

    def switch(self, slot: int) -> None:
        """Make ``slot`` the live root (one write: every later packet reads it)."""
        ...
