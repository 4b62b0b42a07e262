"""A cursor over a spec's tokens: the token helpers of the front end's parser
(:class:`~.front_end` ``_SpecParser``, with its P4_14 and pragma mixins).

:class:`TokenCursor` preprocesses and tokenizes a spec (:func:`~.p4lexer.preprocess`,
:func:`~.p4lexer.tokenize`), then reads it a token at a time: look ahead, consume, expect a kind
(a located SubcError otherwise), skip annotations, bracketed groups and whole declarations, and
give back the source text between two tokens (comments removed).
"""

from __future__ import annotations

from ..errors import Location, SubcError
from .const_expr import ConstExpr, ConstExprError, Value
from .p4lexer import Token, collect_pragmas, tokenize
from .source_map import SpecSource


class TokenCursor:
    """The tokens of the preprocessed spec ``source`` and the index ``i`` of the current one;
    ``text`` is the preprocessed text, ``clean`` the same with comments blanked and ``pragmas``
    its ``@pragma`` lines, in order.  Raises SubcError (located) for text the lexer cannot read."""

    def __init__(self, source: SpecSource):
        self.source = source
        self.path, self.text = source.path, source.text
        self.clean, self.pragmas = collect_pragmas(self.text, source.location)
        self.toks = tokenize(self.clean, source.location)
        self.i = 0

    def loc(self, offset: int) -> Location:
        """The location in the spec's files of character ``offset`` of the preprocessed text."""
        return self.source.location(offset)

    def expression(self, reader: ConstExpr) -> Value:
        """Consume the constant expression at the current token (read by ``reader``, over
        :attr:`toks`) and return its value; SubcError at the token at fault."""
        try:
            v, self.i = reader.read(self.i)
        except ConstExprError as e:
            raise self.error(str(e), e.tok) from None
        return v

    def error(self, msg: str, tok: Token | None = None) -> SubcError:
        """A SubcError ``msg`` at ``tok`` (default: the current token, or the end of the file)."""
        if tok is None:
            tok = self.toks[self.i] if self.i < len(self.toks) else None
        off = tok.start if tok else len(self.text)
        return SubcError(msg, self.loc(off))

    def peek(self, k: int = 0) -> Token | None:
        """The token ``k`` after the current one (None past the end), not consumed."""
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def peek_is(self, kind: str) -> bool:
        """Whether the current token is of ``kind`` (False at the end of the file)."""
        tok = self.peek()
        return tok is not None and tok.kind == kind

    def next(self) -> Token:
        """Consume and return the current token (SubcError at the end of the file)."""
        tok = self.peek()
        if tok is None:
            raise self.error("unexpected end of file")
        self.i += 1
        return tok

    def expect(self, kind: str) -> Token:
        """Consume and return the current token, which must be of ``kind`` (else SubcError at it)."""
        tok = self.peek()
        if tok is None or tok.kind != kind:
            found = "end of file" if tok is None else repr(tok.text)
            raise self.error(f"expected {kind!r}, found {found}", tok)
        self.i += 1
        return tok

    def accept(self, kind: str, text: str | None = None) -> Token | None:
        """Consume and return the current token if it is of ``kind`` (and is ``text``, if given);
        else None, consuming nothing."""
        tok = self.peek()
        if tok is not None and tok.kind == kind and (text is None or tok.text == text):
            self.i += 1
            return tok
        return None

    def raw(self, a: Token, b: Token) -> str:
        """The cleaned text from the start of token ``a`` to the end of token ``b``."""
        return self.clean[a.start : b.end]

    def skip_annotations(self) -> None:
        """Consume the annotations (``@name`` or ``@name(...)``) at the current token."""
        while self.accept("@"):
            self.expect("id")
            if self.peek_is("("):
                self.skip_balanced("(", ")")

    def skip_balanced(self, open_: str, close: str) -> Token:
        """Consume an ``open_`` ... ``close`` group (nested groups included); return its ``close``
        token.  SubcError when the current token is not ``open_`` or the file ends inside."""
        self.expect(open_)
        depth = 1
        while True:
            tok = self.next()
            if tok.kind == open_:
                depth += 1
            elif tok.kind == close:
                depth -= 1
                if depth == 0:
                    return tok

    def scan_until(self, kind: str) -> Token:
        """Consume tokens up to and including the first ``kind`` outside brackets; return it."""
        depth = 0
        while True:
            t = self.next()
            if t.kind in "({[":
                depth += 1
            elif t.kind in ")}]":
                depth -= 1
            elif t.kind == kind and depth == 0:
                return t

    def skip_declaration(self) -> None:
        """Skip to the end of a top-level declaration: a ``;`` or a balanced ``{...}`` block."""
        depth = 0
        while True:
            tok = self.next()
            if tok.kind in "({[":
                depth += 1
            elif tok.kind in ")}]":
                depth -= 1
                if depth == 0 and tok.kind == "}":
                    if self.peek_is(";"):
                        self.i += 1
                    return
            elif tok.kind == ";" and depth == 0:
                return
