"""The recovery service of an eBPF broker loaded with ``--journal`` (``subc load --journal``,
``subc journal``): the journal feed from the data plane's ring buffer into one journal per
subscriber, retention, the MoldUDP64 request server (``--rerequest``), and a status file that
``subc stats`` reads (``journal.json`` in the broker's state directory, replaced atomically every
second).

Journals live under ``<state>/journal/<subscriber id>/`` with ``--state`` (durable: a service
restarted after ``kill -9`` reopens them and goes on from the ring's released position), else in
memory files.  A request is answered from the journal of the subscriber receiving at the
request's source address (an endpoint of the subscribers file), after the source proved it
receives there (:mod:`.rerequest`).
"""

from __future__ import annotations

import hmac
import json
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..backends.ebpf import layout as L
from ..backends.ebpf import map_names as MN
from ..dataplane.ebpf.bpf import Map, obj_get
from ..dataplane.ebpf.broker_state import JOURNAL_STATUS, loaded_home
from ..dataplane.ebpf.ringbuf import open_pinned_ring
from ..dataplane.ebpf.subscribers import load_subscribers
from ..errors import SubcError
from .journal import DEFAULT_SEGMENT_BYTES, Journal
from .journal_feed import JournalFeed
from .rerequest import RequestServer, Stream
from .soup_server import SoupServer

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_BYTES = {"b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}


@dataclass
class Retention:
    """How much of each subscriber's journal is kept: at most ``max_bytes`` (per subscriber)
    and messages no older than ``max_age_s`` seconds (whole segments are dropped, never the one
    being written)."""

    max_bytes: int | None = None
    max_age_s: float | None = None


def _check_login(logins: dict[str, tuple[str, int]], user: str, password: str) -> int | None:
    """The subscriber id of a SoupBinTCP ``user`` whose ``password`` matches (constant-time), or None."""
    found = logins.get(user)
    if found is None or not hmac.compare_digest(found[0].encode(), password.encode()):
        return None
    return found[1]


def parse_bytes(text: str, what: str = "a size") -> int:
    """A size with a unit (``512MiB``, ``4G``, ``100000B``) in bytes; SubcError otherwise."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([A-Za-z]+)", text.strip())
    if not m or m.group(2).lower() not in _BYTES:
        raise SubcError(f"{what} {text!r}: not a size (512MiB, 4G, 100000B)")
    return int(float(m.group(1)) * _BYTES[m.group(2).lower()])


def parse_retention(text: str) -> Retention:
    """``--retain``: ``SECONDS`` with a unit (``90s``, ``10m``, ``2h``, ``1d``), ``BYTES`` with
    one (``512MiB``, ``4G``, ``100000B``), or both, comma-separated.  Raises SubcError."""
    out = Retention()
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([A-Za-z]+)", part)
        unit = m.group(2).lower() if m else ""
        if m and unit in _UNITS:
            out.max_age_s = float(m.group(1)) * _UNITS[unit]
        elif m and unit in _BYTES:
            out.max_bytes = int(float(m.group(1)) * _BYTES[unit])
        else:
            raise SubcError(
                f"--retain {text!r}: {part!r} is neither a time (90s, 10m, 2h, 1d) nor a size (512MiB, 4G, 100000B)"
            )
    return out


class RecoveryService:
    """The service of the broker loaded on ``iface`` (see the module docstring).

    ``state``: directory of the journals (None: memory files); ``rerequest``: (host, port) of
    the request server (None: none); ``rate``: requests per second per source host.  Raises
    SubcError when subc is not loaded on ``iface`` here, or was loaded without ``--journal``."""

    def __init__(
        self,
        iface: str,
        state: str | Path | None = None,
        retention: Retention | None = None,
        rerequest: tuple[str, int] | None = None,
        rate: float = 100.0,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        soup: tuple[str, int] | None = None,
    ):
        self.home, bstate = loaded_home(iface)
        if not bstate.get("journal"):
            raise SubcError(f"subc is loaded on {iface} without --journal: its data plane feeds no journal")
        self.retention = retention or Retention()
        subs = load_subscribers(bstate["subscribers"])
        self.names = subs.names
        self.lock = threading.Lock()
        self.journals: dict[int, Journal] = {}
        for sid in subs.by_id:
            where = Path(state) / "journal" / str(sid) if state is not None else None
            self.journals[sid] = Journal(where, segment_bytes=segment_bytes, name=f"subc-journal-{sid}")
        self.streams: dict[tuple[str, int], Stream] = {}
        for sid, eps in subs.by_id.items():
            addrs = {(e.ip, e.port) for e in eps}
            stream = Stream(self.journals[sid], addrs)
            for a in addrs:
                self.streams[a] = stream
        self._ring_fd, self.ring = open_pinned_ring(self.home.pins / MN.JNL)
        self._seq = Map(obj_get(self.home.pins / MN.SEQ), 4, 8, name=MN.SEQ, owned=True)
        self.feed = JournalFeed(
            self.ring, self.journals.get, self.lock, sent_next=self._sent_next, recipients=list(self.journals)
        )
        self.server: RequestServer | None = None
        self.address: tuple[str, int] | None = None
        if rerequest is not None:
            self.server = RequestServer(self.streams.get, rate=rate)
            self.server.lock = self.lock
            self.address = self.server.start(*rerequest)
        self.soup: SoupServer | None = None
        self.soup_address: tuple[str, int] | None = None
        if soup is not None:
            logins = {login.user: (login.password, sid) for sid, login in subs.soup.items()}
            self.soup = SoupServer(
                lambda user, password: _check_login(logins, user, password),
                lambda key: self.journals.get(key) if isinstance(key, int) else None,
                self.lock,
                session_of=self._session_of,
            )
            self.soup_address = self.soup.start(*soup)
        self.retained_drops = 0

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
        """The kernel's next sequence number of each journaled subscriber (``subc_seq``)."""
        out = {}
        for sid in self.journals:
            v = self._seq.lookup(L.U32.pack(v=sid))
            if isinstance(v, bytes):
                out[sid] = L.U64.unpack(v)["v"]
        return out

    def run(self, stop: threading.Event, status_every_s: float = 1.0) -> None:
        """Feed the journals until ``stop`` is set: wait for the ring's notice (at most 0.1 s),
        drain, and every ``status_every_s`` apply retention and write the status file."""
        last = 0.0
        while not stop.is_set():
            self.ring.wait(0.1)
            journaled = self.feed.counters["journaled_messages"]
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
        """The service's figures: ring positions, the feed's and the request server's counters,
        and per subscriber its journal's retained range, bytes and holes."""
        with self.lock:
            subs = {
                str(sid): {
                    "name": self.names.get(sid),
                    "first_seq": j.first_seq,
                    "next_seq": j.next_seq,
                    "bytes": j.size,
                    "segments": len(j.segments),
                    "hole_messages": j.hole_messages,
                    "holes": [list(h) for h in j.holes[-5:]],
                    "dropped_by_retention": j.dropped_messages,
                }
                for sid, j in self.journals.items()
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
        """Stop the request server, release the ring and the maps, close the journals."""
        if self.server is not None:
            self.server.stop()
        if self.soup is not None:
            self.soup.stop()
        self.ring.close()
        os.close(self._ring_fd)
        self._seq.close()
        for j in self.journals.values():
            j.close()
