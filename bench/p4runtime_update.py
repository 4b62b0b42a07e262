"""Benchmark: loading a switch over P4Runtime, and the writes of a one-rule update.

Generates ``subc gen itch --rules N`` (price form, --symbols symbols, --ports ports) and the same
set with one rule more (a new symbol and price bound: ``stock == "ZZZZ" and price > 10 : fwd(1)``),
compiles both for bmv2 with the same field order and state width (24 bits) and table sizes 3
 times the entries (the root state's table holds its old and new entries side by side), then, with
``simple_switch_grpc`` (BMv2 with its P4Runtime server, on 127.0.0.1, when on PATH):

* ``subc load A --p4runtime --config``: seconds (pipeline set, entries written with the spare
  root's copy, root last);
* ``subc update B --p4runtime`` (one rule added) and then ``subc update A`` (that rule removed),
  --repeat times: the process from start to exit, and the times it prints (live: the root write
  acknowledged; done: the old entries deleted after the grace, the writer's record written), then
  the same updates in this process with their phases (reading the record and the compiled state
  index, planning, writing the record); medians in ms.  Every update must plan from the writer's
  record (no table read back);
* ``subc verify`` after the first of each: must find no difference;
* ``bare_process``: the floor under any Python writer started per update (:data:`BARE_CLIENT`: a
  new process that imports grpc and the bindings, becomes primary, reads the P4Info and sends one
  empty WriteRequest), and the interpreter's own start (``python -c pass``).

Without the switch it still reports the update's plan (updates it would write) from the two
entries.json files.  ``python3 bench/p4runtime_update.py [--rules 100000] [--max-messages 1]``
prints one JSON object.
"""

from __future__ import annotations

import argparse
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
SPEC = ROOT / "examples" / "itch" / "spec.p4"
SUBC = [sys.executable, "-m", "subc.cli"]
ADDR = "127.0.0.1:9559"


def run(*args: str) -> str:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout


LIVE = re.compile(r"live after ([0-9.]+) ms, done after ([0-9.]+) s")


def on_switch(w: Path, repeat: int) -> dict:
    """Load A on simple_switch_grpc, then ``repeat`` times: update to B (one rule more) and back to
    A, each with ``subc update`` (the process timed from start to exit, and the times it prints:
    live = the root write acknowledged, done = the old entries deleted after the grace and the
    record written) and once more in this process (:func:`~subc.dataplane.p4rt.control.update`,
    its phases); verify after each direction.  Medians in ms."""
    from subc.dataplane.p4rt.control import update, verify

    run("p4c-bm2-ss", "-o", str(w / "a.json"), str(w / "a" / "subc.p4"))
    env = dict(os.environ, SUBC_STATE_DIR=str(w / "state"))
    os.environ["SUBC_STATE_DIR"] = env["SUBC_STATE_DIR"]
    sw = subprocess.Popen(
        ["simple_switch_grpc", "--no-p4", "--", "--grpc-server-addr", ADDR],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    out: dict = {}
    try:
        time.sleep(2)
        t = time.perf_counter()
        out["load_output"] = run(
            *SUBC, "load", str(w / "a"), "--p4runtime", ADDR, "--config", str(w / "a.json")
        ).strip()
        out["load_s"] = round(time.perf_counter() - t, 2)
        cli: dict[str, list] = {"process_ms": [], "live_ms": [], "done_ms": []}
        inproc: dict[str, list] = {"live_ms": [], "done_ms": [], "read_ms": [], "plan_ms": [], "record_ms": []}
        for i in range(repeat):
            for name in ("b", "a"):
                t = time.perf_counter()
                said = run(*SUBC, "update", str(w / name), "--p4runtime", ADDR)
                cli["process_ms"].append((time.perf_counter() - t) * 1000)
                m = LIVE.search(said)
                assert m and "planned from the writer's record" in said, said
                cli["live_ms"].append(float(m.group(1)))
                cli["done_ms"].append(float(m.group(2)) * 1000)
                out[f"update_{name}_output"] = said.strip()
                if i == 0:
                    assert verify(str(w / name), ADDR) == [], name
            for name in ("b", "a"):
                t = time.perf_counter()
                wr = update(str(w / name), ADDR)
                inproc["done_ms"].append((time.perf_counter() - t) * 1000)
                inproc["live_ms"].append(wr.live_s * 1000)
                for k in ("read", "plan", "record"):
                    inproc[f"{k}_ms"].append(wr.seconds[k] * 1000)
        out["cli"] = {k: round(statistics.median(v), 1) for k, v in cli.items()}
        out["in_process"] = {k: round(statistics.median(v), 1) for k, v in inproc.items()}
        out["verify"] = run(*SUBC, "verify", str(w / "a"), "--p4runtime", ADDR).strip()
        out["bare_process"] = bare_floor(max(repeat, 5))
    finally:
        sw.terminate()
        sw.wait()
    return out


#: A bare client in a new process: the floor under any Python ``subc update`` (issue 42's 50 ms).
#: It imports only grpc and the P4Runtime bindings, becomes primary (p4runtime-shell's client:
#: arbitration, then GetForwardingPipelineConfig for the P4Info, as any writer needs the P4Info's
#: ids) and sends one WriteRequest with no update; it prints its own times since it started.
BARE_CLIENT = r"""
import sys, time
t0 = time.perf_counter()
import grpc
from p4.v1 import p4runtime_pb2 as pr
from p4runtime_sh.p4runtime import P4RuntimeClient
t1 = time.perf_counter()
c = P4RuntimeClient(0, sys.argv[1], (0, 2))
c.get_p4info()
t2 = time.perf_counter()
req = pr.WriteRequest(device_id=0, election_id=pr.Uint128(high=0, low=2))
c.stub.Write(req)
t3 = time.perf_counter()
print(f"{(t1 - t0) * 1000:.1f} {(t2 - t1) * 1000:.1f} {(t3 - t2) * 1000:.1f}")
c.tear_down()
"""


def bare_floor(repeat: int) -> dict:
    """The floor of a new process (:data:`BARE_CLIENT`), ``repeat`` times: medians in ms of the
    process from start to exit, the imports, the session (arbitration and P4Info) and the empty
    write, and of the interpreter alone (``python -c pass``)."""
    runs: dict[str, list] = {"process_ms": [], "imports_ms": [], "session_ms": [], "write_ms": [], "python_ms": []}
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        runs["python_ms"].append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        said = run(sys.executable, "-c", BARE_CLIENT, ADDR).split()
        runs["process_ms"].append((time.perf_counter() - t) * 1000)
        for k, v in zip(("imports_ms", "session_ms", "write_ms"), said):
            runs[k].append(float(v))
    return {k: round(statistics.median(v), 1) for k, v in runs.items()}


EXTRA_RULE = 'add_order.stock == "ZZZZ" and add_order.price > 10 : fwd(1);'


def compile_pair(w: Path, rules: int, symbols: int, ports: int, max_messages: int) -> dict:
    """Generate ``w``/a.sub (``subc gen itch``, price form) and b.sub (the same and
    :data:`EXTRA_RULE`), compile them into ``w``/a and ``w``/b for bmv2 with one field order, 24
    state bits and ``--capacity-factor 3``; {"compile_a_s", "compile_b_s"}: seconds."""
    out = {}
    run(
        *SUBC,
        "gen",
        "itch",
        "--rules",
        str(rules),
        "--symbols",
        str(symbols),
        "--ports",
        str(ports),
        "-o",
        str(w / "a.sub"),
    )
    (w / "b.sub").write_text((w / "a.sub").read_text() + "\n" + EXTRA_RULE + "\n")
    order = None
    for name in ("a", "b"):
        t = time.perf_counter()
        cmd = [
            *SUBC,
            "compile",
            str(w / f"{name}.sub"),
            "--spec",
            str(SPEC),
            "-o",
            str(w / name),
            "--max-messages",
            str(max_messages),
            "--state-bits",
            "24",
            "--capacity-factor",
            "3",
        ]
        if order:
            cmd += ["--field-order", order]
        run(*cmd)
        out[f"compile_{name}_s"] = round(time.perf_counter() - t, 2)
        order = ",".join(json.loads((w / name / "entries.json").read_text())["field_order"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rules", type=int, default=100_000)
    ap.add_argument("--symbols", type=int, default=2000)
    ap.add_argument("--ports", type=int, default=32)
    ap.add_argument("--max-messages", type=int, default=1, help="message slots of the program (1: smallest)")
    ap.add_argument("--repeat", type=int, default=3, help="updates in each direction (medians reported)")
    args = ap.parse_args()
    from subc.backends.p4.entries_doc import EntriesDoc
    from subc.dataplane.p4rt.plan import plan_update, with_spare_root

    out: dict = {"rules": args.rules, "max_messages": args.max_messages}
    with tempfile.TemporaryDirectory() as d:
        w = Path(d)
        out.update(compile_pair(w, args.rules, args.symbols, args.ports, args.max_messages))
        a = EntriesDoc.from_json(json.loads((w / "a" / "entries.json").read_text()))
        b = EntriesDoc.from_json(json.loads((w / "b" / "entries.json").read_text()))
        out["entries"] = sum(len(t.entries) for t in a.tables)
        t = time.perf_counter()
        plan = plan_update(with_spare_root(a), b)
        out["plan_s"] = round(time.perf_counter() - t, 2)
        out["plan"] = {
            "inserts": len(plan.inserts),
            "modifies": len(plan.modifies),
            "spare_deletes": len(plan.spare_deletes),
            "root": plan.root is not None,
            "deletes": len(plan.deletes),
            "group_inserts": len(plan.group_inserts),
            "group_deletes": len(plan.group_deletes),
            "kept_states": plan.kept_states,
            "new_states": plan.new_states,
        }
        if shutil.which("simple_switch_grpc") and shutil.which("p4c-bm2-ss"):
            out.update(on_switch(w, args.repeat))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
