"""A preprocessed spec and the map from its text back to the files it came from.

The C preprocessor (:mod:`.preprocessor`) turns a spec and the files it includes into one text;
the front end reads that text and reports errors at offsets into it.  :class:`SpecSource` holds
the text and, for every token the preprocessor emitted, where that token came from:

* a token written in a file (outside any macro, or a macro *argument*): its own file, line and
  column, exactly;
* a token of a macro's *body*: the place of the outermost macro invocation it came from (file,
  line, column of the macro's name), with that macro's name (``in expansion of macro 'M'``);
* the chain of ``#include`` directives that led to the token's file (innermost first), which
  error messages print above the headline as compilers do (``In file included from ...``).

``#line N ["file"]`` changes the line (and file) reported for the lines after it, as in C; the
source line shown under an error is the physical line of the file that holds the token.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ..errors import Location


@dataclass(frozen=True)
class Origin:
    """Where one emitted token comes from: ``file`` (a key of :attr:`SpecSource.files`), a
    0-based character offset ``pos`` into that file's text, the ``chain`` of ``#include``
    directives that led there (display path, line; innermost first), ``macro``, the outermost
    macro whose expansion produced the token (None for text written as is), and ``exact``: the
    token's own text stands at ``pos`` (False: ``pos`` is the macro invocation's)."""

    file: str
    pos: int
    chain: tuple[tuple[str, int], ...] = ()
    macro: str | None = None
    exact: bool = True


@dataclass
class SourceFile:
    """A file the preprocessor read: ``display`` (the path as errors print it), its ``text`` as
    the preprocessor lexed it (trailing blanks of each line removed), the start offset of each of
    its lines, and the ``#line`` directives it holds as (physical line of the directive, the line
    number it gives the next line, the file name it gives or None)."""

    display: str
    text: str
    line_starts: list[int] = field(default_factory=list)
    line_directives: list[tuple[int, int, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.line_starts:
            self.line_starts = [0] + [i + 1 for i, c in enumerate(self.text) if c == "\n"]

    def line_col(self, pos: int) -> tuple[int, int]:
        """The physical 1-based (line, column) of character offset ``pos``."""
        i = bisect.bisect_right(self.line_starts, max(0, pos)) - 1
        return i + 1, pos - self.line_starts[i] + 1

    def line_text(self, line: int) -> str:
        """The physical line ``line`` (1-based) without its newline ('' past the end)."""
        if not 0 < line <= len(self.line_starts):
            return ""
        start = self.line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start : end if end >= 0 else len(self.text)]

    def presumed(self, line: int) -> tuple[str, int]:
        """The (file, line) reported for physical ``line``, after the ``#line`` directives above it."""
        best = None
        for rec in self.line_directives:
            if rec[0] < line and (best is None or rec[0] > best[0]):
                best = rec
        if best is None:
            return self.display, line
        return best[2] or self.display, best[1] + (line - best[0] - 1)


@dataclass
class SpecSource:
    """A preprocessed spec: ``path`` (the main file as given), ``text`` (what the front end
    reads), ``files`` (every file read, by key; built-in headers included) and, sorted by start
    offset in ``text``, the emitted tokens' ``starts`` and ``origins``.  ``main_text`` is the main
    file as written (before preprocessing); ``macros`` the object-like macros the spec's files
    define (still defined at the end), name -> replacement text."""

    path: str
    text: str
    main_text: str
    files: dict[str, SourceFile]
    starts: list[int]
    origins: list[Origin]
    macros: dict[str, str] = field(default_factory=dict)

    def origin(self, offset: int) -> Origin | None:
        """The origin of the token at (or before) character ``offset`` of :attr:`text`."""
        if not self.starts:
            return None
        i = bisect.bisect_right(self.starts, max(0, offset)) - 1
        return self.origins[max(0, i)]

    def location(self, offset: int) -> Location:
        """The location in the original files of character ``offset`` of :attr:`text` (see the
        module docstring for what is exact).  The end of the text is the end of the main file."""
        o = self.origin(offset)
        if o is None or offset >= len(self.text):
            return Location.from_offset(self.path, self.main_text, len(self.main_text) if o is not None else 0)
        i = bisect.bisect_right(self.starts, max(0, offset)) - 1
        delta = offset - self.starts[i] if o.exact else 0
        return self.location_of(o, delta)

    def location_of(self, o: Origin, delta: int = 0) -> Location:
        """The :class:`Location` of origin ``o`` (``delta`` characters further on its line)."""
        f = self.files[o.file]
        line, col = f.line_col(o.pos)
        shown_file, shown_line = f.presumed(line)
        text = f.line_text(line)
        return Location(shown_file, shown_line, min(col + delta, len(text) + 1), text, o.chain, o.macro)

    @property
    def included(self) -> list[str]:
        """Display paths of the files read besides the main one (built-in headers included)."""
        return [f.display for k, f in self.files.items() if f.display != self.path]
