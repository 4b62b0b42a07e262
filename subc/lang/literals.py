"""Conversion of rule literals into raw field values.

* Integers (decimal) on a field with a fixed-point scale of s digits are in units: ``50`` on
  ITCH ``Price(4)`` is the raw value 500000; a decimal ``144.21`` is 1442100 (at most s digits
  after the point).  Hex integers are always raw bits.
* Strings on a field of W bits are ASCII, left-aligned and padded with spaces to W/8 bytes
  (ITCH Alpha, Nasdaq TotalView-ITCH 5.0 section 1.2); longer is an error.
* IPv4 (32 bits), IPv6 (128 bits) and MAC (48 bits) literals need a field of that width.

Errors are :class:`~subc.errors.SubcError` at the literal's location.
"""

from __future__ import annotations

import ipaddress

from ..errors import Location, SubcError
from ..spec.model import QueryField


def string_value(s: str, nbytes: int, loc: Location) -> int:
    """The raw value of string ``s`` padded with spaces to ``nbytes`` bytes (big-endian)."""
    try:
        raw = s.encode("ascii")
    except UnicodeEncodeError:
        raise SubcError(f"string {s!r} is not ASCII", loc) from None
    if len(raw) > nbytes:
        raise SubcError(f"string {s!r} is {len(raw)} bytes long; the field holds {nbytes}", loc)
    return int.from_bytes(raw.ljust(nbytes, b" "), "big")


def show_value(field: QueryField, v: int) -> str:
    """A raw field value as a rule would write it: a quoted string for ASCII text fields (trailing
    padding removed), a decimal for fields with implied decimals, else the integer."""
    if field.alpha and field.width % 8 == 0:
        raw = v.to_bytes(field.width // 8, "big").rstrip(b" ")
        if all(0x20 <= b < 0x7F and b not in (0x22, 0x5C) for b in raw):
            return '"' + raw.decode("ascii") + '"'
    if field.scale:
        whole, frac = divmod(v, 10**field.scale)
        return f"{whole}.{frac:0{field.scale}d}"
    return str(v)


def unquote(token: str) -> str:
    body = token[1:-1]
    out, i = [], 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            out.append(body[i + 1])
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def literal_value(kind: str, text: str, field: QueryField, loc: Location) -> int:
    """Raw value of literal ``text`` of token kind ``kind`` (INT, HEX, DECIMAL, STRING, IPV4, IPV6, MAC)."""
    width = field.width
    if kind == "STRING":
        if field.scale is not None:
            raise SubcError(
                f"field '{field.name}' is a number (scale {field.scale}); cannot compare it with a string", loc
            )
        if width % 8:
            raise SubcError(
                f"field '{field.name}' is {width} bits, not whole bytes; cannot compare it with a string", loc
            )
        value = string_value(unquote(text), width // 8, loc)
    elif field.alpha:
        raise SubcError(f"field '{field.name}' is text (alpha); compare it with a string, not {text}", loc)
    elif kind == "INT":
        value = int(text) * 10 ** (field.scale or 0)
    elif kind == "HEX":
        value = int(text, 16)
    elif kind == "DECIMAL":
        if field.scale is None:
            raise SubcError(
                f"decimal {text} on field '{field.name}', which has no fixed-point scale "
                "(declare one with @pragma query_field_scale)",
                loc,
            )
        whole, frac = text.split(".")
        if len(frac.rstrip("0")) > field.scale:
            raise SubcError(f"{text} has more than the {field.scale} decimal digits of field '{field.name}'", loc)
        frac = frac[: field.scale].ljust(field.scale, "0")
        value = int(whole) * 10**field.scale + int(frac or "0")
    elif kind in ("IPV4", "IPV6", "MAC"):
        need = {"IPV4": 32, "IPV6": 128, "MAC": 48}[kind]
        if width != need:
            raise SubcError(f"{kind} address on field '{field.name}' of {width} bits (needs {need})", loc)
        if kind == "MAC":
            value = int(text.replace(":", ""), 16)
        else:
            try:
                value = int(ipaddress.ip_address(text))
            except ValueError:
                raise SubcError(f"bad {kind} address {text!r}", loc) from None
    else:  # pragma: no cover - grammar guarantees the kinds
        raise SubcError(f"unexpected literal {text!r}", loc)
    if value > field.max_value:
        raise SubcError(f"value {text} does not fit in the {width}-bit field '{field.name}'", loc)
    return value


def arg_value(kind: str, text: str, width: int, what: str, loc: Location) -> int:
    """Raw value of an action argument for a parameter of ``width`` bits."""
    if kind == "INT":
        value = int(text)
    elif kind == "HEX":
        value = int(text, 16)
    elif kind == "MAC":
        value = int(text.replace(":", ""), 16)
    elif kind in ("IPV4", "IPV6"):
        try:
            value = int(ipaddress.ip_address(text))
        except ValueError:
            raise SubcError(f"bad address {text!r}", loc) from None
    elif kind == "STRING":
        if width % 8:
            raise SubcError(f"{what} is {width} bits, not whole bytes; a string does not fit", loc)
        value = string_value(unquote(text), width // 8, loc)
    else:
        raise SubcError(f"{what} takes an integer or address, not {text}", loc)
    if value >= 1 << width:
        raise SubcError(f"value {text} does not fit in {what} ({width} bits)", loc)
    return value
