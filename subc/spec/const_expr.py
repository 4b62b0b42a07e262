"""Compile-time constant expressions of a spec, evaluated as p4c folds them (P4_16 Language
Specification v1.2.4, section 8: "Expressions").

Macros produce expressions wherever P4 takes a constant: type widths (``bit<(2) * 8>``), ``const``
initialisers, select keysets and masks (``((26400) + (77)): parse_mold;``), P4_14 field widths
and case values, pragma arguments.  :class:`ConstExpr` reads one from tokens and evaluates it:

* operands: integer literals (``26400``, ``0x6720``, ``0b1_0``, ``16w0x800`` a ``bit<16>``,
  ``8s5`` an ``int<8>``), the spec's constants (typed as declared), parentheses, casts
  ``(bit<W>) e``, ``(int<W>) e`` and ``(T) e`` for a typedef ``T``;
* operators, from the loosest: ``|``; ``^``; ``&``; ``<<`` ``>>``; ``+`` ``-`` ``++``
  (concatenation); ``*`` ``/`` ``%``; prefix ``-`` ``+`` ``~`` (section 8's precedence, p4c's
  grammar).

Values are arbitrary-precision integers (``int``, section 8.8) until a fixed-width operand gives
them a type: then they are ``bit<W>`` (unsigned, arithmetic modulo 2^W, section 8.5) or ``int<W>``
(two's complement, wrapping, arithmetic ``>>``, section 8.6); an untyped operand takes the other
operand's type; two typed operands must have the same type (shifts and ``++`` excepted);
``a ++ b`` is ``bit<Wa + Wb>``.  As p4c refuses them: ``~`` of an untyped value, ``/`` and ``%``
of negative values or by zero, negative shift amounts.  Anything else (a comparison, a field, a
function call) is not a constant: :class:`ConstExprError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .p4lexer import Token, parse_p4_int, tokenize_text

#: Binary operators by binding power (higher binds tighter).
_BINARY = {"|": 1, "^": 2, "&": 3, "<<": 4, ">>": 4, "+": 5, "-": 5, "++": 5, "*": 6, "/": 6, "%": 6}
_TYPED_LITERAL = re.compile(r"(\d+)([ws])(.+)\Z")
#: Largest width of a typed value or cast (as :data:`~.model.MAX_TYPE_WIDTH` bounds types), and of
#: an untyped value's bits, so that no expression can build an unbounded number.
MAX_CONST_BITS = 1 << 16


class ConstExprError(ValueError):
    """An expression that is not a compile-time constant; ``tok`` is the token at fault (None:
    the end of the expression)."""

    def __init__(self, message: str, tok: Token | None = None):
        super().__init__(message)
        self.tok = tok


@dataclass(frozen=True)
class Value:
    """A constant: ``value`` (an int; an ``int<W>`` may be negative), ``width`` (None for an
    arbitrary-precision ``int``) and ``signed``."""

    value: int
    width: int | None = None
    signed: bool = False

    def typed(self, width: int | None, signed: bool) -> "Value":
        """This value converted (wrapped) to ``bit<width>``/``int<width>`` (None: unchanged)."""
        if width is None:
            return self
        v = self.value & ((1 << width) - 1)
        if signed and width and v >> (width - 1):
            v -= 1 << width
        return Value(v, width, signed)


class ConstExpr:
    """A reader of constant expressions over ``toks`` with the spec's constants ``consts``
    (name -> value), their declared types ``types`` (name -> (width, signed); absent: ``int``)
    and typedefs ``typedefs`` (name -> width)."""

    def __init__(
        self,
        toks: Sequence[Token],
        consts: Mapping[str, int],
        types: Mapping[str, tuple[int, bool]] | None = None,
        typedefs: Mapping[str, int] | None = None,
    ):
        self.toks, self.consts = toks, consts
        self.types = types or {}
        self.typedefs = typedefs or {}

    def read(self, i: int) -> tuple[Value, int]:
        """The expression starting at token ``i``: (its value, the index of the first token after
        it).  The expression ends at the first token that cannot continue it (``;``, ``:``, ``>``,
        ``,``, ``mask``, ...).  Raises ConstExprError."""
        return self.binary(i, 1)

    def peek(self, i: int) -> Token | None:
        return self.toks[i] if i < len(self.toks) else None

    def binary(self, i: int, level: int) -> tuple[Value, int]:
        left, i = self.unary(i)
        while True:
            op = self.peek(i)
            if op is None or op.kind not in _BINARY or _BINARY[op.kind] < level:
                return left, i
            right, i = self.binary(i + 1, _BINARY[op.kind] + 1)
            left = self.apply(op, left, right)

    def unary(self, i: int) -> tuple[Value, int]:
        tok = self.peek(i)
        if tok is None:
            raise ConstExprError("expected a constant expression, found the end", None)
        if tok.kind in ("-", "+", "~"):
            v, j = self.unary(i + 1)
            if tok.kind == "-":
                return Value(-v.value, v.width, v.signed).typed(v.width, v.signed), j
            if tok.kind == "~":
                if v.width is None:
                    raise ConstExprError("'~' needs a fixed-width operand (cast it: (bit<W>) ...)", tok)
                return Value(~v.value, v.width, v.signed).typed(v.width, v.signed), j
            return v, j
        if tok.kind == "(":
            cast = self.cast_type(i)
            if cast is not None:
                width, signed, j = cast
                v, j = self.unary(j)
                return v.typed(width, signed), j
            v, j = self.binary(i + 1, 1)
            close = self.peek(j)
            if close is None or close.kind != ")":
                raise ConstExprError("expected ')' in a constant expression", close)
            return v, j + 1
        if tok.kind == "int":
            return literal(tok), i + 1
        if tok.kind == "id" and tok.text in self.consts:
            w, s = self.types.get(tok.text, (None, False))
            return Value(self.consts[tok.text]).typed(w, s), i + 1
        raise ConstExprError(f"'{tok.text}' is not a constant", tok)

    def cast_type(self, i: int) -> tuple[int, bool, int] | None:
        """``(bit<W>)``, ``(int<W>)`` or ``(T)`` for a typedef ``T`` at token ``i``: (width, signed,
        index after the ``)``), or None when the parenthesis is not a cast."""
        t = [self.peek(i + k) for k in range(1, 6)]
        if (
            t[0] is not None
            and t[0].kind == "id"
            and t[0].text in ("bit", "int")
            and t[1] is not None
            and t[1].kind == "<"
        ):
            v, j = self.binary(i + 3, 1)
            end, close = self.peek(j), self.peek(j + 1)
            if end is None or end.kind != ">" or close is None or close.kind != ")":
                raise ConstExprError("malformed cast", t[0])
            if not 0 < v.value <= MAX_CONST_BITS:
                raise ConstExprError(f"cast to a width of {v.value} bits", t[0])
            return v.value, t[0].text == "int", j + 2
        if (
            t[0] is not None
            and t[0].kind == "id"
            and t[0].text in self.typedefs
            and t[1] is not None
            and t[1].kind == ")"
        ):
            return self.typedefs[t[0].text], False, i + 3
        return None

    def apply(self, op: Token, a: Value, b: Value) -> Value:
        """``a op b`` (see the module docstring for the typing rules)."""
        k = op.kind
        if k == "++":
            if a.width is None or b.width is None:
                raise ConstExprError("'++' needs fixed-width operands", op)
            return Value(((a.value & ((1 << a.width) - 1)) << b.width) | (b.value & ((1 << b.width) - 1))).typed(
                a.width + b.width, a.signed
            )
        if k in ("<<", ">>"):
            if b.value < 0:
                raise ConstExprError("negative shift amount", op)
            if a.width is None and k == "<<" and a.value.bit_length() + b.value > MAX_CONST_BITS:
                raise ConstExprError(f"shift result wider than {MAX_CONST_BITS} bits", op)
            shift = min(b.value, (a.width or 0) + MAX_CONST_BITS)
            v = a.value << shift if k == "<<" else a.value >> shift
            return Value(v, a.width, a.signed).typed(a.width, a.signed)
        width, signed = a.width, a.signed
        if a.width is None:
            width, signed = b.width, b.signed
        elif b.width is not None and (a.width, a.signed) != (b.width, b.signed):
            raise ConstExprError(
                f"operands of '{k}' have different types ({_type(a)} and {_type(b)}): cast one of them", op
            )
        x, y = a.typed(width, signed).value, b.typed(width, signed).value
        if k in ("/", "%"):
            if y == 0:
                raise ConstExprError("division by zero", op)
            if x < 0 or y < 0:
                raise ConstExprError(f"'{k}' of a negative value", op)
        v = {
            "|": lambda: x | y,
            "^": lambda: x ^ y,
            "&": lambda: x & y,
            "+": lambda: x + y,
            "-": lambda: x - y,
            "*": lambda: x * y,
            "/": lambda: x // y,
            "%": lambda: x % y,
        }[k]()
        if width is None and v.bit_length() > MAX_CONST_BITS:
            raise ConstExprError(f"value wider than {MAX_CONST_BITS} bits", op)
        return Value(v).typed(width, signed)


def _type(v: Value) -> str:
    return "int" if v.width is None else f"{'int' if v.signed else 'bit'}<{v.width}>"


def literal(tok: Token) -> Value:
    """The value of integer literal ``tok`` (``16w0x800``: ``bit<16>``; ``8s5``: ``int<8>``)."""
    t = tok.text.replace("_", "")
    m = _TYPED_LITERAL.match(t)
    v = parse_p4_int(tok.text)
    if v is None:
        raise ConstExprError(f"bad integer literal '{tok.text}'", tok)
    if m:
        width = int(m.group(1))
        if not 0 < width <= MAX_CONST_BITS:
            raise ConstExprError(f"literal width {width} out of range", tok)
        return Value(v).typed(width, m.group(2) == "s")
    return Value(v)


def evaluate_text(
    text: str,
    consts: Mapping[str, int],
    types: Mapping[str, tuple[int, bool]] | None = None,
    typedefs: Mapping[str, int] | None = None,
) -> int:
    """The value of the constant expression ``text`` (the whole of it).  Raises ConstExprError
    (the message names the expression) for anything that is not one."""
    try:
        toks = tokenize_text(text)
    except ValueError:
        raise ConstExprError(f"'{text.strip()}' is not a constant") from None
    v, j = ConstExpr(toks, consts, types, typedefs).read(0)
    if j != len(toks):
        raise ConstExprError(f"'{text.strip()}' is not a constant", toks[j])
    return v.value
