"""The ``subc`` command group and what its commands share (click).

Exit status: 0 on success, 1 when a simulation finds disagreements, 2 on bad input (with a
``file:line:col: error:`` diagnostic on stderr).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import click

from .. import __version__
from ..errors import SubcError


def fail(e: SubcError) -> None:
    """Print ``e`` as ``file:line:col: error: ...`` with the offending line and a caret, exit 2."""
    click.echo(e.render(), err=True)
    sys.exit(2)


def limits_of(max_rules: int | None, max_states: int | None):
    """The default :class:`~subc.lang.limits.Limits` with the options' rule and state limits."""
    from dataclasses import replace

    from ..lang.limits import DEFAULT_LIMITS as d

    return replace(d, max_rules=max_rules or d.max_rules, max_states=max_states or d.max_states)


def limit_options(f):
    """The ``--max-rules`` and ``--max-states`` options (:class:`subc.lang.limits.Limits`)."""
    from ..lang.limits import DEFAULT_LIMITS as d

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


def compile_paths(
    rules_path: str,
    spec_path: str,
    target: str,
    field_order: str | None,
    progress=None,
    limits=None,
    capacity_factor: float = 2.0,
    state_bits: int = 0,
):
    """Load the spec and the rules at their paths and compile them (``field_order``: comma-separated
    names, or None to search); the result's ``phases`` gain the parse time (s).  ``progress``
    (a :class:`~subc.progress.PhaseProgress`) advances after parsing and after compiling.
    Raises SubcError as :func:`~subc.compiler.driver.compile_rules` and the front end do."""
    from ..compiler.driver import compile_rules
    from ..lang.limits import DEFAULT_LIMITS
    from ..lang.rules import load_rules
    from ..spec.front_end import load_spec

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


def terminate(signum, frame):
    """SIGTERM handler: exit as SIGINT would, so that temporary outputs are removed."""
    raise SystemExit(128 + signum)  # unwinds: temporary outputs are removed (finally blocks run)


class LazyGroup(click.Group):
    """A command group whose commands are defined by modules imported when one of their commands
    is named or the commands are listed (``--help``): ``lazy`` maps a command's name to the
    function that imports its module (which defines it on this group).  ``subc update`` imports
    the data-plane commands alone."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, Callable[[], object]] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.lazy[cmd_name]()
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="subc")
def main() -> None:
    """subc: compile packet subscriptions into data-plane pipelines."""
    import signal

    signal.signal(signal.SIGTERM, terminate)


def ip_port(text: str) -> tuple[str, int]:
    """``IP:PORT`` (an empty IP is 0.0.0.0) as (ip, port); click.BadParameter otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"'{text}' is not IP:PORT")
    return host or "0.0.0.0", int(port)


def election_id_option(_ctx, _param, value: str) -> tuple[int, int]:
    """click callback: ``HIGH,LOW`` as a P4Runtime election id (two integers, not both 0)."""
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
        callback=election_id_option,
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


def record_option(fn):
    """--record-dir: where ``subc load|update|verify --p4runtime`` keep their record of a switch."""
    return click.option(
        "--record-dir",
        type=click.Path(file_okay=False),
        help="--p4runtime: directory of the writer's record of each switch (default $SUBC_STATE_DIR/p4runtime, "
        "else /var/lib/subc/p4runtime as root, else ~/.local/state/subc/p4runtime)",
    )(fn)


def one_of(iface: str | None, p4rt: str | None) -> None:
    """click.UsageError unless exactly one of --iface and --p4runtime is given."""
    if bool(iface) == bool(p4rt):
        raise click.UsageError("give one of --iface (the eBPF data path) and --p4runtime (a switch)")


def write_text(path: str | None, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, then rename), or to stdout."""
    from ..backends.output import atomic_file

    if path is None:
        click.echo(text, nl=False)
        return
    with atomic_file(path) as f:
        f.write(text)
