"""Specs through the C preprocessor (issue 43): specs split across files in Camus's shapes compile,
simulate and build the eBPF program exactly as the same spec in one file; macros, conditionals,
-I/-D; constant expressions; errors located in included files and macro expansions; refusals."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import subc
from subc.cli import main as cli_main
from subc.errors import SubcError
from subc.spec import preprocessor
from subc.spec.const_expr import ConstExprError, evaluate_text
from subc.spec.front_end import load_spec, parse_spec

from spec_files import layouts, split_spec
from spec_model import binaryfile, build_message, messages_for, spec_models
from test_delivery_differential import RENDER, rule_sets

# -- Camus-shaped specs of our own ---------------------------------------------------------------

HEADER_P4 = """\
/* Market-data headers (P4_14), for router.p4. */
#define ETHERTYPE_IPV4 0x0800
#define IPPROTO_UDP 17

header_type ethernet_t { fields { dst : 48; src : 48; etherType : 16; } }
header_type ipv4_t {
    fields { version : 4; ihl : 4; tos : 8; totalLen : 16; ident : 16; flags : 3; frag : 13;
             ttl : 8; protocol : 8; csum : 16; src : 32; dst : 32; }
}
header_type udp_t { fields { sport : 16; dport : 16; len : 16; csum : 16; } }
header_type mold_t { fields { session : 80; seq : 64; count : 16; } }
header_type block_t { fields { msg_len : 16; } }
header_type kind_t { fields { code : 8; } }
header_type order_t { fields { locate : 16; tracking : 16; ts : 48; ref : 64; side : 8; shares : 32;
                               stock : 64; price : 32; } }

header ethernet_t ethernet;
header ipv4_t ipv4;
header udp_t udp;
header mold_t mold;
header block_t block;
header kind_t kind;
@pragma query_field(order.shares)
@pragma query_field_exact(order.side)
header order_t order;
"""

PARSER_P4 = """\
/* The parser functions (P4_14), for router.p4. */
parser start { return parse_ethernet; }
parser parse_ethernet {
    extract(ethernet);
    return select(latest.etherType) { ETHERTYPE_IPV4 : parse_ipv4; default : ingress; }
}
parser parse_ipv4 {
    extract(ipv4);
    return select(latest.protocol) { IPPROTO_UDP : parse_udp; default : ingress; }
}
parser parse_udp {
    extract(udp);
    return select(latest.dport) { FEED_PORT : parse_mold; default : ingress; }
}
parser parse_mold {
    extract(mold);
    extract(block);
    extract(kind);
    return select(latest.code) { 0x41 : parse_order; default : ingress; }
}
parser parse_order { extract(order); return ingress; }
"""

ROUTER_P4 = """\
/* A router over a market-data feed (P4_14): headers and parser from their own files. */
#define FEED_PORT ((26400) + (77))
#include "header.p4"
#include "parser.p4"

@pragma query_field(order.price)
@pragma query_default_action(nop)

control ingress { }
"""

P4_14_RULES = """\
order.shares > 100 and order.side == 66 : fwd(1);
order.price < 5000 : fwd(2);
order.side == 83 : fwd(3);
"""

HEADERS16_P4 = """\
/* Headers (P4_16), included through -I include. */
#define FIELD(name, bytes) bit<(bytes) * 8> name;
header ethernet_t { FIELD(dst, 6) FIELD(src, 6) FIELD(etherType, 2) }
header ipv4_t {
    bit<4> version; bit<4> ihl; bit<8> tos; bit<16> totalLen; bit<16> ident; bit<3> flags; bit<13> frag;
    bit<8> ttl; bit<8> protocol; bit<16> csum; bit<32> src; bit<32> dst;
}
header udp_t { FIELD(sport, 2) FIELD(dport, 2) FIELD(len, 2) FIELD(csum, 2) }
header mold_t { FIELD(session, 10) FIELD(seq, 8) FIELD(count, 2) }
header block_t { FIELD(msg_len, 2) }
header kind_t { FIELD(code, 1) }
header order_t { FIELD(locate, 2) FIELD(tracking, 2) FIELD(ts, 6) FIELD(ref, 8) FIELD(side, 1) FIELD(shares, 4)
                 FIELD(stock, 8) FIELD(price, 4) }
#ifdef WITH_EXECUTED
header executed_t { FIELD(locate, 2) FIELD(tracking, 2) FIELD(ts, 6) FIELD(ref, 8) FIELD(shares, 4) FIELD(match, 8) }
#endif
"""

MAIN16_P4 = """\
/* A market-data spec (P4_16) in the shape of a P4 program: core.p4, v1model.p4, local headers. */
#include <core.p4>
#include <v1model.p4>
#include <headers.p4>

#define PORT(n) (26400 + (n))
#define TYPE(c) (bit<8>) (c)

struct headers {
    ethernet_t ethernet; ipv4_t ipv4; udp_t udp; mold_t mold; block_t block; kind_t kind; order_t order;
#ifdef WITH_EXECUTED
    executed_t executed;
#endif
}
struct metadata { }

@pragma query_field(order.shares)
@pragma query_field_exact(order.side)
@pragma query_field(order.price)
#ifdef WITH_EXECUTED
@pragma query_field(executed.shares)
#endif

parser P(packet_in packet, out headers hdr, inout metadata meta, inout standard_metadata_t sm) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) { 16w0x0800 : parse_ipv4; default : accept; }
    }
    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.protocol) { 17 : parse_udp; default : accept; }
    }
    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dport) { PORT(77) : parse_mold; default : accept; }
    }
    state parse_mold {
        packet.extract(hdr.mold);
        packet.extract(hdr.block);
        packet.extract(hdr.kind);
        transition select(hdr.kind.code) {
            TYPE(0x41) : parse_order;
#ifdef WITH_EXECUTED
            TYPE(0x40 + 5) : parse_executed;
#endif
            default : accept;
        }
    }
    state parse_order { packet.extract(hdr.order); transition accept; }
#ifdef WITH_EXECUTED
    state parse_executed { packet.extract(hdr.executed); transition accept; }
#endif
}
"""

P4_16_RULES = P4_14_RULES


def inline(root: Path, main: str, include_dirs=()) -> str:
    """The spec ``main`` with every local ``#include`` replaced by the file's text (what the
    preprocessor does, written by hand)."""
    out = []
    for line in (root / main).read_text().split("\n"):
        s = line.strip()
        if s.startswith("#include") and "core.p4" not in s and "v1model.p4" not in s:
            name = s.split(None, 1)[1].strip()[1:-1]
            for d in ["", *include_dirs]:
                if (root / d / name).exists():
                    out.append(inline(root / d, name).rstrip("\n"))
                    break
            else:
                raise AssertionError(name)
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def order_message(side: int, shares: int, price: int) -> bytes:
    """An Add Order message of the specs above: code 'A', then the order header's fields."""
    return struct.pack(">BHH6sQBI8sI", 0x41, 1, 2, b"\0" * 6, 7, side, shares, b"STOCK   ", price)


def outputs(root: Path, rules: str, target: str, include_dirs=(), defines=(), monkeypatch=None):
    """{file: text} of ``rules`` over ``root``/spec.p4 compiled for ``target`` (read as
    ``spec.p4`` from ``root``, so that a split spec and its one-file form have the same path)."""
    cwd = os.getcwd()
    os.chdir(root)
    try:
        spec = load_spec("spec.p4", include_dirs, defines)
        c = subc.compile(subc.parse_rules(rules, spec), spec, target=target)
        return spec, c, dict(c.files)
    finally:
        os.chdir(cwd)


def assert_same(a: Path, b: Path, rules: str, inc_a=(), inc_b=(), defs_a=(), defs_b=(), trace: Path | None = None):
    """The spec in folder ``a`` and the one in ``b`` give the same outputs for bmv2 and ebpf (byte
    for byte) and the same simulation of ``trace``, or the same refusal (located where each is
    written)."""
    for target in ("bmv2", "ebpf"):
        try:
            _, ca, fa = outputs(a, rules, target, inc_a, defs_a)
        except SubcError as e:
            with pytest.raises(SubcError) as eb:
                outputs(b, rules, target, inc_b, defs_b)
            assert eb.value.message == e.message
            continue
        _, cb, fb = outputs(b, rules, target, inc_b, defs_b)
        assert fa == fb, target
        if trace is not None and target == "bmv2":
            assert subc.simulate(ca, str(trace)).as_json() == subc.simulate(cb, str(trace)).as_json()


def test_p4_14_header_parser_router_as_one_file(tmp_path):
    split, one = tmp_path / "split", tmp_path / "one"
    split.mkdir()
    one.mkdir()
    (split / "header.p4").write_text(HEADER_P4)
    (split / "parser.p4").write_text(PARSER_P4)
    (split / "spec.p4").write_text(ROUTER_P4)
    (one / "spec.p4").write_text(inline(split, "spec.p4"))
    trace = tmp_path / "t.bin"
    trace.write_bytes(binaryfile([order_message(66, 500, 100), order_message(83, 5, 9000), order_message(1, 1, 1)]))
    assert_same(split, one, P4_14_RULES, trace=trace)
    spec = outputs(split, P4_14_RULES, "bmv2")[0]
    assert sorted(spec.query_fields) == ["order.price", "order.shares", "order.side"]
    assert spec.parser is not None
    udp = next(s for s in spec.parser.states if s.name == "parse_udp")
    assert udp.transition.cases[0][0] == hex(26477)


@pytest.mark.parametrize("variant", [(), ("WITH_EXECUTED",)])
def test_p4_16_core_local_headers_macros_and_ifdef_variants(tmp_path, variant):
    split, one = tmp_path / "split", tmp_path / "one"
    (split / "include").mkdir(parents=True)
    one.mkdir()
    (split / "include" / "headers.p4").write_text(HEADERS16_P4)
    (split / "spec.p4").write_text(MAIN16_P4)
    defines = "".join(f"#define {d}\n" for d in variant)
    (one / "spec.p4").write_text(defines + inline(split, "spec.p4", ["include"]))
    trace = tmp_path / "t.bin"
    trace.write_bytes(binaryfile([order_message(66, 500, 100), order_message(83, 5, 9000)]))
    rules = P4_16_RULES + ("executed.shares > 3 : fwd(4);\n" if variant else "")
    assert_same(split, one, rules, inc_a=["include"], defs_a=variant, trace=trace)
    spec = outputs(split, rules, "bmv2", ["include"], variant)[0]
    assert spec.headers["order_t"].fields[-1] == ("price", 32)
    assert ("executed.shares" in spec.query_fields) == bool(variant)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                               HealthCheck.function_scoped_fixture])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)))
def test_random_specs_split_across_files_compile_and_simulate_as_one_file(tmp_path_factory, data, form):
    model = data.draw(spec_models())
    if not model.query_fields:
        return
    text = RENDER[form](model)
    root = tmp_path_factory.mktemp("spec")
    split, one = root / "split", root / "one"
    one.mkdir()
    (one / "spec.p4").write_text(text)
    inc = split_spec(text, data.draw(layouts(text)), split)
    msgs = data.draw(st.lists(messages_for(model, allow_unknown=True), min_size=1, max_size=6))
    trace = root / "t.bin"
    trace.write_bytes(binaryfile([build_message(model, code, values) for code, values in msgs]))
    assert_same(split, one, data.draw(rule_sets(model)), inc_a=inc, trace=trace)


# -- constant expressions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("((26400) + (77))", 26477),
        ("1 << 4 | 3", 19),
        ("(bit<8>) 300", 44),
        ("8w200 + 100", 44),
        ("8w1 - 2", 255),
        ("(int<8>) 255", -1),
        ("(int<8>) 128 >> 1", -64),
        ("-8s128", -128),
        ("4w0xA ++ 4w0x5", 0xA5),
        ("~8w0x0F", 0xF0),
        ("7 / 2 + 7 % 2", 4),
        ("0x10 & 0x18 ^ 1", 17),
        ("K * 2", 6),
        ("(T) 0x1FF", 0xFF),
        ("C + 1", 0),
    ],
)
def test_constant_expressions_evaluate_as_p4c(text, value):
    assert evaluate_text(text, {"K": 3, "C": 255}, {"C": (8, False)}, {"T": 8}) == value


@pytest.mark.parametrize("text", ["~5", "1 / 0", "-4 % 3", "8w1 + 16w1", "x + 1", "1 == 1", "1 << -1", "(bit<0>) 1"])
def test_non_constant_expressions_are_refused(text):
    with pytest.raises(ConstExprError):
        evaluate_text(text, {})


def test_widths_consts_and_pragma_arguments_take_expressions():
    spec = parse_spec(
        "#define W(n) ((n) * 8)\nconst bit<16> BASE = 16w0xFFFF + 2;\n"
        "header h_t { bit<W(2)> a; bit<(W(1) >> 1)> b; bit<4> c; }\nstruct headers { h_t h; }\n"
        "@pragma query_field(h.a, W(2))\n@pragma query_field(h.b)\n@pragma query_field_scale(h.a, 1 + 1)\n",
        "x.p4",
    )
    assert spec.headers["h_t"].fields == [("a", 16), ("b", 4), ("c", 4)]
    assert spec.consts["BASE"] == 1 and spec.query_fields["h.a"].scale == 2


# -- located errors ----------------------------------------------------------------------------


def error_of(path: Path, *args, **kw) -> SubcError:
    with pytest.raises(SubcError) as ei:
        load_spec(str(path), *args, **kw)
    return ei.value


def test_error_in_an_included_file_is_located_there_with_the_include_chain(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "inner.p4").write_text("header h_t {\n    bit<8> a;\n    bit<8> b\n}\n")
    (tmp_path / "inc" / "outer.p4").write_text('// outer\n#include "inner.p4"\n')
    (tmp_path / "spec.p4").write_text('#include <core.p4>\n#include "inc/outer.p4"\n@pragma query_field(h.a)\n')
    e = error_of(tmp_path / "spec.p4")
    loc = e.location
    assert (loc.path, loc.line, loc.column) == (str(tmp_path / "inc" / "inner.p4"), 4, 1)
    assert loc.included_from == ((str(tmp_path / "inc" / "outer.p4"), 2), (str(tmp_path / "spec.p4"), 2))
    text = e.render().split("\n")
    assert text[0] == f"In file included from {tmp_path}/inc/outer.p4:2,"
    assert text[1] == f"                 from {tmp_path}/spec.p4:2:"
    assert text[2] == f"{tmp_path}/inc/inner.p4:4:1: error: expected ';', found '}}'"
    assert text[3:5] == ["    }", "    ^"]


def test_error_inside_a_macro_expansion_points_at_the_invocation(tmp_path):
    (tmp_path / "spec.p4").write_text(
        "#define WIDE(n) bit<(n) + nowhere>\nheader h_t {\n    bit<8> a;  WIDE(8) b;\n}\n"
        "struct headers { h_t h; }\n@pragma query_field(h.a)\n"
    )
    e = error_of(tmp_path / "spec.p4")
    assert (e.location.line, e.location.column, e.location.macro) == (3, 16, "WIDE")
    assert "'nowhere' is not a constant" in e.message
    assert e.render().split("\n")[-1] == "note: in expansion of macro 'WIDE'"
    # a macro's argument is located exactly
    (tmp_path / "spec.p4").write_text(
        "#define WIDE(n) bit<(n) + 1>\nheader h_t {\n    bit<8> a;  WIDE(oops) b;\n}\n"
        "struct headers { h_t h; }\n@pragma query_field(h.a)\n"
    )
    e = error_of(tmp_path / "spec.p4")
    assert (e.location.line, e.location.column) == (3, 21)


def test_hash_error_line_and_defines(tmp_path):
    (tmp_path / "spec.p4").write_text("#ifndef VARIANT\n#error pick a VARIANT with -D\n#endif\n@pragma query_field(h.a, 8)\n")
    e = error_of(tmp_path / "spec.p4")
    assert (e.location.line, e.message) == (2, "#error pick a VARIANT with -D")
    assert load_spec(tmp_path / "spec.p4", defines=["VARIANT=2"]).query_fields["h.a"].width == 8
    (tmp_path / "spec.p4").write_text('#line 100 "gen.p4"\n@pragma query_field(h.a, 8)\n@pragma query_nope(h.a)\n')
    e = error_of(tmp_path / "spec.p4")
    assert (e.location.path, e.location.line) == ("gen.p4", 101)


# -- refusals and limits -----------------------------------------------------------------------


def test_includes_outside_the_allowed_folders_are_refused(tmp_path):
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "h.p4").write_text("@pragma query_field(h.a, 8)\n")
    for inc in ['"../common/h.p4"', f'"{tmp_path}/common/h.p4"', "</etc/passwd>"]:
        (spec_dir / "spec.p4").write_text(f"#include {inc}\n")
        e = error_of(spec_dir / "spec.p4")
        assert "refused" in e.message and e.location.line == 1
    (spec_dir / "spec.p4").write_text('#include "../common/h.p4"\n')
    e = error_of(spec_dir / "spec.p4")
    assert load_spec(spec_dir / "spec.p4", [str(tmp_path / "common")]).query_fields
    (spec_dir / "spec.p4").write_text('#include "h.p4"\n')
    assert load_spec(spec_dir / "spec.p4", [str(tmp_path / "common")]).query_fields
    os.symlink(tmp_path / "common" / "h.p4", spec_dir / "link.p4")
    (spec_dir / "spec.p4").write_text('#include "link.p4"\n')
    assert "refused" in error_of(spec_dir / "spec.p4").message


def test_recursion_depth_missing_files_fifos_and_huge_expansions(tmp_path):
    (tmp_path / "spec.p4").write_text('#include "spec.p4"\n')
    e = error_of(tmp_path / "spec.p4")
    assert "nested more than" in e.message and len(e.location.included_from) == preprocessor.MAX_INCLUDE_DEPTH
    (tmp_path / "spec.p4").write_text('\n#include "nothere.p4"\n')
    e = error_of(tmp_path / "spec.p4")
    assert "cannot find include file 'nothere.p4'" in e.message and e.location.line == 2
    os.mkfifo(tmp_path / "fifo.p4")
    (tmp_path / "spec.p4").write_text('#include "fifo.p4"\n')
    assert "not a regular file" in error_of(tmp_path / "spec.p4").message
    laughs = "#define L0 x x x x x x x x x x\n" + "".join(
        f"#define L{i} L{i - 1} L{i - 1} L{i - 1} L{i - 1} L{i - 1} L{i - 1} L{i - 1} L{i - 1} L{i - 1} L{i - 1}\n"
        for i in range(1, 9)
    )
    (tmp_path / "spec.p4").write_text(laughs + "L8\n")
    assert "macro expansion exceeds" in error_of(tmp_path / "spec.p4").message
    (tmp_path / "spec.p4").write_text("#frobnicate\n")
    assert "invalid preprocessing directive #frobnicate" in error_of(tmp_path / "spec.p4").message
    (tmp_path / "spec.p4").write_text("#ifdef X\n@pragma query_field(h.a, 8)\n")
    assert "unterminated" in error_of(tmp_path / "spec.p4").message.lower()


def test_cli_takes_I_and_D_and_writes_nothing_on_error(tmp_path, capsys):
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "headers.p4").write_text(HEADERS16_P4)
    (tmp_path / "spec.p4").write_text(MAIN16_P4)
    (tmp_path / "r.sub").write_text(P4_16_RULES + "executed.shares > 3 : fwd(4);\n")
    out = tmp_path / "out"
    args = ["compile", str(tmp_path / "r.sub"), "--spec", str(tmp_path / "spec.p4"), "-o", str(out)]
    with pytest.raises(SystemExit) as ei:
        cli_main(args + ["-I", str(tmp_path / "include")], standalone_mode=False)
    assert ei.value.code == 2 and not out.exists()
    assert "executed" in capsys.readouterr().err
    cli_main(args + ["-I", str(tmp_path / "include"), "-D", "WITH_EXECUTED"], standalone_mode=False)
    assert (out / "subc.p4").exists()
    assert "header executed_t { bit<(2) * 8> locate;" in (out / "subc.p4").read_text()


def test_date_and_time_come_from_source_date_epoch(monkeypatch, tmp_path):
    """__DATE__/__TIME__ never make outputs depend on when they were made (reproducible builds)."""
    from subc.spec.preprocessor import preprocess

    spec = tmp_path / "s.p4"
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert preprocess(str(spec), "__DATE__ __TIME__\n").text.split() == ['"Jan', "1", '1970"', '"00:00:00"']
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # 2023-11-14 22:13:20 UTC
    assert preprocess(str(spec), "__DATE__ __TIME__\n").text.split() == ['"Nov', "14", '2023"', '"22:13:20"']
