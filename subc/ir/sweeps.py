"""The sweeps of :mod:`.layered`: one state's runs over a field, to the next states.

A state at a field boundary is a set of *items* (rules still alive, by what they still require of
the fields ahead), given as groups: index ranges of the field's elementary intervals -> the next
items whose ranges they are.  :func:`sweep` walks a state's range end points once and gives every
elementary interval its next state, next states identified by a 128-bit Zobrist hash of their
item set (:func:`zobrist_keys`) and numbered on first sight; :func:`root_by_point` and
:func:`root_groups` do it for the root state, kept as a trie.  :data:`DEAD` is the dead state.
"""

from __future__ import annotations

from functools import reduce
from itertools import chain
from operator import itemgetter, xor
from random import Random

#: The dead state (no item left) in a sweep's runs.
DEAD = -1
_first = itemgetter(0)


def zobrist_keys(level: int, count: int) -> list[int]:
    """``count`` pseudo-random 128-bit keys for the items of ``level`` (deterministic: a generator
    seeded with the level).  They only identify item sets (a state's hash is the XOR of its items'
    keys); the numbering of states never depends on their values."""
    bits = Random(0x5EED0000 + level).getrandbits
    return [bits(128) for _ in range(count)]


def sweep(
    groups: dict,
    k: int,
    zob: list[int],
    index: dict[int, int],
    states: list[tuple[int, ...] | int],
    leaf_atoms: tuple | None = None,
) -> list[tuple[int, int, int]]:
    """Runs ``(first, last, next state)`` of one state over the index range [0, k).

    The state is given as ``groups``: index ranges (or None: every index) -> the distinct next
    items whose ranges they are.  Next states are found in / added to ``index`` (Zobrist hash ->
    state number) and ``states`` (state number -> item tuple).  :data:`DEAD`: no item.
    ``leaf_atoms``, when the items are leaf items: (item -> its atoms, dict state number -> the
    atoms of its items, a tuple without repeats) to fill where that comes cheap (see
    :func:`_sweep_suffixes`); a state whose atoms are filled there is kept in ``states`` as its
    item count (an int) instead of its items, which no later pass reads (a leaf is its atoms).
    """
    if all(r is None or (len(r) == 1 and r[0][1] == k - 1) for r in groups):
        return _sweep_suffixes(groups, k, zob, index, states, leaf_atoms)
    events: list[tuple[int, int, list]] = []
    count: dict[int, int] = {}
    h = 0
    for ranges, items in groups.items():
        if ranges is None:
            for x in items:
                c = count.get(x)
                if c is None:
                    count[x] = 1
                    h ^= zob[x]
                else:
                    count[x] = c + 1
        else:
            for a, b in ranges:
                events.append((a, 1, items))
                if b + 1 < k:
                    events.append((b + 1, -1, items))
    events.sort(key=_first)
    runs: list[tuple[int, int, int]] = []
    start, j, ne = 0, 0, len(events)
    tgt: int | None  # a segment's next state (None: not numbered yet)
    while True:
        p = events[j][0] if j < ne else k
        if p > start:  # the segment [start, p - 1] has the current item set
            if not count:
                tgt = DEAD
            else:
                tgt = index.get(h)
                if tgt is None:
                    tgt = index[h] = len(states)
                    states.append(tuple(sorted(count)))
            if runs and runs[-1][2] == tgt:
                runs[-1] = (runs[-1][0], p - 1, tgt)
            else:
                runs.append((start, p - 1, tgt))
            start = p
        if j >= ne:
            return runs
        while j < ne and events[j][0] == p:
            _, d, items = events[j]
            if d == 1:
                for x in items:
                    c = count.get(x)
                    if c is None:
                        count[x] = 1
                        h ^= zob[x]
                    else:
                        count[x] = c + 1
            else:
                for x in items:
                    c = count[x]
                    if c == 1:
                        del count[x]
                        h ^= zob[x]
                    else:
                        count[x] = c - 1
            j += 1


def _sweep_suffixes(
    groups: dict,
    k: int,
    zob: list[int],
    index: dict[int, int],
    states: list[tuple[int, ...] | int],
    leaf_atoms: tuple | None = None,
) -> list[tuple[int, int, int]]:
    """:func:`sweep` when every group's ranges are one interval up to the last index (``field >
    P``, say) or every index: items only ever enter, so the current set is a set (set operations
    instead of counts), and so is the union of their atoms (``leaf_atoms``)."""
    starts = sorted(((0 if r is None else r[0][0], items) for r, items in groups.items()), key=_first)
    atoms_of, atoms_out = leaf_atoms if leaf_atoms is not None else (None, None)
    acc: set = set()  # the atoms of the active items
    active: set[int] = set()
    h = 0
    runs: list[tuple[int, int, int]] = []
    start, j, ne = 0, 0, len(starts)
    tgt: int | None  # a segment's next state (None: not numbered yet)
    while True:
        p = starts[j][0] if j < ne else k
        if p > start:  # the segment [start, p - 1] has the current item set
            if not active:
                tgt = DEAD
            else:
                tgt = index.get(h)
                if tgt is None:
                    tgt = index[h] = len(states)
                    if atoms_out is not None:
                        states.append(len(active))  # (its size: a leaf is its atoms)
                        atoms_out[tgt] = tuple(acc)  # (a leaf's atoms, compact: see Leaf)
                    else:
                        states.append(tuple(active))  # (any order: a state is a set)
            if runs and runs[-1][2] == tgt:
                runs[-1] = (runs[-1][0], p - 1, tgt)
            else:
                runs.append((start, p - 1, tgt))
            start = p
        if j >= ne:
            return runs
        while j < ne and starts[j][0] == p:
            new = set(starts[j][1]).difference(active)
            if new:
                active |= new
                h = reduce(xor, map(zob.__getitem__, new), h)
                if atoms_of is not None:
                    acc.update(chain.from_iterable(map(atoms_of, new)))
            j += 1


def groups_of(state: tuple[int, ...], keys: list) -> dict:
    """A state's items (``keys[item]`` = (ranges, next item)) grouped by their ranges."""
    groups: dict = {}
    for it in state:
        ranges, nxt = keys[it]
        g = groups.get(ranges)
        if g is None:
            groups[ranges] = [nxt]
        else:
            g.append(nxt)
    return groups


def root_by_point(root: dict, ranges0: list, k: int, states: list) -> list[tuple[int, int, int]] | None:
    """The root's runs when its groups' ranges on field 0 are pairwise disjoint (an exact field
    tested with ``==`` or ``in``, say): each group's trie (range id of field 1 -> items) is a next
    state as it is, numbered on first sight in value order (equal tries are one state) and appended
    to ``states``.  None when some ranges overlap (or some group allows any value)."""
    spans = []
    for c0, g in root.items():
        ranges = ranges0[c0]
        if ranges is None:
            return None
        for a, b in ranges:
            spans.append((a, b, c0))
    spans.sort(key=_first)
    for (_, b, _), (a, _, _) in zip(spans, spans[1:]):
        if a <= b:
            return None
    state_of: dict[int, int] = {}  # c0 -> next state
    by_size: dict[tuple[int, int], list[int]] = {}  # (groups, items) -> states of that size
    for _, _, c0 in spans:
        if c0 not in state_of:
            g = root[c0]
            same = by_size.setdefault((len(g), sum(map(len, g.values()))), [])
            st = next((x for x in same if states[x] == g), None)  # equal tries: one state
            if st is None:
                st = len(states)
                states.append(g)
                same.append(st)
            state_of[c0] = st
    runs: list[tuple[int, int, int]] = []
    start = 0
    for a, b, c0 in spans:
        if a > start:
            runs.append((start, a - 1, DEAD))
        t = state_of[c0]
        if runs and runs[-1][2] == t:
            runs[-1] = (runs[-1][0], b, t)
        else:
            runs.append((a, b, t))
        start = b + 1
    if start < k:
        runs.append((start, k - 1, DEAD))
    return runs


def root_groups(root: dict, n: int, ranges_of: list, interned: list, keys: list) -> dict:
    """The root state as groups for :func:`sweep` (ranges of field 0 -> items of level 1), the
    items of level 1 interned from the root's trie."""
    if n < 2:
        return {ranges_of[0][c0]: x for c0, x in root.items()} if n else {}
    d1, k1, r1 = interned[1], keys[1], ranges_of[1]
    groups = {}
    for c0, g in root.items():
        items = set()
        for c1, x in g.items():
            for it2 in x:
                key = (c1, it2)
                it = d1.get(key)
                if it is None:
                    it = d1[key] = len(k1)
                    k1.append((r1[c1], it2))
                items.add(it)
        groups[ranges_of[0][c0]] = items
    return groups
