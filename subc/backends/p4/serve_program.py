"""The P4 program that ``subc serve --p4runtime`` fills with live subscriptions.

A compiled program has tables only for the fields its rules test and actions only for the ports
they use; a switch whose subscriptions come and go needs every query field of the field order
(in that order), every subscriber port, and room.  :func:`serve_program` compiles a *skeleton*
rule set through the ordinary path (same templates, same P4Info, same ``entries.json``
layout): one rule per port whose condition tests every field of the order (so that each gets
its stage, with its match kind), range fields in the direct form (an entry per run, which an
incremental writer can rewrite state by state), and the last field's tables declare every
leaf action (one port, a multicast group, the spec's default).  The skeleton's own entries are never written;
``subc serve`` writes the live diagram's (:mod:`subc.dataplane.p4rt.live_entries`).  The files
are those of ``subc compile`` plus ``serve.json``: the ports, the capacity, the root slots.
"""

from __future__ import annotations

import json
import math
from typing import Sequence

from ...compiler.driver import compile_rules
from ...lang.literals import show_value
from ...lang.rules import parse_rules
from ...spec.model import Spec
from ...compiler.target import P4_TARGETS
from .slots import DEFAULT_MAX_MESSAGES

#: Versions of the root (level-0 states 1..root slots) a switch holds at once by default: changes
#: in flight before a grace period ends (``subc serve`` makes at most one change per grace period /
#: root slots).  Each holds a copy of the root's entries in the first field's table.  16: at BMv2's
#: 50 ms grace, one change per 3.3 ms (SUBACK p99 8 ms at 10,000 live once the slots are warm,
#: against 50 ms with 4: bench/serve_p4runtime.py, docs/p4runtime.md).
ROOT_SLOTS = 16
#: Entries per live subscription declared for each stage table (and the first field's table
#: holds the root slots' copies): a subscription adds a few nodes of a few runs per level.
ENTRIES_PER_SUBSCRIPTION = 4


def _probe_value(spec: Spec, name: str) -> str:
    """A literal the rule language accepts for field ``name`` (its value does not matter)."""
    q = spec.query_fields[name]
    if q.alpha and q.width % 8 == 0:
        return show_value(q, int.from_bytes(b"A".ljust(q.width // 8, b" "), "big"))
    return "0x1"


def skeleton_rules(spec: Spec, order: Sequence[str], ports: Sequence[int]) -> str:
    """The skeleton rule set (text): ``f1 == v1 and ... and fn == vn : fwd(p);`` for each port."""
    cond = " and ".join(f"{f} == {_probe_value(spec, f)}" for f in order)
    return "".join(f"{cond} : fwd({p});\n" for p in ports)


def state_bits_for(capacity: int, root_slots: int = ROOT_SLOTS) -> int:
    """Width in bits of the state field for ``capacity`` live subscriptions: states per level up
    to ENTRIES_PER_SUBSCRIPTION x capacity + 1,024 (and at least the root slots)."""
    return max(8, math.ceil(math.log2(ENTRIES_PER_SUBSCRIPTION * capacity + 1024 + root_slots + 1)))


def serve_program(
    spec: Spec,
    order: Sequence[str],
    ports: Sequence[int],
    capacity: int,
    target: str = "bmv2",
    max_messages: int = DEFAULT_MAX_MESSAGES,
    root_slots: int = ROOT_SLOTS,
) -> dict[str, str]:
    """Files (name -> text) of the program ``subc serve --p4runtime`` fills: ``subc.p4``,
    ``p4info.txtpb``, ``entries.json`` (the skeleton's; its ``field_order``, tables, root and
    message layout are what the daemon reads), ``serve.json``.  ``ports``: the switch ports
    subscribers may be behind (1..511); ``capacity``: live subscriptions the tables are sized
    for; ``root_slots``: versions of the root held at once (2..64; the first field's table gets
    room for a copy of the root's entries per slot).  Raises SubcError for an unknown field, bad
    ports, a root slot count out of range or a spec the target cannot take."""
    from ...errors import SubcError
    from ..files import target_files

    if target not in P4_TARGETS:
        raise SubcError(f"a program for subc serve --p4runtime is for bmv2 or tofino, not {target}")
    if not 2 <= root_slots <= 64:
        raise SubcError(f"root slots must be 2..64, not {root_slots}")
    ports = sorted(set(ports))
    if not ports or ports[0] < 0 or ports[-1] > 511:
        raise SubcError("the subscriber ports must be switch ports 0..511 (at least one)")
    for f in order:
        if f not in spec.query_fields:
            raise SubcError(f"{f} is not a query field of {spec.path}")
    text = skeleton_rules(spec, order, ports)
    rules = parse_rules(text, spec, "<serve skeleton>")
    res = compile_rules(
        rules,
        spec,
        target,
        field_order=list(order),
        range_form="direct",
        capacity_factor=1.0,
        state_bits=state_bits_for(capacity, root_slots),
    )
    room = ENTRIES_PER_SUBSCRIPTION * capacity + 1024
    pipe = res.pipeline
    for t in pipe.tables:
        if t.role in ("stage", "miss"):
            # the root slots' copies: each as large as a quarter of the room (the default's 4 fill one room)
            t.min_size = room + (room * root_slots + 3) // 4 if t.field == order[0] else room
            if t.field == order[-1]:  # any leaf may come: one port, several, none
                t.actions = sorted(set(t.actions) | {"subc_fwd", "subc_mcast", pipe.default_action[0]})
    files, _ = target_files(res, "<serve skeleton>", False, max_messages, None)
    files["serve.json"] = (
        json.dumps(
            {
                "format": "subc-serve-program",
                "field_order": list(order),
                "ports": ports,
                "capacity": capacity,
                "root_slots": root_slots,
                "state_width": res.pipeline.state_width,
            },
            indent=1,
        )
        + "\n"
    )
    return files
