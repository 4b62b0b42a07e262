"""Cost models of the back ends, for the field-order search (:func:`~.driver.compile_rules`).

Each model maps the IR of one candidate field order to a comparable cost (smaller is better);
the search keeps the cheapest candidate.  The P4 model lowers the IR to its tables, which the
compiler keeps when the candidate wins.

* **P4** (BMv2, Tofino): the table entries of the lowered pipeline (each table's default action
  counting as one), the switch's scarce resource (TCAM and SRAM entries).
* **eBPF**: the BPF map entries the IR needs (range: one bound per run plus one state record per
  state; exact: one hash entry per value whose next state differs from the miss target, plus one
  state record; lpm: one trie entry per prefix entry; one leaf entry per leaf), then, on equal
  entries, the number of binary-search steps of the worst range state (log2 of its runs),
  which is what a message pays in the XDP program.
"""

from __future__ import annotations

import math

from ..ir.stages import FieldStage, SubscriptionIR
from ..spec.model import Spec
from ..backends.p4.tables import Pipeline, build_pipeline


def p4_cost(ir: SubscriptionIR, spec: Spec, target: str, range_form: str = "auto") -> tuple[tuple[int], Pipeline]:
    """((total entries,), the lowered pipeline) of ``ir`` on P4 ``target`` ('bmv2' or 'tofino')."""
    pipe = build_pipeline(ir, spec, target, range_form)
    return (pipe.total_entries,), pipe


def ebpf_cost(ir: SubscriptionIR) -> tuple[int, int]:
    """(BPF map entries, worst binary-search steps) of ``ir`` (see the module docstring)."""
    entries = len(ir.leaves) + 1
    steps = 0
    for stage in ir.stages:
        kind = stage.field.match_kind
        if kind == "range":
            for st in stage.states:
                entries += 1 + len(st.runs)
                steps = max(steps, math.ceil(math.log2(len(st.runs))) if len(st.runs) > 1 else 0)
        elif kind == "exact":
            for st in stage.states:
                entries += 1 + len(FieldStage.exact_form(st)[0])
        else:
            for st in stage.states:
                entries += len(FieldStage.lpm_form(st, stage.field.width))
    return entries, steps
