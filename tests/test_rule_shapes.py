"""The shape-template parser gives exactly what Lark alone gives: the same rules (conditions,
actions, locations, text) or the same error, on generated rule sets laid out in varied ways and on
damaged texts."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pickle

import subc.lang.rule_shapes as rs
from subc.lang.limits import Limits, check_rule_text
from subc.lang.rule_shapes import rule_ends
from subc.lang.rules import parse_rules, parse_rules_lark
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


def test_templates_are_used_for_repeated_shapes(example_spec, monkeypatch):
    from subc.workloads.itch_rules import itch_rules

    text = itch_rules(2000, symbols=20, seed=1, form="camus") + '  add_order.stock == "ZZ" : fwd(1);  add_order.stock == "YY" : fwd(2);\n'
    calls = []
    orig = rs.ShapeParser._template

    def counting(self, *a):
        calls.append(1)
        return orig(self, *a)

    monkeypatch.setattr(rs.ShapeParser, "_template", counting)
    rules = parse_rules(text, example_spec, "c.sub", line_offset=10, first_index=5)
    assert len(calls) <= 4  # first rule, the rest of the Camus rules, and the two on the last line
    assert rules == parse_rules_lark(text, example_spec, "c.sub", line_offset=10, first_index=5)
    assert rules[0].index == 5 and rules[0].location.line == 11
    assert rules[-1].location.column == 38 and rules[-1].location.line == 2011


def unlocated(cond):
    """A conjunction of predicates without their locations."""
    return tuple((p.field, p.width, p.op, p.operands) for p in cond.items)


def test_deferred_rules_share_cores_and_materialise_as_lark_rules(example_spec):
    text = ('add_order.stock == "AB" and add_order.shares > 5 : fwd(1);\n' * 2
            + 'add_order.stock == "AB" and add_order.shares > 5 : fwd(2);\n'
            + 'add_order.stock == "CD" and add_order.shares > 5 : fwd(1);\n') * 2
    rules = parse_rules(text, example_spec, "c.sub")
    lark = parse_rules_lark(text, example_spec, "c.sub")
    # after the first rule of each shape (rules 0 and 1: the second starts with a newline), rules
    # with the same literals in the condition share one core condition, whatever their actions
    assert rules[4].core is rules[2].core and rules[5].core is rules[2].core and rules[6].core is rules[2].core
    assert rules[3].core is not rules[2].core and rules[7].core is rules[3].core
    for r, x in zip(rules, lark):
        assert r.atoms() == x.atoms()
        assert unlocated(r.core) == unlocated(x.condition)  # the core means what the condition means
        assert r == x and hash(r) == hash(x) and repr(r) == repr(x)
        assert pickle.loads(pickle.dumps(r)) == x


def outcome_checked(text, spec, limits):
    """What Lark alone gives after the limit checks (the reference of parse_rules)."""
    try:
        check_rule_text(text, "r.sub", rule_ends(text), 0, limits)
        return parse_rules_lark(text, spec, "r.sub")
    except SubcError as e:
        return ("error", e.render())


@pytest.mark.parametrize("later", ["syntax", "limit", "none"])
def test_the_first_semantic_error_loses_to_later_syntax_and_limit_errors(example_spec, later):
    good = 'add_order.stock == "AB" and add_order.shares > {} : fwd({});\n'
    lines = [good.format(i, 1 + i % 7) for i in range(50)]
    lines[3] = good.format(3, 600)  # port out of range: a semantic error in a templated rule
    lines[5] = 'add_order.stock == "AB" and add_order.shares > 5 : fwd(9999999999999);\n'
    if later == "syntax":
        lines[40] = 'add_order.stock == "AB" and and add_order.shares > 5 : fwd(1);\n'
    elif later == "limit":
        lines[40] = "add_order.shares > 1" + " and add_order.shares > 2" * 50 + " : fwd(1);\n"
    text = "".join(lines)
    limits = Limits(max_rule_chars=1000)
    got = outcome(lambda t, s, p: parse_rules(t, example_spec, p, limits=limits), text)
    assert got == outcome_checked(text, example_spec, limits)
    assert ("unexpected" in got[1]) if later == "syntax" else ("characters long" in got[1]) if later == "limit" else ("port 600" in got[1])


@pytest.mark.parametrize("error_at", [None, 5, 30])
def test_a_long_piece_of_known_literals_is_a_limit_error_before_or_after_a_semantic_error(example_spec, error_at):
    """Pieces whose condition and action literals were seen before are length-checked after their
    run (span patterns): a piece made long by a number in its comment still gives the limit error,
    whether a semantic error comes before or after it in the same run."""
    good = "# {}\nadd_order.stock == \"AB\" and add_order.shares > {} : fwd({});\n"
    lines = [good.format(1, i % 5, 1 + i % 3) for i in range(50)]
    lines[17] = good.format("9" * 1500, 2, 3)  # the literals of line 2 and 2: known keys
    if error_at is not None:
        lines[error_at] = good.format(1, 1, 600)
    text = "".join(lines)
    limits = Limits(max_rule_chars=1000)
    got = outcome(lambda t, s, p: parse_rules(t, example_spec, p, limits=limits), text)
    assert got == outcome_checked(text, example_spec, limits)
    assert "characters long" in got[1]


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


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(layouts(), min_size=2, max_size=4), st.data())
def test_a_shape_cache_kept_between_texts_changes_nothing(texts, data):
    """Texts parsed one after another with one ShapeCache (templates made from earlier texts, at
    other offsets, lines and paths) give what Lark alone gives on each text."""
    cache = rs.ShapeCache(SPEC, max_shapes=data.draw(st.sampled_from([1, 3, 256])),
                          max_rules=data.draw(st.sampled_from([5, 200_000])))
    for k, text in enumerate(texts):
        if data.draw(st.booleans(), label="damage"):
            i = data.draw(st.integers(0, max(0, len(text) - 1)))
            junk = data.draw(st.sampled_from(["", ";", "x", "9999999999999999999999", '"', "h.zz", "99999"]))
            text = text[:i] + junk + text[i + data.draw(st.integers(0, 3)):]
        path, offset = f"t{k}.sub", data.draw(st.integers(0, 5))

        def cached(t, spec, _path):
            return parse_rules(t, spec, path, line_offset=offset, shapes=cache)

        def lark(t, spec, _path):
            return parse_rules_lark(t, spec, path, line_offset=offset)
        got, want = outcome(cached, text), outcome(lark, text)
        assert got == want
        if isinstance(got, list):  # deferred rules materialize from their own text
            assert [(r.text, r.location) for r in got] == [(r.text, r.location) for r in want]


def test_a_shape_cache_belongs_to_one_spec_and_limits():
    cache = rs.ShapeCache(SPEC)
    with pytest.raises(ValueError):
        parse_rules("h.a == 1 : fwd(1);", SPEC, limits=Limits(max_rules=5), shapes=cache)
