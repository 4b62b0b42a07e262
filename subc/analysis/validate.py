"""``subc validate``: parse and check very large rule sets in parallel (a Spark job).

The driver cuts each rule file into pieces of about ``piece_chars`` characters at line starts where
the previous line ends a rule (``;`` outside strings and comments, :func:`pieces`).  A Spark task
parses a piece with the rule front end (:func:`subc.lang.rules.parse_rules`, with the piece's
line offset, so errors give file lines).  When a piece fails, its rules are parsed one by one so
that every bad rule is reported, not only the first.  Each rule contributes statistics: the fields
it tests, its predicate count, and a digest of its canonical form (fields, operators and values;
``and``/``or`` operands in sorted order; the action set), from which Spark finds duplicate rules.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..lang.ast import And, Not, Pred, Rule, StatePred, predicates
from ..compiler.gcpause import paused_gc
from ..lang.rule_shapes import rule_ends
from ..spec.model import Spec
from ..errors import SubcError

DEFAULT_PIECE_CHARS = 1 << 20
_AFTER_RULE = re.compile(r"[ \t]*(?:(?:#|//)[^\n]*)?\n")


@dataclass(frozen=True)
class Piece:
    """Rule text ``text`` of file ``path`` starting at the beginning of line ``line_offset`` + 1."""

    path: str
    line_offset: int
    text: str


def pieces(path: str, text: str, piece_chars: int = DEFAULT_PIECE_CHARS) -> list[Piece]:
    """Cut ``text`` (the contents of ``path``) into pieces at line starts after a rule end."""
    out: list[Piece] = []
    start, line = 0, 0
    target = piece_chars
    for end in rule_ends(text):
        if end < target:
            continue
        m = _AFTER_RULE.match(text, end)
        if not m:
            continue
        cut = m.end()
        out.append(Piece(path, line, text[start:cut]))
        line += text.count("\n", start, cut)
        start = cut
        target = cut + piece_chars
    if start < len(text) or not out:
        out.append(Piece(path, line, text[start:]))
    return out


def statements(piece: Piece) -> list[Piece]:
    """The rules of ``piece`` one by one (each with its line offset), split at rule ends."""
    out = []
    start, line = 0, piece.line_offset
    text = piece.text
    for end in rule_ends(text) + [len(text)]:
        chunk = text[start:end]
        # pad to the column the rule's text starts at, so that columns stay right
        pad = start - (text.rfind("\n", 0, start) + 1)
        if chunk.strip():
            out.append(Piece(piece.path, line, " " * pad + chunk))
        line += text.count("\n", start, end)
        start = end
    return out


def canonical(e) -> tuple:
    """A hashable form of a condition, independent of locations and of and/or operand order."""
    if isinstance(e, (Pred, StatePred)):
        # a comparison on state (an aggregate or a named counter) is keyed by its aggregate
        subject = e.field if isinstance(e, Pred) else ("state", e.agg.kind, e.agg.field, e.agg.window_ns, e.agg.name)
        ops = sorted((o.value, o.prefix_len if o.prefix_len is not None else -1) for o in e.operands)
        if e.op in ("in", "not in", "==", "!="):
            return ("p", subject, e.op in ("in", "=="), tuple(ops))
        return ("p", subject, e.op, tuple(ops))
    if isinstance(e, Not):
        return ("not", canonical(e.item))
    # sorted by text: the operands' forms differ (an operator or a flag; a field or an aggregate)
    return ("and" if isinstance(e, And) else "or", tuple(sorted((canonical(i) for i in e.items), key=repr)))


def rule_digest(r: Rule) -> str:
    """A 128-bit hex digest of the rule's canonical condition and its action atoms (BLAKE2b)."""
    key = repr((canonical(r.condition), sorted(r.atoms(), key=repr)))
    return hashlib.blake2b(key.encode(), digest_size=16).hexdigest()


@dataclass
class PieceReport:
    """What a task returns for one piece: rendered ``errors`` (with line), per rule (digest, line),
    rules per field and a histogram of predicates per rule."""

    errors: list[tuple[str, int, str]] = field(default_factory=list)
    digests: list[tuple[str, str, int]] = field(default_factory=list)
    fields: Counter = field(default_factory=Counter)
    predicates: Counter = field(default_factory=Counter)
    rules: int = 0


def check_piece(piece: Piece, spec: Spec) -> PieceReport:
    """Parse ``piece`` (rule by rule when it fails as a whole) and gather its report."""
    from ..lang.rules import parse_rules

    rep = PieceReport()
    with paused_gc():
        try:
            rules = parse_rules(piece.text, spec, piece.path, piece.line_offset)
        except SubcError:
            rules = []
            for st in statements(piece):
                try:
                    rules.extend(parse_rules(st.text, spec, st.path, st.line_offset))
                except SubcError as e:
                    line = e.location.line if e.location else 0
                    rep.errors.append((piece.path, line, e.render()))
    for r in rules:
        rep.rules += 1
        rep.digests.append((rule_digest(r), piece.path, r.location.line))
        preds = list(predicates(r.condition))
        rep.predicates[len(preds)] += 1
        rep.fields.update({p.field for p in preds})
    return rep


def validate(
    paths: list[str], spec: Spec, master: str | None = None, piece_chars: int = DEFAULT_PIECE_CHARS, spark=None
) -> dict:
    """Check every rule of ``paths`` (see the module docstring) and return the report.

    Keys: ``files``, ``rules`` (parsed without error), ``errors`` (count) and ``error_messages``
    (every error rendered as ``file:line:col: error: ...`` with the line and a caret, in file and
    line order), ``rules_per_field``, ``predicates_per_rule`` (histogram), ``duplicates`` (rules
    whose canonical form repeats an earlier rule: count) and ``duplicate_groups`` (up to 100 groups
    of ``file:line`` locations), ``pieces``.  Raises :class:`SubcError` for an unreadable file."""
    from pyspark.sql import Row

    from .session import get_session

    items: list[Piece] = []
    for p in paths:
        try:
            text = Path(p).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise SubcError(f"cannot read rules {p}: {e}") from e
        items.extend(pieces(p, text, piece_chars))
    if spark is None:
        spark = get_session(master, "subc validate")
    sc = spark.sparkContext
    bspec = sc.broadcast(spec)
    reports = sc.parallelize(items, max(1, len(items))).map(lambda pc: check_piece(pc, bspec.value))
    reports = reports.cache()
    try:
        summary = reports.map(lambda r: (r.rules, r.errors, r.fields, r.predicates)).collect()
        digests = spark.createDataFrame(
            reports.flatMap(lambda r: [Row(digest=d, file=f, line=ln) for d, f, ln in r.digests]),
            "digest string, file string, line int",
        )
        from pyspark.sql import functions as F

        dup = (
            digests.groupBy("digest")
            .agg(F.count(F.lit(1)).alias("n"), F.sort_array(F.collect_list(F.struct("file", "line"))).alias("at"))
            .where("n > 1")
            .orderBy(F.desc("n"), "digest")
            .collect()
        )
    finally:
        reports.unpersist()
        bspec.unpersist()
    rules = sum(s[0] for s in summary)
    errors = sorted((e for s in summary for e in s[1]), key=lambda e: (paths.index(e[0]), e[1]))
    fields: Counter = Counter()
    preds: Counter = Counter()
    for s in summary:
        fields.update(s[2])
        preds.update(s[3])
    return {
        "files": paths,
        "pieces": len(items),
        "rules": rules,
        "errors": len(errors),
        "error_messages": [e[2] for e in errors],
        "rules_per_field": dict(sorted(fields.items())),
        "predicates_per_rule": {str(k): v for k, v in sorted(preds.items())},
        "duplicates": sum(row["n"] - 1 for row in dup),
        "duplicate_groups": [[f"{a['file']}:{a['line']}" for a in row["at"]] for row in dup[:100]],
    }
