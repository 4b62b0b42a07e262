"""The data pipeline's commands: ``subc analyze`` and ``subc validate`` (PySpark)."""

from __future__ import annotations

import json
import sys

import click

from ..errors import SubcError
from .app import compile_paths, fail, main, open_spec, spec_options


@main.command("analyze")
@spec_options
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
    from ..analysis.analyze import analyze

    paths = list(traces) + list(more_traces)
    if not paths:
        fail(SubcError("no trace given (--trace PATH)"))
    try:
        res = compile_paths(rules, spec_path, target, None)
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
        fail(e)
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
@spec_options
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
    from ..analysis.validate import validate

    try:
        spec = open_spec(spec_path)
        doc = validate(list(rules), spec, master=master, piece_chars=piece_chars)
    except SubcError as e:
        fail(e)
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
