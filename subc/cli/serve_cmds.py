"""Live subscriptions: ``subc serve`` and ``subc serve-program`` (the topic clients ``subc publish``
and ``subc subscribe`` are in :mod:`.client_cmds`)."""

from __future__ import annotations

import json
import sys

import click

from ..errors import SubcError
from .app import fail, ip_port, limit_options, limits_of, main, one_of, open_spec, p4runtime_options, spec_options


@main.command("serve-program")
@spec_options
@click.option(
    "--spec",
    "spec_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="message-format spec (P4_16)",
)
@click.option("--ports", required=True, help="switch ports subscribers may be behind: 1,2,5-8")
@click.option("--target", type=click.Choice(["bmv2", "tofino"]), default="bmv2", show_default=True)
@click.option(
    "--field-order", help="comma-separated fields (default: every query field, exact ones first, then lpm, then range)"
)
@click.option(
    "--capacity",
    type=click.IntRange(1),
    default=10_000,
    show_default=True,
    help="live subscriptions the tables are sized for",
)
@click.option(
    "--max-messages",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="MoldUDP64 specs: messages per datagram the program classifies",
)
@click.option(
    "--root-slots",
    type=click.IntRange(2, 64),
    default=16,
    show_default=True,
    help="versions of the root the switch holds at once: subc serve makes at most one change per "
    "grace period / root slots (each slot holds a copy of the root's entries in the first table)",
)
@click.option("-o", "--output", "out_dir", default="serve-program", show_default=True, type=click.Path(file_okay=False))
def serve_program_cmd(
    spec_path: str,
    ports: str,
    target: str,
    field_order: str | None,
    capacity: int,
    max_messages: int,
    root_slots: int,
    out_dir: str,
) -> None:
    """Write the P4 program that subc serve --p4runtime fills with live subscriptions: a table
    per query field of the field order, every port of --ports, tables sized for --capacity
    (docs/p4runtime.md, "Live subscriptions on a switch").  Compile subc.p4 with the target's compiler."""
    from ..backends.output import write_directory
    from ..backends.p4.serve_program import serve_program
    from ..serve.dataplane import default_field_order

    try:
        port_list = parse_ports(ports)
        spec = open_spec(spec_path)
        order = [f.strip() for f in field_order.split(",") if f.strip()] if field_order else default_field_order(spec)
        files = serve_program(spec, order, port_list, capacity, target, max_messages, root_slots)
        write_directory(out_dir, files)
    except SubcError as e:
        fail(e)
    click.echo(
        f"wrote {out_dir}: {len(order)} field tables ({', '.join(order)}), ports {ports}, "
        f"room for {capacity} subscriptions"
    )


def parse_ports(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                out += list(range(int(a), int(b) + 1))
            elif part:
                out.append(int(part))
        except ValueError:
            raise SubcError(f"--ports: {part!r} is not a port or a range of ports") from None
    return out


@main.command("serve")
@spec_options
@click.option(
    "--spec",
    "spec_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="message-format spec (P4_16)",
)
@click.option("--iface", help="interface the publishers' datagrams arrive on (the eBPF data path)")
@p4runtime_options
@click.option(
    "--program",
    type=click.Path(file_okay=False, exists=True),
    help="--p4runtime: the directory of subc serve-program the switch runs",
)
@click.option(
    "--config",
    type=click.Path(dir_okay=False, exists=True),
    help="--p4runtime: set the switch's pipeline from this device config (BMv2: p4c-bm2-ss's JSON)",
)
@click.option(
    "--port-map",
    type=click.Path(dir_okay=False, exists=True),
    help="--p4runtime: '<network>/<len> <port>' lines: the switch port of each subscriber address",
)
@click.option(
    "--grace",
    type=click.FloatRange(0.0),
    default=0.05,
    show_default=True,
    help="--p4runtime: seconds between a root switch and deleting the entries only the old root used",
)
@click.option("--listen", required=True, help="ADDR:PORT for requests (UDP and TCP)")
@click.option(
    "--rules",
    type=click.Path(dir_okay=False, exists=True),
    help="subscriptions made at every start: '<condition> TO <ip>:<port>' per line",
)
@click.option(
    "--state",
    "state_dir",
    type=click.Path(file_okay=False),
    help="directory of the subscription store (SQLite, WAL); without it nothing survives a restart",
)
@click.option("--lease", type=click.FloatRange(min=0.05), help="seconds a subscription lives unless renewed")
@click.option("--acl", type=click.Path(dir_okay=False, exists=True), help="ACL and limits (TOML, docs/serve.md)")
@click.option("--metrics", help="ADDR:PORT of the Prometheus metrics")
@click.option(
    "--field-order",
    help="comma-separated fields the data path tests (default: every query field, "
    "exact ones first, then lpm, then range)",
)
@click.option(
    "--capacity",
    type=click.IntRange(1),
    default=100_000,
    show_default=True,
    help="live subscriptions the maps are sized for",
)
@click.option("--xdp-mode", type=click.Choice(["auto", "native", "generic"]), default="auto", show_default=True)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info", show_default=True)
@click.option(
    "--journal",
    is_flag=True,
    help="journal every copy sent (under STATE/journal/ with --state, else in memory): MoldUDP64 "
    "re-requests with --rerequest, SoupBinTCP users with --soup (docs/recovery.md)",
)
@click.option(
    "--journal-pages",
    type=click.IntRange(1, 1 << 20),
    default=4096,
    show_default=True,
    help="the journal's ring buffer, in 4 KiB pages (a power of 2)",
)
@click.option("--retain", metavar="SECONDS|BYTES", help="keep each stream's journal within this age and/or size")
@click.option(
    "--segment-bytes", metavar="BYTES", default="64MiB", show_default=True, help="size of a journal segment file"
)
@click.option("--rerequest", metavar="ADDR:PORT", help="serve MoldUDP64 re-requests on this UDP address")
@click.option(
    "--rerequest-rate", type=float, default=100.0, show_default=True, help="re-requests per second per source host"
)
@click.option(
    "--soup",
    metavar="ADDR:PORT",
    help="serve SoupBinTCP 4.1 on this TCP address: the ACL's [[login]] users, each its own "
    "stream; requests as Unsequenced Data",
)
@click.option(
    "--cluster",
    metavar="ENDPOINTS",
    help="share subscriptions with other brokers through etcd at these comma-separated client "
    "endpoints (host:port); needs --node and --journal (README, 'Brokers on several hosts')",
)
@click.option("--node", help="--cluster: this broker's name, unique among the live brokers")
@click.option(
    "--cluster-prefix",
    default="/subc/",
    show_default=True,
    help="--cluster: the etcd key prefix of the cluster's state",
)
@click.option(
    "--cluster-ttl",
    type=click.IntRange(2, 600),
    default=5,
    show_default=True,
    help="--cluster: seconds of this broker's etcd lease: a broker that stops renewing it stops "
    "delivering before that, and its subscribers move to the others after it",
)
@click.option(
    "--cluster-reconcile",
    type=click.FloatRange(1.0),
    default=30.0,
    show_default=True,
    help="--cluster: seconds between reads of the whole prefix that catch what a watch missed",
)
@click.option(
    "--cluster-lead",
    type=click.FloatRange(0.0, 60.0),
    default=0.05,
    show_default=True,
    help="--cluster: a change takes effect this many seconds of feed (at its rate) after the "
    "position the broker that takes the request has reached, the same position on every broker",
)
@click.option(
    "--cluster-lead-messages",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="--cluster: and at least this many messages after it",
)
@limit_options
def serve_cmd(
    spec_path: str,
    iface: str | None,
    p4rt: str | None,
    device_id: int,
    election_id: tuple[int, int],
    program: str | None,
    config: str | None,
    port_map: str | None,
    grace: float,
    listen: str,
    rules: str | None,
    state_dir: str | None,
    lease: float | None,
    acl: str | None,
    metrics: str | None,
    field_order: str | None,
    capacity: int,
    xdp_mode: str,
    log_level: str,
    journal: bool,
    journal_pages: int,
    retain: str | None,
    segment_bytes: str,
    rerequest: str | None,
    rerequest_rate: float,
    soup: str | None,
    cluster: str | None,
    node: str | None,
    cluster_prefix: str,
    cluster_ttl: int,
    cluster_reconcile: float,
    cluster_lead: float,
    cluster_lead_messages: int,
    max_rules: int,
    max_states: int,
) -> None:
    """Run the live broker on IFACE: subscribers come and go with SUBSCRIBE/UNSUBSCRIBE requests
    (docs/serve.md, "Live subscriptions"); the data path stays loaded when the daemon stops, and a
    restarted daemon takes it over.  Logs are JSON lines on stderr.

    With --p4runtime, the subscriptions are entries of a switch running a program of subc
    serve-program (docs/p4runtime.md, "Live subscriptions on a switch")."""
    import logging
    import signal
    from ..dataplane.ebpf.bpf import require_root
    from ..serve.acl import load_acl
    from ..serve.config import ClusterOptions
    from ..serve.daemon import Daemon, JsonFormatter, ServeConfig, SwitchOptions
    from ..serve.dataplane import default_field_order

    one_of(iface, p4rt)
    switch = None
    if p4rt:
        if not program or not port_map:
            raise click.UsageError("--p4runtime needs --program (subc serve-program) and --port-map")
        switch = SwitchOptions(p4rt, program, port_map, config, device_id, election_id, grace)

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.getLogger("subc.serve").addHandler(handler)
    logging.getLogger("subc.serve").setLevel(log_level.upper())
    try:
        if not p4rt:
            require_root("subc serve")
        spec = open_spec(spec_path)
        if field_order:
            order = [f.strip() for f in field_order.split(",") if f.strip()]
        elif program:
            from pathlib import Path

            order = json.loads((Path(program) / "serve.json").read_text())["field_order"]
        else:
            order = default_field_order(spec)
        if (rerequest or soup or retain) and not journal:
            raise SubcError("--rerequest, --soup and --retain need --journal")
        if journal and p4rt:
            raise SubcError("--journal: a P4 switch's copies do not pass through this host (eBPF only)")
        cluster_options = None
        if cluster or node:
            from ..cluster.records import check_node_name, check_prefix

            if not (cluster and node):
                raise SubcError("--cluster and --node go together")
            cluster_options = ClusterOptions(
                [e.strip() for e in cluster.split(",") if e.strip()],
                check_node_name(node),
                check_prefix(cluster_prefix),
                cluster_ttl,
                cluster_reconcile,
                cluster_lead,
                cluster_lead_messages,
            )
        journal_options = None
        if journal:
            from .journal_cmds import service_options

            journal_options = service_options(state_dir, retain, segment_bytes, rerequest, rerequest_rate, soup)
        cfg = ServeConfig(
            spec,
            iface or "",
            ip_port(listen),
            order,
            state_dir,
            rules,
            lease,
            load_acl(acl),
            ip_port(metrics) if metrics else None,
            capacity,
            limits_of(max_rules, max_states),
            xdp_mode,
            switch=switch,
            journal=journal_options,
            journal_pages=journal_pages if journal else 0,
            cluster=cluster_options,
        )
        daemon = Daemon(cfg)
        daemon.start()
    except SubcError as e:
        fail(e)
    except OSError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)

    def stop(signum, frame):
        daemon.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    click.echo(
        f"serving on {cfg.listen[0]}:{daemon.port} (UDP and TCP); {len(daemon.subs)} subscriptions restored", err=True
    )
    daemon.serve_forever()
    daemon.stop()
