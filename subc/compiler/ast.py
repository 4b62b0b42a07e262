"""The rule AST: what the rule parser produces and both the compiler and the reference consume.

A predicate keeps the comparison as written (operator and literal values, already converted to
raw field values) so that the reference semantics evaluate it directly, independently of the
interval sets that the compiler derives from it (:meth:`Pred.values`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Union

from ..errors import Location
from .intervals import IntervalSet

#: Operators of a predicate.  'in' holds several operands; a prefix operand is (value, prefix_len).
OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "not in")


@dataclass(frozen=True)
class Operand:
    """A literal as a raw field value; ``prefix_len`` is set for a prefix ``value/len``."""

    value: int
    prefix_len: int | None = None

    def contains(self, v: int, width: int) -> bool:
        """True when ``v`` equals the value (or lies within the prefix)."""
        if self.prefix_len is None:
            return v == self.value
        shift = width - self.prefix_len
        return (v >> shift) == (self.value >> shift)

    def interval(self, width: int) -> tuple[int, int]:
        if self.prefix_len is None:
            return (self.value, self.value)
        span = (1 << (width - self.prefix_len)) - 1
        return (self.value, self.value | span)


@dataclass(frozen=True)
class Pred:
    """A predicate ``field op operand(s)``: ``field`` is the resolved 'header.field' name, ``width`` bits."""

    field: str
    width: int
    op: str
    operands: tuple[Operand, ...]
    location: Location

    def holds(self, v: int) -> bool:
        """Direct evaluation on the field value ``v`` (the reference semantics)."""
        op, w = self.op, self.width
        if op in ("in", "==", "!=", "not in"):
            hit = any(o.contains(v, w) for o in self.operands)
            return hit if op in ("in", "==") else not hit
        c = self.operands[0].value
        return {"<": v < c, "<=": v <= c, ">": v > c, ">=": v >= c}[op]

    def values(self) -> IntervalSet:
        """The set of field values that satisfy the predicate (shared between equal predicates:
        do not mutate it)."""
        return _pred_values(self.width, self.op, self.operands)


@lru_cache(maxsize=1 << 16)
def _pred_values(width: int, op: str, operands: tuple[Operand, ...]) -> IntervalSet:
    """:meth:`Pred.values`, cached: large rule sets repeat a few thousand distinct predicates."""
    top = (1 << width) - 1
    if op in ("in", "==", "!=", "not in"):
        s = IntervalSet(top, [o.interval(width) for o in operands])
        return s if op in ("in", "==") else s.complement()
    c = operands[0].value
    lo_hi = {"<": (0, c - 1), "<=": (0, c), ">": (c + 1, top), ">=": (c, top)}[op]
    return IntervalSet(top, [lo_hi])


@dataclass(frozen=True)
class And:
    items: tuple["Expr", ...]


@dataclass(frozen=True)
class Or:
    items: tuple["Expr", ...]


@dataclass(frozen=True)
class Not:
    item: "Expr"


Expr = Union[Pred, And, Or, Not]


@dataclass(frozen=True)
class Action:
    """An action call: ``fwd`` (args are ports), ``drop``, or a spec action with raw argument values."""

    name: str
    args: tuple[int, ...]
    location: Location

    def atoms(self) -> list[tuple]:
        """The action as atoms: one ('fwd', port) per port, else (name, *args)."""
        if self.name == "fwd":
            return [("fwd", p) for p in self.args]
        return [(self.name, *self.args)]


@dataclass(frozen=True)
class Rule:
    """One subscription: ``index`` (0-based, in file order), condition, actions, location, source text."""

    index: int
    condition: Expr
    actions: tuple[Action, ...]
    location: Location
    text: str

    def atoms(self) -> frozenset:
        return frozenset(a for act in self.actions for a in act.atoms())


def evaluate(expr: Expr, packet: dict[str, int]) -> bool:
    """Evaluate a condition on a packet given as {'header.field': value} (reference semantics)."""
    if isinstance(expr, Pred):
        return expr.holds(packet[expr.field])
    if isinstance(expr, And):
        return all(evaluate(e, packet) for e in expr.items)
    if isinstance(expr, Or):
        return any(evaluate(e, packet) for e in expr.items)
    return not evaluate(expr.item, packet)


def predicates(expr: Expr):
    """All predicates of ``expr``, depth first."""
    if isinstance(expr, Pred):
        yield expr
    elif isinstance(expr, Not):
        yield from predicates(expr.item)
    else:
        for e in expr.items:
            yield from predicates(e)
