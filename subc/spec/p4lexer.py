"""A tokenizer for the P4_16 subset that message-format specs use.

Comments are blanked (offsets are kept), ``#define NAME VALUE`` lines are collected, other
preprocessor lines are ignored, and whole-line ``@pragma`` directives (Camus style) are
collected and removed, so that the declarations that remain can be parsed token by token.
Source: P4_16 Language Specification v1.2.4, section 6 (lexical constructs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import Location, SubcError


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


def preprocess(path: str, text: str) -> tuple[str, dict[str, str], list[Pragma]]:
    """Blank comments, collect ``#define`` and whole-line ``@pragma`` directives.

    Returns the cleaned text (same length and line structure as ``text``), the defines
    (name -> replacement text) and the pragmas in source order.
    """
    clean = blank_comments(text)
    lines = clean.split("\n")
    defines: dict[str, str] = {}
    pragmas: list[Pragma] = []
    offset = 0
    out_lines = []
    for line in lines:
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if stripped.startswith("#"):
            m = re.match(r"#\s*define\s+([A-Za-z_]\w*)\s+(.+?)\s*$", stripped)
            if m:
                defines[m.group(1)] = m.group(2)
            out_lines.append(" " * len(line))
        elif stripped.startswith("@pragma"):
            m = _PRAGMA_RE.match(stripped)
            if not m:
                raise SubcError("malformed @pragma line", Location.from_offset(path, text, offset + indent))
            base = offset + indent + (m.start(2) if m.group(2) is not None else 0)
            args, offs = _split_args(m.group(2) or "", base)
            pragmas.append(Pragma(m.group(1), args, offs, offset + indent))
            out_lines.append(" " * len(line))
        else:
            out_lines.append(line)
        offset += len(line) + 1
    return "\n".join(out_lines), defines, pragmas


def tokenize(path: str, text: str, clean: str) -> list[Token]:
    """Tokens of ``clean`` (see :func:`preprocess`); errors point into the original ``text``."""
    toks: list[Token] = []
    pos, n = 0, len(clean)
    while pos < n:
        m = _TOKEN_RE.match(clean, pos)
        if not m:
            raise SubcError(f"unexpected character {clean[pos]!r}", Location.from_offset(path, text, pos))
        kind = m.lastgroup
        assert kind is not None  # every alternative of _TOKEN_RE is a named group
        if kind != "ws":
            tk = m.group()
            toks.append(Token(tk if kind == "punct" else kind, tk, m.start(), m.end()))
        pos = m.end()
    return toks


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
