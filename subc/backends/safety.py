"""The template boundary: only identifiers and numbers reach generated code.

Everything a template or a generated script (P4, C, ``commands.txt``, ``bfrt_setup.py``) receives
from rules or specs is checked here first, whatever the front ends already checked: names must match
a strict identifier pattern (optionally dotted, ``hdr.add_order.price``), values must be integers.
A rule's string literal never reaches a template: it is converted to its raw integer value.  A
name crafted to break out of a declaration (quotes, braces, ``#include``, newlines, comment openers)
is refused with a :class:`~subc.errors.SubcError` instead of being written.
"""

from __future__ import annotations

import re

from ..errors import SubcError

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def identifier(name: object, what: str, dotted: bool = False) -> str:
    """``name`` if it is an identifier (``dotted``: identifiers joined by dots), else SubcError."""
    if not isinstance(name, str) or not (DOTTED if dotted else IDENTIFIER).match(name):
        raise SubcError(f"refusing to generate code: {what} {name!r} is not an identifier")
    return name


def number(value: object, what: str) -> int:
    """``value`` if it is an integer (not a bool), else SubcError."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise SubcError(f"refusing to generate code: {what} {value!r} is not an integer")
    return value


def check_action(action: tuple[str, tuple], what: str) -> None:
    """An action call ``(name, ((param, value), ...))``: identifiers and integers only."""
    name, params = action
    identifier(name, f"{what} action")
    for p, v in params:
        identifier(p, f"{what} action parameter")
        number(v, f"{what} action argument")


def check_pipeline(pipe) -> None:
    """Every name and default action of ``pipe``'s tables (:class:`~subc.backends.p4.tables.Pipeline`),
    its headers, fields and metadata names."""
    identifier(pipe.hdr, "header struct name")
    identifier(pipe.meta, "metadata name")
    for h in pipe.headers:
        identifier(h, "header instance")
    for f in pipe.field_order:
        identifier(f, "field", dotted=True)
    for t in pipe.tables:
        identifier(t.name, "table name")
        for k in t.keys:
            identifier(k.name, "key", dotted=True)
        for a in t.actions:
            identifier(a, "action")
        check_action(t.default_action, f"table {t.name} default")
    check_action(pipe.default_action, "default")


_COMMENT_SAFE = re.compile(r"[^A-Za-z0-9 ._/+@=,:-]")


def comment_text(text: str) -> str:
    """``text`` (a file path) made safe inside a generated ``/* ... */`` comment: every character
    outside letters, digits and `` ._/+@=,:-`` becomes ``?`` (no ``*/``, no newline)."""
    return _COMMENT_SAFE.sub("?", text)
