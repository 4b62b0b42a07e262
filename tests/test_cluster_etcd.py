"""The cluster's etcd side against real etcd members on loopback (1 and 3), without a data plane:

* the client (:mod:`subc.cluster.etcd`): a snapshot read in pages is one revision's state even while
  writes go on; a transaction's comparisons decide; a watch delivers revisions in order and raises
  Compacted when its start was compacted; leases end;
* a three-member etcd loses its leader: requests still go through (another member answers);
* the member thread (:mod:`subc.cluster.node`): it joins under a lease, moves the fence forward
  only after renewals, refuses a name another live broker holds, and when etcd goes away it
  fences the data plane before the lease can end elsewhere, queues ``fenced``, and joins again
  with a new lease once etcd is back;
* topic labels (:mod:`subc.cluster.commits`): references and forgets race on revisions, a label
  is never given twice.

Nothing waits on a clock for a verdict: the test waits for events (queued items, keys, fence
writes), with a hang guard only.
"""

from __future__ import annotations

import queue
import threading
import time

import pytest

from etcd_util import EtcdCluster
from subc.cluster import etcd as etcd_mod
from subc.cluster.etcd import Compacted, Compare, EtcdError, delete, get, put
from subc.cluster.node import ClusterNode
from subc.cluster.commits import Committer
from subc.cluster.records import MemberRecord, NodeStatus, SubRecord, label_key, member_key, reg_key
from subc.cluster.replica import Replica
from subc.errors import SubcError
from subc.serve.config import ClusterOptions

HANG = 60.0


def wait_for(cond, what: str, timeout: float = HANG):
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def one(tmp_path):
    c = EtcdCluster(tmp_path, 1)
    yield c
    c.close()


def test_snapshot_pages_are_one_revision_and_txn_and_watch(one, monkeypatch):
    e = one.etcd()
    for i in range(25):
        e.txn([], [put(f"/s/k{i:03d}", str(i).encode())])
    rev0 = e.revision()
    monkeypatch.setattr(etcd_mod, "PAGE", 4)
    stop = threading.Event()

    def writer():
        j = 0
        while not stop.is_set():
            e.txn([], [put(f"/s/k{j % 25:03d}", b"changed"), put(f"/s/new{j}", b"x")])
            j += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        rev, kvs = e.snapshot("/s/", rev0)
    finally:
        stop.set()
        t.join()
    assert rev == rev0
    assert [kv.key for kv in kvs] == [f"/s/k{i:03d}" for i in range(25)]
    assert all(kv.value == str(i).encode() for i, kv in enumerate(kvs))
    # comparisons decide; the failure branch reads
    r = e.txn([Compare("/s/k000", "version", "=", 0)], [put("/s/x", b"1")], [get("/s/k000")])
    assert not r.succeeded and r.got[0].key == "/s/k000"
    assert e.txn([Compare("/s/none/", "version", "=", 0, prefix=True)], [put("/s/x", b"1")]).succeeded
    assert not e.txn([Compare("/s/k", "version", "=", 0, prefix=True)], [put("/s/x", b"1")]).succeeded
    # a watch: revisions in order, one batch each
    w = e.watch("/w/", e.revision() + 1)
    revs = [e.txn([], [put(f"/w/{i}", b"v"), put(f"/w/b{i}", b"v")]).revision for i in range(5)]
    revs.append(e.txn([], [delete("/w/0")]).revision)
    got = []
    while len(got) < len(revs):
        item = w.get(HANG)
        assert item is not None
        got.append(item)
    assert [r for r, _ in got] == revs
    assert all(len(evs) == 2 for _, evs in got[:5]) and got[5][1][0].kind == "delete"
    w.cancel()
    with pytest.raises(EtcdError):
        while True:
            w.get(HANG)
    # a compacted start revision
    e.compact(e.revision())
    w2 = e.watch("/w/", revs[0])
    with pytest.raises(Compacted):
        w2.get(HANG)
    with pytest.raises(Compacted):
        e.snapshot("/w/", revs[0])
    e.close()


def test_three_members_lose_their_leader(tmp_path):
    c = EtcdCluster(tmp_path, 3)
    try:
        e = c.etcd()
        assert e.txn([], [put("/l/a", b"1")]).succeeded
        c.kill(c.leader())
        r = e.txn([Compare("/l/a", "value", "=", b"1")], [put("/l/a", b"2")])
        assert r.succeeded
        assert e.get("/l/a").value == b"2"
        e.close()
    finally:
        c.close()


class Plane:
    """What the member thread writes: the fence values, in order."""

    def __init__(self):
        self.fences: list[int] = []

    def set_fence(self, ns: int) -> None:
        self.fences.append(ns)


def node_for(c: EtcdCluster, name: str, q: queue.Queue, stopping: threading.Event, plane: Plane, ttl: int = 2):
    opts = ClusterOptions(c.endpoints, name, "/n/", ttl, 30.0)
    return ClusterNode(opts, MemberRecord(name, "10.0.0.1:7000"), q, stopping, plane.set_fence,
                       lambda: NodeStatus(0, 0, 0, 0, False, time.time()))


def kinds(q: queue.Queue, want: str):
    def got():
        while True:
            try:
                p = q.get_nowait()
            except queue.Empty:
                return None
            if p is not None and p.kind == "cluster" and p.payload[0] == want:
                return p
    return got


def test_member_joins_fences_and_rejoins(tmp_path):
    c = EtcdCluster(tmp_path, 1)
    q: queue.Queue = queue.Queue()
    stopping = threading.Event()
    plane = Plane()
    node = node_for(c, "b1", q, stopping, plane)
    try:
        node.start()
        assert plane.fences[0] == 1  # fenced before anything
        wait_for(kinds(q, "joined"), "joined")
        e = c.etcd()
        kv = wait_for(lambda: e.get(member_key("/n/", "b1")), "the member key")
        assert kv.lease == node.lease
        wait_for(lambda: len(plane.fences) >= 3, "renewals moving the fence")
        assert plane.fences[1:] == sorted(plane.fences[1:]) and plane.fences[-1] > time.monotonic_ns()
        assert not node.fenced()
        # another broker may not take the name while b1 lives
        q2: queue.Queue = queue.Queue()
        plane2 = Plane()
        other = node_for(c, "b1", q2, stopping, plane2)
        assert not other._join()
        assert other.name_clashes == 1
        e.close()
        # etcd goes away: the fence ends before the lease could (no renewal moves it again)
        c.kill(0)
        wait_for(kinds(q, "fenced"), "fenced", timeout=HANG)
        assert plane.fences[-1] == 1 and node.fenced() and node.lease == 0
        # the updater's part: every endpoint on standby; then the member thread joins again
        node.standby_done.set()
        c.start(0)
        wait_for(kinds(q, "joined"), "joined again")
        assert not node.fenced()
    finally:
        stopping.set()
        node.stop()
        c.close()


def test_cluster_status_reads_members_owners_and_lag(one):
    """``subc cluster status`` on a prefix written here: two live brokers, one acknowledged, one
    subscription endpoint owned by the broker rendezvous hashing picks (checked against a reference
    written from the definition in test_cluster_replica)."""
    import json as _json

    from click.testing import CliRunner

    from subc.cli import main
    from subc.cluster.records import SubRecord, ack_key, status_key, sub_key
    from test_cluster_replica import reference_owner

    e = one.etcd()
    lease = e.grant(30)
    for n in ("b1", "b2"):
        e.txn([], [put(member_key("/cs/", n), MemberRecord(n, f"10.0.0.{n[1]}:7000").encode(), lease)])
    e.txn([], [put(sub_key("/cs/", 1), SubRecord('add_order.price > 1', "10.9.0.2", 6001, "10.9.0.2:6001").encode())])
    rev = e.revision()
    e.txn([], [put(status_key("/cs/", "b1"), NodeStatus(rev - 1, 1, 1, 1, False, time.time()).encode(), lease)])
    from subc.cluster.replica import Replica

    r = Replica("/cs/")
    r.reconcile(*e.snapshot("/cs/"))
    e.txn([], [put(ack_key("/cs/", "b1"), _json.dumps({"set": r.member_set()}).encode(), lease)])
    res = CliRunner().invoke(main, ["cluster", "status", "--cluster", one.endpoints[0], "--cluster-prefix", "/cs/",
                                    "--json"])
    assert res.exit_code == 0, res.output
    doc = _json.loads(res.output)
    rows = {b["node"]: b for b in doc["brokers"]}
    assert set(rows) == {"b1", "b2"} and rows["b1"]["acknowledged"] and not rows["b2"]["acknowledged"]
    assert rows["b1"]["lag"] == doc["revision"] - (rev - 1) and rows["b2"]["applied"] is None
    assert doc["owners"] == {"10.9.0.2:6001": reference_owner("10.9.0.2:6001", ["b1", "b2"])}
    text = CliRunner().invoke(main, ["cluster", "status", "--cluster", one.endpoints[0], "--cluster-prefix", "/cs/"])
    assert text.exit_code == 0 and "b1" in text.output and "etcd" in text.output
    bad = CliRunner().invoke(main, ["cluster", "status", "--cluster", one.endpoints[0], "--cluster-prefix", "nope"])
    assert bad.exit_code == 2 and "error" in bad.output
    e.close()


def test_topic_labels_race_and_are_never_reused(one):
    """Two brokers' committers over one etcd, each with a replica it updates only when told: a
    label is referenced by a transaction whose broker has a stale view (it still commits, and a
    forget computed before it fails for that label); a reference to a label forgotten meanwhile
    takes a new one; the label counter never goes back."""
    e = one.etcd()
    prefix = "/tl/"
    for n in ("b1", "b2"):
        e.txn([], [put(member_key(prefix, n), MemberRecord(n, "10.0.0.1:1").encode())])
    mrev = {n: e.get(member_key(prefix, n)).create_revision for n in ("b1", "b2")}

    def broker(n):
        r = Replica(prefix)
        return r, Committer(e, r, None, 0.0, 0, n, lambda: mrev[n])

    def catch_up(r):
        r.reconcile(*e.snapshot(prefix))

    r1, c1 = broker("b1")
    r2, c2 = broker("b2")
    rev, labels = c1.register("10.9.9.9", "m/x", ["m", "x"], None)
    assert labels == {"m": 1, "x": 2}
    catch_up(r1), catch_up(r2)
    assert {n: v for n, (v, _) in r1.labels.items()} == {"m": 1, "x": 2} and r1.refs == {"m": 1, "x": 1}
    # b1 takes the registration away; its replica sees both labels unreferenced
    assert c1.unregister("10.9.9.9", "m/x") is not None
    assert c1.unregister("10.9.9.9", "m/x") is None  # gone already
    catch_up(r1)
    gone = r1.unreferenced()
    assert set(gone) == {"m", "x"}
    # b2, still seeing the registration, subscribes to m/+ (references m) before b1 forgets
    (sid, _), = c2.subscribe([SubRecord("", "10.0.0.5", 9, "10.9.9.8", None, "m/+")], ["m"])
    assert c1.forget(gone) == 1  # x forgotten; m was referenced meanwhile
    assert e.get(label_key(prefix, "x")) is None and e.get(label_key(prefix, "m")).value == b"1"
    # b2's view still has x (label 2): a reference to it now takes a new label, never 2 again
    rev, labels = c2.register("10.9.9.8", "x", ["x"], 5.0)
    assert labels == {"x": 3} and c2.label_races >= 1
    catch_up(r2)
    assert r2.labels["x"][0] == 3 and r2.next_label[0] == 4 and r2.subs[sid].filter == "m/+"
    # exhausted labels: a clear error, nothing written
    c2.label_limit = 4
    with pytest.raises(SubcError, match="no labels left"):
        c2.register("10.9.9.8", "y/z", ["y", "z"], None)
    assert e.get(reg_key(prefix, "10.9.9.8", "y/z")) is None
