"""The P4 backend (:class:`~subc.backends.backend.Backend`) for BMv2 (v1model) and Tofino (TNA):
the P4 program (:mod:`.program`), ``entries.json`` (:mod:`.entries`), the P4Info of a whole
program (:mod:`.p4info`) with the entries by state (``states.jsonl``, :mod:`.state_index`: what
``subc update --p4runtime`` reads) and the control-plane script of the target (``commands.txt`` for
``simple_switch_CLI``, ``bfrt_setup.py`` for ``bfshell``)."""

from __future__ import annotations

from typing import Any

from ...compiler.driver import CompileResult
from ...compiler.target import Target
from ...errors import SubcError
from ..backend import OutputOptions
from ..output import TextStream, counted
from ..json_text import dumps_stream
from .entries import bfrt_setup_stream, bmv2_commands_stream, entries_doc, report_json
from .p4info import p4info_text
from .program import render_program
from .slots import slot_plan
from .state_index import STATES_FILE, states_file


def check_tofino_state(res: CompileResult, max_messages: int, overflow_port: int | None) -> None:
    """Raise SubcError when ``res``'s comparisons on state cannot run on Tofino: a window that is
    not a power of two of the time unit, a field wider than a register cell
    (:func:`~.state.tofino_problems`), or a multi-message program of more than one slot (each
    register is read-modified-written once per packet: one message per datagram can update it)."""
    assert res.ir.state is not None  # called for a rule set with comparisons on state only
    from .state import tofino_problems  # (a rule set without state does not import it)

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


class P4Backend:
    """A spec whose feed is MoldUDP64-framed gets the multi-message program of
    ``max_messages`` slots, datagrams it cannot handle going to ``overflow_port`` (:mod:`.slots`).

    bmv2: ``subc.p4``, ``commands.txt``; tofino: ``subc.p4``, ``bfrt_setup.py``; both:
    ``entries.json`` and, for a whole program, ``p4info.txtpb``."""

    def check(self, res: CompileResult, options: OutputOptions) -> None:
        """SubcError for comparisons on state that Tofino cannot run (:func:`check_tofino_state`)."""
        if res.ir.state is not None and res.target == Target.TOFINO:
            check_tofino_state(res, options.max_messages, options.overflow_port)

    def outputs(self, res: CompileResult, options: OutputOptions) -> tuple[dict[str, str | TextStream], dict[str, Any]]:
        """(file name -> text, ``report.json`` document) of ``res`` (see the class docstring);
        with ``options.stream``, ``entries.json``, ``states.jsonl`` and the control-plane script
        are :class:`~..output.TextStream` objects, written one after the other (a large rule
        set's texts are never all in memory at once; ``states.jsonl`` records the size of
        ``entries.json``, counted as it is written)."""
        planned = slot_plan(res, options.max_messages, options.overflow_port) if res.spec.whole_program else None
        plan, reason = planned if planned is not None else (None, None)
        name, src = render_program(res, options.rules_path, options.max_messages, options.overflow_port, planned)
        files: dict[str, str | TextStream] = {name: src}
        pipe = res.pipeline
        doc = entries_doc(pipe, res.target, plan)
        entries, entries_size = counted(dumps_stream(doc.to_json))
        files["entries.json"] = entries if options.stream else str(entries)
        if res.spec.whole_program:
            files["p4info.txtpb"], shape = p4info_text(res, plan)
            # the entries by state, for subc update --p4runtime (it reads the states it writes)
            states = TextStream(lambda emit: emit(states_file(doc, entries_size(), shape).decode()))
            files[STATES_FILE] = states if options.stream else str(states)
        script = bmv2_commands_stream(pipe, plan) if res.target == Target.BMV2 else bfrt_setup_stream(pipe, plan=plan)
        files["commands.txt" if res.target == Target.BMV2 else "bfrt_setup.py"] = (
            script if options.stream else str(script)
        )
        return files, report_json(res, plan, reason)
