"""The ``subc`` command line (click).

Exit status: 0 on success, 1 when a simulation finds disagreements, 2 on bad input (with a
``file:line:col: error:`` diagnostic on stderr).
"""

from __future__ import annotations

import json
import sys
import time

import click

from . import __version__
from .errors import SubcError


def _fail(e: SubcError) -> None:
    click.echo(e.render(), err=True)
    sys.exit(2)


def _limits(max_rules: int | None, max_states: int | None):
    from dataclasses import replace

    from .compiler.limits import DEFAULT_LIMITS as d

    return replace(d, max_rules=max_rules or d.max_rules, max_states=max_states or d.max_states)


def limit_options(f):
    """The ``--max-rules`` and ``--max-states`` options (:class:`subc.compiler.limits.Limits`)."""
    from .compiler.limits import DEFAULT_LIMITS as d

    f = click.option(
        "--max-states",
        type=click.IntRange(1),
        default=d.max_states,
        show_default=True,
        help="states of all stages allowed while slicing (before minimisation)",
    )(f)
    return click.option(
        "--max-rules",
        type=click.IntRange(1),
        default=d.max_rules,
        show_default=True,
        help="rules allowed per rule file",
    )(f)


def _compile(
    rules_path: str,
    spec_path: str,
    target: str,
    field_order: str | None,
    progress=None,
    limits=None,
    capacity_factor: float = 2.0,
    state_bits: int = 0,
):
    from .compiler.driver import compile_rules
    from .compiler.limits import DEFAULT_LIMITS
    from .compiler.rules import load_rules
    from .compiler.spec import load_spec

    limits = limits or DEFAULT_LIMITS
    t0 = time.perf_counter()
    spec = load_spec(spec_path)
    rules = load_rules(rules_path, spec, limits)
    t_parse = time.perf_counter() - t0
    if progress:
        progress.next()
    order = [f.strip() for f in field_order.split(",") if f.strip()] if field_order else None
    res = compile_rules(
        rules, spec, target, order, limits=limits, capacity_factor=capacity_factor, state_bits=state_bits
    )
    res.phases = {"parse": t_parse, **res.phases}
    if progress:
        progress.next()
    return res


def _terminate(signum, frame):
    raise SystemExit(128 + signum)  # unwinds: temporary outputs are removed (finally blocks run)


@click.group()
@click.version_option(__version__, prog_name="subc")
def main() -> None:
    """subc: compile packet subscriptions into data-plane pipelines."""
    import signal

    signal.signal(signal.SIGTERM, _terminate)


@main.command("compile")
@click.argument("rules", type=click.Path(dir_okay=False))
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="message-format spec (P4_16)")
@click.option("--target", type=click.Choice(["bmv2", "tofino", "ebpf"]), default="bmv2", show_default=True)
@click.option("-o", "--output", "out_dir", default="out", show_default=True, type=click.Path(file_okay=False))
@click.option("--field-order", help="comma-separated field order (overrides the heuristic)")
@click.option("--dot", is_flag=True, help="also write the BDD as bdd.dot")
@click.option(
    "--timings",
    type=click.Path(dir_okay=False),
    help="write the time of each phase (s) to this JSON file (outputs stay byte-identical)",
)
@click.option(
    "--max-messages",
    type=int,
    default=8,
    show_default=True,
    help="bmv2/tofino: messages of a MoldUDP64 datagram classified per pass (more: to --overflow-port)",
)
@click.option(
    "--overflow-port",
    type=int,
    default=None,
    help="bmv2/tofino: switch port of datagrams the switch cannot split (default: dropped, counted)",
)
@click.option(
    "--capacity-factor",
    type=click.FloatRange(1.0),
    default=2.0,
    show_default=True,
    help="bmv2/tofino: declared table sizes as a multiple of the entries (2: room for an update "
    "over P4Runtime, which writes new entries before it deletes old ones)",
)
@click.option(
    "--state-bits",
    type=click.IntRange(0, 32),
    default=0,
    help="bmv2/tofino: the least width of the state field, so that updates over P4Runtime can load "
    "rule sets with more states into this program (default: one bit more than it needs)",
)
@limit_options
def compile_cmd(
    rules: str,
    spec_path: str,
    target: str,
    out_dir: str,
    field_order: str | None,
    dot: bool,
    timings: str | None,
    max_messages: int,
    overflow_port: int | None,
    capacity_factor: float,
    state_bits: int,
    max_rules: int,
    max_states: int,
) -> None:
    """Compile RULES into a P4 program and control-plane entries in OUTPUT (written atomically)."""
    from .compiler.targets import target_files
    from .compiler.targets.output import write_directory

    from .compiler.gcpause import paused_gc
    from .progress import PhaseProgress

    try:
        with paused_gc(), PhaseProgress(["parsing", "compiling", "generating", "writing"]) as progress:
            res = _compile(
                rules,
                spec_path,
                target,
                field_order,
                progress,
                _limits(max_rules, max_states),
                capacity_factor,
                state_bits,
            )
            files, phases = target_files(res, rules, dot, max_messages, overflow_port)
            progress.next()
            t = time.perf_counter()
            write_directory(out_dir, files)
            progress.next()
            if timings:
                phases = {**phases, "write": time.perf_counter() - t}
                _write_text(timings, json.dumps({k: round(v, 6) for k, v in phases.items()}, indent=1) + "\n")
            summary = _compile_summary(res, files, target, spec_path, out_dir)
            # freed by reference counting while the collector is still paused: once it is back, it
            # would first traverse every object of the compile (0.2 s for 100K rules)
            del res, files
    except SubcError as e:
        _fail(e)
    for text, err in summary:
        click.echo(text, err=err)


def _compile_summary(res, files: dict[str, str], target: str, spec_path: str, out_dir: str) -> list[tuple[str, bool]]:
    """The lines ``subc compile`` prints: (text, to stderr)."""
    if target == "ebpf":
        doc = json.loads(files["report.json"])
        return [
            (
                f"compiled {len(res.rules)} rules for ebpf: field order {', '.join(res.ir.field_order) or '(none)'}; "
                f"{len(doc['maps'])} maps, {doc['total_entries']} entries, {doc['leaf_states']} leaf states "
                f"-> {out_dir}/",
                False,
            )
        ]
    out = []
    if not res.spec.whole_program:
        out.append(
            (
                f"note: {spec_path} declares no headers or parser: wrote the control block only "
                "(subc_control.p4), not a whole program",
                True,
            )
        )
    pipe = res.pipeline
    doc = json.loads(files["report.json"])
    msgs = doc.get("messages") or {}
    if msgs.get("mode") == "multi":  # the installed program: every table once per message slot
        shape = (
            f"{msgs['tables']} tables ({msgs['tables_per_slot']} per message slot, {msgs['max_messages']} slots), "
            f"{msgs['entries_installed']} entries, {msgs['multicast_groups']} multicast groups"
        )
    else:
        shape = f"{len(pipe.tables)} tables, {pipe.total_entries} entries, {doc['multicast_groups']} multicast groups"
    out.append(
        (
            f"compiled {len(res.rules)} rules for {target}: field order {', '.join(pipe.field_order) or '(none)'}; "
            f"{shape} -> {out_dir}/",
            False,
        )
    )
    return out


@main.command("check")
@click.argument("rules", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="message-format spec (P4_16)")
@click.option("--target", type=click.Choice(["bmv2", "tofino", "ebpf"]), default="bmv2", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "github"]), default="text", show_default=True)
@click.option("--strict", is_flag=True, help="exit 1 on warnings too")
@click.option("--no-load", is_flag=True, help="ebpf: do not load the program to count its instructions")
@click.option(
    "--max-messages",
    type=int,
    default=8,
    show_default=True,
    help="tofino: stages for K = 1, 2, 4, ... up to this many messages per datagram",
)
@limit_options
def check_cmd(
    rules: tuple[str, ...],
    spec_path: str,
    target: str,
    fmt: str,
    strict: bool,
    no_load: bool,
    max_messages: int,
    max_rules: int,
    max_states: int,
) -> None:
    """Check RULES for CI: errors, rules that never match or change nothing, conflicting actions,
    and target fit.  Exit status 0 when clean (warnings allowed unless --strict), 1 on errors, 2
    when the input cannot be read."""
    from .checker.diagnostics import render_github, render_text
    from .checker.run import check, report_json, summary_line

    try:
        rep = check(
            list(rules),
            spec_path,
            target,
            _limits(max_rules, max_states),
            load_ebpf=not no_load,
            max_messages=max_messages,
        )
    except SubcError as e:
        if fmt == "github":
            from .checker.diagnostics import Diagnostic

            click.echo(render_github(Diagnostic.from_error(e)))
        _fail(e)
    if fmt == "json":
        click.echo(json.dumps(report_json(rep), indent=1))
    else:
        render = render_github if fmt == "github" else render_text
        for d in rep.diagnostics:
            click.echo(render(d))
        click.echo(summary_line(rep), err=fmt == "github")
    sys.exit(rep.exit_status(strict))


@main.command("simulate")
@click.argument("rules", type=click.Path(dir_okay=False))
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False))
@click.option(
    "--trace",
    required=True,
    type=click.Path(dir_okay=False),
    help="BinaryFILE, or pcap/pcapng capture of MoldUDP64 datagrams",
)
@click.option("--target", type=click.Choice(["bmv2", "tofino"]), default="bmv2", show_default=True)
@click.option("--strict", is_flag=True, help="a foreign frame or a message the spec cannot decode is an error")
@click.option(
    "--udp-port",
    type=click.IntRange(0, 65535),
    help="capture: the feed's UDP port (default: the spec's, else the capture's MoldUDP64 port)",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option(
    "--copies",
    "copies_dir",
    type=click.Path(file_okay=False),
    help="write each port's copies (its messages of each datagram, its own sequence numbers) as DIR/port_P.pcap",
)
def simulate_cmd(
    rules: str,
    spec_path: str,
    trace: str,
    target: str,
    strict: bool,
    udp_port: int | None,
    as_json: bool,
    copies_dir: str | None,
) -> None:
    """Run every message of TRACE through the reference semantics and the compiled tables."""
    from .compiler.targets.output import write_directory
    from .runtime.simulate import copies_pcaps, simulate_trace

    try:
        res = _compile(rules, spec_path, target, None)
        out = simulate_trace(res, trace, strict, udp_port, copies=copies_dir is not None)
        if copies_dir is not None:
            write_directory(copies_dir, copies_pcaps(out.port_copies))
    except SubcError as e:
        _fail(e)
    doc = out.as_json()
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    else:
        click.echo(f"messages read:        {doc['messages']}")
        click.echo(f"classified:           {doc['classified']} (messages with every header the rules test)")
        click.echo(f"zero-length prefixes: {doc['zero_length_fallbacks']} (length taken from the spec's message type)")
        for kind, n in doc["problems"].items():
            click.echo(f"not decoded:          {n} {kind.replace('_', ' ')}")
        for e in doc["problem_examples"][:5]:
            click.echo(f"  {e['where']}: {e['message']}")
        if doc["capture"]:
            counts = ", ".join(f"{k} {v}" for k, v in doc["capture"].items() if isinstance(v, int) and v)
            click.echo(f"capture:              {counts}")
        click.echo(f"unicast deliveries:   {doc['unicast_deliveries']}")
        click.echo(f"multicast deliveries: {doc['multicast_deliveries']}")
        for port, n in doc["per_port"].items():
            click.echo(f"  port {port:>3}: {n} messages")
        for action, n in doc["actions"].items():
            click.echo(f"  {action}: {n} messages")
        click.echo(f"matched no rule:      {doc['no_rule_matched']}")
        click.echo(f"disagreements:        {doc['disagreements']}")
    sys.exit(1 if out.disagreements else 0)


def _endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"'{text}' is not IP:PORT")
    return host or "0.0.0.0", int(port)


def _election_id(_ctx, _param, value: str) -> tuple[int, int]:
    try:
        hi, lo = (int(x, 0) for x in value.split(","))
        if hi < 0 or lo < 0 or (hi, lo) == (0, 0):
            raise ValueError
    except ValueError:
        raise click.BadParameter(f"'{value}' is not HIGH,LOW (two integers, not both 0)") from None
    return hi, lo


def p4runtime_options(fn):
    """--p4runtime HOST:PORT, --device-id, --election-id (P4Runtime spec v1.3 section 5)."""
    fn = click.option(
        "--election-id",
        default="0,1",
        show_default=True,
        callback=_election_id,
        help="P4Runtime election id HIGH,LOW (the highest is the primary controller)",
    )(fn)
    fn = click.option(
        "--device-id",
        type=click.IntRange(0),
        default=0,
        show_default=True,
        help="P4Runtime device id (simple_switch_grpc: --device-id, default 0)",
    )(fn)
    return click.option(
        "--p4runtime",
        "p4rt",
        metavar="HOST:PORT",
        help="a switch's P4Runtime server (bmv2/tofino outputs) instead of --iface",
    )(fn)


def _one_of(iface: str | None, p4rt: str | None) -> None:
    if bool(iface) == bool(p4rt):
        raise click.UsageError("give one of --iface (the eBPF data path) and --p4runtime (a switch)")


def _p4rt_load(out_dir: str, p4rt: str, device_id: int, election_id: tuple[int, int], config: str | None) -> None:
    from .runtime.p4rt.control import load

    t = time.perf_counter()
    try:
        w = load(out_dir, p4rt, device_id, election_id, config)
    except SubcError as e:
        _fail(e)
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
    "copies (docs/ebpf.md, \"XDP fan-out\")",
)
def load_cmd(
    out_dir: str,
    iface: str | None,
    p4rt: str | None,
    device_id: int,
    election_id: tuple[int, int],
    config: str | None,
    subscribers: str | None,
    xdp_mode: str,
    capacity_factor: float,
    fix_links: bool,
    fanout: bool,
    fan_ratio: int,
) -> None:
    """Load an eBPF output directory on IFACE: XDP + TC ingress, maps filled and pinned.  The
    subscribers' interfaces are checked first (missing, down, MTU below IFACE's, veth peers that
    drop XDP-redirected frames); findings are printed on stderr.

    With --p4runtime, load a bmv2/tofino output directory on a switch: its multicast groups and
    entries, then the root state (docs/p4runtime.md, "Loading a switch over P4Runtime")."""
    _one_of(iface, p4rt)
    if p4rt:
        _p4rt_load(out_dir, p4rt, device_id, election_id, config)
        return
    from .runtime.broker import load

    try:
        state = load(out_dir, iface, subscribers, xdp_mode, capacity_factor, fix_links, fanout, fan_ratio)
    except SubcError as e:
        _fail(e)
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
    from .runtime.broker import unload

    try:
        unload(iface)
    except SubcError as e:
        _fail(e)
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
def update_cmd(
    out_dir: str, iface: str | None, p4rt: str | None, device_id: int, election_id: tuple[int, int], grace: float
) -> None:
    """Swap in a recompiled rule set on IFACE under traffic (generation switch).

    With --p4runtime, on a switch: only the entries of states the switch lacks are written, the
    root is switched in one write, then the entries only the old rule set used are deleted."""
    _one_of(iface, p4rt)
    if p4rt:
        from .runtime.p4rt.control import update as p4rt_update

        t = time.perf_counter()
        try:
            w = p4rt_update(out_dir, p4rt, device_id, election_id, grace)
        except SubcError as e:
            _fail(e)
        p = w.plan
        click.echo(
            f"{p4rt}: {out_dir} live; {'root switched, ' if p.root is not None else 'no change to the root, '}"
            f"{len(p.inserts)} entries inserted, {len(p.modifies)} modified and "
            f"{w.phases['spare_deletes'] + w.phases['deletes']} deleted, {w.phases['groups']} multicast groups "
            f"written and {w.phases['group_deletes']} deleted; "
            f"{p.kept_states} states kept, {p.new_states} new; {time.perf_counter() - t:.2f} s"
        )
        return
    from .runtime.broker import update

    try:
        r = update(out_dir, iface)
    except SubcError as e:
        _fail(e)
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
    from .runtime.broker import fanout_sets

    try:
        res = fanout_sets(iface, interval, once, idle_s=idle)
    except SubcError as e:
        _fail(e)
    except KeyboardInterrupt:
        return
    click.echo(json.dumps(res))


@main.command("verify")
@click.argument("out_dir", type=click.Path(file_okay=False, exists=True))
@p4runtime_options
def verify_cmd(out_dir: str, p4rt: str | None, device_id: int, election_id: tuple[int, int]) -> None:
    """Read every entry of the switch back and compare it with OUT_DIR/entries.json (up to the
    numbering of states and multicast groups that updates choose).  Exit status 1 when they
    differ, each difference on a line."""
    from .runtime.p4rt.control import verify

    if not p4rt:
        raise click.UsageError("verify needs --p4runtime HOST:PORT")
    try:
        diff = verify(out_dir, p4rt, device_id, election_id)
    except SubcError as e:
        _fail(e)
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
    _one_of(iface, p4rt)
    from .runtime.broker import stats
    from .runtime.p4rt.control import stats as p4rt_stats

    try:
        doc = p4rt_stats(p4rt, device_id, election_id) if p4rt else stats(iface)
    except SubcError as e:
        _fail(e)
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


@main.command("serve-program")
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
@click.option("-o", "--output", "out_dir", default="serve-program", show_default=True, type=click.Path(file_okay=False))
def serve_program_cmd(
    spec_path: str, ports: str, target: str, field_order: str | None, capacity: int, max_messages: int, out_dir: str
) -> None:
    """Write the P4 program that subc serve --p4runtime fills with live subscriptions: a table
    per query field of the field order, every port of --ports, tables sized for --capacity
    (docs/p4runtime.md, "Live subscriptions on a switch").  Compile subc.p4 with the target's compiler."""
    from .compiler.spec import load_spec
    from .compiler.targets.output import write_directory
    from .compiler.targets.serve_program import serve_program
    from .runtime.serve.dataplane import default_field_order

    try:
        port_list = _port_list(ports)
        spec = load_spec(spec_path)
        order = [f.strip() for f in field_order.split(",") if f.strip()] if field_order else default_field_order(spec)
        files = serve_program(spec, order, port_list, capacity, target, max_messages)
        write_directory(out_dir, files)
    except SubcError as e:
        _fail(e)
    click.echo(
        f"wrote {out_dir}: {len(order)} field tables ({', '.join(order)}), ports {ports}, "
        f"room for {capacity} subscriptions"
    )


def _port_list(text: str) -> list[int]:
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

    from .compiler.spec import load_spec
    from .runtime.bpf import require_root
    from .runtime.serve.acl import load_acl
    from .runtime.serve.daemon import Daemon, JsonFormatter, ServeConfig, SwitchOptions
    from .runtime.serve.dataplane import default_field_order

    _one_of(iface, p4rt)
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
        spec = load_spec(spec_path)
        if field_order:
            order = [f.strip() for f in field_order.split(",") if f.strip()]
        elif program:
            from pathlib import Path

            order = json.loads((Path(program) / "serve.json").read_text())["field_order"]
        else:
            order = default_field_order(spec)
        cfg = ServeConfig(
            spec,
            iface or "",
            _endpoint(listen),
            order,
            state_dir,
            rules,
            lease,
            load_acl(acl),
            _endpoint(metrics) if metrics else None,
            capacity,
            _limits(max_rules, max_states),
            xdp_mode,
            switch=switch,
        )
        daemon = Daemon(cfg)
        daemon.start()
    except SubcError as e:
        _fail(e)
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


@main.command("replay")
@click.argument("trace", type=click.Path(dir_okay=False, exists=True))
@click.option("--to", "dest", required=True, help="IP:PORT to send to")
@click.option(
    "--speed",
    type=click.FloatRange(min=0),
    help="pace: the trace's timestamp gaps divided by this (2: twice as fast; 0: as fast as possible); "
    "default: 1 for a capture, as fast as possible for a BinaryFILE",
)
@click.option("--max", "max_speed", is_flag=True, help="as fast as possible (--speed 0)")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="messages per second (instead of --speed)")
@click.option("--pps", type=click.FloatRange(min=0, min_open=True), help="datagrams per second (instead of --speed)")
@click.option(
    "--count", type=click.IntRange(1), help="stop after this many datagrams (capture) or messages (BinaryFILE)"
)
@click.option(
    "--udp-port",
    "udp_ports",
    multiple=True,
    type=click.IntRange(0, 65535),
    help="capture: the feed port (repeatable; default: the most common destination port of its MoldUDP64 datagrams)",
)
@click.option(
    "--strict",
    is_flag=True,
    help="capture: any frame that is not a MoldUDP64 datagram to the feed port is an error (exit 2)",
)
@click.option(
    "--batch", type=click.IntRange(1, 65534), help="BinaryFILE: N messages per datagram instead of the packer"
)
@click.option(
    "--window", "window_ns", type=click.IntRange(0), help="BinaryFILE: packing window in ns [default: 100000]"
)
@click.option(
    "--max-payload", type=click.IntRange(22, 65507), help="BinaryFILE: largest UDP payload in bytes [default: 1400]"
)
@click.option("--session", help="BinaryFILE: MoldUDP64 session [default: SUBC000001]")
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False),
    help="check every message sent against this spec (not_decoded); a BinaryFILE's zero length prefixes "
    "take its lengths [default: ITCH 5.0's]",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def replay_cmd(
    trace: str,
    dest: str,
    speed: float | None,
    max_speed: bool,
    rate: float | None,
    pps: float | None,
    count: int | None,
    udp_ports: tuple[int, ...],
    strict: bool,
    batch: int | None,
    window_ns: int | None,
    max_payload: int | None,
    session: str | None,
    spec_path: str | None,
    as_json: bool,
) -> None:
    """Send TRACE to IP:PORT: a pcap/pcapng capture datagram by datagram as captured (payloads
    unchanged), a BinaryFILE packed into MoldUDP64 datagrams as a live feed does.  Exit 1 when
    nothing was sent, 2 on bad input (and with --strict on a foreign frame)."""
    from .runtime.replay import is_capture, replay

    try:
        if rate is not None and pps is not None:
            raise SubcError("--rate and --pps exclude each other")
        if max_speed:
            speed = 0.0
        elif speed is None and is_capture(trace):
            speed = 1.0
        decoder = None
        if spec_path:
            from .compiler.spec import load_spec
            from .runtime.decoder import MessageDecoder

            decoder = MessageDecoder(load_spec(spec_path))
        st = replay(
            trace,
            _endpoint(dest),
            rate=rate,
            batch=batch,
            session=session,
            count=count,
            speed=speed,
            pps=pps,
            window_ns=window_ns,
            max_payload=max_payload,
            ports=list(udp_ports) or None,
            strict=strict,
            log=lambda m: click.echo(m, err=True),
            decoder=decoder,
        )
    except SubcError as e:
        _fail(e)
    doc = st.as_json()
    if as_json:
        click.echo(json.dumps(doc))
    else:
        click.echo(
            f"sent {doc['messages']} messages in {doc['datagrams']} datagrams ({st.messages_per_datagram:.2f} "
            f"messages per datagram, max {st.max_messages}; {doc['bytes']} bytes) in {doc['seconds']:.3f} s "
            f"to {dest} ({doc['pacing']})"
        )
        if st.capture is not None:
            click.echo(f"capture: {st.capture.summary()}")
        if st.not_decoded:
            click.echo(
                "not decodable by the spec: "
                + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(st.not_decoded.items()))
            )
    if st.nothing_sent:
        click.echo(f"error: {st.nothing_sent}", err=True)
        sys.exit(1)


@main.command("listen")
@click.argument("bind")
@click.option("--count", type=click.IntRange(1), help="stop after this many datagrams")
@click.option("--timeout", type=float, help="stop after this many idle seconds")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object at the end")
@click.option("--save", type=click.Path(dir_okay=False), help="write the messages received as a BinaryFILE")
@click.option(
    "--save-pcap",
    type=click.Path(dir_okay=False),
    help="write every datagram received, payload unchanged, as a pcap (UDP over Ethernet/IP)",
)
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False),
    help="label messages by the spec's types and count those it cannot decode",
)
def listen_cmd(
    bind: str,
    count: int | None,
    timeout: float | None,
    as_json: bool,
    save: str | None,
    save_pcap: str | None,
    spec_path: str | None,
) -> None:
    """Receive MoldUDP64 on BIND (IP:PORT): count messages by type and sequence gaps.  Says
    "listening on IP:PORT" on stderr once the socket is bound."""
    from .runtime.listen import listen

    endpoint = _endpoint(bind)
    try:
        decoder = None
        if spec_path:
            from .compiler.spec import load_spec
            from .runtime.decoder import MessageDecoder

            decoder = MessageDecoder(load_spec(spec_path))
        st = listen(
            endpoint,
            count=count,
            timeout=timeout,
            save=save,
            save_pcap=save_pcap,
            decoder=decoder,
            on_ready=lambda: click.echo(f"listening on {endpoint[0]}:{endpoint[1]}", err=True),
        )
    except SubcError as e:
        _fail(e)
    doc = st.as_json()
    if as_json:
        click.echo(json.dumps(doc))
    else:
        for k in (
            "received",
            "messages",
            "by_type",
            "not_decoded",
            "gaps",
            "missing_messages",
            "duplicates",
            "malformed",
            "sha256",
        ):
            click.echo(f"{k:<17} {doc[k]}")


def _field_values(spec, items: tuple[str, ...]) -> dict[str, int]:
    """``FIELD=VALUE`` options (an integer, raw) as query field values."""
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        q = spec.resolve_field(name.strip())
        try:
            v = int(text.strip(), 0)
        except ValueError:
            v = -1
        if not sep or q is None or not 0 <= v <= q.max_value:
            raise click.BadParameter(
                f"'{item}' is not FIELD=VALUE with a query field of the spec and an integer that fits it"
            )
        out[q.name] = v
    return out


@main.command("publish")
@click.argument("topic")
@click.argument("payload", required=False)
@click.option(
    "--spec",
    "spec_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="the broker's spec (with @pragma query_topic)",
)
@click.option("--broker", required=True, help="IP:PORT of subc serve's requests")
@click.option("--feed", help="IP:PORT the messages go to (default: the broker's address, the spec's feed port)")
@click.option("--set", "sets", multiple=True, help="FIELD=VALUE of another header field (repeat)")
@click.option("--count", type=click.IntRange(1), default=1, show_default=True, help="send the payload this many times")
@click.option("--keep", is_flag=True, help="stay registered after sending (else UNREGISTER at the end)")
def publish_cmd(
    topic: str,
    payload: str | None,
    spec_path: str,
    broker: str,
    feed: str | None,
    sets: tuple[str, ...],
    count: int,
    keep: bool,
) -> None:
    """REGISTER TOPIC with the broker and send PAYLOAD (else each line of standard input) as
    messages of TOPIC: the spec's topic header with the level labels, then the topic name and the
    payload (docs/serve.md, "Live subscriptions"); then UNREGISTER unless --keep."""
    from .compiler.parse_graph import ParseGraph
    from .compiler.spec import load_spec
    from .runtime.topic_client import Publisher

    try:
        spec = load_spec(spec_path)
        b = _endpoint(broker)
        dest = _endpoint(feed) if feed else (b[0], ParseGraph(spec).feed().ports[0][0])
        pub = Publisher(spec, b, dest)
        values = _field_values(spec, sets)
        labels = pub.register(topic)
        items = (
            [(topic, payload.encode())] * count
            if payload is not None
            else [(topic, line.rstrip("\n").encode()) for line in sys.stdin]
        )
        n = pub.publish(items, values)
        if not keep:
            pub.unregister(topic)
    except SubcError as e:
        _fail(e)
    click.echo(
        f"{topic} labels {' '.join(map(str, labels))}: {len(items)} messages in {n} datagrams to {dest[0]}:{dest[1]}",
        err=True,
    )


@main.command("subscribe")
@click.argument("topic_filter")
@click.option(
    "--spec",
    "spec_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="the broker's spec (with @pragma query_topic)",
)
@click.option("--broker", required=True, help="IP:PORT of subc serve's requests")
@click.option("--bind", default="0.0.0.0:0", show_default=True, help="IP:PORT of this subscriber's socket")
@click.option("--where", help="a condition the messages must also meet (rule language)")
@click.option("--count", type=click.IntRange(1), help="stop after this many messages")
@click.option("--timeout", type=float, help="stop after this many idle seconds")
def subscribe_cmd(
    topic_filter: str,
    spec_path: str,
    broker: str,
    bind: str,
    where: str | None,
    count: int | None,
    timeout: float | None,
) -> None:
    """SUB TOPIC_FILTER (MQTT wildcards + and #) and print each message received as
    'TOPIC<TAB>PAYLOAD' (the payload as UTF-8, undecodable bytes escaped); unsubscribes at the end."""
    from .compiler.spec import load_spec
    from .runtime.topic_client import Subscriber

    try:
        sub = Subscriber(
            load_spec(spec_path), _endpoint(broker), _endpoint(bind) if bind != "0.0.0.0:0" else ("0.0.0.0", 0)
        )
        sid = sub.sub(topic_filter, where)
    except SubcError as e:
        _fail(e)
    click.echo(f"subscribed {sid} on {sub.sock.getsockname()[0]}:{sub.sock.getsockname()[1]}", err=True)
    n = 0
    try:
        while count is None or n < count:
            m = sub.recv(timeout)
            if m is None:
                break
            click.echo(f"{m.topic}\t{m.payload.decode('utf-8', 'backslashreplace')}")
            n += 1
    except KeyboardInterrupt:
        pass
    finally:
        try:
            sub.unsubscribe(sid)
        except SubcError:
            pass
        sub.close()


@main.command("analyze")
@click.argument("rules", type=click.Path(dir_okay=False))
@click.argument("more_traces", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False))
@click.option(
    "--trace",
    "traces",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="ITCH 5.0 BinaryFILE, or pcap/pcapng of MoldUDP64 (repeat, or list after the options)",
)
@click.option("--master", help="Spark master (default: local[*]; under spark-submit: what it set)")
@click.option("-o", "--output", "out_dir", default="analysis", show_default=True, type=click.Path(file_okay=False))
@click.option(
    "--target",
    type=click.Choice(["bmv2", "tofino"]),
    default="bmv2",
    show_default=True,
    help="whose table entries to evaluate",
)
@click.option(
    "--split-bytes",
    type=click.IntRange(0),
    help="BinaryFILE split size in bytes (default: equal splits per core, at most 64 MiB; 0: one task per file)",
)
@click.option(
    "--udp-port",
    type=click.IntRange(0, 65535),
    help="capture: the feed's UDP port (default: the spec's, else the capture's MoldUDP64 port)",
)
@click.option("--strict", is_flag=True, help="a foreign frame or a message the spec cannot decode is an error")
@click.option("--json", "as_json", is_flag=True, help="print summary.json")
def analyze_cmd(
    rules: str,
    more_traces: tuple,
    spec_path: str,
    traces: tuple,
    master: str | None,
    out_dir: str,
    target: str,
    split_bytes: int | None,
    udp_port: int | None,
    strict: bool,
    as_json: bool,
) -> None:
    """What each subscriber receives from TRACE(s), filtering vs broadcast, and whether the compiled
    tables agree with the rules on every message (a Spark job; exit 1 on disagreements)."""
    from .pipeline.analyze import analyze

    paths = list(traces) + list(more_traces)
    if not paths:
        _fail(SubcError("no trace given (--trace PATH)"))
    try:
        res = _compile(rules, spec_path, target, None)
        doc = analyze(
            res,
            paths,
            out_dir,
            master=master,
            split_bytes=split_bytes,
            udp_port=udp_port,
            log=lambda m: click.echo(m, err=True),
            strict=strict,
        )
    except SubcError as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    else:
        b = doc["bytes"]
        click.echo(
            f"messages:        {doc['messages']} ({doc['classified']} classified) in {len(doc['files'])} file(s)"
        )
        for kind, n in doc.get("problems", {}).items():
            click.echo(f"not decoded:     {n} {kind.replace('_', ' ')}")
        if doc.get("capture"):
            counts = ", ".join(f"{k} {v}" for k, v in doc["capture"].items() if isinstance(v, int) and v)
            click.echo(f"capture:         {counts}")
        click.echo(
            f"deliveries:      {doc['deliveries']} to {doc['subscribers']} subscribers "
            f"({doc['unicast']} unicast, {doc['multicast']} multicast, {doc['no_rule_matched']} matched no rule)"
        )
        click.echo(
            f"bytes:           {b['filtered']} filtered vs {b['broadcast']} broadcast (saving {b['saving']:.1%})"
        )
        if doc.get("stateful"):
            st = doc["stateful"]
            click.echo(
                f"state:           in trace order: tables {st['tables']}, reference one by one on "
                f"{st['reference_one_by_one']} messages"
            )
        click.echo(f"disagreements:   {doc['disagreements']}")
        click.echo(
            f"time:            {doc['seconds']['total']:.1f} s, {doc['messages_per_second']} messages/s -> {out_dir}/"
        )
    sys.exit(1 if doc["disagreements"] else 0)


@main.command("validate")
@click.argument("rules", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False))
@click.option("--master", help="Spark master (default: local[*]; under spark-submit: what it set)")
@click.option(
    "--piece-chars", type=click.IntRange(1), default=1 << 20, show_default=True, help="characters of rule text per task"
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def validate_cmd(rules: tuple, spec_path: str, master: str | None, piece_chars: int, as_json: bool) -> None:
    """Parse and check RULES files in parallel: every error with its line, and statistics
    (exit 2 when any rule is bad)."""
    from .compiler.spec import load_spec
    from .pipeline.validate import validate

    try:
        spec = load_spec(spec_path)
        doc = validate(list(rules), spec, master=master, piece_chars=piece_chars)
    except SubcError as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    else:
        for msg in doc["error_messages"]:
            click.echo(msg, err=True)
        click.echo(f"rules:      {doc['rules']} valid, {doc['errors']} error(s) in {len(doc['files'])} file(s)")
        click.echo(f"duplicates: {doc['duplicates']}")
        for group in doc["duplicate_groups"][:10]:
            click.echo("  " + ", ".join(group[:6]) + (" ..." if len(group) > 6 else ""))
        click.echo("rules per field:")
        for f, n in doc["rules_per_field"].items():
            click.echo(f"  {f:<32} {n}")
        click.echo("predicates per rule: " + ", ".join(f"{k}: {v}" for k, v in doc["predicates_per_rule"].items()))
    sys.exit(2 if doc["errors"] else 0)


def _write_text(path: str | None, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, then rename), or to stdout."""
    from .compiler.targets.output import atomic_file

    if path is None:
        click.echo(text, nl=False)
        return
    with atomic_file(path) as f:
        f.write(text)


@main.group("gen")
def gen() -> None:
    """Deterministic workload generators: rule sets and ITCH traces."""


@gen.command("itch")
@click.option("--rules", "n", type=click.IntRange(0), required=True, help="number of rules")
@click.option("--symbols", type=click.IntRange(1), default=100, show_default=True)
@click.option("--ports", type=click.IntRange(1, 511), default=32, show_default=True)
@click.option(
    "--form",
    type=click.Choice(["price", "camus"]),
    default="price",
    show_default=True,
    help="price: stock == S (Zipf) and a price predicate; camus: stock == S and shares > P (Camus Fig. 5c)",
)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="rules file (default: stdout)")
def gen_itch(n: int, symbols: int, ports: int, form: str, seed: int, output: str | None) -> None:
    """ITCH subscriptions for examples/itch/spec.p4."""
    from .workloads.itch_rules import itch_rules

    _write_text(output, itch_rules(n, symbols, ports, seed, form))


@gen.command("siena")
@click.option("--filters", type=click.IntRange(0), required=True, help="number of subscriptions")
@click.option("--conj", type=click.IntRange(1), default=2, show_default=True, help="predicates per conjunction")
@click.option("--disj", type=click.IntRange(1), default=1, show_default=True, help="conjunctions per subscription")
@click.option("--attrs", type=click.IntRange(1), default=8, show_default=True, help="attributes in the space")
@click.option("--zipf/--uniform", default=False, show_default=True, help="attribute popularity")
@click.option("--ports", type=click.IntRange(1, 511), default=32, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="rules file (default: stdout)")
@click.option("--spec-out", type=click.Path(dir_okay=False), help="also write the matching spec (P4_16)")
def gen_siena(
    filters: int,
    conj: int,
    disj: int,
    attrs: int,
    zipf: bool,
    ports: int,
    seed: int,
    output: str | None,
    spec_out: str | None,
) -> None:
    """Siena Synthetic Benchmark Generator-style subscriptions (= 50%, < 25%, > 25%, values 0..100)."""
    from .workloads.siena import siena_rules, siena_spec

    try:
        text = siena_rules(filters, conj, disj, attrs, zipf, ports, seed)
    except ValueError as e:
        _fail(SubcError(str(e)))
    if spec_out:
        _write_text(spec_out, siena_spec(attrs))
    _write_text(output, text)


@gen.command("trace")
@click.option("--messages", type=click.IntRange(1), required=True)
@click.option("--symbols", type=click.IntRange(1), default=500, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="BinaryFILE to write")
def gen_trace(messages: int, symbols: int, seed: int, output: str) -> None:
    """A synthetic ITCH 5.0 BinaryFILE with a trading day's message mix."""
    from .workloads.itch_trace import generate_trace

    try:
        counts = generate_trace(output, messages, symbols, seed)
    except ValueError as e:
        _fail(SubcError(str(e)))
    click.echo(
        f"wrote {sum(counts.values())} messages to {output}: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])),
        err=True,
    )


if __name__ == "__main__":  # pragma: no cover
    main()
