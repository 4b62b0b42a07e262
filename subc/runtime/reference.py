"""Reference semantics: evaluate the rules directly on a packet, no BDD and no tables.

A packet is ``{'header.field': raw value}``.  The outcome (:class:`Decision`) is what a
compiled pipeline must produce: the union of the ports of every matching ``fwd``, or the one
non-forwarding action, or the spec's default action when no rule matches (Camus semantics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..compiler.ast import Rule, evaluate
from ..compiler.spec import Spec
from ..errors import SubcError


@dataclass(frozen=True)
class Decision:
    """What happens to a packet: ``ports`` it is sent to (sorted), or ``action`` (name, *args)."""

    ports: tuple[int, ...] = ()
    action: tuple | None = None

    def __str__(self) -> str:
        if self.ports:
            return "fwd(" + ", ".join(map(str, self.ports)) + ")"
        name, *args = self.action
        return f"{name}({', '.join(map(str, args))})"


def default_decision(spec: Spec) -> Decision:
    """The decision for a packet that matches no rule."""
    return Decision((), (spec.default_action,))


def reference_decision(rules: Sequence[Rule], spec: Spec, packet: dict[str, int]) -> Decision:
    """Evaluate every rule on ``packet`` and combine their actions.

    Raises :class:`SubcError` when the matching rules' actions conflict (a ``fwd`` with another
    action, or two different non-forwarding actions).
    """
    return combine([r for r in rules if evaluate(r.condition, packet)], spec)


def combine(matched: Sequence[Rule], spec: Spec) -> Decision:
    """The decision for a packet that matches exactly the rules ``matched`` (errors as above)."""
    atoms: set = set()
    for r in matched:
        atoms |= r.atoms()
    if not atoms:
        return default_decision(spec)
    ports = tuple(sorted(a[1] for a in atoms if a[0] == "fwd"))
    others = [a for a in atoms if a[0] != "fwd"]
    if (ports and others) or len(others) > 1:
        raise SubcError(f"conflicting actions on one packet: {sorted(atoms, key=repr)}")
    return Decision(ports, None) if ports else Decision((), others[0])
