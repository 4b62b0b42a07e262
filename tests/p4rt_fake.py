"""A P4Runtime server for the tests (grpcio on loopback): one device that applies and records
every write, checking that each is valid for what it holds."""

from __future__ import annotations

import threading
from concurrent import futures


class FakeSwitch:
    """The P4Runtime service of one device (grpcio, loopback): arbitration (every client is
    primary), pipeline config, Write (INSERT/MODIFY/DELETE of table entries, default entries and
    multicast groups; every request recorded; the updates ``reject`` picks are refused with a
    status per update, as BMv2 does) and Read (wildcard tables and groups, default
    entries).  An update that is not valid for what it holds fails the test."""

    def __init__(self):
        import grpc
        from p4.v1 import p4runtime_pb2_grpc

        self.requests: list = []
        self.entries: dict = {}  # (table id, match bytes, priority) -> TableEntry
        self.defaults: dict = {}  # table id -> TableEntry
        self.groups: dict = {}
        self.p4info = None
        self.errors: list[str] = []
        self.reject = None  # update -> True to reject it (RESOURCE_EXHAUSTED), the others applied
        # strict: an update that is not valid for what the device holds is rejected (NOT_FOUND,
        # ALREADY_EXISTS) and not applied, as BMv2 does, instead of failing the test
        self.strict = False
        self.wildcard_reads = 0  # ReadRequests for every table entry
        self.streams = 0  # stream channels opened (arbitration)
        self.lock = threading.Lock()
        outer = self

        class Servicer(p4runtime_pb2_grpc.P4RuntimeServicer):
            def StreamChannel(self, request_iterator, context):
                from p4.v1 import p4runtime_pb2 as pr

                outer.streams += 1
                for req in request_iterator:
                    if req.HasField("arbitration"):
                        rep = pr.StreamMessageResponse()
                        rep.arbitration.CopyFrom(req.arbitration)
                        rep.arbitration.status.code = 0
                        yield rep

            def SetForwardingPipelineConfig(self, request, context):
                from p4.v1 import p4runtime_pb2 as pr

                outer.p4info = request.config.p4info
                return pr.SetForwardingPipelineConfigResponse()

            def GetForwardingPipelineConfig(self, request, context):
                from p4.v1 import p4runtime_pb2 as pr

                rep = pr.GetForwardingPipelineConfigResponse()
                if outer.p4info is not None:
                    rep.config.p4info.CopyFrom(outer.p4info)
                return rep

            def Write(self, request, context):
                import grpc
                from google.rpc import code_pb2, status_pb2
                from p4.v1 import p4runtime_pb2 as pr

                statuses = []
                with outer.lock:
                    outer.requests.append(request)
                    for u in request.updates:
                        if outer.reject is not None and outer.reject(u):
                            statuses.append(pr.Error(canonical_code=code_pb2.RESOURCE_EXHAUSTED,
                                                     message="rejected by the test"))
                            continue
                        bad = outer.invalid(u) if outer.strict else None
                        if bad is not None:
                            statuses.append(pr.Error(canonical_code=bad, message="invalid for what is held"))
                            continue
                        outer.apply(u)
                        statuses.append(pr.Error(canonical_code=code_pb2.OK))
                if any(e.canonical_code != code_pb2.OK for e in statuses):
                    # as BMv2's server: each update applied or not on its own, one status per update
                    st = status_pb2.Status(code=code_pb2.UNKNOWN, message="write failure")
                    for e in statuses:
                        st.details.add().Pack(e)
                    context.set_trailing_metadata((("grpc-status-details-bin", st.SerializeToString()),))
                    context.abort(grpc.StatusCode.UNKNOWN, "write failure")
                return pr.WriteResponse()

            def Read(self, request, context):
                from p4.v1 import p4runtime_pb2 as pr

                rep = pr.ReadResponse()
                with outer.lock:
                    for ent in request.entities:
                        if ent.HasField("table_entry") and ent.table_entry.is_default_action:
                            rep.entities.add().table_entry.CopyFrom(outer.defaults[ent.table_entry.table_id])
                        elif ent.HasField("table_entry"):
                            outer.wildcard_reads += 1
                            for te in outer.entries.values():
                                rep.entities.add().table_entry.CopyFrom(te)
                        elif ent.HasField("packet_replication_engine_entry"):
                            for g in outer.groups.values():
                                rep.entities.add().packet_replication_engine_entry.multicast_group_entry.CopyFrom(g)
                yield rep

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(Servicer(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def invalid(self, u) -> int | None:
        """The ``google.rpc`` code a strict device rejects update ``u`` with, None when valid."""
        from google.rpc import code_pb2
        from p4.v1 import p4runtime_pb2 as pr

        e = u.entity
        if e.HasField("packet_replication_engine_entry"):
            have = e.packet_replication_engine_entry.multicast_group_entry.multicast_group_id in self.groups
        elif e.table_entry.is_default_action:
            return None
        else:
            te = e.table_entry
            have = (te.table_id, b"".join(m.SerializeToString() for m in te.match), te.priority) in self.entries
        if u.type == pr.Update.INSERT:
            return code_pb2.ALREADY_EXISTS if have else None
        return None if have else code_pb2.NOT_FOUND

    def apply(self, u) -> None:
        from p4.v1 import p4runtime_pb2 as pr

        e = u.entity
        if e.HasField("packet_replication_engine_entry"):
            g = e.packet_replication_engine_entry.multicast_group_entry
            have = g.multicast_group_id in self.groups
            if (u.type == pr.Update.INSERT) == have:
                self.errors.append(f"{pr.Update.Type.Name(u.type)} of group {g.multicast_group_id}")
            if u.type == pr.Update.DELETE:
                self.groups.pop(g.multicast_group_id, None)
            else:
                self.groups[g.multicast_group_id] = g
            return
        te = e.table_entry
        if te.is_default_action:
            if u.type != pr.Update.MODIFY:
                self.errors.append("a default entry written other than by MODIFY")
            self.defaults[te.table_id] = te
            return
        key = (te.table_id, b"".join(m.SerializeToString() for m in te.match), te.priority)
        have = key in self.entries
        if (u.type == pr.Update.INSERT) == have or (u.type != pr.Update.INSERT and not have):
            self.errors.append(f"{pr.Update.Type.Name(u.type)} of an entry {'held' if have else 'not held'}")
        if u.type == pr.Update.DELETE:
            self.entries.pop(key, None)
        else:
            self.entries[key] = te

    def stop(self) -> None:
        self.server.stop(0)
