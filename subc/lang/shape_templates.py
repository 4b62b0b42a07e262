"""A rule shape's *template* (:mod:`.rule_shapes`): the shape's rule as closures over a match of
the shape's pattern, built once from Lark's tree of the shape's first piece.

The piece is split into *parts*: the text before the first literal, the first literal, the text
after it, ... (literal ``k``, from 1, is the pattern's group ``k``).  Every offset of the first
piece becomes a function of a match (:func:`_offset_fn`: the same offset from the start or end of
the part around it), every literal the text of its group, converted by the resolver once per
field, kind and text (shared by all shapes of a parse), so that a rule of the shape is built from
a match as the resolver would build it from Lark's tree of its piece: with locations
(:meth:`.shapes.Shape.materialize`) or without (the core condition and atoms a deferred rule
is made of).
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

from lark import Token, Tree

from .ast import And, Action, Not, Or, Pred
from .grammar_parser import as_token, comparison_parts, token_start


class Template:
    """A shape's rule as closures over a pattern match ``m`` (:func:`build_template`):
    ``cond(m, loc, r)``, ``actions`` (each ``f(m, loc, r)``), ``start(m)``, ``end(m)`` (offsets
    of the rule's first character and just after its ';').  ``loc`` locates an offset of the
    matched text (None: build without locations); ``r`` is the resolver over that text."""

    __slots__ = ("cond", "actions", "start", "end")

    def __init__(self, cond, actions, start, end):
        self.cond, self.actions, self.start, self.end = cond, actions, start, end


def _offset_fn(part: int, off: int):
    """The text offset of offset ``off`` in part ``part`` of a piece matched by ``m`` (parts: the
    text before the first literal, the first literal, the text after it, ...)."""
    if part == 0:
        return lambda m: m.start() + off
    if part % 2:
        g = (part + 1) // 2
        return lambda m: m.start(g) + off
    g = part // 2
    return lambda m: m.end(g) + off


def build_template(
    tree: Tree, parts: list[str], rep_resolver, operands: dict, action_values: dict
) -> tuple[Template, tuple[int, ...], tuple[int, ...]]:
    """(template, condition literal groups, action literal groups) of a shape from Lark's ``tree``
    of its first piece, split into ``parts`` and resolved without error by ``rep_resolver`` (the
    rule resolver at the piece).  ``operands`` ((field, kind, text) -> Operand) and
    ``action_values`` ((name, kinds, texts) -> (name, args)) are the caches the template's
    closures fill, shared with the other shapes of the parse."""
    b = _Builder(parts, rep_resolver, operands, action_values)
    rule_tree = tree.children[0]
    cond_tree, actions_tree = rule_tree.children
    cond = b.expr(cond_tree)
    acts = tuple(b.action(a) for a in actions_tree.children)
    template = Template(cond, acts, b.at(rule_tree.meta.start_pos), b.at(rule_tree.meta.end_pos))
    return template, tuple(sorted(set(b.cond_groups))), tuple(sorted(set(b.act_groups)))


class _Builder:
    """The closures of one template (:func:`build_template`), with the literal groups they read."""

    def __init__(self, parts: list[str], rep_resolver, operands: dict, action_values: dict):
        self.parts = parts
        self.bounds = [0] + list(accumulate(map(len, parts)))
        self.group_at = {self.bounds[i]: (i + 1) // 2 for i in range(1, len(parts), 2)}  # piece offset -> group
        self.rep_resolver = rep_resolver
        self.operands, self.action_values = operands, action_values
        self.cond_groups: list[int] = []
        self.act_groups: list[int] = []

    def at(self, pos: int):
        """The function of a match that gives offset ``pos`` of the first piece in the matched text."""
        bounds = self.bounds
        i = min(bisect_right(bounds, pos) - 1, len(self.parts) - 1)
        return _offset_fn(i, pos - bounds[i])

    def expr(self, t):
        """The closure of condition ``t`` (``or_``, ``and_``, ``not_`` or a comparison)."""
        if t.data in ("or_", "and_"):
            # as the resolver: a left-nested chain is one node (walked in a loop)
            rights, x = [], t
            while isinstance(x, Tree) and x.data == t.data:
                rights.append(x.children[1])
                x = x.children[0]
            fs = tuple([self.expr(x)] + [self.expr(y) for y in reversed(rights)])
            cls = Or if t.data == "or_" else And
            if len(fs) == 2:  # (most: a rule's conjunction of two tests, built once per condition)
                f1, f2 = fs
                return lambda m, loc, r: cls((f1(m, loc, r), f2(m, loc, r)))
            return lambda m, loc, r: cls(tuple([f(m, loc, r) for f in fs]))
        if t.data == "not_":
            f = self.expr(t.children[0])
            return lambda m, loc, r: Not(f(m, loc, r))
        return self.comparison(t)

    def operand(self, q, tok: Token):
        """The closure ``f(m, r)`` of the operand of query field ``q`` written as literal ``tok``."""
        g, kind, qname = self.group_at[token_start(tok)], tok.type, q.name
        self.cond_groups.append(g)
        operands = self.operands

        def f(m, r):
            text = m.group(g)
            key = (qname, kind, text)
            o = operands.get(key)
            if o is None:
                o = operands[key] = r.operand(Token(kind, text, start_pos=m.start(g)), q)
            return o

        return f

    def comparison(self, t: Tree):
        """The closure of comparison or membership test ``t``: a located predicate, or (without
        ``loc``) the predicate without location, one per literal texts."""
        where = self.at(t.meta.start_pos)
        # the values are literal tokens: a shape with a prefix is no template
        if t.data in ("member", "not_member"):
            q = self.rep_resolver.field(t.children[0])  # the shape's checks ran on the first piece
            values = [as_token(v) for v in t.children[1:]]
            op = "in" if t.data == "member" else "not in"
        else:
            ftree, _, op, value = comparison_parts(t)
            q = self.rep_resolver.field(ftree)
            values = [as_token(value)]
        fs = tuple(self.operand(q, v) for v in values)
        name, width = q.name, q.width
        groups = tuple(sorted({self.group_at[token_start(v)] for v in values}))
        cores: dict = {}  # literal texts -> the predicate without location

        def f(m, loc, r):
            if loc:
                return Pred(name, width, op, tuple([g(m, r) for g in fs]), loc(where(m)))
            key = m.group(*groups)
            p = cores.get(key)
            if p is None:
                p = cores[key] = Pred(name, width, op, tuple([g(m, r) for g in fs]), None)
            return p

        return f

    def action(self, t: Tree):
        """The closure of action ``t``: its name and arguments resolved once per literal texts."""
        name_tok, *args = map(as_token, t.children)
        where = self.at(token_start(name_tok))
        groups = tuple(self.group_at[token_start(a)] for a in args)
        self.act_groups.extend(groups)
        kinds = tuple(a.type for a in args)
        name = str(name_tok)
        action_values = self.action_values

        def f(m, loc, r):
            texts = tuple([m.group(g) for g in groups])
            key = (name, kinds, texts)
            v = action_values.get(key)
            if v is None:
                toks: list[Token | Tree] = [Token("NAME", name, start_pos=where(m))]
                toks += [Token(k, x, start_pos=m.start(g)) for k, x, g in zip(kinds, texts, groups)]
                a = r.action(Tree("action", toks))
                v = action_values[key] = (a.name, a.args)
            return Action(v[0], v[1], loc(where(m)) if loc else None)

        return f
