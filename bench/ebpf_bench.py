#!/usr/bin/env python3
"""Per-packet cost of the eBPF target's XDP and TC programs, with BPF_PROG_TEST_RUN.

Workload (Camus ITCH, Jepsen et al. HotNets 2018, Figure 5c): N rules
``add_order.stock == S and add_order.shares > P : fwd(H)``, S one of 100 symbols, P uniform in
1..1000, H one of 200 hosts (seeded, deterministic).  For each N: compile with subc
(``--target ebpf``), load the programs (not attached) in filter mode (a match passes to the local
stack, so the test frame is not rewritten between repetitions), then run 64 MoldUDP64 datagrams
of K Add Orders each (``--messages``, default 1, 8 and 32; symbols of the rule set and outside it,
shares uniform) through

* XDP: the full program (parse, every message classified with one lookup per field, leaf
  counters, the tail calls every 16 messages, the decision);
* XDP parse-only: the same source built with ``-DSUBC_PARSE_ONLY`` (parse every message, no lookup),

each ``--repeat`` times and print the mean ns per datagram and per message (kernel-measured
duration of BPF_PROG_TEST_RUN).

``--stateful M,...`` adds, for each M, a run of the same rule set plus M rules of the paper's
stateful shape ``add_order.stock == S and avg(add_order.price, window=1000) > X : fwd(H)``
(docs/state.md "Stateful subscriptions": M aggregate instances, each under its own bpf_spin_lock, time
from bpf_ktime_get_ns); the row's ``stateful_rules`` says which.  ``--counters M,...`` adds
instead M rate limits ``add_order.stock == S and cK < N : fwd(H), inc(cK)`` over M named counters
declared for the run (``@pragma query_counter(cK, 1000)`` appended to the spec): each read at
its state-value stage and updated after the last stage under its lock.  The TC copy builder needs the XDP metadata, which
BPF_PROG_TEST_RUN cannot give a TC program: ``bench/broker_throughput.py`` measures it end to
end.  Needs root.  Writes JSON with ``--json FILE``.

    sudo python3 bench/ebpf_bench.py --sizes 1000,100000 --messages 1,8,32 --repeat 100000
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
from subc.lang.rules import parse_rules  # noqa: E402
from subc.spec.front_end import load_spec, parse_spec  # noqa: E402
from subc.backends.files import target_files  # noqa: E402
from subc.backends.ebpf.source import program_source  # noqa: E402
from subc.dataplane.ebpf.bpf import compile_and_load, test_run  # noqa: E402
from subc.backends.ebpf.maps_doc import MapsDoc  # noqa: E402
from subc.dataplane.ebpf.broker import LoadedFilter, cflags  # noqa: E402
from subc.workloads.itch_codec import encode_add_order, stock_value  # noqa: E402
from subc.wire.moldudp64 import encode_packet  # noqa: E402

SYMBOLS = [f"S{i:03d}" for i in range(100)]


def camus_rules(n: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    return "\n".join(
        f'add_order.stock == "{rng.choice(SYMBOLS)}" and add_order.shares > {rng.randint(1, 1000)} : fwd({rng.randint(1, 200)});'
        for _ in range(n)
    )


def paper_rules(m: int, seed: int = 3) -> str:
    """``m`` rules ``add_order.stock == S and avg(add_order.price, window=1000) > X : fwd(H)``."""
    rng = random.Random(seed)
    return "\n".join(
        f'add_order.stock == "{rng.choice(SYMBOLS)}" and avg(add_order.price, window=1000) > {rng.randint(50, 150)} '
        f": fwd({rng.randint(1, 200)});"
        for _ in range(m)
    )


def counter_rules(m: int, seed: int = 4) -> str:
    """``m`` rate limits ``add_order.stock == S and cK < N : fwd(H), inc(cK)``, K = 0..m-1."""
    rng = random.Random(seed)
    return "\n".join(
        f'add_order.stock == "{rng.choice(SYMBOLS)}" and c{k} < {rng.randint(1, 100)} : fwd({rng.randint(1, 200)}), inc(c{k});'
        for k in range(m)
    )


def frames(per_datagram: int = 1, n: int = 64, seed: int = 2) -> list[bytes]:
    """``n`` frames of ``per_datagram`` Add Orders each (one in 8 of a symbol outside the rules)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    rng = random.Random(seed)
    out = []
    for i in range(n):
        msgs = []
        for j in range(per_datagram):
            sym = rng.choice(SYMBOLS) if (i * per_datagram + j) % 8 else "ZZZZ"
            msgs.append(encode_add_order({"add_order.stock": stock_value(sym), "add_order.shares": rng.randint(1, 1100),
                                          "add_order.price": rng.randint(50, 150) * 10000,
                                          "add_order.order_ref_number": i}))
        out.append(bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=4000, dport=26400)
                         / encode_packet("BENCH00001", i * per_datagram + 1, msgs)))
    return out


def mean_ns(prog_fd: int, pkts: list[bytes], repeat: int) -> float:
    return statistics.fmean(test_run(prog_fd, p, repeat)[2] for p in pkts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--messages", default="1,8,32", help="messages per datagram")
    ap.add_argument("--repeat", type=int, default=100_000)
    ap.add_argument("--stateful", default="", help="also with M paper-shaped stateful rules added, for each M")
    ap.add_argument("--counters", default="", help="also with M rate-limit rules over M named counters, for each M")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    spec_path = ROOT / "examples/itch/spec.p4"
    spec = load_spec(spec_path)
    per = [int(x) for x in args.messages.split(",")]
    results = []
    stateful = [(0, 0)] + [(int(x), 0) for x in args.stateful.split(",") if x] \
        + [(0, int(x)) for x in args.counters.split(",") if x]
    print(f"{'rules':>8} {'stateful':>8} {'counters':>8} {'entries':>8} {'msgs':>5} {'XDP ns/dgram':>13} {'ns/msg':>7} "
          f"{'parse-only ns/dgram':>20} {'ns/msg':>7} {'verified insns':>15}")
    for n, m, c in [(int(x), m, c) for x in args.sizes.split(",") for m, c in stateful]:
        t0 = time.perf_counter()
        text = camus_rules(n) + ("\n" + paper_rules(m) if m else "") + ("\n" + counter_rules(c) if c else "")
        sp = spec
        if c:
            sp = parse_spec(spec_path.read_text() + "".join(f"\n@pragma query_counter(c{k}, 1000)" for k in range(c))
                            + "\n", str(spec_path))
        rules = parse_rules(text, sp, f"camus{n}.sub")
        res = compile_rules(rules, sp, "ebpf", field_order=["add_order.stock", "add_order.shares"])
        files, _ = target_files(res, f"camus{n}.sub")
        t_compile = time.perf_counter() - t0
        doc, src = MapsDoc.from_json(json.loads(files["maps.json"])), program_source(files)
        lf = LoadedFilter.build(doc, src, None)
        base = compile_and_load(src, cflags(lf.caps, lf.max_endpoints) + ["-DSUBC_PARSE_ONLY"])
        from subc.dataplane.ebpf.bpf import prog_info

        for k in per:
            pkts = frames(k)
            row = {
                "rules": n,
                "stateful_rules": m,
                "counter_rules": c,
                "aggregate_instances": len(res.ir.state.instances) if res.ir.state else 0,
                "compile_s": round(t_compile, 2),
                "entries": sum(len(m.entries) for m in doc.maps if m.role != "root"),
                "messages_per_datagram": k,
                "xdp_ns": round(mean_ns(lf.program.xdp.fd, pkts, args.repeat), 1),
                "xdp_parse_only_ns": round(mean_ns(base.xdp.fd, pkts, args.repeat), 1),
                "xdp_insns": prog_info(lf.program.xdp.fd)["xlated_insns"],
                "xdp_verified_insns": prog_info(lf.program.xdp.fd)["verified_insns"],
                "repeat": args.repeat,
                "frames": len(pkts),
            }
            results.append(row)
            print(f"{n:>8} {m:>8} {c:>8} {row['entries']:>8} {k:>5} {row['xdp_ns']:>13} {row['xdp_ns'] / k:>7.1f} "
                  f"{row['xdp_parse_only_ns']:>20} {row['xdp_parse_only_ns'] / k:>7.1f} {row['xdp_verified_insns']:>15}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
