"""The eBPF program as C (docs/ebpf.md "The program"): static files plus two generated headers.

Every output of ``subc compile --target ebpf`` (the example, single-message and stateful
variants, random specs) builds as a BPF object with Debian's clang and libbpf's headers
(``clang -target bpf -DSUBC_LIBBPF -Wall -Werror``), without root; the static files are C, not
templates, and keep their clang-format style; the single translation unit bcc takes
(:func:`program_source`, :func:`bcc_dialect`) is checked on small inputs.  That the program bcc
loads behaves as before is what the kernel differential tests check (test_ebpf.py,
test_spec_decoder.py, test_stateful_ebpf.py, the broker tests).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebpf_util import DIFF_SPEC_TEXT
from spec_model import render_p4_14, render_p4_16, spec_models
from subc import compile as subc_compile
from subc import parse_rules, parse_spec
from subc.backends.ebpf.source import (
    GENERATED_FILES,
    MAIN_FILE,
    PROGRAM_FILES,
    STATIC_FILES,
    bcc_dialect,
    clang_command,
    program_source,
    static_files,
)
from subc.errors import SubcError

ROOT = Path(__file__).resolve().parent.parent
EBPF_DIR = ROOT / "subc" / "backends" / "ebpf" / "bpf"
ITCH_SPEC = ROOT / "examples" / "itch" / "spec.p4"


def need_clang():
    if shutil.which("clang") is None or not Path("/usr/include/bpf/bpf_helpers.h").is_file():
        pytest.skip("needs clang and libbpf-dev (tests/run.sh installs them as root)")


def build_object(files: dict[str, str], tmp: Path, defines: list[str] = ()) -> Path:
    """Write the program's files to ``tmp`` and build them with clang; the object's path."""
    for name in PROGRAM_FILES:
        (tmp / name).write_text(files[name])
    obj = tmp / "subc_filter.o"
    p = subprocess.run(clang_command(tmp, obj, list(defines)), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return obj


def sections(obj: Path) -> set[str]:
    """Section names of a BPF object (llvm-objdump, installed with clang)."""
    tool = shutil.which("llvm-objdump") or "llvm-objdump-14"
    out = subprocess.run([tool, "-h", str(obj)], capture_output=True, text=True, check=True).stdout
    return {line.split()[1] for line in out.splitlines() if line.strip()[:1].isdigit()}


DIFF_SPEC_TIME = DIFF_SPEC_TEXT + "@pragma query_time(m.g, ns)\n@pragma query_counter(c1, 1000)\n"
VARIANTS = {
    # name: (spec text, rules)
    "itch": (ITCH_SPEC.read_text(), (ROOT / "examples" / "itch" / "rules.sub").read_text()),
    "itch-state-arrival": (
        ITCH_SPEC.read_text(),
        'add_order.stock == "GOOGL" and avg(add_order.price, window=1000) > 50 : fwd(1);\n'
        "add_order.shares > 100 and count(window=0) >= 3 : fwd(2);\n",
    ),
    "single": (DIFF_SPEC_TEXT, "m.a > 3 and m.c == 1 : fwd(1);\nm.d == 8/5 and ip.dstAddr == 10.0.0.0/8 : fwd(2);\n"),
    "single-state-time-counters": (
        DIFF_SPEC_TIME,
        "m.a > 3 and c1 < 5 : fwd(1), inc(c1);\nm.c == 1 and max(m.e, window=10) > 7 : fwd(2);\n",
    ),
}


def variant_files(name: str) -> dict[str, str]:
    text, rules = VARIANTS[name]
    spec = parse_spec(text, f"{name}.p4")
    return subc_compile(parse_rules(rules, spec), spec, "ebpf").files


def test_output_holds_the_static_files_verbatim_and_the_generated_headers():
    files = variant_files("itch")
    assert set(PROGRAM_FILES) <= set(files)
    static = static_files()
    for name in STATIC_FILES:
        assert files[name] == static[name] == (EBPF_DIR / name).read_text()
    for name in GENERATED_FILES:
        assert (EBPF_DIR / f"{name}.j2").is_file()
        assert "Do not edit" in files[name]
    # what depends on the rule set is in the generated headers only
    assert '"GOOGL"' not in "".join(static.values())
    assert "add_order" in files["subc_classify.h"] and "add_order" not in "".join(static.values())


def test_static_files_are_c_not_templates():
    for name in STATIC_FILES:
        text = (EBPF_DIR / name).read_text()
        for token in ("{{", "{%", "{#"):
            assert token not in text, f"{name}: template syntax {token!r}"


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_outputs_build_with_clang_as_bpf_objects(tmp_path, name):
    need_clang()
    files = variant_files(name)
    obj = build_object(files, tmp_path)
    secs = sections(obj)
    assert {"xdp", "xdp/devmap", "tc", ".maps", "license"} <= secs, secs
    build_object(files, tmp_path, ["SUBC_PARSE_ONLY"])  # the benchmark's baseline builds too
    build_object(files, tmp_path, ["SUBC_BENCH_STAGES=1", "SUBC_BENCH_NO_NOTE"])  # and its breakdown's variants
    obj = build_object(files, tmp_path, ["SUBC_JOURNAL=1", "SUBC_JOURNAL_PAGES=16"])  # subc load --journal
    p = subprocess.run([shutil.which("llvm-objdump") or "llvm-objdump-14", "-t", str(obj)], capture_output=True, text=True)
    assert ("subc_jnl" in p.stdout) == ('"moldudp64": true' in files["maps.json"]), "the journal's ring: MoldUDP64 only"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), form=st.sampled_from(["p4_16", "p4_14"]))
def test_random_specs_build_with_clang(tmp_path_factory, data, form):
    """The generated headers are valid C for any spec the eBPF target takes: random specs (header
    layouts, parse graphs, MoldUDP64 or not) and a rule per query field."""
    need_clang()
    model = data.draw(spec_models(max_messages=3))
    if not model.query_fields:
        return
    spec = parse_spec((render_p4_16 if form == "p4_16" else render_p4_14)(model), "m.p4")
    lines = []
    for i, q in enumerate(model.query_fields[:4]):
        c = data.draw(st.integers(0, (1 << model.field_width(q.name)) - 1))
        op = "==" if q.kind != "range" else data.draw(st.sampled_from(["==", "<", ">="]))
        lines.append(f"{q.name} {op} {c} : fwd({i + 1});")
    try:
        files = subc_compile(parse_rules("\n".join(lines) + "\n", spec), spec, "ebpf").files
    except SubcError as e:
        assert "spans more than 8 bytes" in e.message, e.render()  # a stated limit of the eBPF target
        return
    build_object(files, tmp_path_factory.mktemp("obj"))


def test_static_c_keeps_its_clang_format_style():
    if shutil.which("clang-format") is None:
        pytest.skip("needs clang-format (tests/run.sh installs it as root)")
    p = subprocess.run(
        ["clang-format", "--dry-run", "--Werror", *STATIC_FILES], cwd=EBPF_DIR, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-3000:]


def test_program_source_inlines_each_quoted_include_once():
    files = {
        "main.c": '#include <linux/bpf.h>\n#include "a.h"\n#include "b.h"\nint x;\n',
        "a.h": '#include "b.h"\nint a;\n',
        "b.h": "int b;\n",
    }
    assert program_source(files, "main.c") == "#include <linux/bpf.h>\nint b;\n\nint a;\n\n\nint x;\n"
    with pytest.raises(SubcError, match="'c.h'"):
        program_source({"main.c": '#include "c.h"\n'}, "main.c")


def test_bcc_dialect_rewrites_map_helpers_and_refuses_others():
    src = (
        "v = bpf_map_lookup_elem(&subc_leaf, &slot);\n"
        "bpf_map_update_elem(&subc_fan_miss, &set, &first, BPF_ANY);\n"
        "bpf_tail_call(ctx, &subc_jmp_xdp, 2);\n"
        "return bpf_redirect_map(inner, 0, BPF_F_BROADCAST);\n"
    )
    assert bcc_dialect(src) == (
        "v = subc_leaf.lookup(&slot);\n"
        "subc_fan_miss.update(&set, &first);\n"
        "subc_jmp_xdp.call(ctx, 2);\n"
        "return bpf_redirect_map(inner, 0, BPF_F_BROADCAST);\n"
    )
    with pytest.raises(SubcError, match="line 2: bpf_map_delete_elem"):
        bcc_dialect("int x;\nbpf_map_delete_elem(&subc_leaf, &k);\n")
    with pytest.raises(SubcError, match="bpf_map_update_elem"):
        bcc_dialect("bpf_map_update_elem(&m, &k, &v, BPF_NOEXIST);\n")


def test_the_translation_unit_has_no_map_helper_bcc_cannot_take():
    """Every map access of the program (static and generated) is in a form bcc_dialect rewrites:
    the whole program goes through it without error, and no helper call on a map is left."""
    for name in VARIANTS:
        src = bcc_dialect(program_source(variant_files(name)))
        assert "bpf_map_lookup_elem(&" not in src and "bpf_tail_call(" not in src
        assert src.count(f'#include "{MAIN_FILE}"') == 0


def test_map_name_constants_are_the_maps_the_c_declares():
    """subc/backends/ebpf/map_names.py names exactly the maps subc_maps.h declares, in order (the
    map writers open them by these names)."""
    import re

    from subc.backends.ebpf.map_names import STATIC_MAPS

    declared = re.findall(r"^SUBC_[A-Z_]+\((subc_\w+),", (EBPF_DIR / "subc_maps.h").read_text(), re.M)
    assert list(STATIC_MAPS) == declared
