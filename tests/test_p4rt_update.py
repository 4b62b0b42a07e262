"""Generation-safe P4Runtime updates (subc.dataplane.p4rt.plan, .control) without a switch.

(Also on multi-message programs of random P4_14 and P4_16 specs: each message slot's tables,
checked every few updates, classify as A until the root switch and as B after it.)

* The plan: for hypothesis-drawn rule sets A, B and C (each sharing the fields and field order of
  the one before), a switch loaded with A (with or without the spare root) is updated to B, then
  to C (whose root is written into the spare by difference); each update is applied one write at
  a time, in an order shuffled within each phase (a WriteRequest may apply its updates in any
  order); after every single write, packets on every rule operand's boundaries are classified by
  the tables the switch would hold: exactly as the earlier rule set's rules say (evaluated on the
  values by the reference interpreter) until the root switch, exactly as the later one's after
  it.  Nothing of the earlier rule set is left at the end but its root's entries (the spare).
* The client: a P4Runtime server written here (grpcio on loopback, the ``p4runtime`` service)
  records every WriteRequest of ``subc load`` and ``subc update`` and applies them to its own
  tables; the load's requests decode (from protobuf fields alone) to exactly entries.json and a
  copy of the root's entries under one other state, the root written alone in the last request;
  the update's requests are new groups, the spare's deletions, inserts and modifications, then
  one request holding only the root's MODIFY, then deletes; the tables the server holds
  afterwards classify as B's rules say.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.backends.files import target_files
from subc.backends.p4.entries import entries_doc
from subc.backends.p4.entries_doc import EntriesDoc
from subc.errors import SubcError
from subc.semantics.reference import reference_decision
from subc.sim.switch import TableSimulator

from ebpf_util import DIFF_SPEC
from strategies import boundary_packets, condition
from test_differential import FIELDS, SPEC
from p4rt_fake import FakeSwitch
from test_p4rt_requests import decode


@st.composite
def rule_chain(draw, qs=FIELDS, n: int = 3):
    """(fields, [rules A, B, ...]): each rule set keeps some of the previous one's rules and adds
    others over the same fields."""
    fields = draw(st.lists(st.sampled_from(sorted(qs)), min_size=2, max_size=4, unique=True))

    def rules(n):
        out = []
        for _ in range(n):
            ports = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3, unique=True))
            out.append(f"{draw(condition(fields, qs))} : fwd({', '.join(map(str, ports))});")
        return out
    chain = [rules(draw(st.integers(1, 7)))]
    while len(chain) < n:
        kept = [r for r in chain[-1] if draw(st.booleans())]
        chain.append(kept + rules(draw(st.integers(0 if kept else 1, 3))))
    return fields, ["\n".join(r) for r in chain]


def _compile(text: str, fields: list[str], spec=SPEC, target="bmv2"):
    rules = parse_rules(text, spec, "r.sub")
    try:
        return rules, compile_rules(rules, spec, target, field_order=fields)
    except SubcError as e:
        assume("conflicting actions" not in e.message)
        raise


def _key(e: dict) -> str:
    return json.dumps([e["match"], e.get("priority")])


def typed(doc: dict) -> EntriesDoc:
    """The model's entries.json (a dict) as the control plane reads it."""
    return EntriesDoc.from_json(doc)


def entries_json(pipe, target: str) -> dict:
    """The compiled entries.json document, as the model holds it (a dict)."""
    return entries_doc(pipe, target).to_json()


def _held(doc: dict, tables: dict, root: int, groups: dict) -> dict:
    """The entries.json document of what a switch with ``tables`` ({name: {key: entry}}) and
    ``groups`` ({id: ports}) holds."""
    return {**doc, "initial_state": root, "tables": [{**t, "entries": list(tables[t["name"]].values())}
                                                      for t in doc["tables"]],
            "multicast_groups": [{"group": g, "ports": p} for g, p in sorted(groups.items())]}


def _expect(rules, pkt):
    return reference_decision(rules, SPEC, pkt)


def _root_rows(doc: dict, tables: dict, root: int) -> dict:
    """{table: {key: entry}} of the entries under state ``root`` in the first stage's tables
    (read here from the keys' names: the state key is ``...subc_state``/``...subc_sN_state``)."""
    out = {}
    first = doc["field_order"][0] if doc["field_order"] else None
    for t in doc["tables"]:
        i = next((j for j, k in enumerate(t["keys"]) if k["name"].endswith("_state")), None)
        if i is None or t.get("field") not in (None, first):
            continue
        out[t["name"]] = {k: e for k, e in tables[t["name"]].items() if e["match"][i]["exact"] == root}
    return out


def _apply_steps(doc, tables, root, groups, plan, check, rnd):
    """Apply ``plan`` to the switch held in ``tables``/``root``/``groups`` one update at a time,
    each phase shuffled, ``check(switched, root)`` after every update; returns the new root."""
    js = lambda xs: [(t, e.to_json()) for t, e in xs]  # noqa: E731 - the model holds entries as entries.json has them
    phases = [[("group", {"group": g, "ports": list(p)}) for g, p in plan.group_inserts],
              [("delete", x) for x in js(plan.spare_deletes)],
              [("insert", x) for x in js(plan.inserts)] + [("modify", x) for x in js(plan.modifies)],
              [("root", plan.root)] if plan.root is not None else [],
              [("delete", x) for x in js(plan.deletes)], [("ungroup", g) for g in plan.group_deletes]]
    check(False, root)
    switched = plan.root is None
    steps = 0
    for phase in phases:
        rnd.shuffle(phase)
        for kind, x in phase:
            steps += 1
            if kind == "insert":
                t, e = x
                assert _key(e) not in tables[t], f"INSERT of an entry {t} already holds"
                tables[t][_key(e)] = e
            elif kind == "modify":
                t, e = x
                assert _key(e) in tables[t] and tables[t][_key(e)] != e, f"MODIFY of {t}: not held or unchanged"
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
            check(switched, root)
    assert switched and plan.writes == steps
    return root


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(rule_chain(), st.booleans(), st.data())
def test_every_step_of_an_update_classifies_as_one_rule_set(chain, spare, data):
    """Two updates in a row (A to B, B to C) from a switch loaded with or without the spare root:
    every update of each, applied one at a time, classifies as the rule set before until the root
    switch and as the next one after it."""
    from subc.dataplane.p4rt.plan import plan_update, with_spare_root

    fields, texts = chain
    compiled = [_compile(t, fields) for t in texts]
    docs = [entries_json(res.pipeline, "bmv2") for _, res in compiled]
    packets = list(boundary_packets([r for rs, _ in compiled for r in rs], FIELDS, data.draw))
    wants = [[_expect(rs, p) for p in packets] for rs, _ in compiled]
    held = with_spare_root(typed(docs[0])).to_json() if spare else docs[0]
    tables = {t["name"]: {_key(e): e for e in t["entries"]} for t in held["tables"]}
    root = held["initial_state"]
    groups = {g["group"]: g["ports"] for g in held["multicast_groups"]}
    rnd = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    for hop in (1, 2):
        before = _held(docs[0], tables, root, groups)
        try:
            plan = plan_update(typed(before), typed(docs[hop]))
        except SubcError as e:
            # the next rule set needs another program (a field unused so far, another last stage) or more states
            assert "reload the switch" in e.message, e.render()
            event(f"update {hop}: refused (another program)")
            return
        event(f"update {hop}: root {'switched' if plan.root is not None else 'kept'}"
              f"{', written into the spare' if plan.modifies or plan.spare_deletes else ''}")

        def check(switched: bool, root: int, hop=hop):
            sim = TableSimulator(typed(_held(docs[0], tables, root, groups)))
            want = wants[hop if switched else hop - 1]
            for pkt, w in zip(packets, want):
                assert sim.process(pkt) == w, ("rule sets:\n" + "\n--\n".join(texts) + f"\npacket {pkt}: "
                                               f"update {hop}, {'after' if switched else 'before'} the root switch")

        spare_rows = _root_rows(docs[0], tables, root) if plan.root is not None else None
        root = _apply_steps(docs[0], tables, root, groups, plan, check, rnd)
        # nothing of the rule set before is left but the old root's entries (the next spare)
        new_doc = plan.doc.to_json()
        final = {t["name"]: {_key(e): e for e in t["entries"]} for t in new_doc["tables"]}
        if spare_rows is not None:
            assert plan.spare is not None and plan.spare != root
            for t, rows in spare_rows.items():
                final[t].update(rows)
        else:
            for t, rows in _root_rows(docs[0], tables, plan.spare).items() if plan.spare is not None else ():
                final[t].update(rows)
        assert tables == final and root == new_doc["initial_state"]
        assert groups == {g["group"]: g["ports"] for g in new_doc["multicast_groups"]}


def test_an_unchanged_rule_set_writes_nothing():
    from subc.dataplane.p4rt.plan import plan_update

    fields = ["h.a", "h.c"]
    _, res = _compile("h.a > 5 and h.c == 3 : fwd(1);\nh.a < 9 : fwd(2, 3);", fields)
    doc = entries_json(res.pipeline, "bmv2")
    plan = plan_update(typed(doc), typed(json.loads(json.dumps(doc))))
    assert plan.writes == 0 and plan.root is None


def test_another_program_is_refused():
    from subc.dataplane.p4rt.plan import plan_update

    _, ra = _compile("h.a > 5 and h.c == 3 : fwd(1);", ["h.a", "h.c"])
    _, rb = _compile("h.a > 5 and h.c == 3 : fwd(1);", ["h.c", "h.a"])
    with pytest.raises(SubcError, match="reload the switch"):
        plan_update(entries_doc(ra.pipeline, "bmv2"), entries_doc(rb.pipeline, "bmv2"))


def test_a_rule_set_with_state_needs_a_reload():
    """Registers belong to the program: an update from or to a rule set comparing state is refused."""
    from subc.dataplane.p4rt.plan import plan_update

    plain = entries_doc(_compile("h.a > 5 : fwd(1);", None)[1].pipeline, "bmv2")
    stateful = entries_doc(_compile("h.a > 5 and count() > 2 : fwd(1);", None)[1].pipeline, "bmv2")
    for old, new in ((plain, stateful), (stateful, plain), (stateful, stateful)):
        with pytest.raises(SubcError, match="compare state.*reload the switch"):
            plan_update(old, new)


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

    from subc.dataplane.p4rt.control import load, stats, update, verify
    from subc.dataplane.p4rt.requests import read_p4info

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
        # entries.json, and a copy of the root's entries under one other state (the spare root)
        spare_of = {}
        for t in doc_a["tables"]:
            i = next((j for j, k in enumerate(t["keys"]) if k["name"].endswith("subc_state")), None)
            if i is None or t.get("field") not in (None, fields[0]):
                continue
            for e in got.get(t["name"], []):
                s = e["match"][i]["exact"]
                if all(dump(e) != dump(x) for x in t["entries"]):
                    spare_of.setdefault(s, []).append((t["name"], e))
        assert len(spare_of) == 1
        ((spare, copies),) = spare_of.items()
        assert spare not in (0, doc_a["initial_state"])
        spared = {t["name"]: list(t["entries"]) for t in doc_a["tables"]}
        for t in doc_a["tables"]:
            i = next((j for j, k in enumerate(t["keys"]) if k["name"].endswith("subc_state")), None)
            for e in t["entries"]:
                if (i is not None and t.get("field") in (None, fields[0])
                        and e["match"][i]["exact"] == doc_a["initial_state"]):
                    spared[t["name"]].append({**e, "match": [{"exact": spare} if j == i else m
                                                             for j, m in enumerate(e["match"])]})
        want = {n: sorted(map(dump, es)) for n, es in spared.items() if es}
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
        # new groups, the spare's deletions, then inserts and the spare's modifications, the root, deletions
        order = [("group" if r.updates[0].entity.HasField("packet_replication_engine_entry") else "table", k)
                 for r, k in zip(reqs[:roots[0]], kinds)]
        phase = [0 if o == ("group", {pr.Update.INSERT}) else 1 if o == ("table", {pr.Update.DELETE})
                 else 2 if o[0] == "table" and o[1] <= {pr.Update.INSERT, pr.Update.MODIFY} else -1 for o in order]
        assert -1 not in phase and phase == sorted(phase), order
        assert all(k == {pr.Update.DELETE} for k in kinds[roots[0] + 1:])
        # the new root was written into the spare: fewer first-stage writes than the root has entries
        assert w.plan.root == spare
        assert sum(len(r.updates) for r in reqs) == w.total == w.plan.writes
        assert sw.errors == []
        assert verify(str(outs["b"]), sw.addr) == []
        streams = sw.streams
        assert sum(stats(sw.addr)["tables"].values()) == len(sw.entries)
        assert sw.streams == streams  # reading takes no part in arbitration (beside a primary)
        # what the server holds classifies as B's rules say (decoded by this test)
        doc_b = json.loads((outs["b"] / "entries.json").read_text())
        held, groups = decode([pr.Update(type=pr.Update.INSERT, entity=pr.Entity(table_entry=te))
                               for te in sw.entries.values()], info)
        root_b = int.from_bytes(sw.defaults[root.table_id].action.action.params[0].value, "big")
        sim_doc = {**doc_b, "initial_state": root_b, "multicast_groups":
                   [{"group": g, "ports": p} for g, p in sw_groups(sw).items()],
                   "tables": [{**t, "entries": held.get(t["name"], [])} for t in doc_b["tables"]]}
        sim = TableSimulator(typed(sim_doc))
        qs = {q.name: q for q in DIFF_SPEC.query_fields.values()}
        for pkt in boundary_packets(rules["a"] + rules["b"], qs, data.draw):
            assert sim.process(pkt) == reference_decision(rules["b"], DIFF_SPEC, pkt), pkt
    finally:
        sw.stop()


def sw_groups(sw: FakeSwitch) -> dict:
    return {g.multicast_group_id: [r.egress_port for r in g.replicas] for g in sw.groups.values()}


def test_unreachable_server_is_a_clear_error(tmp_path):
    import socket

    from subc.dataplane.p4rt.control import load

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

    from subc.spec.front_end import parse_spec
    from subc.backends.p4.state_index import StateIndex
    from subc.dataplane.p4rt.plan import plan_update, with_spare_root

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
    files_b = target_files(res_b, "b.sub", max_messages=slots)[0]
    doc_b = json.loads(files_b["entries.json"])
    # B as subc update reads it: the state index the compile wrote beside entries.json
    index_b = StateIndex.from_bytes(files_b["states.jsonl"].encode())[0]
    assume("messages" in doc_a and "messages" in doc_b)
    try:
        plan = plan_update(typed(doc_a), typed(doc_b))
    except SubcError as e:
        assert "reload the switch" in e.message, e.render()
        event("refused: another program")
        return
    event(f"applied: {slots} slots")
    qs = {q.name: q for q in spec.query_fields.values()}
    packets = list(boundary_packets(rules_a + rules_b, qs, data.draw))[:20]
    want = {False: [reference_decision(rules_a, spec, p) for p in packets],
            True: [reference_decision(rules_b, spec, p) for p in packets]}
    held = with_spare_root(typed(doc_a)).to_json() if data.draw(st.booleans(), label="spare root") else doc_a
    # what the switch holds as the writer's record keeps it (serialized and read back)
    record = StateIndex.from_bytes(StateIndex.from_doc(typed(held)).to_bytes())[0]
    assert record.to_doc() == StateIndex.from_doc(typed(held)).to_doc()
    plan = plan_update(record, index_b)
    tables = {t["name"]: {_key(e): e for e in t["entries"]} for t in held["tables"]}
    groups = {g["group"]: g["ports"] for g in held["multicast_groups"]}
    rnd = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    calls = [0, None]  # checks, the last check's switched

    def check(switched: bool, root: int):
        calls[0] += 1
        if calls[0] % 7 != 1 and switched == calls[1]:
            return  # every few steps and at the root switch: the slots' simulators are the cost
        calls[1] = switched
        for view in _slot_views(doc_a, tables, root, groups):
            sim = TableSimulator(typed(view))
            for pkt, w in zip(packets, want[switched]):
                assert sim.process(pkt) == w, (lines_a, lines_b, pkt, switched)

    root = _apply_steps(doc_a, tables, held["initial_state"], groups, plan, check, rnd)
    calls[0] = 0
    check(True, root)
