"""The P4Runtime writer's record of a switch (subc.dataplane.p4rt.record), against a P4Runtime
server written here (tests/p4rt_fake.py, strict: it rejects a write that is not valid for what
it holds, as BMv2 does).

* An update plans from the record: no table is read back (the server counts wildcard reads), and
  the record written afterwards is exactly what the server holds (read back by the test and
  compared entry by entry, with the states and groups the switch numbers them by).
* Another writer (its own record directory) changes the switch: the root differs from the record,
  the update reads the switch and ends with the switch holding the new rule set.
* Entries removed behind the writer's back (hypothesis picks which): the record is wrong while the
  root is the record's, so the update plans from it; if a write is rejected the writer reads the
  switch and plans again from it.  Either way the switch ends up classifying as the
  rule set says (``verify`` finds nothing), and ``verify`` removes a record that differs.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.backends.files import target_files
from subc.backends.p4.entries_doc import EntriesDoc
from subc.compiler.driver import compile_rules
from subc.dataplane.p4rt.control import load, read_switch, update, verify
from subc.dataplane.p4rt.record import holding_differences, program_digest, read_record, record_path
from subc.dataplane.p4rt.session import Session
from subc.errors import SubcError
from subc.lang.rules import parse_rules

from ebpf_util import DIFF_SPEC
from p4rt_fake import FakeSwitch

FIELDS = ["m.a", "m.b", "m.c"]
SETS = [
    "m.a > 5 and m.c == 7 : fwd(1);\nm.b < 100 : fwd(2, 3);",
    "m.a > 5 and m.c == 7 : fwd(1);\nm.b < 100 : fwd(2, 3);\nm.a > 50 and m.c == 9 : fwd(4, 5);",
    "m.a > 5 and m.c == 7 : fwd(1);\nm.b < 200 : fwd(2, 3);\nm.a > 50 and m.c == 9 : fwd(4);",
]


def _compile(tmp_path, name: str, text: str):
    res = compile_rules(parse_rules(text, DIFF_SPEC, "r.sub"), DIFF_SPEC, "bmv2", field_order=FIELDS, state_bits=6)
    files, _ = target_files(res, "r.sub")
    d = tmp_path / name
    d.mkdir()
    for n, body in files.items():
        (d / n).write_text(body)
    return d


@pytest.fixture
def world(tmp_path):
    outs = [_compile(tmp_path, f"r{i}", text) for i, text in enumerate(SETS)]
    (tmp_path / "prog.json").write_text("{}")
    sw = FakeSwitch()
    sw.strict = True
    try:
        yield tmp_path, outs, sw
    finally:
        sw.stop()


def _recorded_is_held(sw: FakeSwitch, out, record_dir) -> None:
    """The record in ``record_dir`` is exactly what the switch holds."""
    doc = EntriesDoc.from_json(json.loads((out / "entries.json").read_text()))
    with Session(sw.addr, read_only=True) as s:
        held = read_switch(s, doc)
        rec, why = read_record(record_path(sw.addr, 0, record_dir), sw.addr, 0, program_digest(s.p4info))
    assert rec is not None, why
    assert holding_differences(held, rec.index.to_doc()) == []


def test_updates_plan_from_the_record_and_record_what_the_switch_holds(world):
    tmp_path, outs, sw = world
    rd = tmp_path / "records"
    load(str(outs[0]), sw.addr, config=str(tmp_path / "prog.json"), record_dir=str(rd))
    _recorded_is_held(sw, outs[0], rd)
    for out in (outs[1], outs[2], outs[0]):
        reads = sw.wildcard_reads
        w = update(str(out), sw.addr, grace=0, record_dir=str(rd))
        assert w.source == "record"
        assert sw.wildcard_reads == reads  # nothing read back
        assert w.plan is not None and w.plan.writes > 0
        _recorded_is_held(sw, out, rd)
        assert verify(str(out), sw.addr, record_dir=str(rd)) == []
    assert sw.errors == []


def test_another_writer_makes_the_update_read_the_switch(world):
    tmp_path, outs, sw = world
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    load(str(outs[0]), sw.addr, config=str(tmp_path / "prog.json"), record_dir=str(mine))
    w = update(str(outs[1]), sw.addr, grace=0, record_dir=str(theirs))
    assert w.source.startswith("the switch (no record")
    reads = sw.wildcard_reads
    w = update(str(outs[2]), sw.addr, grace=0, record_dir=str(mine))
    assert "root" in w.source and sw.wildcard_reads > reads
    assert verify(str(outs[2]), sw.addr, record_dir=str(mine)) == []
    _recorded_is_held(sw, outs[2], mine)
    # their record is stale now: verify says so and removes it
    said = verify(str(outs[2]), sw.addr, record_dir=str(theirs))
    assert said and all("record" in line for line in said)
    assert not record_path(sw.addr, 0, theirs).exists()
    assert verify(str(outs[2]), sw.addr, record_dir=str(theirs)) == []


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_entries_removed_behind_the_writers_back(world, data):
    tmp_path, outs, sw = world
    rd = tmp_path / f"rec{data.draw(st.integers(0, 1 << 30))}"
    for te in list(sw.entries):  # a fresh switch per example
        del sw.entries[te]
    sw.groups.clear()
    load(str(outs[0]), sw.addr, config=str(tmp_path / "prog.json"), record_dir=str(rd))
    keys = sorted(sw.entries)
    gone = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=4, unique=True))
    for k in gone:
        del sw.entries[k]
    target = data.draw(st.sampled_from(outs[1:]))
    try:
        w = update(str(target), sw.addr, grace=0, record_dir=str(rd))
        assert w.source == "record" or "rejected" in w.source
        # what the record missed is still missing where no write touched it: verify tells, and
        # a verify that finds the record wrong removes it, so the next update reads the switch
        if verify(str(target), sw.addr, record_dir=str(rd)):
            assert not record_path(sw.addr, 0, rd).exists()
            w = update(str(target), sw.addr, grace=0, record_dir=str(rd))
            assert w.source.startswith("the switch")
    except SubcError as e:
        # a damaged diagram may hold two states of one signature, which the plan cannot number
        # consistently: it refuses (nothing more written, no record left) and says to reload
        assert "reload the switch" in str(e)
        assert not record_path(sw.addr, 0, rd).exists()
        sw.entries.clear()
        sw.groups.clear()
        load(str(target), sw.addr, config=str(tmp_path / "prog.json"), record_dir=str(rd))
    assert verify(str(target), sw.addr, record_dir=str(rd)) == []
    _recorded_is_held(sw, target, rd)
    assert sw.errors == []


def test_the_state_index_written_by_compile_is_what_update_reads(world):
    from subc.backends.p4.p4info import shape_digest
    from subc.backends.p4.state_index import StateIndex
    from subc.dataplane.p4rt.control import read_compiled
    from subc.dataplane.p4rt.requests import read_p4info

    _, outs, _ = world
    for out in outs:
        index, shape = read_compiled(str(out))
        assert shape == shape_digest(read_p4info((out / "p4info.txtpb").read_text()))
        doc = EntriesDoc.from_json(json.loads((out / "entries.json").read_text()))
        again = StateIndex.from_doc(doc, spares=False)
        assert {n: i.sig for n, i in index.nodes.items()} == {n: i.sig for n, i in again.nodes.items()}
        assert index.to_doc() == again.to_doc()
        # an entries.json edited since (another size): the index is not used, entries.json is
        (out / "entries.json").write_text((out / "entries.json").read_text() + "\n")
        index2, shape2 = read_compiled(str(out))
        assert shape2 is None and index2.to_doc() == again.to_doc()
