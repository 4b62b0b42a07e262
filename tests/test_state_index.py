"""The state index (subc.backends.p4.state_index: ``states.jsonl`` and the writer's record) and the
planner's paths that depend on its form.

* Written and read back (heads parsed, entries left as lines until asked), an index of a
  hypothesis-drawn rule set (1 to 3 message slots, range, exact and lpm fields) has the same
  nodes, signatures, next states and entries as the index of its entries.json, and writes the
  same bytes again (lines copied, not rewritten); every signature is the hash of the node's
  abstract rows, sorted.
* A row's key (:meth:`StateIndex.row_key`) is equal for two entries exactly when their matches
  are equal in canonical form (:func:`canonical_match`: lpm and ternary values masked, a
  whole-field range, lpm /0 and ternary mask 0 all "any") and their priorities are.
* An update planned from the serialized record and the compiled ``states.jsonl`` writes exactly
  what it writes planned from the two entries.json documents.
* A switch that holds two states of one signature (a copy of a state, as a damaged switch can
  hold): the planner checks every state it keeps, and either refuses (reload) or writes an update
  that classifies as the rule sets say at every step.
"""

from __future__ import annotations

import hashlib
import json
import random

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from subc.backends.files import target_files
from subc.backends.p4.entries_doc import Entry, EntriesDoc, Match
from subc.backends.p4.state_index import StateIndex, canonical_match, state_key_index
from subc.compiler.driver import compile_rules
from subc.dataplane.p4rt.plan import plan_update, with_spare_root
from subc.errors import SubcError
from subc.lang.rules import parse_rules
from subc.semantics.reference import reference_decision
from subc.sim.switch import TableSimulator

from ebpf_util import DIFF_SPEC as SPEC
from strategies import boundary_packets, rule_set
from test_p4rt_update import _apply_steps, _held, rule_chain

#: the query fields of a whole program (range, exact and lpm; its compile writes states.jsonl)
FIELDS = {q.name: q for q in SPEC.query_fields.values() if q.name != "ip.dstAddr"}

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


def _outputs(text: str, slots: int, order: list[str] | None = None) -> dict[str, str]:
    rules = parse_rules(text, SPEC, "r.sub")
    try:
        res = compile_rules(rules, SPEC, "bmv2", field_order=order)
    except SubcError as e:
        assume("conflicting actions" not in e.message)
        raise
    return target_files(res, "r.sub", max_messages=slots)[0]


def _same_program(fields: list[str], texts: list[str]) -> list[str]:
    """``texts`` each with a rule that tests every field (every rule set then has a stage per
    field: one program, which an update can switch between)."""
    keeper = " and ".join(f"{f} == 1" for f in fields) + " : fwd(6);"
    return [f"{t}\n{keeper}" for t in texts]


def _plan_json(plan) -> dict:
    js = lambda xs: [(t, e.to_json()) for t, e in xs]  # noqa: E731
    return {
        "groups": plan.group_inserts,
        "spare_deletes": js(plan.spare_deletes),
        "inserts": js(plan.inserts),
        "modifies": js(plan.modifies),
        "root": plan.root,
        "deletes": js(plan.deletes),
        "group_deletes": plan.group_deletes,
        "kept": plan.kept_states,
        "new": plan.new_states,
        "spare": plan.spare,
        "held": plan.doc.to_json(),
    }


@SETTINGS
@given(rule_set(FIELDS), st.integers(1, 3))
def test_an_index_read_back_is_the_index_written(rules, slots):
    fields, text = rules
    files = _outputs(text, slots, fields)
    doc = EntriesDoc.from_json(json.loads(files["entries.json"]))
    written = files["states.jsonl"].encode()
    read, header = StateIndex.from_bytes(written)
    fresh = StateIndex.from_doc(doc, spares=False)
    assert header["nodes"] == len(fresh.nodes) == len(read.nodes)
    assert read.nodes == fresh.nodes
    for node in fresh.nodes:
        assert read.entries(node) == fresh.entries(node)
        # a signature is the hash of the node's abstract rows, sorted, a line each (the slots'
        # tables that share their entries are sorted once: the same text)
        texts = sorted(text for _, text in fresh.abstract_rows(node))
        assert fresh.signature(node) == hashlib.blake2b("\n".join(texts).encode(), digest_size=16).hexdigest()
    assert read.to_doc() == fresh.to_doc() == StateIndex.from_doc(doc).to_doc()
    assert read.to_bytes({k: header[k] for k in ("entries_json_bytes", "program_shape")}) == written
    # an index of a switch (spare roots unsigned) as the writer's record holds it
    spared = with_spare_root(doc)
    record = StateIndex.from_doc(spared)
    again = StateIndex.from_bytes(record.to_bytes())[0]
    assert again.nodes == record.nodes and again.to_doc() == record.to_doc() == StateIndex.from_doc(spared).to_doc()


KINDS = st.sampled_from(["exact", "range", "lpm", "ternary"])


@st.composite
def match_element(draw, kind: str, bits: int) -> Match:
    top = (1 << bits) - 1
    value = st.one_of(st.sampled_from([0, 1, top]), st.integers(0, top))
    if kind == "exact":
        return Match("exact", draw(value))
    if kind == "range":
        lo, hi = sorted((draw(value), draw(value)))
        return Match("range", lo, hi)
    if kind == "lpm":
        return Match("lpm", draw(value), draw(st.integers(0, bits)))
    return Match("ternary", draw(value), draw(st.sampled_from([0, top, top ^ 1, 1 << (bits - 1)]) | value))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_row_keys_are_equal_for_canonically_equal_matches(data):
    keys = data.draw(st.lists(st.tuples(KINDS, st.sampled_from([1, 8, 16])), min_size=1, max_size=3))
    kinds = [("exact", 8), *keys]  # the state key first
    doc = EntriesDoc.from_json(
        {
            "format": "subc-entries",
            "version": 2,
            "target": "bmv2",
            "control": "C",
            "state_width": 8,
            "code_width": 1,
            "initial_state": 1,
            "root": {"table": "C.r", "action": "set_root", "param": "root"},
            "state_key": "meta.subc_state",
            "default_action": {"action": "hold", "params": {}},
            "headers": [],
            "field_order": ["h.f"],
            "pipeline": [],
            "tables": [
                {
                    "name": "C.t",
                    "role": "stage",
                    "field": "h.f",
                    "size": 16,
                    "keys": [
                        {"name": "meta.subc_state" if i == 0 else f"k{i}", "match_kind": k, "bitwidth": b}
                        for i, (k, b) in enumerate(kinds)
                    ],
                    "default_action": {"action": "NoAction", "params": {}},
                    "entries": [],
                }
            ],
            "multicast_groups": [],
        }
    )
    index = StateIndex.from_doc(doc)
    assert state_key_index(doc.tables[0]) == 0

    def entry() -> Entry:
        match = (Match("exact", 1), *(data.draw(match_element(k, b)) for k, b in keys))
        return Entry(match, data.draw(st.sampled_from([None, 1, 2])), "a", {})

    a, b = entry(), entry()
    key = index.row_key("C.t")
    canon = [tuple(canonical_match(m, bits) for m, (_, bits) in zip(e.match[1:], keys)) for e in (a, b)]
    same = canon[0] == canon[1] and a.priority == b.priority
    assert (key(index.row("C.t", a)) == key(index.row("C.t", b))) == same
    assert key(index.row("C.t", a)) == key(json.loads(json.dumps(index.row("C.t", a))))
    assert index.entry("C.t", 1, index.row("C.t", a)) == a


@SETTINGS
@given(rule_chain(FIELDS, n=2), st.integers(1, 2), st.booleans())
def test_a_plan_from_the_record_and_states_jsonl_is_the_plan_from_the_documents(chain, slots, spare):
    fields, texts = chain
    texts = _same_program(fields, texts)
    files = [_outputs(t, slots, fields) for t in texts]
    docs = [EntriesDoc.from_json(json.loads(f["entries.json"])) for f in files]
    held = with_spare_root(docs[0]) if spare else docs[0]
    record = StateIndex.from_bytes(StateIndex.from_doc(held).to_bytes())[0]
    compiled = StateIndex.from_bytes(files[1]["states.jsonl"].encode())[0]
    try:
        want = _plan_json(plan_update(held, docs[1]))
    except SubcError as e:
        assert "reload the switch" in e.message
        event("refused: another program")
        return
    event(f"planned: root {'switched' if want['root'] is not None else 'kept'}")
    got = plan_update(record, compiled)
    assert _plan_json(got) == want
    # and the record it leaves, written and read back, plans the next update alike
    assert got.held is not None
    again = StateIndex.from_bytes(got.held.to_bytes())[0]

    def back(old) -> dict | str:
        try:
            return _plan_json(plan_update(old, docs[0]))
        except SubcError as e:
            assert "reload the switch" in e.message
            return e.message

    assert back(again) == back(got.held.to_doc())


def _with_a_copy(doc: dict, rnd: random.Random) -> dict | None:
    """``doc`` (entries.json, a dict) with the entries of one state of a stage after the first
    copied under a number no state of that stage uses: a switch holding two states of one
    signature (None when there is no such state)."""
    stages = {}
    for t in doc["tables"]:
        i = next((j for j, k in enumerate(t["keys"]) if k["name"].endswith("_state")), None)
        if i is not None and t.get("field") not in (None, doc["field_order"][0]):
            for e in t["entries"]:
                stages.setdefault(t["field"], set()).add(e["match"][i]["exact"])
    if not stages:
        return None
    field = rnd.choice(sorted(stages))
    state = rnd.choice(sorted(stages[field]))
    copy = max(stages[field]) + 1
    tables = []
    for t in doc["tables"]:
        i = next((j for j, k in enumerate(t["keys"]) if k["name"].endswith("_state")), None)
        extra = []
        if i is not None and t.get("field") == field:
            for e in t["entries"]:
                if e["match"][i]["exact"] == state:
                    extra.append({**e, "match": [{"exact": copy} if j == i else m for j, m in enumerate(e["match"])]})
        tables.append({**t, "entries": t["entries"] + extra})
    return {**doc, "tables": tables}


@SETTINGS
@given(rule_chain(FIELDS, n=2), st.data())
def test_two_states_of_one_signature_on_the_switch(chain, data):
    fields, texts = chain
    texts = _same_program(fields, texts)
    rnd = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    compiled = [parse_rules(t, SPEC, "r.sub") for t in texts]
    docs = [json.loads(_outputs(t, 1, fields)["entries.json"]) for t in texts]
    damaged = _with_a_copy(docs[0], rnd)
    assume(damaged is not None)
    assert damaged is not None
    index = StateIndex.from_doc(EntriesDoc.from_json(damaged))
    signed = [(k, i.sig) for (k, _), i in index.nodes.items() if i.sig is not None]
    assert len(set(signed)) < len(signed)  # two states of one signature
    try:
        plan = plan_update(index, EntriesDoc.from_json(docs[1]))
    except SubcError as e:
        assert "two states of one signature" in e.message or "reload the switch" in e.message
        event("refused: " + ("two states of one signature" if "two states" in e.message else "another program"))
        return
    event(f"written: {plan.writes} updates, {plan.kept_states} states kept")
    packets = list(boundary_packets(compiled[0] + compiled[1], FIELDS, data.draw))
    wants = [[reference_decision(rs, SPEC, p) for p in packets] for rs in compiled]
    tables = {
        t["name"]: {json.dumps([e["match"], e.get("priority")]): e for e in t["entries"]} for t in damaged["tables"]
    }
    groups = {g["group"]: g["ports"] for g in damaged["multicast_groups"]}

    def check(switched: bool, root: int) -> None:
        sim = TableSimulator(EntriesDoc.from_json(_held(docs[0], tables, root, groups)))
        for pkt, want in zip(packets, wants[1 if switched else 0]):
            assert sim.process(pkt) == want, (texts, pkt, switched)

    _apply_steps(docs[0], tables, damaged["initial_state"], groups, plan, check, rnd)
