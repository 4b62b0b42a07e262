"""``subc compile``, ``subc check`` and ``subc simulate``: rules and a spec in, outputs and verdicts out."""

from __future__ import annotations

import json
from collections.abc import Mapping
import sys
import time

import click

from ..errors import SubcError
from .app import (
    compile_paths,
    fail,
    limit_options,
    limits_of,
    main,
    mark_done,
    spec_options,
    spec_preprocessing,
    write_text,
)
from ..compiler.target import Target


@main.command("compile")
@spec_options
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
    from ..backends.files import target_files
    from ..backends.output import write_directory

    from ..compiler.gcpause import paused_gc
    from ..progress import PhaseProgress

    try:
        with paused_gc(), PhaseProgress(["parsing", "compiling", "generating", "writing"]) as progress:
            res = compile_paths(
                rules,
                spec_path,
                target,
                field_order,
                progress,
                limits_of(max_rules, max_states),
                capacity_factor,
                state_bits,
                columns=True,
            )
            files, phases = target_files(res, rules, dot, max_messages, overflow_port, stream=True)
            summary = compile_summary(res, files, target, spec_path, out_dir)
            # the outputs left to write need no rule: the rules and their text are freed before
            # (a million rules: 250 MB), by reference counting while the collector is paused
            res.rules = []
            progress.next()
            t = time.perf_counter()
            write_directory(out_dir, files)
            progress.next()
            if timings:
                phases = {**phases, "write": time.perf_counter() - t}
                write_text(timings, json.dumps({k: round(v, 6) for k, v in phases.items()}, indent=1) + "\n")
            # freed by reference counting while the collector is still paused: once it is back, it
            # would first traverse every object of the compile (0.2 s for 100K rules)
            del res, files
    except SubcError as e:
        fail(e)
    for text, err in summary:
        click.echo(text, err=err)
    mark_done()  # (every output is closed: the process may skip the interpreter's teardown)


def compile_summary(
    res, files: Mapping[str, object], target: str, spec_path: str, out_dir: str
) -> list[tuple[str, bool]]:
    """The lines ``subc compile`` prints: (text, to stderr)."""
    if target == Target.EBPF:
        doc = json.loads(str(files["report.json"]))
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
    doc = json.loads(str(files["report.json"]))
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
@spec_options
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
    from ..checker.diagnostics import render_github, render_text
    from ..checker.run import check, report_json, summary_line

    include_dirs, defines = spec_preprocessing()
    try:
        rep = check(
            list(rules),
            spec_path,
            target,
            limits_of(max_rules, max_states),
            load_ebpf=not no_load,
            max_messages=max_messages,
            include_dirs=include_dirs,
            defines=defines,
        )
    except SubcError as e:
        if fmt == "github":
            from ..checker.diagnostics import Diagnostic

            click.echo(render_github(Diagnostic.from_error(e)))
        fail(e)
    if fmt == "json":
        click.echo(json.dumps(report_json(rep), indent=1))
    else:
        render = render_github if fmt == "github" else render_text
        for d in rep.diagnostics:
            click.echo(render(d))
        click.echo(summary_line(rep), err=fmt == "github")
    sys.exit(rep.exit_status(strict))


@main.command("simulate")
@spec_options
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
    from ..backends.output import write_directory
    from ..sim.trace import copies_pcaps, simulate_trace

    try:
        res = compile_paths(rules, spec_path, target, None)
        out = simulate_trace(res, trace, strict, udp_port, copies=copies_dir is not None)
        if copies_dir is not None:
            assert out.port_copies is not None  # simulated with copies
            write_directory(copies_dir, copies_pcaps(out.port_copies))
    except SubcError as e:
        fail(e)
    doc = out.as_json()
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    else:
        click.echo(f"messages read:        {doc['messages']}")
        click.echo(f"classified:           {doc['classified']} (messages with every header the rules test)")
        click.echo(f"zero-length prefixes: {doc['zero_length_fallbacks']} (length taken from the spec's message type)")
        for kind, n in doc["problems"].items():
            click.echo(f"not decoded:          {n} {kind.replace('_', ' ')}")
        for ex in doc["problem_examples"][:5]:
            click.echo(f"  {ex['where']}: {ex['message']}")
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
