"""Compiler performance: wall time per phase, peak RSS, states, entries and multicast groups.

Workloads (generated with ``subc gen``, cached under --work, deterministic):

* ``camus-N``: Camus Figure 5c, ``stock == S and shares > P : fwd(H)``, 100 symbols, 200 hosts
  (``subc gen itch --form camus``), N in --sizes (default 1K, 10K, 100K, 1M);
* ``price-100000``: ``stock == S`` and a price ``>``, ``<`` or range, 1,000 Zipf symbols, 32 ports;
* ``siena-kK``: Siena-style subscriptions with K = 1..8 predicates per subscription (``subc gen
  siena``, --siena-filters subscriptions over --siena-attrs attributes).

Every compile runs ``subc compile`` in a child process, --repeat times; the table reports the
median wall time (start to exit, every output file written) and the median of each phase
(``--timings``), the largest peak RSS (``wait4``), and the states per stage, entries per table and
multicast groups, which must be equal across runs.  The outputs of the runs are compared file by
file, byte for byte: compilation is deterministic (phase times go to ``--timings``, not to the outputs).  Writes JSON
(--json) and PNG plots (--plots): entries against subscriptions (Camus) and against predicates per
subscription (Siena), the trends of Camus's Figure 5.  Run alone: ``python3 bench/compile_bench.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ITCH_SPEC = ROOT / "examples" / "itch" / "spec.p4"


def gen(args: list[str], out: Path) -> None:
    if not out.exists():
        subprocess.run([sys.executable, "-m", "subc.cli", "gen", *args, "-o", str(out)], check=True)


def workloads(a, work: Path) -> list[tuple[str, Path, Path, dict]]:
    out = []
    for n in a.sizes:
        p = work / f"camus-{n}.sub"
        gen(["itch", "--form", "camus", "--rules", str(n), "--symbols", "100", "--ports", "200"], p)
        out.append((f"camus-{n}", p, ITCH_SPEC, {"family": "camus", "rules": n}))
    if a.price:
        p = work / "price-100000.sub"
        gen(["itch", "--form", "price", "--rules", "100000", "--symbols", "1000", "--ports", "32"], p)
        out.append(("price-100000", p, ITCH_SPEC, {"family": "price", "rules": 100000}))
    spec = work / f"siena-{a.siena_attrs}.p4"
    for k in a.siena_conj:
        p = work / f"siena-f{a.siena_filters}-a{a.siena_attrs}-k{k}.sub"
        if not p.exists():
            subprocess.run([sys.executable, "-m", "subc.cli", "gen", "siena", "--filters", str(a.siena_filters), "--conj",
                            str(k), "--attrs", str(a.siena_attrs), "-o", str(p), "--spec-out", str(spec)], check=True)
        out.append((f"siena-k{k}", p, spec, {"family": "siena", "rules": a.siena_filters, "predicates": k}))
    return out


def digest(out_dir: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(out_dir.rglob("*")):
        if f.is_file():
            data = f.read_bytes()
            h.update(f.name.encode() + b"\0" + data)
    return h.hexdigest()


def run_once(rules: Path, spec: Path, target: str, out_dir: Path, timeout: float) -> dict:
    shutil.rmtree(out_dir, ignore_errors=True)
    t = time.perf_counter()
    timings = out_dir.parent / "timings.json"
    p = subprocess.Popen([sys.executable, "-m", "subc.cli", "compile", str(rules), "--spec", str(spec), "--target",
                          target, "-o", str(out_dir), "--timings", str(timings)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = t + timeout
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            p.kill()
            os.wait4(p.pid, 0)
            return {"error": f"timeout after {timeout:.0f} s"}
        time.sleep(0.01)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        return {"error": p.stderr.read().decode()[-500:]}
    rep = json.loads((out_dir / "report.json").read_text())
    return {
        "wall_s": wall,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "phases_s": json.loads(timings.read_text()),
        "diagram_states": rep.get("diagram_states"),
        "states_per_stage": [s.get("states") for s in rep.get("stages", [])],
        "entries_per_table": {t["name"].split(".")[-1]: t["entries"] for t in rep.get("tables", [])},
        "total_entries": rep.get("total_entries"),
        "multicast_groups": rep.get("multicast_groups"),
        "digest": digest(out_dir),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 10000, 100000, 1000000])
    ap.add_argument("--no-price", dest="price", action="store_false")
    ap.add_argument("--siena-conj", type=lambda s: [int(x) for x in s.split(",") if x], default=list(range(1, 9)))
    ap.add_argument("--siena-filters", type=int, default=30)
    ap.add_argument("--siena-attrs", type=int, default=10)
    ap.add_argument("--target", default="bmv2")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "subc-compile-bench")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plots", type=Path, help="directory for the PNG plots")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    results = []
    print(f"{'workload':<16} {'wall s':>7} {'parse':>6} {'orders':>6} {'slice':>6} {'tables':>6} {'codegen':>7} {'RSS MiB':>8} "
          f"{'states':>8} {'entries':>9} {'groups':>7} {'same':>5}")
    for name, rules, spec, meta in workloads(a, a.work):
        runs = []
        for i in range(a.repeat):
            r = run_once(rules, spec, a.target, a.work / "out", a.timeout)
            runs.append(r)
            if "error" in r:
                break
        if any("error" in r for r in runs):
            err = next(r["error"] for r in runs if "error" in r)
            print(f"{name:<16} failed: {err.strip().splitlines()[-1] if err.strip() else err}")
            results.append({"workload": name, **meta, "error": err})
            continue
        med = {"wall_s": statistics.median(r["wall_s"] for r in runs)}
        for k in runs[0]["phases_s"]:
            med[k] = statistics.median(r["phases_s"].get(k, 0.0) for r in runs)
        same = len({r["digest"] for r in runs}) == 1
        first = runs[0]
        row = {"workload": name, **meta, "runs": len(runs), "median": med,
               "peak_rss_mib": max(r["peak_rss_mib"] for r in runs), "deterministic": same,
               **{k: first[k] for k in ("diagram_states", "states_per_stage", "entries_per_table", "total_entries",
                                        "multicast_groups")},
               "wall_s_runs": [r["wall_s"] for r in runs]}
        results.append(row)
        print(f"{name:<16} {med['wall_s']:>7.2f} {med.get('parse', 0):>6.2f} {med.get('order_search', 0):>6.2f} "
              f"{med.get('slicing', 0):>6.2f} "
              f"{med.get('tables', 0):>6.2f} {med.get('codegen', 0):>7.2f} {row['peak_rss_mib']:>8.0f} "
              f"{row['diagram_states']:>8} {row['total_entries']:>9} {row['multicast_groups']:>7} {str(same):>5}")
    if a.json:
        a.json.write_text(json.dumps({"target": a.target, "repeat": a.repeat, "results": results}, indent=1) + "\n")
    if a.plots:
        plot(results, a.plots)


def plot(results: list[dict], out: Path) -> None:
    """Entries against subscriptions (Camus) and against predicates per subscription (Siena)."""
    out.mkdir(parents=True, exist_ok=True)
    ok = [r for r in results if "error" not in r]
    camus = sorted((r for r in ok if r["family"] == "camus"), key=lambda r: r["rules"])
    siena = sorted((r for r in ok if r["family"] == "siena"), key=lambda r: r["predicates"])
    if camus:
        _line_plot([r["rules"] for r in camus], [r["total_entries"] for r in camus], "subscriptions", "x",
                   "Camus ITCH workload: entries vs subscriptions", out / "entries_vs_subscriptions.png")
    if siena:
        _line_plot([r["predicates"] for r in siena], [r["total_entries"] for r in siena], "predicates per subscription",
                   "y", f"Siena, {siena[0]['rules']} subscriptions", out / "entries_vs_predicates.png")


def _line_plot(xs, ys, xlabel: str, log_axis: str, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(xs, ys, "o-")
    (ax.set_xscale if log_axis == "x" else ax.set_yscale)("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("table entries")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

if __name__ == "__main__":
    main()
