"""Slicing the rule BDD into one stage per field plus a leaf stage (Algorithm 1, Jepsen et al. 2018).

At the boundary before field i, every distinct BDD node reachable from the root is a *state*.
Because the BDD is reduced and canonical, two states of one stage never have the same future
behaviour.  For each state, the cofactors over the field's elementary intervals give the next
state of every interval; adjacent intervals with the same next state are merged into one run.
State 0 is the *dead* state (no rule can match any more); states are numbered from 1 in order of
discovery (deterministic).  After the last field, each state is a leaf: the set of action atoms
of the packets that reach it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .bdd import FieldDomain, RuleBDD, index_segments, leaf_atoms


@dataclass
class StageState:
    """One input state of a stage: ``runs`` are (lo, hi, next state) over the field's values,
    covering ``[0, 2**W - 1]`` in order, with adjacent runs leading to different states."""

    state: int
    runs: list[tuple[int, int, int]]

    def target(self, v: int) -> int:
        for lo, hi, t in self.runs:
            if lo <= v <= hi:
                return t
        raise ValueError(v)


@dataclass
class Stage:
    """The logical table of one field: its domain, its input states, and how many next states."""

    domain: FieldDomain
    states: list[StageState]
    n_next: int

    @property
    def field(self):
        return self.domain.field


@dataclass(eq=False)
class Leaf:
    """A final state and its atoms; ``example`` is one packet ({field: value}) that reaches it.

    The atoms are kept as a tuple, ``atom_items`` (any order, no repeats):
    a leaf of a hundred ``fwd`` atoms takes 0.9 KB so, 4 KB as a frozenset, and a large rule set
    has tens of thousands of leaves alive at once.  :attr:`atoms` gives them as a frozenset;
    leaves are equal when their states, atoms (as sets) and examples are."""

    state: int
    atom_items: tuple
    example: dict[str, int] = field(default_factory=dict)

    @property
    def atoms(self) -> frozenset:
        """The atoms as a frozenset (built on each call)."""
        return frozenset(self.atom_items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Leaf):
            return NotImplemented
        return (self.state, self.atoms, self.example) == (other.state, other.atoms, other.example)


@dataclass
class Sliced:
    """The result of slicing: stages in field order, leaves (non-dead), and the root state (0 or 1).

    ``work`` (not compared) counts the item visits of the layered slicer (:mod:`.layered`), 0 from
    :func:`slice_bdd`."""

    stages: list[Stage]
    leaves: list[Leaf]
    root_state: int
    work: int = field(default=0, compare=False)


def slice_bdd(rb: RuleBDD) -> Sliced:
    """Slice ``rb`` into stages (see the module docstring)."""
    bdd = rb.bdd
    dead = rb.dead(0)
    root_state = 0 if rb.root == dead else 1
    current: dict[int, tuple[int, object, dict]] = {}  # node id -> (state, node, example path)
    if root_state:
        current[int(rb.root)] = (1, rb.root, {})
    stages: list[Stage] = []
    for i, dom in enumerate(rb.domains):
        next_dead = rb.dead(i + 1)
        nxt: dict[int, tuple[int, object, dict]] = {}
        states: list[StageState] = []
        for _, (sid, node, path) in sorted(current.items(), key=lambda kv: kv[1][0]):
            runs: list[tuple[int, int, int]] = []
            for first, last, child in index_segments(bdd, node, dom):
                lo, _ = dom.interval(first)
                _, hi = dom.interval(last)
                if child == next_dead:
                    tgt = 0
                else:
                    key = int(child)
                    if key not in nxt:
                        nxt[key] = (len(nxt) + 1, child, {**path, dom.field.name: lo})
                    tgt = nxt[key][0]
                if runs and runs[-1][2] == tgt and runs[-1][1] + 1 == lo:
                    runs[-1] = (runs[-1][0], hi, tgt)
                else:
                    runs.append((lo, hi, tgt))
            states.append(StageState(sid, runs))
        stages.append(Stage(dom, states, len(nxt)))
        current = nxt
    ordered = sorted(current.values(), key=lambda t: t[0])
    leaves = [Leaf(sid, tuple(leaf_atoms(rb, node)), path) for sid, node, path in ordered]
    return Sliced(stages, leaves, root_state)
