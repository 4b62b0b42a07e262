"""The one interface of the backends: what turns a compiled rule set (:class:`CompileResult`: the
IR and the P4 tables) into a target's output files.

Two backends implement it: :class:`subc.backends.p4.backend.P4Backend` (v1model for BMv2, TNA
for Tofino: the P4 program, ``entries.json``, P4Info and the control-plane scripts) and
:class:`subc.backends.ebpf.backend.EbpfBackend` (the eBPF program's static C and generated
headers, ``maps.json``).  :func:`subc.backends.files.target_files` picks one by target
(:func:`subc.backends.files.backend_of`) and adds what every target writes (``bdd.dot``,
``report.json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..compiler.driver import CompileResult
from .output import TextStream


@dataclass(frozen=True)
class OutputOptions:
    """What a compile asks of every backend: the rules file's name (quoted in the generated
    code's comments), the multi-message P4 program's slots (``max_messages``) and the port of the
    datagrams it cannot classify whole (``overflow_port``, None: dropped); with ``stream``, the
    large text outputs may be :class:`~.output.TextStream` objects, produced while they are
    written (:func:`~.output.write_directory`), instead of strings."""

    rules_path: str
    max_messages: int
    overflow_port: int | None = None
    stream: bool = False


class Backend(Protocol):
    """Generates a target's output files from a compiled rule set."""

    def check(self, res: CompileResult, options: OutputOptions) -> None:
        """Raise SubcError when ``res`` cannot run on the target (before anything is generated)."""
        ...

    def outputs(self, res: CompileResult, options: OutputOptions) -> tuple[dict[str, str | TextStream], dict[str, Any]]:
        """(file name -> text, the ``report.json`` document) of ``res``; texts are strings unless
        ``options.stream``.  Raises SubcError when the rules or the spec cannot be expressed on
        the target."""
        ...
