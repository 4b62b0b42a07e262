"""Prometheus metrics of ``subc serve`` (``--metrics ADDR:PORT``, the ``prometheus_client`` library).

Each daemon has its own registry (several daemons may run in one process in tests):

* ``subc_serve_requests_total{verb, result}``: requests by verb and outcome (ok, error, denied,
  limit, rate_limited, unproven: a UDP request from a source that has not proven its address);
* ``subc_serve_address_proof_total{event}``: the address proof of UDP requests (:mod:`.proof`):
  proven_cookie, proven_token, bad_cookie, requests_unproven, cookies_sent, pings_unproven,
  too_short_unproven, unproven_unanswered;
* ``subc_serve_suback_seconds``: from a SUBSCRIBE's arrival to its SUBACK (the data plane
  already updated and the store committed), a histogram;
* ``subc_serve_changes_total``: changes applied to the data plane (each one root switch);
* ``subc_serve_subscriptions``, ``subc_serve_endpoints``: live subscriptions and endpoints;
* ``subc_serve_topic_labels``, ``subc_serve_registrations``: topic level names with a label, and
  publishers' topic registrations;
* ``subc_serve_root_slots{state}``: root slots free for the next change (``free``), of those the
  ones behind the live root that a change would rewrite on its own path (``stale``), and slots
  waiting out their grace period (``retired``);
* ``subc_serve_root_refresh_writes``, ``subc_serve_root_refresh_failures``: entries written into
  free root slots ahead of the changes (the reclaimer's refresh, a P4Runtime switch), and refreshes
  the data plane refused (the slot is then rewritten by the change that takes it);
* ``subc_serve_root_stale_waits``: changes that waited for a retired root slot to come back from
  its grace period rather than take a stale free one (a P4Runtime switch).

Deliveries per subscriber are the data plane's counters: ``subc stats``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

SUBACK_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)


class Metrics:
    """The metrics above; served over HTTP on ``listen`` ((address, port)) when given."""

    def __init__(self, listen: tuple[str, int] | None = None):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("subc_serve_requests", "requests by verb and outcome", ["verb", "result"], registry=r)
        self.proof = Counter(
            "subc_serve_address_proof", "address proof of UDP requests (cookies), by event", ["event"], registry=r
        )
        self.suback = Histogram(
            "subc_serve_suback_seconds",
            "SUBSCRIBE arrival to SUBACK (data plane updated), s",
            buckets=SUBACK_BUCKETS,
            registry=r,
        )
        self.changes = Counter("subc_serve_changes", "changes applied to the data plane (root switches)", registry=r)
        self.switch_updates = Gauge(
            "subc_serve_switch_updates",
            "P4Runtime updates written to the switch (--p4runtime; entries, groups, roots)",
            registry=r,
        )
        self.switch_requests = Gauge(
            "subc_serve_switch_write_requests", "P4Runtime WriteRequests sent to the switch (--p4runtime)", registry=r
        )
        self.subscriptions = Gauge("subc_serve_subscriptions", "live subscriptions", registry=r)
        self.endpoints = Gauge("subc_serve_endpoints", "delivery endpoints with a subscription", registry=r)
        self.labels = Gauge("subc_serve_topic_labels", "topic level names with a label", registry=r)
        self.registrations = Gauge("subc_serve_registrations", "publishers' topic registrations", registry=r)
        self.root_slots = Gauge(
            "subc_serve_root_slots", "root slots by state (free, stale, retired)", ["state"], registry=r
        )
        self.refresh_writes = Gauge(
            "subc_serve_root_refresh_writes", "entries written into free root slots ahead of changes", registry=r
        )
        self.refresh_failures = Gauge(
            "subc_serve_root_refresh_failures", "root slot refreshes the data plane refused", registry=r
        )
        self.stale_waits = Gauge(
            "subc_serve_root_stale_waits", "changes that waited for a retired root slot (not a stale one)", registry=r
        )
        self.server = None
        if listen is not None:
            self.server, _ = start_http_server(listen[1], addr=listen[0], registry=r)

    def watch_broker(self, broker) -> None:
        """Read the root slot gauges above from ``broker`` (a
        :class:`~subc.dataplane.live_broker.LiveBroker`) whenever they are collected."""
        self.root_slots.labels("free").set_function(broker.free_slot_count)
        self.root_slots.labels("stale").set_function(broker.stale_slot_count)
        self.root_slots.labels("retired").set_function(lambda: len(broker.retired))
        self.refresh_writes.set_function(lambda: broker.refresh_writes)
        self.refresh_failures.set_function(lambda: broker.refresh_failures)
        self.stale_waits.set_function(lambda: broker.stale_waits)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
