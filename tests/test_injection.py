"""Generated code is never steerable by input: crafted names are refused, literals become numbers."""

from __future__ import annotations

import copy
import re

import pytest

from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.spec.front_end import parse_spec
from subc.backends.files import target_files
from subc.backends.safety import identifier
from subc.errors import SubcError

PAYLOADS = ['"', "'", "{", "}", "#include <x.h>", "\n", "/*", "*/", "//", ";", "\\", "$(id)", "`", "\x00", "é"]


@pytest.mark.parametrize("target", ["bmv2", "tofino", "ebpf"])
def test_string_literals_reach_outputs_only_as_numbers(example_spec, target):
    """Crafted strings give the same outputs as plain strings of the same lengths, but for numbers."""
    crafted = ['{};', '\\"; #i', '*/ //', '/* x', '#inc', "a'b", "}}{{"]
    plain = [chr(ord("A") + i) * len(s.replace("\\\\", "")) for i, s in enumerate(crafted)]

    def outputs(strings):
        text = "".join(f'add_order.stock == "{s}" : fwd({i + 1});\n' for i, s in enumerate(strings))
        files, _ = target_files(compile_rules(parse_rules(text, example_spec, "inj.sub"), example_spec, target), "inj.sub")
        # numbers, and hex digests of numbers (states.jsonl's signatures: they cannot carry a payload)
        return {name: re.sub(r"\d+", "0", re.sub(r"\b[0-9a-f]{32,64}\b", "H", body)) for name, body in files.items()}

    assert outputs(crafted) == outputs(plain)


def test_paths_in_comments_cannot_close_them(example_spec):
    res = compile_rules(parse_rules('add_order.price > 1 : fwd(1);', example_spec, "r.sub"), example_spec, "bmv2")
    files, _ = target_files(res, "x */ #include <evil.h> /*\nint y;")
    head = files["subc.p4"].split("*/", 1)[0]
    assert "#include <evil.h>" not in files["subc.p4"] and "\n" not in head.split("rules ", 1)[1].split(" (", 1)[0]


@pytest.mark.parametrize("rule, message", [
    ('add_order.stock == "a\nb" : fwd(1);', "unexpected character"),
    ('add_order.stock == "#include <stdio.h>" : fwd(1);', "bytes long; the field holds 8"),
    ('add_order.stock == "é" : fwd(1);', "not ASCII"),
    ('add_order.price > 1 : fwd(1); } control Evil() { apply { } }', "unexpected"),
    ('add_order.price#include > 1 : fwd(1);', "unexpected"),
    ('add_order.price > 1 : evil_action(1);', "unknown action"),
    ('add_order.price > 1 : fwd(1) /* x */;', "unexpected"),
    ('add_order."price" > 1 : fwd(1);', "unexpected"),
    ('add_order.price > 1 : fwd("1; drop()");', ""),
    ('add_order.price > 1 : fwd(1, 99999999999999999999);', ""),
])
def test_crafted_rules_are_rejected_with_a_location(example_spec, rule, message):
    with pytest.raises(SubcError) as e:
        parse_rules(rule, example_spec, "inj.sub")
    assert e.value.location is not None and e.value.location.line >= 1
    assert message in e.value.message


@pytest.mark.parametrize("spec_text", [
    '@pragma query_field(h.a"; #include, 8)',
    "@pragma query_field(h.a/*, 8)",
    "@pragma query_field(h.a}, 8)",
    "@pragma query_field(h.a\n#include <x>, 8)",
    "@pragma query_field(h.{a}, 8)",
    "@pragma query_field(h.a, 8; drop)",
    "@pragma query_default_action(drop(); #include)",
])
def test_crafted_spec_names_are_rejected(spec_text):
    with pytest.raises(SubcError) as e:
        parse_spec(spec_text, "inj.p4")
    assert e.value.location is not None


@pytest.mark.parametrize("payload", PAYLOADS)
def test_identifier_guard_refuses_every_payload(payload):
    for name in (f"a{payload}", f"{payload}a", f"a.b{payload}"):
        with pytest.raises(SubcError, match="refusing to generate code"):
            identifier(name, "name", dotted=True)
    assert identifier("hdr.add_order.price", "key", dotted=True) == "hdr.add_order.price"


@pytest.mark.parametrize("target", ["bmv2", "tofino"])
def test_template_boundary_checks_names_that_bypassed_the_front_end(example_spec, target):
    """A name that got into the pipeline by another way than the front ends is still refused."""
    res = compile_rules(parse_rules('add_order.price > 1 : fwd(1);', example_spec, "r.sub"), example_spec, target)
    for tamper in (
        lambda p: setattr(p.tables[0], "name", "t { } #include <x>"),
        lambda p: setattr(p.tables[0], "default_action", ("subc_drop(); evil", ())),
        lambda p: setattr(p.tables[0], "default_action", ("subc_set_state", (("next_state", "0); evil("),))),
        lambda p: setattr(p, "headers", ["add_order/*"]),
    ):
        bad = copy.deepcopy(res)
        tamper(bad.pipeline)
        with pytest.raises(SubcError, match="refusing to generate code"):
            target_files(bad, "r.sub")
