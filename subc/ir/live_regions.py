"""Region diagrams: the set of messages a subscription's condition accepts, as a live diagram.

A *region* (module docstring of :mod:`.incremental`) is a quasi-reduced interval decision diagram
over the field order with terminals ``TRUE`` and ``FALSE`` (every node of the FALSE chain has
``false`` set), built from the condition's AST by ``apply`` (and, or, not) in a
:class:`~.live_nodes.Universe` of its own.
"""

from __future__ import annotations

from ..errors import SubcError
from ..lang.ast import And, Expr, Not, Or, Pred
from .live_nodes import Node, Universe, constant_chain, emit_run


def region_of(cond: Expr, index: dict[str, int], tops: list[int]) -> Node:
    """The region diagram (its level-0 node) of condition ``cond`` (an AST expression) over the
    fields of ``index`` (field name -> level) whose largest values are ``tops`` (per level).  The
    region's universe is shared by nobody, so it costs nothing once the region is dropped.
    Raises SubcError (at the predicate) for a field not in ``index``, TypeError for an
    expression that is not a condition."""
    uni = Universe(len(tops))
    true = constant_chain(uni, tops, (True,))
    false = constant_chain(uni, tops, ())
    for node in false:
        node.false = True
    memo: dict = {}

    def pred(p: Pred) -> Node:
        if p.field not in index:
            raise SubcError(f"field '{p.field}' is not one of the broker's fields ({', '.join(index)})", p.location)
        lv = index[p.field]
        out: list = []
        cur = 0
        for lo, hi in p.values().intervals:
            if lo > cur:
                emit_run(out, cur, lo - 1, false[lv + 1])
            emit_run(out, lo, hi, true[lv + 1])
            cur = hi + 1
        if cur <= tops[lv]:
            emit_run(out, cur, tops[lv], false[lv + 1])
        node = uni.intern(lv, tuple(out))[0]
        for up in range(lv - 1, -1, -1):
            node = uni.intern(up, ((0, tops[up], node),))[0]
        return node

    def combine(op: str, a: Node, b: Node) -> Node:
        lv = a.level
        zero, one = (false, true) if op == "and" else (true, false)  # absorbing, identity
        if a is zero[lv] or b is zero[lv]:
            return zero[lv]
        if a is one[lv]:
            return b
        if b is one[lv]:
            return a
        if a is b:
            return a
        key = (op, a, b)
        hit = memo.get(key)
        if hit is not None:
            return hit
        out: list = []
        ar, br = a.runs, b.runs
        i = j = 0
        lo = 0
        while i < len(ar):
            hi = min(ar[i][1], br[j][1])
            emit_run(out, lo, hi, combine(op, ar[i][2], br[j][2]))
            lo = hi + 1
            if ar[i][1] == hi:
                i += 1
            if j < len(br) and br[j][1] == hi:
                j += 1
        res = uni.intern(a.level, tuple(out))[0]
        memo[key] = res
        return res

    def negate(a: Node) -> Node:
        if a is true[a.level]:
            return false[a.level]
        if a is false[a.level]:
            return true[a.level]
        key = ("not", a)
        hit = memo.get(key)
        if hit is None:
            hit = uni.intern(a.level, tuple((lo, hi, negate(c)) for lo, hi, c in a.runs))[0]
            memo[key] = hit
        return hit

    def build(e: Expr) -> Node:
        if isinstance(e, Pred):
            return pred(e)
        if isinstance(e, Not):
            return negate(build(e.item))
        op = "and" if isinstance(e, And) else "or"
        if not isinstance(e, (And, Or)):
            raise TypeError(f"not a condition: {e!r}")
        acc = build(e.items[0])
        for item in e.items[1:]:
            acc = combine(op, acc, build(item))
        return acc

    return build(cond)
