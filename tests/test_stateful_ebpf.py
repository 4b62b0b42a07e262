"""Comparisons on state in the eBPF program (docs/state.md "Stateful subscriptions"), in the kernel.

Hypothesis draws rule sets that mix header predicates with aggregates and timed message
sequences (times in a message field the spec names with ``query_time``, so the test controls
them, stepping onto and around window boundaries); each rule set is compiled, loaded and every
frame run through XDP with BPF_PROG_TEST_RUN in order.  The leaf each frame reaches must carry
the decision :class:`~subc.semantics.stateful_reference.StatefulReference` gives it.  Frames are
built from the values with scapy.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebpf_util import DIFF_SPEC_TEXT, Runner, compile_ebpf, diff_frame, fake_subscribers, need_root
from strategies import counter_probe, counter_rules, stateful_rules, timed_messages
from subc.spec.front_end import parse_spec
from subc.semantics.stateful_reference import StatefulReference

SPEC = parse_spec(DIFF_SPEC_TEXT + "@pragma query_time(m.g, ns)\n", "stateful_ebpf.p4")
SPEC_ARRIVAL = parse_spec(DIFF_SPEC_TEXT, "stateful_ebpf_arrival.p4")
FIELDS = {n: SPEC.query_fields[n] for n in ("m.a", "m.b", "m.c", "m.e")}
VALUES = {"m.a": [0, 1, 2, 5, 255], "m.b": [0, 3, 7, 100, 65535], "m.c": [0, 1, 2], "m.e": [0, 10, 20, 4294967295]}
FIXED = {"m.h": 0, "m.f": 0, "m.d": 0, "ip.dstAddr": 0x01020304}
SUBS = fake_subscribers()


def run_in_kernel(spec, text, messages):
    from subc.dataplane.ebpf.broker import LoadedFilter

    rules, doc, src = compile_ebpf(text, spec)
    lf = LoadedFilter.build(doc, src, SUBS, max_endpoints=8)
    try:
        run = Runner(lf)
        ref = StatefulReference(rules, spec)
        out = []
        for i, (t, msg) in enumerate(messages):
            pkt = {**FIXED, **msg}
            want = ref.decide(pkt, t)
            _, _, leaf = run.run(diff_frame(pkt))
            assert leaf is not None, f"frame {i} not classified"
            got = run.decision(leaf)
            assert got == want, f"{text}\nmessage {i} at {t} ns {msg}: reference {want}, XDP {got}"
            out.append(got)
        return out
    finally:
        lf.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stateful_rules(FIELDS, ["m.a", "m.b", "m.e"], VALUES, max_rules=4), timed_messages(VALUES, "m.g", 30))
def test_xdp_agrees_with_reference_over_time(text, messages):
    need_root()
    run_in_kernel(SPEC, text, messages)


def test_paper_rule_in_the_kernel():
    """``m.c == 1 and avg(m.e) > 10`` with 1 us windows: the decisions follow the window's
    average of the m.c == 1 messages, this message included."""
    need_root()
    text = "m.c == 1 and avg(m.e, window=1) > 10 : fwd(1);"
    rows = [(0, 1, 5), (1, 1, 20), (2, 0, 99), (3, 1, 10), (999, 1, 0), (1000, 1, 11), (1001, 1, 9), (1002, 1, 11)]
    msgs = [(t, {"m.a": 0, "m.b": 0, "m.c": c, "m.e": e, "m.g": t}) for t, c, e in rows]
    got = run_in_kernel(SPEC, text, msgs)
    # averages: 5, 12.5, -, 11.67, 8.75 | 11, 10, 10.33
    assert [d.ports for d in got] == [(), (1,), (), (1,), (), (1,), (), (1,)]


def test_arrival_time_with_a_window_that_never_ends():
    """Without a time field the program reads bpf_ktime_get_ns; with window=0 the decisions do not
    depend on it: ``count() >= 3`` holds from the third classified message on."""
    need_root()
    text = "m.c == 1 and count(window=0) >= 3 : fwd(2);"
    msgs = [(0, {"m.a": 0, "m.b": 0, "m.c": c, "m.e": 0, "m.g": 0}) for c in (1, 0, 1, 1, 0, 1)]
    got = run_in_kernel(SPEC_ARRIVAL, text, msgs)
    assert [d.ports for d in got] == [(), (), (), (2,), (), (2,)]


COUNTERS = "@pragma query_counter(c0, 1)\n@pragma query_counter(c1, 5)\n@pragma query_field_counter(c2, 0)\n"
SPEC_COUNTERS = parse_spec(DIFF_SPEC_TEXT + "@pragma query_time(m.g, ns)\n" + COUNTERS, "counters_ebpf.p4")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counter_rules(FIELDS, ["m.a", "m.b"], VALUES, ["c0", "c1", "c2"], ["m.a", "m.e"], max_rules=4),
       timed_messages(VALUES, "m.g", 30))
def test_xdp_named_counters_agree_with_reference_over_time(text, messages):
    """Named counters in the kernel: read before the stages on state values, updated after the
    last stage by the leaf's updates (``subc_cnt``), under the counter's lock."""
    need_root()
    run_in_kernel(SPEC_COUNTERS, text, messages)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_xdp_counter_values_are_exact(data):
    """A counter summed or counted by one rule and compared with ``==`` by others, against values
    it takes on the sequence (and one off): an update that adds too much or too little, or a
    window moved at the wrong time, changes some decision."""
    need_root()
    messages = data.draw(timed_messages(VALUES, "m.g", 20))
    text = counter_probe(data, SPEC_COUNTERS, messages, ["c0", "c1", "c2"], ["m.a", "m.b"], "m.c", FIXED)
    run_in_kernel(SPEC_COUNTERS, text, messages)


def test_aggregate_a_message_does_not_update_keeps_its_window():
    """Time going back: a message of an earlier window that does not update the aggregate leaves
    it alone (docs/state.md "Stateful subscriptions", rule 1), so the later window goes on counting."""
    need_root()
    text = "m.c == 1 and count(window=1) >= 2 : fwd(1);"
    rows = [(1000, 1), (1001, 1), (500, 2), (1002, 1), (2000, 1)]
    msgs = [(t, {"m.a": 0, "m.b": 0, "m.c": c, "m.e": 0, "m.g": t}) for t, c in rows]
    got = run_in_kernel(SPEC, text, msgs)
    assert [d.ports for d in got] == [(), (1,), (), (1,), ()]


def test_counters_updated_and_never_compared_in_the_kernel():
    """Counters no rule compares: the program has no state-value stage, and the fields the updates
    add are loaded after the last header stage (a CI draw once found them undeclared)."""
    need_root()
    text = "m.a == 0 : c0 <- sum(m.b);\nm.c == 1 : fwd(1), inc(c1);"
    rows = [(0, 0, 7, 1), (1, 0, 3, 0), (2, 5, 1, 1)]
    msgs = [(t, {"m.a": a, "m.b": b, "m.c": c, "m.e": 0, "m.g": t}) for t, a, b, c in rows]
    got = run_in_kernel(SPEC_COUNTERS, text, msgs)
    assert [d.ports for d in got] == [(1,), (), (1,)]


def test_rate_limit_in_the_kernel():
    """``m.c == 1 and c0 < 2 : fwd(1), inc(c0)`` with 1 us windows forwards the first two
    m.c == 1 messages of each window; ``c2`` (never ending) sums m.e of the m.c == 2 messages and
    ``c2 >= 30`` forwards to port 3 once earlier messages brought it there."""
    need_root()
    text = ("m.c == 1 and c0 < 2 : fwd(1), inc(c0);\n"
            "m.c == 2 : c2 <- sum(m.e);\n"
            "c2 >= 30 : fwd(3);")
    rows = [(0, 1, 0), (1, 1, 0), (2, 1, 0), (3, 2, 20), (999, 1, 0), (1000, 1, 0), (1001, 2, 10), (1002, 1, 0),
            (1003, 1, 0)]
    msgs = [(t, {"m.a": 0, "m.b": 0, "m.c": c, "m.e": e, "m.g": t}) for t, c, e in rows]
    got = run_in_kernel(SPEC_COUNTERS, text, msgs)
    assert [d.ports for d in got] == [(1,), (1,), (), (), (), (1,), (), (1, 3), (3,)]


def test_update_refuses_more_thresholds_than_the_program_searches():
    """A state-value stage's binary search is as long as its thresholds need plus 3 steps (at least
    4): a rule set with more thresholds on that value is refused by an update (the live generation
    keeps deciding), and loads on its own."""
    need_root()
    from subc.errors import SubcError
    from subc.dataplane.ebpf.broker import LoadedFilter

    _, few, src = compile_ebpf("m.c == 1 and c0 > 1 : fwd(1);\nm.c == 1 : inc(c0);", SPEC_COUNTERS)
    many_text = "\n".join(f"m.c == 1 and c0 == {x} : fwd({1 + x % 6});" for x in range(20)) + "\nm.c == 1 : inc(c0);"
    _, many, _ = compile_ebpf(many_text, SPEC_COUNTERS)
    with LoadedFilter.build(few, src, SUBS, max_endpoints=8) as lf:
        with pytest.raises(SubcError, match="runs per state"):
            lf.update(many)
    assert run_in_kernel(SPEC_COUNTERS, many_text, [(0, {"m.a": 0, "m.b": 0, "m.c": 1, "m.e": 0, "m.g": 0})])
