"""``subc serve``: the broker daemon whose subscribers come and go (see docs/serve.md, "Live subscriptions").

Threads (the data structures of each are owned by one thread, or by the broker's lock):

* the *network* thread reads requests (UDP datagrams, TCP lines; :mod:`.protocol`), enforces
  the per-source request rate (:class:`.acl.RateLimiter`), parses conditions and builds their
  regions (:meth:`~subc.ir.incremental.LiveDiagram.region`), and queues them;
* the *updater* thread takes every queued request at once (requests that arrive faster than
  changes are coalesced into one change), checks ACL and limits, gives endpoints their subscriber
  numbers (:mod:`.endpoints`), applies the change to the data plane
  (:meth:`~subc.dataplane.live_broker.LiveBroker.apply`: one root switch), commits it to the store
  (:mod:`.store`) and only then replies ``SUBACK``/``UNSUBACK``; it also expires leases and
  answers RENEW and LIST;
* the *reclaimer* thread waits for grace periods and frees what retired roots and drained
  endpoints held (off the path of requests);
* a *lease* timer queues a tick every quarter lease.

A restarted daemon adopts the pinned data path (which kept forwarding), keeps every state the
maps hold, rebuilds its diagram from the store and switches to it in one change, then frees the
previous daemon's entries after a grace period (:meth:`~subc.dataplane.ebpf.live_maps.LiveMaps.inherit`).

With :class:`SwitchOptions` (``--p4runtime``) the same broker writes a P4 switch's entries instead
(:mod:`subc.dataplane.p4rt.live_switch`, :mod:`subc.dataplane.p4rt.live_entries`), endpoints being
the switch ports of :mod:`.port_map`; a restarted daemon takes the switch over the same way.
"""

from __future__ import annotations

import gc
import heapq
import json
import logging
import queue
import select
import selectors
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..ir.incremental import CapacityError, LiveDiagram
from ..lang.limits import DEFAULT_LIMITS, Limits
from ..lang.rule_shapes import ShapeCache
from ..lang.rules import parse_rules
from ..spec.model import Spec
from ..backends.ebpf import layout as L
from ..errors import SubcError
from ..dataplane.ebpf.fanout import grace_waiter
from ..dataplane.live_broker import LiveBroker
from ..dataplane.ebpf.live_maps import LiveMaps
from .acl import Acl, RateLimiter
from .dataplane import ROOT_SLOTS, DataPlane, open_dataplane
from .endpoints import EndpointTable, resolve
from .metrics import Metrics
from .protocol import MAX_LINE, ProtocolError, Request, parse_request, parse_requests
from .store import REMOVED, Store, Stored
from .topics import TopicBook, TopicError, parse_filter, parse_topic

MAX_BATCH = 4096  # requests coalesced into one change
RULES_SOURCE = "rules-file"  # the source of --rules subscriptions
UDP_RCVBUF = 16 << 20  # bytes
#: Ports tried for ``--listen HOST:0`` before giving up (:meth:`Daemon._open_sockets`).
PORT_TRIES = 100
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux, <asm-generic/socket.h>
RESTORE_BATCH = 5000  # stored subscriptions per change at start
RECLAIM_LINGER = 0.02  # seconds retired root slots may wait to be reclaimed together
GC_YOUNG = 100_000  # allocations between collections of the youngest generation
CHECKPOINT_EVERY = 1.0  # seconds between checkpoints of the store's write-ahead log
log = logging.getLogger("subc.serve")


class JsonFormatter(logging.Formatter):
    """Structured logs: one JSON object per line (``ts``, ``level``, ``event`` and its fields)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": round(record.created, 6), "level": record.levelname.lower(), "event": record.getMessage()}
        doc.update(getattr(record, "fields", {}))
        return json.dumps(doc, separators=(",", ":"))


def _event(level: int, event: str, **fields) -> None:
    log.log(level, event, extra={"fields": fields})


@dataclass
class SwitchOptions:
    """``subc serve --p4runtime``: the switch's ``addr`` (HOST:PORT), ``program`` (a ``subc
    serve-program`` directory), device ``config`` (BMv2 JSON; sets the pipeline), ``port_map``
    file, ``grace`` in s between a root switch and freeing the old entries."""

    addr: str
    program: str
    port_map: str
    config: str | None = None
    device_id: int = 0
    election_id: tuple[int, int] = (0, 1)
    grace: float = 0.05


@dataclass
class ServeConfig:
    """``subc serve``'s options: ``listen`` and ``metrics`` as (address, port), ``lease`` in s
    (None: subscriptions do not expire), ``capacity`` in subscriptions."""

    spec: Spec
    iface: str
    listen: tuple[str, int]
    field_order: list[str]
    state_dir: str | None = None
    rules: str | None = None
    lease: float | None = None
    acl: Acl = field(default_factory=Acl)
    metrics: tuple[str, int] | None = None
    capacity: int = 100_000
    limits: Limits = DEFAULT_LIMITS
    xdp_mode: str = "auto"
    resolver: Callable = resolve
    switch: SwitchOptions | None = None  # deliver through a P4 switch over P4Runtime instead of on iface


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


@dataclass
class Pending:
    """A queued request: ``kind`` (the verb, or 'tick'), the parsed ``req``, its ``source``
    (address, port), ``reply`` (sends one line), ``region`` (SUBSCRIBE), receipt time ``t0``."""

    kind: str
    req: Request | None = None
    source: tuple[str, int] = ("", 0)
    reply: Callable[[str], None] | None = None
    region: object = None
    t0: float = 0.0


def bind_udp_tcp(host: str, port: int, tries: int = PORT_TRIES) -> tuple[socket.socket, socket.socket, int]:
    """A UDP and a TCP socket bound to one port of ``host`` (UDP with a receive buffer of
    :data:`UDP_RCVBUF` bytes): ``port``, or with port 0 a port free for both, tried up to ``tries``
    times (the kernel picks UDP's ephemeral port without looking at TCP's, whose port may be an
    outgoing connection's).  Returns (udp, tcp, port).  Raises SubcError when no port can be had."""
    got = port
    for attempt in range(tries if port == 0 else 1):
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:  # room for bursts of requests while a change is applied (root may exceed rmem_max)
            udp.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, UDP_RCVBUF)
        except OSError:
            udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_RCVBUF)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            udp.bind((host, port))
            got = udp.getsockname()[1]
            tcp.bind((host, got))
            return udp, tcp, got
        except OSError as e:
            udp.close()
            tcp.close()
            if port != 0 or attempt == tries - 1:
                raise SubcError(f"cannot listen on {host}:{got} (UDP and TCP): {e.strerror}") from None
    raise SubcError(f"cannot listen on {host}:{port}: no tries")


class Daemon:
    """The ``subc serve`` daemon for ``cfg`` (see the module docstring).  :meth:`start` loads or
    adopts the data path and restores the store (SubcError on failure); :meth:`stop` ends it,
    leaving the data path loaded."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.queue: queue.Queue[Pending | None] = queue.Queue()
        self.subs: dict[int, Live] = {}
        self.per_source: dict[str, int] = {}
        self.leases: list[tuple[float, int]] = []
        self.stopping = threading.Event()
        self.work = threading.Event()  # the reclaimer has something to do
        self.threads: list[threading.Thread] = []
        self.limiter = RateLimiter(cfg.acl.requests_per_second)
        self.complained: dict[str, float] = {}
        self.metrics = Metrics(cfg.metrics)
        self.sockets: list[socket.socket] = []
        self.started = threading.Event()
        self.shapes = ShapeCache(cfg.spec, cfg.limits)  # the network thread's: conditions parse without Lark

    # -- start and stop -----------------------------------------------------------------------

    def _topics(self) -> None:
        cfg = self.cfg
        self.topics: TopicBook | None = None
        if cfg.spec.topic is not None:
            known, next_label = self.store.labels()
            self.topics = TopicBook(cfg.spec, known, next_label, cfg.limits)
        self.depth = self.topics.schema.depth if self.topics else None

    def _open_switch(self):
        """Open the switch (:mod:`subc.dataplane.p4rt.live_switch`); (inherited root slot or None,
        the function that frees the inherited entries)."""
        from ..dataplane.p4rt.live_switch import open_switch
        from .port_map import PortEndpoints, load_port_map

        cfg, sw = self.cfg, self.cfg.switch
        self.sw = open_switch(sw.program, sw.addr, sw.device_id, sw.election_id, sw.config, sw.grace)
        try:
            if list(cfg.field_order) != self.sw.doc["field_order"]:
                raise SubcError(
                    f"{sw.program} tests {', '.join(self.sw.doc['field_order'])}; --field-order gives "
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
        self.broker = LiveBroker(self.diagram, self.writer, self.sw.grace)
        self.endpoints = PortEndpoints(port_map)
        self.adopted = self.sw.adopted
        self._held = []
        if not self.sw.adopted:
            return None, None
        inh = self.sw.inherit()
        return inh.live_slot, self._reserve_inherited(inh.states, lambda: self.sw.release_inherited(inh))

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
            cfg.spec, cfg.iface, cfg.field_order, cfg.capacity, cfg.state_dir, cfg.xdp_mode
        )
        self.store = Store(cfg.state_dir)
        self._topics()
        fields = [cfg.spec.query_fields[f] for f in cfg.field_order]
        self.diagram = LiveDiagram(fields, self.dp.stage_caps())
        self.writer = LiveMaps(self.dp.maps, self.dp.doc["stages"], self.dp.caps, ROOT_SLOTS)
        self.broker = LiveBroker(self.diagram, self.writer, grace_waiter(self.dp.maps))
        known = self.store.endpoints()
        self.endpoints = EndpointTable(self.dp.maps, known, cfg.resolver)
        self._held = []
        self.adopted = self.dp.adopted
        if not self.dp.adopted:
            return None, None
        inh = self.writer.inherit()
        # numbers the inherited leaves may deliver to, beyond the stored endpoints'
        in_use = {
            s
            for s in range(L.MAX_SUBSCRIBERS)
            if L.sub_struct(1).unpack(self.dp.maps["subc_subs"].lookup(L.U32.pack(v=s)))["count"]
        }
        held = self._held = self.endpoints.hold(in_use - set(known.values()))

        def free() -> None:
            self.writer.release_inherited(inh)
            self.endpoints.free_sids(held)

        return inh.live_slot, self._reserve_inherited(inh.states, free)

    def start(self) -> None:
        cfg = self.cfg
        if cfg.switch is not None:
            inherited, release = self._open_switch()
        else:
            inherited, release = self._open_dataplane()
        held: list[int] = self._held
        self.next_id = self.store.next_free_id()
        unused = self._restore(inherited, release)
        held += [sid for _, sid in unused]  # freed with the inherited entries (or at once: nothing inherited)
        if not self.adopted:
            self.endpoints.free_sids(held)
        restored = len(self.subs)
        self._open_sockets()
        for name, fn in (
            ("network", self._network),
            ("updater", self._updater),
            ("reclaimer", self._reclaimer),
            ("lease", self._lease_timer),
        ):
            t = threading.Thread(target=fn, name=f"subc-{name}", daemon=True)
            t.start()
            self.threads.append(t)
        gc.collect()
        gc.freeze()
        # A change allocates hundreds of acyclic objects (diagram nodes, runs) per subscription;
        # collecting the young generation every 700 allocations cost about a fifth of a change's
        # time.  What a batch leaves alive is frozen after it (see _updater).
        gc.set_threshold(GC_YOUNG, 10, 10)
        self.metrics.subscriptions.set(len(self.subs))
        _event(
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
        """Apply the stored subscriptions and those of ``--rules`` (in changes of RESTORE_BATCH;
        the first one switches away from an ``inherited_slot``, whose entries ``release()``
        frees after the grace period).  A stored subscription that no longer parses or whose
        endpoint cannot be resolved is dropped from the store, logged.  Returns the stored
        endpoints no subscription uses ((ip, port), sid), forgotten by the store."""
        if inherited_slot is not None:
            self.broker.adopt(inherited_slot, release)
        stored = [s for s in self.store.all() if s.source != RULES_SOURCE]
        if self.cfg.rules:
            stored += self._rules_file(self.cfg.rules)
        dropped: list[int] = []
        ops, lives = [], []
        for s in stored:
            names: list = []
            try:
                if s.filter is not None:
                    if self.topics is None:
                        raise SubcError("a topic subscription, and the spec has no topic fields")
                    cond, names = self.topics.condition(parse_filter(s.filter, self.depth), s.text)
                else:
                    cond = parse_rules(s.text + " : fwd(0);", self.cfg.spec, "<store>", limits=self.cfg.limits)[
                        0
                    ].condition
                region = self.diagram.region(cond)
                sid, _ = self.endpoints.acquire((s.ip, s.port), fresh=False)
            except (SubcError, TopicError) as e:
                if names:
                    self.topics.release(names)
                _event(logging.WARNING, "restore_dropped", id=s.id, condition=s.text, reason=e.message)
                dropped.append(s.id)
                continue
            live = Live(s.id, s.text, cond, (s.ip, s.port), sid, s.source, s.expires, s.filter, names)
            ops.append((region, sid, +1))
            lives.append(live)
            if len(ops) >= RESTORE_BATCH:
                self.broker.apply(ops)
                ops = []
        self.broker.apply(ops, force=True)  # switches away from an inherited root even with nothing to restore
        for live in lives:
            self._track(live)
            self.per_source[live.source] = self.per_source.get(live.source, 0) + 1
        topics = None
        if self.topics is not None:
            for topic, source, expires in self.store.registrations():
                try:
                    self.topics.register(topic, parse_topic(topic, self.depth), source, expires, 1 << 62)
                except (SubcError, TopicError) as e:
                    _event(logging.WARNING, "restore_dropped", topic=topic, source=source, reason=e.message)
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

    def _rules_file(self, path: str) -> list[Stored]:
        """``--rules``: subscriptions made at every start and never stored nor removable by a
        request: one per line, ``<condition> TO <ip>:<port>`` (# comments)."""
        out = []
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip() or line.lstrip().startswith(("#", "//")):
                continue
            try:
                req = parse_request(("SUBSCRIBE " + line).encode(), self.cfg.spec, self.cfg.limits)
            except ProtocolError as e:
                raise SubcError(f"{path}:{n}:{max(1, e.column - 10)}: error: {e.message}") from None
            if req.to is None:
                raise SubcError(f"{path}:{n}:1: error: a subscription of --rules needs TO <ip>:<port>")
            sid = self.next_id
            self.next_id += 1
            out.append(Stored(sid, req.text, req.to[0], req.to[1], RULES_SOURCE, None))
        return out

    def _open_sockets(self) -> None:
        """The UDP and TCP sockets of ``listen`` (:func:`bind_udp_tcp`)."""
        self.udp, self.tcp, self.port = bind_udp_tcp(*self.cfg.listen)
        self.tcp.listen(128)
        self.udp.setblocking(False)
        self.tcp.setblocking(False)
        self.sockets = [self.udp, self.tcp]

    def stop(self) -> None:
        """Stop the threads and close the sockets and the store (the data path stays loaded)."""
        self.stopping.set()
        self.queue.put(None)
        self.work.set()
        for t in self.threads:
            t.join(timeout=5)
        for s in self.sockets:
            s.close()
        self.metrics.close()
        self.store.close()
        if self.sw is not None:
            self.sw.close()

    # -- the network thread -------------------------------------------------------------------

    def _network(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.udp, selectors.EVENT_READ, "udp")
        sel.register(self.tcp, selectors.EVENT_READ, "accept")
        conns: dict[socket.socket, bytearray] = {}
        while not self.stopping.is_set():
            for key, _ in sel.select(timeout=0.2):
                kind = key.data
                if kind == "udp":
                    batch: list = []
                    for _ in range(64):
                        try:
                            data, addr = self.udp.recvfrom(65536)
                        except BlockingIOError:
                            break
                        except OSError:
                            break

                        def reply(line: str, addr=addr) -> None:
                            try:
                                self.udp.sendto(line.encode() + b"\n", addr)
                            except OSError:
                                pass

                        for raw in data.split(b"\n"):
                            if raw.strip():
                                batch.append((raw, addr, reply))
                    self._requests(batch)
                elif kind == "accept":
                    try:
                        conn, _ = self.tcp.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    conns[conn] = bytearray()
                    sel.register(conn, selectors.EVENT_READ, ("tcp", conn.getpeername(), threading.Lock()))
                else:
                    _, peer, lock = kind
                    conn = key.fileobj
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(conn)
                        conns.pop(conn, None)
                        conn.close()
                        continue
                    buf = conns[conn]
                    buf += data

                    def reply(line: str, conn=conn, lock=lock) -> None:
                        with lock:
                            _send_all(conn, line.encode() + b"\n")

                    batch = []
                    while True:
                        i = buf.find(b"\n")
                        if i < 0:
                            break
                        raw = bytes(buf[:i])
                        del buf[: i + 1]
                        if raw.strip():
                            batch.append((raw, peer, reply))
                    self._requests(batch)
                    if len(buf) > MAX_LINE:
                        reply(f"ERR request longer than {MAX_LINE} bytes")
                        sel.unregister(conn)
                        conns.pop(conn, None)
                        conn.close()
        for conn in conns:
            conn.close()

    def _requests(self, items: list[tuple[bytes, tuple[str, int], Callable[[str], None]]]) -> None:
        """Handle the request lines ``items`` ((line, source, reply)) read in one go: rate
        limits, then parsing (:func:`.protocol.parse_requests`, with the shapes of earlier conditions)."""
        if not items:
            return
        t0 = time.perf_counter()
        allowed = []
        for raw, source, reply in items:
            src = source[0]
            if self.limiter.allow(src):
                allowed.append((raw, source, reply))
                continue
            self.metrics.requests.labels("any", "rate_limited").inc()
            now = time.monotonic()
            if now - self.complained.get(src, 0.0) >= 1.0:  # one complaint per second, no amplification
                self.complained[src] = now
                reply(f"ERR rate limit: {self.cfg.acl.requests_per_second:g} requests per second")
        parsed = parse_requests([raw for raw, _, _ in allowed], self.cfg.spec, self.cfg.limits, self.depth, self.shapes)
        for (raw, source, reply), req in zip(allowed, parsed):
            if isinstance(req, ProtocolError):
                verb = raw.split(None, 1)[0].upper() if raw.split() else b""
                self.metrics.requests.labels("bad", "error").inc()
                reply(req.reply("SUBERR" if verb in (b"SUBSCRIBE", b"SUB") else "ERR"))
                continue
            self._request(req, source, reply, t0)

    def _request(self, req: Request, source: tuple[str, int], reply: Callable[[str], None], t0: float) -> None:
        if req.verb == "PING":
            reply("PONG")
            return
        p = Pending(req.verb, req, source, reply, None, t0)
        if req.verb == "SUBSCRIBE":
            p.region = self._region(req, reply)
            if p.region is None:
                return
        self.queue.put(p)

    def _region(self, req: Request, reply):
        """The region of ``req``'s condition, or None (after an error reply)."""
        try:
            region = self.diagram.region(req.condition)
        except SubcError as e:
            col = req.column + (e.location.column - 1 if e.location else 0)
            reply(f"SUBERR {col} {e.message}")
            return None
        if LiveDiagram.is_empty(region):
            reply(f"SUBERR {req.column} the condition accepts no message")
            return None
        return region

    # -- the updater thread -------------------------------------------------------------------

    def _updater(self) -> None:
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
                _event(logging.ERROR, "batch_failed", error=repr(e))
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
                live = self.subs.get(p.req.sub_id)
                if live is None or live.id in removing or (p.kind == "UNSUBSCRIBE" and live.source != p.source[0]):
                    if p.reply:
                        p.reply(f"ERR no subscription {p.req.sub_id} of {p.source[0]}")
                    continue
                removing.add(live.id)
                unsubs.append((p, live))
            elif p.kind == "tick":
                if self.topics is not None:
                    self.topics.expire(now)
                for sid in self._expired(now):
                    if sid not in removing:
                        removing.add(sid)
                        unsubs.append((Pending("expire", Request("UNSUBSCRIBE", sub_id=sid)), self.subs[sid]))
        if subs or unsubs:
            subs = self._change(subs, unsubs, ep_new)
        # RENEW and LIST see the change's result
        renewed: list[int] = []
        after: list[tuple[Pending, str]] = []  # replies once the topic changes are committed
        for p in batch:
            if p.kind in ("REGISTER", "UNREGISTER"):
                after.append((p, self._registration(p, now)))
            elif p.kind == "RENEW":
                ids = (
                    [p.req.sub_id]
                    if p.req.sub_id is not None
                    else [i for i, lv in self.subs.items() if lv.source == p.source[0]]
                )
                ids = [i for i in ids if i in self.subs and self.subs[i].source == p.source[0]]
                exp = now + self.cfg.lease if self.cfg.lease else None
                for i in ids:
                    self.subs[i].expires = exp
                    if exp is not None:
                        heapq.heappush(self.leases, (exp, i))
                renewed += ids
                n = len(ids)
                if self.topics is not None and p.req.sub_id is None:
                    n += self.topics.renew(p.source[0], exp)
                after.append((p, f"RENEWACK {n}"))
            elif p.kind == "LIST":
                lines = [lv.listing() for lv in self.subs.values() if lv.source == p.source[0]]
                if self.topics is not None:
                    lines += self.topics.listing(p.source[0])
                for line in lines:
                    p.reply(line)
                p.reply(f"END {len(lines)}")
        if renewed:
            self.store.renew(renewed, now + self.cfg.lease if self.cfg.lease else None)
        if self.topics is not None and self.topics.dirty():
            self.store.commit([], [], {}, topics=self.topics.changes())
        for p, line in after:
            p.reply(line)
            self.metrics.requests.labels(p.kind, "error" if line.startswith("ERR") else "ok").inc()
        if self.topics is not None:
            self.metrics.labels.set(len(self.topics.labels))
            self.metrics.registrations.set(len(self.topics.regs))

    def _registration(self, p: Pending, now: float) -> str:
        """Carry out a REGISTER or UNREGISTER; returns its reply."""
        req, src = p.req, p.source[0]
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
        where = req.text
        try:
            cond, names = self.topics.condition(req.topic, where)
        except SubcError as e:
            p.reply(f"SUBERR {req.column} {e.message}")
            return None
        req.condition = cond
        p.region = self._region(req, p.reply)
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
        ep = req.to or p.source
        if req.to is not None and not self.cfg.acl.may_send_to(src, req.to[0], req.token):
            self.metrics.requests.labels("SUBSCRIBE", "denied").inc()
            p.reply(f"SUBERR {req.column + len(req.text)} the ACL does not let {src} direct deliveries to {req.to[0]}")
            return None
        if self.per_source.get(src, 0) >= self.cfg.acl.subs_per_source:
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
        self.per_source[src] = self.per_source.get(src, 0) + 1
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
                        self._undo_admit(lv)
                        p.reply(f"SUBERR 1 the data plane is full: {e.message}")
                    else:
                        p.reply(f"ERR the data plane is full: {e.message}")
                    continue
                (ok_subs if op[2] > 0 else ok_unsubs).append((p, lv))
        eps: dict[tuple[str, int], int | None] = {}
        for _, lv in ok_subs:
            self._track(lv)
            if lv.ep in ep_new:
                eps.setdefault(lv.ep, lv.sid)
        for _, lv in ok_unsubs:
            self._untrack(lv)
            if self.endpoints.release(lv.ep):
                eps[lv.ep] = None
        self.work.set()
        if self.sw is not None:
            eps = {}
        self.store.commit(
            [lv.stored() for _, lv in ok_subs],
            [lv.id for _, lv in ok_unsubs],
            eps,
            next_id=self.next_id,
            topics=self.topics.changes() if self.topics is not None else None,
        )
        done = time.perf_counter()
        for p, lv in ok_subs:
            p.reply(f"SUBACK {lv.id}")
            self.metrics.suback.observe(done - p.t0)
            self.metrics.requests.labels("SUBSCRIBE", "ok").inc()
        for p, lv in ok_unsubs:
            if p.reply:
                p.reply(f"UNSUBACK {lv.id}")
            self.metrics.requests.labels(p.kind, "ok").inc()
            _event(logging.DEBUG, p.kind.lower(), id=lv.id, endpoint=f"{lv.ep[0]}:{lv.ep[1]}")
        self.metrics.changes.inc()
        self.metrics.subscriptions.set(len(self.subs))
        self.metrics.endpoints.set(len(self.endpoints))
        return ok_subs

    def _undo_admit(self, lv: Live) -> None:
        self.per_source[lv.source] -= 1
        self.endpoints.release(lv.ep)
        if lv.names:
            self.topics.release(lv.names)

    def _track(self, lv: Live) -> None:
        self.subs[lv.id] = lv
        if lv.expires is not None:
            heapq.heappush(self.leases, (lv.expires, lv.id))

    def _untrack(self, lv: Live) -> None:
        del self.subs[lv.id]
        if lv.names:
            self.topics.release(lv.names)
        self.per_source[lv.source] -= 1
        if not self.per_source[lv.source]:
            del self.per_source[lv.source]

    def _expired(self, now: float) -> list[int]:
        out = []
        while self.leases and self.leases[0][0] <= now:
            exp, i = heapq.heappop(self.leases)
            lv = self.subs.get(i)
            if lv is not None and lv.expires is not None and lv.expires <= now:
                out.append(i)
        return out

    # -- the reclaimer and the lease timer ----------------------------------------------------

    def _reclaimer(self) -> None:
        checkpointed = time.monotonic()
        while not self.stopping.is_set():
            self.work.wait(timeout=0.5)
            self.work.clear()
            if time.monotonic() - checkpointed >= CHECKPOINT_EVERY:
                try:
                    self.store.checkpoint()
                except sqlite3.Error as e:  # the next one catches up
                    _event(logging.WARNING, "checkpoint_failed", error=str(e))
                checkpointed = time.monotonic()
            # let retired root slots gather for a moment: one grace period and one burst of
            # freeing for several changes, not one per change next to every request's own work
            # (they share the interpreter), unless root slots run short
            until = time.monotonic() + RECLAIM_LINGER
            while not self.stopping.is_set() and self.broker.free_slot_count() > self.writer.root_slots * 3 // 4:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self.work.wait(timeout=left)
                self.work.clear()
            drained = self.endpoints.take_draining()
            pending = self.broker.pending()
            if pending:
                self.broker.reclaim()
            elif drained:
                self.broker.grace()
            if drained:
                self.endpoints.free_drained(drained)

    def _lease_timer(self) -> None:
        if not self.cfg.lease:
            return
        tick = max(0.05, min(self.cfg.lease / 4, 1.0))
        while not self.stopping.wait(tick):
            self.queue.put(Pending("tick"))

    # -- operations ---------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Block until :meth:`stop` (from a signal handler or another thread)."""
        self.stopping.wait()


def _send_all(conn: socket.socket, data: bytes, timeout_ms: int = 1000) -> None:
    """Send ``data`` on non-blocking ``conn`` (waiting with poll while its buffer is full); a
    client that reads nothing for ``timeout_ms`` loses the rest."""
    poller = select.poll()
    poller.register(conn, select.POLLOUT)
    view = memoryview(data)
    while view:
        try:
            n = conn.send(view)
        except BlockingIOError:
            if not poller.poll(timeout_ms):
                return
            continue
        except OSError:
            return
        view = view[n:]
