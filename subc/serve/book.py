"""The live subscriptions of ``subc serve``: each one's subscription (:class:`Live`), how many each
source holds, and when leases end.  Owned by the updater thread once the daemon has started
(restored before, by the daemon itself)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .store import Stored
from .topics import TopicBook


@dataclass
class Live:
    """A live subscription: ``condition`` (AST) of ``text``, endpoint ``ep`` with number ``sid``,
    the request's ``source`` address, lease ``expires`` (Unix s or None)."""

    id: int
    text: str
    condition: object
    ep: tuple[str, int]
    sid: int
    source: str
    expires: float | None
    filter: str | None = None  # a topic subscription's filter (``text`` is then its WHERE part)
    names: list = field(default_factory=list)  # the topic level names the filter references

    def stored(self) -> Stored:
        return Stored(self.id, self.text, self.ep[0], self.ep[1], self.source, self.expires, self.filter)

    def listing(self) -> str:
        if self.filter is None:
            return f"SUB {self.id} {self.ep[0]}:{self.ep[1]} {self.text}"
        where = f" WHERE {self.text}" if self.text else ""
        return f"SUB {self.id} {self.ep[0]}:{self.ep[1]} TOPIC {self.filter}{where}"


class SubscriptionBook:
    """The live subscriptions (``subs``: id -> :class:`Live`), their count per source address
    (``per_source``), and a heap of lease ends; ``topics``: the topic book whose label names a
    topic subscription holds (None: the spec has no topics)."""

    def __init__(self, topics: TopicBook | None):
        self.topics = topics
        self.subs: dict[int, Live] = {}
        self.per_source: dict[str, int] = {}
        self.leases: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self.subs)

    def count(self, source: str) -> int:
        """Subscriptions (and admissions under way) of ``source``."""
        return self.per_source.get(source, 0)

    def admit(self, source: str) -> None:
        """Count one more subscription of ``source`` (before its change is applied)."""
        self.per_source[source] = self.per_source.get(source, 0) + 1

    def undo_admit(self, lv: Live, release_endpoint) -> None:
        """Take back :meth:`admit` of ``lv`` when its change failed: its source's count, its
        endpoint (``release_endpoint(ep)``) and its topic names."""
        self.per_source[lv.source] -= 1
        release_endpoint(lv.ep)
        if lv.names:
            assert self.topics is not None  # names come from the topic book's conditions
            self.topics.release(lv.names)

    def track(self, lv: Live) -> None:
        """``lv`` is live: keep it, and its lease end."""
        self.subs[lv.id] = lv
        if lv.expires is not None:
            heapq.heappush(self.leases, (lv.expires, lv.id))

    def untrack(self, lv: Live) -> None:
        """``lv`` is gone: forget it, its source's count and its topic names."""
        del self.subs[lv.id]
        if lv.names:
            assert self.topics is not None  # names come from the topic book's conditions
            self.topics.release(lv.names)
        self.per_source[lv.source] -= 1
        if not self.per_source[lv.source]:
            del self.per_source[lv.source]

    def renew(self, ids: list[int], expires: float | None) -> None:
        """Give subscriptions ``ids`` the lease end ``expires`` (Unix s; None: none)."""
        for i in ids:
            self.subs[i].expires = expires
            if expires is not None:
                heapq.heappush(self.leases, (expires, i))

    def expired(self, now: float) -> list[int]:
        """The subscriptions whose lease ended by ``now`` (Unix s)."""
        out = []
        while self.leases and self.leases[0][0] <= now:
            _, i = heapq.heappop(self.leases)
            lv = self.subs.get(i)
            if lv is not None and lv.expires is not None and lv.expires <= now:
                out.append(i)
        return out
