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

What the follow thread queues (:mod:`.node`) is applied by :class:`~.applier.ReplicaApplier`.
"""

from __future__ import annotations

import heapq
import logging
import time

from ..errors import SubcError
from ..lang.rule_shapes import ShapeCache
from ..lang.rules import parse_rules
from ..serve.endpoints import is_soup, stream_key
from ..serve.events import event
from ..serve.network import Pending, request_region
from ..serve.topics import TopicSchema, literal_levels
from ..serve.updater import Updater
from .applier import ReplicaApplier
from .commits import TXN_OPS, Committer
from .etcd import EtcdError
from .records import SubRecord
from .rendezvous import owner
from .replica import Replica, topic_names

ROUTED_S = 10.0  # a new endpoint found routable is not looked up again for this long (its subscriptions in flight)
LABELS_OWNER = "labels"  # the rendezvous key whose owner forgets the labels nothing references
TOPIC_SUBS_PER_TXN = 16  # SUBs per transaction (each references up to depth label keys; etcd takes 128 operations)


class ClusterUpdater(ReplicaApplier, Updater):
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
        self.shapes = ShapeCache(self.cfg.spec, self.cfg.limits)
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
        text = self.schema.condition(req.topic, labels, req.text)
        try:
            req.condition = parse_rules(
                text + " : fwd(0);", self.cfg.spec, "<topic>", limits=self.cfg.limits, shapes=self.shapes
            )[0].condition
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
