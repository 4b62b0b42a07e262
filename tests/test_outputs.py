"""`subc compile` outputs: the P4 program, commands.txt, bfrt_setup.py, entries.json, report.json.

The control-plane files are read back (commands.txt parsed, bfrt_setup.py run against a
recording stand-in for ``bfrt``) and must describe exactly the entries of entries.json.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import EXAMPLE

RULES = EXAMPLE / "rules.sub"
SPEC = EXAMPLE / "spec.p4"


def subc(*args, check=True):
    p = subprocess.run([sys.executable, "-m", "subc.cli", *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(p.stderr)
    return p


@pytest.fixture(scope="module", params=["bmv2", "tofino"])
def compiled(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "out"
    subc("compile", RULES, "--spec", SPEC, "--target", request.param, "-o", out, "--dot")
    return request.param, out


def test_files_present(compiled):
    target, out = compiled
    names = {p.name for p in out.iterdir()}
    extra = "commands.txt" if target == "bmv2" else "bfrt_setup.py"
    assert names == {"subc.p4", "entries.json", "states.jsonl", "p4info.txtpb", "report.json", "bdd.dot", extra}
    assert (out / "bdd.dot").read_text().startswith("digraph")


def test_p4_program_structure(compiled):
    target, out = compiled
    src = (out / "subc.p4").read_text()
    doc = json.loads((out / "entries.json").read_text())
    assert ("#include <v1model.p4>" in src) == (target == "bmv2")
    assert ("#include <tna.p4>" in src) == (target == "tofino")
    for t in doc["tables"]:
        short = t["name"].split(".", 1)[1]
        m = re.search(rf"table {short} \{{(.*?)\n    \}}", src, re.S)
        assert m, short
        body = m.group(1)
        # the default --capacity-factor 2: room for an update's new entries beside the old ones in
        # the tables keyed by state; the delivery tables are fixed by the ports
        n = len(t["entries"])
        assert f"size = {max(1, n) if t['role'] in ('deliver', 'egress') else max(16, 2 * n)};" in body
        for k in t["keys"]:
            assert re.search(rf"{re.escape(k['name'])} : {k['match_kind']}\b", body), (short, k)
    for state in ("parse_ipv4", "parse_udp", "parse_moldudp64", "parse_add_order"):
        assert f"state {state} {{" in src
    assert "header itch_add_order_t {" in src and "struct headers {" in src
    if target == "tofino":
        assert "state subc_spec_start {" in src and "transition subc_spec_start;" in src
        assert "Switch(pipe) main;" in src
    else:
        assert "V1Switch(" in src and "mark_to_drop(standard_metadata)" in src
    assert "struct metadata {" not in src  # replaced by subc_metadata_t


def _entry_key(table, e):
    return (table, json.dumps(e["match"]), e["action"], json.dumps(e["params"]))


def test_commands_txt_matches_entries(tmp_path):
    out = tmp_path / "o"
    subc("compile", RULES, "--spec", SPEC, "--target", "bmv2", "-o", out)
    doc = json.loads((out / "entries.json").read_text())
    want = {}
    for t in doc["tables"]:
        kinds = [k["match_kind"] for k in t["keys"]]
        for e in t["entries"]:
            want[_entry_key(t["name"], e)] = e.get("priority")
    got = {}
    groups, nodes = {}, []
    for line in (out / "commands.txt").read_text().splitlines():
        if line.startswith("//") or not line.strip():
            continue
        words = line.split()
        if words[0] == "table_add":
            table, action = words[1], words[2]
            arrow = words.index("=>")
            t = next(t for t in doc["tables"] if t["name"] == table)
            kinds = [k["match_kind"] for k in t["keys"]]
            match = []
            for kind, w in zip(kinds, words[3:arrow]):
                if kind == "exact":
                    match.append({"exact": int(w)})
                elif kind == "range":
                    lo, hi = w.split("->")
                    match.append({"range": [int(lo), int(hi)]})
                else:
                    v, plen = w.split("/")
                    match.append({"lpm": [int(v), int(plen)]})
            rest = words[arrow + 1 :]
            names = list(next(e for e in t["entries"] if e["action"] == action)["params"])
            params = dict(zip(names, map(int, rest[: len(names)])))
            prio = int(rest[len(names)]) if len(rest) > len(names) else None
            got[_entry_key(table, {"match": match, "action": action, "params": params})] = prio
        elif words[0] == "mc_mgrp_create":
            groups[int(words[1])] = None
        elif words[0] == "mc_node_create":
            nodes.append(sorted(map(int, words[2:])))
        elif words[0] == "mc_node_associate":
            groups[int(words[1])] = nodes[int(words[2])]
    assert set(got) == set(want)
    # BMv2: the smallest priority value wins, entries.json: the largest
    for k, p in want.items():
        if p is not None:
            other = [q for kk, q in want.items() if kk[0] == k[0] and q is not None and q != p]
            for q in other:
                assert (got[k] < got[next(kk for kk, qq in want.items() if kk[0] == k[0] and qq == q)]) == (p > q)
    assert groups == {g["group"]: sorted(g["ports"]) for g in doc["multicast_groups"]}


class _Recorder:
    """Stands in for bfrt_python's ``bfrt`` object and records every call by path."""

    def __init__(self, calls, path=()):
        self._calls, self._path = calls, path

    def __getattr__(self, name):
        return _Recorder(self._calls, self._path + (name,))

    def __call__(self, *args, **kwargs):
        self._calls.append((".".join(self._path), args, kwargs))


def test_bfrt_setup_matches_entries(tmp_path):
    out = tmp_path / "o"
    subc("compile", RULES, "--spec", SPEC, "--target", "tofino", "-o", out)
    doc = json.loads((out / "entries.json").read_text())
    calls = []
    exec(compile((out / "bfrt_setup.py").read_text(), "bfrt_setup.py", "exec"), {"bfrt": _Recorder(calls)})
    adds = [c for c in calls if ".add_with_" in c[0]]
    assert len(adds) == sum(len(t["entries"]) for t in doc["tables"])
    by_table = {}
    for path, _, kw in adds:
        table = path.split(".")[-2]
        by_table.setdefault(table, []).append(kw)
    for t in doc["tables"]:
        short = t["name"].split(".", 1)[1]
        recorded = by_table.get(short, [])
        assert len(recorded) == len(t["entries"])
        for e, kw in zip(t["entries"], recorded):
            for k, m in zip(t["keys"], e["match"]):
                n = k["name"].split(".", 1)[1].replace(".", "_")
                if "exact" in m:
                    assert kw[n] == m["exact"]
                elif "range" in m:
                    assert [kw[n + "_start"], kw[n + "_end"]] == m["range"]
                else:
                    assert [kw[n], kw[n + "_p_length"]] == m["lpm"]
            for p, v in e["params"].items():
                assert kw[p] == v
    mgids = {c[2]["MGID"]: c[2]["MULTICAST_NODE_ID"] for c in calls if c[0] == "pre.mgid.add"}
    nodes = {c[2]["MULTICAST_NODE_ID"]: c[2]["DEV_PORT"] for c in calls if c[0] == "pre.node.add"}
    assert {g: nodes[n[0]] for g, n in mgids.items()} == {g["group"]: g["ports"] for g in doc["multicast_groups"]}
    assert calls[-1][0] == "complete_operations"


def test_report(compiled):
    target, out = compiled
    rep = json.loads((out / "report.json").read_text())
    doc = json.loads((out / "entries.json").read_text())
    assert rep["rules"] == 5 and rep["target"] == target
    assert rep["diagram_states"] > 0 and rep["field_order"] == doc["field_order"]
    assert "phases_s" not in rep  # timings would make outputs differ between runs
    assert rep["multicast_groups"] == len(doc["multicast_groups"])
    assert sum(t["entries"] for t in rep["tables"]) == rep["total_entries"]


def test_compilation_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        subc("compile", RULES, "--spec", SPEC, "--target", "tofino", "-o", d)
    for name in ("subc.p4", "entries.json", "bfrt_setup.py", "report.json"):
        assert (a / name).read_text() == (b / name).read_text()
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())


def test_timings_file(tmp_path):
    subc("compile", RULES, "--spec", SPEC, "-o", tmp_path / "out", "--timings", tmp_path / "t.json")
    t = json.loads((tmp_path / "t.json").read_text())
    assert {"parse", "order_search", "slicing", "tables", "codegen", "write"} == set(t)
    assert all(v >= 0 for v in t.values())


def test_bad_input_leaves_output_untouched(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "marker").write_text("previous compile")
    bad = tmp_path / "bad.sub"
    bad.write_text('add_order.stock == "BOB" : fwd(1);\nadd_order.shares >> 5 : fwd(2);\n')
    p = subc("compile", bad, "--spec", SPEC, "-o", out, check=False)
    assert p.returncode == 2
    lines = p.stderr.splitlines()
    assert lines[0] == f"{bad}:2:19: error: unexpected '>', expected a value"
    assert lines[1].strip() == "add_order.shares >> 5 : fwd(2);"
    assert lines[2].rstrip().endswith("^")
    assert sorted(p.name for p in out.iterdir()) == ["marker"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    subc("compile", RULES, "--spec", SPEC, "-o", out)
    assert "marker" not in {p.name for p in out.iterdir()}


def test_conflict_names_both_rules(tmp_path):
    rules = tmp_path / "c.sub"
    rules.write_text('add_order.stock == "BOB" : fwd(1);\nadd_order.shares > 100 : drop();\n')
    p = subc("compile", rules, "--spec", SPEC, "-o", tmp_path / "o", check=False)
    assert p.returncode == 2
    assert f"{rules}:2:1: error: conflicting actions" in p.stderr
    assert f"{rules}:1" in p.stderr and "fwd(1)" in p.stderr


def test_pragma_only_spec_gives_control_block(tmp_path):
    spec = tmp_path / "camus.p4"
    spec.write_text("@pragma query_field(add_order.shares, 32)\n@pragma query_field_exact(add_order.stock, 64)\n")
    rules = tmp_path / "r.sub"
    rules.write_text('add_order.shares > 10 and add_order.stock == "BOB" : fwd(1, 2);\n')
    out = tmp_path / "o"
    p = subc("compile", rules, "--spec", spec, "-o", out)
    assert "not a whole program" in p.stderr
    src = (out / "subc_control.p4").read_text()
    assert "control SubcIngress(" in src and "V1Switch" not in src and "parser" not in src.split("*/", 1)[1]
    assert (out / "commands.txt").exists()


def test_field_order_option(tmp_path):
    out = tmp_path / "o"
    subc("compile", RULES, "--spec", SPEC, "-o", out, "--field-order", "shares,price,buy_sell_indicator,stock")
    rep = json.loads((out / "report.json").read_text())
    assert rep["field_order"] == ["add_order.shares", "add_order.price", "add_order.buy_sell_indicator", "add_order.stock"]
    assert rep["orders_tried"] == 1
    p = subc("compile", RULES, "--spec", SPEC, "-o", out, "--field-order", "shares,price", check=False)
    assert p.returncode == 2 and "--field-order misses field(s)" in p.stderr
