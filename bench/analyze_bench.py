"""Throughput of ``subc analyze``: Spark in local mode against plain NumPy on one core.

Workload (generated deterministically, cached under --work): a synthetic ITCH 5.0 BinaryFILE
(``subc gen trace``, default 10 million messages over 500 symbols) and an ITCH rule set (``subc gen
itch``, price form, default 100,000 rules over the same 500 symbols, 32 ports).

Measured, each the median of --repeat runs (the compile is done once and timed separately):

* ``spark``: the whole job after the session is up (:func:`subc.analysis.analyze.analyze`: read,
  decode, tables, messages.parquet, counts, reference, outputs), messages per second;
* ``spark_read``: the trace alone as a DataFrame (:func:`subc.analysis.trace_df.read_messages`),
  every column decoded and handed to the JVM, counted;
* ``numpy``: the same per-split work as a Spark task (:func:`subc.analysis.evaluate.process_split`,
  including writing the Parquet parts) in one Python process, split after split, plus the
  reference on the driver side: the cost of the evaluation without Spark;
* ``numpy_read``: reading and decoding alone in one process.

With ``--stateful M`` the rule set also has M rules that compare an aggregate, ``stock == S and
avg(price, window=1000000) > P : fwd(H)`` (S, P and H from the generated rules), and with
``--counters C`` C rate limits ``stock == S and seen < 100 : fwd(H), inc(seen)`` over one named
counter (1 s windows); the spec gets ``query_time(add_order.timestamp, ns)``.  Then only ``spark``
is measured (the per-split work and the stateful pass, :mod:`subc.analysis.stateful_pass`, whose
one-message-at-a-time groups run as Spark tasks), with the pass's own time in its steps and its
``stateful`` summary (messages through the reference and the table simulator one by one, tasks).

The machine's load changes wall times a lot on a small VM: note it (``uptime``) with the figures.

Prints a table and writes JSON (--json).  Run it alone: ``python3 bench/analyze_bench.py``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "itch" / "spec.p4"


def ensure_inputs(work: Path, messages: int, rules: int, symbols: int) -> tuple[Path, Path]:
    work.mkdir(parents=True, exist_ok=True)
    trace = work / f"trace-{messages}-{symbols}.itch"
    rules_path = work / f"rules-{rules}-{symbols}.sub"
    if not trace.exists():
        subprocess.run([sys.executable, "-m", "subc.cli", "gen", "trace", "--messages", str(messages), "--symbols",
                        str(symbols), "-o", str(trace)], check=True)
    if not rules_path.exists():
        subprocess.run([sys.executable, "-m", "subc.cli", "gen", "itch", "--rules", str(rules), "--symbols",
                        str(symbols), "-o", str(rules_path)], check=True)
    return trace, rules_path


STATEFUL_PRAGMAS = ("\n@pragma query_field(add_order.timestamp)\n@pragma query_time(add_order.timestamp, ns)\n"
                    "@pragma query_counter(seen, 1000000)\n")


def stateful_rules(rules_path: Path, m: int, c: int) -> str:
    """M avg rules and C rate limits built from the generated rules' stocks, prices and ports."""
    import re

    shapes = re.findall(r'add_order\.stock == "([^"]+)" and add_order\.price > ([0-9.]+) : fwd\(([0-9]+)\)',
                        rules_path.read_text())
    if len(shapes) < max(m, c):
        raise SystemExit(f"{rules_path} has {len(shapes)} rules of the form stock == S and price > P")
    out = [f'add_order.stock == "{s}" and avg(add_order.price, window=1000000) > {p} : fwd({h});'
           for s, p, h in shapes[:m]]
    out += [f'add_order.stock == "{s}" and seen < 100 : fwd({h}), inc(seen);' for s, _, h in shapes[:c]]
    return "\n".join(out) + "\n"


def numpy_run(res, trace: Path, out: Path) -> dict:
    """The Spark job's per-split work and the reference, in this process, one split after another."""
    import numpy as np
    import pandas as pd

    from subc.analysis.analyze import auto_split_bytes, make_bundle
    from subc.analysis.evaluate import process_split, representatives
    from subc.analysis.reference_np import evaluate_rules

    t0 = time.perf_counter()
    bundle = make_bundle(res, [str(trace)], auto_split_bytes([str(trace)], 2))
    ports = [d.ports for d in bundle.tables.decisions]
    out.mkdir(parents=True, exist_ok=True)
    parts = [process_split(bundle, i, str(out), ports).to_pandas() for i in range(len(bundle.splits))]
    agg = pd.concat(parts)
    pairs = agg[agg["class_key"].notna()].groupby("class_key")["messages"].sum()
    ref = evaluate_rules(res.rules, res.spec, representatives(bundle.classes, pairs.index.to_numpy(np.int64)),
                         pairs.to_numpy(np.int64))
    messages = int(agg.loc[agg["class_key"].isna(), "messages"].sum())  # the class rows count classified ones again
    return {"seconds": time.perf_counter() - t0, "messages": messages, "hits": int(ref.rule_hits.sum())}


def numpy_read(trace: Path, spec) -> dict:
    """Reading and decoding alone (the spec's vectorised decoder), one split after another."""
    from subc.analysis.analyze import auto_split_bytes
    from subc.analysis.gather import VectorDecoder
    from subc.analysis.messages import decode
    from subc.analysis.splits import plan_splits, read_split
    from subc.wire.decoder import MessageDecoder

    t0 = time.perf_counter()
    vector = VectorDecoder(MessageDecoder(spec))
    types = vector.decoder.types
    n = 0
    for sp in plan_splits([str(trace)], auto_split_bytes([str(trace)], 2), types):
        n += decode(read_split(sp, types), 0, vector)[0].num_rows
    return {"seconds": time.perf_counter() - t0, "messages": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--rules", type=int, default=100_000)
    ap.add_argument("--symbols", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "subc-analyze-bench")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--stateful", type=int, default=0, help="avg rules added (see the module docstring)")
    ap.add_argument("--counters", type=int, default=0, help="rate limits over a named counter added")
    args = ap.parse_args()

    from subc.compiler.driver import compile_rules
    from subc.lang.rules import load_rules
    from subc.spec.front_end import load_spec
    from subc.analysis.analyze import analyze
    from subc.analysis.session import get_session
    from subc.analysis.trace_df import read_messages

    trace, rules_path = ensure_inputs(args.work, args.messages, args.rules, args.symbols)
    t = time.perf_counter()
    stateful = bool(args.stateful or args.counters)
    if stateful:
        from subc.lang.rules import parse_rules
        from subc.spec.front_end import parse_spec

        spec = parse_spec(SPEC.read_text() + STATEFUL_PRAGMAS, str(SPEC))
        rules = load_rules(rules_path, spec) + parse_rules(stateful_rules(rules_path, args.stateful, args.counters),
                                                           spec, "stateful.sub", first_index=args.rules)
    else:
        spec = load_spec(SPEC)
        rules = load_rules(rules_path, spec)
    res = compile_rules(rules, spec, "bmv2")
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    spark = get_session(args.master, "subc analyze bench", {"spark.ui.enabled": "false"})
    spark_start = time.perf_counter() - t
    runs: dict[str, list[dict]] = {"spark": [], "spark_read": [], "numpy": [], "numpy_read": []}
    for _ in range(args.repeat):
        out = args.work / "out"
        t = time.perf_counter()
        s = analyze(res, [str(trace)], out, spark=spark)
        runs["spark"].append({"seconds": time.perf_counter() - t, "messages": s["messages"],
                              "disagreements": s["disagreements"], "steps": s["seconds"]})
        if stateful:
            runs["spark"][-1]["stateful"] = s["stateful"]
            continue
        t = time.perf_counter()
        n = read_messages(spark, [str(trace)], spec).count()
        runs["spark_read"].append({"seconds": time.perf_counter() - t, "messages": n})
        shutil.rmtree(args.work / "np", ignore_errors=True)
        runs["numpy"].append(numpy_run(res, trace, args.work / "np"))
        runs["numpy_read"].append(numpy_read(trace, spec))
    spark.stop()
    result = {"messages": args.messages, "rules": args.rules, "stateful": args.stateful, "counters": args.counters, "symbols": args.symbols, "master": args.master,
              "compile_seconds": round(compile_s, 2), "spark_start_seconds": round(spark_start, 2),
              "disagreements": max(r["disagreements"] for r in runs["spark"]), "runs": runs, "median": {}}
    print(f"{args.messages:,} messages, {args.rules:,} rules; compile {compile_s:.1f} s, Spark start {spark_start:.1f} s")
    print(f"{'path':<12} {'median s':>9} {'messages/s':>12}")
    for k, rs in runs.items():
        if not rs:
            continue
        sec = statistics.median(r["seconds"] for r in rs)
        rate = args.messages / sec
        result["median"][k] = {"seconds": round(sec, 3), "messages_per_second": round(rate)}
        print(f"{k:<12} {sec:>9.2f} {rate:>12,.0f}")
    if stateful:
        sp = statistics.median(r["steps"]["stateful_pass"] for r in runs["spark"])
        result["median"]["stateful_pass_seconds"] = round(sp, 3)
        print(f"stateful pass (driver): median {sp:.2f} s; {runs['spark'][0]['stateful']}")
    print(f"disagreements: {result['disagreements']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
