"""Message-format specs: the ITCH example, a Camus pragma-only spec, and bad specs."""

from __future__ import annotations

import pytest

from subc.spec.front_end import parse_spec
from subc.errors import SubcError


def test_example_spec(example_spec):
    s = example_spec
    assert s.whole_program
    assert s.instances["add_order"] == "itch_add_order_t"
    q = s.query_fields
    assert (q["add_order.shares"].width, q["add_order.shares"].match_kind) == (32, "range")
    assert (q["add_order.price"].scale, q["add_order.stock"].alpha) == (4, True)
    assert q["add_order.stock"].match_kind == "exact" and q["ipv4.dstAddr"].match_kind == "lpm"
    assert s.consts["ITCH_UDP_PORT"] == 26400
    assert [st.name for st in s.parser.states][0] == "start"
    parse = {st.name: st for st in s.parser.states}
    assert parse["parse_moldudp64"].extracts == ["mold", "mold_msg", "itch"]
    assert ("ITCH_ADD_ORDER_MPID", "parse_add_order_mpid") in parse["parse_moldudp64"].transition.cases
    assert (s.parser.packet, s.parser.hdr, s.parser.meta_type) == ("packet", "hdr", "metadata")


def test_pragma_only_spec_camus_style():
    s = parse_spec(
        "@pragma query_field(add_order.price, 32)\n"
        "@pragma query_field(add_order.shares, 32)\n"
        "@pragma query_field_exact(add_order.stock, 64)\n"
        "@pragma query_default_action(drop)\n",
        "camus.p4",
    )
    assert not s.whole_program
    assert s.query_fields["add_order.stock"].width == 64


def test_p4_14_style_defines_and_controls_are_ignored():
    s = parse_spec(
        "#define PORT 1234\n"
        "header h_t { bit<16> a; bit<8> b; }\n"
        "struct headers { h_t h; }\n"
        "control C(inout headers hdr) { table t { key = { hdr.h.a: exact; } actions = { NoAction; } } apply { t.apply(); } }\n"
        "extern void foo();\n"
        "@pragma query_field(h.a)\n",
        "x.p4",
    )
    assert s.consts["PORT"] == 1234 and s.query_fields["h.a"].width == 16


BAD = [
    ("header h_t { bit<8> a; }\nstruct headers { h_t h; }\n@pragma query_field(h.zz)\n", 3, 21, "unknown field 'zz'"),
    ("header h_t { bit<8> a; }\nstruct headers { h_t h; }\n@pragma query_field(g.a)\n", 3, 21, "unknown header instance 'g'"),
    ("header h_t { bit<8> a; }\nstruct headers { h_t h; }\n@pragma query_field(h.a, 16)\n", 3, 26, "width 16 does not fit"),
    ("@pragma query_field(h.a)\n", 1, 21, "needs a width"),
    ("@pragma query_field(h.a, 200)\n", 1, 21, "at most 128"),
    ("@pragma query_field(h.a, 8)\n@pragma query_frobnicate(h.a)\n", 2, 1, "unknown pragma"),
    ("@pragma query_field(h.a, 8)\n@pragma query_field_scale(h.b, 2)\n", 2, 27, "not a query field"),
    ("header h_t { bit<8> a; }\nstruct headers { h_t h; }\naction foo(bit<8> x) { }\n@pragma query_field(h.a)\n"
     "@pragma query_default_action(foo)\n", 5, 30, "default action 'foo'"),
    ("header h_t { bit<8> a; wat b; }\n@pragma query_field(h.a, 8)\n", 1, 24, "unknown type 'wat'"),
    ("header h_t { bit<8> a }\n", 1, 23, "expected ';'"),
    ("", 1, 1, "no query fields"),
]


@pytest.mark.parametrize("text,line,col,frag", BAD)
def test_bad_specs(text, line, col, frag):
    with pytest.raises(SubcError) as ei:
        parse_spec(text, "bad.p4")
    e = ei.value
    assert frag in e.message
    assert (e.location.line, e.location.column) == (line, col)
    assert str(e).startswith(f"bad.p4:{line}:{col}: error:")
