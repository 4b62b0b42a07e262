"""Prometheus metrics of a broker in a cluster (``subc serve --cluster ... --metrics``), read at
each scrape (a ``prometheus_client`` custom collector, in the daemon's registry):

* ``subc_cluster_applied_revision``: the etcd revision this broker has applied to its data plane;
  ``subc_cluster_status_delay_seconds``: from its last status write to etcd to that write coming
  back through its watch and being applied (the watch's lag, measured once a second);
* ``subc_cluster_members``: live brokers; ``subc_cluster_fenced``: 1 while this broker may not
  deliver (its lease may be gone); ``subc_cluster_handed_over``: 1 once every other member
  acknowledged the member set; ``subc_cluster_delivering_endpoints``: UDP endpoints this broker
  delivers to (the rest of its endpoints are on standby);
* ``subc_cluster_events_total{event}``: ``renewal``, ``renewal_failure``, ``lease_lost``,
  ``watch_restart``, ``compaction``, ``snapshot``, ``name_clash``, ``handover``,
  ``apply_failure`` (a subscription committed in etcd that this data plane could not take),
  ``resolve_failure`` (an owned endpoint that could not be resolved: left on standby),
  ``late_change`` (a change applied after this broker's feed passed its position: its streams may
  differ from the other brokers' by) ``late_message`` (the messages between the two),
  ``forced_switch`` (a scheduled switch made before the feed reached it: the schedule was full),
  ``position_race`` (a transaction retried because another broker moved ``meta/position``),
  ``label_race`` (a transaction retried because a topic label was given or forgotten meanwhile),
  ``label_forgotten`` (labels this broker forgot: nothing used them).
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class ClusterCollector:
    """The metrics above, from a :class:`~.node.ClusterNode` and its
    :class:`~.updater.ClusterUpdater`."""

    def __init__(self, node, updater):
        self.node, self.updater = node, updater

    def describe(self) -> list:
        """Nothing up front (prometheus_client then collects once to describe)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The metrics now."""
        n, u = self.node, self.updater
        rep = u.replica
        yield GaugeMetricFamily("subc_cluster_applied_revision", "etcd revision applied here", value=rep.revision)
        yield GaugeMetricFamily(
            "subc_cluster_status_delay_seconds", "status write to its application here, s", value=u.status_delay
        )
        yield GaugeMetricFamily("subc_cluster_members", "live brokers", value=len(rep.members))
        yield GaugeMetricFamily("subc_cluster_fenced", "1: may not deliver", value=int(n.fenced() or u.fenced))
        yield GaugeMetricFamily(
            "subc_cluster_handed_over", "1: the member set is acknowledged", value=int(rep.handed_over(n.name))
        )
        yield GaugeMetricFamily("subc_cluster_delivering_endpoints", "UDP endpoints delivered to", value=u.owned_count)
        c = CounterMetricFamily("subc_cluster_events", "cluster events", labels=["event"])
        for name, v in (
            ("renewal", n.renewals),
            ("renewal_failure", n.renewal_failures),
            ("lease_lost", n.leases_lost),
            ("watch_restart", n.watch_restarts),
            ("compaction", n.compactions),
            ("snapshot", n.snapshots),
            ("name_clash", n.name_clashes),
            ("handover", u.handovers),
            ("apply_failure", u.apply_failures),
            ("resolve_failure", u.resolve_failures),
            ("late_change", u.late_changes),
            ("late_message", u.late_messages),
            ("forced_switch", u.broker.forced),
            ("position_race", u.committer.position_races),
            ("label_race", u.committer.label_races),
            ("label_forgotten", u.labels_forgotten),
        ):
            c.add_metric([name], v)
        yield c
