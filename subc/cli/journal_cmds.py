"""The recovery service of an eBPF broker: ``subc journal`` (and ``subc load --journal``, which
runs it after loading): the journal feed, retention and the MoldUDP64 request server, in the
foreground until SIGINT or SIGTERM (docs/recovery.md)."""

from __future__ import annotations

import signal
import threading
from typing import Callable

import click

from ..errors import SubcError
from .app import fail, ip_port, main

DEFAULT_JOURNAL_PAGES = 4096  # 16 MiB


def journal_options(f: Callable) -> Callable:
    """The options of the recovery service, shared by ``subc load`` and ``subc journal``."""
    f = click.option(
        "--rerequest-rate",
        type=float,
        default=100.0,
        show_default=True,
        help="re-requests per second per source host",
    )(f)
    f = click.option("--metrics", metavar="ADDR:PORT", help="serve the service's Prometheus metrics on this address")(f)
    f = click.option(
        "--soup",
        metavar="ADDR:PORT",
        help="serve SoupBinTCP 4.1 on this TCP address: the subscribers file's soup logins, each its "
        "stream from the journal (backfill from the requested number, then live)",
    )(f)
    f = click.option(
        "--rerequest",
        metavar="ADDR:PORT",
        help="serve MoldUDP64 re-requests on this UDP address (from the subscribers' endpoints, "
        "after an address cookie)",
    )(f)
    f = click.option(
        "--retain",
        metavar="SECONDS|BYTES",
        help="keep each subscriber's journal within this age (90s, 10m, 2h) and/or size (512MiB), comma-separated",
    )(f)
    f = click.option(
        "--segment-bytes",
        metavar="BYTES",
        default="64MiB",
        show_default=True,
        help="size of a journal segment file (retention drops whole segments)",
    )(f)
    f = click.option(
        "--state",
        type=click.Path(file_okay=False),
        help="keep the journals under STATE/journal/ (durable across restarts); default: in memory",
    )(f)
    return f


def service_options(
    state: str | None,
    retain: str | None,
    segment_bytes: str,
    rerequest: str | None,
    rerequest_rate: float,
    soup: str | None,
):
    """The recovery service's options (:class:`~subc.recovery.service.ServiceOptions`) from the
    command line's; SubcError for a bad --retain or --segment-bytes."""
    from pathlib import Path

    from ..recovery.retention import Retention, parse_bytes, parse_retention
    from ..recovery.service import ServiceOptions

    return ServiceOptions(
        state=Path(state) if state else None,
        retention=parse_retention(retain) if retain else Retention(),
        segment_bytes=parse_bytes(segment_bytes, "--segment-bytes"),
        rerequest=ip_port(rerequest) if rerequest else None,
        rate=rerequest_rate,
        soup=ip_port(soup) if soup else None,
    )


def run_service(
    iface: str,
    state: str | None,
    retain: str | None,
    rerequest: str | None,
    rerequest_rate: float,
    segment_bytes: str = "64MiB",
    soup: str | None = None,
    metrics: str | None = None,
) -> None:
    """Run the recovery service of the broker on ``iface`` until SIGINT or SIGTERM."""
    from ..recovery.loaded_service import loaded_service

    try:
        options = service_options(state, retain, segment_bytes, rerequest, rerequest_rate, soup)
        svc = loaded_service(iface, options)
    except SubcError as e:
        fail(e)
    server = None
    if metrics:
        from ..recovery.metrics import serve_metrics

        try:
            server = serve_metrics(svc, ip_port(metrics))
        except OSError as e:
            svc.close()
            fail(SubcError(f"--metrics {metrics}: {e}"))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    where = f"; request server on {svc.address[0]}:{svc.address[1]}" if svc.address else ""
    where += f"; SoupBinTCP on {svc.soup_address[0]}:{svc.soup_address[1]}" if svc.soup_address else ""
    click.echo(
        f"journal feed running on {iface}: {len(svc.bound)} subscribers, "
        f"{'journals under ' + state if state else 'journals in memory'}{where}",
        err=True,
    )
    try:
        svc.run(stop)
    finally:
        if server is not None:
            server.shutdown()
        svc.close()


@main.command("journal")
@click.option("--iface", required=True, help="interface of a broker loaded with --journal")
@journal_options
def journal_cmd(
    iface: str,
    state: str | None,
    segment_bytes: str,
    retain: str | None,
    rerequest: str | None,
    rerequest_rate: float,
    soup: str | None,
    metrics: str | None,
) -> None:
    """Run the recovery service of the broker on IFACE (loaded with subc load --journal): append
    every copy its data plane sends to the subscriber's journal, keep --retain, answer MoldUDP64
    re-requests on --rerequest; until SIGINT or SIGTERM.  subc stats shows its figures."""
    run_service(iface, state, retain, rerequest, rerequest_rate, segment_bytes, soup, metrics)
