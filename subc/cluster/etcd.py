"""The etcd v3 API as ``subc serve --cluster`` uses it: reads at a revision, transactions that
compare revisions, ordered watches, leases.

Requests go over gRPC (``grpcio``) with the etcd API's generated protobuf bindings that the
``etcd3`` package (python-etcd3) ships (``etcd3.etcdrpc``, etcd's ``rpc.proto``).  Why not
etcd3's own client or ``aetcd``: README, "Brokers on several hosts".  This module adds what they
lack and a cluster needs:

* several endpoints on one channel (gRPC's ``ipv4:`` target, ``round_robin``): a request that
  fails on one member is sent again, and lands on the next;
* the ``hasleader`` metadata on watches and lease keep-alives (etcd's ``WithRequireLeader``): a
  member cut off from the quorum ends them at once instead of going quiet, so a broker behind a
  partition learns it;
* a whole prefix read at one revision in pages (``RangeRequest.revision``), so a large state is
  one consistent snapshot within gRPC's message limits;
* watch responses as batches of one revision each, compaction raised as :class:`Compacted`.

Sources: etcd API reference (etcd.io/docs/v3.4/learning/api/), "Transaction", "Watch API",
"Lease API"; etcd's ``api/v3rpc/rpctypes`` for ``hasleader``.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import grpc
from etcd3 import etcdrpc

from ..errors import SubcError

PAGE = 2000  # keys per range request of a snapshot
MAX_MESSAGE = 64 << 20  # bytes: the largest gRPC message accepted
REQUIRE_LEADER = (("hasleader", "true"),)


class EtcdError(SubcError):
    """etcd cannot be reached, has no quorum, or refused a request."""


class Compacted(EtcdError):
    """A watch's start revision was compacted away; ``revision``: the compaction's."""

    def __init__(self, revision: int):
        super().__init__(f"etcd compacted its history up to revision {revision}")
        self.revision = revision


@dataclass(frozen=True)
class KV:
    """A key's value at a revision: ``key`` (str), ``value`` (bytes), its ``mod_revision``,
    ``version`` (puts since its creation), ``lease`` (0: none) and ``create_revision``."""

    key: str
    value: bytes
    mod_revision: int
    version: int
    lease: int = 0
    create_revision: int = 0


@dataclass(frozen=True)
class Event:
    """A watch event: ``kind`` 'put' or 'delete' of ``kv`` (a delete's value is empty)."""

    kind: str
    kv: KV


@dataclass(frozen=True)
class Compare:
    """A transaction's comparison: ``target`` ('version', 'mod', 'create' or 'value') of ``key``
    (with ``prefix``: of every key under it; an empty range compares as a key never written)
    ``op`` ('=', '!=', '<', '>') ``value``."""

    key: str
    target: str
    op: str
    value: int | bytes
    prefix: bool = False


@dataclass(frozen=True)
class Op:
    """A transaction's operation: ``put`` ``key`` = ``value`` (``lease``: 0 or a lease id), or
    ``delete`` ``key`` (``value`` unused), or ``get`` ``key``."""

    kind: str
    key: str
    value: bytes = b""
    lease: int = 0


def put(key: str, value: bytes, lease: int = 0) -> Op:
    """A transaction's put of ``value`` at ``key`` (under ``lease``, 0: none)."""
    return Op("put", key, value, lease)


def delete(key: str) -> Op:
    """A transaction's delete of ``key``."""
    return Op("delete", key)


def get(key: str) -> Op:
    """A transaction's read of ``key`` (in :attr:`TxnResult.got`)."""
    return Op("get", key)


@dataclass(frozen=True)
class TxnResult:
    """A transaction's outcome: ``succeeded`` (every comparison held), the store's ``revision``
    after it, and the key-values of its ``get`` operations (in order; absent keys left out)."""

    succeeded: bool
    revision: int
    got: list[KV]


def prefix_end(prefix: bytes) -> bytes:
    """The end of the key range of every key starting with ``prefix`` (etcd's convention: the
    prefix with its last byte below 0xff incremented)."""
    b = bytearray(prefix)
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[: i + 1])
    return b"\0"


_TARGETS = {"version": 0, "create": 1, "mod": 2, "value": 3}
_OPS = {"=": 0, ">": 1, "<": 2, "!=": 3}


def _kv(m) -> KV:
    return KV(m.key.decode(), bytes(m.value), m.mod_revision, m.version, m.lease, m.create_revision)


def channel_target(endpoints: Sequence[str]) -> str:
    """The gRPC target of etcd client ``endpoints`` (``host:port`` or ``http://host:port``):
    several IPv4 endpoints become one ``ipv4:a:p,b:q`` target (one channel, balanced); a single
    endpoint is used as it is.  Raises EtcdError when several endpoints are not IPv4 addresses."""
    eps = [e.split("://", 1)[-1].rstrip("/") for e in endpoints]
    if not eps or not all(eps):
        raise EtcdError("no etcd endpoint given")
    if len(eps) == 1:
        return eps[0]
    for e in eps:
        host = e.rsplit(":", 1)[0]
        parts = host.split(".")
        if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
            raise EtcdError(f"etcd endpoint {e}: several endpoints must be IPv4 address:port")
    return "ipv4:" + ",".join(eps)


class Etcd:
    """A client of the etcd cluster at ``endpoints`` (see the module docstring); every request
    gives up after ``timeout`` s and is retried on another member while ``retry_for`` s have not
    passed.  Raises EtcdError (after the retries) when no member answers."""

    def __init__(self, endpoints: Sequence[str], timeout: float = 2.0, retry_for: float = 4.0):
        self.endpoints = list(endpoints)
        self.timeout, self.retry_for = timeout, retry_for
        self.channel = grpc.insecure_channel(
            channel_target(self.endpoints),
            options=[
                ("grpc.lb_policy_name", "round_robin"),
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self.kv = etcdrpc.KVStub(self.channel)
        self.watch_stub = etcdrpc.WatchStub(self.channel)
        self.lease_stub = etcdrpc.LeaseStub(self.channel)
        self.maintenance = etcdrpc.MaintenanceStub(self.channel)
        self.cluster = etcdrpc.ClusterStub(self.channel)

    def close(self) -> None:
        """Close the channel (every call after fails)."""
        self.channel.close()

    def _call(self, fn, request, what: str, retry: bool = True):
        end = time.monotonic() + (self.retry_for if retry else 0)
        while True:
            try:
                return fn(request, timeout=self.timeout, metadata=REQUIRE_LEADER)
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else None
                if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                    raise EtcdError(f"etcd refused {what}: {e.details()}") from None
                if code == grpc.StatusCode.OUT_OF_RANGE and "compacted" in (e.details() or ""):
                    raise EtcdError(f"etcd refused {what}: {e.details()}") from None
                if time.monotonic() >= end:
                    raise EtcdError(f"etcd {what}: {e.details() if hasattr(e, 'details') else e}") from None
                time.sleep(0.05)

    # -- keys ------------------------------------------------------------------------------------

    def snapshot(self, prefix: str, revision: int = 0) -> tuple[int, list[KV]]:
        """Every key under ``prefix`` at one revision (``revision``, or the latest): (that
        revision, key-values in key order).  Raises EtcdError, or :class:`Compacted` when
        ``revision`` was compacted."""
        start = prefix.encode()
        end = prefix_end(start)
        out: list[KV] = []
        rev = revision
        while True:
            req = etcdrpc.RangeRequest(key=start, range_end=end, limit=PAGE, revision=rev)
            try:
                resp = self._call(self.kv.Range, req, f"read of {prefix}")
            except EtcdError as e:
                if "compacted" in e.message and rev:
                    raise Compacted(rev) from None
                raise
            if not rev:
                rev = resp.header.revision
            out.extend(_kv(m) for m in resp.kvs)
            if not resp.more or not resp.kvs:
                return rev, out
            start = resp.kvs[-1].key + b"\0"

    def get(self, key: str) -> KV | None:
        """``key``'s value now, or None."""
        resp = self._call(self.kv.Range, etcdrpc.RangeRequest(key=key.encode()), f"read of {key}")
        return _kv(resp.kvs[0]) if resp.kvs else None

    def revision(self) -> int:
        """The store's revision now (a linearizable read)."""
        resp = self._call(self.kv.Range, etcdrpc.RangeRequest(key=b"\0", count_only=True), "read of the revision")
        return resp.header.revision

    def txn(self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        """One transaction: if every comparison holds, ``success``, else ``failure``.  Raises
        EtcdError (the transaction may or may not have been applied when the error is a
        timeout: callers compare on revisions so that applying it twice is harmless)."""
        req = etcdrpc.TxnRequest(
            compare=[self._compare(c) for c in compares],
            success=[self._op(o) for o in success],
            failure=[self._op(o) for o in failure],
        )
        resp = self._call(self.kv.Txn, req, "transaction")
        got = [
            _kv(m) for r in resp.responses if r.WhichOneof("response") == "response_range" for m in r.response_range.kvs
        ]
        return TxnResult(resp.succeeded, resp.header.revision, got)

    @staticmethod
    def _compare(c: Compare):
        m = etcdrpc.Compare(key=c.key.encode(), target=_TARGETS[c.target], result=_OPS[c.op])
        if c.prefix:
            m.range_end = prefix_end(c.key.encode())
        if c.target == "version":
            m.version = int(c.value)
        elif c.target == "create":
            m.create_revision = int(c.value)
        elif c.target == "mod":
            m.mod_revision = int(c.value)
        else:
            m.value = bytes(c.value)
        return m

    @staticmethod
    def _op(o: Op):
        if o.kind == "put":
            return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=o.key.encode(), value=o.value, lease=o.lease))
        if o.kind == "delete":
            return etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=o.key.encode()))
        return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=o.key.encode()))

    def compact(self, revision: int) -> None:
        """Compact the store's history up to ``revision`` (tests and operators)."""
        self._call(self.kv.Compact, etcdrpc.CompactionRequest(revision=revision, physical=True), "compaction")

    # -- leases ------------------------------------------------------------------------------------

    def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` s; its id."""
        resp = self._call(self.lease_stub.LeaseGrant, etcdrpc.LeaseGrantRequest(TTL=ttl), "lease grant")
        if resp.error:
            raise EtcdError(f"etcd refused a lease: {resp.error}")
        return resp.ID

    def keepalive(self, lease: int) -> int:
        """Renew ``lease`` once (one keep-alive over a stream of its own, from a member that has
        a leader); its new time to live in s, 0 when it has expired.  Raises EtcdError when no
        member answers within the timeout (no retry: the caller's deadline decides)."""

        def stream(request, timeout, metadata):
            for resp in self.lease_stub.LeaseKeepAlive(iter([request]), timeout=timeout, metadata=metadata):
                return resp
            raise EtcdError("the lease keep-alive stream ended without an answer")

        resp = self._call(stream, etcdrpc.LeaseKeepAliveRequest(ID=lease), "lease keep-alive", retry=False)
        return int(resp.TTL)

    def revoke(self, lease: int) -> None:
        """End ``lease`` now (its keys are deleted)."""
        self._call(self.lease_stub.LeaseRevoke, etcdrpc.LeaseRevokeRequest(ID=lease), "lease revoke", retry=False)

    # -- watches ------------------------------------------------------------------------------------

    def watch(self, prefix: str, start_revision: int) -> "Watch":
        """Watch every key under ``prefix`` from ``start_revision`` on (see :class:`Watch`)."""
        return Watch(self, prefix, start_revision)

    # -- the cluster -------------------------------------------------------------------------------

    def members(self) -> list[dict]:
        """The etcd members: name, id, client URLs, and from each reachable one its status
        (leader id, raft term, revision, database bytes), or the error that came instead."""
        resp = self._call(self.cluster.MemberList, etcdrpc.MemberListRequest(), "member list")
        out = []
        for m in resp.members:
            row: dict = {"name": m.name, "id": f"{m.ID:x}", "client_urls": list(m.clientURLs)}
            for url in m.clientURLs:
                ch = grpc.insecure_channel(url.split("://", 1)[-1])
                try:
                    st = etcdrpc.MaintenanceStub(ch).Status(etcdrpc.StatusRequest(), timeout=self.timeout)
                    row.update(
                        leader=f"{st.leader:x}",
                        is_leader=st.leader == m.ID,
                        raft_term=st.raftTerm,
                        revision=st.header.revision,
                        db_bytes=st.dbSize,
                    )
                except grpc.RpcError as e:
                    row["error"] = e.details() if hasattr(e, "details") else str(e)
                finally:
                    ch.close()
                break
            out.append(row)
        return out


_END = object()


class Watch:
    """An ordered watch of a prefix from a revision on, read in a thread of its own: iterate it
    for lists of :class:`Event` of one revision each (``(revision, events)``), in revision
    order.  The iteration raises :class:`Compacted` when the start revision is gone and
    EtcdError when the stream ends (a member lost its leader, etcd went away); :meth:`cancel`
    ends it.  (The etcd API of python-etcd3's bindings predates progress requests: a broker
    learns that nothing changed from its own status writes, which it sees come back.)"""

    def __init__(self, etcd: Etcd, prefix: str, start_revision: int):
        self.q: queue.Queue = queue.Queue()
        self.requests: queue.Queue = queue.Queue()
        key = prefix.encode()
        create = etcdrpc.WatchCreateRequest(key=key, range_end=prefix_end(key), start_revision=start_revision)
        self.requests.put(etcdrpc.WatchRequest(create_request=create))
        self.stopped = threading.Event()
        self.call = etcd.watch_stub.Watch(self._requests(), metadata=REQUIRE_LEADER)
        self.thread = threading.Thread(target=self._read, name="subc-etcd-watch", daemon=True)
        self.thread.start()

    def _requests(self):
        while True:
            r = self.requests.get()
            if r is None:
                return
            yield r

    def _read(self) -> None:
        try:
            for resp in self.call:
                if resp.compact_revision:
                    self.q.put(Compacted(resp.compact_revision))
                    return
                if resp.canceled:
                    self.q.put(EtcdError(f"etcd ended the watch: {resp.cancel_reason or 'canceled'}"))
                    return
                if resp.created and not resp.events:
                    continue
                batch: list[tuple[int, list[Event]]] = []
                for ev in resp.events:
                    e = Event("delete" if ev.type == 1 else "put", _kv(ev.kv))
                    if batch and batch[-1][0] == e.kv.mod_revision:
                        batch[-1][1].append(e)
                    else:
                        batch.append((e.kv.mod_revision, [e]))
                if not batch:
                    batch.append((resp.header.revision, []))
                for item in batch:
                    self.q.put(item)
            self.q.put(EtcdError("the etcd watch stream ended"))
        except grpc.RpcError as e:
            if not self.stopped.is_set():
                self.q.put(EtcdError(f"the etcd watch failed: {e.details() if hasattr(e, 'details') else e}"))
        finally:
            self.q.put(_END)

    def get(self, timeout: float | None = None) -> tuple[int, list[Event]] | None:
        """The next ``(revision, events)``, or None after ``timeout`` s without one.  Raises
        :class:`Compacted` or EtcdError when the watch ended."""
        try:
            item = self.q.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _END:
            self.q.put(_END)
            raise EtcdError("the etcd watch ended")
        if isinstance(item, Exception):
            self.q.put(_END)
            raise item
        return item

    def __iter__(self) -> Iterator[tuple[int, list[Event]]]:
        while True:
            item = self.get()
            assert item is not None
            yield item

    def cancel(self) -> None:
        """End the watch (its thread exits; iteration then raises EtcdError)."""
        self.stopped.set()
        self.requests.put(None)
        self.call.cancel()
