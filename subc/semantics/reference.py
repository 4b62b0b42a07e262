"""Reference semantics: evaluate the rules directly on a packet, no BDD and no tables.

A packet is ``{'header.field': raw value}``.  The outcome (:class:`Decision`) is what a
compiled pipeline must produce; how the actions of the matching rules combine is defined once,
in :mod:`subc.ir.decisions` (Camus semantics).
"""

from __future__ import annotations

from typing import Sequence

from ..lang.ast import Rule, evaluate
from ..ir.decisions import Decision, decide, default_decision_of
from ..spec.model import Spec

__all__ = ["Decision", "combine", "default_decision", "reference_decision"]


def default_decision(spec: Spec) -> Decision:
    """The decision for a packet that matches no rule (the spec's default action)."""
    return default_decision_of(spec.default_action)


def reference_decision(rules: Sequence[Rule], spec: Spec, packet: dict[str, int]) -> Decision:
    """Evaluate every rule on ``packet`` and combine their actions.

    Raises :class:`~subc.ir.decisions.ConflictingActions` (a :class:`SubcError`) when the
    matching rules' actions conflict (a ``fwd`` with another action, or two different
    non-forwarding actions).
    """
    return combine([r for r in rules if evaluate(r.condition, packet)], spec)


def combine(matched: Sequence[Rule], spec: Spec) -> Decision:
    """The decision for a packet that matches exactly the rules ``matched`` (errors as above)."""
    atoms: set = set()
    for r in matched:
        atoms |= r.atoms()
    return decide(atoms, default_decision(spec))
