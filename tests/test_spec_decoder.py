"""The spec is the one source of truth: random specs (P4_16 and P4_14), Camus's spec forms, and the
one decoder derived from the spec, checked against messages built independently with scapy.

Specs and messages come from :mod:`spec_model` (which imports nothing from subc): hypothesis draws a
message format (field names, widths from 1 to 64 bits at unaligned offsets, several message types
selected by a type field), renders it as P4_16 and as Camus's P4_14, and builds message bytes from
field values with scapy.  subc's decoder must give every message exactly the values it was built
from, and ``subc simulate`` must give every message the decision of the rules evaluated on those
values (not on anything subc decoded).
"""

from __future__ import annotations

from collections import Counter

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spec_model import (binaryfile, build_frame, build_message, message_length, messages_for, reference_fields,
                        render_p4_14, render_p4_16, spec_models, valid_instances)
from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.spec.front_end import parse_spec
from subc.backends.ebpf.maps_doc import MapsDoc
from subc.backends.ebpf.source import program_source
from subc.errors import SubcError
from subc.wire.decoder import MessageDecoder
from subc.sim.trace import simulate_trace

SPECS = Path(__file__).parent / "specs"
CORPUS = [("camus_itch_p4_14", "camus_itch_p4_14.p4"), ("camus_itch_p4_16", "camus_itch_p4_16.p4"),
          ("market_other_names", "market_other_names.p4"), ("siena_p4_14", "siena_p4_14.p4"),
          ("dns", "dns_pragma_only.p4")]
RENDER = {"p4_16": render_p4_16, "p4_14": render_p4_14}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)))
def test_decoder_gives_the_values_messages_were_built_from(data, form):
    model = data.draw(spec_models())
    spec = parse_spec(RENDER[form](model), f"m.{form}.p4")
    assert spec.form == form
    dec = MessageDecoder(spec, [f for h in model.headers for f in (f"{h.instance}.{x.name}" for x in h.fields)])
    assert sorted(dec.types.lengths) == sorted(model.codes)
    for code in model.codes:
        assert dec.types.lengths[code] == message_length(model, code)
    for _ in range(6):
        code, values = data.draw(messages_for(model, allow_unknown=True))
        msg = build_message(model, code, values)
        d = dec.decode(msg)
        want = reference_fields(model, code, values)
        if model.message(code) is None:
            assert d.status == "unknown_type"
        else:
            assert d.status == "ok", d
        got = {k: v for k, v in d.values.items() if k.split(".", 1)[0] not in dec.network_instances
               and k.split(".", 1)[0] not in dec.feed.framing}
        assert got == want
        assert set(valid_instances(model, code)) <= d.valid
        if model.message(code) is not None and len(msg) > 1:
            short = dec.decode(msg[:-1])
            assert short.status == "length_mismatch" and short.values == {}
            longer = dec.decode(msg + b"\x00")
            assert longer.status == "length_mismatch" and longer.expected == len(msg)


def _rules_text(model, draw) -> str:
    """A few rules over the model's query fields (constants drawn around each field's values)."""
    lines = []
    for i, q in enumerate(model.query_fields[:4]):
        w = model.field_width(q.name)
        c = draw(st.integers(0, (1 << w) - 1))
        op = draw(st.sampled_from(["==", "!="] if q.kind != "range" else ["==", "<", ">=", "!="]))
        lines.append(f"{q.name} {op} {c} : fwd({i + 1});")
    return "\n".join(lines) + "\n"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)))
def test_simulate_matches_rules_on_built_values(tmp_path_factory, data, form):
    model = data.draw(spec_models())
    if not model.query_fields:
        return
    spec = parse_spec(RENDER[form](model), "m.p4")
    text = _rules_text(model, data.draw)
    rules = parse_rules(text, spec, "r.sub")
    res = compile_rules(rules, spec, "bmv2")
    drawn = [data.draw(messages_for(model, allow_unknown=True)) for _ in range(12)]
    trace = tmp_path_factory.mktemp("t") / "trace.bin"
    trace.write_bytes(binaryfile([build_message(model, c, v) for c, v in drawn]))
    out = simulate_trace(res, trace)
    assert out.disagreements == 0 and out.messages == len(drawn)
    # expected per-port counts: the rules evaluated on the values the messages were built from
    from subc.lang.ast import evaluate, predicates

    headers = {p.field.split(".")[0] for r in rules for p in predicates(r.condition)}
    want: dict[int, int] = {}
    for code, values in drawn:
        fields = reference_fields(model, code, values)
        if not headers <= set(valid_instances(model, code)):
            continue
        for r in rules:
            if evaluate(r.condition, fields):
                for a in r.actions:
                    for p in a.args:
                        want[p] = want.get(p, 0) + 1
    assert dict(out.per_port) == want


@pytest.mark.parametrize("name,spec", CORPUS)
@pytest.mark.parametrize("target", ["bmv2", "tofino", "ebpf"])
def test_camus_spec_corpus_compiles(tmp_path, name, spec, target):
    p = subprocess.run([sys.executable, "-m", "subc.cli", "compile", str(SPECS / f"{name}.sub"), "--spec",
                        str(SPECS / spec), "--target", target, "-o", str(tmp_path / "out")],
                       capture_output=True, text=True)
    if name == "dns" and target == "ebpf":
        assert p.returncode == 2 and "pragma-only" in p.stderr and ":0:0:" not in p.stderr
        return
    assert p.returncode == 0, p.stderr
    files = {f.name for f in (tmp_path / "out").iterdir()}
    if target == "ebpf":
        assert "subc_filter.bpf.c" in files
    elif name == "dns":
        text = (tmp_path / "out" / "subc_control.p4").read_text()
        assert "action answerDNS(bit<32> arg0)" in text and "action notfoundDNS()" in text
    else:
        text = (tmp_path / "out" / "subc.p4").read_text()
        assert "transition select(" in text and "extract(" in text
        if target == "bmv2" and shutil.which("p4test"):  # the P4_14 translations are valid P4_16
            p = subprocess.run(["p4test", str(tmp_path / "out" / "subc.p4")], capture_output=True, text=True)
            assert p.returncode == 0, p.stderr


def test_p4_14_parser_becomes_p4_16():
    spec = parse_spec((SPECS / "camus_itch_p4_14.p4").read_text(), "c.p4")
    assert spec.form == "p4_14" and spec.whole_program
    assert spec.query_fields["add_order.price"].width == 32  # no width in the pragma: from the header
    states = {s.name: s for s in spec.parser.states}
    eth = next(s for s in spec.parser.states if "ethernet" in s.extracts)
    assert eth.transition.fields == ["ethernet.etherType"]
    assert all(t != "ingress" for s in states.values() for _, t in s.transition.cases)
    dec = MessageDecoder(spec)
    assert dec.feed.moldudp64 and dec.types.label(next(iter(dec.types.lengths))) == "A"
    assert dec.types.lengths[ord("A")] == 36


P4_14_BAD = [
    ("header_type h_t { fields { a : 8; } }\nheader h_t h;\nparser start { extract(h); "
     "return select(current(0, 8)) { default : ingress; } }\n@pragma query_field(h.a)\n", 3, 42, "current(...)"),
    ("header_type h_t { fields { a : 8; } }\nheader h_t h;\nparser start { extract(h); set_metadata(m.x, 1); "
     "return ingress; }\n@pragma query_field(h.a)\n", 3, 28, "set_metadata"),
    ("header_type h_t { fields { a : 8; } }\nheader h_t h[4];\nparser start { extract(h[next]); return ingress; }\n"
     "@pragma query_field(h.a, 8)\n", 3, 24, "header stack"),
    ("header g_t h;\n@pragma query_field(h.a, 8)\n", 1, 8, "unknown header type 'g_t'"),
    ("header_type h_t { fields { a : 8; } }\nheader h_t h;\nheader k_t { bit<8> b; }\n@pragma query_field(h.a)\n",
     3, 1, "P4_16 'header' declaration in a P4_14 spec"),
    ("@pragma query_field(h.a, 8)\n@pragma query_counter(c, 100)\n@pragma query_counter(c)\n", 3, 23,
     "counter 'c' is declared twice"),
]


@pytest.mark.parametrize("text,line,col,frag", P4_14_BAD)
def test_p4_14_errors_are_located(text, line, col, frag):
    with pytest.raises(SubcError) as ei:
        parse_spec(text, "bad.p4")
    e = ei.value
    assert frag in e.message, e.message
    assert (e.location.line, e.location.column) == (line, col), str(e)


def test_pragma_only_spec_declares_the_actions_its_rules_call():
    spec = parse_spec((SPECS / "dns_pragma_only.p4").read_text(), "dns.p4")
    assert spec.form == "pragmas" and "notfoundDNS" in spec.actions
    rules = parse_rules((SPECS / "dns.sub").read_text(), spec, "dns.sub")
    act = spec.actions["answerDNS"]
    assert act.params == [("arg0", 32)]
    assert any(a.name == "answerDNS" for r in rules for a in r.actions)
    with pytest.raises(SubcError, match="takes 1 argument"):
        parse_rules('dns_query.qname == "x" : answerDNS(10.0.0.1, 5);', spec, "x.sub")


def test_p4_16_spec_still_rejects_unknown_actions(example_spec):
    with pytest.raises(SubcError, match="unknown action 'frob'"):
        parse_rules("add_order.shares > 1 : frob(1);", example_spec, "x.sub")


def test_renamed_fields_are_decoded_by_the_spec(tmp_path):
    """The issue's case: a spec that calls buy_sell_indicator 'side' (and parses it as a number)."""
    text = (Path(__file__).parent.parent / "examples/itch/spec.p4").read_text()
    text = text.replace("bit<8>  buy_sell_indicator;\n    bit<32> shares;\n    bit<64> stock;\n    bit<32> price;",
                        "bit<8>  side;\n    bit<32> shares;\n    bit<64> stock;\n    bit<32> price;", 1)
    text = text.replace("@pragma query_field_exact(add_order.buy_sell_indicator)\n@pragma query_field_alpha"
                        "(add_order.buy_sell_indicator)\n", "@pragma query_field_exact(add_order.side, 8)\n")
    spec_p = tmp_path / "side.p4"
    spec_p.write_text(text)
    rules_p = tmp_path / "side.sub"
    rules_p.write_text("add_order.side == 0x42 and add_order.price < 10 : fwd(1);\n")
    from conftest import real_sample
    from subc.workloads.itch_codec import decode_add_order, read_binaryfile

    want = sum(1 for _, m in read_binaryfile(real_sample()) if m[:1] in (b"A", b"F")
               and decode_add_order(m)["add_order.buy_sell_indicator"] == 0x42
               and decode_add_order(m)["add_order.price"] < 100_000)
    assert want > 0
    p = subprocess.run([sys.executable, "-m", "subc.cli", "simulate", str(rules_p), "--spec", str(spec_p), "--trace",
                        str(real_sample()), "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["per_port"] == {"1": want} and doc["disagreements"] == 0


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)))
def test_xdp_classifies_random_specs_as_the_rules_on_built_values(data, form):
    """The eBPF program compiled from a random spec (BPF_PROG_TEST_RUN) gives every frame, built with
    scapy from field values, the decision of the rules evaluated on those values."""
    from ebpf_util import Runner, fake_subscribers, need_root
    from subc.lang.ast import evaluate, predicates
    from subc.backends.files import target_files
    from subc.dataplane.ebpf.broker import LoadedFilter
    from subc.semantics.reference import combine, default_decision

    need_root()
    model = data.draw(spec_models(max_messages=3))
    if not model.query_fields:
        return
    spec = parse_spec(RENDER[form](model), "m.p4")
    rules = parse_rules(_rules_text(model, data.draw), spec, "r.sub")
    try:
        res = compile_rules(rules, spec, "ebpf")
        files, _ = target_files(res, "r.sub")
    except SubcError as e:
        assert "spans more than 8 bytes" in e.message, e.render()  # an unaligned 64-bit field: a stated limit
        return
    doc = MapsDoc.from_json(json.loads(files["maps.json"]))
    with LoadedFilter.build(doc, program_source(files), fake_subscribers(), max_endpoints=8) as lf:
        run = Runner(lf)
        headers = {p.field.split(".")[0] for r in rules for p in predicates(r.condition)}
        for _ in range(10):
            code, values = data.draw(messages_for(model, allow_unknown=True))
            fields = reference_fields(model, code, values)
            if headers <= set(valid_instances(model, code)):
                want = combine([r for r in rules if evaluate(r.condition, fields)], spec)
            else:
                want = default_decision(spec)
            _, _, leaf = run.run(build_frame(model, [(code, values)]))
            assert leaf is not None, "a feed frame was not classified"
            assert run.decision(leaf) == want, (code, values)
        # many messages per datagram: each message is classified on its own
        for _ in range(4):
            batch = data.draw(st.lists(messages_for(model, allow_unknown=True), min_size=2, max_size=12))
            want = Counter()
            for code, values in batch:
                fields = reference_fields(model, code, values)
                if headers <= set(valid_instances(model, code)):
                    want[combine([r for r in rules if evaluate(r.condition, fields)], spec)] += 1
                else:
                    want[default_decision(spec)] += 1
            _, hits = run.run_many(build_frame(model, batch))
            got = Counter()
            for leaf, n in hits.items():
                got[run.decision(leaf)] += n
            assert got == want, batch


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)))
def test_vector_decoder_equals_the_message_decoder(data, form):
    """analyze's NumPy decoder gives every message the scalar decoder's status, type and values
    (messages of every type, unknown types, cut and extended messages, one BinaryFILE buffer)."""
    import numpy as np

    from subc.analysis.gather import STATUSES, VectorDecoder
    from subc.analysis.messages import pad
    from subc.analysis.splits import walk_binaryfile

    model = data.draw(spec_models())
    spec = parse_spec(RENDER[form](model), "m.p4")
    dec = MessageDecoder(spec)
    fields = [f for f in dec.graph.fields if dec.graph.fields[f].width <= 64
              and f.split(".", 1)[0] not in dec.feed.framing]
    dec = MessageDecoder(spec, fields)
    vec = VectorDecoder(dec, fields)
    msgs = []
    for _ in range(data.draw(st.integers(1, 12))):
        code, values = data.draw(messages_for(model, allow_unknown=True))
        m = build_message(model, code, values)
        cut = data.draw(st.sampled_from([0, 0, 0, -1, 1]))
        msgs.append(m[:cut] if cut < 0 else m + bytes(cut))
    msgs = [m for m in msgs if m]
    buf = pad(walk_binaryfile(binaryfile(msgs), 0, "t.bin", True, dec.types))
    vd = vec.decode(buf.data, buf.starts, buf.lengths)
    for i, m in enumerate(msgs):
        d = dec.decode(m)
        assert STATUSES[vd.status[i]] == d.status, (i, d)
        assert (vd.type_key[i] if vd.type_key[i] >= 0 else None) == d.type_key
        if d.classified:
            none = np.zeros(len(msgs), bool)
            got = {f: int(vd.values[f][i]) for f in fields if vd.valid.get(f.split(".", 1)[0], none)[i]}
            assert got == d.values, {k: (got.get(k), d.values.get(k)) for k in set(got) | set(d.values)
                                     if got.get(k) != d.values.get(k)}


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=40), st.data())
def test_gather_bits_reads_any_alignment(data, draw):
    import numpy as np

    from subc.spec.parse_graph import bits_at
    from subc.analysis.gather import gather_bits

    width = draw.draw(st.integers(1, 64))
    bits = [draw.draw(st.integers(0, max(0, len(data) * 8 - width))) for _ in range(5)] if len(data) * 8 >= width else []
    if not bits:
        return
    padded = np.frombuffer(data + bytes(16), dtype=np.uint8)
    got = gather_bits(padded, np.array(bits, dtype=np.int64), width)
    # bits_at reads big-endian by Python integers: an independent formula
    assert [int(x) for x in got] == [bits_at(data, b, width) for b in bits]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)))
def test_encoder_builds_messages_that_carry_the_values(data, form):
    """``subc check``'s example messages: bytes built from field values with the spec, read back by
    an independent bit slicer that follows the model (not subc's decoder)."""
    from subc.wire.encoder import MessageEncoder

    model = data.draw(spec_models())
    spec = parse_spec(RENDER[form](model), "m.p4")
    enc = MessageEncoder(MessageDecoder(spec))
    code, values = data.draw(messages_for(model))
    chosen = {k: values[k] for k in data.draw(st.lists(st.sampled_from(sorted(values)), unique=True, max_size=4))}
    msg = enc.encode(chosen)
    assert msg is not None, (code, chosen)
    got_code = int.from_bytes(msg[: model.type_width // 8], "big")
    mt = model.message(got_code)
    assert mt is not None and len(msg) == message_length(model, got_code)
    bit = model.type_width
    seen = {}
    for h in mt.headers:
        for f in h.fields:
            chunk = int.from_bytes(msg, "big")
            total = len(msg) * 8
            seen[f"{h.instance}.{f.name}"] = (chunk >> (total - bit - f.width_bits)) & ((1 << f.width_bits) - 1)
            bit += f.width_bits
    assert all(seen.get(k) == v for k, v in chosen.items()), (chosen, seen)


LOOKAHEAD_SPEC = """header e_t { bit<48> d; bit<48> s; bit<16> t; }
header m_t { bit<8> a; }
header n_t { bit<8> b; }
struct headers { e_t e; m_t m; n_t n; }
parser P(packet_in packet, out headers hdr) {
    state start { packet.extract(hdr.e); transition select(hdr.e.t) { 1: pm; 2: pl; default: accept; } }
    state pm { packet.extract(hdr.m); transition accept; }
    state pl { transition select(packet.lookahead<bit<8>>()) { 1: pn; default: accept; } }
    state pn { packet.extract(hdr.n); transition accept; }
}
@pragma query_field(m.a)
@pragma query_field(n.b)
@pragma query_field(e.t)
"""


def test_a_field_the_decoder_cannot_reach_is_a_compile_error():
    spec = parse_spec(LOOKAHEAD_SPEC, "la.p4")
    compile_rules(parse_rules("m.a > 1 : fwd(1);", spec, "r.sub"), spec)  # m is reached
    with pytest.raises(SubcError) as ei:
        compile_rules(parse_rules("n.b > 1 : fwd(1);", spec, "r.sub"), spec)
    assert "lookahead" in ei.value.message and (ei.value.location.line, ei.value.location.column) == (8, 16)
    unparsed = parse_spec(LOOKAHEAD_SPEC.replace("2: pl;", ""), "u.p4")
    with pytest.raises(SubcError, match="never extracts header 'n'") as ei:
        compile_rules(parse_rules("n.b > 1 : fwd(1);", unparsed, "r.sub"), unparsed)
    assert ei.value.location.line == 12


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)))
def test_analyze_tasks_match_rules_on_built_values(tmp_path_factory, data, form):
    """``subc analyze``'s per-split work (decode with the spec in NumPy, tables, value classes) on a
    BinaryFILE of scapy-built messages: every classified message gets the decision of the rules
    evaluated on the values it was built from, and the reference's value classes agree."""
    from subc.lang.ast import evaluate, predicates
    from subc.analysis.analyze import make_bundle
    from subc.analysis.evaluate import evaluate_split, representatives
    from subc.analysis.reference_np import evaluate_rules
    from subc.semantics.reference import combine

    model = data.draw(spec_models())
    if not model.query_fields:
        return
    spec = parse_spec(RENDER[form](model), "m.p4")
    rules = parse_rules(_rules_text(model, data.draw), spec, "r.sub")
    res = compile_rules(rules, spec, "bmv2")
    drawn = [data.draw(messages_for(model, allow_unknown=True)) for _ in range(15)]
    trace = tmp_path_factory.mktemp("a") / "trace.bin"
    trace.write_bytes(binaryfile([build_message(model, c, v) for c, v in drawn]))
    bundle = make_bundle(res, [str(trace)], 0)
    ev = evaluate_split(bundle, 0)
    headers = {p.field.split(".")[0] for r in rules for p in predicates(r.condition)}
    want = []
    for code, values in drawn:
        fields = reference_fields(model, code, values)
        if headers <= set(valid_instances(model, code)):
            want.append(combine([r for r in rules if evaluate(r.condition, fields)], spec))
    got = [bundle.tables.decisions[c] for c in ev.codes]
    assert got == want
    if len(ev.keys):
        import numpy as np

        uniq, inv = np.unique(ev.keys, return_inverse=True)
        ref = evaluate_rules(rules, spec, representatives(bundle.classes, uniq), np.bincount(inv))
        assert [ref.decisions[i] for i in inv] == want


@pytest.mark.skipif(shutil.which("p4test") is None, reason="p4test not on PATH")
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)))
def test_p4test_accepts_programs_of_random_specs(tmp_path, data, form):
    """The v1model program of a random spec, P4_16 or translated from P4_14, passes p4c's front end."""
    from subc.backends.files import target_files

    model = data.draw(spec_models())
    if not model.query_fields:
        return
    spec = parse_spec(RENDER[form](model), "m.p4")
    res = compile_rules(parse_rules(_rules_text(model, data.draw), spec, "r.sub"), spec, "bmv2")
    files, _ = target_files(res, "r.sub")
    prog = tmp_path / f"{form}.p4"
    prog.write_text(files["subc.p4"])
    p = subprocess.run(["p4test", str(prog)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr + "\n" + RENDER[form](model)
