"""Slicing a rule set field by field, without the global BDD (the compiler's fast path).

The global BDD of :mod:`.bdd` (one variable per action atom, ``F = valid and AND_a (y_a <->
G_a)``) is canonical but costly to build for 10^5 rules.  Slicing (Algorithm 1 of Jepsen et
al., HotNets 2018) only needs, at every field boundary, the distinct *residual functions* of the
rule set and how each field's elementary intervals move between them; this module computes
exactly those, in layers, and returns the same :class:`~.slicing.Sliced` as
``slice_bdd(build_bdd(...))``: the same states, numbered the same way, the same runs and
leaves (tests/test_layered.py checks it against the BDD on random rule sets).

1. **Cubes.**  The rules are grouped by their ``core`` condition (rules of one shape with the same
   literals share it: :class:`~.ast.Rule`), the field domains come from the distinct predicates,
   and each distinct condition becomes a list of disjoint *cubes*: per field (in field order) a
   tuple of elementary-interval index ranges, or None for any value.  A conjunction of
   predicates is one cube (the intersection per field); any other condition (``or``, ``not``) is
   built as a BDD with ``dd`` over the interval-index variables and its paths are read off field
   by field (:func:`~.bdd.index_segments`).
2. **Items.**  A cube with its rule's atoms is a chain of *items*, interned per level: level n
   is the atom set, level i is (ranges of field i, item of level i+1).  Rules that agree on
   fields i.. share their level-i item.  The root's items are kept as a trie (ranges of field 0
   -> ranges of field 1 -> items of level 2).
3. **Layers, top down.**  A state at boundary i is a set of level-i items (the rules still
   alive, by what they still require).  One sweep over a state's range end points gives every
   elementary interval's next state; next states are identified by a 128-bit Zobrist hash of
   their item set, kept up to date as items enter and leave, and materialised once each.  The
   empty set is the dead state.  When the root's ranges on field 0 are pairwise disjoint (an
   exact field tested with ``==``), each trie group is a next state as it is; when every range
   of a state runs to the top of the field (``field > P``), items only enter and the sweep uses
   set operations (:mod:`.sweeps`).
4. **Minimisation, bottom up.**  A leaf is its atom set; a state of stage i is its runs over the
   field with next states replaced by their classes, adjacent equal runs merged.  Equal
   signatures are equal residual functions, which makes the result the reduced diagram.
5. **Numbering, top down,** in the order of :func:`~.slicing.slice_bdd`: states in number order,
   runs in value order, next states numbered on first sight; an example packet per state.

A rule with an empty condition (no packet) contributes no cube.  The number of states per
boundary is bounded (:class:`~subc.lang.limits.Limits`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain
from typing import TYPE_CHECKING

from ..lang.ast import And, Pred, Rule
from ..lang.rule_store import rules_by_core
from .bdd import FieldDomain, core_predicates, predicate_domains
from ..lang.limits import DEFAULT_LIMITS, LimitError, Limits
from .slicing import Leaf, Sliced, Stage, StageState
from .cubes import EMPTY, CubeMaker, Ranges
from .sweeps import DEAD, groups_of, root_by_point, root_groups, sweep, zobrist_keys
from ..spec.model import QueryField

if TYPE_CHECKING:  # dd.cudd is imported where a BDD is built: importing it costs a compile 0.1 s (networkx)
    pass


def _check_limits(states: int, items: int, limits: Limits, dom: FieldDomain, order: Sequence[str]) -> None:
    if states > limits.max_states or items > limits.max_layer_items:
        what = (
            f"more than {limits.max_states:,} states"
            if states > limits.max_states
            else f"states holding more than {limits.max_layer_items:,} rule items"
        )
        raise StateLimitExceeded(
            f"the rule set needs {what} by field {dom.field.name} (field order "
            f"{', '.join(order)}); the limit is --max-states {limits.max_states:,}. The diagram "
            "grows with the combinations of fields the rules test together: rules with few "
            "predicates over many fields can need exponentially many states"
        )


class SliceBudgetExceeded(Exception):
    """:func:`slice_rules` did more work than its ``max_work`` allows."""


class StateLimitExceeded(LimitError):
    """:func:`slice_rules` needs more states (or items in them) than the limits allow."""


def slice_rules(
    rules: Sequence[Rule],
    fields: dict[str, QueryField],
    order: Sequence[str],
    max_work: int | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Sliced:
    """The sliced stages of ``rules`` in field ``order`` (see the module docstring).

    Equal to ``slice_bdd(build_bdd(rules, fields, order))``.  Raises ValueError if ``order``
    misses a field the rules use, :class:`SliceBudgetExceeded` as soon as the sweeps have
    visited more than ``max_work`` items in all (``Sliced.work`` is that count; the order search
    uses it to drop a field order early), and :class:`StateLimitExceeded` when the boundaries have
    more than ``limits.max_states`` states in all, or their item sets hold more than
    ``limits.max_layer_items`` items in all (before minimisation).

    Five passes: the rules grouped by core condition (:func:`~subc.lang.rule_store.rules_by_core`:
    a :class:`~subc.lang.rule_store.RuleStore` has them from its parse), the items of every
    level and the root's trie (:func:`_root_items`), the layers swept top down
    (:func:`_sweep_layers`), minimised bottom up (:func:`_minimise`) and numbered top down
    (:func:`_number`).
    """
    n = len(order)
    interned: list[dict] = [{} for _ in range(n + 1)]
    keys: list[list] = [[] for _ in range(n + 1)]
    by_core = rules_by_core(rules, interned[n], keys[n])
    domains = predicate_domains(core_predicates([c for c, _ in by_core.values()]), fields, order)
    root, ranges_of = _root_items(by_core, domains, interned, keys)
    del by_core
    layer_states, layer_runs, leaf_atoms_of, work = _sweep_layers(
        root, domains, ranges_of, interned, keys, order, max_work, limits
    )
    leaf_atoms, root_class, sigs = _minimise(layer_states, layer_runs, leaf_atoms_of, keys[n])
    stages, leaves, root_state = _number(domains, sigs, root_class, leaf_atoms, bool(layer_states[0]))
    return Sliced(stages, leaves, root_state, work)


def _root_items(by_core: dict[int, tuple], domains: list, interned: list[dict], keys: list[list]) -> tuple[dict, list]:
    """Pass 2: items, per level: level n is the atom set, level i (ranges of field i, item of level
    i + 1), interned per level in ``interned``/``keys``; ranges are numbered per field.  Returns
    (the root state's items as a trie: root[range id of field 0][range id of field 1] = items of
    level 2 (n >= 2), or root[range id of field 0] = leaf items (n == 1), root[None] = leaf items
    (n == 0), each a sorted tuple without repeats; ranges_of[i][range id]).  The lists of leaves of
    ``by_core`` are not changed (a :class:`~subc.lang.rule_store.RuleStore`'s own): a trie cell
    holds one of them until a second core's items join it, then a copy."""
    n = len(domains)
    range_ids: list[dict] = [{None: 0} for _ in range(n)]
    ranges_of: list[list] = [[None] for _ in range(n)]  # range id 0: any value
    levels = range(n - 1, 1, -1)
    root: dict = {}
    maker = CubeMaker(domains)
    cubes_of = maker.cubes

    def range_id(i: int, ranges: Ranges) -> int:
        x = range_ids[i].get(ranges)
        if x is None:
            x = range_ids[i][ranges] = len(ranges_of[i])
            ranges_of[i].append(ranges)
        return x

    borrowed: set[int] = set()  # ids of the leaf lists of by_core held by a trie cell as they are
    # id(pred) -> (pred, range id or -1: no value, field position, its bit)
    by_pred: dict[int, tuple] = {}
    by_pred_get = by_pred.get
    for core, leaves in by_core.values():
        if not leaves:
            continue
        # a predicate or a conjunction of predicates on distinct fields (most rules): its cube from
        # the range ids of its predicates; anything else through CubeMaker
        cube_list = None
        kind = type(core)
        if kind is Pred or kind is And:
            ids = [0] * n
            seen = 0
            for p in core.items if kind is And else (core,):
                hit = by_pred_get(id(p))
                if hit is None:  # (a pred seen before is in by_pred, which keeps it: its id is its own)
                    if type(p) is not Pred:
                        break
                    _, i, ranges = maker.pred_ranges(p)
                    hit = by_pred[id(p)] = (p, -1 if ranges is EMPTY else range_id(i, ranges), i, 1 << i)
                _, x, i, bit = hit
                if seen & bit:
                    break
                seen |= bit
                if x < 0:
                    cube_list = []
                    break
                ids[i] = x
            else:
                cube_list = [ids]
        if cube_list is None:
            cube_list = [[range_id(i, ranges) for i, ranges in enumerate(cube)] for cube in cubes_of(core)]
        for ids in cube_list:
            if n < 2:
                c0 = ids[0] if n else None
                g = root.get(c0)
                if g is None:
                    root[c0] = list(leaves)
                else:
                    g.extend(leaves)
                continue
            if n == 2:
                items = leaves
            else:
                items = []
                for leaf in leaves:
                    it = leaf
                    for i in levels:
                        key = (ids[i], it)
                        d = interned[i]
                        x = d.get(key)
                        if x is None:
                            x = d[key] = len(keys[i])
                            keys[i].append((ranges_of[i][ids[i]], it))
                        it = x
                    items.append(it)
            g = root.get(ids[0])
            if g is None:
                g = root[ids[0]] = {}
            s1 = g.get(ids[1])
            if s1 is None:
                # a one-cube core's own list of leaves, borrowed until extended (a million rules:
                # 8 MB less), else a copy (its cells are extended apart)
                if items is leaves and len(cube_list) == 1:
                    g[ids[1]] = items
                    borrowed.add(id(items))
                else:
                    g[ids[1]] = list(items)
            elif id(s1) in borrowed:
                g[ids[1]] = s1 + items  # (a new list: the borrowed one stays as it is)
                borrowed.discard(id(s1))
            else:
                s1.extend(items)
    # the trie's item lists as sorted tuples without repeats (a set per entry: far more memory)
    for c0, g in root.items():
        if n < 2:
            root[c0] = tuple(sorted(set(g)))
        else:
            for c1, x in g.items():
                g[c1] = tuple(sorted(set(x)))

    return root, ranges_of


def _sweep_layers(
    root: dict,
    domains: list,
    ranges_of: list[list],
    interned: list[dict],
    keys: list[list],
    order: Sequence[str],
    max_work: int | None,
    limits: Limits,
) -> tuple[list[list], list[list], dict[int, tuple], int]:
    """Pass 3: the layers, top down: (layer_states[i] = the states before field i (item tuples;
    the root, and the states after field 0 when they come straight from the root's trie, as
    groups; after the last field, a state's item count where the sweep gave its atoms instead),
    layer_runs[i] = runs per state, the atoms of the states after the last field where a sweep
    gave them, the item visits).  Raises SliceBudgetExceeded and StateLimitExceeded (see
    :func:`slice_rules`)."""
    n = len(domains)
    work = n_states = items_total = 0
    layer_runs: list[list[list[tuple[int, int, int]]]] = []
    leaf_atoms_of: dict[int, tuple] = {}  # state after the last field -> atoms, where a sweep gave them
    if n == 0:
        layer_states: list[list] = [[root[None]] if root else []]
    elif not root:
        layer_states = [[]]
    else:
        layer_states = [[None]]  # the root, swept below
    for i, dom in enumerate(domains):
        nxt_states: list = []
        runs_i: list[list[tuple[int, int, int]]] = []
        if i == 0:
            if not root:
                layer_runs.append(runs_i)
                layer_states.append(nxt_states)
                continue
            work += sum(len(x) for g in root.values() for x in (g.values() if n >= 2 else (g,)))
            if max_work is not None and work > max_work:
                raise SliceBudgetExceeded(f"more than {max_work} item visits in field order {list(order)}")
            runs = root_by_point(root, ranges_of[0], dom.k, nxt_states) if n >= 2 else None
            sizes: Iterable[int]
            if runs is None:
                groups = root_groups(root, n, ranges_of, interned, keys)
                runs = sweep(groups, dom.k, zobrist_keys(1, len(keys[1])), {}, nxt_states)
                sizes = map(len, nxt_states)
            else:
                nxt_states = [{ranges_of[1][c1]: x for c1, x in g.items()} for g in nxt_states]
                sizes = (sum(map(len, g.values())) for g in nxt_states)
            runs_i.append(runs)
            items_total += sum(sizes)
            _check_limits(n_states + len(nxt_states), items_total, limits, dom, order)
        else:
            zob = zobrist_keys(i + 1, len(keys[i + 1]))
            index: dict[int, int] = {}
            last = (keys[n].__getitem__, leaf_atoms_of) if i == n - 1 else None
            for s in layer_states[i]:
                if type(s) is dict:  # groups straight from the root's trie
                    groups, size = s, sum(map(len, s.values()))
                else:
                    groups, size = groups_of(s, keys[i]), len(s)
                work += size
                if max_work is not None and work > max_work:
                    raise SliceBudgetExceeded(f"more than {max_work} item visits in field order {list(order)}")
                before = len(nxt_states)
                runs_i.append(sweep(groups, dom.k, zob, index, nxt_states, last))
                for j in range(before, len(nxt_states)):
                    st = nxt_states[j]
                    items_total += st if type(st) is int else len(st)  # (an int: a leaf's item count)
                _check_limits(n_states + len(nxt_states), items_total, limits, dom, order)
        layer_runs.append(runs_i)
        layer_states.append(nxt_states)
        n_states += len(nxt_states)
    return layer_states, layer_runs, leaf_atoms_of, work


def _minimise(
    layer_states: list[list], layer_runs: list[list], leaf_atoms_of: dict[int, tuple], leaf_keys: list
) -> tuple[list[tuple], int | None, list[list[tuple]]]:
    """Pass 4: minimisation, bottom up: (the leaf classes' atoms (tuples), the root's class (None when the
    root has no state), sigs[i][class] = runs of stage i with next states as classes)."""
    n = len(layer_runs)
    leaf_atoms: list[tuple] = []  # (tuples: compact, see Leaf)
    leaf_class: dict[frozenset, int] = {}
    cls_below: list[int] = []
    c: int | None  # a class (None: not numbered yet)
    atoms_of = leaf_keys.__getitem__
    # when every rule has one atom, distinct leaf states (sets of atom sets) have distinct atoms
    singletons = all(len(a) == 1 for a in leaf_keys)
    for j, s in enumerate(layer_states[n]):
        atoms = leaf_atoms_of.get(j)
        if atoms is None:
            atoms = tuple(set(chain.from_iterable(map(atoms_of, s))))
        if singletons:
            c = len(leaf_atoms)
            leaf_atoms.append(atoms)
        else:
            key = frozenset(atoms)
            c = leaf_class.get(key)
            if c is None:
                c = leaf_class[key] = len(leaf_atoms)
                leaf_atoms.append(atoms)
        cls_below.append(c)
    sigs: list[list[tuple]] = [[] for _ in range(n)]
    for i in range(n - 1, -1, -1):
        by_sig: dict[tuple, int] = {}
        cls_here: list[int] = []
        for runs in layer_runs[i]:
            merged: list[tuple[int, int, int]] = []
            for first, last, t in runs:
                c = DEAD if t == DEAD else cls_below[t]
                if merged and merged[-1][2] == c:
                    merged[-1] = (merged[-1][0], last, c)
                else:
                    merged.append((first, last, c))
            sig = tuple(merged)
            c = by_sig.get(sig)
            if c is None:
                c = by_sig[sig] = len(sigs[i])
                sigs[i].append(sig)
            cls_here.append(c)
        cls_below = cls_here
    return leaf_atoms, (cls_below[0] if cls_below else None), sigs


def _number(
    domains: list, sigs: list[list[tuple]], root_class: int | None, leaf_atoms: list[tuple], has_root: bool
) -> tuple[list[Stage], list[Leaf], int]:
    """Pass 5: numbering, top down: (the stages with their states numbered densely from 1 in
    order of first reach, the leaves, the root state (0: no rule can match))."""
    stages: list[Stage] = []
    root_state = 1 if has_root else 0
    current: dict[int, tuple[int, dict]] = {}
    if root_state:
        assert root_class is not None  # a root state has its class (_minimise)
        current[root_class] = (1, {})
    for i, dom in enumerate(domains):
        nxt: dict[int, tuple[int, dict]] = {}
        states: list[StageState] = []
        for c, (sid, path) in sorted(current.items(), key=lambda kv: kv[1][0]):
            runs = []
            for first, last, t in sigs[i][c]:
                lo, hi = dom.interval(first)[0], dom.interval(last)[1]
                if t == DEAD:
                    tgt = 0
                else:
                    if t not in nxt:
                        nxt[t] = (len(nxt) + 1, {**path, dom.field.name: lo})
                    tgt = nxt[t][0]
                runs.append((lo, hi, tgt))
            states.append(StageState(sid, runs))
        stages.append(Stage(dom, states, len(nxt)))
        current = nxt
    leaves = [Leaf(sid, leaf_atoms[c], path) for c, (sid, path) in sorted(current.items(), key=lambda kv: kv[1][0])]
    return stages, leaves, root_state
