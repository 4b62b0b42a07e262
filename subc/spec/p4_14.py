"""The P4_14 forms of a message-format spec (Camus's spec files), read into the P4_16 model.

Camus's specs (Jepsen et al., HotNets 2018, Figure 2, and Camus's public repositories) are
largely P4_14 (P4_14 Language Specification v1.0.5): ``header_type T { fields { f : W; ... } }``,
header instances ``header T inst;`` (``metadata T inst;`` instances are not packet headers and
are ignored), and parser functions::

    parser start { return parse_ethernet; }
    parser parse_ethernet {
        extract(ethernet);
        return select(latest.etherType) { 0x0800 : parse_ipv4; default : ingress; }
    }

This module turns them into the same :class:`~subc.spec.front_end.Spec` model a P4_16 spec gives:
each header type becomes a P4_16 ``header`` declaration, the instances a ``headers`` struct (in
declaration order), and every parser function a parser state whose statements are P4_16
``extract`` calls.  ``latest.f`` is the field of the header extracted last in the function;
``return ingress`` (or a control's name) is ``accept``; a case ``v mask m`` is ``v &&& m``; and a
select over several fields, whose P4_14 case values are the fields' concatenation, is written as a
P4_16 tuple select.  What the decoder cannot follow (``current(...)`` lookahead,
``set_metadata``, header stacks, variable-length fields in a parsed header) is a located error.
Controls, tables, actions (their parameters are untyped), field lists and calculated fields are
skipped: rules that call actions of a P4_14 spec declare them (``Spec.infers_actions``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import Location, SubcError
from .p4lexer import Token
from .model import HeaderType, ParserDecl, ParserState, Spec, Transition

#: P4_14 targets of ``return`` that leave the parser (Camus's specs return to ``ingress``).
P4_14_ACCEPT = ("ingress", "egress")


class P414Declarations:
    """The P4_14 declarations of :class:`subc.spec.front_end._SpecParser` (a mixin: it uses the
    parser's token helpers ``next``, ``expect``, ``accept``, ``peek``, ``peek_is``, ``error``, ``loc``,
    ``const_value`` (a constant expression), ``skip_balanced``, ``scan_until``, its tokens ``toks``
    and ``i``, its ``spec`` and the P4_14 declarations seen so far)."""

    # -- what the host parser provides (declared for the type checker) -----------------------
    spec: Spec
    #: the tokens, and the index of the current one
    toks: list[Token]
    i: int
    #: header instances as (type, instance), in declaration order
    p414_instances: list[tuple[str, str]]
    #: header stack instances (not supported in a parser)
    p414_stacks: set[str]
    #: the parser functions, as parser states
    p414_states: list[ParserState]
    #: the first P4_16 declaration's keyword, or None
    p416_seen: str | None

    if TYPE_CHECKING:

        def loc(self, offset: int) -> Location: ...
        def error(self, msg: str, tok: Token | None = None) -> SubcError: ...
        def peek(self, k: int = 0) -> Token | None: ...
        def peek_is(self, kind: str) -> bool: ...
        def next(self) -> Token: ...
        def expect(self, kind: str) -> Token: ...
        def accept(self, kind: str, text: str | None = None) -> Token | None: ...
        def skip_balanced(self, open_: str, close: str) -> Token: ...
        def scan_until(self, kind: str) -> Token: ...
        def const_value(self) -> int: ...

    # -- header types and instances ---------------------------------------------------------
    def parse_header_type(self) -> None:
        """``header_type T { fields { f : W [(attributes)]; ... } [length : ...; max_length : ...;] }``."""

        self.form_p4_14()
        self.next()
        name = self.expect("id")
        self.expect("{")
        fields: list[tuple[str, int | None]] = []
        while not self.accept("}"):
            tok = self.expect("id")
            if tok.text == "fields":
                self.expect("{")
                while not self.accept("}"):
                    fname = self.expect("id")
                    self.expect(":")
                    wtok = self.peek()
                    if wtok is not None and wtok.kind == "*":
                        self.next()
                        width = None
                    else:
                        width = self.const_value()
                        if width <= 0:
                            raise self.error(
                                f"field '{fname.text}' of header type '{name.text}' has width {width}", wtok
                            )
                    if self.peek_is("("):
                        self.skip_balanced("(", ")")  # (signed, saturating)
                    self.expect(";")
                    fields.append((fname.text, width))
            else:  # length : expr; max_length : n;
                self.scan_until(";")
        self.accept(";")
        text = p4_16_header(name.text, fields)
        self.spec.headers[name.text] = HeaderType(name.text, fields, text)
        self.spec.decls.append(("header", name.text, text))

    def parse_instance(self) -> None:
        """``header T inst;`` (a packet header) or ``metadata T inst [{ ... }];`` (ignored)."""
        self.form_p4_14()
        kw = self.next()
        tname = self.expect("id")
        inst = self.expect("id")
        if self.peek_is("["):
            self.skip_balanced("[", "]")
            if kw.text == "header":
                self.p414_stacks.add(inst.text)
        if self.peek_is("{"):
            self.skip_balanced("{", "}")
        self.expect(";")
        if kw.text != "header" or inst.text in self.p414_stacks:
            return
        if tname.text not in self.spec.headers:
            raise self.error(f"unknown header type '{tname.text}' (declare it with header_type first)", tname)
        self.p414_instances.append((tname.text, inst.text))

    # -- parser functions -------------------------------------------------------------------
    def parse_parser_function(self) -> None:
        """``parser NAME { extract(inst); ...; return STATE; | return select(f, ...) { cases } }``."""

        self.form_p4_14()
        self.next()
        name = self.expect("id")
        self.expect("{")
        statements: list[str] = []
        extracts: list[str] = []
        transition = None
        while not self.accept("}"):
            tok = self.expect("id")
            if tok.text == "extract":
                self.expect("(")
                inst = self.expect("id")
                if self.peek_is("[") or inst.text in self.p414_stacks:
                    raise self.error(f"header stack '{inst.text}': header stacks are not supported", inst)
                self.expect(")")
                self.expect(";")
                extracts.append(inst.text)
                statements.append(f"packet.extract(hdr.{inst.text});")
            elif tok.text == "return":
                transition = self.p414_return(name.text, extracts, tok)
                self.accept(";")
            elif tok.text == "set_metadata":
                raise self.error(
                    "set_metadata in a parser is not supported (the decoder follows extract and select only)", tok
                )
            else:
                raise self.error(
                    f"unexpected '{tok.text}' in parser function '{name.text}' (expected extract(...) or return)", tok
                )
        if transition is None:
            raise self.error(f"parser function '{name.text}' has no return statement", name)
        self.p414_states.append(ParserState(name.text, statements, extracts, transition, self.loc(name.start)))

    def p414_return(self, state: str, extracts: list[str], tok: Token) -> Transition:
        """The transition of a ``return`` statement (after the ``return`` keyword)."""

        loc = self.loc(tok.start)
        if not self.accept("id", "select"):
            target = self.expect("id").text
            return Transition(None, [("", target)], None, loc)
        self.expect("(")
        fields: list[str] = []
        while not self.accept(")"):
            ref = self.expect("id")
            if ref.text == "current":
                raise self.error("current(...) lookahead in a select is not supported", ref)
            self.expect(".")
            fname = self.expect("id")
            inst = ref.text
            if inst == "latest":
                if not extracts:
                    raise self.error(f"'latest' in parser function '{state}', which extracts no header", ref)
                inst = extracts[-1]
            fields.append(f"{inst}.{fname.text}")
            self.accept(",")
        if not fields:
            raise self.error("select of no field", tok)
        self.expect("{")
        cases: list[tuple[str, str]] = []
        where: list[Location] = []
        while not self.accept("}"):
            j = self.i
            values: list[tuple[int, int | None]] = []
            default = False
            while True:
                if self.accept("id", "default"):
                    default = True
                else:
                    v = self.const_value()
                    mask = None
                    if self.accept("id", "mask"):
                        mask = self.const_value()
                    values.append((v, mask))
                if not self.accept(","):
                    break
            first = self.toks[j]  # the case's first token (consumed by the loop)
            self.expect(":")
            target = self.expect("id").text
            self.expect(";")
            if default:
                cases.append(("default", target))
                where.append(self.loc(first.start))
            else:
                for v, mask in values:  # a case of several values is one case per value
                    cases.append((self.p414_keyset(fields, v, mask, first), target))
                    where.append(self.loc(first.start))
        hdr = "hdr"
        sel = ", ".join(f"{hdr}.{f}" for f in fields)
        return Transition(sel, cases, fields, loc, where)

    def p414_keyset(self, fields: list[str], value: int, mask: int | None, tok: Token) -> str:
        """The P4_16 keyset text of a P4_14 case ``value [mask m]`` over the concatenation of ``fields``."""
        widths = [self.p414_field_width(f, tok) for f in fields]
        total = sum(widths)
        full = (1 << total) - 1
        if mask is None:
            mask = full
        if value > full or mask > full:
            raise self.error(f"case value {value:#x} does not fit the {total}-bit select key", tok)
        parts, shift = [], total
        for w in widths:
            shift -= w
            fm = (1 << w) - 1
            v, m = (value >> shift) & fm, (mask >> shift) & fm
            if m == 0:
                parts.append("_")
            elif m == fm:
                parts.append(hex(v))
            else:
                parts.append(f"{hex(v)} &&& {hex(m)}")
        return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"

    def p414_field_width(self, ref: str, tok: Token) -> int:
        inst, fname = ref.split(".", 1)
        tname = dict((i, t) for t, i in self.p414_instances).get(inst)
        if tname is None:
            raise self.error(f"unknown header instance '{inst}' in select", tok)
        h = self.spec.headers[tname]
        if not h.has(fname):
            raise self.error(f"unknown field '{fname}' in header '{inst}' ({tname})", tok)
        w = h.width_of(fname)
        if w is None:
            raise self.error(f"select on variable-length field '{ref}'", tok)
        return w

    # -- the whole spec ---------------------------------------------------------------------
    def form_p4_14(self) -> None:
        """Note that the spec is P4_14 (one form per file)."""
        if self.spec.form == "p4_16" and self.p416_seen is not None:
            raise self.error(f"P4_14 declaration in a P4_16 spec (P4_16 '{self.p416_seen}' seen first)")
        self.spec.form = "p4_14"

    def finish_p4_14(self) -> None:
        """Build the headers struct and the parser of a P4_14 spec (after every declaration)."""

        spec = self.spec
        members = [(t, i, f"{t} {i};") for t, i in self.p414_instances]
        spec.structs["headers"] = members
        spec.decls.append(
            ("struct", "headers", "struct headers {\n" + "".join(f"    {r}\n" for *_, r in members) + "}")
        )
        if not self.p414_states:
            return
        for st in self.p414_states:
            st.transition.cases = [(k, "accept" if t in P4_14_ACCEPT else t) for k, t in st.transition.cases]
        names = {s.name for s in self.p414_states}
        for st in self.p414_states:
            for _, t in st.transition.cases:
                if t not in names and t not in ("accept", "reject"):
                    # a control's name: P4_14 leaves the parser for that control
                    st.transition.cases = [(k, "accept" if x == t else x) for k, x in st.transition.cases]
        if "start" not in names:
            raise SubcError("the P4_14 parser has no 'start' function", self.p414_states[0].location)
        for st in self.p414_states:
            for inst in st.extracts:
                if inst not in dict((i, t) for t, i in self.p414_instances):
                    raise SubcError(
                        f"parser function '{st.name}' extracts '{inst}', which is not a header instance", st.location
                    )
        spec.parser = ParserDecl(
            "SubcSpecParser", "packet", "hdr", "headers", "meta", None, "standard_metadata", self.p414_states
        )


def p4_16_header(name: str, fields: list[tuple[str, int | None]]) -> str:
    """The P4_16 ``header`` declaration of a P4_14 header type (``varbit<2048>`` for ``*`` fields)."""
    body = "".join(f"    {'varbit<2048>' if w is None else f'bit<{w}>'} {f};\n" for f, w in fields)
    return f"header {name} {{\n{body}}}"
