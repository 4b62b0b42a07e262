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

``--in-turn R`` adds the full and parse-only programs run on the frames in turn, one run each, R
rounds: the predictors and caches then cannot learn one frame, as on a feed where every datagram
differs (each run's time also holds the kernel's timing of one run, tens of ns per datagram).

``--breakdown`` adds, per row, where the nanoseconds go, from programs built with the benchmark's
macros (subc_defs.h) and the same maps: ``parse_no_note`` (parse, each message's state recorded
without its leaf: ``SUBC_PARSE_ONLY`` + ``SUBC_BENCH_NO_NOTE``), ``stages_J`` (the first J field
stages, states recorded without their leaves: ``SUBC_BENCH_STAGES=J`` + ``SUBC_BENCH_NO_NOTE``) and
the full program; each stage's cost is the difference of consecutive rows and the leaf's (its
subscribers' union and intersection, the one-recipient tests, its counters) the full program's
minus ``stages_S``.  The lookups per message of each stage come from the compiled maps: an exact
stage one hash lookup (and the state's default on a miss), a range stage its state's info entry,
then ceil(log2(runs)) binary-search steps and the final bound (mean over the states, weighted by
the messages of the run that reach them is not known here: unweighted).  A stage's marginal cost
also moves register pressure and the verifier's paths, so the rows are attributions, not a sum.

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
import math
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
from subc.dataplane.ebpf.bpf import compile_and_load  # noqa: E402
from subc.dataplane.ebpf.bpf_objects import test_run  # noqa: E402
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
    """Mean ns per run of ``prog_fd`` over ``pkts``, each run ``repeat`` times in a row (the
    kernel's measure: the branch predictors and caches learn the one frame)."""
    return statistics.fmean(test_run(prog_fd, p, repeat)[2] for p in pkts)


def in_turn_ns(prog_fd: int, pkts: list[bytes], rounds: int) -> float:
    """Mean ns per run of ``prog_fd`` with ``pkts`` taken in turn, one run each, ``rounds`` times:
    consecutive runs see different frames, as a broker does on a feed (each run's time includes
    the kernel's timing of one run, some tens of ns, in both programs compared)."""
    return statistics.fmean(test_run(prog_fd, p, 1)[2] for _ in range(rounds) for p in pkts)


def stage_lookups(doc: MapsDoc) -> list[str]:
    """Per field stage of ``doc``: what one message's walk through it looks up (see the module
    docstring)."""
    out = []
    for st in doc.stages:
        if st.kind == "range":
            info = doc.by_name[st.maps[0]]
            counts = [e.count for e in info.entries if e.count]
            steps = statistics.fmean(math.ceil(math.log2(c)) if c > 1 else 0 for c in counts) if counts else 0
            out.append(f"1 info + {steps:.1f} steps + 1 bound")
        elif st.kind == "exact":
            out.append("1 hash (+1 info on a miss)")
        else:
            out.append("1 LPM trie")
    return out


def breakdown(doc: MapsDoc, src: str, pkts: list[bytes], repeat: int, full_ns: float) -> list[dict]:
    """Rows of ``--breakdown`` for the program ``src`` with ``doc``'s maps: ns per message of the
    parse, of each stage and of the leaf (differences of the variants' means over ``pkts``)."""
    from subc.dataplane.ebpf.bpf_objects import prog_info

    variants = [("parse_no_note", "#define SUBC_PARSE_ONLY 1\n#define SUBC_BENCH_NO_NOTE 1\n")]
    variants += [(f"stages_{j}", f"#define SUBC_BENCH_STAGES {j}\n#define SUBC_BENCH_NO_NOTE 1\n")
                 for j in range(1, len(doc.stages) + 1)]
    means = []
    for name, defines in variants:
        lf = LoadedFilter.build(doc, defines + src, None)
        try:
            fd = lf.program.xdp.fd
            means.append((name, mean_ns(fd, pkts, repeat), prog_info(fd)["verified_insns"]))
        finally:
            lf.close()
    per = messages_per_frame(pkts)
    lookups = stage_lookups(doc)
    rows = [{"part": "parse (no leaf)", "ns_per_msg": round(means[0][1] / per, 1), "lookups": "-",
             "verified_insns": means[0][2]}]
    for j, st in enumerate(doc.stages):
        rows.append({"part": f"stage {j}: {st.field} ({st.kind})",
                     "ns_per_msg": round((means[j + 1][1] - means[j][1]) / per, 1), "lookups": lookups[j],
                     "verified_insns": means[j + 1][2]})
    rows.append({"part": "leaf (subscribers, counters)", "ns_per_msg": round((full_ns - means[-1][1]) / per, 1),
                 "lookups": "1 leaf + 1 per-CPU counter", "verified_insns": None})
    return rows


def messages_per_frame(pkts: list[bytes]) -> int:
    """The MoldUDP64 message count of the first frame (every frame of a run holds as many)."""
    return int.from_bytes(pkts[0][14 + 20 + 8 + 18 : 14 + 20 + 8 + 20], "big") or 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--messages", default="1,8,32", help="messages per datagram")
    ap.add_argument("--repeat", type=int, default=100_000)
    ap.add_argument("--stateful", default="", help="also with M paper-shaped stateful rules added, for each M")
    ap.add_argument("--counters", default="", help="also with M rate-limit rules over M named counters, for each M")
    ap.add_argument("--breakdown", action="store_true", help="also the per-stage and leaf costs (see above)")
    ap.add_argument("--in-turn", type=int, default=0, metavar="ROUNDS",
                    help="also run the frames in turn, one run each, ROUNDS times (see above)")
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
        from subc.dataplane.ebpf.bpf_objects import prog_info

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
                "xdp_in_turn_ns": round(in_turn_ns(lf.program.xdp.fd, pkts, args.in_turn), 1) if args.in_turn else None,
                "xdp_parse_only_in_turn_ns": round(in_turn_ns(base.xdp.fd, pkts, args.in_turn), 1)
                if args.in_turn else None,
                "xdp_insns": prog_info(lf.program.xdp.fd)["xlated_insns"],
                "xdp_verified_insns": prog_info(lf.program.xdp.fd)["verified_insns"],
                "repeat": args.repeat,
                "frames": len(pkts),
            }
            if args.breakdown:
                row["breakdown"] = breakdown(doc, src, pkts, args.repeat, row["xdp_ns"])
            results.append(row)
            print(f"{n:>8} {m:>8} {c:>8} {row['entries']:>8} {k:>5} {row['xdp_ns']:>13} {row['xdp_ns'] / k:>7.1f} "
                  f"{row['xdp_parse_only_ns']:>20} {row['xdp_parse_only_ns'] / k:>7.1f} {row['xdp_verified_insns']:>15}", flush=True)
            if args.in_turn:
                print(f"{'':>8}   frames in turn (one run each): XDP {row['xdp_in_turn_ns'] / k:.1f} ns/msg, parse-only "
                      f"{row['xdp_parse_only_in_turn_ns'] / k:.1f} ns/msg", flush=True)
            for part in row.get("breakdown", []):
                print(f"{'':>8}   {part['part']:<44} {part['ns_per_msg']:>7.1f} ns/msg  {part['lookups']:<28} "
                      f"verified insns {part['verified_insns']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
