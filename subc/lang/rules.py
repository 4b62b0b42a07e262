"""The rule front end: text -> Lark parse tree -> resolved AST (:mod:`subc.lang.ast`).

The grammar is ``subc/lang/rules.lark``.  Resolution checks every field against the spec,
every operator against the field's match kind, converts literals to raw values
(:mod:`subc.lang.literals`) and checks actions.  All errors are :class:`SubcError` with
``file:line:col``.
"""

from __future__ import annotations

from pathlib import Path

from lark import Token, Tree
from lark.exceptions import UnexpectedInput

from ..errors import Location, SubcError
from ..ir.decisions import COUNT_ATOM
from .ast import (
    AGGREGATES,
    COUNTER,
    MAX_STATE_PREDICATES,
    Aggregate,
    And,
    Action,
    Not,
    Operand,
    Or,
    Pred,
    Rule,
    StatePred,
    state_predicates,
)
from .grammar_parser import (
    SourceText,
    as_token,
    as_tree,
    comparison_parts,
    rule_parser,
    syntax_error,
    token_start,
)
from .limits import DEFAULT_LIMITS, Limits
from .literals import arg_value, literal_value
from .rule_shapes import ShapeParser
from .shapes import ShapeCache
from .rule_store import RuleStore
from ..spec.model import QueryField, Spec

#: Widest field each aggregate takes (bits): a sum is kept in 64 bits, an average's excess over a
#: threshold in 64 signed bits, a min or max with one more bit for the empty window.
AGGREGATE_MAX_WIDTH = {"sum": 64, "avg": 32, "min": 63, "max": 63}

MAX_PORT = 511  # 9-bit port numbers (v1model egress_spec, TNA PortId_t)


class RuleResolver:
    """Resolves Lark trees of rules (:func:`~.grammar_parser.rule_parser`) into the AST against
    ``spec``: every field against the spec's query fields, every operator against the field's match
    kind, literals into raw values (:mod:`.literals`), actions against ``fwd``, ``drop`` and the
    spec's actions (declaring them when the spec lets rules declare them).

    ``source`` is the :class:`~.grammar_parser.SourceText` the trees' positions (``start_pos``,
    ``meta.start_pos``) are offsets into (plus ``base``: see :meth:`at`); locations are computed
    from those offsets.  Every
    method raises :class:`SubcError` at the offending token.  The shape parser
    (:mod:`.rule_shapes`) calls :meth:`operand` and :meth:`action` with tokens it builds."""

    def __init__(self, spec: Spec, source: SourceText, base: int = 0):
        self.spec, self.source, self.base = spec, source, base

    def at(self, base: int) -> "RuleResolver":
        """A resolver for trees of a piece of the source text that starts at offset ``base`` (their
        positions are offsets into the piece)."""
        return RuleResolver(self.spec, self.source, base)

    def loc(self, item: Token | Tree) -> Location:
        """The location of a token or a (non-empty) tree."""
        return self.source.location(self.base + (token_start(item) if isinstance(item, Token) else item.meta.start_pos))

    def rule(self, tree: Tree, index: int) -> Rule:
        """The rule of a ``rule`` tree, with ``index``."""
        cond_tree, actions_tree = tree.children
        cond = self.expr(cond_tree)
        preds = state_predicates(cond)
        if len(preds) > MAX_STATE_PREDICATES:
            raise SubcError(
                f"a rule may compare state at most {MAX_STATE_PREDICATES} ways; this one has {len(preds)}",
                preds[MAX_STATE_PREDICATES].location,
            )
        actions = tuple(self.action(a) for a in actions_tree.children)
        text = self.source.text[self.base + tree.meta.start_pos : self.base + tree.meta.end_pos]
        return Rule(index, cond, actions, self.loc(tree), text)

    def expr(self, t):
        """The condition of a condition tree (a left-nested chain of one operator is one node)."""
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
        """The query field a ``field`` tree names (a bare name when it is unambiguous)."""
        name = ".".join(str(c) for c in t.children)
        q = self.spec.resolve_field(name)
        if q is None:
            loc = self.loc(t)
            amb = self.spec.bare_ambiguity(name) if "." not in name else []
            if len(amb) > 1:
                raise SubcError(f"field '{name}' is ambiguous: " + ", ".join(amb), loc)
            raise SubcError(f"unknown field '{name}' (not a query field of the spec)", loc)
        return q

    def operand(self, v: Token | Tree, q: QueryField) -> Operand:
        """The operand of literal token (or ``prefix`` tree) ``v`` compared with field ``q``."""
        if isinstance(v, Tree):  # prefix
            base, plen_tok = map(as_token, v.children)
            loc = self.loc(base)
            plen = int(plen_tok)
            if q.match_kind == "exact":
                raise SubcError(f"prefix match on exact-only field '{q.name}' (declared with query_field_exact)", loc)
            if plen > q.width:
                raise SubcError(
                    f"prefix length {plen} is longer than the {q.width}-bit field '{q.name}'", self.loc(plen_tok)
                )
            kind = base.type if base.type != "INT" else "HEX"  # integers in prefixes are raw bits
            value = literal_value(kind, str(base) if base.type != "INT" else hex(int(base)), q, loc)
            if value & ((1 << (q.width - plen)) - 1):
                raise SubcError(f"prefix {base}/{plen} has bits set after the first {plen}", loc)
            return Operand(value, plen)
        return Operand(literal_value(v.type, str(v), q, self.loc(v)))

    def counter_name(self, t) -> str | None:
        """The named counter a ``field`` tree names (a bare name the spec declares with
        ``query_counter``), or None."""
        if (
            isinstance(t, Tree)
            and t.data == "field"
            and len(t.children) == 1
            and str(t.children[0]) in self.spec.counters
        ):
            return str(t.children[0])
        return None

    def counter(self, name: str, t) -> tuple[Aggregate, QueryField]:
        """The :class:`Aggregate` of named counter ``name`` (at tree or token ``t``) and the field
        its comparison values are converted with (64-bit integers)."""
        c = self.spec.counters[name]
        return Aggregate(COUNTER, None, 0, c.window_ns, name), QueryField(name, 64, "range", self.loc(t))

    def aggregate(self, t: Tree) -> tuple[Aggregate, QueryField]:
        """The :class:`Aggregate` of an ``aggregate`` tree, and the field its comparison values
        are converted with (the aggregated field, as wide as the aggregate's values).  Camus's
        ``count(c)`` of a named counter ``c`` is the counter."""
        name_tok, *args = t.children
        kind = str(name_tok)
        cname = self.counter_name(args[0]) if len(args) == 1 else None
        if cname is not None:
            if kind != "count":
                raise SubcError(
                    f"'{args[0].children[0]}' is a named counter: compare it by name or as "
                    f"count({args[0].children[0]}), not with {kind}()",
                    self.loc(name_tok),
                )
            return self.counter(cname, t)
        if kind not in AGGREGATES:
            raise SubcError(f"unknown aggregate '{kind}' (known: {', '.join(sorted(AGGREGATES))})", self.loc(name_tok))
        q, window, seen_kw = None, None, False
        for a in args:
            if a.data == "field":
                if q is not None or seen_kw:
                    raise SubcError(f"{kind}() takes one field, before its keyword arguments", self.loc(a))
                q = self.field(a)
            else:
                key, op, value = a.children
                if str(key) != "window" or str(op) != "=":
                    raise SubcError(f"unknown keyword argument '{key}' (known: window=<us>)", self.loc(key))
                if window is not None:
                    raise SubcError("window= is given twice", self.loc(key))
                window, seen_kw = int(as_token(value)) * 1000, True
        if q is None and kind != "count":
            raise SubcError(f"{kind}() needs a field: {kind}(header.field)", self.loc(name_tok))
        if q is not None:
            if q.alpha:
                raise SubcError(f"cannot aggregate text field '{q.name}' (alpha)", self.loc(name_tok))
            limit = AGGREGATE_MAX_WIDTH.get(kind)
            if limit is not None and q.width > limit:
                raise SubcError(
                    f"{kind}() takes fields of at most {limit} bits; '{q.name}' has {q.width}", self.loc(name_tok)
                )
        if window is None:
            window = self.spec.field_windows.get(q.name, self.spec.window_ns) if q is not None else self.spec.window_ns
        agg = Aggregate(kind, q.name if q is not None else None, q.width if q is not None else 0, window)
        if kind in ("count", "sum"):  # values of 64 bits; a sum keeps the field's scale
            scale = q.scale if (q is not None and kind == "sum") else None
            values_field = QueryField(f"{kind}()", 64, "range", self.loc(t), scale)
        else:
            assert q is not None  # avg, min and max need a field (checked above)
            values_field = q
        return agg, values_field

    def state_pred(self, agg: Aggregate, q: QueryField, op: str, values, t: Tree) -> StatePred:
        """The comparison ``agg op values`` at tree ``t``, the value tokens converted with ``q``
        (whole values only: a prefix is an error)."""
        ops = tuple(self.operand(v, q) for v in values)
        if any(o.prefix_len is not None for o in ops):
            what = "a counter" if agg.kind == COUNTER else "an aggregate"
            raise SubcError(f"{what} is compared with whole values, not prefixes", self.loc(t))
        return StatePred(agg, op, ops, self.loc(t))

    def state_comparison(self, t: Tree) -> StatePred:
        """The comparison on state of an ``agg_cmp``, ``agg_cmp_rev``, ``agg_member`` or
        ``agg_not_member`` tree."""
        if t.data in ("agg_member", "agg_not_member"):
            agg, q = self.aggregate(t.children[0])
            if agg.kind == "avg":
                raise SubcError("avg() is compared with ==, !=, <, <=, > or >=, not a set", self.loc(t))
            return self.state_pred(agg, q, "in" if t.data == "agg_member" else "not in", t.children[1:], t)
        atree, _, op, value = comparison_parts(t)
        agg, q = self.aggregate(atree)
        return self.state_pred(agg, q, op, (value,), t)

    def comparison(self, t: Tree) -> Pred | StatePred:
        """The predicate of a ``cmp``, ``cmp_rev``, ``member`` or ``not_member`` tree, or the
        comparison on state of an aggregate's (:meth:`state_comparison`) or a named counter's."""
        if t.data.startswith("agg_"):
            return self.state_comparison(t)
        if t.data in ("member", "not_member"):
            op = "in" if t.data == "member" else "not in"
            name = self.counter_name(t.children[0])
            if name is not None:  # a named counter's bare name
                return self.state_pred(*self.counter(name, t.children[0]), op, t.children[1:], t)
            q = self.field(t.children[0])
            ops = tuple(self.operand(v, q) for v in t.children[1:])
            return Pred(q.name, q.width, op, ops, self.loc(t))
        ftree, op_tok, op, value = comparison_parts(t)
        name = self.counter_name(ftree)
        if name is not None:  # a named counter's bare name
            return self.state_pred(*self.counter(name, ftree), op, (value,), t)
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

    def counter_update(self, t: Tree) -> Action:
        """The update of a named counter of a ``counter_assign`` tree, Camus's ``c <- count()``
        (add 1, as ``inc(c)``) or ``c <- sum(h.f)`` (add the message's ``h.f``): the action
        ``subc_count(c, field or None)`` (:data:`~.decisions.COUNT_ATOM`)."""
        name_tok, atree = t.children
        name, loc = str(name_tok), self.loc(name_tok)
        if name not in self.spec.counters:
            raise SubcError(
                f"'{name}' is not a counter (declare it with @pragma query_counter({name}, window_us))", loc
            )
        fn_tok, *args = atree.children
        fn = str(fn_tok)
        if fn not in ("count", "sum"):
            raise SubcError(
                f"a counter adds: {name} <- count() or {name} <- sum(header.field), not {fn}()", self.loc(fn_tok)
            )
        if any(a.data != "field" for a in args):
            raise SubcError(f"the counter's window applies: {fn}() takes no keyword arguments here", self.loc(atree))
        if fn == "count":
            if args:
                raise SubcError(f"{name} <- count() takes no field", self.loc(args[0]))
            return Action(COUNT_ATOM, (name, None), loc)
        if len(args) != 1:
            raise SubcError(f"{name} <- sum(header.field) takes one field", self.loc(atree))
        q = self.field(args[0])
        if q.alpha:
            raise SubcError(f"cannot add text field '{q.name}' (alpha) to a counter", self.loc(args[0]))
        return Action(COUNT_ATOM, (name, q.name), loc)

    def action(self, t: Tree) -> Action:
        """The action of an ``action`` tree (name token, then argument tokens), or of a
        ``counter_assign`` tree (:meth:`counter_update`).  ``inc(c)`` of a named counter ``c``
        adds 1 to it."""
        if t.data == "counter_assign":
            return self.counter_update(t)
        name_tok, *args = map(as_token, t.children)
        name, loc = str(name_tok), self.loc(name_tok)
        if any(a.type == "NAME" for a in args):
            if name != "inc" or len(args) != 1:
                bad = next(a for a in args if a.type == "NAME")
                raise SubcError(f"'{bad}' is not a value; only inc(counter) names a counter", self.loc(bad))
            if str(args[0]) not in self.spec.counters:
                raise SubcError(
                    f"'{args[0]}' is not a counter (declare it with @pragma query_counter({args[0]}, window_us))",
                    self.loc(args[0]),
                )
            return Action(COUNT_ATOM, (str(args[0]), None), loc)
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
            arg_value(a.type, str(a), w, f"parameter '{p}' of '{name}'", self.loc(a))
            for a, (p, w) in zip(args, decl.params)
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


def parse_rules(
    text: str,
    spec: Spec,
    path: str = "<rules>",
    line_offset: int = 0,
    first_index: int = 0,
    limits: Limits = DEFAULT_LIMITS,
    shapes: ShapeCache | None = None,
) -> list[Rule]:
    """Parse and resolve a rule set.

    Returns the rules in file order (``Rule.index`` ``first_index``, ``first_index`` + 1, ...).
    ``text`` may be a piece of a file that starts at the beginning of line ``line_offset`` + 1:
    locations then give file lines.  Raises :class:`~.limits.LimitError` at the first rule over
    ``limits`` (rule count, a rule's length, its nesting depth: :func:`~.limits.check_rule_text`),
    else :class:`SubcError` at the first syntax error, else at the first semantic error (unknown
    field or action, operator not allowed by the field's match kind, literal that does not fit,
    string on a numeric field, ...), exactly as :func:`parse_rules_lark` after
    :func:`~.limits.check_rule_text`.  Each distinct rule shape is parsed by Lark once
    (:mod:`subc.lang.rule_shapes`), or never when ``shapes`` (a
    :class:`~.shapes.ShapeCache` of ``spec`` and ``limits``) knows it from an earlier text;
    the result equals :func:`parse_rules_lark`'s.
    """
    return list(parse_rule_store(text, spec, path, line_offset, first_index, limits, shapes))


def parse_rule_store(
    text: str,
    spec: Spec,
    path: str = "<rules>",
    line_offset: int = 0,
    first_index: int = 0,
    limits: Limits = DEFAULT_LIMITS,
    shapes: ShapeCache | None = None,
) -> RuleStore:
    """The rules :func:`parse_rules` gives (same arguments, same errors), held in columns (a
    :class:`~.rule_store.RuleStore`: rules built on demand, grouped by core condition for the
    compiler)."""
    source = SourceText(path, text, line_offset)
    return ShapeParser(source, spec, RuleResolver(spec, source), first_index, limits, shapes).parse()


def parse_rules_lark(
    text: str, spec: Spec, path: str = "<rules>", line_offset: int = 0, first_index: int = 0
) -> list[Rule]:
    """Parse and resolve a rule set with Lark alone (:func:`parse_rules` gives the same result faster,
    and checks limits first).

    Returns the rules in file order (``Rule.index`` ``first_index``, ``first_index`` + 1, ...).
    ``text`` may be a piece of a file that starts at the beginning of line ``line_offset`` + 1:
    locations then give file lines.  Raises :class:`SubcError` at the first syntax error, else at
    the first semantic error (see :func:`parse_rules`).
    """
    try:
        tree = rule_parser().parse(text)
    except UnexpectedInput as e:
        raise syntax_error(e, path, text, line_offset) from None
    resolver = RuleResolver(spec, SourceText(path, text, line_offset))
    return [resolver.rule(as_tree(r), first_index + i) for i, r in enumerate(tree.children)]


def load_rules(path: str | Path, spec: Spec, limits: Limits = DEFAULT_LIMITS) -> list[Rule]:
    """Read and parse the rule file at ``path`` (see :func:`parse_rules`).  Raises
    :class:`SubcError` when it cannot be read (or is not UTF-8)."""
    return list(load_rule_store(path, spec, limits))


def load_rule_store(path: str | Path, spec: Spec, limits: Limits = DEFAULT_LIMITS) -> RuleStore:
    """The rules :func:`load_rules` gives (same errors), held in columns (:func:`parse_rule_store`)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SubcError(f"cannot read rules {path}: {e}") from e
    return parse_rule_store(text, spec, str(path), limits=limits)
