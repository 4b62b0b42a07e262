"""The rule AST: what the rule parser produces and both the compiler and the reference consume.

A predicate keeps the comparison as written (operator and literal values, already converted to
raw field values) so that the reference semantics evaluate it directly, independently of the
interval sets that the compiler derives from it (:meth:`Pred.values`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Callable, Protocol, Union

from ..errors import Location
from ..ir.intervals import IntervalSet


class Shape(Protocol):
    """What a deferred :class:`Rule` needs of its shape (:class:`subc.lang.shapes.Shape`)."""

    def materialize(self, start: int) -> tuple:
        """(condition, actions, location, text) of the rule whose piece starts at ``start``."""
        ...

    def offset_of(self, index: int) -> int:
        """The start offset of the piece of the rule numbered ``index``."""
        ...

    def span(self, start: int) -> tuple:
        """(location, text) of the rule whose piece starts at ``start``."""
        ...


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
    """A predicate ``field op operand(s)``: ``field`` is the resolved 'header.field' name, ``width`` bits.

    ``location`` is where the comparison starts; None in a rule's shared ``core`` (:class:`Rule`)."""

    field: str
    width: int
    op: str
    operands: tuple[Operand, ...]
    location: Location | None

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


#: Aggregate functions of stateful predicates (docs/state.md "Stateful subscriptions").
AGGREGATES = ("count", "sum", "avg", "min", "max")
#: The kind of a named counter's :class:`Aggregate`.
COUNTER = "counter"
#: Aggregates whose value over an empty window is undefined: every comparison on it is false.
UNDEFINED_WHEN_EMPTY = ("avg", "min", "max")
#: Most comparisons on state one rule may hold (its stateless part is found over every truth
#: assignment of them: 2**n).
MAX_STATE_PREDICATES = 10


@dataclass(frozen=True)
class Aggregate:
    """An aggregate over a tumbling window: ``kind`` (one of :data:`AGGREGATES`), the aggregated
    ``field`` ('header.field', None for ``count()``) of ``width`` bits (0 without a field), and
    ``window_ns``, the window's length in ns (0: one window that never ends).

    Its value over a window (docs/state.md "Stateful subscriptions"): ``count`` the messages, ``sum``
    their field values (saturating at 2**64 - 1), ``avg`` the exact mean (a
    :class:`~fractions.Fraction`), ``min``/``max`` the extremes; ``avg``, ``min`` and ``max`` of
    an empty window are None.

    A *named counter* (``@pragma query_counter(name, window_us)``) is kind :data:`COUNTER` with
    its ``name`` (field None, width 0): its value is what the rules' ``inc(name)`` and
    ``name <- ...`` actions added in the window, before the message's own additions."""

    kind: str
    field: str | None
    width: int
    window_ns: int
    name: str | None = None

    def __str__(self) -> str:
        if self.kind == COUNTER:
            return str(self.name)
        args = [self.field] if self.field else []
        return f"{self.kind}({', '.join(args)})"


@dataclass(frozen=True)
class StatePred:
    """A comparison on state: ``agg op operand(s)`` (the operators of :data:`OPS`, operands whole
    values converted as for the aggregated field: its scale applies).  ``location`` as for
    :class:`Pred`."""

    agg: Aggregate
    op: str
    operands: tuple[Operand, ...]
    location: Location | None

    @property
    def key(self) -> tuple:
        """The comparison without its location: two comparisons with one key are one unknown of
        a rule's stateless part (:func:`state_predicates`)."""
        return (self.agg, self.op, self.operands)

    def holds(self, value: "int | Fraction | None") -> bool:
        """The comparison on the aggregate's ``value`` (None, an empty window's ``avg``, ``min`` or
        ``max``: false for every operator)."""
        if value is None:
            return False
        op = self.op
        if op in ("in", "==", "!=", "not in"):
            hit = any(value == o.value for o in self.operands)
            return hit if op in ("in", "==") else not hit
        c = self.operands[0].value
        return {"<": value < c, "<=": value <= c, ">": value > c, ">=": value >= c}[op]


@dataclass(frozen=True)
class And:
    items: tuple["Expr", ...]


@dataclass(frozen=True)
class Or:
    items: tuple["Expr", ...]


@dataclass(frozen=True)
class Not:
    item: "Expr"


Expr = Union[Pred, StatePred, And, Or, Not]


@dataclass(frozen=True)
class Action:
    """An action call: ``fwd`` (args are ports), ``drop``, or a spec action with raw argument values
    (integers); the update of a named counter (:data:`~subc.ir.decisions.COUNT_ATOM`) has the
    counter's name and the added field's name (or None) as args.  ``location`` is that of its
    name; None in a rule's shared atoms (:class:`Rule`)."""

    name: str
    args: tuple[int | str | None, ...]
    location: Location | None

    def atoms(self) -> list[tuple]:
        """The action as atoms: one ('fwd', port) per port, else (name, *args)."""
        if self.name == "fwd":
            return [("fwd", p) for p in self.args]
        return [(self.name, *self.args)]


class Rule:
    """One subscription: ``index`` (0-based, in file order), ``condition``, ``actions``,
    ``location`` (of its first character) and its source ``text`` (from its first character to its
    ``;``).

    ``Rule(index, condition, actions, location, text)`` holds them all.  The shape parser
    (:mod:`.rule_shapes`) makes *deferred* rules instead (:meth:`deferred`): they keep a shared
    ``core`` condition and atom set, and build their located condition, actions, location and text
    from the source text on first use, so that a million rules take about a hundred bytes each
    until something asks for those.  Either way:

    * ``condition``, ``actions``, ``location``, ``text``: as the resolver builds them (every
      predicate and action located);
    * ``core``: a condition equal in meaning to ``condition`` (the same predicates, operators and
      raw values), possibly shared with other rules and without predicate locations: what the
      compiler slices (:mod:`.layered`, :mod:`.bdd`);
    * ``atom_set`` (also :meth:`atoms`): the action atoms, a frozenset;
    * ``shape``: None, or an object shared by deferred rules of one shape: their conditions have
      the same structure and test the same fields in the same order (only the literals differ).

    Rules compare and hash by their materialised fields, and pickle as plain rules.
    """

    __slots__ = ("index", "core", "atom_set", "shape", "_parts")

    def __init__(self, index: int, condition: "Expr", actions: tuple["Action", ...], location: Location, text: str):
        self.index = index
        self.core = condition
        self.atom_set = frozenset(x for act in actions for x in act.atoms())
        self.shape: Shape | None = None
        self._parts: object = (condition, actions, location, text)

    @classmethod
    def deferred(cls, index: int, core: "Expr", atoms: frozenset, shape: "Shape", start: int | None) -> "Rule":
        """A rule whose condition, actions, location and text ``shape.materialize(start)`` gives
        as a tuple on first use (``start``: the offset of its piece; None: the one
        ``shape.offset_of(index)`` gives); ``core`` and ``atoms`` mean what those would give."""
        r = cls.__new__(cls)
        r.index, r.core, r.atom_set, r.shape, r._parts = index, core, atoms, shape, start
        return r

    def _full(self) -> tuple:
        parts = self._parts
        if type(parts) is not tuple:  # deferred: the offset of the rule's piece, or None (its shape has it)
            assert self.shape is not None  # a deferred rule has its shape
            start = parts if type(parts) is int else self.shape.offset_of(self.index)
            parts = self._parts = self.shape.materialize(start)
        return parts

    @property
    def condition(self) -> "Expr":
        return self._full()[0]

    @property
    def actions(self) -> tuple["Action", ...]:
        return self._full()[1]

    @property
    def location(self) -> Location:
        return self._full()[2]

    @property
    def text(self) -> str:
        return self._full()[3]

    def source(self) -> tuple[Location, str]:
        """(``location``, ``text``); a deferred rule that has not been materialised gives them
        without building its condition and actions (``shape.span(start)``), and stays deferred."""
        parts = self._parts
        if type(parts) is not tuple:  # deferred: the offset of its piece, or None (its shape has it)
            assert self.shape is not None  # a deferred rule has its shape
            return self.shape.span(parts if type(parts) is int else self.shape.offset_of(self.index))
        return parts[2], parts[3]

    def atoms(self) -> frozenset:
        """The rule's action atoms (see :meth:`Action.atoms`): ``atom_set``."""
        return self.atom_set

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Rule):
            return NotImplemented
        return self.index == other.index and self._full() == other._full()

    def __hash__(self) -> int:
        return hash((self.index, self.location, self.text))

    def __repr__(self) -> str:
        cond, actions, location, text = self._full()
        return (
            f"Rule(index={self.index!r}, condition={cond!r}, actions={actions!r}, location={location!r}, text={text!r})"
        )

    def __reduce__(self):
        return (Rule, (self.index, *self._full()))


def evaluate(expr: Expr, packet: dict[str, int], state: Callable[[StatePred], bool] | None = None) -> bool:
    """Evaluate a condition on a packet given as {'header.field': value} (reference semantics);
    ``state`` gives the truth of each comparison on state (a condition with one and no ``state``
    raises TypeError)."""
    if isinstance(expr, Pred):
        return expr.holds(packet[expr.field])
    if isinstance(expr, StatePred):
        if state is None:
            raise TypeError(f"a comparison on state ({expr.agg}) needs the state to be evaluated")
        return state(expr)
    if isinstance(expr, And):
        return all(evaluate(e, packet, state) for e in expr.items)
    if isinstance(expr, Or):
        return any(evaluate(e, packet, state) for e in expr.items)
    return not evaluate(expr.item, packet, state)


def state_predicates(expr: Expr) -> list[StatePred]:
    """The distinct comparisons on state of ``expr`` (by :attr:`StatePred.key`), in order of
    first use."""
    out: dict[tuple, StatePred] = {}
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, StatePred):
            out.setdefault(e.key, e)
        elif isinstance(e, Not):
            stack.append(e.item)
        elif isinstance(e, (And, Or)):
            stack.extend(reversed(e.items))
    return list(out.values())


def predicates(expr: Expr):
    """All predicates on header fields of ``expr`` (not those on state), depth first."""
    if isinstance(expr, Pred):
        yield expr
    elif isinstance(expr, StatePred):
        return
    elif isinstance(expr, Not):
        yield from predicates(expr.item)
    else:
        for e in expr.items:
            yield from predicates(e)
