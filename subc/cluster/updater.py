"""The updater thread of a broker in a cluster (``subc serve --cluster``): requests become etcd
transactions, and the data plane changes only as the replica of etcd's state changes, in revision
order, on every broker alike.

A request (any broker takes any request):

* ``SUBSCRIBE``: checked here (ACL, limits, the endpoint's route), then one transaction creates the
  subscription's key with the next id (compare on ``meta/next_id``'s revision; a broker that lost
  the race reads the new value and tries again).  ``SUBACK`` is sent once this broker has applied
  the transaction's revision: committed in etcd, and switched in its own data plane.
* ``UNSUBSCRIBE``: a transaction deletes the key if it still exists; ``UNSUBACK`` once applied.
* ``RENEW``: a transaction rewrites the lease ends; ``RENEWACK`` once applied.  Leases are expired
  by the broker that owns the subscription's endpoint (compare on the record: a renewal that won
  the race keeps it).
* ``LIST`` is answered from the book and the replica.
* Topics (:mod:`subc.serve.topics`): a ``SUB`` is a subscription whose record holds its filter;
  the transaction that creates it references the labels of the filter's level names
  (:meth:`.commits.Committer.labelled`: new names get the next labels).  ``REGISTER`` writes
  ``reg/<source>/<topic>`` with its labels referenced the same way (``REGACK`` once applied),
  ``UNREGISTER`` deletes it.  Every broker builds a topic subscription's condition from the labels
  in its replica, which hold while the subscription does.  Registration leases are expired by the
  member that rendezvous hashing picks for the source; labels nothing references are forgotten by
  the member it picks for ``labels``.
* A fenced broker (its lease may be gone) refuses every request but ``LIST`` with an error.

What the follow thread queues (:mod:`.node`) is applied as one change per batch: subscriptions
removed and added (parsed from their text, regions built, endpoints numbered), lease ends, then
ownership: each UDP endpoint is delivered to by the live member that rendezvous hashing picks
(:mod:`.rendezvous`), and only once every other member acknowledged the member set (released what
it no longer owns, after a grace period); every other endpoint is on standby (journaled, its
sequence numbers taken, not sent).  The applied revision is committed to the store with the
change.
"""

from __future__ import annotations

import heapq
import logging
import time

from ..errors import SubcError
from ..ir.incremental import CapacityError
from ..lang.rules import parse_rules
from ..serve.book import Live
from ..serve.endpoints import is_soup, stream_key
from ..serve.events import event
from ..serve.network import Pending, request_region
from ..serve.store import TopicChanges
from ..serve.topics import TopicError, TopicSchema, literal_levels, parse_filter
from ..serve.updater import Updater
from .commits import TXN_OPS, Committer
from .etcd import EtcdError
from .records import SubRecord
from .rendezvous import owner
from .replica import Delta, Replica, topic_names

REVISION_META = "cluster_revision"
ROUTED_S = 10.0  # a new endpoint found routable is not looked up again for this long (its subscriptions in flight)
LABELS_OWNER = "labels"  # the rendezvous key whose owner forgets the labels nothing references
TOPIC_SUBS_PER_TXN = 16  # SUBs per transaction (each references up to depth label keys; etcd takes 128 operations)


class ClusterUpdater(Updater):
    """The updater of a broker in a cluster (see the module docstring).  Takes the
    :class:`Updater`'s arguments, then ``node`` (:class:`~.node.ClusterNode`), ``replica``
    (loaded from the store), ``grace`` (returns once no program run that started before the
    call is still running), the data plane's ``schedule`` (:class:`~subc.dataplane.ebpf.schedule.FeedSchedule`)
    and the ``lead`` (s, and at least ``lead_messages``) of a change's position over the feed."""

    def __init__(
        self, *args, node, replica: Replica, grace, schedule=None, lead: float = 0.05, lead_messages: int = 0, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self.node, self.replica, self.grace = node, replica, grace
        self.fenced = True  # until the member thread has joined
        self.acked = ""  # the member set this broker last acknowledged
        self.waiters: list[tuple[int, Pending, str]] = []  # (revision, request, reply line)
        self.inflight: dict[int, str] = {}  # ids committed here, not yet applied -> source
        self.apply_failures = 0  # subscriptions committed in etcd that this data plane could not take
        self.resolve_failures = 0  # owned endpoints that could not be resolved (left on standby)
        self.handovers = 0
        self.status_delay = 0.0  # s from this broker's last status write to its application here
        self.late_changes = 0  # changes applied after this broker's feed passed their position
        self.late_messages = 0  # messages between those positions and the feed's
        self._added = False  # subscriptions were added since ownership was last looked at
        self.parsed: dict[int, tuple] = {}  # ids committed here -> (condition, region), until applied
        self.routed: dict[tuple[str, int], float] = {}  # endpoints found routable -> until when (Unix s)
        self.committer = Committer(
            node.etcd, replica, schedule, lead, lead_messages, node.name, lambda: node.member_rev
        )
        self.owned_count = 0  # UDP endpoints delivered to (published for the member thread)
        self.endpoints.standby = lambda ep: not self._delivers(ep)
        self.schema = TopicSchema(self.cfg.spec) if self.cfg.spec.topic is not None else None
        if self.schema is not None:
            self.committer.label_limit = self.schema.label_limit
        self.labels_forgotten = 0
        self.answered: set[int] = set()  # requests of the batch being committed answered with an error

    # -- the batch ------------------------------------------------------------------------------

    def _process(self, batch: list[Pending]) -> None:
        cluster = [p for p in batch if p.kind == "cluster"]
        if cluster:
            self._apply(cluster)
        requests = [p for p in batch if p.kind != "cluster"]
        if requests:
            self._requests(requests, time.time())
        self._reply_applied()

    def _reply_applied(self) -> None:
        rev = self.replica.revision
        if not self.waiters:
            return
        done = time.perf_counter()
        keep = []
        for w in self.waiters:
            r, p, line = w
            if r > rev:
                keep.append(w)
                continue
            assert p.reply is not None
            p.reply(line)
            verb = p.kind
            if line.startswith("SUBACK"):
                self.metrics.suback.observe(done - p.t0)
            self.metrics.requests.labels(verb, "ok").inc()
        self.waiters = keep

    # -- requests ---------------------------------------------------------------------------------

    def _requests(self, batch: list[Pending], now: float) -> None:
        subs: list[tuple[Pending, SubRecord]] = []
        unsubs: list[tuple[Pending, int]] = []
        topic_subs: list[tuple[Pending, SubRecord]] = []
        regs: list[Pending] = []
        renews: list[tuple[Pending, list[int], list[tuple[str, str]]]] = []  # ids, registrations
        admitted: dict[str, int] = {}  # this batch's SUBSCRIBEs per source
        for p in batch:
            if p.kind == "tick":
                self._expire(now)
                self.routed = {ep: t for ep, t in self.routed.items() if t >= now}
                continue
            assert p.reply is not None  # every other request comes from the network
            if p.kind == "LIST":
                self._list(p)
                continue
            if self.fenced or self.node.fenced():
                self.metrics.requests.labels(p.kind, "fenced").inc()
                p.reply(
                    "ERR this broker is cut off from the cluster (its etcd lease may have ended): "
                    "send the request to another broker"
                )
                continue
            assert p.req is not None
            if p.kind in ("REGISTER", "UNREGISTER"):
                regs.append(p)
            elif p.kind in ("SUBSCRIBE", "SUB"):
                rec = self._admit_record(p, now, admitted)
                if rec is not None:
                    (topic_subs if rec.filter is not None else subs).append((p, rec))
            elif p.kind == "UNSUBSCRIBE":
                sid = p.req.sub_id
                rec = self.replica.subs.get(sid) if sid is not None else None
                if sid is None or rec is None or rec.source != p.source[0] or any(i == sid for _, i in unsubs):
                    p.reply(f"ERR no subscription {sid} of {p.source[0]}")
                    continue
                unsubs.append((p, sid))
            elif p.kind == "RENEW":
                src = p.source[0]
                ids = (
                    [p.req.sub_id]
                    if p.req.sub_id is not None
                    else [i for i, r in self.replica.subs.items() if r.source == src]
                )
                ids = [i for i in ids if i in self.replica.subs and self.replica.subs[i].source == src]
                regs_of = [k for k in self.replica.regs if k[1] == src] if p.req.sub_id is None else []
                renews.append((p, ids, regs_of))
        try:
            if subs:
                self._commit_subscribes(subs)
            if topic_subs:
                self._commit_subscribes(topic_subs, TOPIC_SUBS_PER_TXN)
            for p in regs:
                self._commit_registration(p, now)
            if unsubs:
                self._commit_unsubscribes(unsubs)
            if renews:
                self._commit_renewals(renews, now)
        except EtcdError as e:
            event(logging.WARNING, "cluster_commit_failed", error=e.message)
            waiting = {id(w[1]) for w in self.waiters}
            pend: list[Pending] = [
                *(p for p, _ in subs),
                *(p for p, _ in topic_subs),
                *(p for p, _ in unsubs),
                *(r[0] for r in renews),
                *regs,
            ]
            for p in pend:
                if p.reply and id(p) not in waiting and id(p) not in self.answered:
                    p.reply(f"ERR etcd: {e.message}")
                    self.metrics.requests.labels(p.kind, "error").inc()
        self.answered.clear()

    def _fail(self, p: Pending, line: str, outcome: str = "error") -> None:
        """Answer ``p`` with the error ``line`` while its batch is being committed."""
        assert p.reply is not None
        p.reply(line)
        self.answered.add(id(p))
        self.metrics.requests.labels(p.kind, outcome).inc()

    def _list(self, p: Pending) -> None:
        assert p.reply is not None
        src = p.source[0]
        lines = [lv.listing() for lv in self.book.subs.values() if lv.source == src]
        for topic, s in sorted(k for k in self.replica.regs if k[1] == src):
            labels = [self.replica.labels.get(n, (0, 0))[0] for n in topic_names(topic)]
            lines.append(f"REG {topic} {' '.join(map(str, labels))}")
        for line in lines:
            p.reply(line)
        p.reply(f"END {len(lines)}")

    def _admit_record(self, p: Pending, now: float, admitted: dict[str, int]) -> SubRecord | None:
        """A SUBSCRIBE's record, or None after an error reply (ACL, the source's limit counting
        the applied, the committed and the ``admitted`` ones, an endpoint with no route)."""
        req, src = p.req, p.source[0]
        assert req is not None and p.reply is not None
        ep = req.to or p.source
        if req.to is not None and not self.cfg.acl.may_send_to(src, req.to[0], req.token):
            self.metrics.requests.labels("SUBSCRIBE", "denied").inc()
            p.reply(f"SUBERR {req.column + len(req.text)} the ACL does not let {src} direct deliveries to {req.to[0]}")
            return None
        held = self.book.count(src) + sum(1 for s in self.inflight.values() if s == src) + admitted.get(src, 0)
        if held >= self.cfg.acl.subs_per_source:
            self.metrics.requests.labels("SUBSCRIBE", "limit").inc()
            p.reply(f"SUBERR 1 {src} has {self.cfg.acl.subs_per_source} subscriptions, the most one source may have")
            return None
        if not is_soup(ep[0]) and ep not in self.endpoints.by_ep and self.routed.get(ep, 0) < now:
            try:
                self.endpoints.resolver(ep[0], ep[1], 0)
            except SubcError as e:
                p.reply(f"SUBERR 1 endpoint {ep[0]}:{ep[1]}: {e.message}")
                return None
            self.routed[ep] = now + ROUTED_S
        if p.kind == "SUB" and not self._check_topic(p):
            return None
        admitted[src] = admitted.get(src, 0) + 1
        return SubRecord(
            req.text,
            ep[0],
            ep[1],
            src,
            now + self.cfg.lease if self.cfg.lease else None,
            req.topic_text if p.kind == "SUB" else None,
        )

    def _check_topic(self, p: Pending) -> bool:
        """Whether a SUB's condition (its filter's with the labels its names have now, or would
        get, and its WHERE part) parses within the limits and accepts a message; else an error
        reply.  The condition every broker applies is built again from the labels committed."""
        req = p.req
        assert req is not None and req.topic is not None and p.reply is not None and self.schema is not None
        names = literal_levels(req.topic)
        nxt = self.replica.next_label[0]
        labels = {}
        for n in names:
            cur = self.replica.labels.get(n)
            labels[n] = cur[0] if cur is not None else min(nxt, self.schema.label_limit - 1)
        text = self.schema.condition(req.topic, labels)
        if req.text:
            text = f"{text} and ({req.text})"
        try:
            req.condition = parse_rules(text + " : fwd(0);", self.cfg.spec, "<topic>", limits=self.cfg.limits)[
                0
            ].condition
        except SubcError as e:
            p.reply(f"SUBERR {req.column} {e.message}")
            return False
        return request_region(self.diagram, req, p.reply) is not None

    def _commit_registration(self, p: Pending, now: float) -> None:
        """A REGISTER or UNREGISTER: its transaction, and its reply once applied (or an error)."""
        req, src = p.req, p.source[0]
        assert req is not None and req.topic is not None and p.reply is not None
        if p.kind == "UNREGISTER":
            rev = self.committer.unregister(src, req.topic_text)
            if rev is None:
                self._fail(p, f"ERR {src} has no registration of {req.topic_text}")
            else:
                self.waiters.append((rev, p, f"UNREGACK {req.topic_text}"))
            return
        held = sum(1 for t, s in self.replica.regs if s == src)
        if (req.topic_text, src) not in self.replica.regs and held >= self.cfg.acl.subs_per_source:
            self._fail(
                p, f"ERR {src} has {self.cfg.acl.subs_per_source} registrations, the most one source may have", "limit"
            )
            return
        try:
            names = list(req.topic)
            rev, labels = self.committer.register(
                src, req.topic_text, names, now + self.cfg.lease if self.cfg.lease else None
            )
        except SubcError as e:
            self._fail(p, f"ERR {e.message}")
            return
        self.waiters.append((rev, p, f"REGACK {req.topic_text} {' '.join(str(labels[n]) for n in names)}"))

    def _commit_subscribes(self, subs: list[tuple[Pending, SubRecord]], per_txn: int = TXN_OPS) -> None:
        for at in range(0, len(subs), per_txn):
            chunk = subs[at : at + per_txn]
            names = [n for _, rec in chunk if rec.filter is not None for n in topic_names(rec.filter)]
            try:
                done = self.committer.subscribe([rec for _, rec in chunk], names)
            except SubcError as e:  # labels exhausted
                for p, _ in chunk:
                    self._fail(p, f"SUBERR 1 {e.message}")
                continue
            for (p, rec), (sid, rev) in zip(chunk, done):
                self.inflight[sid] = rec.source
                self.waiters.append((rev, p, f"SUBACK {sid}"))
                if p.kind == "SUBSCRIBE" and p.req is not None and p.region is not None:  # parsed: not again
                    self.parsed[sid] = (p.req.condition, p.region)

    def _commit_unsubscribes(self, unsubs: list[tuple[Pending, int]]) -> None:
        for at in range(0, len(unsubs), TXN_OPS):
            chunk = unsubs[at : at + TXN_OPS]
            done = self.committer.unsubscribe([i for _, i in chunk])
            for p, i in chunk:
                rev = done[i]
                if rev is not None:
                    self.waiters.append((rev, p, f"UNSUBACK {i}"))
                else:
                    self._fail(p, f"ERR no subscription {i} of {p.source[0]}")

    def _commit_renewals(self, renews: list[tuple[Pending, list[int], list[tuple[str, str]]]], now: float) -> None:
        exp = now + self.cfg.lease if self.cfg.lease else None
        for p, ids, regs in renews:
            rev = self.committer.renew([(i, self.replica.subs[i]) for i in ids], exp)
            if regs:
                rev = max(rev, self.committer.renew_registrations(regs, exp))
            self.waiters.append((max(rev, self.replica.revision), p, f"RENEWACK {len(ids) + len(regs)}"))

    def _expire(self, now: float) -> None:
        """Delete the subscriptions whose lease ended and whose endpoint this broker owns, and
        the registrations whose lease ended and whose source it is picked for (the record
        compared: a renewal that won keeps it); forget the labels nothing references when it is
        picked for them."""
        if self.fenced or self.node.fenced():
            return
        members = list(self.replica.members)
        me = self.node.name
        try:
            for key, reg in list(self.replica.regs.items()):
                if reg.expires is not None and reg.expires <= now and owner(f"reg:{key[1]}", members) == me:
                    self.committer.expire_registration(key, reg)
            if owner(LABELS_OWNER, members) == me:
                gone = self.replica.unreferenced()
                if gone:
                    self.labels_forgotten += self.committer.forget(gone)
        except EtcdError as e:
            event(logging.WARNING, "cluster_expire_failed", error=e.message)
        for i in self.book.expired(now):
            rec = self.replica.subs.get(i)
            if rec is None:
                continue
            if owner(stream_key(rec.ep), members) != self.node.name:
                heapq.heappush(self.book.leases, (now + 1.0, i))  # its owner expires it; looked at again
                continue
            try:
                self.committer.expire(i, rec)
            except EtcdError as e:
                event(logging.WARNING, "cluster_expire_failed", id=i, error=e.message)

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
        text = self.schema.condition(levels, labels)
        return f"{text} and ({rec.text})" if rec.text else text

    def _change_from(self, delta: Delta) -> None:
        """Apply ``delta``'s subscriptions to the book, the data plane and the store."""
        added, removed, renewed_recs = delta.added, delta.removed, delta.renewed
        ops: list = []
        gone: list[Live] = []
        for i in removed:
            lv = self.book.subs.get(i)
            if lv is not None:
                ops.append((self.diagram.region(lv.condition), lv.sid, -1))  # type: ignore[arg-type]
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
                    cond = parse_rules(self._text(rec) + " : fwd(0);", self.cfg.spec, "<etcd>", limits=self.cfg.limits)[
                        0
                    ].condition
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
