"""The one lowering of a state's runs to entries (subc/ir/lowering.py), against the meaning of
the entries and an independent optimum.

Hypothesis draws a state (runs over a narrow field, targets among a few states, 0 dead):

* the LPM entries, matched longest prefix first (a value no entry matches goes to the dead
  state), give every value its run's target, and they are as few as the optimum of a dynamic
  program over the whole binary trie (written here, independently of ORTC);
* the exact entries plus the miss target give every value its target, with the fewest entries;
* the range entries above the fallback give every value its target;
* every form is the same, up to renaming, when the states are numbered otherwise (live nodes and
  batch states are numbered differently).
"""

from __future__ import annotations

from functools import lru_cache

from hypothesis import given, settings
from hypothesis import strategies as st

from subc.ir.lowering import exact_form, lpm_form, range_form


def dead(t) -> bool:
    return t == 0


@st.composite
def states(draw, max_width: int = 6):
    """(width, runs): runs covering [0, 2**width - 1], adjacent targets different."""
    width = draw(st.integers(1, max_width))
    top = (1 << width) - 1
    cuts = sorted(draw(st.sets(st.integers(1, top), max_size=min(top, 10))))
    bounds = [0, *cuts, top + 1]
    runs, prev = [], None
    for lo, nxt in zip(bounds, bounds[1:]):
        t = draw(st.integers(0, 4).filter(lambda x: x != prev))
        runs.append((lo, nxt - 1, t))
        prev = t
    return width, runs


def target_of(runs, v):
    return next(t for lo, hi, t in runs if lo <= v <= hi)


def lpm_lookup(entries, width, v):
    best = None
    for value, plen, t in entries:
        shift = width - plen
        if (v >> shift) == (value >> shift) and (best is None or plen > best[0]):
            best = (plen, t)
    return best[1] if best else 0


def optimal_lpm_count(runs, width) -> int:
    """Fewest prefixes for the runs' function (no match: state 0), by dynamic programming over
    every block of the binary trie: a block either has no entry (its halves inherit) or one
    entry of some target (its halves inherit that)."""
    targets = sorted({t for _, _, t in runs})
    values = [target_of(runs, v) for v in range(1 << width)]

    @lru_cache(maxsize=None)
    def cost(lo: int, k: int, inherited: int) -> int:
        if k == 0:
            return 0 if values[lo] == inherited else 1
        half = 1 << (k - 1)

        def below(inh: int) -> int:
            return cost(lo, k - 1, inh) + cost(lo + half, k - 1, inh)

        return min([below(inherited)] + [1 + below(t) for t in targets if t != inherited])

    return cost(0, width, 0)


@settings(max_examples=400, deadline=None)
@given(states())
def test_lpm_form_is_exact_and_optimal(state):
    width, runs = state
    entries = lpm_form(runs, width, dead)
    for v in range(1 << width):
        assert lpm_lookup(entries, width, v) == target_of(runs, v), (v, entries)
    assert len(entries) == optimal_lpm_count(runs, width), entries
    assert entries == sorted(entries, key=lambda e: (e[0], e[1]))
    assert len({(v, p) for v, p, _ in entries}) == len(entries)


@settings(max_examples=300, deadline=None)
@given(states())
def test_exact_form_is_exact_with_fewest_entries(state):
    width, runs = state
    entries, miss = exact_form(runs, dead)
    table = dict(entries)
    for v in range(1 << width):
        assert table.get(v, miss) == target_of(runs, v)
    assert miss not in table.values()
    # no other miss target needs fewer entries, counting a miss entry for a live miss target
    for t in {t for _, _, t in runs}:
        others = sum(hi - lo + 1 for lo, hi, u in runs if u != t)
        assert len(entries) + (miss != 0) <= others + (t != 0)


@settings(max_examples=300, deadline=None)
@given(states())
def test_range_form_is_exact_with_fewest_entries(state):
    width, runs = state
    entries, fb = range_form(runs, dead)
    for v in range(1 << width):
        got = next((t for lo, hi, t in entries if lo <= v <= hi), fb)
        assert got == target_of(runs, v)
    for t in {t for _, _, t in runs}:
        assert len(entries) + (fb != 0) <= sum(1 for r in runs if r[2] != t) + (t != 0)


@settings(max_examples=300, deadline=None)
@given(states(), st.permutations([1, 2, 3, 4]))
def test_forms_do_not_depend_on_state_numbers(state, perm):
    width, runs = state
    rename = {0: 0, **{k + 1: p for k, p in enumerate(perm)}}
    renamed = [(lo, hi, rename[t]) for lo, hi, t in runs]
    assert lpm_form(renamed, width, dead) == [(v, p, rename[t]) for v, p, t in lpm_form(runs, width, dead)]
    e, m = exact_form(runs, dead)
    assert exact_form(renamed, dead) == ([(v, rename[t]) for v, t in e], rename[m])
    r, fb = range_form(runs, dead)
    assert range_form(renamed, dead) == ([(lo, hi, rename[t]) for lo, hi, t in r], rename[fb])


def test_lpm_form_examples():
    # 10.0.0.0/8 -> 1 inside a dead /0; and a /0 that is all one live target
    w = 32
    runs = [(0, 0x09FFFFFF, 0), (0x0A000000, 0x0AFFFFFF, 1), (0x0B000000, (1 << w) - 1, 0)]
    assert lpm_form(runs, w, dead) == [(0x0A000000, 8, 1)]
    assert lpm_form([(0, (1 << w) - 1, 3)], w, dead) == [(0, 0, 3)]
    assert lpm_form([(0, (1 << w) - 1, 0)], w, dead) == []
    # a hole in a live prefix: two entries, not the hole's complement
    runs = [(0, 127, 1), (128, 128, 0), (129, 255, 1)]
    assert lpm_form(runs, 8, dead) == [(0, 0, 1), (128, 8, 0)]
