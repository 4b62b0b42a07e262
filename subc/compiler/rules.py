"""The rule front end: text -> Lark parse tree -> resolved AST (:mod:`subc.compiler.ast`).

The grammar is ``subc/grammar/rules.lark``.  Resolution checks every field against the spec,
every operator against the field's match kind, converts literals to raw values
(:mod:`subc.compiler.literals`) and checks actions.  All errors are :class:`SubcError` with
``file:line:col``.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from ..errors import Location, SubcError
from .ast import And, Action, Not, Operand, Or, Pred, Rule
from .limits import DEFAULT_LIMITS, Limits, check_rule_text
from .literals import arg_value, literal_value
from .spec import QueryField, Spec

#: The grammar, read as package data (works from a zip too, as shipped with ``spark-submit --py-files``).
GRAMMAR = resources.files("subc") / "grammar" / "rules.lark"
MAX_PORT = 511  # 9-bit port numbers (v1model egress_spec, TNA PortId_t)

_FRIENDLY = {
    "CMP": "a comparison operator", "SEMICOLON": "';'", "COLON": "':'", "LPAR": "'('", "RPAR": "')'",
    "COMMA": "','", "NAME": "a name", "INT": "a value", "STRING": "a value", "DECIMAL": "a value", "HEX": "a value",
    "IPV4": "a value", "IPV6": "a value", "MAC": "a value", "AND": "'and'", "OR": "'or'",
    "LBRACE": "'{'", "RBRACE": "'}'", "BANG": "'!'", "NOT": "'not'", "IN": "'in'", "SLASH": "'/'", "$END": "end of input", "DOT": "'.'",
}


@lru_cache(maxsize=1)
def rule_parser() -> Lark:
    """The Lark LALR parser for the rule language (built once)."""
    return Lark(GRAMMAR.read_text(), parser="lalr", propagate_positions=True, maybe_placeholders=False)


def _syntax_error(e: UnexpectedInput, path: str, text: str) -> SubcError:
    loc = Location.from_line_col(path, text, max(e.line, 1), max(e.column, 1)) if e.line and e.line > 0 else (
        Location.from_offset(path, text, len(text))
    )
    if isinstance(e, UnexpectedCharacters):
        return SubcError(f"unexpected character {text[e.pos_in_stream]!r}", loc)
    if isinstance(e, UnexpectedEOF) or (isinstance(e, UnexpectedToken) and e.token.type == "$END"):
        loc = Location.from_offset(path, text, len(text.rstrip()))
        return SubcError("unexpected end of input (is a ';' missing?)", loc)
    expected = sorted({_FRIENDLY.get(t, t) for t in getattr(e, "expected", ()) if not t.startswith("__")})
    tok = e.token
    msg = f"unexpected {tok.value!r}"
    if expected:
        msg += ", expected " + (expected[0] if len(expected) == 1 else "one of " + ", ".join(expected))
    return SubcError(msg, loc)


def comparison_parts(t: Tree) -> tuple[Tree, Token, str, object]:
    """(field tree, operator token, operator as if the field came first with ``=`` as ``==``,
    value) of a ``cmp`` or ``cmp_rev`` tree (``5 < price`` is ``price > 5``)."""
    if t.data == "cmp":
        ftree, op_tok, value = t.children
        op = str(op_tok)
    else:
        value, op_tok, ftree = t.children
        op = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(str(op_tok), str(op_tok))
    return ftree, op_tok, "==" if op == "=" else op, value


class _Resolver:
    def __init__(self, spec: Spec, path: str, text: str, line_offset: int = 0):
        self.spec, self.path, self.text = spec, path, text
        self.lines = text.split("\n")  # once: a location per token must not rescan the text
        self.line_offset = line_offset

    def loc(self, item) -> Location:
        line, col = (item.line, item.column) if isinstance(item, Token) else (item.meta.line, item.meta.column)
        src = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return Location(self.path, line + self.line_offset, col, src)

    def rule(self, tree: Tree, index: int) -> Rule:
        cond_tree, actions_tree = tree.children
        cond = self.expr(cond_tree)
        actions = tuple(self.action(a) for a in actions_tree.children)
        text = self.text[tree.meta.start_pos : tree.meta.end_pos]
        return Rule(index, cond, actions, self.loc(tree), text)

    def expr(self, t):
        if t.data == "or_":
            return Or(self._flatten(t, "or_"))
        if t.data == "and_":
            return And(self._flatten(t, "and_"))
        if t.data == "not_":
            return Not(self.expr(t.children[0]))
        return self.comparison(t)

    def _flatten(self, t: Tree, kind: str) -> tuple:
        """The operands of a left-nested chain ``((a op b) op c) op d`` of one ``kind``, in order
        (a loop down the left spine: a chain of any length is one node and no recursion)."""
        rights = []
        while isinstance(t, Tree) and t.data == kind:
            left, right = t.children
            rights.append(right)
            t = left
        return tuple([self.expr(t)] + [self.expr(r) for r in reversed(rights)])

    def field(self, t: Tree) -> QueryField:
        name = ".".join(str(c) for c in t.children)
        q = self.spec.resolve_field(name)
        if q is None:
            loc = self.loc(t)
            amb = self.spec.bare_ambiguity(name) if "." not in name else []
            if len(amb) > 1:
                raise SubcError(f"field '{name}' is ambiguous: " + ", ".join(amb), loc)
            raise SubcError(f"unknown field '{name}' (not a query field of the spec)", loc)
        return q

    def operand(self, v, q: QueryField) -> Operand:
        if isinstance(v, Tree):  # prefix
            base, plen_tok = v.children
            loc = self.loc(base)
            plen = int(plen_tok)
            if q.match_kind == "exact":
                raise SubcError(f"prefix match on exact-only field '{q.name}' (declared with query_field_exact)", loc)
            if plen > q.width:
                raise SubcError(f"prefix length {plen} is longer than the {q.width}-bit field '{q.name}'", self.loc(plen_tok))
            kind = base.type if base.type != "INT" else "HEX"  # integers in prefixes are raw bits
            value = literal_value(kind, str(base) if base.type != "INT" else hex(int(base)), q, loc)
            if value & ((1 << (q.width - plen)) - 1):
                raise SubcError(f"prefix {base}/{plen} has bits set after the first {plen}", loc)
            return Operand(value, plen)
        return Operand(literal_value(v.type, str(v), q, self.loc(v)))

    def comparison(self, t: Tree) -> Pred:
        if t.data in ("member", "not_member"):
            q = self.field(t.children[0])
            values = t.children[1:]
            ops = tuple(self.operand(v, q) for v in values)
            return Pred(q.name, q.width, "in" if t.data == "member" else "not in", ops, self.loc(t))
        ftree, op_tok, op, value = comparison_parts(t)
        q = self.field(ftree)
        if op in ("<", "<=", ">", ">=") and q.match_kind != "range":
            kind = "query_field_exact" if q.match_kind == "exact" else "query_field_lpm"
            raise SubcError(
                f"'{op}' on field '{q.name}', which allows only ==, != and in (declared with {kind})", self.loc(op_tok)
            )
        operand = self.operand(value, q)
        if operand.prefix_len is not None and op not in ("==", "!="):
            raise SubcError(f"a prefix can only be compared with == or !=, not '{op}'", self.loc(op_tok))
        return Pred(q.name, q.width, op, (operand,), self.loc(t))

    def action(self, t: Tree) -> Action:
        name_tok, *args = t.children
        name, loc = str(name_tok), self.loc(name_tok)
        if name == "fwd":
            if not args:
                raise SubcError("fwd() needs at least one port", loc)
            ports = []
            for a in args:
                if a.type != "INT":
                    raise SubcError(f"fwd() takes port numbers, not {a}", self.loc(a))
                if int(a) > MAX_PORT:
                    raise SubcError(f"port {a} is out of range (0 to {MAX_PORT})", self.loc(a))
                ports.append(int(a))
            return Action("fwd", tuple(sorted(set(ports))), loc)
        if name == "drop":
            if args:
                raise SubcError("drop() takes no arguments", self.loc(args[0]))
            return Action("drop", (), loc)
        decl = self.spec.actions.get(name)
        if decl is None and self.spec.infers_actions:
            decl = self.spec.declare_action(name, [inferred_width(a.type, str(a)) for a in args], loc)
        if decl is None:
            known = ", ".join(["fwd", "drop", *sorted(self.spec.actions)])
            raise SubcError(f"unknown action '{name}' (known: {known})", loc)
        if len(args) != len(decl.params):
            raise SubcError(f"action '{name}' takes {len(decl.params)} argument(s), got {len(args)}", loc)
        values = tuple(
            arg_value(a.type, str(a), w, f"parameter '{p}' of '{name}'", self.loc(a)) for a, (p, w) in zip(args, decl.params)
        )
        return Action(name, values, loc)


#: Widths of the parameters of an action a rule declares (``Spec.infers_actions``), by literal kind:
#: integers are 32 bits (64 when the value needs it), addresses their size, strings their bytes.
INFERRED_WIDTHS = {"IPV4": 32, "IPV6": 128, "MAC": 48}


def inferred_width(kind: str, text: str) -> int:
    """The width in bits of a parameter declared by an action call's literal ``text`` of ``kind``."""
    if kind in INFERRED_WIDTHS:
        return INFERRED_WIDTHS[kind]
    if kind == "STRING":
        return max(8, 8 * len(text.encode("utf-8", "replace")) - 16)  # without the quotes
    value = int(text, 16) if kind == "HEX" else int(text) if kind == "INT" else 0
    return 32 if value < 1 << 32 else 64


def parse_rules(text: str, spec: Spec, path: str = "<rules>", line_offset: int = 0, first_index: int = 0,
                limits: Limits = DEFAULT_LIMITS) -> list[Rule]:
    """Parse and resolve a rule set.

    Returns the rules in file order (``Rule.index`` ``first_index``, ``first_index`` + 1, ...).
    ``text`` may be a piece of a file that starts at the beginning of line ``line_offset`` + 1:
    locations then give file lines.  Raises :class:`SubcError` at the first syntax or semantic
    error (unknown field or action, operator not allowed by the field's match kind, literal that
    does not fit, string on a numeric field, ...).  Each distinct rule shape is parsed by Lark
    once (:mod:`subc.compiler.rule_shapes`); the result equals :func:`parse_rules_lark`'s.
    The rule count, each rule's length and its nesting depth are checked first against
    ``limits`` (:func:`~subc.compiler.limits.check_rule_text`).
    """
    from .rule_shapes import parse_shapes, rule_ends

    ends = rule_ends(text)
    check_rule_text(text, path, ends, line_offset, limits)
    rules = parse_shapes(text, spec, path, line_offset, first_index, ends)
    if rules is None:
        rules = parse_rules_lark(text, spec, path, line_offset, first_index)
    return rules


def parse_rules_lark(text: str, spec: Spec, path: str = "<rules>", line_offset: int = 0, first_index: int = 0) -> list[Rule]:
    """Parse and resolve a rule set with Lark alone (:func:`parse_rules` gives the same result faster).

    Returns the rules in file order (``Rule.index`` ``first_index``, ``first_index`` + 1, ...).
    ``text`` may be a piece of a file that starts at the beginning of line ``line_offset`` + 1:
    locations then give file lines.  Raises :class:`SubcError` at the first syntax or semantic
    error (unknown field or action, operator not allowed by the field's match kind, literal that
    does not fit, string on a numeric field, ...).
    """
    try:
        tree = rule_parser().parse(text)
    except UnexpectedInput as e:
        err = _syntax_error(e, path, text)
        loc = err.location
        if line_offset and loc is not None:
            err.location = Location(loc.path, loc.line + line_offset, loc.column, loc.source_line)
        raise err from None
    resolver = _Resolver(spec, path, text, line_offset)
    return [resolver.rule(r, first_index + i) for i, r in enumerate(tree.children)]


def load_rules(path: str | Path, spec: Spec, limits: Limits = DEFAULT_LIMITS) -> list[Rule]:
    """Read and parse the rule file at ``path`` (see :func:`parse_rules`)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SubcError(f"cannot read rules {path}: {e}") from e
    return parse_rules(text, spec, str(path), limits=limits)
