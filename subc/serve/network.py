"""The network thread of ``subc serve``: requests read from UDP datagrams and TCP lines
(:mod:`.protocol`), the per-source request rate enforced (:class:`subc.ratelimit.RateLimiter`: one complaint
per source per second, over UDP only to a source that proved its address), UDP requests from
sources that have not proven their address answered with a cookie and dropped (:mod:`.proof`: no
reflection, no amplification), conditions parsed (with the shapes of earlier ones,
:class:`~subc.lang.shapes.ShapeCache`) and their regions built
(:meth:`~subc.ir.incremental.LiveDiagram.region`, in a universe of their own: safe beside the
updater), then queued as :class:`Pending` for the updater (:mod:`.updater`)."""

from __future__ import annotations

import collections
import queue
import select
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, cast

from ..errors import SubcError
from ..ir.incremental import LiveDiagram, Node
from ..lang.shapes import ShapeCache
from ..recovery.cookies import Cookies
from ..ratelimit import RateLimiter
from .config import ServeConfig
from .metrics import Metrics
from .proof import AddressProof
from .protocol import MAX_LINE, ProtocolError, Request, parse_requests

UDP_RCVBUF = 16 << 20  # bytes
#: Ports tried for ``--listen HOST:0`` before giving up (:func:`bind_udp_tcp`).
PORT_TRIES = 100
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux, <asm-generic/socket.h>


@dataclass
class Pending:
    """A queued request: ``kind`` (the verb, 'tick', or 'cluster'), the parsed ``req``, its
    ``source`` (address, port), ``reply`` (sends one line), ``region`` (SUBSCRIBE), receipt time
    ``t0``; ``payload``: what a cluster's threads queue (:mod:`subc.cluster.node`)."""

    kind: str
    req: Request | None = None
    source: tuple[str, int] = ("", 0)
    reply: Callable[[str], None] | None = None
    region: Node | None = None
    t0: float = 0.0
    payload: object = None


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


def request_region(diagram: LiveDiagram, req: Request, reply: Callable[[str], None]) -> Node | None:
    """The region of ``req``'s condition in ``diagram`` (:meth:`LiveDiagram.region`), or None after
    an error reply (a field outside the field order, a condition that accepts no message)."""
    assert req.condition is not None  # a SUBSCRIBE's, or a SUB's once the updater gave it its filter's
    try:
        region = diagram.region(req.condition)
    except SubcError as e:
        col = req.column + (e.location.column - 1 if e.location else 0)
        reply(f"SUBERR {col} {e.message}")
        return None
    if LiveDiagram.is_empty(region):
        reply(f"SUBERR {req.column} the condition accepts no message")
        return None
    return region


class RequestListener:
    """The network thread for ``cfg``: :meth:`open` binds the UDP and TCP sockets of
    ``cfg.listen`` (SubcError when it cannot), :meth:`run` reads requests until ``stopping`` and
    puts them on ``out``; ``depth``: the topic levels (None: the spec has no topics); ``cookies``
    and ``clock`` (seconds; the rate limiter's) for tests.  ``counters``: the address proof's events
    (:data:`.proof.EVENTS`) and ``rate_limited``."""

    def __init__(
        self,
        cfg: ServeConfig,
        diagram: LiveDiagram,
        depth: int | None,
        metrics: Metrics,
        out: queue.Queue,
        stopping: threading.Event,
        cookies: Cookies | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.cfg, self.diagram, self.depth, self.metrics = cfg, diagram, depth, metrics
        self.queue, self.stopping = out, stopping
        self.clock = clock
        self.limiter = RateLimiter(cfg.acl.requests_per_second, clock)
        self.proof = AddressProof(cfg.acl, cookies, self._proof_event)
        self.counters = self.proof.counters
        self.complained: dict[str, float] = {}
        self.shapes = ShapeCache(cfg.spec, cfg.limits)  # this thread's: conditions parse without Lark
        self.sockets: list[socket.socket] = []
        self.port = 0
        self._inbox: collections.deque = collections.deque()  # submit()ted lines for this thread
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def open(self) -> int:
        """Bind the UDP and TCP sockets of ``listen`` (:func:`bind_udp_tcp`); the port."""
        self.udp, self.tcp, self.port = bind_udp_tcp(*self.cfg.listen)
        self.tcp.listen(128)
        self.udp.setblocking(False)
        self.tcp.setblocking(False)
        self.sockets = [self.udp, self.tcp]
        return self.port

    def close(self) -> None:
        """Close the sockets (after the thread ended)."""
        for s in self.sockets:
            s.close()
        self._wake_r.close()
        self._wake_w.close()

    def submit(self, payload: bytes, source: tuple[str, int], reply: Callable[[str], None]) -> None:
        """Hand request lines that came another way (a SoupBinTCP user's Unsequenced Data:
        ``source`` is ``("soup:<user>", 0)``, proven by its TCP connection and login) to this
        thread, which parses and queues them as it does a TCP peer's.  Thread-safe."""
        self._inbox.append((payload, source, reply))
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:  # the thread has wake-ups pending already
            pass

    def _submitted(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while self._inbox:
            payload, source, reply = self._inbox.popleft()
            lines = [raw for raw in payload.split(b"\n") if raw.strip()]
            self._requests([(raw, source, reply) for raw in self._allowed(lines, source, reply, None)])

    def run(self) -> None:
        """The thread's loop, until ``stopping``: read requests and queue them."""
        sel = selectors.DefaultSelector()
        sel.register(self.udp, selectors.EVENT_READ, "udp")
        sel.register(self.tcp, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "submitted")
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

                        batch += self.datagram(data, addr, reply)
                    self._requests(batch)
                elif kind == "submitted":
                    self._submitted()
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
                    conn = cast(socket.socket, key.fileobj)  # registered above with its ("tcp", ...) data
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

                    def tcp_reply(line: str, conn=conn, lock=lock) -> None:
                        with lock:
                            send_all(conn, line.encode() + b"\n")

                    lines = []
                    while True:
                        i = buf.find(b"\n")
                        if i < 0:
                            break
                        raw = bytes(buf[:i])
                        del buf[: i + 1]
                        if raw.strip():
                            lines.append(raw)
                    self._requests([(raw, peer, tcp_reply) for raw in self._allowed(lines, peer, tcp_reply, None)])
                    if len(buf) > MAX_LINE:
                        tcp_reply(f"ERR request longer than {MAX_LINE} bytes")
                        sel.unregister(conn)
                        conns.pop(conn, None)
                        conn.close()
        for conn in conns:
            conn.close()

    def _proof_event(self, name: str) -> None:
        self.metrics.proof.labels(name).inc()
        if name in ("requests_unproven", "pings_unproven"):
            self.metrics.requests.labels("any", "unproven").inc()

    def datagram(
        self, data: bytes, source: tuple[str, int], reply: Callable[[str], None]
    ) -> list[tuple[bytes, tuple[str, int], Callable[[str], None]]]:
        """The request lines of UDP datagram ``data`` from ``source`` to process ((line, source,
        reply)): those within the rate whose source proved its address (:mod:`.proof`); the
        unproven ones get their one reply here (a cookie, or nothing)."""
        lines = self._allowed([raw for raw in data.split(b"\n") if raw.strip()], source, reply, len(data))
        if not lines:
            return []
        proven, answer = self.proof.datagram(lines, source, len(data))
        if answer is not None:
            reply(answer)
        return [(raw, source, reply) for raw in proven]

    def _allowed(
        self, lines: list[bytes], source: tuple[str, int], reply: Callable[[str], None], size: int | None
    ) -> list[bytes]:
        """The request ``lines`` from ``source`` within its rate; over it, one complaint per
        second, to a TCP peer (``size`` None) or with a UDP line that proves its source's address
        (an unproven datagram's one reply is :meth:`.proof.AddressProof.datagram`'s)."""
        src = source[0]
        allowed = []
        for raw in lines:
            if self.limiter.allow(src):
                allowed.append(raw)
                continue
            self.metrics.requests.labels("any", "rate_limited").inc()
            self.counters["rate_limited"] += 1
            now = self.clock()
            if now - self.complained.get(src, -1.0) < 1.0:  # one complaint per second
                continue
            line = f"ERR rate limit: {self.cfg.acl.requests_per_second:g} requests per second"
            if size is None or self.proof.proven(raw, source):  # no amplification
                self.complained[src] = now
                reply(line)
        return allowed

    def _requests(self, items: list[tuple[bytes, tuple[str, int], Callable[[str], None]]]) -> None:
        """Handle the request lines ``items`` ((line, source, reply)) read in one go, within their
        rates and proven: parsing (:func:`.protocol.parse_requests`, with the shapes of earlier
        conditions), then :meth:`_request`."""
        if not items:
            return
        t0 = time.perf_counter()
        parsed = parse_requests([raw for raw, _, _ in items], self.cfg.spec, self.cfg.limits, self.depth, self.shapes)
        for (raw, source, reply), req in zip(items, parsed):
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
            p.region = request_region(self.diagram, req, reply)
            if p.region is None:
                return
        self.queue.put(p)


def send_all(conn: socket.socket, data: bytes, timeout_ms: int = 1000) -> None:
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
