"""Topics of ``subc serve``: names, MQTT filters, labels, and the conditions filters become.

The reference is MQTT itself, written here from the standard (MQTT Version 3.1.1, section 4.7)
over topic *strings*: :func:`mqtt_matches`, :func:`mqtt_valid_filter`, :func:`mqtt_valid_name`.
subc never sees those strings in its data path: it labels the levels with numbers and matches a
filter's condition on the label fields.  Hypothesis draws topic universes (empty levels, repeated
names, every depth up to the spec's), filters with ``+`` and ``#``, and specs of several depths,
label widths and level-count match kinds; the filter's condition, evaluated on the values a
message of each topic carries (its level count and labels, from REGACK), must give the
reference's answer for every (filter, topic) pair.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.lang.ast import evaluate
from subc.lang.limits import DEFAULT_LIMITS
from subc.spec.front_end import parse_spec
from subc.errors import SubcError
from subc.serve.protocol import ProtocolError, parse_request
from subc.serve.topics import LabelTable, TopicBook, TopicError, parse_filter, parse_topic


# -- the reference: MQTT 3.1.1 section 4.7, on strings ----------------------------------------------

def mqtt_valid_name(name: str) -> bool:
    """4.7.1/4.7.3: a topic name is at least one character and holds no wildcard."""
    return len(name) > 0 and "+" not in name and "#" not in name


def mqtt_valid_filter(f: str) -> bool:
    """4.7.1: '#' alone in the last level, '+' alone in a level."""
    if not f:
        return False
    levels = f.split("/")
    for i, lv in enumerate(levels):
        if "#" in lv and (lv != "#" or i != len(levels) - 1):
            return False
        if "+" in lv and lv != "+":
            return False
    return True


def mqtt_matches(f: str, name: str) -> bool:
    """4.7.1 and 4.7.2: does filter ``f`` match topic ``name``?"""
    if name.startswith("$") and f[:1] in ("+", "#"):
        return False
    fl, nl = f.split("/"), name.split("/")
    for i, lv in enumerate(fl):
        if lv == "#":
            return True  # the parent level and any number of levels below ("sport/#" matches "sport")
        if i >= len(nl):
            return False
        if lv != "+" and lv != nl[i]:
            return False
    return len(fl) == len(nl)


# -- specs ---------------------------------------------------------------------------------------

def topic_spec(depth: int, width: int, levels_kind: str, extra: bool = False):
    kind = {"range": "query_field", "exact": "query_field_exact"}[levels_kind]
    lines = [f"@pragma {kind}(t.n, 8)"] + [f"@pragma query_field_exact(t.l{i}, {width})" for i in range(depth)]
    if extra:
        lines.append("@pragma query_field(t.prio, 8)")
    labels = ", ".join(f"t.l{i}" for i in range(depth))
    lines.append(f"@pragma query_topic(t.n, {labels})")
    return parse_spec("\n".join(lines) + "\n", "topics.p4")


SEGMENTS = st.sampled_from(["a", "b", "c", "", "sport", "tennis", "x1", "$x"])


@st.composite
def universe(draw):
    depth = draw(st.integers(1, 4))
    spec = topic_spec(depth, draw(st.sampled_from([8, 16, 32])), draw(st.sampled_from(["range", "exact"])))
    names = draw(st.lists(st.lists(SEGMENTS, min_size=1, max_size=depth).map("/".join).filter(bool), min_size=1, max_size=12,
                          unique=True))
    fseg = st.one_of(SEGMENTS, st.just("+"))
    filters = draw(st.lists(
        st.tuples(st.lists(fseg, min_size=0, max_size=depth), st.booleans()).map(
            lambda t: "/".join(t[0] + (["#"] if t[1] or not t[0] else []))).filter(bool),
        min_size=1, max_size=8))
    return spec, depth, names, filters


def message_values(spec, labels: list[int]) -> dict[str, int]:
    t = spec.topic
    vals = {t.levels: len(labels)}
    vals.update({f: 0 for f in t.labels})
    vals.update(zip(t.labels, labels))
    return vals


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(universe())
def test_filter_conditions_match_as_mqtt_does(u):
    spec, depth, names, filters = u
    book = TopicBook(spec, {}, 1, DEFAULT_LIMITS)
    registered = {}
    for name in names:
        if name.startswith("$"):
            with pytest.raises(TopicError):
                parse_topic(name, depth)  # reserved for the broker: no publisher gets labels for it
            continue
        levels = parse_topic(name, depth)
        registered[name] = book.register(name, levels, "10.0.0.1", None, 1000)
    for f in filters:
        levels = parse_filter(f, depth)
        cond, names_used = book.condition(levels, "")
        for name, labels in registered.items():
            got = evaluate(cond, message_values(spec, labels))
            assert got == mqtt_matches(f, name), (f, name, labels)
        book.release(names_used)
    # the labels of registered names are stable and distinct per name
    again = {n: book.register(n, parse_topic(n, depth), "10.0.0.1", None, 1000) for n in registered}
    assert again == registered
    by_level = {}
    for n, labels in registered.items():
        for lv, lab in zip(n.split("/"), labels):
            assert by_level.setdefault(lab, lv) == lv


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab+#/$ ", min_size=0, max_size=12), st.integers(1, 4))
def test_name_and_filter_validity_follow_mqtt(text, depth):
    printable = text != "" and " " not in text
    deep = len(text.split("/"))
    try:
        parse_filter(text, depth)
        ok = True
    except TopicError:
        ok = False
    fixed = deep - (1 if text.endswith("#") else 0)
    assert ok == (printable and mqtt_valid_filter(text) and fixed <= depth)
    try:
        parse_topic(text, depth)
        ok = True
    except TopicError:
        ok = False
    assert ok == (printable and mqtt_valid_name(text) and not text.startswith("$") and deep <= depth)


def test_labels_are_forgotten_with_their_last_user_and_never_reused():
    t = LabelTable({}, 1, 1 << 8)
    a, b = t.acquire(["a", "b"])
    assert t.acquire(["a"]) == [a]
    t.release(["a", "b"])
    assert t.label("a") == a and t.label("b") is None
    t.release(["a"])
    assert t.label("a") is None
    assert t.acquire(["a"]) != [a]  # a new label: a publisher holding the old one reaches no one
    added, forgotten = t.changes()
    assert set(added) == {"a"} and forgotten == set()  # b was given and forgotten between commits
    small = LabelTable({}, 1, 3)
    small.acquire(["x", "y"])
    with pytest.raises(SubcError, match="no labels left"):
        small.acquire(["z"])


def test_where_conditions_and_the_level_count_of_hash():
    spec = topic_spec(3, 16, "range", extra=True)
    book = TopicBook(spec, {}, 1, DEFAULT_LIMITS)
    lab = book.register("s/t", ("s", "t"), "h", None, 10)
    cond, _ = book.condition(("s", "#"), "t.prio > 3")
    assert evaluate(cond, {**message_values(spec, lab), "t.prio": 4})
    assert not evaluate(cond, {**message_values(spec, lab), "t.prio": 3})
    assert evaluate(cond, {**message_values(spec, lab[:1]), "t.prio": 9})  # 's/#' matches 's'
    with pytest.raises(SubcError):
        book.condition(("s",), "t.nope > 1")
    assert book.labels.label("s") is not None and len(book.labels) == 2  # the failed SUB released its names


def test_requests_name_their_errors_by_column():
    spec = topic_spec(2, 16, "range", extra=True)

    def err(line):
        with pytest.raises(ProtocolError) as e:
            parse_request(line.encode(), spec, depth=2)
        return e.value.column, e.value.message

    assert err("SUB a/b#")[0] == 8
    assert err("SUB a/b/c") == (8, "more than 2 levels (the spec's label fields)")
    assert err("REGISTER $SYS/x")[0] == 10
    assert err("REGISTER a/+")[0] == 12
    assert err("SUB a WHERE t.prio >")[0] >= 13
    assert err("SUB a WHERE t.zz > 1")[0] == 13
    assert err("SUB a junk")[1].startswith("expected WHERE")
    r = parse_request(b"SUB a/+ WHERE t.prio > 1 TO 10.0.0.9:5 TOKEN k", spec, depth=2)
    assert r.topic == ("a", "+") and r.text == "t.prio > 1" and r.to == ("10.0.0.9", 5) and r.token == "k"
    with pytest.raises(ProtocolError, match="no topic fields"):
        parse_request(b"SUB a", spec, depth=None)


def test_spec_rejects_bad_topic_pragmas():
    with pytest.raises(SubcError, match="not a query field"):
        parse_spec("@pragma query_field(t.n, 8)\n@pragma query_topic(t.n, t.l0)\n")
    with pytest.raises(SubcError, match="cannot hold"):
        parse_spec("@pragma query_field(t.n, 1)\n@pragma query_field_exact(t.a, 8)\n@pragma query_field_exact(t.b, 8)\n"
                   "@pragma query_topic(t.n, t.a, t.b)\n")
    with pytest.raises(SubcError, match="exact or range"):
        parse_spec("@pragma query_field(t.n, 8)\n@pragma query_field_lpm(t.a, 8)\n@pragma query_topic(t.n, t.a)\n")
