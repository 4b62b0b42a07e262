"""The Lark parser of the rule language and what the front end reads off its trees.

The grammar is ``subc/lang/rules.lark`` (LALR, contextual lexer).  This module is the one place
that builds the parser (:func:`rule_parser`) and turns its exceptions into located
:class:`~subc.errors.SubcError` diagnostics (:func:`syntax_error`); the rule resolver
(:mod:`.rules`), the shape parser (:mod:`.rule_shapes`) and the input limits (:mod:`.limits`) all
import it, and it imports none of them.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from functools import lru_cache
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from ..errors import Location, SubcError

#: The grammar, read as package data (works from a zip too, as shipped with ``spark-submit --py-files``).
GRAMMAR = resources.files("subc") / "lang" / "rules.lark"

#: Terminal names as a syntax error names what it expected.
FRIENDLY_TERMINALS = {
    "CMP": "a comparison operator",
    "SEMICOLON": "';'",
    "COLON": "':'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "NAME": "a name",
    "INT": "a value",
    "STRING": "a value",
    "DECIMAL": "a value",
    "HEX": "a value",
    "IPV4": "a value",
    "IPV6": "a value",
    "MAC": "a value",
    "AND": "'and'",
    "OR": "'or'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "BANG": "'!'",
    "NOT": "'not'",
    "IN": "'in'",
    "SLASH": "'/'",
    "$END": "end of input",
    "DOT": "'.'",
}


class SourceText:
    """A rule text as it is parsed: ``path``, ``text`` and ``line_offset`` (the text starts at the
    beginning of file line ``line_offset`` + 1, as a piece of a larger file does).

    :meth:`location` locates a 0-based character offset; the line index behind it (8 bytes per
    line) is built as far as the offsets asked for, so that locating the first rules of a large
    file does not scan all of it."""

    __slots__ = ("path", "text", "line_offset", "_starts", "_scanned", "_line")

    def __init__(self, path: str, text: str, line_offset: int = 0):
        self.path, self.text, self.line_offset = path, text, line_offset
        self._starts = array("q", [0])  # offsets where lines start
        self._scanned = 0  # every newline before this offset is indexed
        self._line = (0, -1, 0, "")  # the line located last: (start, end, file line, text)

    def location(self, pos: int) -> Location:
        """The :class:`Location` of offset ``pos`` (0 <= pos <= len(text)): file line, 1-based
        column, and the text of the line (without its newline), as Lark counts them."""
        ls, le, line, src = self._line
        if not ls <= pos <= le:  # another line than last time (a rule's locations share one)
            if pos > self._scanned:
                self._scan(pos)
            starts, text = self._starts, self.text
            i = bisect_right(starts, pos) - 1
            ls = starts[i]
            le = text.find("\n", ls)
            if le < 0:
                le = len(text)
            line, src = i + 1 + self.line_offset, text[ls:le]
            self._line = (ls, le, line, src)
        return Location(self.path, line, pos - ls + 1, src)

    def _scan(self, pos: int) -> None:
        text, starts = self.text, self._starts
        stop = min(len(text), max(pos, 2 * self._scanned, 1 << 16))
        i = self._scanned
        find = text.find
        while True:
            j = find("\n", i, stop)
            if j < 0:
                break
            starts.append(j + 1)
            i = j + 1
        self._scanned = stop


@lru_cache(maxsize=1)
def rule_parser() -> Lark:
    """The Lark LALR parser of the rule language, built once per process (positions propagated:
    every tree has ``meta.start_pos``/``end_pos``, every token ``start_pos``, 0-based offsets
    into the parsed text).  ``parse(text)`` returns a ``start`` tree with one ``rule`` child per
    rule and raises ``lark.exceptions.UnexpectedInput`` on a syntax error.  The grammar's analysis
    is kept in Lark's cache (a file under the temporary directory keyed by the grammar, the
    options and Lark's version: built again when one changes), which saves building the LALR
    tables in every process."""
    return Lark(GRAMMAR.read_text(), parser="lalr", propagate_positions=True, maybe_placeholders=False, cache=True)


def syntax_error(e: UnexpectedInput, path: str, text: str, line_offset: int = 0) -> SubcError:
    """The diagnostic of Lark's syntax error ``e`` raised while parsing ``text`` (read from
    ``path``, starting at the beginning of file line ``line_offset`` + 1): an unexpected character,
    an unexpected end of input (at the end of the last non-blank text), or an unexpected token with
    what the grammar expected instead."""
    loc = (
        Location.from_line_col(path, text, max(e.line, 1), max(e.column, 1))
        if e.line and e.line > 0
        else (Location.from_offset(path, text, len(text)))
    )
    if isinstance(e, UnexpectedCharacters):
        # lark declares pos_in_stream None (UnexpectedInput's default); UnexpectedCharacters sets the int offset
        err = SubcError(f"unexpected character {text[e.pos_in_stream]!r}", loc)  # type: ignore[index]
    elif isinstance(e, UnexpectedEOF) or (isinstance(e, UnexpectedToken) and e.token.type == "$END"):
        err = SubcError(
            "unexpected end of input (is a ';' missing?)", Location.from_offset(path, text, len(text.rstrip()))
        )
    else:
        assert isinstance(e, UnexpectedToken)  # lark raises no other UnexpectedInput
        expected = sorted({FRIENDLY_TERMINALS.get(t, t) for t in getattr(e, "expected", ()) if not t.startswith("__")})
        msg = f"unexpected {e.token.value!r}"
        if expected:
            msg += ", expected " + (expected[0] if len(expected) == 1 else "one of " + ", ".join(expected))
        err = SubcError(msg, loc)
    if line_offset and err.location is not None:
        loc = err.location
        err.location = Location(loc.path, loc.line + line_offset, loc.column, loc.source_line)
    return err


def as_token(x: Token | Tree) -> Token:
    """``x``, a child of a parse tree where the grammar puts a token (a name, an operator, a
    literal).  TypeError when it is a tree."""
    if not isinstance(x, Token):
        raise TypeError(f"expected a token, found a {x.data!r} tree")
    return x


def as_tree(x: Token | Tree) -> Tree:
    """``x``, a child of a parse tree where the grammar puts a tree (a rule, a condition, a field).
    TypeError when it is a token."""
    if not isinstance(x, Tree):
        raise TypeError(f"expected a tree, found token {x!r}")
    return x


def token_start(tok: Token) -> int:
    """The offset of ``tok`` in the parsed text (the parser gives every token its position, and the
    shape parser the tokens it builds).  ValueError for a token without one."""
    pos = tok.start_pos
    if pos is None:
        raise ValueError(f"token {tok!r} has no position")
    return pos


def comparison_parts(t: Tree) -> tuple[Tree, Token, str, Token | Tree]:
    """(field tree, operator token, operator as if the field came first with ``=`` as ``==``,
    value) of a ``cmp`` or ``cmp_rev`` tree (``5 < price`` is ``price > 5``); of an ``agg_cmp`` or
    ``agg_cmp_rev`` tree the first item is the aggregate's tree.  The value is a literal token or a
    ``prefix`` tree."""
    if t.data in ("cmp", "agg_cmp"):
        ftree, op_tok, value = t.children
        op = str(op_tok)
    else:
        value, op_tok, ftree = t.children
        op = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(str(op_tok), str(op_tok))
    return as_tree(ftree), as_token(op_tok), "==" if op == "=" else op, value


def tree_tokens(tree: Tree) -> list[Token]:
    """The tokens of a Lark tree in text order, found without recursion."""
    out: list[Token] = []
    stack: list[Token | Tree] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, Tree):
            stack.extend(reversed(node.children))
        else:
            out.append(node)
    return out


def condition_depth(tree: Token | Tree, mark: int = 0) -> tuple[int, Tree | None]:
    """(nesting depth, the first node found at depth ``mark`` or, with ``mark`` 0, at the
    maximum depth) of a condition's Lark tree, counted without recursion as the AST nests: each
    ``and``/``or``/``not`` node is a level, except that a left-nested chain of one operator
    (``a and b and c``) is one level, as the resolver flattens it."""
    best, best_node = 0, None
    marked = None
    stack: list[tuple[object, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, Tree) or node.data not in ("and_", "or_", "not_"):
            continue
        d = depth + 1
        if d > best:
            best, best_node = d, node
        if d == mark and marked is None:
            marked = node
        if node.data == "not_":
            stack.append((node.children[0], d))
            continue
        left, right = node.children
        stack.append((right, d))
        stack.append((left, depth if isinstance(left, Tree) and left.data == node.data else d))
    return best, (marked if mark else best_node)
