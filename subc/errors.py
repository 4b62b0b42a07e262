"""Errors that subc reports to users.

Every error about user input carries a source location so that it can be shown in the
conventional compiler form::

    rules.sub:3:17: error: unknown field 'add_order.prise'
        add_order.prise > 10 : fwd(1);
                  ^
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    """A position in a source file: 1-based line and column, and the text of that line.

    A location in a spec may also carry ``included_from``, the ``#include`` directives that led
    to its file as (path, line), innermost first, and ``macro``, the macro whose expansion holds
    the position (the location is then that of the macro's invocation)."""

    path: str
    line: int
    column: int
    source_line: str = ""
    included_from: tuple[tuple[str, int], ...] = ()
    macro: str | None = None

    @staticmethod
    def from_offset(path: str, text: str, offset: int) -> "Location":
        """Location of character ``offset`` (0-based) in ``text``."""
        offset = max(0, min(offset, len(text)))
        line = text.count("\n", 0, offset) + 1
        start = text.rfind("\n", 0, offset) + 1
        end = text.find("\n", offset)
        if end < 0:
            end = len(text)
        return Location(path, line, offset - start + 1, text[start:end])

    @staticmethod
    def from_line_col(path: str, text: str, line: int, column: int) -> "Location":
        """Location of 1-based ``line``/``column`` in ``text``."""
        lines = text.split("\n")
        src = lines[line - 1] if 0 < line <= len(lines) else ""
        return Location(path, line, column, src)


class SubcError(Exception):
    """An error in user input or in a requested operation, with an optional location.

    ``str(err)`` is the one-line ``file:line:col: error: message``; :meth:`render` adds the
    offending line and a caret under the column.
    """

    def __init__(self, message: str, location: Location | None = None, notes: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.location = location
        self.notes = list(notes or [])

    def __str__(self) -> str:
        if self.location is None:
            return f"error: {self.message}"
        loc = self.location
        return f"{loc.path}:{loc.line}:{loc.column}: error: {self.message}"

    def render(self) -> str:
        """The full diagnostic: ``In file included from`` lines (when the location is in an
        included file), headline, source line, caret, the macro expansion, and any notes."""
        out = []
        loc = self.location
        if loc is not None and loc.included_from:
            first, *rest = loc.included_from
            out.append(f"In file included from {first[0]}:{first[1]}" + ("," if rest else ":"))
            for k, (path, line) in enumerate(rest):
                out.append(f"                 from {path}:{line}" + ("," if k < len(rest) - 1 else ":"))
        out.append(str(self))
        if loc is not None and loc.source_line:
            src = loc.source_line.expandtabs(1)
            out.append("    " + src)
            out.append("    " + " " * (loc.column - 1) + "^")
        if loc is not None and loc.macro is not None:
            out.append(f"note: in expansion of macro '{loc.macro}'")
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out)
