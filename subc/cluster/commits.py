"""A broker's writes to etcd: its requests as transactions that compare revisions, each change
with the feed position it takes effect at (README, "Brokers on several hosts").

Every transaction that adds or removes a subscription also writes ``meta/position`` (compared on
its revision, so positions never go back): the position this broker's feed has reached, plus
``--cluster-lead`` seconds of feed at the rate it has seen, and never before the previous
change's.  Every broker schedules the change there (:mod:`subc.dataplane.ebpf.schedule`), so all
of them switch between the same two messages; a broker that applies a change after its own feed
passed that position switches at once and counts it (``late``).
"""

from __future__ import annotations

import json
import math
import time
from typing import Sequence

from ..dataplane.ebpf.schedule import FeedSchedule, Position
from .etcd import Compare, Etcd, EtcdError, Op, TxnResult, delete, get, put
from .records import SubRecord, next_id_key, position_key, sub_key
from .replica import Replica

TXN_OPS = 100  # operations per transaction (etcd's default limit is 128)
TRIES = 20  # transactions tried when ids or positions race with other brokers
IDLE_S = 1.0  # a feed silent this long has no rate: a change takes effect at its next message


class Committer:
    """Transactions of one broker over ``etcd`` for the state of ``replica``; ``schedule``: its
    data plane's feed position (None: no feed; changes then take effect where the last one did,
    or at once), ``lead`` in s of feed and at least ``lead_messages``."""

    def __init__(
        self, etcd: Etcd, replica: Replica, schedule: FeedSchedule | None, lead: float, lead_messages: int = 0
    ):
        self.etcd, self.replica, self.schedule, self.lead = etcd, replica, schedule, lead
        self.lead_messages = lead_messages
        self.prefix = replica.prefix
        self.hint: tuple[Position | None, int] = (None, 0)  # meta/position as this broker last wrote or read it
        self.rate = 0.0  # messages/s the feed was seen to carry
        self._seen: tuple[Position, int] | None = None  # the last feed sample (position, ns)
        self.position_races = 0

    # -- positions -----------------------------------------------------------------------------

    def feed(self) -> Position | None:
        """The feed's position now (and the rate estimate brought up to date)."""
        if self.schedule is None:
            return None
        got = self.schedule.position()
        if got is None:
            return None
        pos, ts = got
        prev = self._seen
        if prev is not None and prev[0].session == pos.session and ts > prev[1] and pos.seq >= prev[0].seq:
            r = (pos.seq - prev[0].seq) / ((ts - prev[1]) / 1e9)
            self.rate = r if not self.rate else 0.5 * self.rate + 0.5 * r
        self._seen = (pos, ts)
        if time.monotonic_ns() - ts > IDLE_S * 1e9:
            self.rate = 0.0
        return pos

    def _last(self) -> tuple[Position | None, int]:
        rp = self.replica.position
        return self.hint if self.hint[1] > rp[1] else rp

    def next_position(self) -> tuple[Position | None, int]:
        """(the position a change committed now takes effect at, the revision of ``meta/position``
        to compare)."""
        last, rev = self._last()
        f = self.feed()
        if f is None:
            return last, rev
        p = Position(f.session, f.seq + max(self.lead_messages, math.ceil(self.rate * self.lead)))
        if last is not None and last.session == p.session and last.seq > p.seq:
            p = last
        return p, rev

    def commit(self, compares: Sequence[Compare], ops: Sequence[Op], gets: Sequence[str] = ()) -> TxnResult:
        """One change: ``ops`` if ``compares`` hold, with ``meta/position``; position races are
        retried.  A failure the caller's comparisons caused comes back (``succeeded`` False,
        ``got``: ``meta/position`` then ``gets``).  Raises EtcdError."""
        key = position_key(self.prefix)
        for _ in range(TRIES):
            p, rev = self.next_position()
            extra = [put(key, json.dumps(p.to_json()).encode())] if p is not None else []
            r = self.etcd.txn(
                [*compares, Compare(key, "mod", "=", rev)], [*ops, *extra], [get(key), *(get(k) for k in gets)]
            )
            if r.succeeded:
                if p is not None:
                    self.hint = (p, r.revision)
                return r
            pkv = next((kv for kv in r.got if kv.key == key), None)
            now = pkv.mod_revision if pkv is not None else 0
            if now == rev:
                return r
            self.position_races += 1
            self.hint = (Position.from_json(json.loads(pkv.value)) if pkv is not None else None, now)
        raise EtcdError("feed positions kept racing with other brokers; send the request again")

    # -- requests -------------------------------------------------------------------------------

    def subscribe(self, recs: Sequence[SubRecord]) -> list[tuple[int, int]]:
        """Create ``recs`` (at most :data:`TXN_OPS`) with the next ids: [(id, revision)].
        Raises EtcdError."""
        key = next_id_key(self.prefix)
        nxt, nxt_rev = self.replica.next_id
        for _ in range(TRIES):
            first = max(nxt, 1)
            ops = [put(key, str(first + len(recs)).encode())]
            ops += [put(sub_key(self.prefix, first + k), rec.encode()) for k, rec in enumerate(recs)]
            r = self.commit([Compare(key, "mod", "=", nxt_rev)], ops, [key])
            if r.succeeded:
                return [(first + k, r.revision) for k in range(len(recs))]
            got = next((kv for kv in r.got if kv.key == key), None)
            nxt, nxt_rev = (int(got.value), got.mod_revision) if got is not None else (1, 0)
        raise EtcdError("subscription ids kept racing with other brokers; send the request again")

    def unsubscribe(self, ids: Sequence[int]) -> dict[int, int | None]:
        """Delete subscriptions ``ids`` (at most :data:`TXN_OPS`): id -> revision, or None for
        one that was gone already.  Raises EtcdError."""
        keys = [sub_key(self.prefix, i) for i in ids]
        r = self.commit([Compare(k, "version", ">", 0) for k in keys], [delete(k) for k in keys])
        if r.succeeded:
            return {i: r.revision for i in ids}
        out: dict[int, int | None] = {}
        for i, k in zip(ids, keys):  # one of them is gone already: one by one
            r1 = self.commit([Compare(k, "version", ">", 0)], [delete(k)])
            out[i] = r1.revision if r1.succeeded else None
        return out

    def renew(self, recs: Sequence[tuple[int, SubRecord]], expires: float | None) -> int:
        """Give ``recs`` ((id, record)) the lease end ``expires``: the last revision written
        (lease ends change no stream: no position).  Raises EtcdError."""
        rev = 0
        for at in range(0, len(recs), TXN_OPS):
            chunk = recs[at : at + TXN_OPS]
            keys = [sub_key(self.prefix, i) for i, _ in chunk]
            new = [SubRecord(r.text, r.ip, r.port, r.source, expires, r.filter).encode() for _, r in chunk]
            r = self.etcd.txn([Compare(k, "version", ">", 0) for k in keys], [put(k, v) for k, v in zip(keys, new)])
            rev = max(rev, r.revision)
        return rev

    def expire(self, sid: int, rec: SubRecord) -> bool:
        """Delete subscription ``sid`` if it is still ``rec`` (a renewal that won keeps it)."""
        k = sub_key(self.prefix, sid)
        return self.commit([Compare(k, "value", "=", rec.encode())], [delete(k)]).succeeded
