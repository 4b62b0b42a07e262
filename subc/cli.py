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


def _compile(rules_path: str, spec_path: str, target: str, field_order: str | None):
    from .compiler.driver import compile_rules
    from .compiler.rules import load_rules
    from .compiler.spec import load_spec

    t0 = time.perf_counter()
    spec = load_spec(spec_path)
    rules = load_rules(rules_path, spec)
    t_parse = time.perf_counter() - t0
    order = [f.strip() for f in field_order.split(",") if f.strip()] if field_order else None
    res = compile_rules(rules, spec, target, order)
    res.phases = {"parse": t_parse, **res.phases}
    return res


@click.group()
@click.version_option(__version__, prog_name="subc")
def main() -> None:
    """subc: compile packet subscriptions into data-plane pipelines."""


@main.command("compile")
@click.argument("rules", type=click.Path(dir_okay=False))
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="message-format spec (P4_16)")
@click.option("--target", type=click.Choice(["bmv2", "tofino"]), default="bmv2", show_default=True)
@click.option("-o", "--output", "out_dir", default="out", show_default=True, type=click.Path(file_okay=False))
@click.option("--field-order", help="comma-separated field order (overrides the heuristic)")
@click.option("--dot", is_flag=True, help="also write the BDD as bdd.dot")
def compile_cmd(rules: str, spec_path: str, target: str, out_dir: str, field_order: str | None, dot: bool) -> None:
    """Compile RULES into a P4 program and control-plane entries in OUTPUT (written atomically)."""
    from .compiler.targets import target_files
    from .compiler.targets.entries import dumps, report_json
    from .compiler.targets.output import write_directory

    try:
        res = _compile(rules, spec_path, target, field_order)
        files, phases = target_files(res, rules, dot)
        files["report.json"] = dumps(report_json(res, phases))
        write_directory(out_dir, files)
    except SubcError as e:
        _fail(e)
    pipe = res.pipeline
    if not res.spec.whole_program:
        click.echo(
            f"note: {spec_path} declares no headers or parser: wrote the control block only "
            "(subc_control.p4), not a whole program",
            err=True,
        )
    click.echo(
        f"compiled {len(res.rules)} rules for {target}: field order {', '.join(pipe.field_order) or '(none)'}; "
        f"{len(pipe.tables)} tables, {pipe.total_entries} entries, {len(pipe.mcast_groups)} multicast groups -> {out_dir}/"
    )


@main.command("simulate")
@click.argument("rules", type=click.Path(dir_okay=False))
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False))
@click.option("--trace", required=True, type=click.Path(dir_okay=False), help="ITCH 5.0 BinaryFILE")
@click.option("--target", type=click.Choice(["bmv2", "tofino"]), default="bmv2", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def simulate_cmd(rules: str, spec_path: str, trace: str, target: str, as_json: bool) -> None:
    """Run every Add Order of TRACE through the reference semantics and the compiled tables."""
    from .runtime.simulate import simulate_trace

    try:
        res = _compile(rules, spec_path, target, None)
        out = simulate_trace(res, trace)
    except SubcError as e:
        _fail(e)
    doc = out.as_json()
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    else:
        click.echo(f"messages read:        {doc['messages']}")
        click.echo(f"add orders:           {doc['add_orders']}")
        click.echo(f"zero-length prefixes: {doc['zero_length_fallbacks']} (length taken from the message type)")
        click.echo(f"unicast deliveries:   {doc['unicast_deliveries']}")
        click.echo(f"multicast deliveries: {doc['multicast_deliveries']}")
        for port, n in doc["per_port"].items():
            click.echo(f"  port {port:>3}: {n} messages")
        for action, n in doc["actions"].items():
            click.echo(f"  {action}: {n} messages")
        click.echo(f"matched no rule:      {doc['no_rule_matched']}")
        click.echo(f"disagreements:        {doc['disagreements']}")
    sys.exit(1 if out.disagreements else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
