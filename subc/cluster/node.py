"""One broker's membership of a cluster: its etcd lease and keys, its fence, and the watch that
feeds its updater (README, "Brokers on several hosts").

Two threads:

* the *member* thread grants the broker's lease (``--cluster-ttl``), writes ``member/<node>``
  under it (refused while another broker holds the name), renews it every third of its time to
  live, and after each renewal moves the data plane's fence (``subc_fence``: the time until which
  the kernel may send copies) to the renewal's send time plus the time to live it was given, less
  :data:`FENCE_MARGIN_S`.  etcd ends the lease no earlier than that (its clock starts when the
  leader receives the renewal), so a broker that dies, stops, or is cut off from the quorum
  stops sending before another broker can see its lease end and take its subscribers.  When a
  renewal finds the lease gone the thread queues ``fenced``, waits until the updater has put every
  endpoint on standby, and joins again with a new lease (``joined``).  About once a second it
  rewrites ``status/<node>`` (what the broker applied and owns), which also tells the updater that
  nothing was missed up to that revision.
* the *follow* thread reads the whole prefix at one revision, queues it (``snapshot``), and watches
  from the next revision, queueing each batch of revisions (``events``); a compacted start
  revision, a watch that ends (its member lost the leader) or an error starts it over with a new
  snapshot, as does a timer every ``--cluster-reconcile`` seconds.

The updater thread (:mod:`.updater`) owns the :class:`~.replica.Replica` and applies what these
threads queue, in order.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Callable

from ..serve.config import ClusterOptions
from ..serve.events import event
from ..serve.network import Pending
from .etcd import Compacted, Compare, Etcd, EtcdError, put
from .records import MemberRecord, NodeStatus, ack_key, member_key, status_key

FENCE_MARGIN_S = 0.25  # the fence ends this long before the lease can
STATUS_S = 1.0  # how often status/<node> is rewritten
WATCH_WAIT_S = 0.2


class ClusterNode:
    """This broker in the cluster of ``opts`` (see the module docstring).  ``member``: what
    ``member/<node>`` says of it; ``requests``: the updater's queue; ``set_fence(ns)``: writes
    the data plane's fence (CLOCK_MONOTONIC ns; 1: fenced now); ``status()``: the broker's
    :class:`NodeStatus` now; ``report(doc)``: hears this broker's figures after each status
    write (``subc stats``)."""

    def __init__(
        self,
        opts: ClusterOptions,
        member: MemberRecord,
        requests: queue.Queue,
        stopping: threading.Event,
        set_fence: Callable[[int], None],
        status: Callable[[], NodeStatus],
        etcd: Etcd | None = None,
        report: Callable[[dict], None] | None = None,
    ):
        self.opts, self.member, self.queue, self.stopping = opts, member, requests, stopping
        self.set_fence, self.status, self.report = set_fence, status, report
        self.etcd = etcd or Etcd(opts.endpoints)
        self.prefix, self.name = opts.prefix, opts.node
        self.lease = 0
        self.member_rev = 0  # the create revision of member/<node> under the lease (0: not a member)
        self.until = 0.0  # monotonic s: this broker may deliver until then
        self.standby_done = threading.Event()  # the updater put every endpoint on standby
        self.standby_done.set()
        self.threads: list[threading.Thread] = []
        self.status_sent: tuple[int, float] | None = None  # (revision, monotonic s) of the last status write
        # counters (Prometheus, status)
        self.renewals = 0
        self.renewal_failures = 0
        self.leases_lost = 0
        self.watch_restarts = 0
        self.compactions = 0
        self.snapshots = 0
        self.name_clashes = 0

    # -- state -----------------------------------------------------------------------------------

    def fenced(self) -> bool:
        """Whether this broker may not deliver nor acknowledge now (its lease may be gone)."""
        return time.monotonic() > self.until

    def start(self) -> None:
        """Fence the data plane, then start the member and follow threads."""
        self.set_fence(1)
        for name, fn in (("member", self._member_loop), ("follow", self._follow_loop)):
            t = threading.Thread(target=fn, name=f"subc-cluster-{name}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        """Fence the data plane and end the lease (the other brokers take over at once)."""
        self.until = 0.0
        self.set_fence(1)
        for t in self.threads:
            t.join(timeout=3)
        if self.lease:
            try:
                self.etcd.revoke(self.lease)
            except EtcdError:
                pass
            self.lease = 0
        self.etcd.close()

    # -- writes the updater asks for ------------------------------------------------------------

    def ack(self, member_set: str) -> bool:
        """Write ``ack/<node>`` = ``member_set`` under the lease (this broker released what it
        no longer owns under that set); False when it could not (no lease, etcd unreachable)."""
        lease = self.lease
        if not lease:
            return False
        try:
            self.etcd.txn([], [put(ack_key(self.prefix, self.name), json.dumps({"set": member_set}).encode(), lease)])
            return True
        except EtcdError as e:
            event(logging.WARNING, "cluster_ack_failed", error=e.message)
            return False

    # -- the member thread ----------------------------------------------------------------------

    def _join(self) -> bool:
        """Grant a lease and write ``member/<node>`` under it (only if no live broker holds the
        name); True when joined."""
        lease = self.etcd.grant(self.opts.ttl)
        key = member_key(self.prefix, self.name)
        t0 = time.monotonic()
        r = self.etcd.txn(
            [Compare(key, "version", "=", 0)],
            [
                put(key, self.member.encode(), lease),
                put(status_key(self.prefix, self.name), self.status().encode(), lease),
            ],
        )
        if not r.succeeded:
            self.name_clashes += 1
            event(logging.ERROR, "cluster_name_taken", node=self.name, note="another live broker holds this node name")
            self.etcd.revoke(lease)
            return False
        self.lease = lease
        self.member_rev = r.revision
        self._extend(t0, self.opts.ttl)
        self.queue.put(Pending("cluster", payload=("joined", r.revision)))
        event(logging.INFO, "cluster_joined", node=self.name, lease=f"{lease:x}", revision=r.revision)
        return True

    def _extend(self, t0: float, ttl: int) -> None:
        until = t0 + ttl - FENCE_MARGIN_S
        if until > self.until:
            self.until = until
            self.set_fence(int(until * 1e9))

    def _member_loop(self) -> None:
        period = max(0.2, self.opts.ttl / 3)
        next_status = 0.0
        while not self.stopping.is_set():
            try:
                if not self.lease:
                    if not self.standby_done.wait(0.5):
                        continue
                    if not self._join():
                        self.stopping.wait(period)
                        continue
                t0 = time.monotonic()
                ttl = self.etcd.keepalive(self.lease)
                if ttl <= 0:
                    self._lost("etcd ended the lease")
                    continue
                self.renewals += 1
                self._extend(t0, ttl)
                if time.monotonic() >= next_status:
                    next_status = time.monotonic() + STATUS_S
                    st = self.status()
                    r = self.etcd.txn([], [put(status_key(self.prefix, self.name), st.encode(), self.lease)])
                    self.status_sent = (r.revision, time.monotonic())
                    if self.report is not None:
                        self.report(
                            {
                                "node": self.name,
                                "etcd_revision": r.revision,
                                "applied": st.applied,
                                "lag": r.revision - st.applied,
                                "fenced": st.fenced,
                                "delivers_to": st.owns,
                                "endpoints": st.endpoints,
                                "subscriptions": st.subscriptions,
                                "renewals": self.renewals,
                                "leases_lost": self.leases_lost,
                                "watch_restarts": self.watch_restarts,
                                "time": st.time,
                            }
                        )
            except EtcdError as e:
                self.renewal_failures += 1
                event(logging.WARNING, "cluster_renewal_failed", error=e.message)
                if self.lease and self.fenced():
                    self._lost(e.message)
            self.stopping.wait(min(period, max(0.05, self.until - time.monotonic()) if self.lease else period))

    def _lost(self, why: str) -> None:
        """The lease is gone (or may be): fenced; the updater puts every endpoint on standby
        before this broker joins again."""
        self.leases_lost += 1
        self.lease = 0
        self.member_rev = 0
        self.until = 0.0
        self.set_fence(1)
        self.standby_done.clear()
        self.queue.put(Pending("cluster", payload=("fenced", why)))
        event(logging.WARNING, "cluster_fenced", node=self.name, reason=why)

    # -- the follow thread ----------------------------------------------------------------------

    def _follow_loop(self) -> None:
        watch = None
        reconcile_at = 0.0
        while not self.stopping.is_set():
            try:
                if watch is None or time.monotonic() >= reconcile_at:
                    rev, kvs = self.etcd.snapshot(self.prefix)
                    self.snapshots += 1
                    self.queue.put(Pending("cluster", payload=("snapshot", rev, kvs)))
                    if watch is not None:
                        watch.cancel()
                    watch = self.etcd.watch(self.prefix, rev + 1)
                    reconcile_at = time.monotonic() + self.opts.reconcile
                item = watch.get(WATCH_WAIT_S)
                if item is None:
                    continue
                items = [item]
                while True:
                    more = watch.get(0)
                    if more is None:
                        break
                    items.append(more)
                self.queue.put(Pending("cluster", payload=("events", items)))
            except Compacted as e:
                self.compactions += 1
                event(logging.WARNING, "cluster_watch_compacted", revision=e.revision)
                watch = self._restart(watch)
            except EtcdError as e:
                self.watch_restarts += 1
                event(logging.WARNING, "cluster_watch_failed", error=e.message)
                watch = self._restart(watch)
                self.stopping.wait(WATCH_WAIT_S)
        if watch is not None:
            watch.cancel()

    @staticmethod
    def _restart(watch):
        if watch is not None:
            watch.cancel()
        return None
