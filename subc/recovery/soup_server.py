"""The SoupBinTCP 4.1 server: a subscriber logs in over TCP and gets its stream from its journal
(:mod:`.journal`), the messages it missed (backfill) then the live ones, with no gap and no
duplicate, each sent with ``os.sendfile`` from the segment files (the journal stores every message
as its Sequenced Data packet), never copied through Python.

Protocol (SoupBinTCP 4.1, "Protocol Flow" and the packets of :mod:`subc.wire.soupbintcp`):

* **Login.**  The client's first packet is a Login Request (before it, Unsequenced Data is a
  protocol error; Debug and Client Heartbeat are ignored).  ``accounts(username, password)`` gives
  the user's stream key or None: *Login Rejected* ``A``.  ``journal_of(key)`` gives its journal or
  None: ``S``.  The requested session must be all spaces or the stream's current session (the
  last segment's; for an empty journal ``session_of(key)``, by default 10 spaces), else ``S``.
  The requested sequence number: 0 means the journal's ``next_seq`` (live only); a number from
  ``first_seq`` to ``next_seq`` means backfill from it; one before retention (< ``first_seq``),
  past ``next_seq``, in a hole (sent, never journaled) or of another session is rejected ``S``.
  *Login Accepted* carries the session and the number of the first Sequenced Data packet sent.
  A rejected client is closed once the Login Rejected is sent.
* **Data.**  Backfill and live data alike are byte ranges of the segments
  (``Journal.spans``), sent as the socket takes them (partial sends continue inside a range).
  The journal's writer calls :meth:`SoupServer.wake` after appending, so live data goes out at
  once (else at the next 0.1 s tick).
* **Holes.**  SoupBinTCP numbers messages by their order on the connection, so it cannot skip a
  number: a client whose next number is in a hole gets a Debug packet saying so and is
  disconnected (reason ``hole``); it should log in again at the next journaled number
  (``Journal.available_from``).  Likewise a client that fell behind retention (``retention``).
  A client whose next message belongs to another session gets *End of Session* and is closed.
* **Heartbeats and timeouts.**  A *Server Heartbeat* goes to a logged-in client after
  ``heartbeat_s`` without anything sent to it; a client from which nothing came for
  ``client_timeout_s`` is closed (``client timeout``); one that has not logged in within
  ``client_timeout_s`` too (``login timeout``).  A Logout Request closes the connection
  (``logout``).
* **Slow clients.**  Sockets are non-blocking and one thread serves every client with
  ``selectors``; a client whose socket takes nothing for more than ``stall_timeout_s`` while data
  waits is closed (``stalled``): it never slows the others.  Each turn sends a client at most
  4 MiB, so a long backfill does not starve the rest.
* **Unsequenced Data** from a logged-in client goes to ``on_unsequenced(key, payload)``; the
  payload it returns (if any) is sent back as Unsequenced Data (4.1 leaves that packet free-form
  both ways).
* :meth:`SoupServer.end_session` sends End of Session to a key's clients after what they are owed.

Every event is counted in :attr:`SoupServer.counters`: ``connections``, ``logins_accepted``,
``login_rejected_A``, ``login_rejected_S`` (and ``login_rejected_S:<why>``: ``no journal``,
``session``, ``retention``, ``future``, ``hole``), ``disconnects`` and ``disconnect:<reason>``,
``backfill_bytes``, ``live_bytes``, ``sendfile_calls``, ``heartbeats_sent``, ``client_heartbeats``,
``unsequenced_in``, ``unsequenced_out``, ``debug_in``, ``protocol_errors``, ``end_of_session_sent``,
``internal_errors``.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Hashable
from typing import Callable

from ..errors import SubcError
from ..wire import soupbintcp as sb
from .journal import Journal
from .soup_session import SoupClient, Span, admit, own_spans, why_not

#: Bytes of journal ranges taken at once for a client.
SPAN_BYTES = 1 << 20
#: Bytes a client is sent per turn of the loop before the others get theirs.
TURN_BYTES = 4 << 20
#: Bytes read from a client at once.
RECV_BYTES = 65536
#: The loop's longest wait (s): its timers run at least this often.
TICK_S = 0.1
#: Disconnections remembered in :attr:`SoupServer.disconnected`.
MAX_DISCONNECTED = 200
_LISTEN, _WAKE = "listen", "wake"


class SoupServer:
    """A SoupBinTCP 4.1 server over journals (see the module docstring).

    ``accounts(username, password)``: the user's stream key (any hashable) or None.
    ``journal_of(key)``: its :class:`~.journal.Journal` or None.  ``lock``: the lock the journals'
    writer holds while appending (held here only to read a journal, never while sending).
    ``on_unsequenced(key, payload)``: the reply payload to a client's Unsequenced Data, or None.
    ``session_of(key)``: the session (10 bytes) of a stream whose journal is empty.
    ``heartbeat_s``, ``client_timeout_s``, ``stall_timeout_s``: seconds of ``clock``."""

    def __init__(
        self,
        accounts: Callable[[str, str], Hashable | None],
        journal_of: Callable[[Hashable], Journal | None],
        lock: threading.Lock,
        on_unsequenced: Callable[[Hashable, bytes], bytes | None] | None = None,
        heartbeat_s: float = 1.0,
        client_timeout_s: float = 15.0,
        stall_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        session_of: Callable[[Hashable], bytes] | None = None,
    ):
        self.accounts = accounts
        self.journal_of = journal_of
        self.lock = lock
        self.on_unsequenced = on_unsequenced
        self.session_of = session_of
        self.heartbeat_s = heartbeat_s
        self.client_timeout_s = client_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.clock = clock
        self.counters: Counter = Counter()
        #: The last disconnections: :meth:`SoupClient.info` with the ``reason``, oldest first.
        self.disconnected: deque[dict] = deque(maxlen=MAX_DISCONNECTED)
        #: The last unexpected errors (text), for diagnosis.
        self.errors: deque[str] = deque(maxlen=20)
        self.address: tuple[str, int] | None = None
        self._clients: dict[int, SoupClient] = {}
        self._registry = threading.Lock()  # guards _clients against sessions() from other threads
        self._changed = threading.Condition()
        self._ends: deque[Hashable] = deque()  # end_session requests for the loop
        self._replies: deque[tuple[Hashable, bytes]] = deque()  # send_unsequenced requests for the loop
        self._stopping = False
        self._sel: selectors.BaseSelector | None = None
        self._listener: socket.socket | None = None
        self._wake_fd = -1
        self._wake_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # -- the public side -------------------------------------------------------------------------

    def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on TCP ``host``:``port`` (0: any free port) and serve in a thread; returns the
        address (host, port).  Raises SubcError when already started, OSError when the address
        cannot be bound."""
        if self._thread is not None:
            raise SubcError("the SoupBinTCP server is already started")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        lsock = socket.socket(family, socket.SOCK_STREAM)
        try:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind((host, port))
            lsock.listen(128)
            lsock.setblocking(False)
        except OSError:
            lsock.close()
            raise
        self._listener = lsock
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._sel = selectors.DefaultSelector()
        self._sel.register(lsock, selectors.EVENT_READ, _LISTEN)
        self._sel.register(self._wake_fd, selectors.EVENT_READ, _WAKE)
        name = lsock.getsockname()
        self.address = (name[0], name[1])
        self._thread = threading.Thread(target=self._run, name="subc-soupbintcp", daemon=True)
        self._thread.start()
        return self.address

    def wake(self) -> None:
        """Have the loop look at the journals now (thread-safe; the journal's writer calls it
        after appending, so live data goes out at once)."""
        with self._wake_lock:  # never a write to the descriptor once closed (its number reused)
            if self._wake_fd >= 0:
                try:
                    os.eventfd_write(self._wake_fd, 1)
                except BlockingIOError:  # the counter is full: the loop is woken anyway
                    pass

    def end_session(self, key: Hashable) -> None:
        """Send End of Session to ``key``'s clients once they have what the journal holds now,
        then close them (reason ``end of session``).  Thread-safe."""
        self._ends.append(key)
        self.wake()

    def send_unsequenced(self, key: Hashable, payload: bytes) -> None:
        """Send Unsequenced Data ``payload`` to ``key``'s logged-in clients (a reply that comes
        later than :attr:`on_unsequenced` returns).  Thread-safe."""
        self._replies.append((key, payload))
        self.wake()

    def stop(self) -> None:
        """Close every connection and the listening socket, and end the thread."""
        self._stopping = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def sessions(self) -> list[dict]:
        """One dict per connected client (:meth:`SoupClient.info`: peer, user, key, next_seq,
        bytes_sent, connected_since, ...).  Thread-safe."""
        with self._registry:
            clients = list(self._clients.values())
        return [c.info() for c in clients]

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` is true, tested after each turn of the loop, at most
        ``timeout`` seconds; returns its last value."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    # -- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        sel = self._sel
        assert sel is not None
        last_tick = time.monotonic()
        try:
            while not self._stopping:
                woken = False
                for skey, mask in sel.select(TICK_S):
                    if skey.data is _LISTEN:
                        self._accept()
                    elif skey.data is _WAKE:
                        woken = True
                        try:
                            os.eventfd_read(self._wake_fd)
                        except BlockingIOError:
                            pass
                    else:
                        self._event(skey.data, mask)
                if woken or time.monotonic() - last_tick >= TICK_S:
                    last_tick = time.monotonic()
                    self._tick()
                with self._changed:
                    self._changed.notify_all()
        finally:
            self._shutdown()

    def _event(self, c: SoupClient, mask: int) -> None:
        try:
            if mask & selectors.EVENT_READ:
                self._read(c)
            if mask & selectors.EVENT_WRITE and not c.closed:
                self._pump(c)
        except Exception as e:  # a bug must not take the other clients down: close this one
            self._internal(c, e)

    def _internal(self, c: SoupClient, e: Exception) -> None:
        self.counters["internal_errors"] += 1
        self.errors.append(f"{c.peer}: {type(e).__name__}: {e}")
        self._close(c, "internal error")

    def _tick(self) -> None:
        """The timers, End of Session requests, and live data for every client not waiting for
        its socket."""
        now = self.clock()
        while self._ends:
            self._end(self._ends.popleft())
        while self._replies:
            key, payload = self._replies.popleft()
            for c in list(self._clients.values()):
                if c.logged_in and c.key == key and c.closing is None:
                    c.queue(sb.encode_unsequenced_data(payload))
                    self.counters["unsequenced_out"] += 1
        for c in list(self._clients.values()):
            try:
                self._timers(c, now)
                if not c.closed and not c.want_write:
                    self._pump(c)
            except Exception as e:
                self._internal(c, e)

    def _timers(self, c: SoupClient, now: float) -> None:
        if c.stalled_since is not None and now - c.stalled_since > self.stall_timeout_s:
            self._close(c, "stalled")
        elif not c.logged_in and c.closing is None and now - c.connected_at > self.client_timeout_s:
            self._close(c, "login timeout")
        elif now - c.last_recv > self.client_timeout_s:
            self._close(c, "client timeout")
        elif c.logged_in and c.closing is None and not c.items and now - c.last_sent >= self.heartbeat_s:
            c.queue(sb.SERVER_HEARTBEAT_PACKET)
            self.counters["heartbeats_sent"] += 1

    def _end(self, key: Hashable) -> None:
        for c in list(self._clients.values()):
            if c.key == key and c.journal is not None and c.closing is None:
                with self.lock:
                    c.end_at = c.journal.next_seq

    # -- connections ---------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._listener is not None and self._sel is not None
        for _ in range(64):
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors, a connection reset before accept
                self.counters["accept_errors"] += 1
                self.errors.append(f"accept: {e}")
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = SoupClient(sock, (peer[0], peer[1]), sb.PacketDecoder(sb.FROM_CLIENT), self.clock())
            with self._registry:
                self._clients[c.fd] = c
            self._sel.register(sock, selectors.EVENT_READ, c)
            self.counters["connections"] += 1

    def _close(self, c: SoupClient, reason: str) -> None:
        """Close ``c`` now, counted under ``reason``."""
        if c.closed:
            return
        assert self._sel is not None
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        with self._registry:
            self._clients.pop(c.fd, None)
        self.disconnected.append({**c.info(), "reason": reason})
        self.counters["disconnect:" + reason] += 1  # counted before the peer can see the end
        self.counters["disconnects"] += 1
        c.close()

    def _close_after(self, c: SoupClient, reason: str, packet: bytes | None = None) -> None:
        """Send ``packet`` (if any) after what is queued, then close ``c`` (``reason``)."""
        if packet is not None:
            c.queue(packet)
        c.closing = reason

    def _shutdown(self) -> None:
        for c in list(self._clients.values()):
            self._close(c, "server stopped")
        if self._sel is not None:
            self._sel.close()
        if self._listener is not None:
            self._listener.close()
        with self._wake_lock:
            if self._wake_fd >= 0:
                os.close(self._wake_fd)
                self._wake_fd = -1
        with self._changed:
            self._changed.notify_all()

    # -- what clients send ---------------------------------------------------------------------

    def _read(self, c: SoupClient) -> None:
        try:
            data = c.sock.recv(RECV_BYTES)
        except BlockingIOError:
            return
        except OSError:
            self._close(c, "connection lost")
            return
        if not data:
            self._close(c, "peer closed")
            return
        c.last_recv = self.clock()
        if c.closing is not None:
            return  # being closed: what it says no longer matters
        packets = c.decoder.feed(data)
        while not c.closed and c.closing is None:
            try:
                p = next(packets, None)
            except SubcError as e:  # malformed: the stream's framing is lost
                self._protocol_error(c, e.message)
                break
            if p is None:
                break
            self._packet(c, p)
        if not c.closed:
            self._pump(c)

    def _packet(self, c: SoupClient, p: sb.Packet) -> None:
        t = p.type
        if t == sb.LOGIN_REQUEST:
            if c.logged_in:
                self._protocol_error(c, "a second Login Request")
                return
            try:
                req = sb.decode_login_request(p.payload)
            except SubcError as e:
                self._protocol_error(c, e.message)
                return
            self._login(c, req)
        elif t == sb.UNSEQUENCED_DATA:
            if not c.logged_in:
                self._protocol_error(c, "Unsequenced Data before login")
                return
            self.counters["unsequenced_in"] += 1
            reply = self.on_unsequenced(c.key, p.payload) if self.on_unsequenced is not None else None
            if reply is not None:
                c.queue(sb.encode_unsequenced_data(reply))
                self.counters["unsequenced_out"] += 1
        elif t == sb.CLIENT_HEARTBEAT:
            self.counters["client_heartbeats"] += 1
        elif t == sb.DEBUG:
            self.counters["debug_in"] += 1
        elif t == sb.LOGOUT_REQUEST:
            self._close(c, "logout")

    def _protocol_error(self, c: SoupClient, text: str) -> None:
        """A Debug packet saying what was wrong, then the connection closed."""
        self.counters["protocol_errors"] += 1
        self._close_after(c, "protocol error", sb.encode_debug("protocol error: " + text))

    def _login(self, c: SoupClient, req: sb.LoginRequest) -> None:
        key = self.accounts(req.username, req.password)
        if key is None:
            self.counters["login_rejected_A"] += 1
            self._close_after(c, "login rejected", sb.encode_login_rejected(sb.REJECT_NOT_AUTHORIZED))
            return
        j = self.journal_of(key)
        why, session, start, live_from = ("no journal", b"", 0, 0) if j is None else self._admit(j, key, req)
        if why is not None:
            self.counters["login_rejected_S:" + why] += 1
            self.counters["login_rejected_S"] += 1
            self._close_after(c, "login rejected", sb.encode_login_rejected(sb.REJECT_SESSION_NOT_AVAILABLE))
            return
        c.user, c.key, c.journal, c.session = req.username, key, j, session
        c.next_seq, c.backfill_end = start, live_from
        c.queue(sb.encode_login_accepted(session, start))
        self.counters["logins_accepted"] += 1

    def _admit(self, j: Journal, key: Hashable, req: sb.LoginRequest) -> tuple[str | None, bytes, int, int]:
        """:func:`~.soup_session.admit` under the journal's lock."""
        with self.lock:
            if j.segments:
                current = j.segments[-1].session
            else:
                current = self.session_of(key) if self.session_of is not None else sb.BLANK_SESSION
            return admit(j, req, current)

    # -- what clients get ----------------------------------------------------------------------

    def _pump(self, c: SoupClient) -> None:
        """Send ``c`` what is queued and what it is owed, at most :data:`TURN_BYTES`, and watch
        its socket for writability while it has more."""
        now = self.clock()
        budget = TURN_BYTES
        blocked = False
        while not c.closed and budget > 0:
            if not c.items and not self._refill(c):
                break
            try:
                sent, blocked = c.send(budget, now, self.counters)
            except OSError:
                self._close(c, "connection lost")
                return
            budget -= sent
            if blocked:
                break
        if c.closed:
            return
        if not c.items and c.closing is not None:
            self._close(c, c.closing)
            return
        self._watch(c, blocked or budget <= 0)

    def _watch(self, c: SoupClient, write: bool) -> None:
        if write != c.want_write:
            assert self._sel is not None
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
            self._sel.modify(c.sock, events, c)
            c.want_write = write

    def _refill(self, c: SoupClient) -> bool:
        """Queue the next journal ranges ``c`` is owed (or its End of Session, or its closing);
        returns whether anything was queued."""
        j = c.journal
        if j is None or c.closing is not None:
            return False
        with self.lock:
            end = j.next_seq if c.end_at is None else min(j.next_seq, c.end_at)
            live = c.next_seq >= c.backfill_end
            if not live:
                end = min(end, c.backfill_end)  # a range is backfill or live, never both
            if c.next_seq >= end:
                spans: list[Span] = []
                why = "end" if c.end_at is not None and c.next_seq >= c.end_at else None
            else:
                if c.session == sb.BLANK_SESSION:
                    # a login to an empty journal took the blank session: its first message names it
                    c.session = j.session_of(c.next_seq) or c.session
                got = j.spans(c.next_seq, end - c.next_seq, max_bytes=SPAN_BYTES, session=c.session)
                spans = own_spans(j, c.next_seq, got, live)
                why = None if spans else why_not(j, c)
            resume = j.available_from(c.next_seq) if why == "hole" else None
        if spans:
            c.items.extend(spans)
            return True
        if why is None:
            return False
        if why in ("end", "end of session"):
            self.counters["end_of_session_sent"] += 1
            self._close_after(c, "end of session", sb.END_OF_SESSION_PACKET)
        else:
            text = f"sequence number {c.next_seq} is not in the journal ({why})"
            if resume is not None:
                text += f"; log in again at {resume}"
            self._close_after(c, why, sb.encode_debug(text))
        return True
