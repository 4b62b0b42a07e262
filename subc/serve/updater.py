"""The updater thread of ``subc serve``: every queued request at once (requests that arrive faster
than changes are coalesced into one change), checked against the ACL and limits, endpoints given
their subscriber numbers (:mod:`.endpoints`), the change applied to the data plane
(:meth:`~subc.dataplane.live_broker.LiveBroker.apply`: one root switch), committed to the store
(:mod:`.store`), and only then ``SUBACK``/``UNSUBACK``; leases expired; RENEW, LIST, REGISTER and
UNREGISTER answered after the change."""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time

from ..dataplane.live_broker import LiveBroker
from ..errors import SubcError
from ..ir.incremental import CapacityError, LiveDiagram
from .book import Live, SubscriptionBook
from .config import ServeConfig
from .events import event
from .metrics import Metrics
from .network import Pending, request_region
from .protocol import Request
from .store import Store
from .topics import TopicBook

MAX_BATCH = 4096  # requests coalesced into one change


class Updater:
    """The updater for ``cfg``: takes :class:`~.network.Pending` requests from ``requests`` (None:
    stop), changes ``book``, ``broker`` (over ``diagram``), ``endpoints`` and ``store``, and sets
    ``work`` for the reclaimer after a change; ``on_switch``: the data plane is a P4 switch (no
    endpoint numbers to store); ``next_id``: the next subscription id."""

    def __init__(
        self,
        cfg: ServeConfig,
        requests: queue.Queue,
        book: SubscriptionBook,
        broker: LiveBroker,
        diagram: LiveDiagram,
        store: Store,
        endpoints,
        topics: TopicBook | None,
        metrics: Metrics,
        work: threading.Event,
        on_switch: bool,
        next_id: int,
    ):
        self.cfg, self.queue, self.book, self.broker, self.diagram = cfg, requests, book, broker, diagram
        self.store, self.endpoints, self.topics, self.metrics = store, endpoints, topics, metrics
        self.work, self.on_switch, self.next_id = work, on_switch, next_id

    def run(self) -> None:
        """The thread's loop: every queued request at once (at most :data:`MAX_BATCH`), until None."""
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    p = self.queue.get_nowait()
                except queue.Empty:
                    break
                if p is None:
                    self._process(batch)
                    return
                batch.append(p)
            try:
                self._process(batch)
            except Exception as e:  # noqa: BLE001 - the daemon must outlive one bad batch
                event(logging.ERROR, "batch_failed", error=repr(e))
                for p in batch:
                    if p.reply:
                        p.reply("ERR internal error")
            gc.freeze()  # what is alive now is long-lived: keep it out of the cyclic collector's scans

    def _process(self, batch: list[Pending]) -> None:
        now = time.time()
        subs: list[tuple[Pending, Live]] = []
        unsubs: list[tuple[Pending, Live]] = []
        removing: set[int] = set()
        ep_new: dict[tuple[str, int], int] = {}
        for p in batch:
            if p.kind == "SUBSCRIBE":
                live = self._admit(p, now, ep_new)
                if live is not None:
                    subs.append((p, live))
            elif p.kind == "SUB":
                live = self._admit_topic(p, now, ep_new)
                if live is not None:
                    subs.append((p, live))
            elif p.kind in ("UNSUBSCRIBE", "expire"):
                assert p.req is not None and p.req.sub_id is not None  # an UNSUBSCRIBE's id, or the expired one's
                live = self.book.subs.get(p.req.sub_id)
                if live is None or live.id in removing or (p.kind == "UNSUBSCRIBE" and live.source != p.source[0]):
                    if p.reply:
                        p.reply(f"ERR no subscription {p.req.sub_id} of {p.source[0]}")
                    continue
                removing.add(live.id)
                unsubs.append((p, live))
            elif p.kind == "tick":
                if self.topics is not None:
                    self.topics.expire(now)
                for sid in self.book.expired(now):
                    if sid not in removing:
                        removing.add(sid)
                        unsubs.append((Pending("expire", Request("UNSUBSCRIBE", sub_id=sid)), self.book.subs[sid]))
        if subs or unsubs:
            subs = self._change(subs, unsubs, ep_new)
        # RENEW and LIST see the change's result
        renewed: list[int] = []
        after: list[tuple[Pending, str]] = []  # replies once the topic changes are committed
        for p in batch:
            if p.kind in ("REGISTER", "UNREGISTER"):
                after.append((p, self._registration(p, now)))
            elif p.kind == "RENEW":
                assert p.req is not None  # every request from the network has its own
                ids = (
                    [p.req.sub_id]
                    if p.req.sub_id is not None
                    else [i for i, lv in self.book.subs.items() if lv.source == p.source[0]]
                )
                ids = [i for i in ids if i in self.book.subs and self.book.subs[i].source == p.source[0]]
                exp = now + self.cfg.lease if self.cfg.lease else None
                self.book.renew(ids, exp)
                renewed += ids
                n = len(ids)
                if self.topics is not None and p.req.sub_id is None:
                    n += self.topics.renew(p.source[0], exp)
                after.append((p, f"RENEWACK {n}"))
            elif p.kind == "LIST":
                reply = p.reply
                assert reply is not None  # every request from the network has its reply
                lines = [lv.listing() for lv in self.book.subs.values() if lv.source == p.source[0]]
                if self.topics is not None:
                    lines += self.topics.listing(p.source[0])
                for line in lines:
                    reply(line)
                reply(f"END {len(lines)}")
        if renewed:
            self.store.renew(renewed, now + self.cfg.lease if self.cfg.lease else None)
        if self.topics is not None and self.topics.dirty():
            self.store.commit([], [], {}, topics=self.topics.changes())
        for p, line in after:
            assert p.reply is not None  # REGISTER, UNREGISTER and RENEW come from the network
            p.reply(line)
            self.metrics.requests.labels(p.kind, "error" if line.startswith("ERR") else "ok").inc()
        if self.topics is not None:
            self.metrics.labels.set(len(self.topics.labels))
            self.metrics.registrations.set(len(self.topics.regs))

    def _registration(self, p: Pending, now: float) -> str:
        """Carry out a REGISTER or UNREGISTER; returns its reply."""
        req, src = p.req, p.source[0]
        # parsed only when the spec has topic fields (protocol.parse_request), and then there is a topic book
        assert req is not None and req.topic is not None and self.topics is not None
        if p.kind == "UNREGISTER":
            if not self.topics.unregister(req.topic_text, src):
                return f"ERR {src} has no registration of {req.topic_text}"
            return f"UNREGACK {req.topic_text}"
        try:
            labels = self.topics.register(
                req.topic_text,
                req.topic,
                src,
                now + self.cfg.lease if self.cfg.lease else None,
                self.cfg.acl.subs_per_source,
            )
        except SubcError as e:
            return f"ERR {e.message}"
        return f"REGACK {req.topic_text} {' '.join(map(str, labels))}"

    def _admit_topic(self, p: Pending, now: float, ep_new: dict) -> Live | None:
        """A SUB's subscription (:meth:`_admit` of its filter's condition), or None after an error
        reply."""
        req = p.req
        # parsed only when the spec has topic fields (protocol.parse_request), and then there is a topic book
        assert req is not None and req.topic is not None and self.topics is not None and p.reply is not None
        where = req.text
        try:
            cond, names = self.topics.condition(req.topic, where)
        except SubcError as e:
            p.reply(f"SUBERR {req.column} {e.message}")
            return None
        req.condition = cond
        p.region = request_region(self.diagram, req, p.reply)
        if p.region is None:
            self.topics.release(names)
            return None
        live = self._admit(p, now, ep_new)
        if live is None:
            self.topics.release(names)
            return None
        live.filter, live.names = req.topic_text, names
        return live

    def _admit(self, p: Pending, now: float, ep_new: dict) -> Live | None:
        """A SUBSCRIBE's subscription, its endpoint numbered, or None after an error reply."""
        req, src = p.req, p.source[0]
        assert req is not None and p.reply is not None  # a SUBSCRIBE or SUB from the network
        ep = req.to or p.source
        if req.to is not None and not self.cfg.acl.may_send_to(src, req.to[0], req.token):
            self.metrics.requests.labels("SUBSCRIBE", "denied").inc()
            p.reply(f"SUBERR {req.column + len(req.text)} the ACL does not let {src} direct deliveries to {req.to[0]}")
            return None
        if self.book.count(src) >= self.cfg.acl.subs_per_source:
            self.metrics.requests.labels("SUBSCRIBE", "limit").inc()
            p.reply(f"SUBERR 1 {src} has {self.cfg.acl.subs_per_source} subscriptions, the most one source may have")
            return None
        first = ep not in self.endpoints.by_ep  # its store row is to be written
        try:
            sid, _ = self.endpoints.acquire(ep)
        except SubcError as e:
            p.reply(f"SUBERR 1 endpoint {ep[0]}:{ep[1]}: {e.message}")
            return None
        if first:
            ep_new[ep] = sid
        self.book.admit(src)
        live = Live(
            self.next_id, req.text, req.condition, ep, sid, src, now + self.cfg.lease if self.cfg.lease else None
        )
        self.next_id += 1
        return live

    def _change(self, subs: list, unsubs: list, ep_new: dict) -> list:
        """Apply the additions ``subs`` and removals ``unsubs`` ((Pending, Live)) in one change,
        or one by one when the batch does not fit, commit and reply.  ``ep_new``: the endpoints
        the additions took first (their store rows are written).  Returns the additions made."""
        ops = [(p.region, lv.sid, +1) for p, lv in subs]
        ops += [(self.diagram.region(lv.condition), lv.sid, -1) for _, lv in unsubs]
        t0 = time.perf_counter()
        try:
            self.broker.apply(ops)
            ok_subs, ok_unsubs = subs, unsubs
        except (CapacityError, SubcError):
            ok_subs, ok_unsubs = [], []
            for (p, lv), op in zip(subs + unsubs, ops):
                try:
                    self.broker.apply([op])
                except (CapacityError, SubcError) as e:
                    if op[2] > 0:
                        self.book.undo_admit(lv, self.endpoints.release)
                        p.reply(f"SUBERR 1 the data plane is full: {e.message}")
                    else:
                        p.reply(f"ERR the data plane is full: {e.message}")
                    continue
                (ok_subs if op[2] > 0 else ok_unsubs).append((p, lv))
        eps: dict[tuple[str, int], int | None] = {}
        for _, lv in ok_subs:
            self.book.track(lv)
            if lv.ep in ep_new:
                eps.setdefault(lv.ep, lv.sid)
        for _, lv in ok_unsubs:
            self.book.untrack(lv)
            if self.endpoints.release(lv.ep):
                eps[lv.ep] = None
        self.work.set()
        if self.on_switch:
            eps = {}  # a switch port is no endpoint's own number: nothing to keep
        applied = time.perf_counter()
        self.store.commit(
            [lv.stored() for _, lv in ok_subs],
            [lv.id for _, lv in ok_unsubs],
            eps,
            next_id=self.next_id,
            topics=self.topics.changes() if self.topics is not None else None,
        )
        done = time.perf_counter()
        event(
            logging.DEBUG,
            "change",
            subscribes=len(ok_subs),
            unsubscribes=len(ok_unsubs),
            apply_ms=round((applied - t0) * 1e3, 3),
            commit_ms=round((done - applied) * 1e3, 3),
        )
        for p, lv in ok_subs:
            p.reply(f"SUBACK {lv.id}")
            self.metrics.suback.observe(done - p.t0)
            self.metrics.requests.labels("SUBSCRIBE", "ok").inc()
        for p, lv in ok_unsubs:
            if p.reply:
                p.reply(f"UNSUBACK {lv.id}")
            self.metrics.requests.labels(p.kind, "ok").inc()
            event(logging.DEBUG, p.kind.lower(), id=lv.id, endpoint=f"{lv.ep[0]}:{lv.ep[1]}")
        self.metrics.changes.inc()
        self.metrics.subscriptions.set(len(self.book))
        self.metrics.endpoints.set(len(self.endpoints))
        return ok_subs
