"""Chunked root runs (subc/ir/root_runs.py) against a value-by-value reference.

Hypothesis draws small value domains, source roots (chunked or plain tuples) and new roots
assembled from emitted runs and copied spans of the sources, with tiny chunk sizes so that
every path of the builder (sharing, merging at junctions, reopening and sealing chunks) runs.
The reference is the child of every single value; the expected runs are its maximal runs.
After each round the sources must be unchanged (roots are persistent) and the new root becomes
a source of the next round.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from subc.ir import root_runs
from subc.ir.incremental import Node
from subc.ir.root_runs import ChunkBuilder, ChunkedRuns

CHILDREN = [object() for _ in range(4)]


def maximal_runs(values: list) -> list[tuple]:
    """The maximal runs (lo, hi, child) of a list of children indexed by value."""
    out: list[tuple] = []
    for v, c in enumerate(values):
        if out and out[-1][2] is c:
            out[-1] = (out[-1][0], v, c)
        else:
            out.append((v, v, c))
    return out


def check_shape(runs: ChunkedRuns, values: list) -> None:
    want = maximal_runs(values)
    assert list(runs) == want
    assert len(runs) == len(want)
    assert all(1 <= len(c) <= 2 * root_runs.CHUNK for c in runs.chunks)
    assert runs.firsts == [c[0][0] for c in runs.chunks]
    assert runs.clos == [[r[0] for r in c] for c in runs.chunks]
    for i in range(-len(want), len(want)):
        assert runs[i] == want[i]
    for v, c in enumerate(values):
        assert runs.run_at(v)[2] is c


@st.composite
def rounds(draw):
    top = draw(st.integers(0, 120))
    values = st.lists(st.sampled_from(range(len(CHILDREN))), min_size=top + 1, max_size=top + 1)
    sources = draw(st.lists(st.tuples(values, st.booleans()), min_size=1, max_size=3))
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        cuts = sorted(draw(st.sets(st.integers(1, top), max_size=8))) if top else []
        bounds = list(zip([0] + cuts, [c - 1 for c in cuts] + [top]))
        pieces = [(lo, hi, draw(st.one_of(st.tuples(st.just("emit"), st.sampled_from(range(len(CHILDREN)))),
                                         st.tuples(st.just("copy"), st.integers(0, 99)))))
                  for lo, hi in bounds]
        probes = draw(st.lists(st.tuples(st.integers(0, top), st.integers(0, top)), max_size=6))
        steps.append((pieces, probes))
    return top, sources, steps, draw(st.sampled_from([1, 2, 3, 64]))


def build(values: list) -> Node:
    b = ChunkBuilder()
    for lo, hi, c in maximal_runs(values):
        b.emit(lo, hi, c)
    return Node(0, b.runs())


@settings(max_examples=300, deadline=None)
@given(rounds())
def test_chunked_runs_equal_the_values(case):
    top, sources, steps, chunk = case
    saved, root_runs.CHUNK = root_runs.CHUNK, chunk
    try:
        run_rounds(sources, steps)
    finally:
        root_runs.CHUNK = saved


def run_rounds(sources, steps) -> None:
    roots: list[tuple[Node, list]] = []
    for vals, chunked in sources:
        values = [CHILDREN[i] for i in vals]
        node = build(values) if chunked else Node(0, tuple(maximal_runs(values)))
        if chunked:
            check_shape(node.runs, values)
        roots.append((node, values))
    for pieces, probes in steps:
        snapshot = [list(n.runs) for n, _ in roots]
        b = ChunkBuilder()
        want: list = []
        for lo, hi, (kind, arg) in pieces:
            if kind == "emit":
                b.emit(lo, hi, CHILDREN[arg])
                want += [CHILDREN[arg]] * (hi - lo + 1)
            else:
                src, svals = roots[arg % len(roots)]
                b.copy_span(src, lo, hi)
                want += svals[lo : hi + 1]
        node = Node(0, b.runs())
        check_shape(node.runs, want)
        ref = maximal_runs(want)
        for lo, hi in probes:
            lo, hi = min(lo, hi), max(lo, hi)
            assert list(node.between(lo, hi)) == [r for r in ref if r[1] >= lo and r[0] <= hi]
        assert [list(n.runs) for n, _ in roots] == snapshot  # the sources are untouched
        roots.append((node, want))
