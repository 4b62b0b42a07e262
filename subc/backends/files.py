"""Every output file of a compilation for its target: P4 programs (v1model, TNA), control-plane
entries, eBPF maps and program, reports.

:func:`target_files` gives every output file of a compilation as text, in memory, so that the
caller can write them atomically (:mod:`.output`).
"""

from __future__ import annotations

import time

from ..errors import SubcError
from ..ir.bdd import to_dot
from ..compiler.driver import CompileResult
from .p4.entries import bfrt_setup, bmv2_commands, dumps, entries_json, report_json
from .p4.p4info import p4info_text
from .p4.program import render_program
from .p4.slots import DEFAULT_MAX_MESSAGES, check_options, slot_plan
from .p4.state import tofino_problems
from ..compiler.target import P4_TARGETS, TARGETS, Target  # noqa: F401 (P4_TARGETS, TARGETS: its names)

#: The targets whose programs keep the registers of comparisons on state.
STATEFUL_TARGETS: tuple[Target, ...] = (Target.EBPF, Target.BMV2, Target.TOFINO)


def check_tofino_state(res: CompileResult, max_messages: int, overflow_port: int | None) -> None:
    """Raise SubcError when ``res``'s comparisons on state cannot run on Tofino: a window that is
    not a power of two of the time unit, a field wider than a register cell
    (:func:`~.p4state.tofino_problems`), or a multi-message program of more than one slot (each
    register is read-modified-written once per packet: one message per datagram can update it)."""
    problems = tofino_problems(res.ir.state)
    if res.spec.whole_program:
        plan, _ = slot_plan(res, max_messages, overflow_port)
        if plan is not None and plan.max_messages > 1:
            problems.append(
                f"a Tofino register is read-modified-written once per packet, so of a MoldUDP64 datagram "
                f"only one message can update the aggregates: compile with --max-messages 1 (datagrams "
                f"of more messages go to the overflow port), not {plan.max_messages}"
            )
    if problems:
        raise SubcError("the rules' comparisons on state cannot run on Tofino: " + "; ".join(problems))


def target_files(
    res: CompileResult,
    rules_path: str,
    dot: bool = False,
    max_messages: int = DEFAULT_MAX_MESSAGES,
    overflow_port: int | None = None,
) -> tuple[dict[str, str], dict[str, float]]:
    """(file name -> text, phase times in s) of the outputs of ``res`` for its target.

    P4 targets: a spec whose feed is MoldUDP64-framed gets the multi-message program of
    ``max_messages`` slots, datagrams it cannot handle going to ``overflow_port``
    (:mod:`.p4slots`; bad values raise SubcError).

    bmv2: ``subc.p4``, ``commands.txt``; tofino: ``subc.p4``, ``bfrt_setup.py``; both:
    ``entries.json``, ``report.json`` and, for a whole program, ``p4info.txtpb``
    (:mod:`.p4info`); ebpf: the program (``subc_filter.bpf.c``, its static headers and the generated
    ``subc_config.h`` and ``subc_classify.h``: :mod:`.ebpf_source`), ``maps.json``,
    ``report.json``; all: with ``dot``, ``bdd.dot``.  Raises SubcError when the rules or the
    spec cannot be expressed on the target.
    """
    check_options(max_messages, overflow_port)
    if res.ir.state is not None and res.target not in STATEFUL_TARGETS:
        raise SubcError(
            f"the rules compare state (aggregates), which the {res.target} target does not support yet "
            f"(supported: {', '.join(STATEFUL_TARGETS) or 'none'}; `subc simulate` runs them on the tables)"
        )
    if res.ir.state is not None and res.target == Target.TOFINO:
        check_tofino_state(res, max_messages, overflow_port)
    t0 = time.perf_counter()
    files: dict[str, str] = {}
    if res.target == Target.EBPF:
        from .ebpf.program import render_filter
        from .ebpf.target import build_maps, ebpf_plan, report

        plan = ebpf_plan(res)
        doc = build_maps(res, plan)
        files.update(render_filter(res, plan, doc, rules_path))
        files["maps.json"] = dumps(doc.to_json())
        if dot:
            files["bdd.dot"] = to_dot(res.rbdd)
        phases = {**res.phases, "codegen": time.perf_counter() - t0}
        files["report.json"] = dumps(report(res, doc))
        return files, phases
    plan, reason = slot_plan(res, max_messages, overflow_port) if res.spec.whole_program else (None, None)
    name, src = render_program(res, rules_path, max_messages, overflow_port)
    files[name] = src
    doc = entries_json(res.pipeline, res.target, plan)
    files["entries.json"] = dumps(doc)
    if res.spec.whole_program:
        files["p4info.txtpb"] = p4info_text(res, plan)
    if res.target == Target.BMV2:
        files["commands.txt"] = bmv2_commands(res.pipeline, plan)
    else:
        files["bfrt_setup.py"] = bfrt_setup(res.pipeline, plan=plan)
    if dot:
        files["bdd.dot"] = to_dot(res.rbdd)
    phases = {**res.phases, "codegen": time.perf_counter() - t0}
    files["report.json"] = dumps(report_json(res, plan, reason))
    return files, phases
