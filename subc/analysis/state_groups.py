"""Messages of the stateful pass cut into independent groups, and groups packed into tasks.

A message that the stateful pass must run one at a time touches some *resources*: for the
reference, the state rules whose stateless part it matches (each rule's aggregates are its own)
and the named counters those rules compare or update (shared by every rule); for the tables, its
footprint (:mod:`.state_footprint`: register instances).  Two messages that touch a common
resource must run in one task, in trace order; messages whose resources are disjoint (through
any chain of messages) may run in different tasks, because neither can see what the other
changed.  :func:`components` finds the connected components (union-find) and :func:`pack` packs
them into at most N tasks of about equal message counts (largest first, each to the lightest
task).  Within a task the messages keep trace order, so every resource sees its messages in the
same order as the sequential pass: the results are exactly the sequential pass's.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import numpy as np


class UnionFind:
    """Disjoint sets of hashable items (path halving, union by size)."""

    def __init__(self) -> None:
        self.parent: dict[Hashable, Hashable] = {}
        self.size: dict[Hashable, int] = {}

    def find(self, x: Hashable) -> Hashable:
        """The representative of ``x``'s set (``x`` joins as a set of its own when new)."""
        parent = self.parent
        if x not in parent:
            parent[x] = x
            self.size[x] = 1
            return x
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, items: Iterable[Hashable]) -> None:
        """Join the sets of all ``items``."""
        it = iter(items)
        first = next(it, None)
        if first is None:
            return
        a = self.find(first)
        for b in it:
            b = self.find(b)
            if a == b:
                continue
            if self.size[a] < self.size[b]:
                a, b = b, a
            self.parent[b] = a
            self.size[a] += self.size[b]


def components(resources: Sequence[frozenset], links: Iterable[Iterable[Hashable]] = ()) -> np.ndarray:
    """Per message (``resources[i]``: the resources it touches, non-empty), the id of its
    component (int64, 0 to C - 1, in order of first message): messages are in one component when
    they share a resource, through any chain; ``links``: more sets of resources that belong
    together (a named counter and the rules that use it)."""
    uf = UnionFind()
    for group in links:
        uf.union(group)
    for r in set(resources):
        uf.union(r)
    ids: dict[Hashable, int] = {}
    out = np.empty(len(resources), dtype=np.int64)
    for i, r in enumerate(resources):
        root = uf.find(next(iter(r)))
        out[i] = ids.setdefault(root, len(ids))
    return out


def pack(component: np.ndarray, tasks: int) -> list[np.ndarray]:
    """The messages (indexes into ``component``, ascending: trace order) of at most ``tasks``
    tasks, whole components each, with about equal message counts (largest component first, to
    the task with the fewest messages); empty tasks are left out."""
    if not len(component):
        return []
    sizes = np.bincount(component)
    load = np.zeros(max(1, tasks), dtype=np.int64)
    task_of = np.empty(len(sizes), dtype=np.int64)
    for c in np.argsort(-sizes, kind="stable"):
        k = int(np.argmin(load))
        task_of[c] = k
        load[k] += sizes[c]
    owner = task_of[component]
    return [np.flatnonzero(owner == k) for k in range(len(load)) if load[k]]
