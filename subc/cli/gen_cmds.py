"""``subc gen``: deterministic rule sets and traces (ITCH, Siena-style)."""

from __future__ import annotations


import click

from ..errors import SubcError
from .app import fail, main, write_text


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
    from ..workloads.itch_rules import itch_rules

    write_text(output, itch_rules(n, symbols, ports, seed, form))


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
    from ..workloads.siena import siena_rules, siena_spec

    try:
        text = siena_rules(filters, conj, disj, attrs, zipf, ports, seed)
    except ValueError as e:
        fail(SubcError(str(e)))
    if spec_out:
        write_text(spec_out, siena_spec(attrs))
    write_text(output, text)


@gen.command("trace")
@click.option("--messages", type=click.IntRange(1), required=True)
@click.option("--symbols", type=click.IntRange(1), default=500, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="BinaryFILE to write")
def gen_trace(messages: int, symbols: int, seed: int, output: str) -> None:
    """A synthetic ITCH 5.0 BinaryFILE with a trading day's message mix."""
    from ..workloads.itch_trace import generate_trace

    try:
        counts = generate_trace(output, messages, symbols, seed)
    except ValueError as e:
        fail(SubcError(str(e)))
    click.echo(
        f"wrote {sum(counts.values())} messages to {output}: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])),
        err=True,
    )
