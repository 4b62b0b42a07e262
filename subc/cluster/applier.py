"""How a broker in a cluster applies the replica of etcd's state to its data plane (the part of
:class:`~.updater.ClusterUpdater` that follows etcd, as a mixin over its attributes).

What the follow thread queues (:mod:`.node`) is applied as one change per run of revisions whose
changes take effect at one feed position: subscriptions removed and added (parsed from their text,
or a topic subscription's filter with the labels in the replica; regions built, endpoints
numbered), lease ends, the labels the store keeps, then ownership: each UDP endpoint is delivered
to by the live member that rendezvous hashing picks (:mod:`.rendezvous`), and only once every other
member acknowledged the member set (released what it no longer owns, after a grace period); every
other endpoint is on standby (journaled, its sequence numbers taken, not sent).  The applied
revision is committed to the store with the change.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from ..errors import SubcError
from ..ir.incremental import CapacityError
from ..lang.rule_shapes import ShapeCache
from ..lang.rules import parse_rules
from ..serve.book import Live
from ..serve.endpoints import is_soup, stream_key
from ..serve.events import event
from ..serve.network import Pending
from ..serve.store import TopicChanges
from ..serve.topics import TopicError, TopicSchema, literal_levels, parse_filter
from .commits import Committer
from .records import SubRecord
from .rendezvous import owner
from .replica import Delta, Replica

REVISION_META = "cluster_revision"  # the store's meta key of the applied etcd revision


class ReplicaApplier:
    """Applies the replica's changes and ownership (see the module docstring); mixed into
    :class:`~.updater.ClusterUpdater`, whose attributes it uses."""

    cfg: Any
    book: Any
    broker: Any
    diagram: Any
    store: Any
    endpoints: Any
    metrics: Any
    work: Any
    node: Any
    replica: Replica
    committer: Committer
    schema: TopicSchema | None
    shapes: ShapeCache  # the updater thread's: conditions of known shapes parse without Lark
    grace: Callable[[], None]
    fenced: bool
    acked: str
    inflight: dict[int, str]
    parsed: dict[int, tuple]
    apply_failures: int
    resolve_failures: int
    handovers: int
    status_delay: float
    late_changes: int
    late_messages: int
    owned_count: int
    _added: bool

    # -- applying the replica's changes ---------------------------------------------------------------

    def _apply(self, items: list[Pending]) -> None:
        """Apply what the cluster's threads queued, in order: each run of revisions whose changes
        take effect at one feed position is one change of the data plane."""
        delta = Delta()
        members = False
        for p in items:
            payload = p.payload
            assert isinstance(payload, tuple)
            kind = payload[0]
            if kind == "snapshot":
                delta = self._step(delta, self.replica.reconcile(payload[1], payload[2]))
            elif kind == "events":
                for rev, evs in payload[1]:
                    delta = self._step(delta, self.replica.apply(rev, evs))
            elif kind == "fenced":
                self.fenced = True
                members = True
            elif kind == "joined":
                self.fenced = False
                members = True
        sent = self.node.status_sent
        if sent is not None and self.replica.revision >= sent[0]:
            self.status_delay = time.monotonic() - sent[1]
        members = members or delta.members or self._added
        self._flush(delta)
        self.store.commit(
            [], [], {}, meta={REVISION_META: str(self.replica.revision)}, topics=self._label_changes(delta)
        )
        if self.schema is not None:
            self.metrics.labels.set(len(self.replica.labels))
            self.metrics.registrations.set(len(self.replica.regs))
        self._own(force=members)
        self._added = False
        if self.fenced:
            self.node.standby_done.set()

    def _step(self, delta: Delta, d: Delta) -> Delta:
        """Fold revision delta ``d`` into the pending ``delta``, first applying the pending one
        when ``d`` changes subscriptions at another position."""
        if d.changes_subscriptions() and delta.changes_subscriptions() and d.position != delta.position:
            members = delta.members
            self._flush(delta)
            delta = Delta(members=members, labels=delta.labels)
        delta.merge(d)
        return delta

    def _flush(self, delta: Delta) -> None:
        if delta.start:
            self._change_from(delta)
            delta.start.clear()
            delta.end.clear()

    def _at(self, delta: Delta):
        """The feed position ``delta``'s change takes effect at: its own, not before the last
        switch already scheduled (or the feed's position now, for a change etcd gave none); late
        ones are counted.  None: at once (no feed seen, nothing scheduled)."""
        if not delta.changes_subscriptions():
            return None
        at = delta.position
        feed = self.committer.feed()
        sched = self.broker.scheduled
        if at is None:
            at = feed
        if sched and (at is None or (sched[-1][0].session == at.session and sched[-1][0].seq > at.seq)):
            at = sched[-1][0]
        if at is not None and feed is not None and feed.session == at.session and feed.seq > at.seq:
            self.late_changes += 1
            self.late_messages += feed.seq - at.seq
            event(logging.WARNING, "cluster_late_change", position=at.seq, feed=feed.seq)
        return at

    def _label_changes(self, delta: Delta) -> TopicChanges | None:
        """The labels ``delta`` gave or forgot, for the store (which a restart's topic
        subscriptions are rebuilt from before etcd is read); taken from ``delta``."""
        if not delta.labels:
            return None
        given = {n: lab for n, lab in delta.labels.items() if lab is not None}
        forgotten = {n for n, lab in delta.labels.items() if lab is None}
        delta.labels = {}
        return TopicChanges(given, forgotten, self.replica.next_label[0], {})

    def _text(self, rec: SubRecord) -> str:
        """The condition (rule-language text) of subscription ``rec``: its text, or for a topic
        subscription its filter's condition with the labels in the replica and its WHERE part.
        Raises SubcError (no topic fields, a label not in the replica)."""
        if rec.filter is None:
            return rec.text
        if self.schema is None:
            raise SubcError("a topic subscription, and the spec has no topic fields")
        try:
            levels = parse_filter(rec.filter, self.schema.depth)
        except TopicError as e:
            raise SubcError(f"topic filter {rec.filter!r}: {e.message}") from None
        labels = {}
        for n in literal_levels(levels):
            cur = self.replica.labels.get(n)
            if cur is None:
                raise SubcError(f"topic level {n!r} has no label in etcd")
            labels[n] = cur[0]
        return self.schema.condition(levels, labels, rec.text)

    def _change_from(self, delta: Delta) -> None:
        """Apply ``delta``'s subscriptions to the book, the data plane and the store."""
        added, removed, renewed_recs = delta.added, delta.removed, delta.renewed
        ops: list = []
        gone: list[Live] = []
        for i in removed:
            lv = self.book.subs.get(i)
            if lv is not None:
                ops.append((self.diagram.region(lv.condition), lv.sid, -1))
                gone.append(lv)
        new: list[Live] = []
        ep_new: dict[tuple[str, int], int] = {}
        for i, rec in added.items():
            self.inflight.pop(i, None)
            if i in self.book.subs and i not in removed:
                continue  # restored from the store already
            try:
                mine = self.parsed.pop(i, None)
                if mine is not None:
                    cond, region = mine
                else:
                    cond = parse_rules(
                        self._text(rec) + " : fwd(0);",
                        self.cfg.spec,
                        "<etcd>",
                        limits=self.cfg.limits,
                        shapes=self.shapes,
                    )[0].condition
                    region = self.diagram.region(cond)
                first = rec.ep not in self.endpoints.by_ep
                sid, _ = self.endpoints.acquire(rec.ep)
            except SubcError as e:
                self.apply_failures += 1
                event(logging.ERROR, "cluster_apply_failed", id=i, condition=rec.text, reason=e.message)
                continue
            if first:
                ep_new[rec.ep] = sid
            self.book.admit(rec.source)
            lv = Live(i, rec.text, cond, rec.ep, sid, rec.source, rec.expires, rec.filter)
            ops.append((region, sid, +1))
            new.append(lv)
        at = self._at(delta)
        try:
            self.broker.apply(ops, at=at)
        except (CapacityError, SubcError) as e:  # one by one: what fits goes in
            event(logging.ERROR, "cluster_change_too_big", error=str(e))
            kept_new: list[Live] = []
            kept_gone: list[Live] = []
            for op, lv in zip(ops, gone + new):
                try:
                    self.broker.apply([op], at=at)
                except (CapacityError, SubcError):
                    self.apply_failures += 1
                    if op[2] > 0:
                        self.book.undo_admit(lv, self.endpoints.release)
                    continue
                (kept_new if op[2] > 0 else kept_gone).append(lv)
            new, gone = kept_new, kept_gone
        eps: dict[tuple[str, int], int | None] = {}
        self._added = self._added or bool(new)
        for lv in new:
            self.book.track(lv)
            if lv.ep in ep_new:
                eps.setdefault(lv.ep, lv.sid)
        for lv in gone:
            self.book.untrack(lv)
            if self.endpoints.release(lv.ep):
                eps[lv.ep] = None
        renewed = []
        for i, rec in renewed_recs.items():
            if i in self.book.subs:
                self.book.renew([i], rec.expires)
                renewed.append((i, rec.expires))
        self.work.set()
        self.store.commit(
            [lv.stored() for lv in new],
            [lv.id for lv in gone],
            eps,
            meta={REVISION_META: str(self.replica.revision)},
            renewed=renewed,
            topics=self._label_changes(delta),
        )
        self.metrics.changes.inc()
        self.metrics.subscriptions.set(len(self.book))
        self.metrics.endpoints.set(len(self.endpoints))

    # -- ownership ------------------------------------------------------------------------------------

    def _delivers(self, ep: tuple[str, int]) -> bool:
        """Whether this broker delivers to UDP endpoint ``ep`` now: not fenced, its owner under
        the live member set, and every other member acknowledged that set."""
        me = self.node.name
        if self.fenced or self.node.fenced() or me not in self.replica.members:
            return False
        if not self.replica.handed_over(me):
            return False
        return owner(stream_key(ep), self.replica.members) == me

    def _count_owned(self) -> None:
        self.owned_count = sum(
            1 for ep in self.endpoints.by_ep if not is_soup(ep[0]) and ep not in self.endpoints.on_standby
        )

    def _own(self, force: bool) -> None:
        """Put on standby the endpoints this broker no longer delivers to, wait a grace period,
        acknowledge the member set, then deliver to the ones it now owns."""
        if not force:
            return
        release, take = [], []
        for ep in list(self.endpoints.by_ep):
            if is_soup(ep[0]):
                continue
            want = self._delivers(ep)
            active = ep not in self.endpoints.on_standby
            if active and not want:
                release.append(ep)
            elif want and not active:
                take.append(ep)
        for ep in release:
            self.endpoints.set_standby(ep, True)
        if release:
            self.grace()  # no copy to a released endpoint is still being built
            self.handovers += 1
        me = self.node.name
        ms = self.replica.member_set()
        if not self.fenced and me in self.replica.members and self.acked != ms:
            if self.node.ack(ms):
                self.acked = ms
        for ep in take:
            try:
                self.endpoints.set_standby(ep, False)
            except SubcError as e:
                self.resolve_failures += 1
                event(logging.WARNING, "cluster_endpoint_unresolved", endpoint=f"{ep[0]}:{ep[1]}", reason=e.message)
        self._count_owned()
        if release or take:
            event(logging.INFO, "cluster_ownership", released=len(release), taken=len(take), member_set=ms)
