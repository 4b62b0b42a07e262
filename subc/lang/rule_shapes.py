"""Fast rule parsing: Lark parses each distinct rule *shape* once; the other rules of a shape are
matched by a regular expression built from it and kept as compact deferred rules.

Large rule sets repeat a few shapes with different literals (a million Camus subscriptions are
one shape: ``add_order.stock == S and add_order.shares > P : fwd(H);``).  The text is a sequence
of *pieces*, each from the end of the previous rule to just after a ``;`` outside strings and
comments (:func:`rule_ends`).  A regular expression splits a piece into its literals (strings,
decimals, hex and decimal integers that are not part of a name) and the text between them; that
text plus the literals' kinds is the piece's *shape*.

* The first piece of a shape is parsed by Lark (:func:`~.grammar_parser.rule_parser`) and resolved
  by the rule resolver (:class:`~.rules.RuleResolver`, passed in), like every piece of a shape
  that cannot be a template (below).
* Its tree becomes the shape's *template* (:mod:`.shape_templates`), and the shape's text with
  one capturing group per literal becomes the shape's *pattern*: a piece matches the pattern
  exactly when it splits into that shape.  The following pieces are matched with the patterns
  of the shapes seen last, one C-level match each; a piece that matches none is split and looked
  up (or is a new shape).
* A templated piece becomes a *deferred* rule of the :class:`~.rule_store.RuleStore` the parse
  fills: its start offset, and the numbers of its group (a *core* condition shared by every rule
  of the shape with the same condition literal texts) and of its atom set (literal values are
  converted by the resolver's own code, once per field and text).  The store builds it as a
  deferred :class:`~.ast.Rule` when asked; its located condition, actions, location and text are
  built from the template when first asked for (:meth:`Shape.materialize`), by matching the
  pattern at its offset again.

A shape is a template only when Lark's tokens for its first piece are exactly the literals and
text the splitter saw (no IPv4/IPv6/MAC literals or prefixes, one rule).

Errors are those of :func:`subc.lang.rules.parse_rules_lark` after
:func:`~.limits.check_rule_text`.  The limits are checked on the way (the rule count, each piece's
length, each shape's nesting depth, which every piece of the shape shares).  The first semantic
error (a field, an operator, a literal, an action) is kept while the rest of the text is still
checked for limits and syntax; when a limit is exceeded, or a piece is not valid syntax, or the
text ends in an incomplete rule, the whole text is checked and parsed the reference way (limits,
then Lark on all of it), so that errors come out exactly as the plain parser reports them.  The
result equals :func:`~.rules.parse_rules_lark` rule for rule (``tests/test_rule_shapes.py``).
"""

from __future__ import annotations

import re
from array import array
from itertools import accumulate

from lark import Tree
from lark.exceptions import UnexpectedInput

from ..errors import SubcError
from ..compiler.gcpause import paused_gc
from .grammar_parser import (
    SourceText,
    as_tree,
    condition_depth,
    rule_parser,
    syntax_error,
    token_start,
    tree_tokens,
)
from .limits import DEFAULT_LIMITS, Limits, check_rule_text
from .rule_store import RuleStore
from .shape_templates import build_template
from .shapes import Shape, ShapeCache

#: Rule ends: a ';' outside strings and comments (strings and comments are matched to skip them).
_ENDS = re.compile(r'"(?:[^"\\\n]|\\.)*"|#[^\n]*|//[^\n]*|;')
#: Literals of a piece (one capturing group: re.split keeps them).  Names are matched and kept in
#: the text so that digits inside a name are not literals; comments likewise.
_SPLIT = re.compile(r'("(?:[^"\\\n]|\\.)*"|(?<![A-Za-z0-9_.])(?:\d+\.\d+|0[xX][0-9A-Fa-f]+|\d+)(?![A-Za-z0-9_]))')
_COMMENT_OR_SPACE = re.compile(r"(?:\s+|#[^\n]*|//[^\n]*)*\Z")
_LITERAL_TYPES = ("INT", "HEX", "DECIMAL", "STRING")
#: A literal of each kind in a shape's pattern (the alternatives of _SPLIT, one group each; a
#: string's ``(?:[^"\\\n]|\\.)*`` unrolled as ``[^"\\\n]*(?:\\.[^"\\\n]*)*``, the same strings matched
#: faster).  The text around a literal is fixed by the shape, so it splits there exactly as the
#: first piece did.
_GROUP = {
    "STRING": r'("[^"\\\n]*(?:\\.[^"\\\n]*)*")',
    "DECIMAL": r"(\d+\.\d+)",
    "HEX": r"(0[xX][0-9A-Fa-f]+)",
    "INT": r"(\d+)",
}
#: How many shapes' patterns are tried on a piece before it is split and looked up.
_RECENT = 4


def rule_ends(text: str) -> list[int]:
    """Offsets just after each ';' that ends a rule (outside strings and comments)."""
    return [m.end() for m in _ENDS.finditer(text) if m.group() == ";"]


def span_pattern(parts: list[str], cond_groups: tuple[int, ...], act_groups: tuple[int, ...]) -> re.Pattern | None:
    """The span pattern of a template shape split into ``parts`` (see :class:`~.shapes.Shape`):
    its pattern with two groups, from the first to the last literal of ``cond_groups`` and of
    ``act_groups`` (sorted group numbers; an empty group when there are none), or None unless each
    of them is a run of consecutive groups, the condition's before the actions'.  Fixed text lies
    between a span's literals, so a span's text determines them."""
    cg, ag = cond_groups, act_groups
    for gs in (cg, ag):
        if gs and gs != tuple(range(gs[0], gs[-1] + 1)):
            return None
    if cg and ag and cg[-1] >= ag[0]:
        return None
    out = [] if cg else ["()"]
    for i, p in enumerate(parts):
        if i % 2 == 0:
            out.append(re.escape(p))
            continue
        g = (i + 1) // 2
        opens = (cg and g == cg[0]) or (ag and g == ag[0])
        closes = (cg and g == cg[-1]) or (ag and g == ag[-1])
        out.append(("(" if opens else "") + "(?:" + _GROUP[_kind(p)][1:] + (")" if closes else ""))
    out.append("" if ag else "()")
    return re.compile("".join(out))


def _kind(lit: str) -> str:
    if lit[0] == '"':
        return "STRING"
    if "." in lit:
        return "DECIMAL"
    if len(lit) > 1 and lit[1] in "xX":
        return "HEX"
    return "INT"


class _Anomaly(Exception):
    """The text needs the reference path: a limit exceeded, a syntax error, an incomplete rule."""


class ShapeParser:
    """Parse the rule text of ``source`` shape by shape (see the module docstring).

    ``resolver`` is a :class:`~.rules.RuleResolver` over ``source``; rules are numbered from
    ``first_index``; ``limits`` are those of :func:`~.limits.check_rule_text`; ``cache``: shapes
    known from earlier parses (:class:`ShapeCache`, of the same spec and limits, else ValueError).
    :meth:`parse` returns the rules in text order (a :class:`~.rule_store.RuleStore`) or raises
    what the reference path raises."""

    def __init__(
        self,
        source: SourceText,
        spec,
        resolver,
        first_index: int = 0,
        limits: Limits = DEFAULT_LIMITS,
        cache: ShapeCache | None = None,
    ):
        if cache is not None and (cache.spec is not spec or cache.limits != limits):
            raise ValueError("ShapeParser: the shape cache is for another spec or other limits")
        self.source, self.spec, self.resolver = source, spec, resolver
        self.first_index, self.limits = first_index, limits
        self.cache = cache
        self.shapes: dict[tuple, Shape] = {}
        self.recent: list[Shape] = []  # templated shapes, most recently used first
        self.operands: dict[tuple, object] = {}  # (field, kind, text) -> Operand
        self.action_values: dict[tuple, tuple] = {}  # (name, kinds, texts) -> (name, args)
        self.index = first_index
        self.offsets = array("q")  # the start offset of each rule's piece, by index from first_index
        self.store = RuleStore(first_index, self.offsets)
        #: per shape, this parse's group numbers by condition literal texts and leaf numbers by
        #: action literal texts (the store's numbers: the shape's own caches outlive a parse)
        self.numbers: dict[Shape, tuple[dict, dict]] = {}
        self.error: SubcError | None = None  # the first semantic error; then only checking

    def parse(self) -> RuleStore:
        """The rules of the text (see the class docstring); the cycle collector is paused meanwhile
        (parsing allocates nothing cyclic)."""
        declared = dict(self.spec.actions)
        with paused_gc():
            try:
                rules: RuleStore | None = self._scan()
            except _Anomaly:
                rules = None
        if rules is None:
            # undo the actions the scan declared: the reference path declares them again in order
            self.spec.actions.clear()
            self.spec.actions.update(declared)
            return self._reference()
        if self.cache is not None:
            self.cache.parsed(self.index - self.first_index)
        else:  # the literal texts seen are not needed any more (a million rules: 20 MB of keys)
            for shape in self.shapes.values():
                shape.conditions, shape.atom_sets = {}, {}
        self.numbers = {}
        if self.error is not None:
            raise self.error
        return rules

    def _reference(self) -> RuleStore:
        """Limits on the whole text, then Lark on all of it (:func:`~.rules.parse_rules_lark`)."""
        src = self.source
        check_rule_text(src.text, src.path, rule_ends(src.text), src.line_offset, self.limits)
        try:
            tree = rule_parser().parse(src.text)
        except UnexpectedInput as e:
            raise syntax_error(e, src.path, src.text, src.line_offset) from None
        return RuleStore.of(
            (self.resolver.rule(r, self.first_index + i) for i, r in enumerate(tree.children)), self.first_index
        )

    # -- the scan ------------------------------------------------------------------------------
    def _scan(self) -> RuleStore:
        text = self.source.text
        n = len(text)
        rules = self.store
        pos = 0
        while pos < n:
            for shape in self.recent:
                after = self._run(shape, pos, rules)
                if after != pos:
                    self._recent(shape)
                    pos = after
                    break
            else:
                pos = self._piece(pos, rules)
        return rules

    def _run(self, shape: Shape, pos: int, rules: RuleStore) -> int:
        """Consume the consecutive pieces from ``pos`` that match ``shape``'s pattern; returns the
        offset after them (``pos`` when the first does not match).  _Anomaly when a piece is too
        long or the rules are too many."""
        text = self.source.text
        assert shape.pattern is not None  # only shapes with a pattern are run
        match = shape.pattern.match
        max_chars = self.limits.max_rule_chars
        if self.error is None:
            pos = self._deferred(shape, pos, rules)
        index = self.index
        if self.error is not None:
            while True:  # checking only
                m = match(text, pos)
                if m is None:
                    break
                end = m.end()
                if end - pos > max_chars:
                    raise _Anomaly
                self.offsets.append(pos)
                index += 1
                pos = end
        self.index = index
        if index - self.first_index > self.limits.max_rules:
            raise _Anomaly
        return pos

    def _deferred(self, shape: Shape, pos: int, rules: RuleStore) -> int:
        """Add the pieces from ``pos`` that match template ``shape``'s pattern to ``rules`` as
        deferred rules (their groups and leaves: :meth:`_number`) until one does not match or has a
        semantic error (kept in :attr:`error`, its piece consumed); returns the offset after them.
        _Anomaly when a piece is too long.  The rules' leaves join their groups' lists after the
        loop, in rule order (:meth:`RuleStore.join_leaves`)."""
        start = len(rules.group_of)
        if shape.span_pattern is not None:
            pos = self._deferred_spans(shape, pos, rules)
        else:
            pos = self._deferred_groups(shape, pos, rules)
        rules.join_leaves(start)
        return pos

    def _deferred_groups(self, shape: Shape, pos: int, rules: RuleStore) -> int:
        """:meth:`_deferred` for a shape without a span pattern: its pieces' literal texts are the
        keys of their group and leaf numbers."""
        text = self.source.text
        pattern = shape.pattern
        assert pattern is not None  # only shapes with a pattern are run
        match, max_chars = pattern.match, self.limits.max_rule_chars
        cg, ag = shape.cond_groups, shape.act_groups
        groups, leaves = self.numbers.get(shape) or self.numbers.setdefault(shape, ({}, {}))
        group_of, leaf_of, offset = rules.group_of.append, rules.leaf_of.append, self.offsets.append
        index = self.index
        while True:
            m = match(text, pos)
            if m is None:
                self.index = index
                return pos
            end = m.end()
            if end - pos > max_chars:
                raise _Anomaly
            ck = m.group(*cg) if cg else None
            ak = m.group(*ag) if ag else None
            g = groups.get(ck)
            leaf = leaves.get(ak)
            if g is None or leaf is None:
                numbered = self._number(shape, m, ck, ak)
                if numbered is None:
                    self.index = index + 1
                    return end
                g, leaf = numbered
            group_of(g)
            leaf_of(leaf)
            offset(pos)
            index += 1
            pos = end

    def _deferred_spans(self, shape: Shape, pos: int, rules: RuleStore) -> int:
        """:meth:`_deferred` with ``shape``'s span pattern: a piece's condition span and action
        span (one string each, which determine its literal texts) are the keys of its group and
        leaf numbers; a piece with a new key is matched again with the shape's pattern for
        :meth:`_number`.  (One string per key instead of a tuple of them: a million rules parse
        ~30% faster.)"""
        text = self.source.text
        spans, pattern = shape.span_pattern, shape.pattern
        assert spans is not None and pattern is not None  # only shapes with a pattern are run
        match, max_chars = spans.match, self.limits.max_rule_chars
        groups, leaves = self.numbers.get(shape) or self.numbers.setdefault(shape, ({}, {}))
        group_get, leaf_get = groups.get, leaves.get
        group_of, leaf_of, offset = rules.group_of.append, rules.leaf_of.append, self.offsets.append
        # a piece whose action span is known has atoms resolved without error (Shape.resolve's
        # cache): a new condition span is resolved here alone, as Shape.resolve would
        cg, resolver = shape.cond_groups, shape.resolver
        conditions = shape.conditions if self.cache is not None else None
        assert shape.template is not None  # a template shape
        cond = shape.template.cond
        cores, shapes, group_leaves = rules.cores, rules.shapes, rules.leaves
        index = self.index
        while True:
            m = match(text, pos)
            if m is None:
                self.index = index
                return pos
            end = m.end()
            if end - pos > max_chars:
                raise _Anomaly
            ck, ak = m.groups()
            g = group_get(ck)
            leaf = leaf_get(ak)
            if g is None or leaf is None:
                literals = pattern.match(text, pos)
                assert literals is not None  # the same expression, other groups
                if leaf is not None and cg:  # a new condition only (most new keys): its core
                    try:
                        if conditions is None:  # (a shape of this parse: its new span is new to it)
                            core = cond(literals, None, resolver)
                        else:
                            rk = literals.group(*cg)
                            core = conditions.get(rk)
                            if core is None:
                                core = conditions[rk] = cond(literals, None, resolver)
                    except SubcError as e:
                        self.error = e
                        self.index = index + 1
                        return end
                    g = groups[ck] = len(cores)  # rules.new_group(core, shape), inlined
                    cores.append(core)
                    shapes.append(shape)
                    group_leaves.append([])
                else:
                    numbered = self._number(shape, literals, ck, ak)
                    if numbered is None:
                        self.index = index + 1
                        return end
                    g, leaf = numbered
            group_of(g)
            leaf_of(leaf)
            offset(pos)
            index += 1
            pos = end

    def _number(self, shape: Shape, m: re.Match, ck, ak) -> tuple[int, int] | None:
        """(group, leaf) numbers in :attr:`store` of the piece matched by ``m`` (``shape``'s
        pattern) of template ``shape``, whose keys in :attr:`numbers` are ``ck`` (condition) and
        ``ak`` (actions), new ones for keys this parse has not seen; None after a semantic error
        (kept in :attr:`error`)."""
        groups, leaves = self.numbers[shape]
        cg, ag = shape.cond_groups, shape.act_groups
        try:
            cond, atoms = shape.resolve(m, m.group(*cg) if cg else None, m.group(*ag) if ag else None)
        except SubcError as e:
            self.error = e
            return None
        g = groups.get(ck)
        if g is None:
            g = groups[ck] = self.store.new_group(cond, shape)
        leaf = leaves.get(ak)
        if leaf is None:
            leaf = leaves[ak] = self.store.leaf(atoms)
        return g, leaf

    def _piece(self, pos: int, rules: RuleStore) -> int:
        """Handle the piece at ``pos`` that no recent pattern matched; returns the offset after it
        (after the pieces that follow it with the same pattern, for a known shape)."""
        text = self.source.text
        limits = self.limits
        end = None
        for m in _ENDS.finditer(text, pos):
            if m.group() == ";":
                end = m.end()
                break
        if end is None:  # the text after the last rule: comments and white space only
            if not _COMMENT_OR_SPACE.match(text, pos) or len(text) - pos > limits.max_rule_chars:
                raise _Anomaly
            return len(text)
        if end - pos > limits.max_rule_chars or self.index >= self.first_index + limits.max_rules:
            raise _Anomaly
        piece = text[pos:end]
        parts = _SPLIT.split(piece)
        key = ("\x00".join(parts[0::2]), tuple(map(_kind, parts[1::2])))
        shape = self.shapes.get(key)
        if shape is None and self.cache is not None:
            shape = self.cache.get(key, self.source, self.resolver)
            if shape is not None:
                self.shapes[key] = shape
                shape.offsets, shape.first_index = self.offsets, self.first_index
        first = shape is None
        if shape is None:
            tree = self._lark(piece)
            shape = self.shapes[key] = Shape(self.source, self.resolver)
            shape.offsets, shape.first_index = self.offsets, self.first_index
            if self._safe(tree, parts):
                shape.pattern = re.compile(
                    "".join(re.escape(p) if i % 2 == 0 else _GROUP[_kind(p)] for i, p in enumerate(parts))
                )
        elif shape.pattern is not None:
            self._recent(shape)
            after = self._run(shape, pos, rules)
            if after == pos:  # pragma: no cover - the key says it matches
                raise _Anomaly
            return after
        else:
            tree = self._lark(piece)
        # the first piece of a shape, or a piece of a shape that has no pattern: the resolver
        if self.error is None:
            try:
                rules.add_rule(self.resolver.at(pos).rule(tree.children[0], self.index))
            except SubcError as e:
                self.error = e
            else:
                if first and shape.pattern is not None:
                    self._template(shape, tree, parts, pos)
                    if self.cache is not None:
                        self.cache.put(key, shape)
        self.offsets.append(pos)
        self.index += 1
        if shape.pattern is not None:
            self._recent(shape)
        return end

    def _recent(self, shape: Shape) -> None:
        if not self.recent or self.recent[0] is not shape:
            if shape in self.recent:
                self.recent.remove(shape)
            self.recent.insert(0, shape)
            del self.recent[_RECENT:]

    def _lark(self, piece: str) -> Tree:
        """Lark's tree of one piece; _Anomaly on a syntax error or a condition nested too deep."""
        try:
            tree = rule_parser().parse(piece)
        except UnexpectedInput:
            raise _Anomaly from None
        if len(tree.children) != 1:
            raise _Anomaly  # pragma: no cover - a piece ends at its first ';'
        if condition_depth(as_tree(tree.children[0]).children[0])[0] > self.limits.max_nesting:
            raise _Anomaly
        return tree

    def _safe(self, tree: Tree, parts: list[str]) -> bool:
        """True when every Lark literal token of the piece is one of the splitter's literals (which
        may also find some in comments), with no IPv4/IPv6/MAC literal, no prefix, no aggregate
        and no named counter (compared or updated)."""
        counters = self.spec.counters
        for t in tree.iter_subtrees():
            if t.data in ("prefix", "aggregate", "counter_assign"):
                return False  # prefixes, and comparisons on state (resolved piece by piece)
            if (
                counters
                and t.data in ("field", "action")
                and any(str(c) in counters for c in t.children[1 if t.data == "action" else 0 :])
            ):
                return False
        bounds = list(accumulate(map(len, parts)))
        lit_at = {bounds[i - 1]: parts[i] for i in range(1, len(parts), 2)}
        for tok in tree_tokens(tree):
            if tok.type in ("IPV4", "IPV6", "MAC"):
                return False
            if tok.type in _LITERAL_TYPES and lit_at.get(token_start(tok)) != str(tok):
                return False
        return True

    # -- templates -------------------------------------------------------------------------
    def _template(self, shape: Shape, tree: Tree, parts: list[str], rep: int) -> None:
        """Make ``shape`` a template shape from Lark's ``tree`` of its first piece (at offset ``rep``,
        split into ``parts``, resolved without error): the literal groups of its condition and
        actions, and closures that build its rules from a pattern match
        (:func:`~.shape_templates.build_template`)."""
        shape.template, shape.cond_groups, shape.act_groups = build_template(
            tree, parts, self.resolver.at(rep), self.operands, self.action_values
        )
        shape.span_pattern = span_pattern(parts, shape.cond_groups, shape.act_groups)
