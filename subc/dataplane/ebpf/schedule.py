"""Root switches at feed positions, and the feed's position, in a loaded eBPF data path with the
journal feed (``bpf/subc_cluster.h``: ``subc_sched`` and ``subc_pos``).

A *position* is a MoldUDP64 session (10 bytes) and a sequence number.  A switch scheduled at a
position makes every datagram of that session numbered at or past it, and every datagram of
another session, classified with the switch's root (the last such switch), the rest with
``subc_root``'s.  Brokers of a cluster schedule each change at the position etcd records for it,
so they all switch between the same two messages of the feed whatever the moment they apply it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ...backends.ebpf import layout as L
from ...backends.ebpf import map_names as MN
from ...errors import SubcError
from .bpf import Map

BPF_F_LOCK = 4  # update the value under its bpf_spin_lock (include/uapi/linux/bpf.h)
SESSION_BYTES = 10


@dataclass(frozen=True, order=True)
class Position:
    """A feed position: MoldUDP64 ``session`` (10 bytes) and sequence number ``seq``."""

    session: bytes
    seq: int

    def to_json(self) -> dict:
        """``{"session": hex, "seq": n}``."""
        return {"session": self.session.hex(), "seq": self.seq}

    @classmethod
    def from_json(cls, d: dict) -> "Position":
        """The position of :meth:`to_json`'s ``d``; ValueError when it is not one."""
        s = bytes.fromhex(d["session"])
        if len(s) != SESSION_BYTES or int(d["seq"]) < 0:
            raise ValueError("not a feed position")
        return cls(s, int(d["seq"]))

    def passed_by(self, feed: "Position | None") -> bool:
        """Whether a feed at ``feed`` (its next sequence number) has reached this position: every
        datagram to come is at or past it (or of another session)."""
        if feed is None:
            return False
        return feed.session != self.session or feed.seq >= self.seq


def _split(session: bytes) -> tuple[int, int]:
    return int.from_bytes(session[:8], sys.byteorder), int.from_bytes(session[8:10], sys.byteorder)


class FeedSchedule:
    """``subc_sched`` and ``subc_pos`` of a loaded data path's ``maps`` (SubcError when it was
    loaded without the journal feed)."""

    def __init__(self, maps: dict[str, Map]):
        if MN.SCHED not in maps or MN.POS not in maps:
            raise SubcError("the data path was loaded without the journal feed: it has no switch schedule")
        self.sched, self.pos = maps[MN.SCHED], maps[MN.POS]
        self.entry = L.SCHED_ENTRY
        self.capacity = L.SCHED_ENTRIES

    def position(self) -> tuple[Position, int] | None:
        """The feed's position now ((session, next sequence number), when it was last seen in
        CLOCK_MONOTONIC ns), or None before any datagram: the session of the latest datagram
        on any CPU, the highest next number of that session."""
        vals = self.pos.lookup(L.U32.pack(v=0))
        if not vals:
            return None
        rows = [L.POS.unpack(v) for v in (vals if isinstance(vals, list) else [vals])]
        rows = [r for r in rows if r["ts"]]
        if not rows:
            return None
        latest = max(rows, key=lambda r: r["ts"])
        key = (latest["s0"], latest["s1"])
        nxt = max(r["next"] for r in rows if (r["s0"], r["s1"]) == key)
        session = latest["s0"].to_bytes(8, sys.byteorder) + latest["s1"].to_bytes(2, sys.byteorder)
        return Position(session, nxt), latest["ts"]

    def write(self, entries: list[tuple[Position, int]]) -> None:
        """Make the schedule ``entries`` ((position, root slot), positions non-decreasing; at
        most :data:`~subc.backends.ebpf.layout.SCHED_ENTRIES`), in one locked write; the data
        path tracks the feed's position from the first write on."""
        if len(entries) > L.SCHED_ENTRIES:
            raise SubcError(f"at most {L.SCHED_ENTRIES} root switches can be scheduled")
        body = b"".join(
            self.entry.pack(seq=p.seq, s0=_split(p.session)[0], s1=_split(p.session)[1], root=slot)
            for p, slot in entries
        )
        body += bytes(self.entry.size * (L.SCHED_ENTRIES - len(entries)))
        self.sched.update(L.U32.pack(v=0), L.SCHED_HEAD.pack(0, len(entries), 1, 0) + body, BPF_F_LOCK)
