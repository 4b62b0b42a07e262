"""Compiler performance: wall time per phase, peak RSS, states, entries and multicast groups.

Workloads (generated with ``subc gen``, cached under --work, deterministic):

* ``camus-N``: Camus Figure 5c, ``stock == S and shares > P : fwd(H)``, 100 symbols, 200 hosts
  (``subc gen itch --form camus``), N in --sizes (default 1K, 10K, 100K, 1M);
* ``price-100000``: ``stock == S`` and a price ``>``, ``<`` or range, 1,000 Zipf symbols, 32 ports;
* ``siena-kK``: Siena-style subscriptions with K = 1..8 predicates per subscription (``subc gen
  siena``, --siena-filters subscriptions over --siena-attrs attributes).

``--baseline`` puts each Camus compile next to a plain-Python pass written for that workload alone
(:func:`camus_baseline`: a regular expression parses the rules, a sweep over each symbol's sorted
thresholds gives the same table entries and multicast groups), run as a child process too
(``compile_bench.py --run-baseline RULES OUT``), alternating with the compiles so that both see the
same machine load; its entries are checked against ``entries.json`` (count and content) and the
ratios subc / baseline of the median wall times and of the peak RSS are reported.  E.g.
``python3 bench/compile_bench.py --sizes 100000,1000000 --no-price --siena-conj '' --repeat 3 --baseline``.

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
import re
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
    """SHA-256 of the files of ``out_dir`` (names and contents), read in chunks: this process
    stays small, as every child it starts inherits its peak RSS (Linux counts the forked image)."""
    h = hashlib.sha256()
    for f in sorted(out_dir.rglob("*")):
        if f.is_file():
            h.update(f.name.encode() + b"\0")
            with f.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def run_child(cmd: list[str], timeout: float) -> tuple[float, float, int, str]:
    """Run ``cmd``: (wall time in s from start to exit, peak RSS in MiB from ``wait4``, exit
    status, the end of its stderr); the exit status is -1 after ``timeout`` s (the child is killed)."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        deadline = t + timeout
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                p.kill()
                os.wait4(p.pid, 0)
                return time.perf_counter() - t, 0.0, -1, f"timeout after {timeout:.0f} s"
            time.sleep(0.005)
        wall = time.perf_counter() - t
        err.seek(0)
        tail = err.read().decode(errors="replace")[-500:]
    return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), tail


def run_once(rules: Path, spec: Path, target: str, out_dir: Path, timeout: float) -> dict:
    shutil.rmtree(out_dir, ignore_errors=True)
    timings = out_dir.parent / "timings.json"
    wall, rss, rc, err = run_child([sys.executable, "-m", "subc.cli", "compile", str(rules), "--spec", str(spec),
                                    "--target", target, "-o", str(out_dir), "--timings", str(timings)], timeout)
    if rc != 0:
        return {"error": err}
    rep = json.loads((out_dir / "report.json").read_text())
    return {
        "wall_s": wall,
        "peak_rss_mib": rss,
        "phases_s": json.loads(timings.read_text()),
        "diagram_states": rep.get("diagram_states"),
        "states_per_stage": [s.get("states") for s in rep.get("stages", [])],
        "entries_per_table": {t["name"].split(".")[-1]: t["entries"] for t in rep.get("tables", [])},
        "total_entries": rep.get("total_entries"),
        "multicast_groups": rep.get("multicast_groups"),
        "digest": digest(out_dir),
    }


# -- the plain-Python pass for the Camus workload ------------------------------------------------

#: One Camus rule as ``subc gen itch --form camus`` writes it.
CAMUS_RULE = re.compile(r'add_order\.stock == "([A-Z]{1,8})" and add_order\.shares > (\d+) : fwd\((\d+)\);')
SHARES_TOP = 2**32 - 1  # add_order.shares is 32 bits (examples/itch/spec.p4)
STOCK_BYTES = 8  # add_order.stock: 8 ASCII bytes (ITCH Alpha, padded with spaces)
MAX_MESSAGES = 8  # subc compile --max-messages (its default): messages classified per datagram, one slot each


def camus_baseline(rules_path: Path, out_path: Path, max_messages: int = MAX_MESSAGES) -> None:
    """The entries of a Camus rule set (``stock == "S" and shares > P : fwd(H);``, one per line)
    computed for that workload alone, written to ``out_path`` as JSON ``{"tables": {name: [entry,
    ...]}, "multicast_groups": [...]}`` in the forms of the bmv2 ``entries.json``.

    A regular expression parses the rules; per symbol, a sweep over the sorted thresholds gives the
    runs of ``shares`` values and the host set each one forwards to (a value v matches the rules with
    P < v).  The numbering is subc's: symbols in value order, a symbol's runs numbered as a state on
    first sight (symbols with equal runs share one), the host sets of those states' runs as leaves
    on first sight; per state, the target that saves the most entries becomes a full-range fallback
    at priority 1 (none when it is the dead state 0, ties to the lower leaf).  The P4 program
    classifies ``max_messages`` messages per datagram, each in a slot with its own copy of the
    tables (``subc_s<i>_...``); a leaf sets the slot's bitmap of hosts (bit j: the j-th of the sorted
    hosts), ``subc_deliver`` unicasts a one-host union, ``subc_port_bit`` gives each egress port its
    bit, and one multicast group holds every host.  Raises SystemExit when a rule does not have the
    Camus form."""
    text = rules_path.read_text()
    by_symbol: dict[str, list[tuple[int, int]]] = {}
    n = 0
    for m in CAMUS_RULE.finditer(text):
        s, p, h = m.groups()
        by_symbol.setdefault(s, []).append((int(p), int(h)))
        n += 1
    if n != text.count(";"):
        raise SystemExit(f"{rules_path}: not a Camus rule set ({n} of {text.count(';')} rules parsed)")
    # symbols in value order (big-endian ASCII padded with spaces: byte order is value order)
    symbols = sorted(by_symbol, key=lambda s: s.encode().ljust(STOCK_BYTES))
    states: dict[tuple, int] = {}  # runs (lo, hi, sorted host tuple) of a symbol -> its shares-stage state
    stock_entries = []
    hosts_used: set[int] = set()
    for s in symbols:
        runs, start, hosts, current = [], 0, set(), ()
        for p, h in sorted(by_symbol[s]):
            if h not in hosts:  # values above p reach h too
                if p >= start:
                    runs.append((start, p, current))
                    start = p + 1
                hosts.add(h)
                current = tuple(sorted(hosts))
        runs.append((start, SHARES_TOP, current))
        hosts_used |= hosts
        state = states.setdefault(tuple(runs), len(states) + 1)
        value = int.from_bytes(s.encode().ljust(STOCK_BYTES), "big")
        stock_entries.append({"match": [{"exact": 1}, {"exact": value}], "action": "subc_set_state",
                              "params": {"next_state": state}})
    leaves: dict[tuple, int] = {}  # host set -> leaf state, on first sight
    for runs in states:
        for _, _, hs in runs:
            if hs:
                leaves.setdefault(hs, len(leaves) + 1)
    ports = sorted(hosts_used)
    bit = {p: 1 << j for j, p in enumerate(ports)}
    bitmaps = {hs: sum(bit[p] for p in hs) for hs in leaves}
    shares_entries = []
    for runs, state in states.items():
        count: dict[tuple, int] = {}
        for _, _, hs in runs:
            count[hs] = count.get(hs, 0) + 1
        # the fallback: fewest entries, the dead state (empty host set, no entry) first, then by leaf
        fb = min(count, key=lambda hs: (len(runs) - count[hs] + (1 if hs else 0), leaves.get(hs, 0)))
        for lo, hi, hs in runs:
            if hs != fb:
                shares_entries.append({"match": [{"exact": state}, {"range": [lo, hi]}], "priority": 2,
                                       "action": "subc_msg_fwd", "params": {"ports": bitmaps[hs]}})
        if fb:
            shares_entries.append({"match": [{"exact": state}, {"range": [0, SHARES_TOP]}], "priority": 1,
                                   "action": "subc_msg_fwd", "params": {"ports": bitmaps[fb]}})
    tables = {}
    for base, entries in (("add_order_stock", stock_entries), ("add_order_stock_miss", []),
                          ("add_order_shares", shares_entries)):
        for i in range(max_messages):
            tables[f"SubcIngress.subc_s{i}_{base}"] = entries
    tables["SubcIngress.subc_deliver"] = [{"match": [{"exact": b}], "action": "subc_unicast", "params": {"port": p}}
                                         for p, b in bit.items()]
    tables["SubcEgress.subc_port_bit"] = [{"match": [{"exact": p}], "action": "subc_set_port_bit",
                                          "params": {"port_bit": b}} for p, b in bit.items()]
    doc = {"tables": tables, "multicast_groups": [{"group": 1, "ports": ports}] if ports else []}
    out_path.write_text(json.dumps(doc) + "\n")


def same_entries(baseline_json: Path, entries_json: Path) -> str | None:
    """None when the baseline's entries and multicast groups equal those of subc's
    ``entries.json`` (same tables, entries in the same order, same content), else what differs."""
    base = json.loads(baseline_json.read_text())
    subc = json.loads(entries_json.read_text())
    tables = {t["name"]: t["entries"] for t in subc["tables"]}
    if set(tables) != set(base["tables"]):
        return f"tables differ: {sorted(tables)} against {sorted(base['tables'])}"
    for name, entries in tables.items():
        if entries != base["tables"][name]:
            n = next((i for i, (a, b) in enumerate(zip(entries, base["tables"][name])) if a != b),
                     min(len(entries), len(base["tables"][name])))
            return f"{name}: {len(entries)} entries against {len(base['tables'][name])}, first difference at {n}"
    if subc["multicast_groups"] != base["multicast_groups"]:
        return f"multicast groups differ ({len(subc['multicast_groups'])} against {len(base['multicast_groups'])})"
    return None


def baseline_once(rules: Path, out: Path, timeout: float) -> dict:
    """One run of :func:`camus_baseline` in a child process: wall time and peak RSS (``wait4``)."""
    wall, rss, rc, err = run_child([sys.executable, str(Path(__file__).resolve()), "--run-baseline", str(rules),
                                    str(out)], timeout)
    return {"error": err} if rc != 0 else {"wall_s": wall, "peak_rss_mib": rss}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--run-baseline":  # the child of baseline_once
        camus_baseline(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    if len(sys.argv) == 4 and sys.argv[1] == "--same-entries":  # the entries check, in a child
        print(same_entries(Path(sys.argv[2]), Path(sys.argv[3])) or "same")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 10000, 100000, 1000000])
    ap.add_argument("--no-price", dest="price", action="store_false")
    ap.add_argument("--siena-conj", type=lambda s: [int(x) for x in s.split(",") if x], default=list(range(1, 9)))
    ap.add_argument("--siena-filters", type=int, default=30)
    ap.add_argument("--siena-attrs", type=int, default=10)
    ap.add_argument("--target", default="bmv2")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--baseline", action="store_true",
                    help="also run the plain-Python pass on each Camus workload (bmv2) and report the ratios")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "subc-compile-bench")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plots", type=Path, help="directory for the PNG plots")
    a = ap.parse_args()
    if a.baseline and a.target != "bmv2":
        ap.error("--baseline compares bmv2 compiles")
    a.work.mkdir(parents=True, exist_ok=True)
    results, comparisons = [], []
    print(f"load average at start: {Path('/proc/loadavg').read_text().strip()}" if Path("/proc/loadavg").exists() else "")
    print(f"{'workload':<16} {'wall s':>7} {'parse':>6} {'orders':>6} {'slice':>6} {'tables':>6} {'codegen':>7} {'RSS MiB':>8} "
          f"{'states':>8} {'entries':>9} {'groups':>7} {'same':>5}")
    for name, rules, spec, meta in workloads(a, a.work):
        with_base = a.baseline and meta["family"] == "camus"
        runs, base_runs, check = [], [], None
        for i in range(a.repeat):
            if with_base:  # alternate: both see the same load
                b = baseline_once(rules, a.work / "baseline.json", a.timeout)
                base_runs.append(b)
                if "error" in b:
                    print(f"{name:<16} baseline failed: {b['error'].strip()}")
                    with_base = False
            r = run_once(rules, spec, a.target, a.work / "out", a.timeout)
            runs.append(r)
            if "error" in r:
                break
            if with_base and check is None:  # in a child: loading both documents would grow this process
                check = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--same-entries",
                                        str(a.work / "baseline.json"), str(a.work / "out" / "entries.json")],
                                       capture_output=True, text=True).stdout.strip() or "comparison failed"
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
               "median_peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs),
               **{k: first[k] for k in ("diagram_states", "states_per_stage", "entries_per_table", "total_entries",
                                        "multicast_groups")},
               "wall_s_runs": [r["wall_s"] for r in runs], "peak_rss_mib_runs": [r["peak_rss_mib"] for r in runs],
               "digest": first["digest"]}
        if with_base:
            bw = statistics.median(b["wall_s"] for b in base_runs)
            brss = statistics.median(b["peak_rss_mib"] for b in base_runs)
            row["baseline"] = {"wall_s": bw, "peak_rss_mib": brss, "entries": check,
                               "wall_s_runs": [b["wall_s"] for b in base_runs],
                               "peak_rss_mib_runs": [b["peak_rss_mib"] for b in base_runs],
                               "time_ratio": med["wall_s"] / bw, "rss_ratio": row["median_peak_rss_mib"] / brss}
            comparisons.append(row)
        results.append(row)
        print(f"{name:<16} {med['wall_s']:>7.2f} {med.get('parse', 0):>6.2f} {med.get('order_search', 0):>6.2f} "
              f"{med.get('slicing', 0):>6.2f} "
              f"{med.get('tables', 0):>6.2f} {med.get('codegen', 0):>7.2f} {row['peak_rss_mib']:>8.0f} "
              f"{row['diagram_states']:>8} {row['total_entries']:>9} {row['multicast_groups']:>7} {str(same):>5}")
    if comparisons:
        print(f"\nsubc compile against the plain-Python pass (median of {a.repeat}, peak RSS median; "
              f"load average now {Path('/proc/loadavg').read_text().split()[:3] if Path('/proc/loadavg').exists() else '?'})")
        print(f"{'workload':<16} {'subc s':>7} {'base s':>7} {'time x':>7} {'subc MiB':>9} {'base MiB':>9} {'RSS x':>6}  entries")
        for row in comparisons:
            b = row["baseline"]
            print(f"{row['workload']:<16} {row['median']['wall_s']:>7.2f} {b['wall_s']:>7.2f} {b['time_ratio']:>7.2f} "
                  f"{row['median_peak_rss_mib']:>9.0f} {b['peak_rss_mib']:>9.0f} {b['rss_ratio']:>6.2f}  {b['entries']}")
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
