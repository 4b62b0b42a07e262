"""``subc simulate``: every Add Order of an ITCH trace through the reference and the tables.

Each Add Order (``A`` and ``F``) is decoded (:mod:`.itch`) into a packet
``{'header.field': value}`` and given to the reference semantics (:mod:`.reference`) and to the
table simulator over the compiled ``entries.json`` (:mod:`.simulator`); any difference is a
disagreement.  Fields that an Add Order does not carry (for example ``ipv4.dstAddr``) take the
value 0 in both.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..compiler.driver import CompileResult
from ..compiler.targets.entries import entries_json
from .itch import ADD_ORDER_TYPES, ReadStats, decode_add_order, read_binaryfile
from ..compiler.ast import evaluate
from .reference import combine
from .simulator import TableSimulator


@dataclass
class SimulationResult:
    """Counts of a simulation (see :meth:`as_json` for the keys)."""

    messages: int = 0
    add_orders: int = 0
    by_type: Counter = field(default_factory=Counter)
    per_port: Counter = field(default_factory=Counter)
    multicast_deliveries: int = 0
    unicast_deliveries: int = 0
    default_action: int = 0
    actions: Counter = field(default_factory=Counter)
    disagreements: int = 0
    examples: list = field(default_factory=list)
    zero_length_fallbacks: int = 0
    rule_hits: Counter = field(default_factory=Counter)

    def as_json(self) -> dict:
        return {
            "messages": self.messages,
            "add_orders": self.add_orders,
            "by_type": dict(sorted(self.by_type.items())),
            "per_port": {str(p): n for p, n in sorted(self.per_port.items())},
            "unicast_deliveries": self.unicast_deliveries,
            "multicast_deliveries": self.multicast_deliveries,
            "actions": dict(sorted(self.actions.items())),
            "no_rule_matched": self.default_action,
            "disagreements": self.disagreements,
            "disagreement_examples": self.examples[:10],
            "zero_length_fallbacks": self.zero_length_fallbacks,
            "rule_hits": {str(i): n for i, n in sorted(self.rule_hits.items())},
        }


def simulate_trace(res: CompileResult, trace: str | Path) -> SimulationResult:
    """Run every Add Order of the BinaryFILE ``trace`` through both semantics (see module doc)."""
    sim = TableSimulator(entries_json(res.pipeline, res.target))
    fields = list(res.spec.query_fields)
    out = SimulationResult()
    stats = ReadStats()
    for offset, msg in read_binaryfile(trace, stats):
        if msg[:1] not in ADD_ORDER_TYPES:
            continue
        out.add_orders += 1
        packet = {f: 0 for f in fields}
        packet.update(decode_add_order(msg))
        matched = [r for r in res.rules if evaluate(r.condition, packet)]
        out.rule_hits.update(r.index for r in matched)
        ref = combine(matched, res.spec)
        got = sim.process(packet)
        if got != ref:
            out.disagreements += 1
            if len(out.examples) < 10:
                out.examples.append({"offset": offset, "reference": str(ref), "tables": str(got)})
        if not matched:
            out.default_action += 1
        if got.ports:
            out.per_port.update(got.ports)
            if len(got.ports) > 1:
                out.multicast_deliveries += 1
            else:
                out.unicast_deliveries += 1
        else:
            out.actions[str(got)] += 1
    out.messages = stats.messages
    out.by_type = stats.by_type
    out.zero_length_fallbacks = stats.zero_length_fallbacks
    return out
