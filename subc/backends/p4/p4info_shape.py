"""The shape of a P4Info: what a rule set's control plane writes against (tables, their keys and
actions, actions and their parameters), table sizes aside: the compiler digests it into
``states.jsonl`` and ``subc update --p4runtime`` compares it with the switch's without parsing
``p4info.txtpb`` (P4Runtime specification v1.3, section 6).  Imports nothing heavy: the
writer's start-up is part of an update's latency."""

from __future__ import annotations

import hashlib


def program_shape(info) -> tuple[dict, dict]:
    """(action name -> [(parameter, bits)], table name -> ([(key, bits, match type)], action ids))
    of P4Info message ``info``: what a program's control plane writes against, its tables' sizes
    aside (a compile sizes tables by its own entries)."""
    acts = {a.preamble.name: [(p.name, p.bitwidth) for p in a.params] for a in info.actions}
    tabs = {
        t.preamble.name: (
            [(f.name, f.bitwidth, f.match_type) for f in t.match_fields],
            sorted(r.id for r in t.action_refs),
        )
        for t in info.tables
    }
    return acts, tabs


def shape_digest(info) -> str:
    """SHA-256 (hex) of :func:`program_shape` of ``info``: equal for two P4Infos a rule set can be
    written against alike."""
    acts, tabs = program_shape(info)
    return hashlib.sha256(repr((sorted(acts.items()), sorted(tabs.items()))).encode()).hexdigest()
