#!/usr/bin/env python3
"""Per-packet cost of the eBPF target's XDP and TC programs, with BPF_PROG_TEST_RUN.

Workload (Camus ITCH, Jepsen et al. HotNets 2018, Figure 5c): N rules
``add_order.stock == S and add_order.shares > P : fwd(H)``, S one of 100 symbols, P uniform in
1..1000, H one of 200 hosts (seeded, deterministic).  For each N: compile with subc
(``--target ebpf``), load the programs (not attached) in filter mode (a match passes to the local
stack, so the test frame is not rewritten between repetitions), then run 64 Add Order frames
(symbols of the rule set and outside it, shares uniform) through

* XDP: the full program (parse, one lookup per field, leaf action, counters);
* XDP parse-only: the same source built with ``-DSUBC_PARSE_ONLY`` (parse, no lookup);
* TC: the TC program classifying by itself (the path used when XDP leaves no metadata),

each ``--repeat`` times (default 1,000,000) and print the mean ns per packet (kernel-measured
duration of BPF_PROG_TEST_RUN).  Needs root.  Writes JSON with ``--json FILE``.

    sudo python3 bench/ebpf_bench.py --sizes 1000,10000 --repeat 1000000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from subc.compiler.driver import compile_rules  # noqa: E402
from subc.compiler.rules import parse_rules  # noqa: E402
from subc.compiler.spec import load_spec  # noqa: E402
from subc.compiler.targets import target_files  # noqa: E402
from subc.runtime.bpf import compile_and_load, test_run  # noqa: E402
from subc.runtime.broker import LoadedFilter, cflags  # noqa: E402
from subc.workloads.itch_codec import encode_add_order, stock_value  # noqa: E402
from subc.runtime.moldudp64 import encode_packet  # noqa: E402

SYMBOLS = [f"S{i:03d}" for i in range(100)]


def camus_rules(n: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    return "\n".join(
        f'add_order.stock == "{rng.choice(SYMBOLS)}" and add_order.shares > {rng.randint(1, 1000)} : fwd({rng.randint(1, 200)});'
        for _ in range(n)
    )


def frames(n: int = 64, seed: int = 2) -> list[bytes]:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    rng = random.Random(seed)
    out = []
    for i in range(n):
        sym = rng.choice(SYMBOLS) if i % 8 else "ZZZZ"
        msg = encode_add_order({"add_order.stock": stock_value(sym), "add_order.shares": rng.randint(1, 1100),
                                "add_order.price": 1000000, "add_order.order_ref_number": i})
        out.append(bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=4000, dport=26400)
                         / encode_packet("BENCH00001", i + 1, [msg])))
    return out


def mean_ns(prog_fd: int, pkts: list[bytes], repeat: int) -> float:
    return statistics.fmean(test_run(prog_fd, p, repeat)[2] for p in pkts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--repeat", type=int, default=1_000_000)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    spec = load_spec(ROOT / "examples/itch/spec.p4")
    pkts = frames()
    results = []
    print(f"{'rules':>8} {'compile s':>10} {'entries':>8} {'XDP ns':>8} {'parse-only ns':>14} {'TC ns':>8} {'XDP insns':>10}")
    for n in [int(x) for x in args.sizes.split(",")]:
        t0 = time.perf_counter()
        rules = parse_rules(camus_rules(n), spec, f"camus{n}.sub")
        res = compile_rules(rules, spec, "ebpf", field_order=["add_order.stock", "add_order.shares"])
        files, _ = target_files(res, f"camus{n}.sub")
        t_compile = time.perf_counter() - t0
        doc, src = json.loads(files["maps.json"]), files["subc_filter.bpf.c"]
        lf = LoadedFilter.build(doc, src, None)
        base = compile_and_load(src, cflags(lf.caps, lf.max_endpoints) + ["-DSUBC_PARSE_ONLY"])
        from subc.runtime.bpf import prog_info

        row = {
            "rules": n,
            "compile_s": round(t_compile, 2),
            "entries": sum(len(m["entries"]) for m in doc["maps"] if m["role"] != "root"),
            "xdp_ns": round(mean_ns(lf.program.xdp.fd, pkts, args.repeat), 1),
            "xdp_parse_only_ns": round(mean_ns(base.xdp.fd, pkts, args.repeat), 1),
            "tc_ns": round(mean_ns(lf.program.tc.fd, pkts, args.repeat), 1),
            "xdp_insns": prog_info(lf.program.xdp.fd)["xlated_insns"],
            "tc_insns": prog_info(lf.program.tc.fd)["xlated_insns"],
            "repeat": args.repeat,
            "frames": len(pkts),
        }
        results.append(row)
        print(f"{n:>8} {row['compile_s']:>10} {row['entries']:>8} {row['xdp_ns']:>8} {row['xdp_parse_only_ns']:>14} "
              f"{row['tc_ns']:>8} {row['xdp_insns']:>10}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
