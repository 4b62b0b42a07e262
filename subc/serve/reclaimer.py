"""The reclaimer thread of ``subc serve``: off the path of requests, it waits out grace periods and
frees what retired root slots and drained endpoints held, and checkpoints the store's
write-ahead log."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

from ..dataplane.live_broker import REFRESH_WRITES, LiveBroker
from .events import event
from .store import Store

RECLAIM_LINGER = 0.02  # seconds retired root slots may wait to be reclaimed together
ADVANCE_EVERY = 0.005  # seconds between looks at the feed's position while switches are scheduled
CHECKPOINT_EVERY = 1.0  # seconds between checkpoints of the store's write-ahead log
REFRESH_PAUSE = 0.001  # seconds between refreshes: the lock is free for a change meanwhile


def reclaim_forever(
    stopping: threading.Event, work: threading.Event, store: Store, broker: LiveBroker, endpoints, root_slots: int
) -> None:
    """Until ``stopping``: make scheduled root switches the feed has reached the base
    (:meth:`LiveBroker.advance`, every :data:`ADVANCE_EVERY` s while any is scheduled); whenever
    ``work`` is set (a change retired a root slot or drained an endpoint), wait a moment for more
    (:data:`RECLAIM_LINGER`, unless a quarter of the ``root_slots`` or more are retired or
    stale: a stale free slot costs a change much of a root's rewrite),
    then one grace period for all of them and free their entries (:meth:`LiveBroker.reclaim`)
    and the drained endpoints; then, until the next change, refresh stale free root slots
    (:meth:`LiveBroker.refresh`, :data:`~subc.dataplane.live_broker.REFRESH_WRITES` entries at a time); every
    :data:`CHECKPOINT_EVERY` s, checkpoint the store."""
    checkpointed = time.monotonic()
    while not stopping.is_set():
        work.wait(timeout=ADVANCE_EVERY if broker.scheduled else 0.5)
        work.clear()
        broker.advance()  # switches scheduled at feed positions the feed has reached
        if time.monotonic() - checkpointed >= CHECKPOINT_EVERY:
            try:
                store.checkpoint()
            except sqlite3.Error as e:  # the next one catches up
                event(logging.WARNING, "checkpoint_failed", error=str(e))
            checkpointed = time.monotonic()
        # let retired root slots gather for a moment: one grace period and one burst of
        # freeing for several changes, not one per change next to every request's own work
        # (they share the interpreter), unless root slots run short
        until = time.monotonic() + RECLAIM_LINGER
        while not stopping.is_set() and broker.free_slot_count() - broker.stale_slot_count() > root_slots * 3 // 4:
            left = until - time.monotonic()
            if left <= 0:
                break
            work.wait(timeout=left)
            work.clear()
        # an endpoint drained by a scheduled change is still delivered to until the switch
        drained = endpoints.take_draining() if not broker.scheduled else []
        pending = broker.pending()
        if pending:
            broker.reclaim()
        elif drained:
            broker.grace()
        if drained:
            endpoints.free_drained(drained)
        while not stopping.is_set() and not work.is_set() and broker.refresh(REFRESH_WRITES):
            time.sleep(REFRESH_PAUSE)
