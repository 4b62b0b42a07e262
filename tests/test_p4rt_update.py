"""Generation-safe P4Runtime updates (subc.runtime.p4rt.plan, .control) without a switch.

(Also on multi-message programs of random P4_14 and P4_16 specs: each message slot's tables,
checked every few updates, classify as A until the root switch and as B after it.)

* The plan: for hypothesis-drawn rule sets A and B (B shares A's fields and field order), the
  updates that take a switch holding A to B are applied one at a time, in an order shuffled
  within each phase (a WriteRequest may apply its updates in any order); after every single
  update, packets on every rule operand's boundaries are classified by the tables the switch
  would hold: exactly as A's rules say (evaluated on the values by the reference interpreter)
  until the root switch, exactly as B's after it.  Nothing of A is left at the end.
* The client: a P4Runtime server written here (grpcio on loopback, the ``p4runtime`` service)
  records every WriteRequest of ``subc load`` and ``subc update`` and applies them to its own
  tables; the load's requests decode (from protobuf fields alone) to exactly entries.json, the
  root written alone in the last request; the update's requests are inserts, then one request
  holding only the root's MODIFY, then deletes; the tables the server holds afterwards
  classify as B's rules say.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from subc.compiler.driver import compile_rules
from subc.compiler.rules import parse_rules
from subc.compiler.targets import target_files
from subc.compiler.targets.entries import entries_json
from subc.errors import SubcError
from subc.runtime.reference import reference_decision
from subc.runtime.simulator import TableSimulator

from ebpf_util import DIFF_SPEC
from strategies import boundary_packets, condition
from test_differential import FIELDS, SPEC
from p4rt_fake import FakeSwitch
from test_p4rt_requests import decode


@st.composite
def rule_pair(draw, qs=FIELDS):
    """(fields, rules A, rules B): B keeps some of A's rules and adds others over the same fields."""
    fields = draw(st.lists(st.sampled_from(sorted(qs)), min_size=2, max_size=4, unique=True))

    def rules(n):
        out = []
        for _ in range(n):
            ports = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3, unique=True))
            out.append(f"{draw(condition(fields, qs))} : fwd({', '.join(map(str, ports))});")
        return out
    a = rules(draw(st.integers(1, 7)))
    kept = [r for r in a if draw(st.booleans())]
    b = kept + rules(draw(st.integers(0 if kept else 1, 3)))
    return fields, "\n".join(a), "\n".join(b)


def _compile(text: str, fields: list[str], spec=SPEC, target="bmv2"):
    rules = parse_rules(text, spec, "r.sub")
    try:
        return rules, compile_rules(rules, spec, target, field_order=fields)
    except SubcError as e:
        assume("conflicting actions" not in e.message)
        raise


def _key(e: dict) -> str:
    return json.dumps([e["match"], e.get("priority")])


def _held(doc: dict, tables: dict, root: int, groups: dict) -> dict:
    """The entries.json document of what a switch with ``tables`` ({name: {key: entry}}) and
    ``groups`` ({id: ports}) holds."""
    return {**doc, "initial_state": root, "tables": [{**t, "entries": list(tables[t["name"]].values())}
                                                      for t in doc["tables"]],
            "multicast_groups": [{"group": g, "ports": p} for g, p in sorted(groups.items())]}


def _expect(rules, pkt):
    return reference_decision(rules, SPEC, pkt)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(rule_pair(), st.data())
def test_every_step_of_an_update_classifies_as_one_rule_set(pair, data):
    from subc.runtime.p4rt.plan import plan_update

    fields, text_a, text_b = pair
    rules_a, res_a = _compile(text_a, fields)
    rules_b, res_b = _compile(text_b, fields)
    doc_a, doc_b = entries_json(res_a.pipeline, "bmv2"), entries_json(res_b.pipeline, "bmv2")
    try:
        plan = plan_update(doc_a, doc_b)
    except SubcError as e:
        # B needs another program (a field A does not use, another last stage) or more states
        assert "reload the switch" in e.message, e.render()
        event("refused: another program")
        return
    event(f"applied: root {'switched' if plan.root is not None else 'kept'}")
    packets = list(boundary_packets(rules_a + rules_b, FIELDS, data.draw))
    want_a = [_expect(rules_a, p) for p in packets]
    want_b = [_expect(rules_b, p) for p in packets]
    tables = {t["name"]: {_key(e): e for e in t["entries"]} for t in doc_a["tables"]}
    root = doc_a["initial_state"]
    rnd = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    inserts, deletes = list(plan.inserts), list(plan.deletes)
    rnd.shuffle(inserts)
    rnd.shuffle(deletes)
    groups = {g["group"]: g["ports"] for g in doc_a["multicast_groups"]}
    steps = [("group", g) for g in plan.group_inserts] + [("insert", x) for x in inserts] + ([("root", plan.root)] if plan.root is not None else []) + \
        [("delete", x) for x in deletes] + [("ungroup", g) for g in plan.group_deletes]

    def check(switched: bool):
        sim = TableSimulator(_held(doc_a, tables, root, groups))
        want = want_b if switched else want_a
        for pkt, w in zip(packets, want):
            assert sim.process(pkt) == w, (f"A:\n{text_a}\nB:\n{text_b}\npacket {pkt}: "
                                           f"{'after' if switched else 'before'} the root switch")

    check(False)
    switched = plan.root is None
    for kind, x in steps:
        if kind == "insert":
            t, e = x
            assert _key(e) not in tables[t], f"INSERT of an entry {t} already holds"
            tables[t][_key(e)] = e
        elif kind == "delete":
            t, e = x
            assert tables[t].pop(_key(e)) == e
        elif kind == "group":
            assert x["group"] not in groups
            groups[x["group"]] = x["ports"]
        elif kind == "ungroup":
            del groups[x]
        else:
            root, switched = x, True
        check(switched)
    assert switched
    # nothing of A left: every entry held is one of B's (as the plan renumbered it)
    final = {t["name"]: {_key(e): e for e in t["entries"]} for t in plan.doc["tables"]}
    assert tables == final and root == plan.doc["initial_state"]
    assert groups == {g["group"]: g["ports"] for g in plan.doc["multicast_groups"]}
    assert plan.writes == len(steps)


def test_an_unchanged_rule_set_writes_nothing():
    from subc.runtime.p4rt.plan import plan_update

    fields = ["h.a", "h.c"]
    _, res = _compile("h.a > 5 and h.c == 3 : fwd(1);\nh.a < 9 : fwd(2, 3);", fields)
    doc = entries_json(res.pipeline, "bmv2")
    plan = plan_update(doc, json.loads(json.dumps(doc)))
    assert plan.writes == 0 and plan.root is None


def test_another_program_is_refused():
    from subc.runtime.p4rt.plan import plan_update

    _, ra = _compile("h.a > 5 and h.c == 3 : fwd(1);", ["h.a", "h.c"])
    _, rb = _compile("h.a > 5 and h.c == 3 : fwd(1);", ["h.c", "h.a"])
    with pytest.raises(SubcError, match="reload the switch"):
        plan_update(entries_json(ra.pipeline, "bmv2"), entries_json(rb.pipeline, "bmv2"))


# -- a P4Runtime server in the test ----------------------------------------------------------


def _write_out(tmp_path, name: str, files: dict):
    d = tmp_path / name
    d.mkdir()
    for n, text in files.items():
        (d / n).write_text(text)
    return d


PAIRS = [
    (["m.a", "m.b", "m.c"], "m.a > 5 and m.c == 7 : fwd(1);\nm.b < 100 : fwd(2, 3);",
     "m.a > 5 and m.c == 7 : fwd(1);\nm.b < 100 : fwd(2, 3);\nm.a > 50 and m.c == 9 : fwd(4, 5);"),
    (["m.d", "m.e"], "m.e > 3 and m.d == 3 : fwd(4);\nm.e < 1000 : fwd(1, 2);",
     "m.e > 30 and m.d == 3 : fwd(4);\nm.e < 1000 : fwd(1, 2);\nm.d == 9 : fwd(4);"),
]


@pytest.mark.parametrize("fields,text_a,text_b", PAIRS)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_load_and_update_requests_captured_from_a_p4runtime_server(fields, text_a, text_b, data):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        _load_and_update(Path(d), fields, text_a, text_b, data)


def _load_and_update(tmp_path, fields, text_a, text_b, data):
    from p4.v1 import p4runtime_pb2 as pr

    from subc.runtime.p4rt.control import load, stats, update, verify
    from subc.runtime.p4rt.requests import read_p4info

    outs, rules = {}, {}
    for name, text in (("a", text_a), ("b", text_b)):
        rules[name] = parse_rules(text, DIFF_SPEC, "r.sub")
        res = compile_rules(rules[name], DIFF_SPEC, "bmv2", field_order=fields, state_bits=6)
        files, _ = target_files(res, "r.sub")
        outs[name] = _write_out(tmp_path, name, files)
    (tmp_path / "prog.json").write_text("{}")
    sw = FakeSwitch()
    try:
        load(str(outs["a"]), sw.addr, config=str(tmp_path / "prog.json"))
        doc_a = json.loads((outs["a"] / "entries.json").read_text())
        info = read_p4info((outs["a"] / "p4info.txtpb").read_text())
        *inserts, last = sw.requests
        got, groups = decode([u for r in inserts for u in r.updates], info)
        dump = lambda e: json.dumps(e, sort_keys=True)  # noqa: E731
        want = {t["name"]: sorted(map(dump, t["entries"])) for t in doc_a["tables"] if t["entries"]}
        assert {n: sorted(map(dump, es)) for n, es in got.items()} == want
        assert groups == {g["group"]: g["ports"] for g in doc_a["multicast_groups"]}
        assert len(last.updates) == 1 and last.updates[0].type == pr.Update.MODIFY
        root = last.updates[0].entity.table_entry
        assert root.is_default_action and int.from_bytes(root.action.action.params[0].value, "big") == doc_a["initial_state"]
        assert verify(str(outs["a"]), sw.addr) == []
        assert verify(str(outs["b"]), sw.addr) != []
        n = len(sw.requests)
        w = update(str(outs["b"]), sw.addr, grace=0)
        reqs = sw.requests[n:]
        kinds = [{u.type for u in r.updates} for r in reqs]
        roots = [i for i, r in enumerate(reqs) if any(u.entity.table_entry.is_default_action for u in r.updates)]
        assert len(roots) == 1 and len(reqs[roots[0]].updates) == 1
        assert all(k == {pr.Update.INSERT} for k in kinds[:roots[0]])
        assert all(k == {pr.Update.DELETE} for k in kinds[roots[0] + 1:])
        assert sum(len(r.updates) for r in reqs) == w.total == w.plan.writes
        assert sw.errors == []
        assert verify(str(outs["b"]), sw.addr) == []
        assert sum(stats(sw.addr)["tables"].values()) == len(sw.entries)
        # what the server holds classifies as B's rules say (decoded by this test)
        doc_b = json.loads((outs["b"] / "entries.json").read_text())
        held, groups = decode([pr.Update(type=pr.Update.INSERT, entity=pr.Entity(table_entry=te))
                               for te in sw.entries.values()], info)
        root_b = int.from_bytes(sw.defaults[root.table_id].action.action.params[0].value, "big")
        sim_doc = {**doc_b, "initial_state": root_b, "multicast_groups":
                   [{"group": g, "ports": p} for g, p in sw_groups(sw).items()],
                   "tables": [{**t, "entries": held.get(t["name"], [])} for t in doc_b["tables"]]}
        sim = TableSimulator(sim_doc)
        qs = {q.name: q for q in DIFF_SPEC.query_fields.values()}
        for pkt in boundary_packets(rules["a"] + rules["b"], qs, data.draw):
            assert sim.process(pkt) == reference_decision(rules["b"], DIFF_SPEC, pkt), pkt
    finally:
        sw.stop()


def sw_groups(sw: FakeSwitch) -> dict:
    return {g.multicast_group_id: [r.egress_port for r in g.replicas] for g in sw.groups.values()}


def test_unreachable_server_is_a_clear_error(tmp_path):
    import socket

    from subc.runtime.p4rt.control import load

    res = compile_rules(parse_rules("m.e > 3 : fwd(4);", DIFF_SPEC, "r.sub"), DIFF_SPEC, "bmv2")
    files, _ = target_files(res, "r.sub")
    out = _write_out(tmp_path, "a", files)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SubcError, match="did not answer"):
        load(str(out), f"127.0.0.1:{port}")


# -- multi-message programs of random specs ----------------------------------------------------


def _slot_views(doc: dict, tables: dict, root: int, groups: dict) -> list[dict]:
    """One document per message slot: slot ``i``'s held entries in slot 0's table definitions
    (the table simulator runs slot 0's pipeline)."""
    def base(t):
        return t["name"].split(".", 1)[1][len(f"subc_s{t['slot']}_"):]
    slot0 = {base(t): t for t in doc["tables"] if t.get("slot") == 0}
    views = []
    for i in sorted({t["slot"] for t in doc["tables"] if "slot" in t}):
        mine = {base(t): t["name"] for t in doc["tables"] if t.get("slot") == i}
        ts = [{**t0, "entries": list(tables[mine[b]].values())} for b, t0 in slot0.items()]
        views.append({**doc, "initial_state": root, "tables": ts,
                      "multicast_groups": [{"group": g, "ports": p} for g, p in sorted(groups.items())]})
    return views


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                   HealthCheck.filter_too_much])
@given(data=st.data(), form=st.sampled_from(["p4_14", "p4_16"]))
def test_updates_of_multi_message_programs_of_random_specs(data, form):
    """Random specs (P4_14 and P4_16 forms, other field names and layouts) framed by MoldUDP64,
    programs of 1 to 4 message slots: every message slot classifies as A, then as B."""
    from spec_model import spec_models
    from test_delivery_differential import RENDER, rule_sets

    from subc.compiler.spec import parse_spec
    from subc.runtime.p4rt.plan import plan_update

    model = data.draw(spec_models())
    assume(model.query_fields)
    spec = parse_spec(RENDER[form](model), "m.p4")
    lines_a = data.draw(rule_sets(model)).splitlines()
    lines_b = [line for line in lines_a if data.draw(st.booleans())] + data.draw(rule_sets(model)).splitlines()[:1]
    rules_a, rules_b = parse_rules("\n".join(lines_a), spec, "a.sub"), parse_rules("\n".join(lines_b), spec, "b.sub")
    try:
        res_a = compile_rules(rules_a, spec, "bmv2", state_bits=8)
        res_b = compile_rules(rules_b, spec, "bmv2", field_order=res_a.ir.field_order, state_bits=8)
    except SubcError:  # conflicting actions, or B uses a field A's order lacks
        event("not compiled")
        assume(False)
    slots = data.draw(st.integers(1, 4))
    doc_a = json.loads(target_files(res_a, "a.sub", max_messages=slots)[0]["entries.json"])
    doc_b = json.loads(target_files(res_b, "b.sub", max_messages=slots)[0]["entries.json"])
    assume("messages" in doc_a and "messages" in doc_b)
    try:
        plan = plan_update(doc_a, doc_b)
    except SubcError as e:
        assert "reload the switch" in e.message, e.render()
        event("refused: another program")
        return
    event(f"applied: {slots} slots")
    qs = {q.name: q for q in spec.query_fields.values()}
    packets = list(boundary_packets(rules_a + rules_b, qs, data.draw))[:20]
    want = {False: [reference_decision(rules_a, spec, p) for p in packets],
            True: [reference_decision(rules_b, spec, p) for p in packets]}
    tables = {t["name"]: {_key(e): e for e in t["entries"]} for t in doc_a["tables"]}
    groups = {g["group"]: g["ports"] for g in doc_a["multicast_groups"]}
    root, switched = doc_a["initial_state"], plan.root is None
    rnd = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    inserts, deletes = list(plan.inserts), list(plan.deletes)
    rnd.shuffle(inserts)
    rnd.shuffle(deletes)
    steps = [("insert", x) for x in inserts] + [("root", plan.root)] + [("delete", x) for x in deletes]

    def check():
        for view in _slot_views(doc_a, tables, root, groups):
            sim = TableSimulator(view)
            for pkt, w in zip(packets, want[switched]):
                assert sim.process(pkt) == w, (lines_a, lines_b, pkt, switched)

    check()
    for i, (kind, x) in enumerate(steps):
        if kind == "insert":
            tables[x[0]][_key(x[1])] = x[1]
        elif kind == "delete":
            del tables[x[0]][_key(x[1])]
        elif x is not None:
            root, switched = x, True
        if i % 7 == 0 or kind == "root":  # every few steps: the slots' simulators are the cost
            check()
    check()
