"""Fuzzing the rule parser: every text either parses or raises SubcError with a location in it,
within a second and bounded memory (the contract and bounds of tests/test_fuzz.py).

Inputs: the corpus ``tests/fuzz_corpus/rules`` (seeds and every input that once broke the parser),
mutations of its files, and token soup over the rule language.  ``subc check`` gets the same
contract on the corpus: exit status 0 or 1, never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subc.lang.rules import parse_rules
from subc.spec.front_end import load_spec

from test_fuzz import bounded, fuzz_settings, outcome

HERE = Path(__file__).resolve().parent
CORPUS = sorted((HERE / "fuzz_corpus" / "rules").iterdir())
SPEC_PATH = HERE.parent / "examples" / "itch" / "spec.p4"
SPEC = load_spec(SPEC_PATH)
SEEDS = [p.read_text(errors="replace") for p in CORPUS]

TOKENS = [
    "add_order.stock", "add_order.price", "add_order.shares", "stock", "price", "x.y", "==", "=", "!=", "<", "<=", ">",
    ">=", "in", "not", "!", "and", "&&", "or", "||", "(", ")", "{", "}", ",", ":", ";", "fwd", "drop", "fwd(1)",
    '"GOOGL"', '"', "\\", "0", "1", "511", "512", "4294967295", "4294967296", "-1", "0x1F", "1.5", "10.0.0.1",
    "10.0.0.0/8", "::1", "aa:bb:cc:dd:ee:ff", "/", "#", "//", "\n", " ", "\t", "\x00", "é", "9" * 50,
]


def check_rules(text: str, path: str = "fuzz.sub"):
    with bounded(f"parse_rules of {len(text)} characters"):
        rules, err = outcome(lambda: parse_rules(text, SPEC, path))
    if err is not None:
        loc = err.location
        assert loc is not None, f"no location: {err}"
        assert loc.path == path and 1 <= loc.line <= text.count("\n") + 1, loc
        assert 1 <= loc.column <= len(loc.source_line) + 1, loc
        err.render()
        return
    for r in rules:
        assert r.location.path == path and r.actions


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_rule_corpus(path):
    check_rules(path.read_text(errors="replace"), path.name)


def test_check_cli_on_the_corpus():
    p = subprocess.run([sys.executable, "-m", "subc.cli", "check", *map(str, CORPUS), "--spec", str(SPEC_PATH),
                        "--format", "json"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert '"code": "limit"' in p.stdout and '"code": "syntax"' in p.stdout


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["insert", "delete", "duplicate", "truncate", "token"]))
        i = draw(st.integers(0, len(text)))
        if op == "insert":
            text = text[:i] + draw(st.text(max_size=4)) + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 8)):]
        elif op == "duplicate":
            j = draw(st.integers(i, min(len(text), i + 200)))
            text = text[:j] + text[i:j] * draw(st.integers(1, 20)) + text[j:]
        elif op == "truncate":
            text = text[:i]
        else:
            text = text[:i] + " " + draw(st.sampled_from(TOKENS)) + " " + text[i:]
    return text


@fuzz_settings(300)
@given(mutated())
def test_mutated_rules(text):
    check_rules(text)


@fuzz_settings(300)
@given(st.lists(st.sampled_from(TOKENS), max_size=60).map(" ".join))
def test_token_soup(text):
    check_rules(text)
