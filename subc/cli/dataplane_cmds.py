"""Loading a compiled rule set on a data plane and running it: ``subc load``, ``update``, ``unload``,
``fanout``, ``verify`` and ``stats``, on an interface (eBPF) or a switch (P4Runtime)."""

from __future__ import annotations

import json
import sys
import time

import click

from ..errors import SubcError
from .app import fail, main, one_of, p4runtime_options, record_option
from .journal_cmds import DEFAULT_JOURNAL_PAGES, journal_options, run_service


def p4rt_load(
    out_dir: str,
    p4rt: str,
    device_id: int,
    election_id: tuple[int, int],
    config: str | None,
    record_dir: str | None = None,
) -> None:
    """``subc load --p4runtime``: load ``out_dir`` on the switch, print what was written."""
    from ..dataplane.p4rt.control import load

    t = time.perf_counter()
    try:
        w = load(out_dir, p4rt, device_id, election_id, config, record_dir)
    except SubcError as e:
        fail(e)
    click.echo(
        f"loaded {out_dir} on {p4rt} (device {device_id}){' with its pipeline' if config else ''}: "
        f"{w.phases['groups']} multicast groups, {w.phases['entries']} entries, root last; "
        f"{time.perf_counter() - t:.2f} s"
    )


@main.command("load")
@click.argument("out_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--iface", help="interface the market data arrives on (eBPF)")
@p4runtime_options
@click.option(
    "--config",
    type=click.Path(dir_okay=False, exists=True),
    help="--p4runtime: set the forwarding pipeline first, with OUT_DIR/p4info.txtpb and this device "
    "config (BMv2: the JSON p4c-bm2-ss writes for subc.p4)",
)
@record_option
@click.option("--subscribers", type=click.Path(dir_okay=False, exists=True), help="subscribers file (TOML)")
@click.option("--xdp-mode", type=click.Choice(["auto", "native", "generic"]), default="auto", show_default=True)
@click.option(
    "--capacity-factor",
    type=float,
    default=2.0,
    show_default=True,
    help="map capacity as a multiple of the compiled entries (2: room for one update)",
)
@click.option(
    "--fix-links/--no-fix-links",
    default=True,
    show_default=True,
    help="turn GRO on at veth peers of subscriber interfaces that would drop XDP-redirected copies",
)
@click.option(
    "--fanout/--no-fanout",
    default=True,
    show_default=True,
    help="build copies in devmap egress programs (XDP fan-out; driver-mode XDP only), else in TC",
)
@click.option(
    "--fan-ratio",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="broadcast a datagram whose recipients span interfaces to every endpoint (dropping the "
    "clones of non-recipients) when the endpoints are at most this many times its recipients; "
    "above 1, faster, but a bulk of dropped clones loses the kernel's flush and can delay "
    'copies (docs/ebpf.md, "XDP fan-out")',
)
@click.option(
    "--journal",
    is_flag=True,
    help="journal every copy sent (a BPF ring buffer to user space) and run the recovery service in "
    "the foreground until SIGINT or SIGTERM (subc journal's options; docs/recovery.md)",
)
@click.option(
    "--journal-pages",
    type=click.IntRange(1, 1 << 20),
    default=DEFAULT_JOURNAL_PAGES,
    show_default=True,
    help="the journal's ring buffer, in 4 KiB pages (a power of 2)",
)
@journal_options
def load_cmd(
    out_dir: str,
    iface: str | None,
    p4rt: str | None,
    device_id: int,
    election_id: tuple[int, int],
    record_dir: str | None,
    config: str | None,
    subscribers: str | None,
    xdp_mode: str,
    capacity_factor: float,
    fix_links: bool,
    fanout: bool,
    fan_ratio: int,
    journal: bool,
    journal_pages: int,
    state: str | None,
    segment_bytes: str,
    retain: str | None,
    rerequest: str | None,
    rerequest_rate: float,
    soup: str | None,
    metrics: str | None,
) -> None:
    """Load an eBPF output directory on IFACE: XDP + TC ingress, maps filled and pinned.  The
    subscribers' interfaces are checked first (missing, down, MTU below IFACE's, veth peers that
    drop XDP-redirected frames); findings are printed on stderr.

    With --p4runtime, load a bmv2/tofino output directory on a switch: its multicast groups and
    entries, then the root state (docs/p4runtime.md, "Loading a switch over P4Runtime").

    With --journal, every copy sent is also journaled and the recovery service runs in the
    foreground (as subc journal); with --rerequest, it answers MoldUDP64 re-requests."""
    one_of(iface, p4rt)
    if (state or retain or rerequest or soup or metrics) and not journal:
        fail(SubcError("--state, --retain, --rerequest, --soup and --metrics need --journal"))
    if p4rt:
        p4rt_load(out_dir, p4rt, device_id, election_id, config, record_dir)
        return
    from ..dataplane.ebpf.broker import load

    assert iface is not None  # one_of: --iface when not --p4runtime
    try:
        loaded = load(
            out_dir,
            iface,
            subscribers,
            xdp_mode,
            capacity_factor,
            fix_links,
            fanout,
            fan_ratio,
            journal_pages=journal_pages if journal else 0,
        )
    except SubcError as e:
        fail(e)
    report_load(out_dir, iface, subscribers, loaded)
    if journal:
        run_service(iface, state, retain, rerequest, rerequest_rate, segment_bytes, soup, metrics)


def report_load(out_dir: str, iface: str, subscribers: str | None, state: dict) -> None:
    """Print what ``subc load`` did on an interface."""
    for lp in state.get("links", []):
        click.echo(f"{'fixed' if lp['fixed'] else lp['severity']}: {lp['message']}", err=True)
    for msg in state.get("cleared", []):
        click.echo(f"note: {msg}", err=True)
    p = state["programs"]
    mode = "filter mode: matches go to the local stack" if not subscribers else f"subscribers {subscribers}"
    click.echo(
        f"loaded {out_dir} on {iface} ({mode}); XDP {p['xdp']['xlated_insns']} instructions (id {p['xdp']['id']}), "
        f"TC {p['tc']['xlated_insns']} instructions (id {p['tc']['id']}); maps pinned under {state['pins']}/"
    )
    fan = state.get("fanout") or {}
    click.echo(
        f"XDP fan-out: {'on' if fan.get('enabled') else 'off'}"
        + (
            f" ({fan['device_maps']} device maps, {fan['groups']} interfaces)"
            if fan.get("enabled")
            else f" ({fan.get('reason', 'not requested')}): copies to several recipients are built in TC"
        )
    )


@main.command("unload")
@click.option("--iface", required=True)
def unload_cmd(iface: str) -> None:
    """Detach subc from IFACE and remove its pinned maps and state."""
    from ..dataplane.ebpf.broker import unload

    try:
        unload(iface)
    except SubcError as e:
        fail(e)
    click.echo(f"unloaded subc from {iface}")


@main.command("update")
@click.argument("out_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--iface")
@p4runtime_options
@click.option(
    "--grace",
    type=click.FloatRange(0.0),
    default=0.05,
    show_default=True,
    help="--p4runtime: seconds between the root switch and deleting the old entries",
)
@record_option
def update_cmd(
    out_dir: str,
    iface: str | None,
    p4rt: str | None,
    device_id: int,
    election_id: tuple[int, int],
    grace: float,
    record_dir: str | None,
) -> None:
    """Swap in a recompiled rule set on IFACE under traffic (generation switch).

    With --p4runtime, on a switch: only the entries of states the switch lacks are written, the
    root is switched in one write, then the entries only the old rule set used are deleted."""
    one_of(iface, p4rt)
    if p4rt:
        import gc

        # a one-shot process: what it allocates lives until it exits.  update() pauses the cycle
        # collector, which would otherwise scan it all once after (10-30 ms), and free nothing
        gc.disable()
        from ..dataplane.p4rt.control import update as p4rt_update

        t = time.perf_counter()
        try:
            w = p4rt_update(out_dir, p4rt, device_id, election_id, grace, record_dir)
        except SubcError as e:
            fail(e)
        p = w.plan
        assert p is not None  # update() planned what it wrote
        source = "the writer's record" if w.source == "record" else w.source
        click.echo(
            f"{p4rt}: {out_dir} live; {'root switched, ' if p.root is not None else 'no change to the root, '}"
            f"{len(p.inserts)} entries inserted, {len(p.modifies)} modified and "
            f"{w.phases['spare_deletes'] + w.phases['deletes']} deleted, {w.phases['groups']} multicast groups "
            f"written and {w.phases['group_deletes']} deleted; "
            f"{p.kept_states} states kept, {p.new_states} new; planned from {source}; live after "
            f"{w.live_s * 1000:.1f} ms, done after {time.perf_counter() - t:.3f} s"
        )
        return
    from ..dataplane.ebpf.broker import update

    assert iface is not None  # one_of: --iface when not --p4runtime
    try:
        r = update(out_dir, iface)
    except SubcError as e:
        fail(e)
    click.echo(f"{iface}: generation {r.gen} live; {r.written} entries written, {r.deleted} old entries deleted")


@main.command("fanout")
@click.option("--iface", required=True)
@click.option(
    "--interval", type=click.FloatRange(min=0.0001), default=0.005, show_default=True, help="seconds between passes"
)
@click.option("--once", is_flag=True, help="one pass, then exit")
@click.option(
    "--idle",
    type=click.FloatRange(min=0.0),
    default=1.0,
    show_default=True,
    help="seconds without a datagram after which a set's map may give way to a new set when all maps are in use",
)
def fanout_cmd(iface: str, interval: float, once: bool, idle: float) -> None:
    """Run the XDP fan-out's control loop on IFACE: make an exact recipient-set device map for every
    set of recipients on several interfaces that XDP has seen (until then such datagrams take the
    broadcast-to-every-endpoint or TC way), until subc is unloaded or the command is interrupted.
    When every map is in use, the maps of idle sets are reused."""
    from ..dataplane.ebpf.broker import fanout_sets

    try:
        res = fanout_sets(iface, interval, once, idle_s=idle)
    except SubcError as e:
        fail(e)
    except KeyboardInterrupt:
        return
    click.echo(json.dumps(res))


@main.command("verify")
@click.argument("out_dir", type=click.Path(file_okay=False, exists=True))
@p4runtime_options
@record_option
def verify_cmd(
    out_dir: str, p4rt: str | None, device_id: int, election_id: tuple[int, int], record_dir: str | None
) -> None:
    """Read every entry of the switch back and compare it with OUT_DIR/entries.json (up to the
    numbering of states and multicast groups that updates choose), and with the writer's record
    of the switch (exactly; a record that differs is removed).  Exit status 1 when they differ,
    each difference on a line."""
    from ..dataplane.p4rt.control import verify

    if not p4rt:
        raise click.UsageError("verify needs --p4runtime HOST:PORT")
    try:
        diff = verify(out_dir, p4rt, device_id, election_id, record_dir)
    except SubcError as e:
        fail(e)
    for line in diff:
        click.echo(line)
    if diff:
        sys.exit(1)
    click.echo(f"{p4rt}: every entry of {out_dir} is on the switch, and nothing else")


@main.command("stats")
@click.option("--iface")
@p4runtime_options
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def stats_cmd(iface: str | None, p4rt: str | None, device_id: int, election_id: tuple[int, int], as_json: bool) -> None:
    """Print the broker's counters on IFACE: global, per subscriber, per leaf.  With --p4runtime,
    a switch's entries per table and its counters."""
    one_of(iface, p4rt)
    from ..dataplane.ebpf.broker_stats import stats
    from ..dataplane.p4rt.control import stats as p4rt_stats

    try:
        if p4rt:
            doc = p4rt_stats(p4rt, device_id, election_id)
        else:
            assert iface is not None  # one_of: --iface when not --p4runtime
            doc = stats(iface)
    except SubcError as e:
        fail(e)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    if p4rt:
        click.echo(f"{p4rt} (device {device_id})")
        for name, n in doc["tables"].items():
            click.echo(f"  {n:>10}  {name}")
        for name, cells in doc["counters"].items():
            for idx, pk, by in cells:
                if pk or by:
                    click.echo(f"  {name}[{idx}]: {pk} packets, {by} bytes")
        return
    click.echo(f"{iface}: generation {doc['generation']}")
    for k, v in doc["stats"].items():
        click.echo(f"  {k:<14} {v:>12}")
    click.echo("subscriber    datagrams     messages        bytes     next_seq")
    for sid, c in doc["subscribers"].items():
        click.echo(
            f"  {sid:>8} {c['datagrams']:>12} {c['messages']:>12} {c['bytes']:>12} {c['next_seq']:>12}  "
            f"{c['name'] or ''}"
        )
    click.echo("leaf state     messages        bytes  action")
    for st, c in doc["leaves"].items():
        click.echo(f"  {st:>8} {c['messages']:>12} {c['bytes']:>12}  {c['action']}")
    if doc.get("journal"):
        echo_journal(doc["journal"])
    if doc.get("cluster"):
        c = doc["cluster"]
        click.echo(
            f"cluster: node {c['node']}, applied revision {c['applied']} (etcd at {c['etcd_revision']}, lag "
            f"{c['lag']}; watch {c.get('status_delay_s', 0) * 1000:.1f} ms), {'fenced' if c['fenced'] else 'live'}, "
            f"delivers to {c['delivers_to']} of {c['endpoints']} endpoints, {c.get('late_changes', 0)} late changes, "
            f"{c.get('scheduled_switches', 0)} switches scheduled"
        )


def echo_journal(j: dict) -> None:
    """The journal part of ``subc stats``."""
    svc = j["service"]
    click.echo(
        f"journal: ring {j['ring_bytes']} bytes, "
        + (
            "no journal service has run (subc journal)"
            if svc is None
            else f"service pid {svc['pid']}, "
            f"status of {time.strftime('%H:%M:%S', time.localtime(svc['updated']))}, {svc['held']} held"
        )
    )
    subs = (svc or {}).get("subscribers", {})
    click.echo("subscriber    first_seq     next_seq        bytes  not_journaled  retention_drops")
    for sid in sorted(set(subs) | set(j["lost_messages"]), key=int):
        s = subs.get(sid, {})
        click.echo(
            f"  {sid:>8} {s.get('first_seq', '-'):>12} {s.get('next_seq', '-'):>12} {s.get('bytes', '-'):>12} "
            f"{j['lost_messages'].get(sid, 0):>14} {s.get('dropped_by_retention', '-'):>16}"
        )
    rr = (svc or {}).get("rerequest")
    if rr:
        figures = ", ".join(f"{k} {v}" for k, v in sorted(rr.items()) if k != "address")
        click.echo(f"request server {rr['address'][0]}:{rr['address'][1]}: {figures}")
    soup = (svc or {}).get("soup")
    if soup:
        figures = ", ".join(f"{k} {v}" for k, v in sorted(soup["counters"].items()))
        click.echo(f"SoupBinTCP {soup['address'][0]}:{soup['address'][1]}: {len(soup['sessions'])} sessions; {figures}")
        for c in soup["sessions"]:
            click.echo(f"  {c}")
