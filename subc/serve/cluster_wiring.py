"""``subc serve --cluster``: how the daemon's pieces are wired to the cluster (docs/cluster.md):
the options it refuses, and the cluster's updater with this broker's node."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..errors import SubcError
from .config import ServeConfig
from .updater import Updater

CLUSTER_STATUS = "cluster.json"  # --cluster: this broker's figures, rewritten about once a second (subc stats)


def write_json_atomic(path: Path, doc: dict) -> None:
    """``doc`` as JSON at ``path``, replaced whole (a temporary file renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def check_cluster(cfg: ServeConfig) -> None:
    """Refuse what ``--cluster`` does not run with (SubcError): a P4 switch, no journal, ``--rules``.
    Nothing without ``--cluster``."""
    if cfg.cluster is None:
        return
    if cfg.switch is not None:
        raise SubcError("--cluster runs eBPF brokers; it does not drive a P4 switch (--p4runtime)")
    if cfg.journal is None:
        raise SubcError(
            "--cluster needs --journal: a broker keeps every stream it does not deliver to in its "
            "journal, with its sequence numbers, to take it over without loss"
        )
    if cfg.rules:
        raise SubcError("--cluster takes its subscriptions from etcd: --rules is for a broker of its own")


def cluster_updater(daemon: Any, args: tuple) -> Updater:
    """The cluster's updater over the updater's ``args``, with this broker's node (started by the
    daemon once its threads run).  ``daemon``: a :class:`~subc.serve.daemon.Daemon` whose data
    plane, store, book, endpoints and broker are open (its ``node`` is set here); the node's
    figures go to the metrics and to :data:`CLUSTER_STATUS` in the state folder."""
    from ..cluster.applier import REVISION_META
    from ..cluster.metrics import ClusterCollector
    from ..cluster.node import ClusterNode
    from ..cluster.records import MemberRecord, NodeStatus, SubRecord
    from ..cluster.replica import Replica
    from ..cluster.updater import ClusterUpdater

    cfg = daemon.cfg
    opts = cfg.cluster
    assert opts is not None
    replica = Replica(opts.prefix)
    replica.load(
        int(daemon.store.meta(REVISION_META) or 0),
        {
            i: SubRecord(lv.text, lv.ep[0], lv.ep[1], lv.source, lv.expires, lv.filter)
            for i, lv in daemon.book.subs.items()
        },
    )
    rec = daemon.recovery
    member = MemberRecord(
        opts.node,
        f"{cfg.listen[0]}:{daemon.port}",
        rerequest=f"{rec.address[0]}:{rec.address[1]}" if rec is not None and rec.address else "",
        soup=f"{rec.soup_address[0]}:{rec.soup_address[1]}" if rec is not None and rec.soup_address else "",
        started=time.time(),
    )
    updater: ClusterUpdater | None = None

    def status() -> NodeStatus:
        u = updater
        return NodeStatus(
            replica.revision,
            len(daemon.book),
            u.owned_count if u is not None else 0,
            len(daemon.endpoints),
            node.fenced(),
            time.time(),
        )

    def report(doc: dict) -> None:
        u = updater
        if u is not None:
            doc.update(
                status_delay_s=round(u.status_delay, 6),
                late_changes=u.late_changes,
                late_messages=u.late_messages,
                scheduled_switches=len(daemon.broker.scheduled),
                forced_switches=daemon.broker.forced,
            )
        if cfg.state_dir:
            write_json_atomic(Path(cfg.state_dir) / CLUSTER_STATUS, doc)

    node = daemon.node = ClusterNode(
        opts, member, daemon.queue, daemon.stopping, daemon.set_fence, status, report=report
    )
    updater = ClusterUpdater(
        *args,
        node=node,
        replica=replica,
        grace=daemon.broker.grace,
        schedule=daemon.broker.schedule,
        lead=opts.lead,
        lead_messages=opts.lead_messages,
    )
    daemon.metrics.registry.register(ClusterCollector(node, updater))
    return updater
