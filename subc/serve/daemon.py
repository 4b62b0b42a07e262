"""``subc serve``: the broker daemon whose subscribers come and go (see docs/serve.md, "Live subscriptions").

Threads (the data structures of each are owned by one thread, or by the broker's lock):

* the *network* thread (:mod:`.network`) reads requests (UDP datagrams, TCP lines;
  :mod:`.protocol`), enforces the per-source request rate, parses conditions and builds their
  regions, and queues them;
* the *updater* thread (:mod:`.updater`) takes every queued request at once, checks ACL and
  limits, gives endpoints their subscriber numbers, applies the change to the data plane (one root
  switch), commits it to the store and only then replies ``SUBACK``/``UNSUBACK``; it owns the
  live subscriptions (:mod:`.book`), expires leases and answers RENEW and LIST;
* the *reclaimer* thread (:mod:`.reclaimer`) waits for grace periods and frees what retired roots
  and drained endpoints held (off the path of requests);
* a *lease* timer queues a tick every quarter lease.

This module starts them: it loads or adopts the data plane, restores the store, and stops.

A restarted daemon adopts the pinned data path (which kept forwarding), keeps every state the
maps hold, rebuilds its diagram from the store and switches to it in one change, then frees the
previous daemon's entries after a grace period (:meth:`~subc.dataplane.ebpf.live_maps.LiveMaps.inherit`).

With :class:`SwitchOptions` (``--p4runtime``) the same broker writes a P4 switch's entries instead
(:mod:`subc.dataplane.p4rt.live_switch`, :mod:`subc.dataplane.p4rt.live_entries`), endpoints being
the switch ports of :mod:`.port_map`; a restarted daemon takes the switch over the same way.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
from typing import TYPE_CHECKING, Callable, cast

from ..backends.ebpf import layout as L
from ..backends.ebpf import map_names as MN
from ..dataplane.ebpf.fanout import grace_waiter
from ..dataplane.ebpf.live_maps import LiveMaps
from ..dataplane.ebpf.schedule import FeedSchedule
from ..dataplane.live_broker import LiveBroker
from ..errors import SubcError
from ..ir.incremental import CapacityError, LiveDiagram
from ..lang.shapes import ShapeCache
from ..lang.rules import parse_rules
from ..recovery.metrics import RecoveryCollector
from ..recovery.service import RecoveryService
from .book import Live, SubscriptionBook
from .cluster_wiring import check_cluster, cluster_updater
from .config import ServeConfig, SwitchOptions
from .dataplane import ROOT_SLOTS, DataPlane, open_dataplane
from .endpoints import SOUP_PREFIX, EndpointTable, is_soup, stream_key
from .events import JsonFormatter, event  # noqa: F401 (JsonFormatter: part of this module's names)
from .metrics import Metrics
from .network import Pending, RequestListener
from .reclaimer import reclaim_forever
from .rules_file import RULES_SOURCE, read_rules_file
from .store import REMOVED, Store
from .topics import TopicBook, TopicError, parse_filter, parse_topic
from .updater import Updater

if TYPE_CHECKING:
    from ..cluster.node import ClusterNode
    from ..dataplane.p4rt.live_entries import LiveEntries
    from ..dataplane.p4rt.live_switch import SwitchPlane
    from .port_map import PortEndpoints


GC_YOUNG = 100_000  # allocations between collections of the youngest generation


class Daemon:
    """The ``subc serve`` daemon for ``cfg`` (see the module docstring).  :meth:`start` loads or
    adopts the data path and restores the store (SubcError on failure); :meth:`stop` ends it,
    leaving the data path loaded."""

    # set by start(): the switch (--p4runtime) or None, the data plane's writer, the endpoints' numbers
    sw: SwitchPlane | None
    writer: LiveMaps | LiveEntries
    endpoints: EndpointTable | PortEndpoints

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.queue: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.work = threading.Event()  # the reclaimer has something to do
        self.threads: list[threading.Thread] = []
        self.metrics = Metrics(cfg.metrics)
        self.listener: RequestListener | None = None
        self.started = threading.Event()
        self.recovery: RecoveryService | None = None  # with cfg.journal: the journal's service
        self.node: ClusterNode | None = None  # with cfg.cluster: this broker's membership

    @property
    def port(self) -> int:
        """The port the daemon listens on (after :meth:`start`)."""
        return self.listener.port if self.listener else 0

    @property
    def subs(self) -> dict[int, Live]:
        """The live subscriptions by id."""
        return self.book.subs

    # -- start and stop -----------------------------------------------------------------------

    def _topics(self) -> None:
        cfg = self.cfg
        self.topics: TopicBook | None = None
        if cfg.spec.topic is not None:
            known, next_label = self.store.labels()
            self.topics = TopicBook(cfg.spec, known, next_label, cfg.limits)
        self.depth = self.topics.schema.depth if self.topics else None
        self.book = SubscriptionBook(self.topics)

    def _open_switch(self, sw: SwitchOptions):
        """Open the switch of ``sw`` (:mod:`subc.dataplane.p4rt.live_switch`); (inherited root slot
        or None, the function that frees the inherited entries)."""
        from ..dataplane.p4rt.live_switch import open_switch
        from .port_map import PortEndpoints, load_port_map

        cfg = self.cfg
        plane = self.sw = open_switch(sw.program, sw.addr, sw.device_id, sw.election_id, sw.config, sw.grace)
        try:
            if list(cfg.field_order) != list(self.sw.doc.field_order):
                raise SubcError(
                    f"{sw.program} tests {', '.join(self.sw.doc.field_order)}; --field-order gives "
                    f"{', '.join(cfg.field_order)}"
                )
            port_map = load_port_map(sw.port_map, self.sw.ports)
            self.store = Store(cfg.state_dir)
        except BaseException:
            self.sw.close()
            raise
        self._topics()
        fields = [cfg.spec.query_fields[f] for f in cfg.field_order]
        self.diagram = LiveDiagram(fields, self.sw.stage_caps())
        self.writer = self.sw.writer
        writer = self.sw.writer
        session = self.sw.session
        self.metrics.switch_updates.set_function(lambda: writer.writes)
        self.metrics.switch_requests.set_function(lambda: session.write_requests)
        self.broker = LiveBroker(self.diagram, self.writer, self.sw.grace, grace_s=self.sw.grace_s)
        self.metrics.watch_broker(self.broker)
        self.endpoints = PortEndpoints(port_map)
        self.adopted = self.sw.adopted
        self._held: list[int] = []
        if not self.sw.adopted:
            return None, None
        inh = self.sw.inherit()
        return inh.live_slot, self._reserve_inherited(inh.states, lambda: plane.release_inherited(inh))

    def _reserve_inherited(self, states: dict[int, set[int]], free: Callable[[], None]) -> Callable[[], None]:
        """Keep the inherited ``states`` (level -> states) out of the diagram's use; returns the
        function that ``free()``s the inherited entries and gives the states back."""
        for lv, ss in states.items():
            if lv:
                self.diagram.reserve(lv, ss)

        def release() -> None:
            free()
            for lv, ss in states.items():
                if lv:
                    self.diagram.unreserve(lv, ss)

        return release

    def _open_dataplane(self):
        """Load or adopt the eBPF data path on the interface; (inherited root slot or None, the
        function that frees the inherited entries)."""
        cfg = self.cfg
        self.sw = None
        self.dp: DataPlane = open_dataplane(
            cfg.spec, cfg.iface, cfg.field_order, cfg.capacity, cfg.state_dir, cfg.xdp_mode, cfg.journal_pages
        )
        if cfg.cluster is not None:
            self.set_fence(1)  # nothing is sent until this broker holds its lease and owns endpoints
        if cfg.journal is not None:
            assert self.dp.home is not None  # an eBPF data plane has its home
            self.recovery = RecoveryService(self.dp.home, cfg.journal, self._soup_login, self._soup_request)
            self.metrics.registry.register(RecoveryCollector(self.recovery))
        self.store = Store(cfg.state_dir)
        self._topics()
        fields = [cfg.spec.query_fields[f] for f in cfg.field_order]
        self.diagram = LiveDiagram(fields, self.dp.stage_caps())
        writer = self.writer = LiveMaps(self.dp.maps, self.dp.doc.stages, self.dp.caps, ROOT_SLOTS)
        schedule = FeedSchedule(self.dp.maps) if cfg.cluster is not None else None
        if schedule is not None:
            # a previous daemon's switches name slots this one rewrites: the base root alone, until
            # the restore's change (before inherit(), which deletes every slot but the base's)
            schedule.write([])
        self.broker = LiveBroker(self.diagram, writer, grace_waiter(self.dp.maps), schedule)
        self.metrics.watch_broker(self.broker)
        known = self.store.endpoints()
        on_number = None
        if self.recovery is not None:
            recovery = self.recovery

            def on_number(sid: int, ep: tuple[str, int], fresh: bool) -> None:
                addrs = [] if is_soup(ep[0]) else [ep]
                recovery.bind(sid, stream_key(ep), addrs, fresh=fresh)

        standby = (lambda ep: True) if cfg.cluster is not None else None  # the cluster's updater decides later
        endpoints = self.endpoints = EndpointTable(self.dp.maps, known, cfg.resolver, on_number, standby)
        self._held = []
        self.adopted = self.dp.adopted
        if not self.dp.adopted:
            return None, None
        inh = writer.inherit()
        # numbers the inherited leaves may deliver to, beyond the stored endpoints'
        in_use = {
            s
            for s in range(L.MAX_SUBSCRIBERS)
            # an array map, not per-CPU: one value for every index
            if L.sub_struct(1).unpack(cast(bytes, self.dp.maps[MN.SUBS].lookup(L.U32.pack(v=s))))["count"]
        }
        held = self._held = endpoints.hold(in_use - set(known.values()))

        def free() -> None:
            writer.release_inherited(inh)
            endpoints.free_sids(held)

        return inh.live_slot, self._reserve_inherited(inh.states, free)

    def set_fence(self, until_ns: int) -> None:
        """Write the data plane's fence (``subc_fence``): copies are sent until ``until_ns``
        (CLOCK_MONOTONIC ns; 1: none from now on)."""
        self.dp.maps[MN.FENCE].update(L.U32.pack(v=0), L.U64.pack(v=until_ns))

    def start(self) -> None:
        """Open the data plane (load or adopt it), restore the subscriptions, bind the sockets and
        start the threads.  Raises SubcError when any of these fails."""
        cfg = self.cfg
        check_cluster(cfg)
        if cfg.switch is not None:
            inherited, release = self._open_switch(cfg.switch)
        else:
            inherited, release = self._open_dataplane()
        held: list[int] = self._held
        self.next_id = self.store.next_free_id()
        unused = self._restore(inherited, release)
        held += [sid for _, sid in unused]  # freed with the inherited entries (or at once: nothing inherited)
        if not self.adopted:
            self.endpoints.free_sids(held)
        restored = len(self.book)
        self.listener = RequestListener(cfg, self.diagram, self.depth, self.metrics, self.queue, self.stopping)
        self.listener.open()
        args = (
            cfg,
            self.queue,
            self.book,
            self.broker,
            self.diagram,
            self.store,
            self.endpoints,
            self.topics,
            self.metrics,
            self.work,
            self.sw is not None,
            self.next_id,
        )
        self.updater = cluster_updater(self, args) if cfg.cluster is not None else Updater(*args)

        def reclaimer() -> None:
            reclaim_forever(self.stopping, self.work, self.store, self.broker, self.endpoints, self.writer.root_slots)

        threads: list[tuple[str, Callable[[], None]]] = [
            ("network", self.listener.run),
            ("updater", self.updater.run),
            ("reclaimer", reclaimer),
            ("lease", self._lease_timer),
        ]
        if self.recovery is not None:
            recovery = self.recovery
            threads.append(("journal", lambda: recovery.run(self.stopping)))
        for name, fn in threads:
            t = threading.Thread(target=fn, name=f"subc-{name}", daemon=True)
            t.start()
            self.threads.append(t)
        if self.node is not None:
            self.node.start()
        gc.collect()
        gc.freeze()
        # A change allocates hundreds of acyclic objects (diagram nodes, runs) per subscription;
        # collecting the young generation every 700 allocations cost about a fifth of a change's
        # time.  What a batch leaves alive is frozen after it (see Updater.run).
        gc.set_threshold(GC_YOUNG, 10, 10)
        self.metrics.subscriptions.set(len(self.book))
        event(
            logging.INFO,
            "serving",
            iface=cfg.iface,
            switch=cfg.switch and cfg.switch.addr,
            listen=f"{cfg.listen[0]}:{self.port}",
            adopted=self.adopted,
            restored=restored,
            field_order=cfg.field_order,
        )
        self.started.set()

    def _restore(self, inherited_slot: int | None, release) -> list:
        """Apply the stored subscriptions and those of ``--rules`` in one change, which switches
        away from an ``inherited_slot`` (whose entries ``release()`` frees after the grace
        period): until that switch the data plane delivers with the diagram the previous daemon
        left, then with all of the restored one, so no subscription misses a message while the
        others are restored.  A stored subscription that no longer parses or whose endpoint
        cannot be resolved is dropped from the store, logged.  Returns the stored endpoints no
        subscription uses ((ip, port), sid), forgotten by the store.  Raises SubcError when the
        restored diagram does not fit in the maps beside the inherited one."""
        if inherited_slot is not None:
            self.broker.adopt(inherited_slot, release)
        stored = [s for s in self.store.all() if s.source != RULES_SOURCE]
        if self.cfg.rules:
            soup = self.recovery is not None and self.recovery.soup is not None
            made = read_rules_file(self.cfg.rules, self.cfg.spec, self.cfg.limits, soup, self.next_id)
            self.next_id += len(made)
            stored += made
        dropped: list[int] = []
        ops, lives = [], []
        shapes = ShapeCache(self.cfg.spec, self.cfg.limits)  # conditions of known shapes parse without Lark
        for s in stored:
            names: list = []
            try:
                if s.filter is not None:
                    if self.topics is None:
                        raise SubcError("a topic subscription, and the spec has no topic fields")
                    cond, names = self.topics.condition(parse_filter(s.filter, self.topics.schema.depth), s.text)
                else:
                    cond = parse_rules(
                        s.text + " : fwd(0);", self.cfg.spec, "<store>", limits=self.cfg.limits, shapes=shapes
                    )[0].condition
                region = self.diagram.region(cond)
                sid, _ = self.endpoints.acquire((s.ip, s.port), fresh=False)
            except (SubcError, TopicError) as e:
                if names:
                    assert self.topics is not None  # names come from the topic book's conditions
                    self.topics.release(names)
                event(logging.WARNING, "restore_dropped", id=s.id, condition=s.text, reason=e.message)
                dropped.append(s.id)
                continue
            live = Live(s.id, s.text, cond, (s.ip, s.port), sid, s.source, s.expires, s.filter, names)
            ops.append((region, sid, +1))
            lives.append(live)
        try:
            self.broker.apply(ops, force=True)  # switches away from an inherited root even with nothing to restore
        except CapacityError as e:
            if inherited_slot is None:
                raise SubcError(f"restoring {len(ops)} subscriptions: {e}; start with a larger --capacity") from None
            raise SubcError(
                f"restoring {len(ops)} subscriptions beside the diagram the previous daemon left live (both "
                f"stay in the maps until the restored one replaces it in one switch): {e}; the maps hold the "
                "diagram twice only up to about half of --capacity for some rule sets: unload (subc unload "
                "--iface IF) and start with a larger --capacity"
            ) from None
        for live in lives:
            self.book.track(live)
            self.book.admit(live.source)
        topics = None
        if self.topics is not None:
            for topic, source, expires in self.store.registrations():
                try:
                    self.topics.register(topic, parse_topic(topic, self.topics.schema.depth), source, expires, 1 << 62)
                except (SubcError, TopicError) as e:
                    event(logging.WARNING, "restore_dropped", topic=topic, source=source, reason=e.message)
                    self.topics.pending[(topic, source)] = REMOVED
            self.topics.labels.forget_unused()
            topics = self.topics.changes()
        unused = self.endpoints.forget_known()
        eps: dict = {ep: e.sid for ep, e in self.endpoints.by_ep.items()}
        eps.update({ep: None for ep, _ in unused})
        if self.sw is not None:
            eps = {}  # a switch port is no endpoint's own number: nothing to keep
        self.store.commit([], dropped, eps, next_id=self.next_id, topics=topics)
        return unused

    # -- SoupBinTCP users (--journal --soup) ---------------------------------------------------------

    def _soup_login(self, user: str, password: str) -> str | None:
        """The stream key of a SoupBinTCP login the ACL grants (``[[login]]``), or None."""
        return SOUP_PREFIX + user if self.cfg.acl.check_login(user, password) else None

    def _soup_request(self, key: str, payload: bytes) -> None:
        """A logged-in SoupBinTCP user's Unsequenced Data: one or more request lines of the
        control protocol, made for its own stream; replies go back as Unsequenced Data."""
        recovery = self.recovery
        assert recovery is not None

        def reply(line: str) -> None:
            recovery.soup_reply(key, line.encode() + b"\n")

        if self.listener is None or not self.started.is_set():
            reply("ERR the broker is starting: send the request again")
            return
        self.listener.submit(payload, (key, 0), reply)

    def stop(self) -> None:
        """Stop the threads and close the sockets and the store (the data path stays loaded)."""
        if self.node is not None:
            self.node.stop()  # fenced first: the other brokers take this one's subscribers over
        self.stopping.set()
        self.queue.put(None)
        self.work.set()
        for t in self.threads:
            t.join(timeout=5)
        if self.listener is not None:
            self.listener.close()
        if self.recovery is not None:
            self.recovery.close()
        self.metrics.close()
        self.store.close()
        if self.sw is not None:
            self.sw.close()

    # -- the lease timer ----------------------------------------------------------------------

    def _lease_timer(self) -> None:
        """Queue a ``tick`` (leases to expire; in a cluster also the labels to forget) every
        quarter lease, at most every second."""
        if not self.cfg.lease and self.cfg.cluster is None:
            return
        tick = max(0.05, min(self.cfg.lease / 4, 1.0)) if self.cfg.lease else 1.0
        while not self.stopping.wait(tick):
            self.queue.put(Pending("tick"))

    # -- operations ---------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Block until :meth:`stop` (from a signal handler or another thread)."""
        self.stopping.wait()
