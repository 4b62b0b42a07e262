"""P4Info (``p4info.txtpb``) of generated programs.

* Against the program text: tables, keys (names, match kinds, widths), action references, sizes,
  actions and their directionless parameters, counters and registers are read from ``subc.p4``
  here with regular expressions and the P4 declarations' own types (nothing of subc's), and
  must be what the P4Info says; IDs are unique and carry their resource type.
* Against p4c (when ``p4c-bm2-ss`` is on PATH): ``--p4runtime-files`` writes the same text.
* Hash and alias rules against values p4c printed for the ITCH example.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.spec.front_end import parse_spec
from subc.backends.files import target_files

from ebpf_util import DIFF_SPEC
from spec_model import spec_models
from test_delivery_differential import RENDER, rule_sets

P4C = shutil.which("p4c-bm2-ss")
NAMED_TYPES = {"PortId_t": 9, "MulticastGroupId_t": 16}
INTRINSIC = {"standard_metadata.egress_port": 9, "eg_intr_md.egress_port": 9}
KINDS = {"exact": 2, "lpm": 3, "ternary": 4, "range": 5}
SINGLE_RULES = [
    "m.a > 5 and m.d == 3 : fwd(1);\nm.b < 100 and ip.dstAddr == 10.0.0.0/8 : fwd(2, 3);\nm.c == 7 : fwd(5);",
    "m.e > 3 : fwd(4);",
    "m.f == 1 and m.g > 5 and m.h < 3 : fwd(1, 2);",
]


def parse_p4info(text: str):
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2

    return text_format.Parse(text, p4info_pb2.P4Info())


# -- reading the program ------------------------------------------------------------------------


def _blocks(src: str, keyword: str):
    """(name, header text, body) of every ``keyword NAME(...) { body }`` / ``keyword NAME { body }``
    (braces balanced)."""
    for m in re.finditer(rf"\b{keyword}\s+(\w+)\s*(\([^)]*\))?\s*\{{", src):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(src[i], 0)
            i += 1
        yield m.group(1), m.group(2) or "", src[m.end(): i - 1]


def _types(src: str) -> dict[str, dict[str, str]]:
    """Struct and header types: name -> member -> type text; typedefs as name -> {"": type}."""
    out: dict[str, dict[str, str]] = {}
    for kw in ("struct", "header"):
        for name, _, body in _blocks(src, kw):
            out[name] = {m.group(2): m.group(1) for m in re.finditer(r"([\w<>]+)\s+(\w+)\s*;", body)}
    for m in re.finditer(r"typedef\s+([\w<>]+)\s+(\w+)\s*;", src):
        out[m.group(2)] = {"": m.group(1)}
    return out


def _width(type_text: str, types: dict) -> int:
    m = re.fullmatch(r"bit<(\d+)>", type_text)
    if m:
        return int(m.group(1))
    if type_text in NAMED_TYPES:
        return NAMED_TYPES[type_text]
    return _width(types[type_text][""], types)


def _expr_width(expr: str, params: dict[str, str], types: dict) -> int:
    if expr in INTRINSIC:
        return INTRINSIC[expr]
    root, *path = expr.split(".")
    t = params[root]
    for member in path[:-1]:
        t = types[t][member]
    return _width(types[t][path[-1]], types)


def program_view(src: str) -> dict:
    """What a controller sees in ``src``, read from the text: tables, actions, counters, registers
    (fully qualified names)."""
    types = _types(src)
    view = {"tables": {}, "actions": {}, "counters": {}, "registers": {}}
    for control, sig, body in _blocks(src, "control"):
        if not control.startswith(("SubcIngress", "SubcEgress")) or "Deparser" in control:
            continue
        params = {m.group(2): m.group(1) for m in re.finditer(r"(?:inout|in|out)\s+(\w+)\s+(\w+)", sig)}
        for name, asig, _ in _blocks(body, "action"):
            ps = []
            for p in filter(None, (x.strip() for x in asig.strip("()").split(","))):
                if not p.startswith(("out ", "inout ", "in ")):
                    typ, pname = p.rsplit(None, 1)
                    ps.append((pname, _width(typ, types)))
            view["actions"][f"{control}.{name}"] = ps
        for name, _, tbody in _blocks(body, "table"):
            keys = []
            km_ = re.search(r"key\s*=\s*\{(.*?)\}", tbody, re.S)
            kb = km_.group(1) if km_ else ""  # a keyless table (subc_root) has no key block
            for km in re.finditer(r"([\w.]+)\s*:\s*(\w+)\s*(?:@name\(\"(\w+)\"\))?\s*;", kb):
                keys.append((km.group(3) or km.group(1), _expr_width(km.group(1), params, types), km.group(2)))
            ab = re.search(r"actions\s*=\s*\{(.*?)\}", tbody, re.S).group(1)
            acts = set()
            for a in filter(None, (x.strip() for x in ab.split(";"))):
                default_only = a.startswith("@defaultonly")
                a = a.replace("@defaultonly", "").strip().split("(")[0]
                acts.add((a if a == "NoAction" else f"{control}.{a}", default_only))
            size = int(re.search(r"size\s*=\s*(\d+)\s*;", tbody).group(1))
            view["tables"][f"{control}.{name}"] = (keys, acts, size)
        for m in re.finditer(r"\bcounter\((\d+), CounterType\.packets\)\s+(\w+);", body):
            view["counters"][f"{control}.{m.group(2)}"] = int(m.group(1))
        for m in re.finditer(r"\bCounter<bit<\d+>, bit<\d+>>\((\d+), CounterType_t\.PACKETS\)\s+(\w+);", body):
            view["counters"][f"{control}.{m.group(2)}"] = int(m.group(1))
        for m in re.finditer(r"\bregister<bit<(\d+)>>\((\d+)\)\s+(\w+);", body):
            view["registers"][f"{control}.{m.group(3)}"] = (int(m.group(1)), int(m.group(2)))
        for m in re.finditer(r"\bRegister<bit<(\d+)>, bit<\d+>>\((\d+)(?:, \d+)?\)\s+(\w+);", body):
            view["registers"][f"{control}.{m.group(3)}"] = (int(m.group(1)), int(m.group(2)))
    return view


def check_consistent(src: str, info) -> None:
    """The P4Info ``info`` describes program ``src`` (see the module docstring)."""
    from p4.config.v1.p4info_pb2 import ActionRef

    DEFAULT_ONLY = ActionRef.DEFAULT_ONLY
    view = program_view(src)
    actions = {a.preamble.id: a for a in info.actions}
    assert len(actions) == len(info.actions)
    ids = [x.preamble.id for x in [*info.tables, *info.actions, *info.counters, *info.registers]]
    assert len(set(ids)) == len(ids), "IDs are unique"
    for group, prefix in ((info.tables, 0x02), (info.actions, 0x01), (info.counters, 0x12), (info.registers, 0x16)):
        assert all(x.preamble.id >> 24 == prefix for x in group)
    assert {t.preamble.name for t in info.tables} == set(view["tables"])
    for t in info.tables:
        keys, acts, size = view["tables"][t.preamble.name]
        assert [(f.name, f.bitwidth, f.match_type) for f in t.match_fields] == [(n, w, KINDS[k]) for n, w, k in keys]
        assert [f.id for f in t.match_fields] == list(range(1, len(keys) + 1))
        refs = {(actions[r.id].preamble.name, r.scope == DEFAULT_ONLY) for r in t.action_refs}
        assert refs == acts, (t.preamble.name, refs ^ acts)
        assert t.size == size
    for a in info.actions:
        declared = view["actions"].get(a.preamble.name, []) if a.preamble.name != "NoAction" else []
        assert [(p.name, p.bitwidth) for p in a.params] == declared, a.preamble.name
    referenced = {r.id for t in info.tables for r in t.action_refs}
    assert referenced <= set(actions)
    assert {c.preamble.name: c.size for c in info.counters} == view["counters"]
    assert {r.preamble.name: (r.type_spec.bitstring.bit.bitwidth, r.size) for r in info.registers} == view["registers"]


def random_program_files(data, form: str, target: str) -> dict | None:
    """The output files of a random spec (``form``: P4_16 or P4_14) and rule set compiled for
    ``target`` with 1 to 4 message slots, or None when the spec has no query field."""
    model = data.draw(spec_models())
    if not model.query_fields:
        return None
    spec = parse_spec(RENDER[form](model), "m.p4")
    res = compile_rules(parse_rules(data.draw(rule_sets(model)), spec, "r.sub"), spec, target)
    files, _ = target_files(res, "r.sub", max_messages=data.draw(st.integers(1, 4)))
    return files


# -- tests -------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)), target=st.sampled_from(["bmv2", "tofino"]))
def test_p4info_of_random_specs_describes_the_program(data, form, target):
    """Random specs (multi-message programs) and rule sets, both targets."""
    files = random_program_files(data, form, target)
    if files is None:
        return
    info = parse_p4info(files["p4info.txtpb"])
    assert info.pkg_info.arch == ("tna" if target == "tofino" else "v1model")
    check_consistent(files["subc.p4"], info)


@pytest.mark.parametrize("target", ["bmv2", "tofino"])
@pytest.mark.parametrize("rules", SINGLE_RULES)
def test_p4info_of_single_message_programs_describes_the_program(rules, target):
    res = compile_rules(parse_rules(rules, DIFF_SPEC, "r.sub"), DIFF_SPEC, target)
    files, _ = target_files(res, "r.sub")
    assert "subc_s0" not in files["subc.p4"]  # the single-message program
    check_consistent(files["subc.p4"], parse_p4info(files["p4info.txtpb"]))


def test_pragma_only_specs_get_no_p4info():
    from conftest import ROOT

    spec_path = ROOT / "tests" / "specs" / "dns_pragma_only.p4"
    from subc.spec.front_end import load_spec

    spec = load_spec(spec_path)
    rules = parse_rules((ROOT / "tests" / "specs" / "dns.sub").read_text(), spec, "dns.sub")
    files, _ = target_files(compile_rules(rules, spec, "bmv2"), "dns.sub")
    assert "p4info.txtpb" not in files


def test_ids_and_aliases_follow_p4c():
    """Values p4c 1.2.4.8 printed for the ITCH example's P4Info."""
    from subc.backends.p4.p4info import aliases, assign_ids

    ids = assign_ids({"action": ["NoAction", "SubcIngress.subc_set_state", "SubcEgress.subc_set_port_bit"],
                      "table": ["SubcIngress.subc_s0_add_order_stock"], "counter": ["SubcIngress.subc_datagrams"],
                      "register": ["SubcEgress.subc_seq"]})
    assert ids[("action", "NoAction")] == 21257015
    assert ids[("action", "SubcIngress.subc_set_state")] == 19513806
    assert ids[("action", "SubcEgress.subc_set_port_bit")] == 30436497
    assert ids[("table", "SubcIngress.subc_s0_add_order_stock")] == 44429808
    assert ids[("counter", "SubcIngress.subc_datagrams")] == 308508676
    assert ids[("register", "SubcEgress.subc_seq")] == 376162555
    assert aliases(["SubcIngress.x", "SubcEgress.x", "SubcIngress.y"]) == {
        "SubcIngress.x": "SubcIngress.x", "SubcEgress.x": "SubcEgress.x", "SubcIngress.y": "y"}


def test_colliding_hashes_probe_to_the_next_id():
    """p4c's linear probing: the later name (in sorted order) of two with the same low 24 bits
    takes the next value."""
    from subc.backends.p4 import p4info

    saved = p4info.jenkins_hash
    try:
        p4info.jenkins_hash = lambda name: 7
        ids = p4info.assign_ids({"action": ["b", "a", "c"]})
    finally:
        p4info.jenkins_hash = saved
    assert [ids[("action", n)] for n in "abc"] == [0x01000007, 0x01000008, 0x01000009]


def _p4c_p4info(tmp_path, src: str) -> str:
    prog = tmp_path / "subc.p4"
    prog.write_text(src)
    p = subprocess.run([P4C, "--p4runtime-files", str(tmp_path / "p4c.txtpb"), "-o", str(tmp_path / "o.json"),
                        str(prog)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return (tmp_path / "p4c.txtpb").read_text()


@pytest.mark.skipif(P4C is None, reason="p4c-bm2-ss not on PATH")
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)))
def test_p4info_equals_p4c_for_random_specs(tmp_path, data, form):
    files = random_program_files(data, form, "bmv2")
    if files is None:
        return
    assert files["p4info.txtpb"] == _p4c_p4info(tmp_path, files["subc.p4"])


@pytest.mark.skipif(P4C is None, reason="p4c-bm2-ss not on PATH")
@pytest.mark.parametrize("rules", SINGLE_RULES)
def test_p4info_equals_p4c_for_single_message_programs(tmp_path, rules):
    res = compile_rules(parse_rules(rules, DIFF_SPEC, "r.sub"), DIFF_SPEC, "bmv2")
    files, _ = target_files(res, "r.sub")
    assert files["p4info.txtpb"] == _p4c_p4info(tmp_path, files["subc.p4"])
