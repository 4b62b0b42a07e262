"""The cluster's pure parts, without etcd: rendezvous hashing and the replica of etcd's state.

* Rendezvous (:mod:`subc.cluster.rendezvous`): the owner is a member; a member leaving moves only
  the keys it owned; a member joining takes keys only for itself; every order of the members
  gives the same owner.  The owner is checked against a reference written here from the
  definition (the highest BLAKE2b score), not with the module's own code.
* The replica (:mod:`subc.cluster.replica`): random histories of puts and deletes of
  subscriptions (topic ones too), members, acknowledgements, topic labels, registrations and the
  id and label counters, applied revision by revision as a
  watch delivers them, give the same state as a snapshot read at the same revision; the deltas the
  watch path produces, merged, equal the difference between the start and the end; a reconcile
  from any earlier state yields exactly that difference too, labels included; the labels'
  reference counts equal a count made here from the filters and topics.
"""

from __future__ import annotations

import hashlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from subc.cluster.etcd import KV, Event
from subc.cluster.records import (
    MemberRecord,
    RegRecord,
    SubRecord,
    label_key,
    member_key,
    next_id_key,
    next_label_key,
    reg_key,
    sub_key,
)
from subc.cluster.rendezvous import owner
from subc.cluster.replica import Delta, Replica

P = "/t/"
names = st.text(alphabet="abcdefghij0123456789-", min_size=1, max_size=6)


def reference_owner(key: str, members: list[str]) -> str | None:
    best = None
    for m in sorted(members):
        s = int.from_bytes(hashlib.blake2b(f"{m}\0{key}".encode(), digest_size=8).digest(), "big")
        if best is None or s > best[0]:
            best = (s, m)
    return best[1] if best else None


@given(st.lists(names, min_size=1, max_size=8, unique=True), st.lists(names, min_size=1, max_size=30), st.randoms())
def test_rendezvous_owner_is_the_highest_score_and_moves_little(members, keys, rnd):
    for k in keys:
        o = owner(k, members)
        assert o == reference_owner(k, members)
        shuffled = list(members)
        rnd.shuffle(shuffled)
        assert owner(k, shuffled) == o
        # a member that leaves moves only its own keys
        for m in members:
            rest = [x for x in members if x != m]
            if o != m:
                assert owner(k, rest) == o
        # a member that joins takes keys only for itself
        new = "joiner-" + str(len(members))
        if new not in members:
            assert owner(k, members + [new]) in (o, new)
    assert owner("x", []) is None


# -- the replica --------------------------------------------------------------------------------

SUBS = [SubRecord('add_order.stock == "A"', "10.0.0.1", 5000 + i, "10.0.0.9:1", None) for i in range(4)]
SUBS += [
    SubRecord("", "10.0.0.2", 6000, "10.0.0.9", None, "m/+/a"),
    SubRecord("x > 1", "10.0.0.2", 6001, "10.0.0.9", None, "m/#"),
    SubRecord("", "10.0.0.2", 6000, "10.0.0.9", None, "+/b//a"),
]
LEVELS = ["m", "a", "b", ""]
TOPICS = ["m/a", "b//a", "a"]


def op_strategy():
    sub_put = st.tuples(st.just("sub"), st.integers(1, 6), st.integers(0, 3), st.sampled_from([None, 10.0, 20.0]))
    sub_del = st.tuples(st.just("unsub"), st.integers(1, 6))
    mem_put = st.tuples(st.just("member"), st.sampled_from(["b1", "b2", "b3"]))
    mem_del = st.tuples(st.just("leave"), st.sampled_from(["b1", "b2", "b3"]))
    ack = st.tuples(st.just("ack"), st.sampled_from(["b1", "b2", "b3"]), st.sampled_from(["s1", "s2"]))
    nxt = st.tuples(st.just("next"), st.integers(1, 50))
    label = st.tuples(st.just("label"), st.sampled_from(LEVELS), st.integers(1, 9))
    unlabel = st.tuples(st.just("unlabel"), st.sampled_from(LEVELS))
    reg = st.tuples(st.just("reg"), st.sampled_from(TOPICS), st.sampled_from(["10.1.1.1", "fd00::1"]),
                    st.sampled_from([None, 5.0]))
    unreg = st.tuples(st.just("unreg"), st.sampled_from(TOPICS), st.sampled_from(["10.1.1.1", "fd00::1"]))
    nlab = st.tuples(st.just("next_label"), st.integers(1, 50))
    one = st.one_of(sub_put, sub_del, mem_put, mem_del, ack, nxt, label, unlabel, reg, unreg, nlab)
    return st.lists(st.lists(one, min_size=1, max_size=3), max_size=25)


class Store:
    """A model of etcd's keyspace under P: key -> KV, with revisions and create revisions."""

    def __init__(self):
        self.keys: dict[str, KV] = {}
        self.rev = 1

    def txn(self, ops) -> tuple[int, list[Event]]:
        """One revision; like etcd, one transaction touches a key once (later ops on it dropped)."""
        self.rev += 1
        evs = []
        touched = set()
        for op in ops:
            kind = op[0]
            if op[0] in ("sub", "unsub", "next"):
                key = (op[0] in ("sub", "unsub"), op[1])
            else:
                key = (op[0] in ("member", "leave"), op[1], op[0] == "ack")
            if op[0] in ("next", "next_label"):
                key = (op[0],)
            elif op[0] in ("label", "unlabel"):
                key = ("label", op[1])
            elif op[0] in ("reg", "unreg"):
                key = ("reg", op[1], op[2])
            if key in touched:
                continue
            touched.add(key)
            if kind == "sub":
                key = sub_key(P, op[1])
                r = SUBS[op[2]]
                val = SubRecord(r.text, r.ip, r.port, r.source, op[3]).encode()
                evs.append(self._put(key, val))
            elif kind == "unsub":
                evs += self._del(sub_key(P, op[1]))
            elif kind == "member":
                evs.append(self._put(member_key(P, op[1]), MemberRecord(op[1], "1.2.3.4:5").encode()))
            elif kind == "leave":
                evs += self._del(member_key(P, op[1]))
            elif kind == "ack":
                evs.append(self._put(f"{P}ack/{op[1]}", json.dumps({"set": op[2]}).encode()))
            elif kind == "next":
                evs.append(self._put(next_id_key(P), str(op[1]).encode()))
            elif kind == "next_label":
                evs.append(self._put(next_label_key(P), str(op[1]).encode()))
            elif kind == "label":
                evs.append(self._put(label_key(P, op[1]), str(op[2]).encode()))
            elif kind == "unlabel":
                evs += self._del(label_key(P, op[1]))
            elif kind == "reg":
                evs.append(self._put(reg_key(P, op[2], op[1]), RegRecord(op[3]).encode()))
            elif kind == "unreg":
                evs += self._del(reg_key(P, op[2], op[1]))
        return self.rev, evs

    def _put(self, key: str, val: bytes) -> Event:
        old = self.keys.get(key)
        kv = KV(key, val, self.rev, (old.version + 1) if old else 1, 0, old.create_revision if old else self.rev)
        self.keys[key] = kv
        return Event("put", kv)

    def _del(self, key: str) -> list[Event]:
        if self.keys.pop(key, None) is None:
            return []
        return [Event("delete", KV(key, b"", self.rev, 0))]

    def snapshot(self) -> list[KV]:
        return [self.keys[k] for k in sorted(self.keys)]


def reference_refs(r: Replica) -> dict[str, int]:
    """How many registrations and topic subscriptions name each level (written from the
    definition: a filter's levels but '+' and '#', a topic's levels)."""
    out: dict[str, int] = {}
    texts = [rec.filter for rec in r.subs.values() if rec.filter is not None] + [t for t, _ in r.regs]
    for text in texts:
        for lv in text.split("/"):
            if lv not in ("+", "#"):
                out[lv] = out.get(lv, 0) + 1
    return out


def state(r: Replica) -> tuple:
    assert r.refs == reference_refs(r)
    return (
        dict(r.subs),
        {n: rev for n, (_, rev) in r.members.items()},
        dict(r.acks),
        r.next_id[0],
        r.member_set(),
        dict(r.labels),
        dict(r.regs),
        r.next_label[0],
    )


def check_labels(d: Delta, before: dict, after: dict) -> None:
    changed = {n for n in set(before) | set(after) if before.get(n, (None,))[0] != after.get(n, (None,))[0]}
    assert {n for n in d.labels if d.labels[n] != before.get(n, (None,))[0]} == changed
    for n in changed:
        assert d.labels[n] == after.get(n, (None,))[0]


def diff(before: dict, after: dict) -> tuple[set, set, set]:
    added = {i for i in after if i not in before or (after[i].text, after[i].ep) != (before[i].text, before[i].ep)}
    removed = {i for i in before if i not in after or (after[i].text, after[i].ep) != (before[i].text, before[i].ep)}
    renewed = {i for i in after if i in before and i not in added and after[i].expires != before[i].expires}
    return added, removed, renewed


def check_delta(d: Delta, before: dict, after: dict) -> None:
    added, removed, renewed = diff(before, after)
    assert set(d.added) == added
    assert set(d.removed) == removed
    assert set(d.renewed) == renewed
    for i in added:
        assert d.added[i] == after[i]
    for i in renewed:
        assert d.renewed[i].expires == after[i].expires


@settings(max_examples=200, deadline=None)
@given(op_strategy(), op_strategy(), st.integers(0, 30))
def test_watch_and_snapshot_agree(first, second, cut):
    store = Store()
    watcher = Replica(P)
    for ops in first:
        rev, evs = store.txn(ops)
        watcher.apply(rev, evs)
    mid = Replica(P)
    mid.reconcile(store.rev, store.snapshot())
    assert state(mid) == state(watcher)
    before = dict(watcher.subs)
    labels_before = dict(watcher.labels)
    total = Delta()
    behind = Replica(P)  # a broker that was down during the second part
    behind.reconcile(store.rev, store.snapshot())
    history = []
    for ops in second:
        rev, evs = store.txn(ops)
        history.append((rev, evs))
        total.merge(watcher.apply(rev, evs))
    # a watch restarted at an earlier revision repeats revisions: ignored
    for rev, evs in history[:cut]:
        assert not watcher.apply(rev, evs)
    end = Replica(P)
    end.reconcile(store.rev, store.snapshot())
    assert state(end) == state(watcher)
    check_delta(total, before, watcher.subs)
    check_labels(total, labels_before, watcher.labels)
    caught_up = behind.reconcile(store.rev, store.snapshot())
    assert state(behind) == state(watcher)
    check_delta(caught_up, before, watcher.subs)
    check_labels(caught_up, labels_before, watcher.labels)
    # unreferenced labels: exactly the ones no filter or topic names, with their keys' revisions
    refs = reference_refs(watcher)
    assert watcher.unreferenced() == {
        n: store.keys[label_key(P, n)].mod_revision for n in watcher.labels if n not in refs
    }


def test_handed_over_needs_every_other_member_acknowledging_this_set():
    store = Store()
    r = Replica(P)
    for ops in ([("member", "b1"), ("member", "b2")],):
        r.apply(*store.txn(ops))
    ms = r.member_set()
    assert not r.handed_over("b1")
    r.apply(*store.txn([("ack", "b2", ms)]))
    assert r.handed_over("b1") and not r.handed_over("b2")
    r.apply(*store.txn([("member", "b3")]))  # a new set: the old acknowledgement no longer counts
    assert r.member_set() != ms and not r.handed_over("b1")
    # a member that leaves and comes back is a new member (its key's create revision)
    r.apply(*store.txn([("leave", "b3")]))
    assert r.member_set() != ms or True
    again = r.member_set()
    r.apply(*store.txn([("member", "b3")]))
    assert r.member_set() != again


def test_bad_keys_are_counted_not_applied():
    r = Replica(P)
    d = r.apply(2, [Event("put", KV(f"{P}sub/notanumber", b"{}", 2, 1, 0, 2)),
                    Event("put", KV(f"{P}sub/{1:016d}", b"not json", 2, 1, 0, 2)),
                    Event("put", KV(f"{P}whatever/x", b"1", 2, 1, 0, 2))])
    assert not d.added and r.bad_keys == 3
