"""Rule shapes (see :mod:`.rule_shapes`, which finds them): a :class:`Shape` holds a shape's
pattern, template and caches and builds its deferred rules' parts; a :class:`ShapeCache` keeps
template shapes from one parse to the next.
"""

from __future__ import annotations

import re
from array import array

from .grammar_parser import SourceText
from .limits import DEFAULT_LIMITS, Limits
from .shape_templates import Template


class Shape:
    """A rule shape (see the module docstring): ``pattern`` is None when its pieces are parsed by
    Lark one by one; otherwise it matches exactly its pieces, and once the first piece has been
    resolved without error, ``template`` builds the others (:meth:`resolve`, :meth:`materialize`)
    of ``source``, with ``resolver`` (a :class:`~.rules.RuleResolver` over ``source``) for the
    literals and their errors."""

    def __init__(self, source: SourceText, resolver):
        self.source, self.resolver = source, resolver
        self.template: Template | None = None
        self.pattern: re.Pattern | None = None
        self.cond_groups: tuple[int, ...] = ()
        self.act_groups: tuple[int, ...] = ()
        #: for a template whose condition literals are consecutive groups, and its action
        #: literals too: the pattern with two groups only, the text from the first to the last
        #: condition literal and likewise for the actions (empty when there are none), one
        #: string each that stands for the literal texts of its part (:mod:`.rule_shapes`)
        self.span_pattern: re.Pattern | None = None
        self.conditions: dict = {}  # condition literal texts -> core condition
        self.atom_sets: dict = {}  # action literal texts -> atoms
        #: the start offsets of the pieces of one parse, by rule index from ``first_index`` (its
        #: deferred rules keep no offset of their own: 28 bytes a rule)
        self.offsets: array | None = None
        self.first_index = 0

    def offset_of(self, index: int) -> int:
        """The start offset of the piece of rule ``index`` of the parse that made this shape's
        rules (:attr:`offsets`)."""
        assert self.offsets is not None  # set by the parser for the shapes of its rules
        return self.offsets[index - self.first_index]

    def resolve(self, m: re.Match, ck, ak) -> tuple:
        """(core condition, atoms) of the piece matched by ``m`` with condition and action literal
        texts ``ck`` and ``ak``, cached; raises SubcError as the resolver would on that piece."""
        tpl = self.template
        assert tpl is not None  # only a template shape's pieces are matched and resolved
        cond = self.conditions.get(ck)
        r = self.resolver
        if cond is None:
            cond = self.conditions[ck] = tpl.cond(m, None, r)
        atoms = self.atom_sets.get(ak)
        if atoms is None:
            atoms = self.atom_sets[ak] = frozenset(a for f in tpl.actions for a in f(m, None, r).atoms())
        return cond, atoms

    def rebound(self, source: SourceText, resolver) -> "Shape":
        """This template shape for the pieces of another text (``source``, ``resolver``): the
        pattern, template and caches are shared."""
        s = Shape(source, resolver)
        s.template, s.pattern = self.template, self.pattern
        s.cond_groups, s.act_groups = self.cond_groups, self.act_groups
        s.span_pattern = self.span_pattern
        s.conditions, s.atom_sets = self.conditions, self.atom_sets
        return s

    def span(self, start: int) -> tuple:
        """(location, text) of the deferred rule whose piece starts at ``start``, as
        :meth:`materialize` gives them, without building its condition and actions."""
        tpl, pattern = self.template, self.pattern
        assert tpl is not None and pattern is not None  # deferred rules are made of template shapes only
        m = pattern.match(self.source.text, start)
        if m is None:  # pragma: no cover - the piece matched when it was parsed
            raise RuntimeError(f"rule at offset {start} no longer matches its shape")
        s, e = tpl.start(m), tpl.end(m)
        return self.source.location(s), self.source.text[s:e]

    def materialize(self, start: int) -> tuple:
        """(condition, actions, location, text) of the deferred rule whose piece starts at ``start``,
        with every predicate and action located, as the resolver builds them."""
        tpl, pattern = self.template, self.pattern
        assert tpl is not None and pattern is not None  # deferred rules are made of template shapes only
        m = pattern.match(self.source.text, start)
        if m is None:  # pragma: no cover - the piece matched when it was parsed
            raise RuntimeError(f"rule at offset {start} no longer matches its shape")
        loc, r = self.source.location, self.resolver
        s, e = tpl.start(m), tpl.end(m)
        return tpl.cond(m, loc, r), tuple(f(m, loc, r) for f in tpl.actions), loc(s), self.source.text[s:e]


class ShapeCache:
    """Template shapes kept from one parse to the next, for a program that parses many small texts
    of few shapes one at a time (``subc serve`` parses each request's condition alone): a text's
    pieces of a known shape are then matched without Lark.  For one ``spec`` and ``limits``.

    Shapes hold caches of the literal texts they have seen (conditions, operands), so the cache is
    bounded: it forgets everything after ``max_rules`` rules parsed through it, or when a new shape
    would make more than ``max_shapes``.  Not thread-safe (one parsing thread)."""

    def __init__(self, spec, limits: Limits = DEFAULT_LIMITS, max_shapes: int = 256, max_rules: int = 200_000):
        self.spec, self.limits = spec, limits
        self.max_shapes, self.max_rules = max_shapes, max_rules
        self.shapes: dict[tuple, Shape] = {}
        self.rules = 0  # parsed since the cache was last emptied

    def get(self, key: tuple, source: SourceText, resolver) -> Shape | None:
        """The shape of ``key`` for the pieces of ``source`` (None: not known)."""
        shape = self.shapes.get(key)
        return None if shape is None else shape.rebound(source, resolver)

    def put(self, key: tuple, shape: Shape) -> None:
        """Keep template shape ``shape``."""
        if len(self.shapes) >= self.max_shapes:
            self.shapes.clear()
        self.shapes[key] = shape

    def parsed(self, n: int) -> None:
        """Note ``n`` rules parsed with the cache."""
        self.rules += n
        if self.rules > self.max_rules:
            self.shapes.clear()
            self.rules = 0
