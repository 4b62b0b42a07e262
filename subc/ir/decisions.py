"""Decision semantics: what a message that matches a set of rules gets (Camus semantics).

The one definition that the compiler (leaf decisions of the IR), ``subc check`` (conflicts), the
reference (:mod:`subc.semantics.reference`) and the vectorised reference
(:mod:`subc.analysis.reference_np`) use.

An *atom* is one action of a rule as a tuple: ``('fwd', port)`` per port of a ``fwd``, else
``(name, *args)`` (``('drop',)``, ``('nop',)``, a spec action with its arguments).  A message
gets the atoms of every rule it matches:

* several ``fwd`` atoms merge into one port set (one port: unicast, several: a multicast group);
* one non-forwarding atom is applied as it is;
* a ``fwd`` together with a non-forwarding atom, or two different non-forwarding atoms, is a
  *conflict* (an error that names both rules at compile and check time);
* no atom (no rule matches, or the message lacks a header that the rules test) gets the spec's
  default action.

*State atoms* are not part of a decision: ``('subc_update', k)`` (the stateful pass's update
rules, :mod:`.aggregates`) and ``('subc_count', counter, field)`` (a rule's ``inc(counter)``,
``counter <- count()`` with field None, or ``counter <- sum(field)``) change registers and never
conflict; :func:`decide` and :func:`conflicting_pair` leave them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Collection, Iterable

from ..errors import SubcError

#: The forwarding action's name; every other atom is a non-forwarding action.
FWD = "fwd"
#: The atom name of an aggregate instance's update (see the module docstring).
UPDATE_ATOM = "subc_update"
#: The atom name of a named counter's update: ``('subc_count', counter, field or None)``.
COUNT_ATOM = "subc_count"
#: Atom names that change state and take no part in decisions.
STATE_ATOMS = frozenset((UPDATE_ATOM, COUNT_ATOM))
_ONLY_FWD = frozenset((FWD,))
_name, _port = itemgetter(0), itemgetter(1)  # of an atom: ('fwd', port) or (name, *args)


@dataclass(frozen=True)
class Decision:
    """What happens to a message: ``ports`` it is sent to (sorted, distinct), or ``action``
    (name, *args) when it is not forwarded."""

    ports: tuple[int, ...] = ()
    action: tuple | None = None

    def __str__(self) -> str:
        if self.ports:
            return "fwd(" + ", ".join(map(str, self.ports)) + ")"
        assert self.action is not None  # a decision that forwards nowhere has its action
        name, *args = self.action
        return f"{name}({', '.join(map(str, args))})"


class ConflictingActions(SubcError):
    """Two atoms of one message cannot apply together; ``pair`` holds them (see the module
    docstring)."""

    def __init__(self, pair: tuple[tuple, tuple], atoms: Iterable[tuple]):
        super().__init__(f"conflicting actions on one packet: {sorted(atoms, key=repr)}")
        self.pair = pair


def action_class(atom: tuple) -> object:
    """The class of an atom for conflicts: every ``fwd`` atom is one class ('fwd'), a state atom
    none (None: it conflicts with nothing), any other atom is its own class.  Two atoms with
    classes conflict exactly when their classes differ."""
    if atom[0] in STATE_ATOMS:
        return None
    return FWD if atom[0] == FWD else atom


def conflicting_pair(atoms: Iterable[tuple]) -> tuple[tuple, tuple] | None:
    """The first pair of ``atoms`` that cannot apply to one message, or None.

    Deterministic: the pair is (a ``fwd`` atom, the first other atom by ``repr``) when there is a
    ``fwd``, else the first two non-forwarding atoms by ``repr``.  State atoms never conflict."""
    if _ONLY_FWD.issuperset(map(_name, atoms)):  # forwarding only (most leaves): nothing conflicts
        return None
    atoms = [a for a in atoms if a[0] not in STATE_ATOMS]
    others = sorted((a for a in atoms if a[0] != FWD), key=repr)
    ports = [a for a in atoms if a[0] == FWD]
    if not others or (not ports and len(others) == 1):
        return None
    if ports:
        return min(ports), others[0]
    return others[0], others[1]


def forwarding_ports(atoms: Collection[tuple]) -> tuple[int, ...] | None:
    """The sorted ports of ``atoms`` (distinct atoms) when there is one and every one is a
    ``fwd`` atom, else None: then ``decide(atoms, d) == Decision(ports)`` and no pair of them
    conflicts (one pass over the atoms, where :func:`decide` makes a set of them)."""
    if atoms and _ONLY_FWD.issuperset(map(_name, atoms)):
        # (distinct ports; a set of small ints iterates almost in order: sorted in a pass or two)
        return tuple(sorted(set(map(_port, atoms))))
    return None


def decide(atoms: Iterable[tuple], default: Decision) -> Decision:
    """The decision for a message whose matched rules have ``atoms`` (none but state atoms:
    ``default``).

    Raises :class:`ConflictingActions` (a :class:`SubcError`) on a conflict."""
    atoms = set(atoms)
    if not atoms:
        return default
    if _ONLY_FWD.issuperset(map(_name, atoms)):  # forwarding only (most leaves)
        return Decision(tuple(sorted(map(_port, atoms))), None)
    atoms = {a for a in atoms if a[0] not in STATE_ATOMS}
    if not atoms:
        return default
    pair = conflicting_pair(atoms)
    if pair is not None:
        raise ConflictingActions(pair, atoms)
    ports = tuple(sorted(a[1] for a in atoms if a[0] == FWD))
    if ports:
        return Decision(ports, None)
    (atom,) = atoms
    return Decision((), atom)


def default_decision_of(action_name: str) -> Decision:
    """The decision of a message that matches no rule, for the spec's ``query_default_action``
    (a spec action without parameters, or 'drop' or 'nop')."""
    return Decision((), (action_name,))


def describe_atom(atom: tuple) -> str:
    """An atom as a rule writes it: ``fwd(3)``, ``drop()``, ``name(arg, ...)``, ``inc(c)``,
    ``c <- sum(h.f)``."""
    if atom[0] == FWD:
        return f"fwd({atom[1]})"
    if atom[0] == COUNT_ATOM:
        return f"inc({atom[1]})" if atom[2] is None else f"{atom[1]} <- sum({atom[2]})"
    return f"{atom[0]}({', '.join(str(a) for a in atom[1:])})"


def conflict_message(second: tuple, first: tuple, where: str, first_rule_at: str | None) -> str:
    """The wording of a conflict error: ``second`` is an atom of the rule the error points at,
    ``first`` an atom of the rule at ``first_rule_at`` (None: the same rule); ``where`` describes
    the message (``field=value, ...``)."""
    if first_rule_at is None:
        head = f"conflicting actions: {describe_atom(first)} and {describe_atom(second)} of this rule"
    else:
        head = (
            f"conflicting actions: {describe_atom(second)} of this rule and {describe_atom(first)} "
            f"of the rule at {first_rule_at}"
        )
    return f"{head} apply to the same packet ({where}); a packet can be forwarded or get one other action, not both"
