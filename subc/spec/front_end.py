"""Message-format specs: P4_16 headers and parser annotated with ``@pragma query_*`` (Camus format).

A spec declares the packet format (``header`` types, a ``struct`` of header instances,
constants, typedefs and a ``parser``) and names the fields that rules may use:

=====================================================  ===========================================
``@pragma query_field(h.f[, width])``                   range matching (all comparisons)
``@pragma query_field_exact(h.f[, width])``             exact matching (``==``, ``!=``, ``in``)
``@pragma query_field_lpm(h.f[, width])``               prefix matching (``==``, ``!=``, ``in``, ``/len``)
``@pragma query_default_action(name)``                  action of packets that match no rule (drop)
``@pragma query_field_scale(h.f, digits)``              subc: fixed-point field, ``digits`` implied decimals
``@pragma query_field_alpha(h.f)``                      subc: ASCII text field (ITCH Alpha); strings only
``@pragma query_payload(h)``                            subc: a message with header ``h`` has a payload
``@pragma query_topic(h.n, h.l0, h.l1, ...)``           subc: topic levels (count, then one label field each)
``@pragma query_field_counter(h.f[, window_us])``       Camus: ``h.f`` may be aggregated (a range query field),
                                                        over tumbling windows of ``window_us`` us
``@pragma query_window(window_us)``                     subc: the aggregates' default window (0: never ends)
``@pragma query_time(h.f[, unit])``                     subc: a message's time is field ``h.f`` in ``unit``
                                                        (ns, us, ms, s) instead of its arrival time
=====================================================  ===========================================

``query_payload``: a message whose parse extracts instance ``h`` may be longer than its headers
(the rest is its payload, delivered with it, never parsed); any other message's length must equal
its headers'.  ``query_topic`` names the fields ``subc serve`` labels hierarchical topics with
(``REGISTER``/``SUB``, MQTT-style): ``h.n`` holds the number of levels of a message's topic and
``h.l0``... the numeric label of each level (the deepest topic has one level per label field); all
are query fields, the labels exact or range fields.

``h`` is the header *instance* (a member of the headers struct), as in Camus.  Top-level
``action`` declarations become actions that rules may call; their bodies are copied into
the generated ingress control.  Controls, externs and the package instantiation are ignored.
A spec with only pragma lines (each with a width) is accepted: then only a control block and
entries can be generated.  Sources: Camus (Jepsen et al., HotNets 2018) spec files; P4_16
Language Specification v1.2.4 (sections 7 headers/structs, 8 expressions, 12 parsers).

The spec goes through the C preprocessor first (:mod:`.preprocessor`: ``#include``, macros,
conditionals, ``-I``/``-D``), and every constant P4 allows (widths, ``const`` initialisers,
keysets, P4_14 widths and case values, pragma arguments) is a constant expression
(:mod:`.const_expr`).  Errors are located in the file and at the line and column where the text
was written (:mod:`.source_map`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from ..errors import Location, SubcError
from .const_expr import ConstExpr, ConstExprError, Value, evaluate_text
from .p4_14 import P414Declarations
from .pragmas import PragmaRules
from .p4lexer import Token
from .preprocessor import preprocess
from .source_map import SpecSource
from .token_cursor import TokenCursor
from .model import (
    MAX_TYPE_WIDTH,
    HeaderType,
    ParserDecl,
    ParserState,
    Spec,
    SpecAction,
    Transition,
)


class _SpecParser(TokenCursor, P414Declarations, PragmaRules):
    def __init__(self, source: SpecSource):
        super().__init__(source)
        self.spec = Spec(source.path, source.main_text, source=source)
        # P4_14: header instances (type, instance), stacks, parser functions; first P4_16 keyword
        self.p414_instances: list[tuple[str, str]] = []
        self.p414_stacks: set[str] = set()
        self.p414_states: list[ParserState] = []
        self.p416_seen: str | None = None

    # -- types and values ------------------------------------------------------------------
    def parse_type(self) -> tuple[int | None, str]:
        """A type: returns (width in bits or None, type name as written).

        Raises SubcError (at the width) for a width over :data:`MAX_TYPE_WIDTH`."""
        tok = self.expect("id")
        if tok.text in ("bit", "int", "varbit"):
            self.expect("<")
            wtok = self.peek()
            width = self.expression(self.constants()).value
            if width > MAX_TYPE_WIDTH:
                raise self.error(f"type width exceeds the limit of {MAX_TYPE_WIDTH} bits", wtok)
            if width < 0:
                raise self.error(f"negative type width {width}", wtok)
            self.expect(">")
            return (None if tok.text == "varbit" else width), f"{tok.text}<{width}>"
        if tok.text == "bool":
            return 1, "bool"
        if tok.text in self.spec.typedefs:
            return self.spec.typedefs[tok.text], tok.text
        return None, tok.text

    def constants(self) -> ConstExpr:
        """A reader of constant expressions over the tokens, with the constants and typedefs
        declared so far."""
        return ConstExpr(self.toks, self.spec.consts, self.spec.const_types, self.spec.typedefs)

    def const_value(self) -> int:
        """Consume the constant expression at the current token; its value (SubcError at the
        token at fault when it is not a constant)."""
        return self.expression(self.constants()).value

    # -- declarations ----------------------------------------------------------------------
    def parse(self) -> Spec:
        for name, body in self.source.macros.items():  # #define NAME VALUE: a constant too (P4_14)
            try:
                self.spec.consts.setdefault(name, evaluate_text(body, self.spec.consts))
            except ConstExprError:
                pass
        while self.peek() is not None:
            self.skip_annotations()
            tok = self.peek()
            if tok is None:
                break
            kw = tok.text if tok.kind == "id" else ""
            nxt = [self.peek(k) for k in (1, 2)]
            if kw == "header_type":
                self.parse_header_type()
            elif kw in ("header", "metadata") and all(t is not None and t.kind == "id" for t in nxt):
                self.parse_instance()
            elif kw == "parser" and nxt[0] is not None and nxt[1] is not None and nxt[1].kind == "{":
                self.parse_parser_function()
            elif kw == "const":
                self.note_p4_16(kw)
                self.parse_const()
            elif kw in ("typedef", "type"):
                self.note_p4_16(kw)
                self.parse_typedef()
            elif kw == "header":
                self.note_p4_16(kw)
                self.parse_header()
            elif kw == "struct":
                self.note_p4_16(kw)
                self.parse_struct()
            elif kw == "parser" and self._is_parser_definition():
                self.note_p4_16(kw)
                self.parse_parser()
            elif kw == "action" and not self._p4_14_action():
                self.parse_action()
            else:
                self.skip_declaration()
        if self.spec.form == "p4_14":
            self.finish_p4_14()
        elif not self.spec.headers and self.spec.parser is None:
            self.spec.form = "pragmas"
        self.apply_pragmas()
        return self.spec

    def note_p4_16(self, kw: str) -> None:
        """Note a P4_16 declaration; one form per file."""
        if self.spec.form == "p4_14":
            raise self.error(f"P4_16 '{kw}' declaration in a P4_14 spec")
        self.p416_seen = self.p416_seen or kw

    def _p4_14_action(self) -> bool:
        """Whether the ``action`` at the current token is P4_14 (untyped parameters, or a P4_14 spec):
        such actions are the program's own and are skipped."""
        if self.spec.form == "p4_14":
            return True
        j = self.i + 2
        if j >= len(self.toks) or self.toks[j].kind != "(":
            return False
        a = self.toks[j + 1] if j + 1 < len(self.toks) else None
        b = self.toks[j + 2] if j + 2 < len(self.toks) else None
        return (
            a is not None
            and a.kind == "id"
            and a.text not in ("in", "out", "inout")
            and b is not None
            and b.kind in (",", ")")
        )

    def _is_parser_definition(self) -> bool:
        """Whether the ``parser`` at the current token has a body: its parameter list is followed
        by ``{``.  Looks no further than the end of the declaration (a ``;``, ``{`` or ``}``
        outside parentheses), so that many declarations cost linear time."""
        j, depth = self.i + 1, 0
        while j < len(self.toks):
            k = self.toks[j].kind
            if k == "(":
                depth += 1
            elif k == ")":
                depth -= 1
                if depth <= 0:
                    return depth == 0 and j + 1 < len(self.toks) and self.toks[j + 1].kind == "{"
            elif depth == 0 and k in (";", "{", "}"):
                return False
            j += 1
        return False

    def parse_const(self) -> None:
        start = self.next()
        width, tname = self.parse_type()
        name = self.expect("id")
        self.expect("=")
        value = self.initialiser()
        end = self.scan_until(";")
        if value is not None:
            if width is not None:  # the constant has its declared type (a bit<W> wraps modulo 2^W)
                signed = tname.startswith("int<")
                self.spec.const_types[name.text] = (width, signed)
                value = Value(value).typed(width, signed).value
            self.spec.consts[name.text] = value
        self.spec.decls.append(("const", name.text, self.raw(start, end)))

    def initialiser(self) -> int | None:
        """The value of the ``const`` initialiser at the current token when it is a constant
        expression followed by ``;`` (consumed); else None, consuming nothing (a struct or
        boolean initialiser, which the spec's messages do not need)."""
        try:
            v, j = self.constants().read(self.i)
        except ConstExprError:
            return None
        if j < len(self.toks) and self.toks[j].kind == ";":
            self.i = j
            return v.value
        return None

    def parse_typedef(self) -> None:
        start = self.next()
        width, _ = self.parse_type()
        name = self.expect("id")
        end = self.expect(";")
        if width is not None:
            self.spec.typedefs[name.text] = width
        self.spec.decls.append(("typedef", name.text, self.raw(start, end)))

    def parse_members(self) -> list[tuple[int | None, str, str, Token, Token]]:
        """The members of a ``{ ... }`` block: (width or None, type name, member name, first token,
        the ``;``) each."""
        self.expect("{")
        out = []
        while not self.accept("}"):
            self.skip_annotations()
            j = self.i
            width, tname = self.parse_type()
            first = self.toks[j]  # the type's first token, which parse_type consumed
            if self.peek_is("["):  # header stack
                self.skip_balanced("[", "]")
                tname += "[]"
            name = self.expect("id")
            end = self.expect(";")
            out.append((width, tname, name.text, first, end))
        return out

    def parse_header(self) -> None:
        start = self.next()
        name = self.expect("id")
        members = self.parse_members()
        end = self.toks[self.i - 1]
        for width, tname, mname, first, _ in members:
            if width is None and not tname.startswith("varbit"):
                raise self.error(f"unknown type {tname!r} of header field {mname!r}", first)
        self.spec.headers[name.text] = HeaderType(name.text, [(m[2], m[0]) for m in members], self.raw(start, end))
        self.spec.decls.append(("header", name.text, self.raw(start, end)))

    def parse_struct(self) -> None:
        start = self.next()
        name = self.expect("id")
        members = self.parse_members()
        end = self.toks[self.i - 1]
        self.spec.structs[name.text] = [(m[1], m[2], self.raw(m[3], m[4])) for m in members]
        self.spec.decls.append(("struct", name.text, self.raw(start, end)))

    def parse_action(self) -> None:
        start = self.next()
        name = self.expect("id")
        self.expect("(")
        params: list[tuple[str, int]] = []
        while not self.accept(")"):
            self.skip_annotations()
            ptok = self.peek()
            if ptok and ptok.text in ("in", "out", "inout"):
                raise self.error("spec actions take only directionless parameters (set by the control plane)", ptok)
            width, tname = self.parse_type()
            if width is None:
                raise self.error(f"unknown parameter type {tname!r}", ptok)
            pname = self.expect("id")
            params.append((pname.text, width))
            self.accept(",")
        body_end = self.skip_balanced("{", "}")
        if name.text in ("fwd", "drop") or name.text.startswith("subc_"):
            raise self.error(f"action name {name.text!r} is reserved", name)
        self.spec.actions[name.text] = SpecAction(name.text, params, self.raw(start, body_end), self.loc(name.start))

    def parse_parser(self) -> None:
        self.next()
        name = self.expect("id")
        self.expect("(")
        roles: dict[str, tuple[str, str]] = {}
        others: list[tuple[str, str]] = []
        while not self.accept(")"):
            self.skip_annotations()
            direction = ""
            ptok = self.peek()
            if ptok is not None and ptok.text in ("in", "out", "inout"):
                direction = self.next().text
            _, tname = self.parse_type()
            pname = self.expect("id").text
            self.accept(",")
            if tname == "packet_in":
                roles["packet"] = (tname, pname)
            elif direction == "out" and "hdr" not in roles:
                roles["hdr"] = (tname, pname)
            elif tname == "standard_metadata_t":
                roles["std"] = (tname, pname)
            elif direction == "inout" and "meta" not in roles:
                roles["meta"] = (tname, pname)
            else:
                others.append((tname, pname))
        if "packet" not in roles or "hdr" not in roles:
            raise self.error("the parser needs a 'packet_in' parameter and an 'out' headers parameter", name)
        self.expect("{")
        self.hdr_name = roles["hdr"][1]
        states: list[ParserState] = []
        while not self.accept("}"):
            self.skip_annotations()
            tok = self.peek()
            if tok is not None and tok.text == "state":
                states.append(self.parse_state(roles["packet"][1], roles["hdr"][1]))
            else:
                self.skip_declaration()
        if not any(s.name == "start" for s in states):
            raise self.error("the parser has no 'start' state", name)
        self.spec.parser = ParserDecl(
            name=name.text,
            packet=roles["packet"][1],
            hdr=roles["hdr"][1],
            headers_type=roles["hdr"][0],
            meta=roles.get("meta", (None, None))[1],
            meta_type=roles.get("meta", (None, None))[0],
            std_meta=roles.get("std", (None, None))[1],
            states=states,
        )

    def parse_state(self, packet: str, hdr: str) -> ParserState:
        self.expect("id")
        name_tok = self.expect("id")
        name = name_tok.text
        self.expect("{")
        statements: list[str] = []
        extracts: list[str] = []
        transition = None
        while not self.accept("}"):
            tok = self.peek()
            if tok is None:
                raise self.error("unterminated parser state")
            if tok.text == "transition":
                transition = self.parse_transition()
                continue
            first, t = tok, self.scan_until(";")
            stmt = self.raw(first, t)
            m = re.fullmatch(rf"{re.escape(packet)}\s*\.\s*extract\s*\(\s*{re.escape(hdr)}\s*\.\s*(\w+)\s*\)\s*;", stmt)
            if m:
                extracts.append(m.group(1))
            statements.append(stmt)
        if transition is None:
            transition = Transition(None, [("", "reject")], None, self.loc(name_tok.start))
        return ParserState(name, statements, extracts, transition, self.loc(name_tok.start))

    def parse_transition(self) -> Transition:
        kw = self.expect("id")
        loc = self.loc(kw.start)
        if self.accept("id", "select"):
            j = self.i
            rp = self.skip_balanced("(", ")")
            lp = self.toks[j]  # the '(' skip_balanced consumed
            sel = self.clean[lp.start + 1 : rp.end - 1].strip()
            self.expect("{")
            cases, where = [], []
            while not self.accept("}"):
                j = self.i
                t = self.scan_until(":")
                first = self.toks[j]  # the keyset's first token, which scan_until consumed
                keyset = self.clean[first.start : t.start].strip()
                target = self.expect("id").text
                self.expect(";")
                cases.append((keyset, target))
                where.append(self.loc(first.start))
            return Transition(sel, cases, select_fields(sel, self.hdr_name), loc, where)
        target = self.expect("id").text
        self.expect(";")
        return Transition(None, [("", target)], None, loc)


def select_fields(select_text: str, hdr: str) -> list[str] | None:
    """The fields of a P4_16 select expression ``hdr.i.f, hdr.j.g`` as ``['i.f', 'j.g']``, or None
    when an element is not a header field (an expression, a lookahead, metadata)."""
    out = []
    for part in select_text.split(","):
        m = re.fullmatch(rf"\s*{re.escape(hdr)}\s*\.\s*(\w+)\s*\.\s*(\w+)\s*", part)
        if m is None:
            return None
        out.append(f"{m.group(1)}.{m.group(2)}")
    return out


def parse_spec(text: str, path: str = "<spec>", include_dirs: Sequence[str] = (), defines: Sequence[str] = ()) -> Spec:
    """Parse a message-format spec from ``text``, read from ``path`` (its folder is where its
    ``#include`` files are found; the working folder for a name that is no file), after the C
    preprocessor (:func:`~.preprocessor.preprocess`, with the ``-I`` folders ``include_dirs`` and
    the ``-D`` macros ``defines``, ``NAME[=VALUE]``).

    Raises :class:`SubcError` with the location of the first problem, in the file where it is
    written (unknown field or instance, width mismatch, a query field of 0 or more than
    :data:`MAX_FIELD_WIDTH` bits, a type wider than :data:`MAX_TYPE_WIDTH`, a scale outside
    0..18, malformed pragma or declaration, an expression that is not a constant, a preprocessor
    error or refusal).
    """
    spec = _SpecParser(preprocess(path, text, include_dirs, defines)).parse()
    if not spec.query_fields:
        raise SubcError(
            "the spec declares no query fields (@pragma query_field...)", Location(path, 1, 1, text.split("\n")[0])
        )
    return spec


def load_spec(path: str | Path, include_dirs: Sequence[str] = (), defines: Sequence[str] = ()) -> Spec:
    """Read and parse the spec file at ``path`` with the ``-I`` folders ``include_dirs`` and the
    ``-D`` macros ``defines`` (errors as :func:`parse_spec`; unreadable: SubcError; not UTF-8:
    SubcError at the first bad byte)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SubcError(f"cannot read spec {path}: {e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        good = data[: e.start].decode("utf-8")
        loc = Location.from_offset(str(path), data.decode("utf-8", "replace"), len(good))
        raise SubcError(
            f"the spec is not UTF-8 text: byte {data[e.start]:#04x} at byte offset {e.start}", loc
        ) from None
    return parse_spec(text, str(path), include_dirs, defines)
