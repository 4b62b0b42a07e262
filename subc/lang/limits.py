"""Input limits: hostile or runaway input gets a clear error instead of exhausting the machine.

The limits (all configurable through :class:`Limits`; ``subc compile`` and ``subc check`` take
``--max-rules`` and ``--max-states``):

* **rule length** (characters from the end of the previous rule to this rule's ``;``),
* **nesting depth** of a condition (parentheses and ``not``/``!``, each level counts one),
* **rules per file**,
* **states** of all stages while slicing (before minimisation) and the items they hold in all:
  rule sets whose diagram grows exponentially (e.g. many single-predicate subscriptions over many
  attributes, each packet's port set depending on every attribute) stop with an error instead of
  using all memory.

The field width limit (128 bits) is the spec parser's (:mod:`subc.spec.front_end`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import Location, SubcError

_NESTERS = ("(", "not", "!")
_LEAD = re.compile(r"(?:\s|(?:#|//)[^\n]*)*")


class LimitError(SubcError):
    """Input over one of the :class:`Limits` (``subc check`` reports it as a 'limit' finding)."""


@dataclass(frozen=True)
class Limits:
    """Limits on rule input and compilation (see the module docstring)."""

    max_rule_chars: int = 65_536
    max_nesting: int = 64
    max_rules: int = 2_000_000
    max_states: int = 200_000
    max_layer_items: int = 50_000_000


DEFAULT_LIMITS = Limits()


def _rule_start(text: str, start: int) -> int:
    """The offset of the first character of the rule whose piece starts at ``start`` (comments and
    white space skipped)."""
    m = _LEAD.match(text, start)
    assert m is not None  # _LEAD matches the empty string
    return m.end()


def _loc(path: str, text: str, offset: int, line_offset: int) -> Location:
    loc = Location.from_offset(path, text, offset)
    return Location(loc.path, loc.line + line_offset, loc.column, loc.source_line)


def check_rule_text(
    text: str, path: str, ends: list[int], line_offset: int = 0, limits: Limits = DEFAULT_LIMITS
) -> None:
    """Check the rule count, each rule's length and nesting depth before parsing.

    ``ends`` are the offsets just after each rule's ``;`` (:func:`~.rule_shapes.rule_ends`); the
    text after the last one, if any, is checked as one more rule.
    Raises :class:`LimitError` at the first rule over a limit (at its first character; for nesting,
    at the start of the first sub-condition one level too deep).
    """
    if len(ends) > limits.max_rules:
        start = _rule_start(text, ends[limits.max_rules - 1])
        raise LimitError(
            f"more than {limits.max_rules:,} rules in one file (the limit; raise it with --max-rules)",
            _loc(path, text, start, line_offset),
        )
    start = 0
    for end in ends + ([len(text)] if not ends or ends[-1] < len(text) else []):
        n = end - start
        if n > limits.max_rule_chars:
            raise LimitError(
                f"rule is {n:,} characters long, more than the limit of {limits.max_rule_chars:,}",
                _loc(path, text, _rule_start(text, start), line_offset),
            )
        if n > limits.max_nesting:
            piece = text[start:end]
            # nesting needs parentheses or 'not': without them, precedence allows 3 levels
            if sum(piece.count(s) for s in _NESTERS) + 3 > limits.max_nesting:
                _check_nesting(text, start, end, path, line_offset, limits)
        start = end


def _check_nesting(text: str, start: int, end: int, path: str, line_offset: int, limits: Limits) -> None:
    # the grammar (Lark) only when a rule nests deep enough to need it: every command's start-up
    # imports this module's Limits
    from lark.exceptions import UnexpectedInput

    from .grammar_parser import as_tree, condition_depth, rule_parser

    try:
        tree = rule_parser().parse(text[start:end])
    except UnexpectedInput:
        return  # the parser reports the syntax error
    for rule in tree.children:
        depth, node = condition_depth(as_tree(rule).children[0], limits.max_nesting + 1)
        if depth > limits.max_nesting:
            assert node is not None  # depth > max_nesting >= 0: a node at the mark (max_nesting + 1) was found
            pos = start + (node.meta.start_pos if not node.meta.empty else 0)
            raise LimitError(
                f"condition nested {depth} levels deep (and/or/not), more than the limit of {limits.max_nesting}",
                _loc(path, text, pos, line_offset),
            )
