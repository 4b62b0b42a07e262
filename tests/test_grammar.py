"""The rule language: every construct, Camus compatibility, and bad input with exact locations."""

from __future__ import annotations

import pytest

from subc.lang.ast import And, Not, Or, Pred
from subc.lang.rules import parse_rules
from subc.spec.front_end import parse_spec
from subc.errors import SubcError

SPEC = """
@pragma query_field(add_order.shares, 32)
@pragma query_field(add_order.price, 32)
@pragma query_field_scale(add_order.price, 4)
@pragma query_field_exact(add_order.stock, 64)
@pragma query_field_lpm(ipv4.dstAddr, 32)
@pragma query_field_lpm(ipv6.dstAddr, 128)
@pragma query_field_exact(ethernet.dstAddr, 48)
@pragma query_field(udp.dstPort, 16)
"""


@pytest.fixture(scope="module")
def spec():
    return parse_spec(SPEC, "s.p4")


def one(text, spec):
    (rule,) = parse_rules(text, spec, "r.sub")
    return rule


def test_camus_rules_unchanged(spec):
    rules = parse_rules(
        'add_order.shares = 1: fwd(1);\n'
        'add_order.price = 2: fwd(2);\n'
        'add_order.shares = 3 and add_order.price = 4: fwd(3);\n'
        'add_order.shares > 100 and add_order.stock = "BFN": fwd(2);\n'
        'add_order.stock = 5 and add_order.shares > 12: fwd(7);\n',
        spec,
        "camus.sub",
    )
    assert len(rules) == 5
    assert rules[3].condition.items[1].operands[0].value == int.from_bytes(b"BFN     ", "big")
    assert rules[4].condition.items[0].operands[0].value == 5
    # the price field has a scale of 4 here: an integer is in units
    assert rules[1].condition.operands[0].value == 20000


@pytest.mark.parametrize("op", ["==", "=", "!=", "<", "<=", ">", ">="])
def test_comparisons(spec, op):
    r = one(f"shares {op} 10 : fwd(1);", spec)
    assert isinstance(r.condition, Pred)
    assert r.condition.op == ("==" if op == "=" else op)
    assert r.condition.field == "add_order.shares"


def test_literal_on_left_is_flipped(spec):
    r = one("10 < shares : fwd(1);", spec)
    assert (r.condition.op, r.condition.operands[0].value) == (">", 10)


def test_precedence_not_and_or(spec):
    r = one("shares == 1 or shares == 2 and not shares == 3 : fwd(1);", spec)
    assert isinstance(r.condition, Or)
    assert isinstance(r.condition.items[1], And)
    assert isinstance(r.condition.items[1].items[1], Not)
    r = one("!(shares == 1 || shares == 2) && price > 1 : fwd(1);", spec)
    assert isinstance(r.condition, And) and isinstance(r.condition.items[0], Not)


def test_literals(spec):
    r = one("ipv4.dstAddr == 192.168.0.0/16 and ipv6.dstAddr == fe80::/10 and "
            "ethernet.dstAddr == 02:00:0a:0a:01:02 and udp.dstPort == 0x6720 : fwd(1);", spec)
    p4, p6, mac, port = r.condition.items
    assert (p4.operands[0].value, p4.operands[0].prefix_len) == (0xC0A80000, 16)
    assert (p6.operands[0].value >> 118, p6.operands[0].prefix_len) == (0xFE80 >> 6, 10)
    assert mac.operands[0].value == 0x02000A0A0102
    assert port.operands[0].value == 0x6720


def test_decimal_on_scaled_field(spec):
    assert one("price > 144.21 : fwd(1);", spec).condition.operands[0].value == 1442100
    assert one("price > 0.0001 : fwd(1);", spec).condition.operands[0].value == 1


def test_string_padding(spec):
    r = one('stock == "GOOGL" : fwd(1);', spec)
    assert r.condition.operands[0].value.to_bytes(8, "big") == b"GOOGL   "


def test_set_membership_and_negation(spec):
    r = one('stock in {"AAPL", "MSFT"} : fwd(1);', spec)
    assert r.condition.op == "in" and len(r.condition.operands) == 2
    r = one('stock not in {"AAPL"} : fwd(1);', spec)
    assert r.condition.op == "not in"


def test_bare_field_and_comments(spec):
    rules = parse_rules("# a comment\nshares > 1 : fwd(1); // trailing\n// last\n", spec, "r.sub")
    assert rules[0].condition.field == "add_order.shares"


def test_several_actions(spec):
    r = one("shares > 1 : fwd(1, 2), fwd(3);", spec)
    assert [a.name for a in r.actions] == ["fwd", "fwd"]
    assert r.atoms() == {("fwd", 1), ("fwd", 2), ("fwd", 3)}
    assert one("shares > 1 : drop();", spec).actions[0].name == "drop"


def test_spec_action_with_address_argument():
    spec = parse_spec("@pragma query_field(h.x, 8)\naction answerDNS(bit<32> addr) { }\n", "s.p4")
    r = one("h.x == 1 : answerDNS(10.0.0.97);", spec)
    assert r.actions[0].name == "answerDNS" and r.actions[0].args == (0x0A000061,)
    with pytest.raises(SubcError, match="takes 1 argument"):
        parse_rules("h.x == 1 : answerDNS();", spec, "r.sub")


BAD = [
    # (rules text, line, column, message fragment)
    ("shares > 1 fwd(1);", 1, 12, "unexpected 'fwd'"),
    ("shares > 1 : fwd(1)", 1, 20, "unexpected end of input"),
    ("prise > 1 : fwd(1);", 1, 1, "unknown field 'prise'"),
    ("shares > 1 : fwd(1);\nshares > 2 : fwd(1);\nstock < \"A\" : fwd(1);", 3, 7, "'<' on field 'add_order.stock'"),
    ("ipv4.dstAddr > 1.2.3.4 : fwd(1);", 1, 14, "'>' on field 'ipv4.dstAddr'"),
    ('price == "ABC" : fwd(1);', 1, 10, "cannot compare it with a string"),
    ('stock == "TOOLONGNAME" : fwd(1);', 1, 10, "11 bytes long"),
    ("shares > 4294967296 : fwd(1);", 1, 10, "does not fit"),
    ("shares > 1.5 : fwd(1);", 1, 10, "no fixed-point scale"),
    ("price > 1.23456 : fwd(1);", 1, 9, "more than the 4 decimal digits"),
    ("shares > 1 : subc_frob(1);", 1, 14, "action name 'subc_frob' is reserved"),
    ("shares > 1 : fwd(600);", 1, 18, "port 600 is out of range"),
    ("ipv4.dstAddr == 10.0.0.1/8 : fwd(1);", 1, 17, "bits set after the first 8"),
    ("stock == 1.2.3.4 : fwd(1);", 1, 10, "IPV4 address on field 'add_order.stock'"),
    ("ipv4.dstAddr == 10.0.0.0/33 : fwd(1);", 1, 26, "prefix length 33"),
    ("shares $ 1 : fwd(1);", 1, 8, "unexpected character '$'"),
    ("stock == 10.0.0.0/8 : fwd(1);", 1, 10, "prefix match on exact-only field"),
    ("ipv4.dstAddr < 10.0.0.0/8 : fwd(1);", 1, 14, "'<' on field"),
]


@pytest.mark.parametrize("text,line,col,frag", BAD)
def test_errors_have_exact_locations(spec, text, line, col, frag):
    with pytest.raises(SubcError) as ei:
        parse_rules(text, spec, "bad.sub")
    e = ei.value
    assert frag in e.message
    assert (e.location.path, e.location.line, e.location.column) == ("bad.sub", line, col)
    rendered = e.render().splitlines()
    assert rendered[0].startswith(f"bad.sub:{line}:{col}: error: ")
    assert rendered[2].index("^") - 4 == col - 1


def test_bare_field_ambiguity():
    spec = parse_spec("@pragma query_field(a.x, 8)\n@pragma query_field(b.x, 8)\n", "s.p4")
    with pytest.raises(SubcError, match="ambiguous"):
        parse_rules("x == 1 : fwd(1);", spec, "r.sub")
