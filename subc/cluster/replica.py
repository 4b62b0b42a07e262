"""One broker's copy of the cluster's state in etcd (:mod:`.records`), changed in revision order.

A :class:`Replica` takes the watch's batches (:meth:`Replica.apply`: one revision's events) or a
whole snapshot (:meth:`Replica.reconcile`: the prefix read at one revision, compared with what the
replica holds, for a broker that starts, restarts or lost its watch) and returns the
:class:`Delta` the broker applies to its data plane.  Both give the same state for the same
revision: the snapshot's difference is exactly the events the replica missed (checked by
tests/test_cluster_replica.py with random histories).

The member set's identity (:meth:`Replica.member_set`) is a hash of the live members' names and
the revisions their keys were created at, so every broker names the same set alike whatever
history it applied (a broker that read a snapshot saw no deletions).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Iterable

from ..dataplane.ebpf.schedule import Position
from .etcd import KV, Event
from .records import MemberRecord, NodeStatus, RegRecord, SubRecord


def topic_names(text: str) -> list[str]:
    """The level names a topic name or filter ``text`` references (every level but ``+`` and
    ``#``; see :func:`subc.serve.topics.literal_levels`)."""
    return [lv for lv in text.split("/") if lv not in ("+", "#")]


def _same(a: SubRecord, b: SubRecord) -> bool:
    """Whether two records are one subscription (only the lease end may differ)."""
    return (a.text, a.ep, a.filter, a.source) == (b.text, b.ep, b.filter, b.source)


@dataclass
class Delta:
    """What a span of revisions changed: for every subscription id it touched, its record at the
    span's ``start`` and at its ``end`` (None: absent); and whether the member set or the
    acknowledgements changed (``members``), and the feed ``position`` its last change takes
    effect at (``meta/position``, written with each change).  :attr:`added`, :attr:`removed` and
    :attr:`renewed` derive from the records, so that merged spans are exact whatever happened in
    between."""

    start: dict[int, SubRecord | None] = field(default_factory=dict)
    end: dict[int, SubRecord | None] = field(default_factory=dict)
    members: bool = False
    position: Position | None = None  # the feed position the span's last change takes effect at
    labels: dict[str, int | None] = field(default_factory=dict)  # topic labels touched: name -> label (None: forgotten)

    def touch(self, sid: int, before: SubRecord | None, after: SubRecord | None) -> None:
        """Subscription ``sid`` went from ``before`` to ``after``."""
        self.start.setdefault(sid, before)
        self.end[sid] = after

    @property
    def added(self) -> dict[int, SubRecord]:
        """Subscriptions present at the end and absent at the start (or another subscription
        under the same id): id -> record."""
        out = {}
        for i, e in self.end.items():
            b = self.start.get(i)
            if e is not None and (b is None or not _same(b, e)):
                out[i] = e
        return out

    @property
    def removed(self) -> dict[int, SubRecord]:
        """Subscriptions present at the start and gone (or changed) at the end: id -> record."""
        out = {}
        for i, b in self.start.items():
            e = self.end.get(i)
            if b is not None and (e is None or not _same(b, e)):
                out[i] = b
        return out

    @property
    def renewed(self) -> dict[int, SubRecord]:
        """Subscriptions whose lease end alone changed: id -> record at the end."""
        out = {}
        for i, e in self.end.items():
            b = self.start.get(i)
            if e is not None and b is not None and _same(b, e) and b.expires != e.expires:
                out[i] = e
        return out

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.renewed or self.members)

    def merge(self, later: "Delta") -> None:
        """Fold ``later`` (a span that follows this one) into this delta."""
        for i, e in later.end.items():
            self.touch(i, later.start[i], e)
        self.members = self.members or later.members
        self.labels.update(later.labels)
        if later.position is not None:
            self.position = later.position

    def changes_subscriptions(self) -> bool:
        """Whether the span adds or removes a subscription (not only lease ends)."""
        return any(e is None or b is None or not _same(b, e) for i, e in self.end.items() for b in [self.start[i]])


class Replica:
    """The state under ``prefix`` as of :attr:`revision` (see the module docstring): ``subs``
    (id -> record), ``members`` (node -> (record, create revision)), ``acks`` (node -> member-set
    id), ``status`` (node -> :class:`NodeStatus`), ``next_id`` ((value, mod revision)); topics:
    ``labels`` (name -> (label, create revision)), ``next_label`` ((value, mod revision)),
    ``regs`` ((topic, source) -> :class:`RegRecord`) and ``refs`` (name -> how many
    registrations and topic subscriptions reference it)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.revision = 0
        self.subs: dict[int, SubRecord] = {}
        self.members: dict[str, tuple[MemberRecord, int]] = {}
        self.acks: dict[str, str] = {}
        self.status: dict[str, NodeStatus] = {}
        self.next_id: tuple[int, int] = (1, 0)
        self.position: tuple[Position | None, int] = (None, 0)  # meta/position: (value, mod revision)
        self.labels: dict[str, tuple[int, int]] = {}
        self.next_label: tuple[int, int] = (1, 0)
        self.regs: dict[tuple[str, str], RegRecord] = {}
        self.refs: dict[str, int] = {}
        self.bad_keys = 0  # keys under the prefix that no record decodes (counted, ignored)
        self.mods: dict[str, int] = {}  # key -> the revision of the put this replica applied

    # -- reading keys -------------------------------------------------------------------------

    def _split(self, key: str) -> tuple[str, str] | None:
        if not key.startswith(self.prefix):
            return None
        kind, _, name = key[len(self.prefix) :].partition("/")
        return kind, name

    def _put(self, kv: KV, d: Delta) -> None:
        parts = self._split(kv.key)
        if parts is None:
            return
        kind, name = parts
        self.mods[kv.key] = kv.mod_revision
        try:
            if kind == "sub":
                sid = int(name)
                rec = SubRecord.decode(kv.value)
                d.touch(sid, self.subs.get(sid), rec)
                self._set_sub(sid, rec)
            elif kind == "member":
                mem = MemberRecord.decode(kv.value)
                before = self.members.get(name)
                self.members[name] = (mem, kv.create_revision)
                if before is None or before[1] != kv.create_revision:
                    d.members = True
            elif kind == "ack":
                self.acks[name] = json.loads(kv.value)["set"]
                d.members = True
            elif kind == "status":
                self.status[name] = NodeStatus.decode(kv.value)
            elif kind == "label":
                lab = int(kv.value)
                if self.labels.get(name, (None,))[0] != lab:
                    d.labels[name] = lab
                self.labels[name] = (lab, kv.create_revision)
            elif kind == "reg":
                source, _, topic = name.partition("/")
                self._set_reg((topic, source), RegRecord.decode(kv.value))
            elif kind == "meta" and name == "next_id":
                self.next_id = (int(kv.value), kv.mod_revision)
            elif kind == "meta" and name == "next_label":
                self.next_label = (int(kv.value), kv.mod_revision)
            elif kind == "meta" and name == "position":
                pos = Position.from_json(json.loads(kv.value))
                self.position = (pos, kv.mod_revision)
                d.position = pos
            else:
                self.bad_keys += 1
        except (ValueError, KeyError, TypeError, AttributeError):
            self.bad_keys += 1

    def _delete(self, key: str, d: Delta) -> None:
        parts = self._split(key)
        if parts is None:
            return
        self.mods.pop(key, None)
        kind, name = parts
        if kind == "sub":
            try:
                sid = int(name)
            except ValueError:
                return
            old = self.subs.get(sid)
            if old is not None:
                d.touch(sid, old, None)
                self._set_sub(sid, None)
        elif kind == "member":
            if self.members.pop(name, None) is not None:
                d.members = True
        elif kind == "ack":
            if self.acks.pop(name, None) is not None:
                d.members = True
        elif kind == "status":
            self.status.pop(name, None)
        elif kind == "label":
            if self.labels.pop(name, None) is not None:
                d.labels[name] = None
        elif kind == "reg":
            source, _, topic = name.partition("/")
            self._set_reg((topic, source), None)
        elif kind == "meta" and name == "next_id":
            self.next_id = (1, 0)
        elif kind == "meta" and name == "next_label":
            self.next_label = (1, 0)
        elif kind == "meta" and name == "position":
            self.position = (None, 0)

    def _ref(self, names: Iterable[str], k: int) -> None:
        for n in names:
            c = self.refs.get(n, 0) + k
            if c > 0:
                self.refs[n] = c
            else:
                self.refs.pop(n, None)

    def _set_sub(self, sid: int, rec: SubRecord | None) -> None:
        old = self.subs.pop(sid, None)
        if old is not None and old.filter is not None:
            self._ref(topic_names(old.filter), -1)
        if rec is not None:
            self.subs[sid] = rec
            if rec.filter is not None:
                self._ref(topic_names(rec.filter), +1)

    def _set_reg(self, key: tuple[str, str], rec: RegRecord | None) -> None:
        old = self.regs.pop(key, None)
        if old is not None:
            self._ref(topic_names(key[0]), -1)
        if rec is not None:
            self.regs[key] = rec
            self._ref(topic_names(key[0]), +1)

    def unreferenced(self) -> dict[str, int]:
        """The labels no registration and no topic subscription references: name -> the mod
        revision of its key (what a forget compares)."""
        return {n: self.mods.get(k, 0) for n in self.labels if n not in self.refs for k in [f"{self.prefix}label/{n}"]}

    # -- changes ---------------------------------------------------------------------------------

    def apply(self, revision: int, events: Iterable[Event]) -> Delta:
        """Apply one revision's watch ``events``; the delta.  A revision at or below
        :attr:`revision` is ignored (empty delta): a watch restarted from a snapshot may repeat
        it."""
        d = Delta()
        if revision <= self.revision:
            return d
        for ev in events:
            if ev.kind == "put":
                self._put(ev.kv, d)
            else:
                self._delete(ev.kv.key, d)
        self.revision = revision
        return d

    def reconcile(self, revision: int, kvs: Iterable[KV]) -> Delta:
        """Make the replica the snapshot ``kvs`` read at ``revision``; the delta from what it
        held (what its missed events would have changed).  Keys whose put it applied already
        (same revision) are not decoded again."""
        kvs = list(kvs)
        d = Delta()
        seen_subs: set[int] = set()
        seen: dict[str, set[str]] = {"member": set(), "ack": set(), "status": set(), "label": set(), "reg": set()}
        next_id_seen = position_seen = next_label_seen = False
        for kv in kvs:
            parts = self._split(kv.key)
            if parts is None:
                continue
            kind, name = parts
            if kind == "sub":
                try:
                    seen_subs.add(int(name))
                except ValueError:
                    pass
            elif kind in seen:
                seen[kind].add(name)
            elif kind == "meta" and name == "next_id":
                next_id_seen = True
            elif kind == "meta" and name == "position":
                position_seen = True
            elif kind == "meta" and name == "next_label":
                next_label_seen = True
            if self.mods.get(kv.key) == kv.mod_revision:
                continue  # applied already: nothing to decode (a periodic reconcile of 100,000 keys)
            self._put(kv, d)
        for sid in [s for s in self.subs if s not in seen_subs]:
            d.touch(sid, self.subs[sid], None)
            self._set_sub(sid, None)
        seen_keys = {kv.key for kv in kvs}
        self.mods = {k: r for k, r in self.mods.items() if k in seen_keys}
        for name in [m for m in self.members if m not in seen["member"]]:
            del self.members[name]
            d.members = True
        for name in [m for m in self.acks if m not in seen["ack"]]:
            del self.acks[name]
            d.members = True
        for name in [m for m in self.status if m not in seen["status"]]:
            del self.status[name]
        for name in [n for n in self.labels if n not in seen["label"]]:
            del self.labels[name]
            d.labels[name] = None
        for key in [k for k in self.regs if f"{k[1]}/{k[0]}" not in seen["reg"]]:
            self._set_reg(key, None)
        if not next_label_seen:
            self.next_label = (1, 0)
        if not next_id_seen:
            self.next_id = (1, 0)
        if not position_seen:
            self.position = (None, 0)
        self.revision = max(self.revision, revision)
        return d

    def load(self, revision: int, subs: dict[int, SubRecord]) -> None:
        """Start from a broker's own store: ``subs`` as applied at ``revision`` (the members,
        acknowledgements and statuses come with the first reconcile)."""
        self.revision = revision
        for sid, rec in subs.items():
            self._set_sub(sid, rec)

    # -- the member set ------------------------------------------------------------------------

    def member_set(self) -> str:
        """The live member set's identity: 16 hex digits of BLAKE2b over the sorted (name,
        create revision) pairs."""
        text = ";".join(f"{n}@{rev}" for n, (_, rev) in sorted(self.members.items()))
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    def handed_over(self, node: str) -> bool:
        """Whether every live member but ``node`` acknowledged the current member set (has
        released what it no longer owns under it)."""
        ms = self.member_set()
        return all(self.acks.get(m) == ms for m in self.members if m != node)
