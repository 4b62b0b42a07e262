"""The recovery service of an eBPF broker whose data plane feeds a journal (``subc load
--journal``, ``subc journal``, ``subc serve --journal``): the journal feed from the data plane's
ring buffer into one journal per stream, retention, the MoldUDP64 request server
(``--rerequest``), the SoupBinTCP server (``--soup``), and a status file that ``subc stats``
reads (``journal.json`` in the broker's state directory, replaced atomically every second).

A *stream* is what one subscriber number (the data plane's recipient) is sent between two
bindings: :meth:`RecoveryService.bind` gives a number its stream key (``subc load``: the
subscriber id; ``subc serve``: the endpoint, ``IP:PORT`` or ``soup:USER``) and the addresses that
may re-request it.  A number that changes hands (``subc serve`` reuses a number after its last
subscription's grace period) is bound only once the feed has read every record the data plane
had reserved until then, so the old stream's copies never reach the new stream's journal.

Journals live under ``<state>/journal/<key>/`` with a state directory (durable: a service
restarted after ``kill -9`` reopens them and goes on from the ring's released position), else in
memory files.  A re-request is answered from the journal of the stream bound to its source
address, after the source proved it receives there (:mod:`.rerequest`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ..backends.ebpf import layout as L
from ..backends.ebpf import map_names as MN
from ..dataplane.ebpf.bpf import Map
from ..dataplane.ebpf.bpf_objects import obj_get
from ..dataplane.ebpf.broker_home import BrokerHome
from ..dataplane.ebpf.broker_state import JOURNAL_STATUS
from ..dataplane.ebpf.ringbuf import open_pinned_ring
from ..errors import SubcError
from .journal import DEFAULT_SEGMENT_BYTES, Journal
from .journal_feed import JournalFeed
from .rerequest import RequestServer, Stream
from .retention import Retention
from .soup_server import SoupServer

#: The key of the kernel's ``journal_lost`` counter in the statistics map.
JOURNAL_LOST_KEY = L.U32.pack(v=L.STATS.index("journal_lost"))
#: Longest wait (s) of :meth:`RecoveryService.bind` for the feed to read up to its position.
BIND_WAIT_S = 10.0


@dataclass
class ServiceOptions:
    """The service's options: ``state`` (journals' directory, None: memory files), retention,
    segment size (bytes), the request server's address (None: none) and rate (requests per
    second per source host), the SoupBinTCP server's address (None: none)."""

    state: Path | None = None
    retention: Retention = field(default_factory=Retention)
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    rerequest: tuple[str, int] | None = None
    rate: float = 100.0
    soup: tuple[str, int] | None = None


def _dir_name(key: str) -> str:
    """A stream key as a directory name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", key)


class RecoveryService:
    """The service over the data plane pinned in ``home`` (see the module docstring).

    ``accounts(user, password)``: the stream key of a SoupBinTCP login, or None (rejected);
    ``on_unsequenced(key, payload)``: a logged-in SoupBinTCP client's Unsequenced Data (its reply,
    if any, is sent later with :meth:`soup_reply`).  Raises SubcError when the ring cannot be
    opened (a data plane loaded without the journal feed)."""

    def __init__(
        self,
        home: BrokerHome,
        options: ServiceOptions,
        accounts: Callable[[str, str], str | None] | None = None,
        on_unsequenced: Callable[[str, bytes], None] | None = None,
    ):
        self.home, self.options = home, options
        self.retention = options.retention
        self.lock = threading.Lock()  # held while journals are written, read or rotated
        self.journals: dict[str, Journal] = {}
        self.bound: dict[int, str] = {}  # subscriber number -> stream key
        self.by_addr: dict[tuple[str, int], str] = {}  # re-request source -> stream key
        self.names: dict[int, str] = {}
        self._ring_fd, self.ring = open_pinned_ring(home.pins / MN.JNL)
        self._seq = Map(obj_get(home.pins / MN.SEQ), 4, 8, name=MN.SEQ, owned=True)
        self._stats = Map(obj_get(home.pins / MN.STATS), 4, 8, percpu=True, name=MN.STATS, owned=True)
        self.feed = JournalFeed(
            self.ring,
            self._journal_of,
            self.lock,
            sent_next=self._sent_next,
            recipients=range(L.RECIPIENTS - 1),
            lost_total=self._lost_total,
        )
        self._binds: list[tuple[int, str, list[tuple[str, int]], bool, threading.Event]] = []
        self._binds_lock = threading.Lock()
        self._running = False
        self.server: RequestServer | None = None
        self.address: tuple[str, int] | None = None
        if options.rerequest is not None:
            self.server = RequestServer(self._stream_of, rate=options.rate)
            self.server.lock = self.lock
            self.address = self.server.start(*options.rerequest)
        self.soup: SoupServer | None = None
        self.soup_address: tuple[str, int] | None = None
        self._on_unsequenced = on_unsequenced
        if options.soup is not None:
            self.soup = SoupServer(
                accounts or (lambda user, password: None),
                self._soup_journal,
                self.lock,
                on_unsequenced=self._unsequenced if on_unsequenced else None,
                session_of=self._session_of,
            )
            self.soup_address = self.soup.start(*options.soup)
        self.retained_drops = 0

    # -- streams -----------------------------------------------------------------------------------

    def journal(self, key: str) -> Journal:
        """The journal of stream ``key`` (opened, or made, on first use)."""
        j = self.journals.get(key)
        if j is None:
            where = self.options.state / "journal" / _dir_name(key) if self.options.state is not None else None
            j = self.journals[key] = Journal(
                where, segment_bytes=self.options.segment_bytes, name=f"subc-journal-{_dir_name(key)}"
            )
        return j

    def _new_journal(self, key: str) -> None:
        """Start stream ``key`` afresh (its numbers begin again at 1): the old journal goes."""
        with self.lock:
            old = self.journals.pop(key, None)
            if old is not None:
                old.close()
            if self.options.state is not None:
                shutil.rmtree(self.options.state / "journal" / _dir_name(key), ignore_errors=True)
            self.journal(key)

    def bind(
        self, sid: int, key: str, addresses: Iterable[tuple[str, int]] = (), fresh: bool = False, name: str = ""
    ) -> None:
        """Give subscriber number ``sid`` the stream ``key`` (``fresh``: its numbers start again at
        1, so the stream's journal starts afresh), re-requestable from ``addresses``.  While the
        service runs, this waits until the feed has read every record reserved before the call
        (the number's previous stream ends there).  Raises SubcError when the feed does not get
        there within BIND_WAIT_S."""
        addrs = list(addresses)
        if name:
            self.names[sid] = name
        if not self._running:
            self._apply_bind(sid, key, addrs, fresh)
            return
        done = threading.Event()
        with self._binds_lock:
            self._binds.append((sid, key, addrs, fresh, done))
        self.ring.wake()  # the feed thread applies it now, not after its idle wait
        if not done.wait(BIND_WAIT_S):
            raise SubcError(f"the journal feed did not reach subscriber {sid}'s new stream in {BIND_WAIT_S:.0f} s")

    def _apply_bind(self, sid: int, key: str, addrs: list[tuple[str, int]], fresh: bool) -> None:
        if self.bound.get(sid) is not None:
            self.feed.finish(sid)  # the number's previous stream: its last copies and gaps are final
        if fresh:
            self._new_journal(key)
        else:
            with self.lock:
                self.journal(key)
        self.bound[sid] = key
        for a in addrs:
            self.by_addr[a] = key
        self.feed.restart(sid)

    def _take_binds(self) -> None:
        """Apply the binds asked for: first read the ring up to where it was (module docstring)."""
        with self._binds_lock:
            binds, self._binds = self._binds, []
        if not binds:
            return
        prod = self.ring.producer
        while self.feed.read_pos < prod:
            if not self.feed.drain():
                self.ring.wait(0.001)  # a record still being written
        for sid, key, addrs, fresh, done in binds:
            self._apply_bind(sid, key, addrs, fresh)
            done.set()

    def _journal_of(self, sid: int) -> Journal | None:
        key = self.bound.get(sid)
        return self.journals.get(key) if key is not None else None

    def _stream_of(self, addr: tuple[str, int]) -> Stream | None:
        key = self.by_addr.get(addr)
        if key is None or key not in self.journals:
            return None
        return Stream(self.journals[key], {addr})

    def _soup_journal(self, key: Hashable) -> Journal | None:
        if not isinstance(key, str):
            return None
        return self.journal(key)  # under the server's lock (the caller's)

    def _unsequenced(self, key: Hashable, payload: bytes) -> bytes | None:
        if self._on_unsequenced is not None and isinstance(key, str):
            self._on_unsequenced(key, payload)
        return None  # the reply comes later (soup_reply)

    def soup_reply(self, key: str, payload: bytes) -> None:
        """Send Unsequenced Data ``payload`` to the SoupBinTCP clients of stream ``key``."""
        if self.soup is not None:
            self.soup.send_unsequenced(key, payload)

    def _session_of(self, key: object) -> bytes:
        """The session a SoupBinTCP login to an empty journal gets: the latest session any
        journal holds (the feed's), else 10 spaces."""
        latest = max(
            (j.segments[-1] for j in self.journals.values() if j.segments),
            key=lambda seg: seg.last_append,
            default=None,
        )
        return latest.session if latest is not None else b" " * 10

    def _sent_next(self) -> dict[int, int]:
        """The kernel's next sequence number of each bound subscriber number (``subc_seq``)."""
        out = {}
        for sid in list(self.bound):
            v = self._seq.lookup(L.U32.pack(v=sid))
            if isinstance(v, bytes):
                out[sid] = L.U64.unpack(v)["v"]
        return out

    def _lost_total(self) -> int:
        """The kernel's count of copies sent but not journaled (``journal_lost``, all CPUs)."""
        v = self._stats.lookup(JOURNAL_LOST_KEY)
        return sum(int.from_bytes(x[:8], "little") for x in v) if isinstance(v, list) else 0

    # -- running -----------------------------------------------------------------------------------

    def run(self, stop: threading.Event, status_every_s: float = 1.0) -> None:
        """Feed the journals until ``stop`` is set: wait for the ring's notice (at most 0.1 s),
        apply the binds asked for, drain, and every ``status_every_s`` apply retention and write
        the status file."""
        self._running = True
        last = 0.0
        try:
            while not stop.is_set():
                self.ring.wait(0.1)
                journaled = self.feed.counters["journaled_messages"]
                self._take_binds()
                while self.feed.drain(limit=65536):
                    pass
                if self.soup is not None and self.feed.counters["journaled_messages"] != journaled:
                    self.soup.wake()  # live data for the SoupBinTCP clients
                now = time.monotonic()
                if now - last >= status_every_s:
                    self.retain()
                    self.write_status()
                    last = now
            self.feed.drain()
        finally:
            self._running = False
            self._take_binds()
        self.write_status()

    def retain(self) -> None:
        """Apply the retention to every journal."""
        r = self.retention
        if r.max_bytes is None and r.max_age_s is None:
            return
        with self.lock:
            for j in self.journals.values():
                self.retained_drops += j.retain(r.max_bytes, r.max_age_s)

    def status(self) -> dict:
        """The service's figures: ring positions, the feed's, the request server's and the
        SoupBinTCP server's counters, and per bound subscriber number its stream's journal."""
        with self.lock:
            subs = {}
            for sid, key in sorted(self.bound.items()):
                j = self.journals[key]
                subs[str(sid)] = {
                    "stream": key,
                    "name": self.names.get(sid),
                    "first_seq": j.first_seq,
                    "next_seq": j.next_seq,
                    "bytes": j.size,
                    "segments": len(j.segments),
                    "hole_messages": j.hole_messages,
                    "holes": [list(h) for h in j.holes[-5:]],
                    "dropped_by_retention": j.dropped_messages,
                }
        return {
            "updated": time.time(),
            "pid": os.getpid(),
            "ring": {"bytes": self.ring.size, "consumer": self.ring.consumer, "producer": self.ring.producer},
            "feed": {"path": self.feed.path, **dict(self.feed.counters)},
            "held": self.feed.held,
            "rerequest": None
            if self.server is None
            else {"address": list(self.address or ()), **dict(self.server.counters)},
            "soup": None
            if self.soup is None
            else {
                "address": list(self.soup_address or ()),
                "counters": dict(self.soup.counters),
                "sessions": self.soup.sessions(),
            },
            "retention": {"max_bytes": self.retention.max_bytes, "max_age_s": self.retention.max_age_s},
            "subscribers": subs,
        }

    def write_status(self) -> None:
        """Replace ``journal.json`` in the broker's state directory (a temporary file, then rename)."""
        path = self.home.state_dir / JOURNAL_STATUS
        tmp = path.with_name(f".{JOURNAL_STATUS}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(self.status(), indent=1) + "\n")
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop the servers, release the ring and the maps, close the journals."""
        if self.server is not None:
            self.server.stop()
        if self.soup is not None:
            self.soup.stop()
        self.ring.close()
        os.close(self._ring_fd)
        self._seq.close()
        self._stats.close()
        for j in self.journals.values():
            j.close()
