"""The shape-template parser gives exactly what Lark alone gives: the same rules (conditions,
actions, locations, text) or the same error, on generated rule sets laid out in varied ways and on
damaged texts."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.compiler.rule_shapes import parse_shapes
from subc.compiler.rules import parse_rules, parse_rules_lark
from subc.errors import SubcError

from strategies import rule_set
from test_differential import FIELDS, SPEC

SEPARATORS = st.sampled_from(["\n", " ", "\n\n", "  # a comment; with 12 and \"x\"\n", "\n// 7 > 5;\n", "\t"])


def outcome(fn, text):
    try:
        return fn(text, SPEC, "r.sub")
    except SubcError as e:
        return ("error", e.render())


@st.composite
def layouts(draw):
    """A generated rule set, each rule repeated with other literals, joined by varied separators."""
    _, text = draw(rule_set(FIELDS, allow_drop=True, max_port=600))
    rules = text.split("\n")
    out = []
    for r in rules:
        for _ in range(draw(st.integers(1, 3))):
            # the same shape with other numbers: replace each digit run by a drawn number
            import re

            out.append(re.sub(r"(?<![\w.])\d+(?![\w.])", lambda m: str(draw(st.integers(0, 70000))), r))
    seps = [draw(SEPARATORS) for _ in out]
    return draw(st.sampled_from(["", "\n", "# head 3\n"])) + "".join(r + s for r, s in zip(out, seps))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(layouts())
def test_shape_parser_equals_lark(text):
    assert outcome(parse_rules, text) == outcome(parse_rules_lark, text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(layouts(), st.data())
def test_damaged_texts_give_the_same_error_or_rules(text, data):
    i = data.draw(st.integers(0, max(0, len(text) - 1)))
    junk = data.draw(st.sampled_from(["", ";", "(", "x", "9999999999999999999999", '"', ".", "=", "fwd(", "h.zz"]))
    bad = text[:i] + junk + text[i + data.draw(st.integers(0, 3)):]
    assert outcome(parse_rules, bad) == outcome(parse_rules_lark, bad)


def test_templates_are_used_for_repeated_shapes(example_spec):
    from subc.workloads.itch_rules import itch_rules

    text = itch_rules(2000, symbols=20, seed=1, form="camus") + '  add_order.stock == "ZZ" : fwd(1);  add_order.stock == "YY" : fwd(2);\n'
    calls = []
    import subc.compiler.rule_shapes as rs

    orig = rs.ShapeParser._template

    def counting(self, *a):
        calls.append(1)
        return orig(self, *a)

    rs.ShapeParser._template = counting
    try:
        rules = parse_shapes(text, example_spec, "c.sub", line_offset=10, first_index=5)
    finally:
        rs.ShapeParser._template = orig
    assert rules == parse_rules_lark(text, example_spec, "c.sub", line_offset=10, first_index=5)
    assert rules[0].index == 5 and rules[0].location.line == 11
    assert rules[-1].location.column == 38 and rules[-1].location.line == 2011
    assert len(calls) <= 4  # first rule, the rest of the Camus rules, and the two on the last line


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rule_set(FIELDS, allow_drop=True), st.integers(0, 2), st.sampled_from(["99999999999", "600", "0x1FF", "256"]))
def test_literal_errors_in_templated_rules_are_located_as_lark_locates_them(fields_text, which, big):
    """The first rule of each shape is valid; a later one of the same shape has a literal that does
    not fit (or a port out of range): the error must name that rule's line and column."""
    import re

    _, text = fields_text
    first = [re.sub(r"(?<![\w.])\d+(?![\w.])", "1", r) for r in text.split("\n")]
    nums = [0]

    def bump(m):
        nums[0] += 1
        return big if nums[0] % 3 == which else "2"

    later = [re.sub(r"(?<![\w.])\d+(?![\w.])", bump, r) for r in first]
    full = "\n".join(first) + "\n  " + "\n".join(later) + "\n"
    assert outcome(parse_rules, full) == outcome(parse_rules_lark, full)
