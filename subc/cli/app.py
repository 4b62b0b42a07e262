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


_SPEC_OPTIONS = "subc.spec_options"


def spec_options(f):
    """The C preprocessor's options for ``--spec`` (:mod:`subc.spec.preprocessor`): ``-I DIR``
    and ``-D NAME[=VALUE]``, repeatable, kept in the click context for :func:`open_spec`."""

    def keep(ctx, param, value):
        ctx.meta.setdefault(_SPEC_OPTIONS, {})[param.name] = tuple(value)

    f = click.option(
        "-D",
        "--define",
        "spec_defines",
        multiple=True,
        expose_value=False,
        callback=keep,
        help="define a macro for the spec's preprocessor: NAME (as 1) or NAME=VALUE (repeatable)",
    )(f)
    return click.option(
        "-I",
        "--include-dir",
        "spec_include_dirs",
        multiple=True,
        expose_value=False,
        callback=keep,
        type=click.Path(file_okay=False, exists=True),
        help="folder the spec's #include files are searched in and may be read from (repeatable)",
    )(f)


def spec_preprocessing() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ``-I`` folders and ``-D`` macros of the running command (empty outside one)."""
    ctx = click.get_current_context(silent=True)
    opts = ctx.meta.get(_SPEC_OPTIONS, {}) if ctx is not None else {}
    return opts.get("spec_include_dirs", ()), opts.get("spec_defines", ())


def open_spec(spec_path: str):
    """The spec at ``spec_path``, preprocessed with the command's ``-I`` and ``-D`` options
    (:func:`~subc.spec.front_end.load_spec`; raises SubcError as it does)."""
    from ..spec.front_end import load_spec

    include_dirs, defines = spec_preprocessing()
    return load_spec(spec_path, include_dirs, defines)


def compile_paths(
    rules_path: str,
    spec_path: str,
    target: str,
    field_order: str | None,
    progress=None,
    limits=None,
    capacity_factor: float = 2.0,
    state_bits: int = 0,
    columns: bool = False,
):
    """Load the spec (with the command's ``-I``/``-D``) and the rules at their paths and compile
    them (``field_order``: comma-separated names, or None to search); the result's ``phases``
    gain the parse time (s).  ``progress`` (a :class:`~subc.progress.PhaseProgress`) advances
    after parsing and after compiling.  With ``columns`` the result's rules are a
    :class:`~subc.lang.rule_store.RuleStore` (for a caller that needs the outputs only: each
    access to a rule builds it anew), else a list.
    Raises SubcError as :func:`~subc.compiler.driver.compile_rules` and the front end do."""
    from ..compiler.driver import compile_rules
    from ..lang.limits import DEFAULT_LIMITS
    from ..lang.rules import load_rule_store, load_rules

    limits = limits or DEFAULT_LIMITS
    t0 = time.perf_counter()
    spec = open_spec(spec_path)
    rules = (load_rule_store if columns else load_rules)(rules_path, spec, limits)
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


#: Set by :func:`mark_done`: the running command left the process nothing to do but exit.
_quick_exit = False


def mark_done() -> None:
    """Mark the running command as finished, every output written and closed, nothing left for
    an exit handler or a finalizer to do: :func:`run` then ends the process without the
    interpreter's teardown (freeing every object and module: 40 ms after a 100K-rule compile)."""
    global _quick_exit
    _quick_exit = True


def run() -> None:
    """The entry point of ``subc`` and ``python -m subc.cli``: :data:`main`, then, after a
    command that called :func:`mark_done`, standard output and error flushed and ``os._exit``
    with the command's status."""
    import os

    try:
        main()
    except SystemExit as e:
        if not _quick_exit:
            raise
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            raise e from None  # (the ordinary exit reports what cannot be written)
        os._exit(code)


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
