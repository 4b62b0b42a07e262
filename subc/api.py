"""subc's public API: what ``import subc`` offers, the same steps as the commands.

    import subc

    spec = subc.load_spec("examples/itch/spec.p4")
    rules = subc.parse_rules('add_order.stock == "GOOGL" and add_order.price > 50 : fwd(1, 2);', spec)
    c = subc.compile(rules, spec, target="ebpf")
    c.write("out/")                      # what `subc compile` writes, atomically
    c.report["total_entries"], c.field_order
    sim = subc.simulate(c, "examples/itch/data/ex20101224.TEST_ITCH_50")
    assert sim.disagreements == 0

Every function raises :class:`SubcError` (``subc.SubcError``) for bad input, with a
``file:line:col`` location where there is one, exactly as the commands report it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Sequence

from .lang.ast import Rule
from .compiler.driver import CompileResult, compile_rules
from .lang.limits import DEFAULT_LIMITS, Limits
from .lang.rules import load_rules, parse_rules
from .spec.front_end import load_spec, parse_spec
from .spec.model import Spec
from .compiler.target import Target, target_of
from .backends.ebpf.maps_doc import MapsDoc
from .backends.files import target_files
from .backends.p4.entries_doc import EntriesDoc
from .backends.output import write_directory
from .errors import SubcError

__all__ = [
    "Compilation",
    "Rule",
    "Spec",
    "SubcError",
    "check",
    "compile",
    "load_rules",
    "load_spec",
    "parse_rules",
    "parse_spec",
    "simulate",
]


@dataclass
class Compilation:
    """A compiled rule set (:func:`compile`): ``result`` (the IR in the chosen field order, the rules
    and the spec: :class:`~subc.compiler.driver.CompileResult`) and the options its outputs are
    generated with.  The outputs are made on first use."""

    result: CompileResult
    rules_path: str = "<rules>"
    max_messages: int = 8
    overflow_port: int | None = None
    dot: bool = False
    _files: dict[str, str] | None = field(default=None, repr=False)

    @property
    def target(self) -> str:
        """'bmv2', 'tofino' or 'ebpf'."""
        return self.result.target

    @property
    def field_order(self) -> list[str]:
        """The fields in stage order (one match-action table, or one BPF map stage, each)."""
        return list(self.result.ir.field_order)

    @property
    def files(self) -> dict[str, str]:
        """File name -> text of every output ``subc compile`` writes for the target (P4: ``subc.p4``,
        ``entries.json``, ``report.json``, ...; eBPF: ``subc_filter.bpf.c``, ``maps.json``,
        ``report.json``).  Raises SubcError when the rules cannot be expressed on the target."""
        if self._files is None:
            self._files, _ = target_files(self.result, self.rules_path, self.dot, self.max_messages, self.overflow_port)
        return self._files

    @cached_property
    def entries(self) -> EntriesDoc | MapsDoc:
        """The control-plane entries: ``entries.json`` (P4 targets, :class:`EntriesDoc`) or
        ``maps.json`` (eBPF, :class:`MapsDoc`), read back from their text (``.to_json()`` gives
        the parsed JSON)."""
        if self.target == Target.EBPF:
            return MapsDoc.from_json(json.loads(self.files["maps.json"]))
        return EntriesDoc.from_json(json.loads(self.files["entries.json"]))

    @cached_property
    def report(self) -> dict:
        """``report.json``, parsed: stages, entries per table or map, states, timings of the compile."""
        return json.loads(self.files["report.json"])

    def write(self, out_dir: str | Path) -> Path:
        """Write :attr:`files` to ``out_dir``, replacing it atomically (a temporary directory, then
        rename: the directory is the previous one or the new one, never half-written); returns
        its path.  Raises SubcError on an OS error (``out_dir`` then unchanged)."""
        return write_directory(out_dir, self.files)


def compile(
    rules: Sequence[Rule],
    spec: Spec,
    target: str = "bmv2",
    *,
    field_order: Sequence[str] | None = None,
    max_messages: int = 8,
    overflow_port: int | None = None,
    capacity_factor: float = 2.0,
    state_bits: int = 0,
    limits: Limits = DEFAULT_LIMITS,
    dot: bool = False,
    rules_path: str = "<rules>",
) -> Compilation:
    """Compile ``rules`` (:func:`parse_rules`) over ``spec`` for ``target`` ('bmv2', 'tofino' or
    'ebpf'), as ``subc compile`` does (README, "Commands": the options of the same names;
    ``rules_path`` is named in the outputs' comments).  The field order is searched under the
    target's cost model unless ``field_order`` is given.  Raises SubcError for an unknown target,
    conflicting actions (naming both rules), a bad field order, or a rule set over ``limits``."""
    res = compile_rules(
        rules,
        spec,
        target_of(target),
        field_order,
        limits=limits,
        capacity_factor=capacity_factor,
        state_bits=state_bits,
    )
    return Compilation(res, rules_path, max_messages, overflow_port, dot)


def simulate(compilation: Compilation, trace: str | Path, strict: bool = False, udp_port: int | None = None):
    """Run every message of ``trace`` (a BinaryFILE, or a pcap/pcapng capture of MoldUDP64
    datagrams) through the compiled tables and through the reference semantics, as ``subc
    simulate`` does; returns the :class:`~subc.sim.trace.SimulationResult` (``messages``,
    ``per_port``, ``disagreements``, ``as_json()``...).  Raises SubcError for an unreadable or
    malformed trace, or with ``strict`` the first message the spec cannot decode."""
    from .sim.trace import simulate_trace

    return simulate_trace(compilation.result, trace, strict, udp_port)


def check(
    paths: Sequence[str | Path],
    spec_path: str | Path,
    target: str = "bmv2",
    *,
    load_ebpf: bool = False,
    max_messages: int = 8,
    limits: Limits = DEFAULT_LIMITS,
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
):
    """Check rule files as ``subc check`` does: returns the
    :class:`~subc.checker.run.CheckReport` (``diagnostics``, each with code, severity, file, line
    and column; ``exit_status(strict)``).  ``load_ebpf`` (root, bcc) also loads the eBPF program to
    count its instructions; ``include_dirs`` and ``defines`` are the spec's ``-I`` and ``-D``
    (:func:`load_spec`).  Raises SubcError when the spec or a file cannot be read."""
    from .checker.run import check as run_check

    return run_check(
        [str(p) for p in paths],
        str(spec_path),
        target,
        limits,
        load_ebpf=load_ebpf,
        max_messages=max_messages,
        include_dirs=include_dirs,
        defines=defines,
    )
