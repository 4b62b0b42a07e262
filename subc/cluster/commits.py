"""A broker's writes to etcd: its requests as transactions that compare revisions, each change
with the feed position it takes effect at (README, "Brokers on several hosts").

Every transaction that adds or removes a subscription compares that this broker's membership is
the one it holds (``member/<node>``'s create revision: a transaction that reaches etcd after the
broker's lease ended fails) and writes ``meta/position`` (compared on its revision, so positions
never go back): the position this broker's feed has reached, plus
``--cluster-lead`` seconds of feed at the rate it has seen, and never before the previous
change's.  Every broker schedules the change there (:mod:`subc.dataplane.ebpf.schedule`), so all
of them switch between the same two messages; a broker that applies a change after its own feed
passed that position switches at once and counts it (``late``).

A transaction whose outcome is unknown (etcd did not answer in time: it may still be applied, as
TCP delivers it late) is resolved before the broker replies: once etcd answers again, a
transaction rewrites ``meta/position`` unchanged if it still has the revision the lost one
compared (then that one can never be applied: not committed), else the lost one's own keys say
whether it was; a broker that cannot reach etcd before its lease ends is no member any more, and
the lost transaction compared its membership.
"""

from __future__ import annotations

import json
import math
import time
from typing import Callable, Sequence

from ..dataplane.ebpf.schedule import FeedSchedule, Position
from .etcd import Compare, Etcd, EtcdError, Op, TxnResult, delete, get, put
from ..errors import SubcError
from .records import (
    RegRecord,
    SubRecord,
    label_key,
    member_key,
    next_id_key,
    next_label_key,
    position_key,
    reg_key,
    sub_key,
)
from .replica import Replica

TXN_OPS = 100  # operations per transaction (etcd's default limit is 128)
TRIES = 20  # transactions tried when ids or positions race with other brokers
RESOLVE_S = 30.0  # longest wait for etcd to tell a lost transaction's outcome
IDLE_S = 1.0  # a feed silent this long has no rate: a change takes effect at its next message


class Committer:
    """Transactions of one broker over ``etcd`` for the state of ``replica``; ``schedule``: its
    data plane's feed position (None: no feed; changes then take effect where the last one did,
    or at once), ``lead`` in s of feed and at least ``lead_messages``; ``node`` and
    ``membership()`` (its member key's create revision now, 0: not a member)."""

    def __init__(
        self,
        etcd: Etcd,
        replica: Replica,
        schedule: FeedSchedule | None,
        lead: float,
        lead_messages: int = 0,
        node: str = "",
        membership: Callable[[], int] = lambda: 0,
    ):
        self.etcd, self.replica, self.schedule, self.lead = etcd, replica, schedule, lead
        self.lead_messages, self.node, self.membership = lead_messages, node, membership
        self.unknown_outcomes = 0  # transactions etcd did not answer, resolved before replying
        self.prefix = replica.prefix
        self.hint: tuple[Position | None, int] = (None, 0)  # meta/position as this broker last wrote or read it
        self.rate = 0.0  # messages/s the feed was seen to carry
        self._seen: tuple[Position, int] | None = None  # the last feed sample (position, ns)
        self.position_races = 0
        self.label_races = 0  # transactions retried because a label was given or forgotten meanwhile
        self.label_limit = 1 << 32  # one past the largest label the spec's label fields hold

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

    def commit(
        self, compares: Sequence[Compare], ops: Sequence[Op], gets: Sequence[str] = (), position: bool = True
    ) -> TxnResult:
        """One change: ``ops`` if ``compares`` hold and this broker is the member it was, with
        ``meta/position`` (``position`` False: a change of no stream, without it); position
        races are retried.  A failure the caller's comparisons caused comes back (``succeeded``
        False, ``got``: ``meta/position``, the member key, then ``gets``).  Raises EtcdError (not
        committed: a lost transaction is resolved first)."""
        key = position_key(self.prefix)
        mkey = member_key(self.prefix, self.node)
        for _ in range(TRIES):
            mrev = self.membership()
            if not mrev:
                raise EtcdError("this broker is not a member of the cluster now (its lease ended)")
            p, rev = self.next_position() if position else (None, -1)
            if not position:
                try:
                    r = self.etcd.txn(
                        [*compares, Compare(mkey, "create", "=", mrev)], ops, [get(mkey), *(get(k) for k in gets)]
                    )
                except EtcdError as e:
                    return self._resolve(e, None, mrev, ops)
                if not r.succeeded and not any(kv.key == mkey and kv.create_revision == mrev for kv in r.got):
                    raise EtcdError("this broker's membership ended (its lease expired)")
                return r
            extra = [put(key, json.dumps(p.to_json()).encode())] if p is not None else []
            cmp = [*compares, Compare(key, "mod", "=", rev), Compare(mkey, "create", "=", mrev)]
            try:
                r = self.etcd.txn(cmp, [*ops, *extra], [get(key), get(mkey), *(get(k) for k in gets)])
            except EtcdError as e:
                return self._resolve(e, rev, mrev, ops)
            if r.succeeded:
                if p is not None:
                    self.hint = (p, r.revision)
                return r
            got = {kv.key: kv for kv in r.got}
            if mkey not in got or got[mkey].create_revision != mrev:
                raise EtcdError("this broker's membership ended (its lease expired)")
            now = got[key].mod_revision if key in got else 0
            if now == rev:
                return r
            self.position_races += 1
            self.hint = (Position.from_json(json.loads(got[key].value)) if key in got else None, now)
        raise EtcdError("feed positions kept racing with other brokers; send the request again")

    def _resolve(self, error: EtcdError, rev: int | None, mrev: int, ops: Sequence[Op]) -> TxnResult:
        """The outcome of a transaction etcd did not answer (it compared membership ``mrev``,
        and ``meta/position`` at ``rev``, None: a change without a position): a synthetic success
        if it was applied, else EtcdError.  With a position, a transaction that rewrites
        ``meta/position`` unchanged makes sure the lost one never applies; without, its keys tell
        once etcd answers (a registration's value is its lease end, unique enough)."""
        self.unknown_outcomes += 1
        key = position_key(self.prefix)
        end = time.monotonic() + RESOLVE_S
        while time.monotonic() < end:
            if self.membership() != mrev:  # the lease ended: the lost transaction can never apply
                raise EtcdError(f"{error.message} (not committed: this broker's lease ended)")
            try:
                cur = self.etcd.get(key) if rev is not None else None
                if cur is not None and cur.mod_revision == rev:  # not applied yet: make sure it never is
                    if self.etcd.txn([Compare(key, "mod", "=", rev)], [put(key, cur.value)]).succeeded:
                        raise EtcdError(f"{error.message} (not committed)")
                    continue
                return self._applied(error, ops)
            except EtcdError as e:
                if "not committed" in e.message:
                    raise
                time.sleep(0.2)
        raise EtcdError(f"{error.message} (outcome unknown: etcd did not answer for {RESOLVE_S:.0f} s)")

    def _applied(self, error: EtcdError, ops: Sequence[Op]) -> TxnResult:
        """Whether the lost transaction's ``ops`` are what etcd holds (``meta/position`` moved
        since: it was applied, or another change was and it never will be)."""
        rev = 0
        for o in ops:
            if o.kind == "put" and o.key.startswith((f"{self.prefix}sub/", f"{self.prefix}reg/")):
                kv = self.etcd.get(o.key)
                if kv is None or kv.value != o.value:
                    raise EtcdError(f"{error.message} (not committed)")
                rev = max(rev, kv.mod_revision)
            elif o.kind == "delete":
                if self.etcd.get(o.key) is not None:
                    raise EtcdError(f"{error.message} (not committed)")
        return TxnResult(True, rev or self.etcd.revision(), [])

    # -- topic labels ---------------------------------------------------------------------------

    def labelled(
        self,
        names: Sequence[str],
        compares: Sequence[Compare],
        ops: Sequence[Op],
        gets: Sequence[str] = (),
        position=True,
    ) -> tuple[TxnResult, dict[str, int]]:
        """:meth:`commit` ``ops`` with the labels of level ``names`` referenced: an existing
        label key is compared on its create revision and rewritten, a new name given the next
        label (compare on ``meta/next_label``).  Label races are retried; a failure of the
        caller's ``compares`` comes back as in :meth:`commit`, with the labels it would have
        had.  Returns (result, name -> label).  Raises SubcError when the labels are exhausted,
        EtcdError."""
        nkey = next_label_key(self.prefix)
        view: dict[str, tuple[int, int] | None] = {}
        nl = self.replica.next_label
        uniq = list(dict.fromkeys(names))
        keys = [label_key(self.prefix, n) for n in uniq]
        for _ in range(TRIES):
            cmp: list[Compare] = []
            lops: list[Op] = []
            labels: dict[str, int] = {}
            nxt = first = max(nl[0], 1)
            for n, k in zip(uniq, keys):
                cur = view[n] if n in view else self.replica.labels.get(n)
                if cur is None:
                    cmp.append(Compare(k, "create", "=", 0))
                    labels[n] = nxt
                    nxt += 1
                else:
                    cmp.append(Compare(k, "create", "=", cur[1]))
                    labels[n] = cur[0]
                lops.append(put(k, str(labels[n]).encode()))
            if nxt > self.label_limit:
                raise SubcError(f"no labels left (labels are {self.label_limit - 1} at most and never reused)")
            if nxt != first:
                cmp.append(Compare(nkey, "mod", "=", nl[1]))
                lops.append(put(nkey, str(nxt).encode()))
            r = self.commit([*compares, *cmp], [*ops, *lops], [*gets, nkey, *keys], position)
            if r.succeeded:
                return r, labels
            got = {kv.key: kv for kv in r.got}
            now = {n: ((int(got[k].value), got[k].create_revision) if k in got else None) for n, k in zip(uniq, keys)}
            gnl = (int(got[nkey].value), got[nkey].mod_revision) if nkey in got else (1, 0)
            held = all(
                (now[n][1] if now[n] is not None else 0) == c.value  # type: ignore[index]
                for n, c in zip(uniq, cmp)
            ) and (nxt == first or gnl[1] == nl[1])
            if held:
                return r, labels  # the caller's comparison failed
            self.label_races += 1
            view, nl = dict(now), gnl
        raise EtcdError("topic labels kept racing with other brokers; send the request again")

    def forget(self, labels: dict[str, int]) -> int:
        """Delete the label keys ``labels`` (name -> the mod revision seen with nothing
        referencing it) that were not referenced since; returns how many.  Raises EtcdError."""
        items = [(label_key(self.prefix, n), rev) for n, rev in labels.items()]
        done = 0
        for at in range(0, len(items), TXN_OPS):
            chunk = items[at : at + TXN_OPS]
            if self.etcd.txn(
                [Compare(k, "mod", "=", rev) for k, rev in chunk], [delete(k) for k, _ in chunk]
            ).succeeded:
                done += len(chunk)
                continue
            for k, rev in chunk:  # one was referenced meanwhile: one by one
                done += self.etcd.txn([Compare(k, "mod", "=", rev)], [delete(k)]).succeeded
        return done

    def register(
        self, source: str, topic: str, names: Sequence[str], expires: float | None
    ) -> tuple[int, dict[str, int]]:
        """Register (or renew) ``source``'s ``topic`` (level ``names``) with lease end
        ``expires``: (revision, name -> label).  Raises SubcError (labels exhausted), EtcdError."""
        op = put(reg_key(self.prefix, source, topic), RegRecord(expires).encode())
        r, labels = self.labelled(names, [], [op], position=False)
        return r.revision, labels

    def unregister(self, source: str, topic: str) -> int | None:
        """Delete ``source``'s registration of ``topic``: the revision, or None when it had
        none.  Its labels are forgotten later (:meth:`forget`).  Raises EtcdError."""
        k = reg_key(self.prefix, source, topic)
        r = self.commit([Compare(k, "version", ">", 0)], [delete(k)], position=False)
        return r.revision if r.succeeded else None

    def renew_registrations(self, keys: Sequence[tuple[str, str]], expires: float | None) -> int:
        """Give the registrations ``keys`` ((topic, source)) the lease end ``expires``: the last
        revision written.  Raises EtcdError."""
        rev = 0
        val = RegRecord(expires).encode()
        for at in range(0, len(keys), TXN_OPS):
            ks = [reg_key(self.prefix, s, t) for t, s in keys[at : at + TXN_OPS]]
            r = self.etcd.txn([Compare(k, "version", ">", 0) for k in ks], [put(k, val) for k in ks])
            rev = max(rev, r.revision)
        return rev

    def expire_registration(self, key: tuple[str, str], rec: RegRecord) -> bool:
        """Delete registration ``key`` ((topic, source)) if it is still ``rec``."""
        k = reg_key(self.prefix, key[1], key[0])
        return self.etcd.txn([Compare(k, "value", "=", rec.encode())], [delete(k)]).succeeded

    # -- requests -------------------------------------------------------------------------------

    def subscribe(self, recs: Sequence[SubRecord], names: Sequence[str] = ()) -> list[tuple[int, int]]:
        """Create ``recs`` (at most :data:`TXN_OPS`, with the level ``names`` their topic
        filters reference) with the next ids: [(id, revision)].  Raises EtcdError, SubcError
        (labels exhausted)."""
        key = next_id_key(self.prefix)
        nxt, nxt_rev = self.replica.next_id
        for _ in range(TRIES):
            first = max(nxt, 1)
            ops = [put(key, str(first + len(recs)).encode())]
            ops += [put(sub_key(self.prefix, first + k), rec.encode()) for k, rec in enumerate(recs)]
            r, _ = self.labelled(names, [Compare(key, "mod", "=", nxt_rev)], ops, [key])
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
