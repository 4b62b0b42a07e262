"""Parsed rules held in columns, and the questions the compiler asks of a rule set.

The shape parser (:mod:`.rule_shapes`) fills a :class:`RuleStore` instead of making one
:class:`~.ast.Rule` per rule: a million rules of one shape share about a hundred thousand core
conditions, so the store keeps, per rule, the number of its *group* (rules with the same core
condition object, numbered in order of first appearance) and of its *leaf* (its interned atom
set), and, per group, the core, the shape and the leaves of its rules.  The compiler's first pass
(rules grouped by core, :func:`rules_by_core`) is then made while parsing.  Rules are built on
demand (:meth:`RuleStore.__getitem__`, iteration), deferred as the parser used to make them.

The functions below answer for any sequence of rules, from the columns when it is a store.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter
from typing import overload

from .ast import Rule, Shape

_core_and_atoms = attrgetter("core", "atom_set")


class RuleStore(Sequence[Rule]):
    """The rules of one parse, numbered from ``first_index``, as columns (see the module docstring).

    ``offsets`` is the parse's array of the start offsets of the rules' pieces (an ``array('q')``,
    one per rule, filled by the parser; only deferred rules' are read).  Per rule: ``group_of``
    and ``leaf_of`` (arrays of its group number, and of its leaf number, -1 for no atoms); per
    group: ``cores`` (the core condition), ``shapes`` (the deferred rules' shape, None for a rule
    the resolver built, which is kept whole in ``eager`` by index), ``leaves`` (the leaf numbers of
    its rules with atoms, in rule order).  ``leaf_keys`` are the distinct non-empty atom sets by
    leaf number (in order of first appearance), ``leaf_ids`` their inverse; ``empty_atoms`` tells
    whether a rule has none."""

    def __init__(self, first_index: int = 0, offsets: array | None = None):
        self.first_index = first_index
        self.offsets = offsets if offsets is not None else array("q")
        self.group_of = array("i")
        self.leaf_of = array("i")
        self.cores: list = []
        self.shapes: list[Shape | None] = []
        self.leaves: list[list[int]] = []
        self.eager: dict[int, Rule] = {}
        self.leaf_ids: dict[frozenset, int] = {}
        self.leaf_keys: list[frozenset] = []
        self.empty_atoms = False

    def new_group(self, core, shape: Shape | None) -> int:
        """A new group of core condition ``core`` (rules of ``shape``, or None): its number."""
        self.cores.append(core)
        self.shapes.append(shape)
        self.leaves.append([])
        return len(self.cores) - 1

    def leaf(self, atoms: frozenset) -> int:
        """The leaf number of atom set ``atoms`` (interned on first sight), -1 when it is empty."""
        if not atoms:
            self.empty_atoms = True
            return -1
        x = self.leaf_ids.get(atoms)
        if x is None:
            x = self.leaf_ids[atoms] = len(self.leaf_keys)
            self.leaf_keys.append(atoms)
        return x

    def add(self, group: int, leaf: int) -> None:
        """Append a rule of ``group`` with ``leaf`` (the shape parser fills the columns itself, then
        :meth:`join_leaves`)."""
        self.group_of.append(group)
        self.leaf_of.append(leaf)
        if leaf >= 0:
            self.leaves[group].append(leaf)

    def join_leaves(self, start: int) -> None:
        """Append the leaves of the rules from position ``start`` on to their groups' lists
        (:attr:`leaves`), in rule order, but the -1s (no atoms): for rules whose numbers were
        appended to :attr:`group_of` and :attr:`leaf_of` directly (the shape parser's runs: its loop
        over a million rules is 15% faster without an append per rule to these lists)."""
        gs, ls = self.group_of[start:], self.leaf_of[start:]
        lists = self.leaves
        if -1 in ls:
            for g, leaf in zip(gs, ls):
                if leaf >= 0:
                    lists[g].append(leaf)
        else:
            deque(map(list.append, map(lists.__getitem__, gs), ls), maxlen=0)

    def add_rule(self, rule: Rule) -> None:
        """Append ``rule``, kept whole (its own group); its index must be the next one."""
        self.eager[rule.index] = rule
        self.add(self.new_group(rule.core, None), self.leaf(rule.atom_set))

    @classmethod
    def of(cls, rules: Iterable[Rule], first_index: int = 0) -> "RuleStore":
        """A store of ``rules`` (indexed ``first_index``, ``first_index`` + 1, ...), kept whole."""
        store = cls(first_index)
        for r in rules:
            store.add_rule(r)
        return store

    def __len__(self) -> int:
        return len(self.group_of)

    def rule(self, i: int) -> Rule:
        """The rule at position ``i`` (0 <= i < len): the resolver's, or a new deferred rule."""
        index = self.first_index + i
        r = self.eager.get(index)
        if r is not None:
            return r
        g, leaf = self.group_of[i], self.leaf_of[i]
        shape = self.shapes[g]
        assert shape is not None  # a group without a shape holds one eager rule
        atoms = self.leaf_keys[leaf] if leaf >= 0 else frozenset()
        return Rule.deferred(index, self.cores[g], atoms, shape, self.offsets[i])

    @overload
    def __getitem__(self, i: int) -> Rule: ...

    @overload
    def __getitem__(self, i: slice) -> list[Rule]: ...

    def __getitem__(self, i: int | slice) -> Rule | list[Rule]:
        if isinstance(i, slice):
            return [self.rule(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("rule index out of range")
        return self.rule(i)

    def __iter__(self) -> Iterator[Rule]:
        eager, cores, shapes, keys = self.eager, self.cores, self.shapes, self.leaf_keys
        empty: frozenset = frozenset()
        deferred = Rule.deferred
        index, offsets = self.first_index, self.offsets
        for i, (g, leaf) in enumerate(zip(self.group_of, self.leaf_of)):
            shape = shapes[g]
            if shape is None:
                yield eager[index + i]
            else:
                yield deferred(index + i, cores[g], keys[leaf] if leaf >= 0 else empty, shape, offsets[i])


def rules_by_core(rules: Sequence[Rule], leaf_ids: dict, leaf_keys: list) -> dict[int, tuple]:
    """``rules`` grouped by core condition object, each with the leaf numbers of its rules that
    have atoms (their atom sets interned in ``leaf_ids``/``leaf_keys``, numbered in order of first
    appearance): ``{id(core): (core, [leaf, ...])}`` in order of first appearance.  The lists of a
    :class:`RuleStore` are its own: the caller must not change them."""
    if isinstance(rules, RuleStore):
        leaf_ids.update(rules.leaf_ids)
        leaf_keys.extend(rules.leaf_keys)
        return {id(c): (c, leaves) for c, leaves in zip(rules.cores, rules.leaves)}
    by_core: dict[int, tuple] = {}
    for core, atoms in map(_core_and_atoms, rules):
        leaf = None
        if atoms:
            leaf = leaf_ids.get(atoms)
            if leaf is None:
                leaf = leaf_ids[atoms] = len(leaf_keys)
                leaf_keys.append(atoms)
        g = by_core.get(id(core))
        if g is None:
            g = by_core[id(core)] = (core, [])  # (keeps the core alive: its id stays its own)
        if leaf is not None:
            g[1].append(leaf)  # (a list: a million rules' sets would take 80 MB more)
    return by_core


def distinct_atom_sets(rules: Sequence[Rule]) -> list[frozenset]:
    """The distinct atom sets of ``rules``, in order of first appearance (the empty set included
    when a rule has no atoms; its place then is not kept for a :class:`RuleStore`)."""
    if isinstance(rules, RuleStore):
        return rules.leaf_keys + ([frozenset()] if rules.empty_atoms else [])
    return list(dict.fromkeys(r.atom_set for r in rules))


def unshaped_rules(rules: Sequence[Rule]) -> Iterable[Rule]:
    """The rules of ``rules`` without a ``shape`` (those the resolver built whole), in order."""
    if isinstance(rules, RuleStore):
        return [rules.eager[i] for i in sorted(rules.eager)]
    return (r for r in rules if r.shape is None)


def shape_cores(rules: Sequence[Rule]) -> Iterator[tuple]:
    """(core, shape) of the rules of ``rules`` in order, but of the rules of one shape (which test
    the same fields in the same order) only the first."""
    pairs = zip(rules.cores, rules.shapes) if isinstance(rules, RuleStore) else ((r.core, r.shape) for r in rules)
    shapes: set = set()
    for core, sh in pairs:
        if sh is not None:
            if sh in shapes:
                continue
            shapes.add(sh)
        yield core, sh
