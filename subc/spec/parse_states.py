"""The pieces of the parse graph's states (:mod:`.parse_graph`): header field slots, select
keysets and the resolved states.

A select case's keyset (P4_16 Language Specification v1.2.4, section 12: select expressions) is
``value``, ``value &&& mask``, ``lo .. hi``, a tuple of these and ``_``, or ``default``; its values
are constant expressions (:mod:`.const_expr`: literals, the spec's constants, arithmetic,
casts).  :func:`parse_keyset` reads one from its P4 text for a key of given field widths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import Location
from .const_expr import ConstExprError


@dataclass(frozen=True)
class Keyset:
    """One select case's keyset over the key's ``width`` bits: ``value``/``mask`` (a match when
    ``key & mask == value & mask``), or a range ``lo``..``hi`` (``mask`` None), or ``default``."""

    value: int = 0
    mask: int | None = 0
    lo: int = 0
    hi: int = 0
    default: bool = False

    def matches(self, key: int) -> bool:
        """Whether the key value ``key`` matches this keyset."""
        if self.default:
            return True
        if self.mask is None:
            return self.lo <= key <= self.hi
        return key & self.mask == self.value & self.mask


@dataclass(frozen=True)
class FieldSlot:
    """A header field: ``instance``, ``name``, ``bit_offset`` from the start of its header, ``width`` in bits."""

    instance: str
    name: str
    bit_offset: int
    width: int

    @property
    def ref(self) -> str:
        return f"{self.instance}.{self.name}"


@dataclass(frozen=True)
class GraphState:
    """A parser state: extracted instances in order, the select key (fields, concatenated; None for
    a direct transition) and its cases (keyset, target state / ``accept`` / ``reject``) in order."""

    name: str
    extracts: tuple[str, ...]
    key: tuple[FieldSlot, ...] | None
    cases: tuple[tuple[Keyset, str], ...]
    location: Location | None

    @property
    def key_width(self) -> int:
        return sum(f.width for f in self.key or ())


class KeysetError(ValueError):
    """A keyset the parse graph cannot read (the message names it; the caller locates it)."""


def parse_keyset(text: str, widths: list[int], consts: Callable[[str], int]) -> Keyset:
    """The :class:`Keyset` written ``text`` for a select key of fields of ``widths`` bits
    (concatenated); ``consts`` evaluates a constant expression (``Spec.constant``: raises
    ConstExprError).  Raises KeysetError for a tuple of the wrong arity, an element that is not a
    constant, or a range inside a tuple."""
    t = text.strip()
    if t in ("default", "_"):
        return Keyset(default=True)
    if t.startswith("(") and _closing(t) == len(t) - 1:
        parts = _split_top(t[1:-1])
    else:
        parts = [t]
    if len(parts) != len(widths):
        raise KeysetError(f"keyset '{t}' has {len(parts)} element(s) for a key of {len(widths)} field(s)")
    if len(parts) == 1 and ".." in t:
        lo, hi = t.split("..", 1)
        return Keyset(mask=None, lo=_const(lo, consts), hi=_const(hi, consts))
    value = mask = 0
    for part, w in zip(parts, widths):
        full = (1 << w) - 1
        p = part.strip()
        if p in ("_", "default"):
            v, m = 0, 0
        elif "&&&" in p:
            a, b = p.split("&&&", 1)
            v, m = _const(a, consts) & full, _const(b, consts) & full
        elif ".." in p:
            raise KeysetError("a range inside a tuple keyset is not supported")
        else:
            v, m = _const(p, consts) & full, full
        value, mask = (value << w) | v, (mask << w) | m
    return Keyset(value=value, mask=mask)


def _const(text: str, consts: Callable[[str], int]) -> int:
    t = text.strip()
    try:
        return consts(t)
    except ConstExprError as e:
        raise KeysetError(f"keyset '{t}' is not a constant ({e})") from None


def _closing(s: str) -> int:
    """The index of the parenthesis that closes the one ``s`` starts with (-1: none)."""
    depth = 0
    for i, c in enumerate(s):
        depth += (c == "(") - (c == ")")
        if depth == 0:
            return i
    return -1


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
    out.append(cur)
    return out
