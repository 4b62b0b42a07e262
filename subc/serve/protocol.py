"""The text protocol of ``subc serve``: one request per line (UDP datagram or TCP line).

Requests (keywords are case-insensitive; conditions are in subc's rule language, parsed by the
same grammar and front end as rule files, with the limits of ``subc check``)::

    SUBSCRIBE <condition> [TO <ipv4>:<port> [TOKEN <token>]]
                                               -> SUBACK <id>            | SUBERR <column> <message>
    UNSUBSCRIBE <id>                           -> UNSUBACK <id>          | ERR <message>
    RENEW [<id>]                               -> RENEWACK <n>           (the source's subscriptions, or one)
    LIST                                       -> SUB <id> <ip>:<port> <condition> ... then END <n>
    PING                                       -> PONG
    REGISTER <topic>                           -> REGACK <topic> <label> ...  | ERR <message>
    UNREGISTER <topic>                         -> UNREGACK <topic>       | ERR <message>
    SUB <filter> [WHERE <condition>] [TO <ipv4>:<port> [TOKEN <token>]]
                                               -> SUBACK <id>            | SUBERR <column> <message>

Topics (when the spec has ``@pragma query_topic``; see :mod:`.topics`): ``REGISTER`` gives the
labels of a topic's levels (one per level, in order) for a publisher to write into its messages;
``SUB`` subscribes to an MQTT-style filter (``+``, ``#``), and, with ``WHERE``, to the messages of
those topics that the condition also accepts.

A subscription's endpoint (where its messages go, as MoldUDP64 datagrams) is the request's source
address and port (as in BPF-Broker), or the ``TO`` address when the broker's ACL allows it (for
the request's source network, or for the ``TOKEN``).
``<column>`` is the 1-based column of the request line where the error is.

Address proof (UDP only; :mod:`.proof`): any request may end with ``COOKIE <16 hex digits>``, the
cookie the broker gave the request's source address in a ``COOKIE <hex>`` reply; the parser takes
it off (:func:`split_cookie`, :attr:`Request.cookie`) before reading the request.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from ..lang.limits import DEFAULT_LIMITS, Limits
from ..lang.shapes import ShapeCache
from ..lang.ast import Expr, state_predicates
from ..lang.rules import parse_rules
from ..spec.model import Spec
from ..errors import SubcError
from .topics import TopicError, parse_filter, parse_topic

MAX_LINE = 4096  # bytes of one request
COOKIE = "COOKIE"  # the keyword of a cookie, at the end of a request and in the broker's reply
COOKIE_HEX = 16  # hex digits of a cookie (8 bytes)
#: Bytes of the broker's ``COOKIE <hex>`` reply with its newline: an unproven request shorter than
#: this gets nothing (a reply is never larger than the request that caused it).
COOKIE_REPLY_BYTES = len(COOKIE) + 1 + COOKIE_HEX + 1
_HEX = re.compile(rb"[0-9A-Fa-f]{%d}\Z" % COOKIE_HEX)
_TO = re.compile(r"\s+TO\s+(\d{1,3}(?:\.\d{1,3}){3}):(\d{1,5})(?:\s+TOKEN\s+([!-~]{1,128}))?\s*\Z", re.IGNORECASE)
_ADDR = re.compile(rb"(\d{1,3}(?:\.\d{1,3}){3}):\d{1,5}\Z")
_TOKEN = re.compile(rb"[!-~]{1,128}\Z")
_ACTION = re.compile(r":\s*[A-Za-z_]\w*\s*\(")
_ID = re.compile(r"\d{1,18}\Z")


class ProtocolError(Exception):
    """A bad request: ``column`` (1-based, in the request line) and ``message``."""

    def __init__(self, column: int, message: str):
        super().__init__(message)
        self.column, self.message = column, message

    def reply(self, keyword: str = "ERR") -> str:
        if keyword == "SUBERR":
            return f"SUBERR {self.column} {self.message}"
        return f"ERR {self.message}"


@dataclass
class Request:
    """A parsed request: ``verb`` and, per verb, ``condition`` (AST), ``text`` (the condition's
    text), ``to`` ((ip, port) or None), ``token`` (or None), ``sub_id``."""

    verb: str
    condition: Expr | None = None
    text: str = ""
    to: tuple[str, int] | None = None
    sub_id: int | None = None
    token: str | None = None
    column: int = 1  # where the condition's text starts in the request line (a location's column 1)
    topic: tuple[str, ...] | None = None  # REGISTER/UNREGISTER: the name's levels; SUB: the filter's
    topic_text: str = ""  # the name or filter as given
    cookie: bytes | None = None  # the request's COOKIE (8 bytes; b"" when not 16 hex digits), or None


def _clean(raw: bytes) -> str:
    if len(raw) > MAX_LINE:
        raise ProtocolError(MAX_LINE + 1, f"request longer than {MAX_LINE} bytes")
    try:
        line = raw.decode("ascii")
    except UnicodeDecodeError as e:
        raise ProtocolError(e.start + 1, "request is not ASCII") from None
    line = line.rstrip("\r\n")
    for i, ch in enumerate(line):
        if ch != "\t" and not (" " <= ch <= "~"):
            raise ProtocolError(i + 1, f"control character {ord(ch):#04x} in request")
    return line


def _last_blank(s: bytes) -> int:
    return max(s.rfind(b" "), s.rfind(b"\t"))


def split_cookie(raw: bytes) -> tuple[bytes, bytes | None]:
    """``raw`` (a request line) without its final ``COOKIE <hex>``, and the cookie: 8 bytes, ``b""``
    when the value is not 16 hex digits, None when the line does not end with the keyword and a
    value.  Only the end of the line is looked at (nothing is parsed: cheap enough to run before
    the rate limit's verdict is acted on), and the line keeps its columns."""
    s = raw.rstrip()
    cut = _last_blank(s)
    if cut < 0:
        return raw, None
    head = s[:cut].rstrip()
    k = _last_blank(head)
    if k < 0 or head[k + 1 :].upper() != COOKIE.encode():
        return raw, None
    value = s[cut + 1 :]
    return head[:k], bytes.fromhex(value.decode("ascii")) if _HEX.match(value) else b""


def claimed_grant(line: bytes) -> tuple[str, str] | None:
    """The ``TO`` address and ``TOKEN`` that a ``SUBSCRIBE`` or ``SUB`` line (without its cookie)
    ends with, or None (no condition is parsed: the address proof looks at it before parsing)."""
    words = line.split()  # linear in the line's length, as the regular expression of TO is not
    if len(words) < 6 or words[0].upper() not in (b"SUBSCRIBE", b"SUB"):
        return None
    to, addr, token_kw, token = words[-4:]
    m = _ADDR.match(addr)
    if to.upper() != b"TO" or token_kw.upper() != b"TOKEN" or not m or not _TOKEN.match(token):
        return None
    try:
        return str(ipaddress.IPv4Address(m.group(1).decode())), token.decode()
    except ValueError:
        return None


def _split_to(rest: str, rest_col: int) -> tuple[str, tuple[str, int] | None, str | None]:
    """``rest`` without a trailing ``TO <ip>:<port> [TOKEN <t>]``, the address and the token."""
    m = _TO.search(rest)
    if not m:
        return rest, None, None
    try:
        ip = str(ipaddress.IPv4Address(m.group(1)))
    except ValueError:
        raise ProtocolError(rest_col + m.start(1), f"'{m.group(1)}' is not an IPv4 address") from None
    port = int(m.group(2))
    if not 1 <= port <= 65535:
        raise ProtocolError(rest_col + m.start(2), "port must be from 1 to 65535")
    return rest[: m.start()], (ip, port), m.group(3)


def _condition(text: str, col: int, spec: Spec, limits: Limits, shapes: ShapeCache | None = None) -> Expr:
    """The condition AST of ``text`` (at request column ``col``).  Raises ProtocolError."""
    try:
        rules = parse_rules(text + " : fwd(0);", spec, "<request>", limits=limits, shapes=shapes)
    except SubcError as e:
        c = e.location.column if e.location is not None else 1
        if c > len(text):  # in the part the broker appended: the condition has an action part
            m = _ACTION.search(text)
            if m:
                raise ProtocolError(
                    col + m.start(), "a condition has no action part (the broker delivers to the subscriber)"
                ) from None
            raise ProtocolError(col + len(text), e.message) from None
        raise ProtocolError(col + c - 1, e.message) from None
    if len(rules) != 1 or len(rules[0].actions) != 1:
        raise ProtocolError(col, "a subscription takes one condition, without actions")
    preds = state_predicates(rules[0].condition)
    if preds:
        loc = preds[0].location
        assert loc is not None  # a parsed comparison has its location
        raise ProtocolError(
            col + loc.column - 1, "live subscriptions do not take comparisons on state (aggregates) yet"
        )
    return rules[0].condition


_WHERE = re.compile(r"\s+WHERE(?=\s|\Z)", re.IGNORECASE)


def parse_requests(
    raws: list[bytes],
    spec: Spec,
    limits: Limits = DEFAULT_LIMITS,
    depth: int | None = None,
    shapes: ShapeCache | None = None,
) -> list[Request | ProtocolError]:
    """:func:`parse_request` of each line of ``raws``, in order: a request, or its error."""
    out: list[Request | ProtocolError] = []
    for raw in raws:
        try:
            out.append(parse_request(raw, spec, limits, depth, shapes))
        except ProtocolError as e:
            out.append(e)
    return out


def parse_request(
    raw: bytes, spec: Spec, limits: Limits = DEFAULT_LIMITS, depth: int | None = None, shapes: ShapeCache | None = None
) -> Request:
    """The request of one line ``raw`` (without its newline); ``depth``: the levels a topic may
    have (the spec's label fields), None when the spec has no topic fields; ``shapes``: condition
    shapes kept between requests (:class:`~subc.lang.shapes.ShapeCache` of ``spec`` and
    ``limits``: a condition of a known shape is parsed without Lark).  A final ``COOKIE <hex>`` is
    taken off into :attr:`Request.cookie`.  Raises :class:`ProtocolError`."""
    if len(raw) > MAX_LINE:
        raise ProtocolError(MAX_LINE + 1, f"request longer than {MAX_LINE} bytes")
    raw, cookie = split_cookie(raw)
    req = _parse(raw, spec, limits, depth, shapes)
    req.cookie = cookie
    return req


def _parse(raw: bytes, spec: Spec, limits: Limits, depth: int | None, shapes: ShapeCache | None) -> Request:
    line = _clean(raw)
    stripped = line.lstrip()
    lead = len(line) - len(stripped)
    verb, _, rest = stripped.partition(" ")
    verb = verb.upper()
    rest_col = lead + len(verb) + 2  # column of rest's first character
    if verb == "SUBSCRIBE":
        rest, to, token = _split_to(rest, rest_col)
        if not rest.strip():
            raise ProtocolError(rest_col, "SUBSCRIBE needs a condition")
        cond = _condition(rest, rest_col, spec, limits, shapes)
        return Request("SUBSCRIBE", cond, rest.strip(), to, token=token, column=rest_col)
    if verb in ("REGISTER", "UNREGISTER", "SUB"):
        if depth is None:
            raise ProtocolError(lead + 1, f"{verb}: the broker's spec has no topic fields (@pragma query_topic)")
        if verb == "SUB":
            rest, to, token = _split_to(rest, rest_col)
        body = rest.strip()
        col = rest_col + (len(rest) - len(rest.lstrip()))
        if not body:
            raise ProtocolError(rest_col, f"{verb} needs a topic {'filter' if verb == 'SUB' else 'name'}")
        name, _, tail = body.partition(" ")
        try:
            levels = parse_filter(name, depth) if verb == "SUB" else parse_topic(name, depth)
        except TopicError as e:
            raise ProtocolError(col + e.column - 1, e.message) from None
        if verb != "SUB":
            if tail.strip():
                raise ProtocolError(col + len(name) + 1, f"{verb} takes one topic name")
            return Request(verb, topic=levels, topic_text=name)
        req = Request("SUB", None, "", to, token=token, topic=levels, topic_text=name)
        if tail.strip():
            m = _WHERE.match(" " + tail)
            if not m:
                raise ProtocolError(col + len(name) + 1, "expected WHERE <condition> after the topic filter")
            where = (" " + tail)[m.end() :]
            wcol = col + len(name) + m.end()
            if not where.strip():
                raise ProtocolError(wcol, "WHERE needs a condition")
            req.condition = _condition(where, wcol, spec, limits, shapes)
            req.text, req.column = where.strip(), wcol + (len(where) - len(where.lstrip()))
        return req
    if verb in ("UNSUBSCRIBE", "RENEW"):
        arg = rest.strip()
        if not arg:
            if verb == "RENEW":
                return Request(verb)
            raise ProtocolError(rest_col, "UNSUBSCRIBE needs a subscription id")
        if not _ID.match(arg):
            raise ProtocolError(rest_col + rest.find(arg), f"'{arg[:40]}' is not a subscription id")
        return Request(verb, sub_id=int(arg))
    if verb in ("LIST", "PING"):
        if rest.strip():
            raise ProtocolError(rest_col, f"{verb} takes no argument")
        return Request(verb)
    raise ProtocolError(
        lead + 1,
        f"unknown request '{verb[:40]}' (SUBSCRIBE, UNSUBSCRIBE, RENEW, LIST, PING, REGISTER, UNREGISTER, SUB)",
    )
