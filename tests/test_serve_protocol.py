"""The request parser and the store of ``subc serve`` (no root needed).

The parser is fuzzed: any bytes give a request or a ProtocolError whose column lies in the line
(plus one past its end), never another exception; conditions drawn by hypothesis (every
comparison kind, nested and/or/not) parse to the AST that the rule parser gives the same text,
with and without a ``TO`` endpoint; errors in a condition point at its column in the request.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import condition
from test_differential import FIELDS, SPEC
from test_topics import topic_spec

from subc.lang.ast import Not, Pred
from subc.lang.rules import parse_rules
from subc.lang.rule_shapes import ShapeCache
from subc.serve.protocol import MAX_LINE, ProtocolError, Request, parse_request, parse_requests
from subc.serve.store import Store, Stored


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=300),
                 st.text(max_size=200).map(lambda t: t.encode("utf-8", "replace")),
                 st.sampled_from(["SUBSCRIBE", "subscribe", "UNSUBSCRIBE", "RENEW", "LIST", "PING"]).flatmap(
                     lambda v: st.text(max_size=120).map(lambda t: f"{v} {t}".encode("utf-8", "replace")))))
def test_any_bytes_give_a_request_or_a_located_error(raw):
    try:
        parse_request(raw, SPEC)
    except ProtocolError as e:
        assert 1 <= e.column <= max(len(raw), MAX_LINE) + 1
        assert e.message and "\n" not in e.reply("SUBERR")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(condition(sorted(FIELDS), FIELDS), st.one_of(st.none(), st.tuples(st.integers(0, 255), st.integers(1, 65535))),
       st.sampled_from(["SUBSCRIBE", "subscribe", "Subscribe"]))
def test_conditions_parse_as_the_rule_parser_does(cond, to, verb):
    line = f"{verb} {cond}" + (f" TO 10.1.{to[0]}.2:{to[1]}" if to else "")
    req = parse_request(line.encode(), SPEC)
    (rule,) = parse_rules(f"{cond} : fwd(0);", SPEC, "<request>")
    assert req.verb == "SUBSCRIBE" and req.condition == rule.condition
    assert req.to == ((f"10.1.{to[0]}.2", to[1]) if to else None)


def test_errors_point_into_the_request_line():
    line = 'SUBSCRIBE h.a > 3 and h.zz == 1'
    try:
        parse_request(line.encode(), SPEC)
        raise AssertionError("accepted an unknown field")
    except ProtocolError as e:
        assert line[e.column - 1 :].startswith("h.zz"), e.column
    for bad, where in [("SUBSCRIBE h.a > 3 : fwd(2)", ":"), ("SUBSCRIBE h.a > 3 TO 10.0.0.300:5", "10.0.0.300"),
                       ("UNSUBSCRIBE x1", "x1"), ("FROB 1", "FROB"), ("SUBSCRIBE", "")]:
        try:
            parse_request(bad.encode(), SPEC)
            raise AssertionError(f"accepted {bad!r}")
        except ProtocolError as e:
            if where:
                assert bad[e.column - 1 :].startswith(where), (bad, e.column, e.message)
    too_long = b"SUBSCRIBE " + b"h.a > 1 or " * 400 + b"h.a > 2"
    try:
        parse_request(too_long, SPEC)
        raise AssertionError("accepted an oversized line")
    except ProtocolError as e:
        assert "longer than" in e.message
    deep = "SUBSCRIBE " + "not (" * 70 + "h.a > 1" + ")" * 70
    try:
        parse_request(deep.encode(), SPEC)
        raise AssertionError("accepted a condition nested beyond the limit")
    except ProtocolError as e:
        assert "nest" in e.message


def test_store_keeps_subscriptions_across_reopen(tmp_path):
    s = Store(tmp_path)
    ids = [s.next_id() for _ in range(3)]
    assert ids == [1, 2, 3]
    for i in ids:
        s.add(Stored(i, f"h.a > {i}", "10.0.0.2", 5000 + i, "10.0.0.2:4000", 100.0 + i))
    s.remove(2)
    s.renew([1, 3], 500.0)
    s.close()
    s = Store(tmp_path)
    assert [(x.id, x.text, x.port, x.expires) for x in s.all()] == [(1, "h.a > 1", 5001, 500.0), (3, "h.a > 3", 5003, 500.0)]
    assert s.next_id() == 4
    assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


TOPIC_SPEC = topic_spec(3, 16, "range", extra=True)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["SUB", "sub", "REGISTER", "UNREGISTER"]).flatmap(
    lambda v: st.text(alphabet=st.sampled_from("ab/+#$ WHERE<>=1TOKEN.:\t\x00é"), max_size=80).map(
        lambda t: f"{v} {t}".encode("utf-8", "replace"))))
def test_topic_requests_give_a_request_or_a_located_error(raw):
    try:
        r = parse_request(raw, TOPIC_SPEC, depth=3)
    except ProtocolError as e:
        assert 1 <= e.column <= len(raw) + 1
        assert e.message and "\n" not in e.reply("SUBERR")
        return
    assert r.topic is not None and 1 <= len([lv for lv in r.topic if lv != "#"]) + (r.topic[-1] == "#") <= 4


def test_store_keeps_labels_and_registrations(tmp_path):
    from subc.serve.store import REMOVED, TopicChanges

    s = Store(tmp_path)
    s.commit([Stored(1, "", "10.0.0.2", 5000, "10.0.0.2", None, "a/+")], [], {},
             topics=TopicChanges({"a": 1, "b": 2}, set(), 3, {("a/b", "10.0.0.9"): 12.5, ("a", "10.0.0.9"): None}))
    s.commit([], [], {}, topics=TopicChanges({"c": 3}, {"b"}, 4, {("a", "10.0.0.9"): REMOVED}))
    s.close()
    s = Store(tmp_path)
    assert s.labels() == ({"a": 1, "c": 3}, 4)
    assert s.registrations() == [("a/b", "10.0.0.9", 12.5)]
    assert s.all()[0].filter == "a/+"
    s.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(
    condition(sorted(FIELDS), FIELDS).map(lambda c: f"SUBSCRIBE {c}"),
    condition(sorted(FIELDS), FIELDS).map(lambda c: f"subscribe   {c} TO 10.0.0.9:77"),
    st.sampled_from(["SUBSCRIBE h.a > 3 and h.zz == 1", "SUBSCRIBE h.a > 3 : fwd(2)", "SUBSCRIBE h.a >",
                     'SUBSCRIBE h.a > 1 and h.a < "x;y"', "PING", "UNSUBSCRIBE 4", "FROB", "SUBSCRIBE"]),
    st.text(max_size=40).map(lambda t: f"SUBSCRIBE {t}")), min_size=1, max_size=8))
def test_requests_parsed_with_kept_shapes_equal_requests_parsed_alone(lines):
    raws = [ln.encode("utf-8", "replace") for ln in lines]
    together = parse_requests(raws, SPEC, shapes=ShapeCache(SPEC))  # shapes kept from line to line
    for raw, got in zip(raws, together):
        try:
            alone = parse_request(raw, SPEC)
        except ProtocolError as e:
            assert isinstance(got, ProtocolError) and (got.column, got.message) == (e.column, e.message), raw
            continue
        assert isinstance(got, Request), (raw, got)
        assert (got.verb, unlocated(got.condition), got.text, got.to) == \
            (alone.verb, unlocated(alone.condition), alone.text, alone.to)
        if got.condition is not None:  # locations: same columns (errors found later point into the line)
            assert [p.location.column for p in preds(got.condition)] == \
                [p.location.column + alone.column - got.column for p in preds(alone.condition)]


def preds(e):
    return [e] if isinstance(e, Pred) else [p for x in getattr(e, "items", (getattr(e, "item", None),)) if x
                                            for p in preds(x)]


def unlocated(e):
    """``e`` without source locations (they name the text parsed: one line, or the batch)."""
    if e is None:
        return None
    if isinstance(e, Pred):
        return replace(e, location=None)
    if isinstance(e, Not):
        return replace(e, item=unlocated(e.item))
    return replace(e, items=tuple(unlocated(x) for x in e.items))


# -- the daemon's listening sockets (subc serve --listen) -------------------------------------------


def test_listen_port_zero_finds_a_port_free_for_udp_and_tcp(monkeypatch):
    """With --listen HOST:0 the kernel picks UDP's port without looking at TCP's (an outgoing
    connection may hold it: seen as EADDRINUSE in CI): the daemon tries another port."""
    import errno
    import socket

    from subc.serve import network

    real = socket.socket
    failures = []

    class TakenOnce(real):
        def bind(self, addr):
            if self.type == socket.SOCK_STREAM and not failures:
                failures.append(addr)
                raise OSError(errno.EADDRINUSE, "Address already in use")
            return super().bind(addr)

    monkeypatch.setattr(network.socket, "socket", TakenOnce)
    udp, tcp, port = network.bind_udp_tcp("127.0.0.1", 0)
    try:
        assert len(failures) == 1 and udp.getsockname() == tcp.getsockname() == ("127.0.0.1", port)
    finally:
        udp.close()
        tcp.close()


def test_listen_on_a_taken_port_is_a_clear_error():
    import socket

    import pytest

    from subc.errors import SubcError
    from subc.serve.network import bind_udp_tcp

    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    try:
        with pytest.raises(SubcError, match=f"cannot listen on 127.0.0.1:{port} \\(UDP and TCP\\): Address already in use"):
            bind_udp_tcp("127.0.0.1", port)
    finally:
        held.close()
