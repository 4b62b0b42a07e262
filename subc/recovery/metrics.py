"""Prometheus metrics of the recovery service (``--metrics ADDR:PORT`` of ``subc load --journal``
and ``subc journal``; ``subc serve --journal`` adds them to its own registry), read from the
service's figures at each scrape (a ``prometheus_client`` custom collector):

* ``subc_journal_bytes{stream}``, ``subc_journal_first_seq{stream}``,
  ``subc_journal_next_seq{stream}``: each bound stream's journal: bytes retained, oldest retained
  and next sequence numbers;
* ``subc_journal_hole_messages_total{stream}``: messages sent but never journaled (the ring was
  full); ``subc_journal_retention_dropped_total{stream}``: messages dropped by retention;
* ``subc_journal_feed_records_total``, ``subc_journal_feed_messages_total``: ring records read and
  messages journaled; ``subc_journal_ring_lag_bytes``: bytes reserved in the ring and not yet
  released (the feed's lag); ``subc_journal_held``: copies held past a gap;
* ``subc_rerequest_requests_total{result}``: MoldUDP64 re-requests by outcome (``served``,
  ``unanswered``, ``cookie_sent``, ``not_authorized``, ``rate_limited``, ``malformed``);
  ``subc_rerequest_messages_total{result}``: messages ``served`` and ``unanswered`` (gone);
* ``subc_soup_sessions``: SoupBinTCP clients connected; ``subc_soup_logins_total{result}``
  (``accepted``, ``rejected_A``, ``rejected_S``); ``subc_soup_bytes_total{kind}`` (``backfill``,
  ``live``); ``subc_soup_disconnects_total{reason}``.
"""

from __future__ import annotations

from typing import Iterator, Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

RR_RESULTS = ("served", "unanswered", "cookie_sent", "not_authorized", "rate_limited", "malformed")


class HasStatus(Protocol):
    """What the collector reads: the service's :meth:`status` (subc.recovery.service)."""

    def status(self) -> dict: ...


class RecoveryCollector:
    """The metrics above, from ``service.status()`` at each scrape."""

    def __init__(self, service: HasStatus):
        self.service = service

    def collect(self) -> Iterator[Metric]:
        st = self.service.status()
        by_stream = {v["stream"]: v for v in st["subscribers"].values()}
        for name, field, doc in (
            ("subc_journal_bytes", "bytes", "bytes each stream's journal retains"),
            ("subc_journal_first_seq", "first_seq", "oldest retained sequence number"),
            ("subc_journal_next_seq", "next_seq", "next sequence number"),
        ):
            g = GaugeMetricFamily(name, doc, labels=["stream"])
            for key, v in by_stream.items():
                g.add_metric([key], v[field])
            yield g
        for name, field, doc in (
            ("subc_journal_hole_messages", "hole_messages", "messages sent but never journaled"),
            ("subc_journal_retention_dropped", "dropped_by_retention", "messages dropped by retention"),
        ):
            c = CounterMetricFamily(name, doc, labels=["stream"])
            for key, v in by_stream.items():
                c.add_metric([key], v[field])
            yield c
        feed = st["feed"]
        yield CounterMetricFamily("subc_journal_feed_records", "ring records read", value=feed.get("records", 0))
        yield CounterMetricFamily(
            "subc_journal_feed_messages", "messages journaled", value=feed.get("journaled_messages", 0)
        )
        ring = st["ring"]
        yield GaugeMetricFamily(
            "subc_journal_ring_lag_bytes",
            "ring bytes reserved, not yet released",
            value=ring["producer"] - ring["consumer"],
        )
        yield GaugeMetricFamily("subc_journal_held", "copies held past a gap", value=st["held"])
        rr = st.get("rerequest")
        if rr is not None:
            c = CounterMetricFamily("subc_rerequest_requests", "MoldUDP64 re-requests by outcome", labels=["result"])
            for r in RR_RESULTS:
                c.add_metric([r], rr.get(r, 0))
            yield c
            m = CounterMetricFamily("subc_rerequest_messages", "messages served and unanswered", labels=["result"])
            m.add_metric(["served"], rr.get("served_messages", 0))
            m.add_metric(["unanswered"], rr.get("unanswered_messages", 0))
            yield m
        soup = st.get("soup")
        if soup is not None:
            counters = soup["counters"]
            yield GaugeMetricFamily("subc_soup_sessions", "SoupBinTCP clients connected", value=len(soup["sessions"]))
            logins = CounterMetricFamily("subc_soup_logins", "SoupBinTCP logins by outcome", labels=["result"])
            for label, key in (
                ("accepted", "logins_accepted"),
                ("rejected_A", "login_rejected_A"),
                ("rejected_S", "login_rejected_S"),
            ):
                logins.add_metric([label], counters.get(key, 0))
            yield logins
            sent = CounterMetricFamily("subc_soup_bytes", "SoupBinTCP bytes sent", labels=["kind"])
            sent.add_metric(["backfill"], counters.get("backfill_bytes", 0))
            sent.add_metric(["live"], counters.get("live_bytes", 0))
            yield sent
            gone = CounterMetricFamily("subc_soup_disconnects", "SoupBinTCP disconnections", labels=["reason"])
            for k, v in counters.items():
                if k.startswith("disconnect:"):
                    gone.add_metric([k.split(":", 1)[1]], v)
            yield gone


def serve_metrics(service: HasStatus, listen: tuple[str, int]):
    """Serve the service's metrics over HTTP on ``listen`` ((address, port)); the server (its
    ``shutdown()`` stops it)."""
    registry = CollectorRegistry()
    registry.register(RecoveryCollector(service))
    server, _ = start_http_server(listen[1], addr=listen[0], registry=registry)
    return server
