"""Diagnostics of ``subc check`` and their three output formats (text, JSON, GitHub annotations).

Text is the compiler form (``file:line:col: warning: message``, the offending line, a caret, notes).
JSON (format ``subc-check``, version 1)::

    {"format": "subc-check", "version": 1, "target": "tofino", "files": ["rules.sub"],
     "rules": 3, "summary": {"errors": 1, "warnings": 1},
     "diagnostics": [{"severity": "warning", "code": "redundant", "message": "...",
                      "file": "rules.sub", "line": 3, "column": 1, "source_line": "...",
                      "notes": ["..."], "related": [{"file": "rules.sub", "line": 1, "column": 1}],
                      "example": {"add_order.price": 11}}],
     "target_fit": {...}}

``example`` (a packet, field -> raw value) is set for conflicts; ``related`` lists the other rules
a diagnostic names.  GitHub annotations follow the workflow command syntax
(``::warning file=F,line=L,col=C,title=T::message``, "Workflow commands for GitHub Actions").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import Location, SubcError

#: Diagnostic codes: what a CI job can filter on.
CODES = ("syntax", "limit", "unsatisfiable", "duplicate", "redundant", "conflict", "target-fit")


@dataclass
class Diagnostic:
    """One finding: ``severity`` 'error', 'warning' or 'note' (never changes the exit status),
    ``code`` (one of :data:`CODES`), message,
    location (None for findings about the whole rule set), notes, related rule locations, an
    example packet ({'header.field': value}) and ``example_message``: that packet's message bytes
    as the spec frames them (hex; None when the spec does not describe a MoldUDP64 feed)."""

    severity: str
    code: str
    message: str
    location: Location | None = None
    notes: list[str] = field(default_factory=list)
    related: list[Location] = field(default_factory=list)
    example: dict[str, int] | None = None
    example_message: str | None = None

    @staticmethod
    def from_error(e: SubcError, code: str = "syntax") -> "Diagnostic":
        """An error diagnostic from a :class:`SubcError` (its location and notes)."""
        return Diagnostic("error", code, e.message, e.location, list(e.notes))

    def sort_key(self) -> tuple:
        loc = self.location
        return (loc is None, loc.path if loc else "", loc.line if loc else 0, loc.column if loc else 0, self.code)


def render_text(d: Diagnostic) -> str:
    """The compiler form: headline, source line and caret, notes."""
    loc = d.location
    head = f"{d.severity}: {d.message} [{d.code}]"
    out = [f"{loc.path}:{loc.line}:{loc.column}: {head}" if loc else head]
    if loc is not None and loc.source_line:
        out.append("    " + loc.source_line.expandtabs(1))
        out.append("    " + " " * (loc.column - 1) + "^")
    out.extend(f"note: {n}" for n in d.notes)
    return "\n".join(out)


def _gh_escape(s: str, prop: bool = False) -> str:
    s = s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        s = s.replace(":", "%3A").replace(",", "%2C")
    return s


def render_github(d: Diagnostic) -> str:
    """One GitHub Actions workflow command (``::error`` or ``::warning``) for ``d``."""
    props = []
    if d.location is not None:
        props += [f"file={_gh_escape(d.location.path, True)}", f"line={d.location.line}", f"col={d.location.column}"]
    props.append(f"title={_gh_escape('subc ' + d.code, True)}")
    body = "\n".join([d.message, *d.notes])
    level = "notice" if d.severity == "note" else d.severity
    return f"::{level} {','.join(props)}::{_gh_escape(body)}"


def _loc_json(loc: Location) -> dict:
    return {"file": loc.path, "line": loc.line, "column": loc.column}


def to_json(d: Diagnostic) -> dict:
    """The JSON form of ``d`` (see the module docstring)."""
    out: dict = {"severity": d.severity, "code": d.code, "message": d.message}
    if d.location is not None:
        out.update(_loc_json(d.location))
        out["source_line"] = d.location.source_line
    out["notes"] = list(d.notes)
    out["related"] = [_loc_json(r) for r in d.related]
    if d.example is not None:
        out["example"] = dict(d.example)
    if d.example_message is not None:
        out["example_message"] = d.example_message
    return out
