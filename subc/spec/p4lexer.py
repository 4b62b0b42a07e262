"""A tokenizer for the P4_16 subset that message-format specs use.

It reads the spec as the C preprocessor (:mod:`.preprocessor`) produced it: comments are blanked
(offsets are kept), and whole-line ``@pragma`` directives (Camus style) are collected and
removed, so that the declarations that remain can be parsed token by token.  Errors are located
by the caller's ``locate`` (an offset of the text -> a :class:`~subc.errors.Location`).
Source: P4_16 Language Specification v1.2.4, section 6 (lexical constructs).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import Location, SubcError

#: An offset of the preprocessed text -> its location in the spec's files.
Locate = Callable[[int], Location]


@dataclass(frozen=True)
class Token:
    """One token: ``kind`` is 'id', 'int', 'str' or the punctuation itself; offsets into the text."""

    kind: str
    text: str
    start: int
    end: int


@dataclass(frozen=True)
class Pragma:
    """A ``@pragma name(args)`` directive: args are raw strings split at top-level commas."""

    name: str
    args: tuple[str, ...]
    arg_offsets: tuple[int, ...]
    offset: int


_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<int>\d+[ws]\d[\dA-Fa-fxXoObB_]*|0[xX][0-9A-Fa-f_]+|0[bB][01_]+|0[oO][0-7_]+|\d[\d_]*)
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<punct>&&&|\.\.|==|!=|<=|>=|<<|>>|&&|\|\||\+\+|[{}()\[\]<>;,.:=&|^~!+\-*/%?@#])
    """,
    re.VERBOSE,
)


def blank_comments(text: str) -> str:
    """``text`` with ``//`` and ``/* */`` comments replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


_PRAGMA_RE = re.compile(r"@pragma\s+([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*$")


def _split_args(s: str, base: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    args, offs, depth, start = [], [], 0, 0
    for i, c in enumerate(s + ","):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            raw = s[start:i]
            stripped = raw.strip()
            if stripped:
                args.append(stripped)
                offs.append(base + start + (len(raw) - len(raw.lstrip())))
            start = i + 1
    return tuple(args), tuple(offs)


def collect_pragmas(text: str, locate: Locate) -> tuple[str, list[Pragma]]:
    """Blank comments and collect the whole-line ``@pragma`` directives of ``text`` (a
    preprocessed spec; any line left that starts with ``#`` is blanked too).

    Returns the cleaned text (same length and line structure as ``text``) and the pragmas in
    order; a malformed ``@pragma`` line is a SubcError at ``locate(offset)``.
    """
    clean = blank_comments(text)
    lines = clean.split("\n")
    pragmas: list[Pragma] = []
    offset = 0
    out_lines = []
    for line in lines:
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if stripped.startswith("#"):
            out_lines.append(" " * len(line))
        elif stripped.startswith("@pragma"):
            m = _PRAGMA_RE.match(stripped)
            if not m:
                raise SubcError("malformed @pragma line", locate(offset + indent))
            base = offset + indent + (m.start(2) if m.group(2) is not None else 0)
            args, offs = _split_args(m.group(2) or "", base)
            pragmas.append(Pragma(m.group(1), args, offs, offset + indent))
            out_lines.append(" " * len(line))
        else:
            out_lines.append(line)
        offset += len(line) + 1
    return "\n".join(out_lines), pragmas


def tokenize(clean: str, locate: Locate) -> list[Token]:
    """Tokens of ``clean`` (see :func:`collect_pragmas`); an unexpected character is a SubcError
    at ``locate(offset)``."""
    toks: list[Token] = []
    pos, n = 0, len(clean)
    while pos < n:
        m = _TOKEN_RE.match(clean, pos)
        if not m:
            raise SubcError(f"unexpected character {clean[pos]!r}", locate(pos))
        kind = m.lastgroup
        assert kind is not None  # every alternative of _TOKEN_RE is a named group
        if kind != "ws":
            tk = m.group()
            toks.append(Token(tk if kind == "punct" else kind, tk, m.start(), m.end()))
        pos = m.end()
    return toks


def tokenize_text(text: str) -> list[Token]:
    """Tokens of a short piece of spec text (a keyset, a pragma argument); ValueError for a
    character that starts no token."""
    try:
        return tokenize(text, lambda off: Location("<text>", 1, off + 1, text))
    except SubcError as e:
        raise ValueError(e.message) from None


def parse_p4_int(text: str) -> int | None:
    """Value of a P4_16 integer literal (``16w0x800``, ``0x1F``, ``1_000``), or None."""
    t = text.replace("_", "")
    m = re.fullmatch(r"(\d+)[ws](.+)", t)
    if m:
        t = m.group(2)
    try:
        if t[:2] in ("0x", "0X"):
            return int(t[2:], 16)
        if t[:2] in ("0b", "0B"):
            return int(t[2:], 2)
        if t[:2] in ("0o", "0O"):
            return int(t[2:], 8)
        return int(t, 10)
    except ValueError:
        return None
