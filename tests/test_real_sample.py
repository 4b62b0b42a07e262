"""The real ITCH sample end to end: `subc simulate` agrees with the rules on every Add Order."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import EXAMPLE, real_sample
from subc.workloads.itch_codec import ADD_ORDER_TYPES, ReadStats, decode_add_order, read_binaryfile, stock_symbol


def simulate(trace, *extra, check=True):
    p = subprocess.run(
        [sys.executable, "-m", "subc.cli", "simulate", str(EXAMPLE / "rules.sub"), "--spec", str(EXAMPLE / "spec.p4"),
         "--trace", str(trace), *extra],
        capture_output=True, text=True,
    )
    if check:
        assert p.returncode == 0, p.stderr + p.stdout
    return p


def independent_counts(trace):
    """Per-port counts computed straight from the decoded messages, for the example rules."""
    ports = {1: 0, 2: 0, 3: 0, 4: 0, 5: 0}
    for _, msg in read_binaryfile(trace):
        if msg[:1] not in ADD_ORDER_TYPES:
            continue
        m = decode_add_order(msg)
        sym, shares, price = stock_symbol(m["add_order.stock"]), m["add_order.shares"], m["add_order.price"] / 10_000
        side = chr(m["add_order.buy_sell_indicator"])
        ports[1] += sym == "BOB"
        ports[2] += shares >= 1000
        ports[3] += sym == "CHAR" and (side == "B" and price < 10 or shares >= 500)
        ports[4] += sym == "ALC" and 20 <= price <= 25
        ports[5] += sym in ("BOB", "CHAR", "ALC") and shares < 100
    return {str(p): n for p, n in ports.items() if n}


@pytest.mark.parametrize("name,fallbacks", [("ex20101224.TEST_ITCH_50", 12012), ("ex20101224.TEST_ITCH_50.reframed", 0)])
def test_simulate_real_sample(name, fallbacks):
    trace = real_sample(name)
    doc = json.loads(simulate(trace, "--json").stdout)
    assert doc["messages"] == 12012 and doc["classified"] == 5000
    assert doc["by_type"] == {"A": 4997, "D": 1745, "E": 198, "F": 3, "H": 3, "P": 5000, "R": 3, "S": 6, "U": 12, "X": 45}
    assert doc["zero_length_fallbacks"] == fallbacks
    assert doc["disagreements"] == 0
    assert doc["per_port"] == independent_counts(trace)
    assert doc["per_port"]["1"] == 2482  # every BOB order (SOURCE.md)


def test_simulate_text_output():
    out = simulate(real_sample()).stdout
    assert "disagreements:        0" in out and "classified:           5000" in out


def test_corrupt_trace_is_a_clear_error(tmp_path):
    data = real_sample("ex20101224.TEST_ITCH_50.reframed").read_bytes()
    bad = tmp_path / "bad.itch"
    bad.write_bytes(data[:1000] + b"\x00\x00Z" + data[1000:])
    p = simulate(bad, check=False)
    assert p.returncode == 2
    assert str(bad) in p.stderr and "byte offset" in p.stderr


def test_reader_counts_match_source_notes():
    stats = ReadStats()
    n = sum(1 for _ in read_binaryfile(real_sample(), stats))
    assert n == 12012 and stats.zero_length_fallbacks == 12012
