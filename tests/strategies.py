"""Hypothesis strategies shared by the differential tests: rule sets over a table of query
fields (every comparison kind, nested and/or/not, fwd and drop actions) and packets on, below
and above every bound the rules mention."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def value_for(draw, q):
    top = q.max_value
    return draw(st.one_of(st.sampled_from([0, 1, top - 1, top, top // 2]), st.integers(0, top)))


@st.composite
def predicate(draw, fields, qs):
    name = draw(st.sampled_from(fields))
    q = qs[name]
    if q.match_kind == "range":
        op = draw(st.sampled_from(["==", "=", "!=", "<", "<=", ">", ">=", "in", "not in"]))
    else:
        op = draw(st.sampled_from(["==", "!=", "in", "not in"]))
    if op in ("<",) :
        v = draw(st.integers(1, q.max_value))  # `< 0` is allowed but empty; keep it rarer
    else:
        v = draw(value_for(q))
    def lit(v):
        if q.match_kind == "lpm" and draw(st.booleans()):
            plen = draw(st.integers(0, q.width))
            v = (v >> (q.width - plen)) << (q.width - plen) if plen else 0
            return f"{v}/{plen}"
        return str(v)
    if op in ("in", "not in"):
        vals = draw(st.lists(value_for(q), min_size=1, max_size=4))
        return f"{name} {op} {{{', '.join(lit(x) for x in vals)}}}"
    if q.match_kind == "lpm":
        return f"{name} {op} {lit(v)}"
    return f"{name} {op} {v}"


@st.composite
def condition(draw, fields, qs, depth=0):
    if depth >= 2 or draw(st.integers(0, 2)) == 0:
        return draw(predicate(fields, qs))
    kind = draw(st.sampled_from(["and", "or", "not"]))
    if kind == "not":
        return f"not ({draw(condition(fields, qs, depth + 1))})"
    parts = draw(st.lists(condition(fields, qs, depth + 1), min_size=2, max_size=3))
    return "(" + f" {kind} ".join(parts) + ")"


@st.composite
def rule_set(draw, qs, allow_drop=False, max_port=6):
    fields = draw(st.lists(st.sampled_from(sorted(qs)), min_size=2, max_size=4, unique=True))
    n = draw(st.integers(1, 8))
    rules = []
    for _ in range(n):
        cond = draw(condition(fields, qs))
        if allow_drop and draw(st.integers(0, 4)) == 0:
            act = "drop()"
        else:
            ports = draw(st.lists(st.integers(1, max_port), min_size=1, max_size=3, unique=True))
            act = f"fwd({', '.join(map(str, ports))})"
        rules.append(f"{cond} : {act};")
    return fields, "\n".join(rules)


def boundary_packets(rules, qs, draw):
    """Packets on, below and above every operand of the rules, plus random ones."""
    from subc.lang.ast import predicates

    cands = {f: {0, qs[f].max_value} for f in qs}
    for r in rules:
        for p in predicates(r.condition):
            top = qs[p.field].max_value
            for o in p.operands:
                lo, hi = o.interval(p.width)
                for v in (lo - 1, lo, lo + 1, hi - 1, hi, hi + 1):
                    if 0 <= v <= top:
                        cands[p.field].add(v)
    pkts = []
    for _ in range(40):
        pkts.append({f: draw(st.sampled_from(sorted(cands[f]))) for f in qs})
    for _ in range(5):
        pkts.append({f: draw(st.integers(0, qs[f].max_value)) for f in qs})
    return pkts


# -- comparisons on state (docs/state.md "Stateful subscriptions") ------------------------------------


@st.composite
def aggregate_comparison(draw, agg_fields, values):
    """A comparison on an aggregate of one of ``agg_fields`` (range fields of at most 32 bits)
    with a window of none, 0, 1 or 5 us, every operator, thresholds near ``values``."""
    kind = draw(st.sampled_from(["count", "sum", "avg", "min", "max"]))
    field = draw(st.sampled_from(agg_fields))
    args = [] if kind == "count" else [field]
    window = draw(st.sampled_from([None, 0, 1, 5]))
    if window is not None:
        args.append(f"window={window}")
    call = f"{kind}({', '.join(args)})"
    op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="] + ([] if kind == "avg" else ["in", "not in"])))
    if kind == "count":
        vals = st.integers(0, 6)
    elif kind == "sum":
        vals = st.sampled_from([0, 1, 5, 7, 10, 107, 200, 65535, 4294967295, 8589934590])
    else:
        vals = st.sampled_from(sorted(set(values[field]) | {3, 4}))
    return _state_comparison_text(draw, call, op, vals)


def _state_comparison_text(draw, ref: str, op: str, vals) -> str:
    """``ref op value`` (sometimes written value-first, flipped), or ``ref op {values}`` for
    ``in`` and ``not in``, with values drawn from the strategy ``vals``."""
    if op in ("in", "not in"):
        return f"{ref} {op} {{{', '.join(str(v) for v in draw(st.lists(vals, min_size=1, max_size=3)))}}}"
    v = draw(vals)
    if draw(st.booleans()):
        flipped = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op)
        return f"{v} {flipped} {ref}"
    return f"{ref} {op} {v}"


@st.composite
def stateful_condition(draw, fields, agg_fields, values, depth=0):
    if depth >= 2 or draw(st.integers(0, 2)) == 0:
        if draw(st.integers(0, 2)) == 0:
            return draw(predicate(sorted(fields), fields))
        return draw(aggregate_comparison(agg_fields, values))
    kind = draw(st.sampled_from(["and", "and", "or", "not"]))
    if kind == "not":
        return f"not ({draw(stateful_condition(fields, agg_fields, values, depth + 1))})"
    parts = draw(st.lists(stateful_condition(fields, agg_fields, values, depth + 1), min_size=2, max_size=3))
    return "(" + f" {kind} ".join(parts) + ")"


@st.composite
def stateful_rules(draw, fields, agg_fields, values, max_rules=5):
    """1 to ``max_rules`` rules mixing predicates on ``fields`` with comparisons on aggregates."""
    rules = []
    for _ in range(draw(st.integers(1, max_rules))):
        cond = draw(stateful_condition(fields, agg_fields, values))
        if draw(st.booleans()):  # the paper's shape: a header predicate and an aggregate
            cond = f"{draw(predicate(sorted(fields), fields))} and {draw(aggregate_comparison(agg_fields, values))}"
        ports = draw(st.lists(st.integers(1, 6), min_size=1, max_size=2, unique=True))
        rules.append(f"{cond} : fwd({', '.join(map(str, ports))});")
    return "\n".join(rules)


@st.composite
def timed_messages(draw, values, time_field, max_messages=40):
    """(time in ns, message) pairs with fields from ``values`` and the time in ``time_field``: steps
    onto, before and after window boundaries (1 and 5 us, 2 us), sometimes back in time."""
    t = draw(st.integers(0, 3000))
    out = []
    for _ in range(draw(st.integers(1, max_messages))):
        t = max(0, t + draw(st.sampled_from([0, 1, 999, 1000, 1001, 2000, 4999, 5000, -1, -1000])))
        msg = {f: draw(st.sampled_from(vs)) for f, vs in values.items()}
        msg[time_field] = t
        out.append((t, msg))
    return out


# -- named counters (docs/state.md "Stateful subscriptions") ------------------------------------------


@st.composite
def counter_comparison(draw, counters):
    """A comparison on one of the named ``counters``: by its bare name or as Camus's ``count(c)``,
    every operator, values 0 to 6 (crossed by a few updates) or large ones (sums of fields)."""
    name = draw(st.sampled_from(counters))
    ref = name if draw(st.integers(0, 3)) else f"count({name})"
    vals = st.sampled_from([0, 1, 2, 3, 4, 6, 255, 300, 65535])
    op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "in", "not in"]))
    return _state_comparison_text(draw, ref, op, vals)


@st.composite
def counter_condition(draw, fields, agg_fields, values, counters, depth=0):
    if depth >= 2 or draw(st.integers(0, 2)) == 0:
        pick = draw(st.integers(0, 4))
        if pick <= 1:
            return draw(predicate(sorted(fields), fields))
        if pick == 2 and agg_fields:
            return draw(aggregate_comparison(agg_fields, values))
        return draw(counter_comparison(counters))
    kind = draw(st.sampled_from(["and", "and", "or", "not"]))
    if kind == "not":
        return f"not ({draw(counter_condition(fields, agg_fields, values, counters, depth + 1))})"
    parts = draw(st.lists(counter_condition(fields, agg_fields, values, counters, depth + 1), min_size=2, max_size=3))
    return "(" + f" {kind} ".join(parts) + ")"


@st.composite
def counter_rules(draw, fields, agg_fields, values, counters, add_fields, max_rules=5):
    """1 to ``max_rules`` rules over header ``fields``, aggregates of ``agg_fields`` and the named
    ``counters``, whose actions forward and update counters: ``inc(c)``, ``c <- count()``,
    ``c <- sum(f)`` of one of ``add_fields``; some rules only update (the rate-limit shape
    ``f == x and c < n : fwd(p), inc(c)`` is drawn often)."""
    rules = []
    for _ in range(draw(st.integers(1, max_rules))):
        if draw(st.integers(0, 2)) == 0:
            c = draw(st.sampled_from(counters))
            cond = f"{draw(predicate(sorted(fields), fields))} and {c} < {draw(st.integers(1, 4))}"
            acts = [f"fwd({draw(st.integers(1, 6))})", f"inc({c})"]
        else:
            cond = draw(counter_condition(fields, agg_fields, values, counters))
            acts = []
            if draw(st.integers(0, 3)):
                ports = draw(st.lists(st.integers(1, 6), min_size=1, max_size=2, unique=True))
                acts.append(f"fwd({', '.join(map(str, ports))})")
            for _ in range(draw(st.integers(0 if acts else 1, 2))):
                c = draw(st.sampled_from(counters))
                acts.append(draw(st.sampled_from([f"inc({c})", f"{c} <- count()",
                                                  f"{c} <- sum({draw(st.sampled_from(add_fields))})"])))
        rules.append(f"{cond} : {', '.join(acts)};")
    return "\n".join(rules)


def counter_probe(data, spec, messages, counters, add_fields, cond_field, fixed=None) -> str:
    """A rule set that updates one of the named ``counters`` (``inc``, ``count()`` or ``sum`` of
    one of ``add_fields``) on the messages whose ``cond_field`` (an exact field) differs from a
    drawn value, and compares it with ``==`` against 1 to 3 values it takes on ``messages`` ((time
    ns, message) pairs, completed by ``fixed``) or one off: an update that adds too much or too
    little, or a window moved at the wrong time, changes some decision.  The values come from
    :class:`~subc.semantics.stateful_reference.StatefulReference` run on the update rule alone."""
    from subc.lang.rules import parse_rules
    from subc.semantics.stateful_reference import StatefulReference

    c = data.draw(st.sampled_from(counters))
    adds = ["inc({c})", "{c} <- count()"] + [f"{{c}} <- sum({f})" for f in add_fields]
    update = f"{cond_field} != {data.draw(st.integers(0, 2))} : {data.draw(st.sampled_from(adds)).format(c=c)};"
    ref = StatefulReference(parse_rules(update, spec, "probe.sub"), spec)
    seen = set()
    for t, msg in messages:
        seen.add(ref.counter(c, t))
        ref.decide({**(fixed or {}), **msg}, t)
    near = sorted({max(0, v + d) for v in seen for d in (-1, 0, 1)})
    thresholds = data.draw(st.lists(st.sampled_from(near), min_size=1, max_size=3, unique=True))
    return update + "".join(f"\n{c} == {x} : fwd({i + 1});" for i, x in enumerate(thresholds))
