"""P4Runtime updates of compiled rule sets (subc.dataplane.p4rt.requests).

The updates are decoded here from the protobuf fields alone (byte strings read as big-endian
integers, omitted fields as "any value") and must give back every entry and multicast group of
``entries.json``; values are in canonical form (P4Runtime 1.3 section 8.4.1).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.backends.p4.entries_doc import EntriesDoc, Entry
from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.backends.files import target_files
from subc.errors import SubcError

from ebpf_util import DIFF_SPEC
from test_delivery_differential import RENDER
from test_p4info import SINGLE_RULES, random_program_files


def _int(b: bytes) -> int:
    assert b and (len(b) == 1 or b[0] != 0), f"not canonical: {b.hex()}"
    return int.from_bytes(b, "big")


def decode(updates, p4info) -> tuple[dict, dict]:
    """(table name -> sorted entries as entries.json writes them, group -> ports) of ``updates``."""
    tables = {t.preamble.id: t for t in p4info.tables}
    actions = {a.preamble.id: a for a in p4info.actions}
    kinds = {2: "exact", 3: "lpm", 4: "ternary", 5: "range"}
    out: dict[str, list] = {}
    groups = {}
    for u in updates:
        assert u.type == 1  # INSERT
        ent = u.entity
        if ent.HasField("packet_replication_engine_entry"):
            g = ent.packet_replication_engine_entry.multicast_group_entry
            groups[g.multicast_group_id] = [r.egress_port for r in g.replicas]
            continue
        te = ent.table_entry
        t = tables[te.table_id]
        given_ = {m.field_id: m for m in te.match}
        match = []
        for f in t.match_fields:
            kind, top = kinds[f.match_type], (1 << f.bitwidth) - 1
            m = given_.get(f.id)
            if kind == "exact":
                match.append({"exact": _int(m.exact.value)})
            elif kind == "range":
                match.append({"range": [_int(m.range.low), _int(m.range.high)] if m else [0, top]})
            elif kind == "lpm":
                match.append({"lpm": [_int(m.lpm.value), m.lpm.prefix_len] if m else [0, 0]})
            else:
                match.append({"ternary": [_int(m.ternary.value), _int(m.ternary.mask)] if m else [0, 0]})
        a = actions[te.action.action.action_id]
        pnames = {p.id: p.name for p in a.params}
        e = {"match": match, "action": a.preamble.name.split(".")[-1],
             "params": {pnames[p.param_id]: _int(p.value) for p in te.action.action.params}}
        if te.priority:
            e["priority"] = te.priority
        out.setdefault(t.preamble.name, []).append(e)
    return out, groups


def _norm(doc: dict, p4info) -> tuple[dict, dict]:
    """entries.json's entries in the decoded form (lpm values masked, priorities only where P4Runtime
    has them)."""
    widths = {t.preamble.name: [f.bitwidth for f in t.match_fields] for t in p4info.tables}
    out = {}
    for t in doc["tables"]:
        ranged = any("range" in m or "ternary" in m for e in t["entries"][:1] for m in e["match"])
        for e in t["entries"]:
            match = []
            for m, w in zip(e["match"], widths[t["name"]]):
                if "lpm" in m:
                    v, plen = m["lpm"]
                    m = {"lpm": [v >> (w - plen) << (w - plen) if plen else 0, plen]}
                match.append(m)
            x = {"match": match, "action": e["action"], "params": dict(e["params"])}
            if ranged and e.get("priority"):
                x["priority"] = e["priority"]
            out.setdefault(t["name"], []).append(x)
    return out, {g["group"]: g["ports"] for g in doc.get("multicast_groups", [])}


def _check(files: dict) -> None:
    from subc.dataplane.p4rt.requests import P4InfoIndex, insert_updates, read_p4info

    doc = json.loads(files["entries.json"])
    p4info = read_p4info(files["p4info.txtpb"])
    updates = insert_updates(EntriesDoc.from_json(doc), P4InfoIndex(p4info))
    got, groups = decode(updates, p4info)
    want, want_groups = _norm(doc, p4info)
    key = lambda e: json.dumps(e, sort_keys=True)  # noqa: E731
    assert {n: sorted(es, key=key) for n, es in got.items()} == {n: sorted(es, key=key) for n, es in want.items() if es}
    assert groups == want_groups
    seen_entry = False
    for u in updates:  # groups before the entries that use them
        if u.entity.HasField("table_entry"):
            seen_entry = True
        else:
            assert not seen_entry


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)))
def test_updates_of_random_specs_encode_every_entry(data, form):
    files = random_program_files(data, form, "bmv2")
    if files is None:
        return
    _check(files)


@pytest.mark.parametrize("rules", SINGLE_RULES)
def test_updates_of_single_message_programs_encode_every_entry(rules):
    res = compile_rules(parse_rules(rules, DIFF_SPEC, "r.sub"), DIFF_SPEC, "bmv2")
    files, _ = target_files(res, "r.sub")
    _check(files)


def test_values_are_canonical_and_checked():
    from subc.dataplane.p4rt.requests import encode_value

    assert encode_value(0, 9) == b"\x00"
    assert encode_value(255, 9) == b"\xff"
    assert encode_value(256, 9) == b"\x01\x00"
    assert encode_value((1 << 64) - 1, 64) == b"\xff" * 8
    for bad, bits in ((512, 9), (-1, 8), (1 << 64, 64)):
        with pytest.raises(SubcError):
            encode_value(bad, bits)


def test_dont_care_fields_are_omitted_and_prefixes_masked():
    from p4.config.v1 import p4info_pb2

    from subc.dataplane.p4rt.requests import P4InfoIndex, table_entry

    info = p4info_pb2.P4Info()
    t = info.tables.add()
    t.preamble.id, t.preamble.name = 0x02000001, "C.t"
    for i, (kind, bits) in enumerate([(5, 16), (3, 32), (4, 8)], 1):
        f = t.match_fields.add()
        f.id, f.name, f.bitwidth, f.match_type = i, f"f{i}", bits, kind
    a = info.actions.add()
    a.preamble.id, a.preamble.name = 0x01000001, "C.go"
    p = a.params.add()
    p.id, p.name, p.bitwidth = 1, "port", 9
    idx = P4InfoIndex(info)
    te = table_entry(idx, "C.t", Entry.from_json({"match": [{"range": [0, 65535]}, {"lpm": [0x0A0000FF, 8]}, {"ternary": [5, 0]}],
                                                 "priority": 3, "action": "go", "params": {"port": 2}}))
    assert [m.field_id for m in te.match] == [2]
    assert te.match[0].lpm.value == b"\x0a\x00\x00\x00" and te.match[0].lpm.prefix_len == 8
    assert te.priority == 3 and te.action.action.params[0].value == b"\x02"
    with pytest.raises(SubcError, match="no parameter"):
        table_entry(idx, "C.t", Entry.from_json({"match": [{"range": [1, 2]}, {"lpm": [0, 0]}, {"ternary": [0, 0]}],
                                                "action": "go", "params": {"nope": 1}}))
    with pytest.raises(SubcError, match="not in the P4Info"):
        table_entry(idx, "C.u", Entry.from_json({"match": [], "action": "go"}))


@settings(max_examples=200, deadline=None)
@given(field=st.integers(1, 2**29 - 1), payloads=st.lists(st.binary(max_size=400), max_size=4))
def test_length_delimited_frames_parse_as_the_repeated_field(field, payloads):
    """A WriteRequest sent as its head and framed updates (Session.write) is the request the
    library builds; and any field number and length frame as protobuf's own encoder does."""
    from google.protobuf.internal import encoder
    from p4.v1 import p4runtime_pb2 as pr

    from subc.dataplane.p4rt.session import length_delimited

    for p in payloads:
        assert length_delimited(field, p) == encoder.TagBytes(field, 2) + encoder._VarintBytes(len(p)) + p
    ups = []
    for k, p in enumerate(payloads):
        u = pr.Update(type=pr.Update.MODIFY)
        u.entity.table_entry.table_id = k + 1
        u.entity.table_entry.match.add(field_id=1).exact.value = p or b"\x00"
        ups.append(u)
    head = pr.WriteRequest(device_id=field)
    head.election_id.low = 7
    framed = head.SerializeToString() + b"".join(length_delimited(4, u.SerializeToString()) for u in ups)
    want = pr.WriteRequest(device_id=field)
    want.election_id.low = 7
    want.updates.extend(ups)
    assert pr.WriteRequest.FromString(framed) == want
