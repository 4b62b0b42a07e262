"""``subc verify``'s comparison (subc.dataplane.p4rt.compare) on its own, against renumberings and
changes made here, on the entries.json documents of hypothesis-drawn rule sets.

* A switch holding the rule set's entries under other state numbers and multicast group ids (a
  bijection drawn here, applied to the document's JSON: state keys, ``next_state`` parameters,
  the root, ``group`` parameters and the groups) holds the rule set: no difference either way.
* One entry gone, one port of a group changed, or a state no root reaches added: a difference.
* Two rule sets of the same fields and field order: no difference only if their rules (the
  reference interpreter on the values) decide every boundary packet alike.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from subc.backends.p4.entries_doc import EntriesDoc
from subc.dataplane.p4rt.compare import compare
from subc.semantics.reference import reference_decision

from strategies import boundary_packets
from test_differential import FIELDS, SPEC
from test_p4rt_update import _compile, entries_json, rule_chain


def _state_key(table: dict) -> int | None:
    """The index of the state key of a table (named ``...subc_state``/``...subc_sN_state``)."""
    return next((j for j, k in enumerate(table["keys"]) if k["name"].endswith("_state")), None)


def renumbered(doc: dict, states: dict[int, int], groups: dict[int, int]) -> dict:
    """``doc`` with state s numbered ``states.get(s, s)`` and group g ``groups[g]``."""
    out = copy.deepcopy(doc)
    out["initial_state"] = states.get(doc["initial_state"], doc["initial_state"])
    for t in out["tables"]:
        i = _state_key(t)
        for e in t["entries"]:
            if i is not None:
                m = e["match"][i]
                m["exact"] = states.get(m["exact"], m["exact"])
            params = e.get("params", {})
            if "next_state" in params:
                params["next_state"] = states.get(params["next_state"], params["next_state"])
            if "group" in params:
                params["group"] = groups[params["group"]]
    out["multicast_groups"] = sorted(
        ({**g, "group": groups[g["group"]]} for g in out["multicast_groups"]), key=lambda g: g["group"]
    )
    return out


def _numbers(doc: dict) -> tuple[set[int], set[int]]:
    """The state numbers (but the dead state, 0) and group ids of ``doc``."""
    states = {doc["initial_state"]}
    for t in doc["tables"]:
        i = _state_key(t)
        for e in t["entries"]:
            if i is not None:
                states.add(e["match"][i]["exact"])
            states.add(e.get("params", {}).get("next_state", 0))
    return states - {0}, {g["group"] for g in doc["multicast_groups"]}


def _bijection(draw, xs: set[int], low: int) -> dict[int, int]:
    xs_sorted = sorted(xs)
    targets = draw(st.permutations(list(range(low, low + 2 * len(xs_sorted) + 1))))
    return dict(zip(xs_sorted, targets[: len(xs_sorted)]))


def typed(doc: dict) -> EntriesDoc:
    return EntriesDoc.from_json(doc)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(chain=rule_chain(n=2), data=st.data())
def test_the_same_entries_renumbered_are_the_same_and_any_change_is_seen(chain, data):
    fields, texts = chain
    rules, res = _compile(texts[0], fields)
    doc = entries_json(res.pipeline, "bmv2")
    states, groups = _numbers(doc)
    other = renumbered(doc, _bijection(data.draw, states, 1), _bijection(data.draw, groups, 1))
    assert compare(typed(other), typed(doc)) == []
    assert compare(typed(doc), typed(other)) == []

    with_entries = [(ti, k) for ti, t in enumerate(other["tables"]) for k in range(len(t["entries"]))]
    if with_entries:
        ti, k = data.draw(st.sampled_from(with_entries), label="entry removed")
        less = copy.deepcopy(other)
        del less["tables"][ti]["entries"][k]
        assert compare(typed(less), typed(doc)) != []
    if other["multicast_groups"]:
        gi = data.draw(st.integers(0, len(other["multicast_groups"]) - 1), label="group changed")
        changed = copy.deepcopy(other)
        ports = changed["multicast_groups"][gi]["ports"]
        ports[data.draw(st.integers(0, len(ports) - 1))] = max(max(ports), 100) + 1
        assert compare(typed(changed), typed(doc)) != []
    # a copy of a reachable state's entries under a number nothing leads to: left over
    keyed = [(ti, t) for ti, t in enumerate(other["tables"]) if _state_key(t) is not None and t["entries"]]
    if keyed:
        ti, t = data.draw(st.sampled_from(keyed), label="table with a stray state")
        i = _state_key(t)
        stray = copy.deepcopy(other)
        e = copy.deepcopy(t["entries"][0])
        e["match"][i]["exact"] = max(_numbers(other)[0]) + 7
        if t.get("field") in (None, other["field_order"][0] if other["field_order"] else None):
            return  # a first-stage state is an earlier root (one is kept): not a stray state
        stray["tables"][ti]["entries"].append(e)
        assert compare(typed(stray), typed(doc)) != []


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(chain=rule_chain(n=2), data=st.data())
def test_no_difference_only_between_rule_sets_that_decide_alike(chain, data):
    fields, texts = chain
    (ra, a), (rb, b) = (_compile(t, fields) for t in texts)
    assume(ra and rb)
    same = compare(typed(entries_json(a.pipeline, "bmv2")), typed(entries_json(b.pipeline, "bmv2"))) == []
    packets = list(boundary_packets(ra + rb, FIELDS, data.draw))
    alike = all(reference_decision(ra, SPEC, p) == reference_decision(rb, SPEC, p) for p in packets)
    event(f"no difference: {same}, decide alike: {alike}")
    if same:
        assert alike
    if not alike:
        assert not same
