"""Workload generators (``subc gen``): deterministic for a seed, and following their distributions
(checked statistically, with tolerances far wider than the sampling error at these sizes)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from subc.lang.rules import parse_rules
from subc.spec.front_end import parse_spec
from subc.workloads.itch_codec import ReadStats, decode_add_order, read_binaryfile
from subc.workloads.distributions import mean_prices, symbol_names, zipf_weights
from subc.workloads.itch_rules import itch_rules
from subc.workloads.itch_trace import MESSAGE_MIX, generate_trace
from subc.workloads.siena import siena_rules, siena_spec


def test_itch_rules_are_deterministic_and_parse(example_spec):
    a = itch_rules(2000, symbols=50, ports=16, seed=7)
    assert a == itch_rules(2000, symbols=50, ports=16, seed=7)
    assert a != itch_rules(2000, symbols=50, ports=16, seed=8)
    rules = parse_rules(a, example_spec)
    assert len(rules) == 2000
    ports = {p for r in rules for (_, p) in r.atoms()}
    assert ports <= set(range(1, 17)) and len(ports) == 16


def test_itch_price_rules_follow_zipf_symbols_and_per_symbol_prices():
    n, symbols = 20000, 50
    text = itch_rules(n, symbols=symbols, seed=3)
    names = symbol_names(symbols)
    counts = Counter(re.findall(r'stock == "(\w+)"', text))
    p = zipf_weights(symbols)
    for rank in (0, 1, 4, 9):  # observed share of a rank within 15% of the Zipf probability
        assert counts[names[rank]] / n == pytest.approx(p[rank], rel=0.15)
    kinds = Counter("range" if ">=" in line else (">" if ">" in line else "<") for line in text.splitlines())
    for k in ("range", ">", "<"):
        assert kinds[k] / n == pytest.approx(1 / 3, abs=0.02)
    means = mean_prices(symbols)
    top = [float(x) for x in re.findall(rf'stock == "{names[0]}" and add_order.price [<>] ([\d.]+)', text)]
    assert np.mean(top) == pytest.approx(means[0], rel=0.02)  # thresholds centre on the symbol's mean
    assert np.std(top) / means[0] == pytest.approx(0.05, rel=0.2)


def test_camus_form_is_uniform_over_symbols_shares_and_hosts():
    n = 30000
    text = itch_rules(n, symbols=100, ports=200, seed=1, form="camus")
    shares = np.array([int(x) for x in re.findall(r"shares > (\d+)", text)])
    hosts = np.array([int(x) for x in re.findall(r"fwd\((\d+)\)", text)])
    syms = Counter(re.findall(r'stock == "(\w+)"', text))
    assert shares.min() >= 1 and shares.max() <= 1000 and shares.mean() == pytest.approx(500.5, rel=0.02)
    assert hosts.min() >= 1 and hosts.max() <= 200 and len(set(hosts)) == 200
    assert len(syms) == 100 and max(syms.values()) < 2 * n / 100


def test_siena_rules_follow_the_generator_parameters():
    n, conj, disj, attrs = 3000, 3, 2, 10
    text = siena_rules(n, conj, disj, attrs, zipf=False, seed=5)
    assert text == siena_rules(n, conj, disj, attrs, zipf=False, seed=5)
    spec = parse_spec(siena_spec(attrs), "siena.p4")
    rules = parse_rules(text, spec)
    assert len(rules) == n
    preds = re.findall(r"siena\.a(\d+) (==|<|>) (\d+)", text)
    assert len(preds) == n * conj * disj
    ops = Counter(op for _, op, _ in preds)
    assert ops["=="] / len(preds) == pytest.approx(0.5, abs=0.02)
    assert ops["<"] / len(preds) == pytest.approx(0.25, abs=0.02)
    values = np.array([int(v) for _, _, v in preds])
    assert values.min() == 0 and values.max() == 100 and values.mean() == pytest.approx(50, abs=1.5)
    attr = Counter(int(a) for a, _, _ in preds)
    assert max(attr.values()) / min(attr.values()) < 1.15  # uniform
    for line in text.splitlines():  # distinct attributes within a conjunction
        for term in line.split(" or "):
            names = re.findall(r"siena\.a(\d+)", term)
            assert len(names) == len(set(names)) == conj
    zipf = Counter(int(a) for a, _, _ in re.findall(r"siena\.a(\d+) (==|<|>) (\d+)", siena_rules(n, 1, 1, attrs, zipf=True)))
    assert zipf[0] / n == pytest.approx(zipf_weights(attrs)[0], rel=0.1)
    with pytest.raises(ValueError, match="distinct attributes"):
        siena_rules(1, 5, 1, 4)


def test_trace_is_deterministic_well_formed_and_has_the_message_mix(tmp_path):
    n = 200_000
    a, b = tmp_path / "a.itch", tmp_path / "b.itch"
    counts = generate_trace(a, n, symbols=40, seed=9)
    generate_trace(b, n, symbols=40, seed=9)
    assert a.read_bytes() == b.read_bytes()
    generate_trace(b, n, symbols=40, seed=10)
    assert a.read_bytes() != b.read_bytes()
    stats = ReadStats()
    prev, adds, refs = 0, [], []
    for _, m in read_binaryfile(a, stats):  # the reader checks every length against its type
        ts = int.from_bytes(m[5:11], "big")
        assert ts >= prev
        prev = ts
        if m[:1] in (b"A", b"F"):
            adds.append(decode_add_order(m))
    assert stats.messages == n == sum(counts.values())
    assert stats.zero_length_fallbacks == 0
    flow = n - 6 - 2 * 40
    for t, share in MESSAGE_MIX.items():
        assert stats.by_type[t] / flow == pytest.approx(share, abs=0.003), t
    assert stats.by_type["S"] == 6 and stats.by_type["R"] == stats.by_type["H"] == 40
    refs = [d["add_order.order_ref_number"] for d in adds]
    assert refs == list(range(1, len(refs) + 1))
    names = symbol_names(40)
    sym = Counter(d["add_order.stock"].to_bytes(8, "big").decode().rstrip() for d in adds)
    assert sym[names[0]] / len(adds) == pytest.approx(zipf_weights(40)[0], rel=0.05)
    hours = np.array([d["add_order.timestamp"] for d in adds]) / 3.6e12
    market = (hours >= 9.5) & (hours < 16)
    assert market.mean() == pytest.approx(0.90, abs=0.01)
    first_hour, midday = ((hours >= 9.5) & (hours < 10.5)).sum(), ((hours >= 12) & (hours < 13)).sum()
    assert first_hour > 1.5 * midday  # U shape
    lots = np.array([d["add_order.shares"] for d in adds])
    assert (lots % 100 == 0).mean() == pytest.approx(0.8, abs=0.01)


def test_gen_cli_writes_files_atomically(tmp_path):
    out = tmp_path / "rules.sub"
    spec = tmp_path / "siena.p4"
    r = subprocess.run([sys.executable, "-m", "subc.cli", "gen", "siena", "--filters", "5", "--conj", "2",
                        "--attrs", "4", "-o", str(out), "--spec-out", str(spec)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(out.read_text().splitlines()) == 5 and "siena_t" in spec.read_text()
    r = subprocess.run([sys.executable, "-m", "subc.cli", "gen", "siena", "--filters", "5", "--conj", "5",
                        "--attrs", "4"], capture_output=True, text=True)
    assert r.returncode == 2 and "error:" in r.stderr
    r = subprocess.run([sys.executable, "-m", "subc.cli", "gen", "trace", "--messages", "10", "--symbols", "10",
                        "-o", str(tmp_path / "t.itch")], capture_output=True, text=True)
    assert r.returncode == 2 and "fewer than the 26 system and directory messages" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rules.sub", "siena.p4"]
