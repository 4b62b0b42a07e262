"""Every output file of a compilation for its target: P4 programs (v1model, TNA), control-plane
entries, eBPF maps and program, reports.

:func:`target_files` gives every output file of a compilation as text, in memory, so that the
caller can write them atomically (:mod:`.output`).
"""

from __future__ import annotations

import time
from typing import Any, Literal, overload

from ..errors import SubcError
from ..ir.bdd import to_dot
from ..compiler.driver import CompileResult
from .backend import Backend, OutputOptions
from .output import TextStream
from .p4.backend import P4Backend
from .json_text import dumps
from .p4.slots import DEFAULT_MAX_MESSAGES, check_options
from ..compiler.target import P4_TARGETS, TARGETS, Target  # noqa: F401 (P4_TARGETS, TARGETS: its names)

#: The targets whose programs keep the registers of comparisons on state.
STATEFUL_TARGETS: tuple[Target, ...] = (Target.EBPF, Target.BMV2, Target.TOFINO)


def backend_of(target: Target | str) -> Backend:
    """The backend of ``target`` (``bmv2``, ``tofino``: P4; ``ebpf``).  The eBPF backend is
    imported on first use (about 0.1 s a P4 compile does not spend)."""
    if target == Target.EBPF:
        from .ebpf.backend import EbpfBackend

        return EbpfBackend()
    return P4Backend()


@overload
def target_files(
    res: CompileResult,
    rules_path: str,
    dot: bool = ...,
    max_messages: int = ...,
    overflow_port: int | None = ...,
    stream: Literal[False] = ...,
) -> tuple[dict[str, str], dict[str, float]]: ...


@overload
def target_files(
    res: CompileResult,
    rules_path: str,
    dot: bool = ...,
    max_messages: int = ...,
    overflow_port: int | None = ...,
    stream: bool = ...,
) -> tuple[dict[str, str | TextStream], dict[str, float]]: ...


def target_files(
    res: CompileResult,
    rules_path: str,
    dot: bool = False,
    max_messages: int = DEFAULT_MAX_MESSAGES,
    overflow_port: int | None = None,
    stream: bool = False,
) -> tuple[dict[str, Any], dict[str, float]]:
    """(file name -> text, phase times in s) of the outputs of ``res`` for its target: its
    backend's (:func:`backend_of`: :class:`~.p4.backend.P4Backend`,
    :class:`~.ebpf.backend.EbpfBackend`), ``bdd.dot`` with ``dot``, and ``report.json``.

    ``max_messages`` and ``overflow_port``: the multi-message P4 program's slots and overflow
    port (:mod:`.p4.slots`; bad values raise SubcError for every target).  With ``stream``, the
    large texts may be :class:`~.output.TextStream` objects, produced when
    :func:`~.output.write_directory` writes them (an error in them is then raised there);
    otherwise every text is a string.  Raises SubcError when the rules or the spec cannot be
    expressed on the target.
    """
    check_options(max_messages, overflow_port)
    if res.ir.state is not None and res.target not in STATEFUL_TARGETS:
        raise SubcError(
            f"the rules compare state (aggregates), which the {res.target} target does not support yet "
            f"(supported: {', '.join(STATEFUL_TARGETS) or 'none'}; `subc simulate` runs them on the tables)"
        )
    backend = backend_of(res.target)
    options = OutputOptions(rules_path, max_messages, overflow_port, stream)
    backend.check(res, options)
    t0 = time.perf_counter()
    files, report = backend.outputs(res, options)
    if dot:
        files["bdd.dot"] = to_dot(res.rbdd)
    phases = {**res.phases, "codegen": time.perf_counter() - t0}
    files["report.json"] = dumps(report)
    return files, phases
