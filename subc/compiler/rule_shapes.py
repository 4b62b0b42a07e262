"""Fast rule parsing: Lark parses each distinct rule *shape* once; rules of a known shape are built
from a template.

Large rule sets repeat a few shapes with different literals (100,000 Camus subscriptions are one
shape: ``add_order.stock == S and add_order.shares > P : fwd(H);``).  The text is cut into rule
pieces at each ``;`` outside strings and comments; a regular expression splits a piece into its
literals (strings, decimals, hex and decimal integers that are not part of a name) and the text
between them.  That text plus the literals' kinds is the piece's *shape*.  For the first piece of a
shape, Lark parses it and the rule resolver (:class:`subc.compiler.rules._Resolver`) resolves it
(fields, operators, actions); its tree becomes the shape's *template*.  Every later piece of the
shape is built from the template: literal values are converted by the resolver's own code (cached
per field and literal text), locations are mapped through the literal length differences.

A shape is used as a template only when Lark's tokens for its first piece are exactly the literals
and text the splitter saw (no IPv4/IPv6/MAC literals or prefixes); other shapes are parsed by Lark
rule by rule.  When any shape is not valid syntax, or the text ends in an incomplete rule, the
whole text is parsed by Lark as before, so syntax errors are reported exactly as the plain parser
reports them.  The result equals :func:`subc.compiler.rules.parse_rules_lark` rule for rule
(``tests/test_rule_shapes.py``).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import accumulate

from lark import Token, Tree
from lark.exceptions import UnexpectedInput

from ..errors import Location
from .ast import And, Action, Not, Or, Pred, Rule
from .gcpause import paused_gc
from .limits import tree_tokens
from .rules import comparison_parts

#: Rule ends: a ';' outside strings and comments (strings and comments are matched to skip them).
_ENDS = re.compile(r'"(?:[^"\\\n]|\\.)*"|#[^\n]*|//[^\n]*|;')
#: Literals of a piece (one capturing group: re.split keeps them).  Names are matched and kept in
#: the text so that digits inside a name are not literals; comments likewise.
_SPLIT = re.compile(
    r'("(?:[^"\\\n]|\\.)*"|(?<![A-Za-z0-9_.])(?:\d+\.\d+|0[xX][0-9A-Fa-f]+|\d+)(?![A-Za-z0-9_]))'
)
_COMMENT_OR_SPACE = re.compile(r"(?:\s+|#[^\n]*|//[^\n]*)*\Z")
_LITERAL_TYPES = ("INT", "HEX", "DECIMAL", "STRING")


def rule_ends(text: str) -> list[int]:
    """Offsets just after each ';' that ends a rule (outside strings and comments)."""
    return [m.end() for m in _ENDS.finditer(text) if m.group() == ";"]


def _kind(lit: str) -> str:
    if lit[0] == '"':
        return "STRING"
    if "." in lit:
        return "DECIMAL"
    if len(lit) > 1 and lit[1] in "xX":
        return "HEX"
    return "INT"


class _Fallback(Exception):
    """The text needs the plain Lark parser (a syntax error somewhere, or an unusual ending)."""


class _Template:
    """A shape's rule as closures over the literal slots of a piece (see the module docstring)."""

    __slots__ = ("cond", "actions", "start", "end")

    def __init__(self, cond, actions, start: int, end: int):
        self.cond, self.actions, self.start, self.end = cond, actions, start, end


class ShapeParser:
    """Parse a rule text shape by shape (see the module docstring).

    ``parse()`` returns the rules in text order; errors are :class:`SubcError` exactly as
    :func:`subc.compiler.rules.parse_rules_lark` raises them."""

    def __init__(self, text: str, spec, path: str, line_offset: int = 0, first_index: int = 0,
                 ends: list[int] | None = None):
        from .rules import _Resolver

        self.text, self.spec, self.path = text, spec, path
        self.line_offset, self.first_index = line_offset, first_index
        self.resolver = _Resolver(spec, path, text, line_offset)
        self.lines = self.resolver.lines
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.operands: dict[tuple, object] = {}
        self.action_values: dict[tuple, tuple] = {}
        self.ends = ends if ends is not None else rule_ends(text)

    # -- positions -------------------------------------------------------------------------
    def location(self, pos: int) -> Location:
        """Location of absolute character offset ``pos``."""
        i = bisect_right(self.line_starts, pos) - 1
        return Location(self.path, i + 1 + self.line_offset, pos - self.line_starts[i] + 1, self.lines[i])

    def token(self, kind: str, value: str, pos: int) -> Token:
        loc = self.location(pos)
        return Token(kind, value, start_pos=pos, line=loc.line - self.line_offset, column=loc.column)

    # -- the two passes --------------------------------------------------------------------
    def pieces(self) -> list[tuple[int, int]]:
        """(start, end) of every rule piece: from the previous rule's end to just after this ';'."""
        out, start = [], 0
        for end in self.ends:
            out.append((start, end))
            start = end
        if not _COMMENT_OR_SPACE.match(self.text, start):
            raise _Fallback  # an incomplete rule at the end: Lark reports it
        return out

    def parse(self) -> list[Rule]:
        from .rules import rule_parser

        parser = rule_parser()
        pieces = self.pieces()
        shapes: dict[tuple, object] = {}  # key -> (Lark tree, rep start, rep parts) or None (unsafe)
        plan = []
        for start, end in pieces:
            parts = _SPLIT.split(self.text[start:end])
            lits = parts[1::2]
            key = ("\x00".join(parts[0::2]), tuple(map(_kind, lits)))
            if key not in shapes:
                piece = self.text[start:end]
                try:
                    tree = parser.parse(piece)
                except UnexpectedInput:
                    raise _Fallback from None
                shapes[key] = (tree, parts, start) if self._safe(tree, parts) else None
            plan.append((key, start, end, parts))
        rules: list[Rule] = []
        templates: dict[tuple, _Template | None] = {}
        for key, start, end, parts in plan:
            index = self.first_index + len(rules)
            shape = shapes[key]
            if shape is None:
                rules.extend(self._lark_piece(start, end, index))
                continue
            tpl = templates.get(key)
            if tpl is None:
                # the first rule of a shape goes through the resolver itself (its errors, in its
                # order); the template builds the others
                rules.extend(self._lark_piece(start, end, index))
                templates[key] = self._template(*shape)
                continue
            rules.append(self._build(tpl, start, parts, index))
        return rules

    def _safe(self, tree: Tree, parts: list[str]) -> bool:
        """True when the piece is one rule whose Lark literal tokens are exactly the splitter's
        literals, with no IPv4/IPv6/MAC literal and no prefix."""
        if len(tree.children) != 1 or any(t.data == "prefix" for t in tree.iter_subtrees()):
            return False
        bounds = list(accumulate(map(len, parts)))
        lit_at = {bounds[i - 1]: parts[i] for i in range(1, len(parts), 2)}
        for tok in tree_tokens(tree):
            if tok.type in ("IPV4", "IPV6", "MAC"):
                return False
            if tok.type in _LITERAL_TYPES and lit_at.get(tok.start_pos) != str(tok):
                return False
        return True

    def _lark_piece(self, start: int, end: int, index: int) -> list[Rule]:
        """Rules of one piece parsed by Lark (shapes that cannot be templates)."""
        from .rules import rule_parser

        piece = self.text[start:end]
        try:
            tree = rule_parser().parse(piece)
        except UnexpectedInput:  # pragma: no cover - checked in the first pass
            raise _Fallback from None
        return [self.resolver.rule(self._shift(r, start), index + i) for i, r in enumerate(tree.children)]

    def _shift(self, t, base: int):
        """A copy of Lark tree ``t`` (positions relative to a piece at ``base``) in text positions
        (built without recursion: a long ``and`` chain is a deep tree)."""
        if isinstance(t, Token):
            return self.token(t.type, str(t), base + t.start_pos)
        copies: dict[int, Tree] = {}
        for node in t.iter_subtrees():  # children before parents
            kids = [copies[id(c)] if isinstance(c, Tree) else self.token(c.type, str(c), base + c.start_pos)
                    for c in node.children]
            new = Tree(node.data, kids)
            if not node.meta.empty:
                loc = self.location(base + node.meta.start_pos)
                new.meta.line, new.meta.column = loc.line - self.line_offset, loc.column
                new.meta.start_pos, new.meta.end_pos = base + node.meta.start_pos, base + node.meta.end_pos
                new.meta.empty = False
            copies[id(node)] = new
        return copies[id(t)]

    # -- templates -------------------------------------------------------------------------
    def _template(self, tree: Tree, parts: list[str], rep_start: int) -> _Template:
        """Closures that build a rule of this shape from a piece's literals and positions (the
        representative piece, at ``rep_start``, has been resolved without error)."""
        rule_tree = tree.children[0]
        bounds = [0] + list(accumulate(map(len, parts)))
        slot_of = {bounds[i]: i for i in range(1, len(parts), 2)}  # piece offset of a literal -> part index

        def where(pos: int) -> tuple[int, int]:
            """(part index, offset in the part) of piece position ``pos`` of the representative."""
            i = bisect_right(bounds, pos) - 1
            return i, pos - bounds[i]

        r = self.resolver

        def literal(tok: Token):
            return slot_of[tok.start_pos]

        def expr(t):
            if t.data in ("or_", "and_"):
                # as the resolver: a left-nested chain is one node (walked in a loop), a right
                # operand is not
                rights, x = [], t
                while isinstance(x, Tree) and x.data == t.data:
                    rights.append(x.children[1])
                    x = x.children[0]
                items = [expr(x)] + [expr(r) for r in reversed(rights)]
                cls = Or if t.data == "or_" else And
                fs = tuple(items)
                return lambda b: cls(tuple(f(b) for f in fs))
            if t.data == "not_":
                f = expr(t.children[0])
                return lambda b: Not(f(b))
            return comparison(t)

        def field(ft: Tree):
            return r.field(self._shift(ft, rep_start))

        def operand_fn(q, tok: Token):
            slot, kind, cache = literal(tok), tok.type, self.operands

            def f(b):
                parts_, base, offs = b
                text = parts_[slot]
                key = (q.name, kind, text)
                o = cache.get(key)
                if o is None:
                    o = cache[key] = r.operand(self.token(kind, text, base + offs[slot]), q)
                return o
            return f

        def comparison(t: Tree):
            pos = where(t.meta.start_pos)
            if t.data in ("member", "not_member"):
                q = field(t.children[0])
                fs = [operand_fn(q, v) for v in t.children[1:]]
                op = "in" if t.data == "member" else "not in"
            else:
                ftree, _, op, value = comparison_parts(t)
                q = field(ftree)  # the shape's checks ran on the representative
                fs = [operand_fn(q, value)]
            name, width = q.name, q.width

            def f(b):
                return Pred(name, width, op, tuple(g(b) for g in fs), self._loc(b, pos))
            return f

        def action(t: Tree):
            name_tok, *args = t.children
            pos = where(name_tok.start_pos)
            slots = tuple(literal(a) if a.type in _LITERAL_TYPES else None for a in args)
            if any(s is None for s in slots):
                raise _Fallback  # pragma: no cover - non-literal arguments are not in the grammar
            kinds = tuple(a.type for a in args)
            name = str(name_tok)
            cache = self.action_values

            def f(b):
                parts_, base, offs = b
                texts = tuple(parts_[s] for s in slots)
                key = (name, kinds, texts)
                v = cache.get(key)
                if v is None:
                    toks = [self.token("NAME", name, base + offs[pos[0]] + pos[1])]
                    toks += [self.token(k, x, base + offs[s]) for k, x, s in zip(kinds, texts, slots)]
                    a = r.action(Tree("action", toks))
                    v = cache[key] = (a.name, a.args)
                return Action(v[0], v[1], self._loc(b, pos))
            return f

        cond_tree, actions_tree = rule_tree.children
        cond = expr(cond_tree)
        acts = tuple(action(a) for a in actions_tree.children)
        return _Template(cond, acts, where(rule_tree.meta.start_pos), where(rule_tree.meta.end_pos))

    def _loc(self, b, pos: tuple[int, int]) -> Location:
        _, base, offs = b
        return self.location(base + offs[pos[0]] + pos[1])

    def _build(self, tpl: _Template, start: int, parts: list[str], index: int) -> Rule:
        offs = [0]
        offs.extend(accumulate(map(len, parts)))
        b = (parts, start, offs)
        cond = tpl.cond(b)
        actions = tuple(f(b) for f in tpl.actions)
        s = start + offs[tpl.start[0]] + tpl.start[1]
        e = start + offs[tpl.end[0]] + tpl.end[1]
        return Rule(index, cond, actions, self.location(s), self.text[s:e])


def parse_shapes(text: str, spec, path: str, line_offset: int = 0, first_index: int = 0,
                 ends: list[int] | None = None) -> list[Rule] | None:
    """The rules of ``text`` by shape (see the module docstring), or None when the plain parser is
    needed.  ``ends``: :func:`rule_ends` of ``text`` when the caller has them.  The cycle collector
    is off meanwhile: parsing allocates and frees nothing cyclic."""
    with paused_gc():
        try:
            return ShapeParser(text, spec, path, line_offset, first_index, ends).parse()
        except _Fallback:
            return None
