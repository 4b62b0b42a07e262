"""A P4Runtime session with one switch, through ``p4runtime-shell``'s client
(``p4runtime_sh.p4runtime.P4RuntimeClient``; not its interactive shell, whose IPython import
alone takes longer than an update).

:class:`Session` opens the client (arbitration on the stream channel with an election
id, P4Runtime specification v1.3 section 5), optionally sets the forwarding pipeline (P4Info and
the target's device config, ``VERIFY_AND_COMMIT``), and keeps the switch's P4Info.  Writes go in
``WriteRequest`` batches of :data:`BATCH` updates; the updates of one request may be applied in
any order (section 12), so callers send what must come first in an earlier call of
:meth:`Session.write`.  Every failure is a :class:`~subc.errors.SubcError` that says what
happened: no server at the address, another controller is primary (or took over mid-write),
an entry the switch rejected (its table, match and the server's status).
"""

from __future__ import annotations

import contextlib
import io
import logging
from typing import Any

from ...errors import SubcError
from .requests import P4InfoIndex
from .wire import length_delimited

BATCH = 500  # updates per WriteRequest
CONNECT_HINT = "is the switch running with its P4Runtime server on that address (simple_switch_grpc)?"


@contextlib.contextmanager
def _quiet():
    """p4runtime-shell reports failures with ``logging.critical``, ``print`` and ``sys.exit``:
    keep them off the user's terminal, turn the exit into an exception for the caller."""
    out = io.StringIO()
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(out):
            yield out
    finally:
        logging.disable(logging.NOTSET)


def _describe(update, index: P4InfoIndex) -> str:
    e = update.entity
    if e.HasField("table_entry"):
        te = e.table_entry
        name = index.table_names.get(te.table_id, f"table id {te.table_id}")
        what = "default action" if te.is_default_action else f"entry {[str(m).replace(chr(10), ' ') for m in te.match]}"
        return f"{name} {what}"
    if e.HasField("packet_replication_engine_entry"):
        return f"multicast group {e.packet_replication_engine_entry.multicast_group_entry.multicast_group_id}"
    return "an entity"


class WriteRejected(SubcError):
    """The switch rejected updates of a :meth:`Session.write`; ``applied``: the indexes of the
    updates it applied (every earlier request's, and those of the rejected request with an OK
    status), None when the server did not say."""

    def __init__(self, message: str, applied: list[int] | None):
        super().__init__(message)
        self.applied = applied


def _update_statuses(err) -> list | None:
    """The per-update ``p4.v1.Error`` list of a rejected WriteRequest's gRPC error ``err`` (from
    its ``grpc-status-details-bin`` trailer), or None when it carries none."""
    from google.rpc import status_pb2
    from p4.v1 import p4runtime_pb2 as pr

    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status()
            status.ParseFromString(value)
            out = []
            for any_ in status.details:
                e = pr.Error()
                out.append(e if any_.Unpack(e) else None)
            return out or None
    return None


def framed_updates(updates: list) -> bytes:
    """``updates`` (``p4.v1.Update`` messages or their serializations) as the ``updates`` field of
    a ``WriteRequest``: appended to the serialization of its other fields, the request
    (:meth:`Session.write`)."""
    from p4.v1 import p4runtime_pb2 as pr

    field = pr.WriteRequest.DESCRIPTOR.fields_by_name["updates"].number
    return b"".join(length_delimited(field, u if isinstance(u, bytes) else u.SerializeToString()) for u in updates)


class Session:
    """A primary-controller session with the switch at ``addr`` (``HOST:PORT``), device
    ``device_id``, election id ``election_id`` ((high, low)); with ``config`` ((P4Info text
    path, device config path), e.g. BMv2's JSON) the forwarding pipeline is set first;
    ``read_only`` opens no stream channel and takes part in no arbitration (Read and
    GetForwardingPipelineConfig need none, section 5): it reads beside a primary controller such
    as ``subc serve --p4runtime`` without disturbing it; ``election_id`` is then unused.

    Attributes: ``index`` (:class:`~.requests.P4InfoIndex` of the switch's P4Info), ``p4info``.
    SubcError when no server answers, the session is not primary, or the pipeline is refused."""

    def __init__(
        self,
        addr: str,
        device_id: int = 0,
        election_id: tuple[int, int] = (0, 1),
        config: tuple[str, str] | None = None,
        read_only: bool = False,
    ):
        from p4runtime_sh.p4runtime import P4RuntimeClient

        self.addr, self.device_id = addr, device_id
        self.channel = None
        self.client = None
        self._write: Any = None  # the Write method, its requests serialized here (:meth:`write`)
        self._head = b""
        self.write_requests = 0  # WriteRequests sent
        if read_only and not config:
            self._open_reader()
            return
        with _quiet() as out:
            try:
                self.client = P4RuntimeClient(device_id, addr, election_id)
                if config:
                    self.client.set_fwd_pipe_config(config[0], config[1])
                self.p4info = self.client.get_p4info()
            except SystemExit:
                said = out.getvalue().strip()
                self.close()
                raise SubcError(
                    f"{addr}: no P4Runtime session with device {device_id}: the server did not answer "
                    f"the arbitration; {CONNECT_HINT}"
                ) from None
            except Exception as e:  # noqa: BLE001 - grpc and protobuf errors alike
                said = out.getvalue().strip()
                self.close()
                if config:
                    raise SubcError(
                        f"{addr}: could not set the forwarding pipeline (device {device_id}) from "
                        f"{config[0]} and {config[1]}: {e}{'; ' + said if said else ''}; {CONNECT_HINT}"
                    ) from None
                raise SubcError(f"{addr}: P4Runtime setup failed: {e}; {CONNECT_HINT}") from None
        if "not the primary" in out.getvalue() and not read_only:
            self.close()
            raise SubcError(
                f"{addr}: another controller is primary for device {device_id} (a higher election id "
                f"than {election_id[0]},{election_id[1]}): pass a higher --election-id"
            )
        if not self.p4info.tables:
            self.close()
            raise SubcError(f"{addr}: device {device_id} has no forwarding pipeline (set one with subc load --config)")
        self.index = P4InfoIndex(self.p4info)
        self.stub = self.client.stub

    def _open_reader(self) -> None:
        """A gRPC channel and the P4Info of the device's pipeline, no arbitration."""
        import grpc
        from p4.v1 import p4runtime_pb2 as pr
        from p4.v1 import p4runtime_pb2_grpc

        self.channel = grpc.insecure_channel(self.addr)
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        req = pr.GetForwardingPipelineConfigRequest(
            device_id=self.device_id, response_type=pr.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE
        )
        try:
            rep = self.stub.GetForwardingPipelineConfig(req, timeout=10)
        except grpc.RpcError as e:
            self.close()
            raise SubcError(
                f"{self.addr}: no P4Runtime answer for device {self.device_id} ({e.code().name}: "
                f"{e.details()}); {CONNECT_HINT}"
            ) from None
        if not rep.config.HasField("p4info") or not rep.config.p4info.tables:
            self.close()
            raise SubcError(
                f"{self.addr}: device {self.device_id} has no forwarding pipeline (set one with subc load --config)"
            )
        self.p4info = rep.config.p4info
        self.index = P4InfoIndex(self.p4info)

    def close(self) -> None:
        """End the session (the stream channel and the gRPC channel)."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
            return
        if self.client is not None:
            with _quiet(), contextlib.suppress(Exception):
                self.client.tear_down()
            self.client = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write(self, updates: list) -> int:
        """Send ``updates`` (``p4.v1.Update`` messages or their serializations) in WriteRequests of
        :data:`BATCH`, each acknowledged before the next is sent.  Returns the updates written.
        :class:`WriteRejected` when the switch rejects updates (which ones, the server's status;
        its ``applied`` lists the indexes in ``updates`` the switch did apply), SubcError for a
        lost primary role or a broken connection (what was applied is then unknown).

        A request is sent as the serialization of its other fields followed by each update's,
        framed as the ``updates`` field (protobuf encoding: a message's fields may come in any
        order and a repeated field's elements one by one), which spares pure-Python protobuf
        (p4runtime-shell pins protobuf below 3.21, without a C implementation for Python 3.11)
        a deep copy of every update into the request.  A rejection's per-update statuses (section
        12.3: ``google.rpc.Status`` details of one ``p4.v1.Error`` per update, in order, OK for the
        applied ones) are read here: p4runtime-shell 0.0.6's parser loops forever on a status
        list that holds an OK before an error, as BMv2 returns for a partly applied request."""
        import grpc
        from p4.v1 import p4runtime_pb2 as pr

        client = self.client
        assert client is not None, "a read-only session does not write"
        if self._write is None:
            method = pr.DESCRIPTOR.services_by_name["P4Runtime"].methods_by_name["Write"]
            self._write = client.channel.unary_unary(
                f"/{method.containing_service.full_name}/{method.name}",
                response_deserializer=pr.WriteResponse.FromString,
            )
            head = pr.WriteRequest(device_id=self.device_id)
            head.election_id.high, head.election_id.low = client.election_id
            if client.role_name is not None:
                head.role = client.role_name
            self._head = head.SerializeToString()
        for i in range(0, len(updates), BATCH):
            batch = updates[i : i + BATCH]
            body = framed_updates(batch)
            try:
                self.write_requests += 1
                self._write(self._head + body)
            except grpc.RpcError as e:
                statuses = _update_statuses(e) if e.code() == grpc.StatusCode.UNKNOWN else None
                if statuses is None:
                    raise SubcError(self._rpc_error(e, f"after {i} of {len(updates)} updates")) from None
                raise self._rejected(updates, i, batch, statuses) from None
        return len(updates)

    def _rejected(self, updates: list, i: int, batch: list, statuses: list) -> "WriteRejected":
        from google.rpc import code_pb2
        from p4.v1 import p4runtime_pb2 as pr

        failed = [(k, err) for k, err in enumerate(statuses) if err is None or err.canonical_code != code_pb2.OK]
        known = len(statuses) == len(batch)
        if not known:  # not one status per update: which ones were applied is unknown
            failed = [(k, None) for k in range(len(batch))]
        bad = {k for k, _ in failed}
        lines = []
        for k, err in failed[:5]:
            u = pr.Update.FromString(batch[k]) if isinstance(batch[k], bytes) else batch[k]
            kind = pr.Update.Type.Name(u.type)
            said = f"{code_pb2.Code.Name(err.canonical_code)} {err.message!r}" if err is not None else "no status"
            lines.append(f"{kind} of {_describe(u, self.index)}: {said}")
        more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
        applied = list(range(i)) + [i + k for k in range(len(batch)) if k not in bad] if known else None
        return WriteRejected(
            f"{self.addr}: the switch rejected {len(failed)} of {len(batch)} updates{more} after {i} "
            "were written: " + "; ".join(lines),
            applied,
        )

    def _rpc_error(self, err, when: str) -> str:
        import grpc

        code = err.code()
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return (
                f"{self.addr}: this session is no longer the primary controller of device {self.device_id} "
                f"(another took over: {err.details()}); {when}"
            )
        if code == grpc.StatusCode.UNAVAILABLE:
            return f"{self.addr}: the P4Runtime server went away ({err.details()}); {when}"
        return f"{self.addr}: P4Runtime error {code.name}: {err.details()}; {when}"

    def read(self, entities: list) -> list:
        """Every entity a ReadRequest for ``entities`` (``p4.v1.Entity``, wildcards allowed)
        returns.  SubcError when the read fails."""
        import grpc
        from p4.v1 import p4runtime_pb2 as pr

        req = pr.ReadRequest(device_id=self.device_id)
        req.entities.extend(entities)
        out = []
        try:
            for rep in self.stub.Read(req):
                out.extend(rep.entities)
        except grpc.RpcError as e:
            raise SubcError(self._rpc_error(e, "while reading")) from None
        return out

    def table_entries(self) -> list:
        """Every table entry of the switch (``TableEntry``; default entries not included)."""
        from p4.v1 import p4runtime_pb2 as pr

        return [e.table_entry for e in self.read([pr.Entity(table_entry=pr.TableEntry())])]

    def default_entry(self, table: str):
        """The default entry (``TableEntry``) of ``table``."""
        from p4.v1 import p4runtime_pb2 as pr

        te = pr.TableEntry(table_id=self.index.table(table).id, is_default_action=True)
        got = self.read([pr.Entity(table_entry=te)])
        if not got:
            raise SubcError(f"{self.addr}: the switch returned no default entry of {table}")
        return got[0].table_entry

    def multicast_groups(self) -> list:
        """Every multicast group of the switch (``MulticastGroupEntry``)."""
        from p4.v1 import p4runtime_pb2 as pr

        e = pr.Entity()
        e.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
        return [x.packet_replication_engine_entry.multicast_group_entry for x in self.read([e])]

    def counters(self) -> list:
        """Every indirect counter cell of the switch (``CounterEntry``), one read per counter."""
        from p4.v1 import p4runtime_pb2 as pr

        out = []
        for c in self.p4info.counters:
            out += [
                e.counter_entry for e in self.read([pr.Entity(counter_entry=pr.CounterEntry(counter_id=c.preamble.id))])
            ]
        return out
