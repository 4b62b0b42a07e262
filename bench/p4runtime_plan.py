"""Benchmark: the phases of a one-rule ``subc update --p4runtime`` that need no switch, and the
``subc update`` process's start-up (against the P4Runtime server of the tests).

Compiles ``subc gen itch --rules N`` (price form) as A and A with one rule more as B exactly as
``bench/p4runtime_update.py`` does (:func:`p4runtime_update.compile_pair`), writes the record a
``subc load`` of A leaves (:func:`~subc.dataplane.p4rt.control.spared_doc` and
:func:`~subc.dataplane.p4rt.control.loaded_record`: A with the spare root's copy, for a switch
running A's P4Info), then times, ``--repeat`` times in each direction (A to B from that record,
B to A from the record A to B leaves), the steps :func:`~subc.dataplane.p4rt.control.update`
takes between its switch reads and writes (the cycle collector paused, as there), in ms:

* ``read_compiled``: the new rule set's ``states.jsonl`` (header and the root's line);
* ``read_record``: the P4Info's digest and the record (header and the root's line);
* ``plan``: :func:`~subc.dataplane.p4rt.plan.plan_update` and the room check;
* ``requests``: every phase's ``Update`` messages built and framed as WriteRequests'
  ``updates`` field (:func:`~subc.dataplane.p4rt.session.framed_updates`);
* ``record``: the new record written (:func:`~subc.dataplane.p4rt.record.write_record`);
* ``live``: read_compiled + read_record + plan + the requests of the phases up to the root switch
  (what precedes the first write, and the writes' serialization, of the in-process ``live``).

With ``--cli`` it also starts ``tests/p4rt_fake.py``'s P4Runtime server (grpcio, in this
process), loads A on it (``subc.dataplane.p4rt.control.load``), and runs ``python3 -m subc.cli
update B`` then ``update A`` ``--repeat`` times: ``first_write_ms`` from the process's start to
the server receiving its first WriteRequest, ``process_ms`` to its exit, ``live_ms`` as it prints
it (from :func:`update`'s start), beside ``python_ms``, a bare ``python3 -c pass``, and the
imports alone (:data:`IMPORTS`); with Python's bytecode cached.  The server is Python
(pure-Python protobuf): its answers are slower than BMv2's (the session's setup, the root read and
the writes wait for them), so neither ``live_ms`` nor ``process_ms`` is BMv2's.

``python3 bench/p4runtime_plan.py [--rules 100000] [--repeat 7] [--cli] [--work DIR]`` prints
one JSON object of medians (``--work`` keeps the compiled outputs there, reused by a run of the
same ``--rules``, ``--symbols``, ``--ports`` and ``--max-messages``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from p4runtime_update import SUBC, compile_pair

ROOT = Path(__file__).resolve().parent.parent
ADDR = "127.0.0.1:9559"  # the record's switch (no server is contacted for the phases)


def _ms(seconds: float) -> float:
    return seconds * 1000


def load_record(a_dir: Path, path: Path):
    """Write the record a ``subc load`` of ``a_dir`` on a switch running its P4Info leaves, at
    ``path``; the P4Info message."""
    from subc.dataplane.p4rt.control import loaded_record, read_output, spared_doc
    from subc.dataplane.p4rt.record import write_record

    doc, info = read_output(str(a_dir))
    write_record(path, loaded_record(ADDR, 0, info, spared_doc(info, doc)))
    return info


def update_phases(old: Path, new_dir: Path, info, into: Path) -> dict[str, float]:
    """One update from the record at ``old`` to ``new_dir``'s rule set, its record written to
    ``into``: ms per step (see the module docstring)."""
    from subc.backends.p4.p4info_shape import shape_digest
    from subc.dataplane.p4rt.control import (
        PHASES,
        check_room,
        phase_updates,
        read_compiled,
        table_sizes,
    )
    from subc.dataplane.p4rt.plan import plan_update
    from subc.dataplane.p4rt.record import SwitchRecord, program_digest, read_record, write_record
    from subc.dataplane.p4rt.requests import P4InfoIndex
    from subc.dataplane.p4rt.session import framed_updates

    index = P4InfoIndex(info)  # the session's, built when it opens
    out = {}
    t = time.perf_counter()
    new, shape = read_compiled(str(new_dir))
    assert shape == shape_digest(info)
    t1 = time.perf_counter()
    program = program_digest(info)
    rec, why = read_record(old, ADDR, 0, program)
    assert rec is not None, why
    t2 = time.perf_counter()
    plan = plan_update(rec.index, new)
    check_room(table_sizes(info), rec.index, plan)
    t3 = time.perf_counter()
    live = 0.0
    for name in PHASES:
        framed_updates(phase_updates(index, new.skeleton, plan, name))
        if name == "root":
            live = time.perf_counter()
    t4 = time.perf_counter()
    assert plan.held is not None
    write_record(into, SwitchRecord(ADDR, 0, program, plan.held))
    t5 = time.perf_counter()
    out.update(read_compiled=t1 - t, read_record=t2 - t1, plan=t3 - t2, requests=t4 - t3, record=t5 - t4)
    out["live"] = live - t
    out = {k: _ms(v) for k, v in out.items()}
    out["writes"] = plan.writes
    return out


def phases(w: Path, repeat: int) -> dict:
    """Medians of :func:`update_phases` A to B and B to A, ``repeat`` times each, each with the
    cycle collector paused as :func:`~subc.dataplane.p4rt.control.update` pauses it (a full
    collection before each, untimed)."""
    from subc.compiler.gcpause import paused_gc

    rec = w / "records"
    rec.mkdir(exist_ok=True)
    info = load_record(w / "a", rec / "a.json")
    out = {}

    def once(old: str, new_dir: str, into: str) -> dict[str, float]:
        gc.collect()
        with paused_gc():
            return update_phases(rec / old, w / new_dir, info, rec / into)

    for name, old, new_dir, into in (("a_to_b", "a.json", "b", "b.json"), ("b_to_a", "b.json", "a", "a2.json")):
        runs = [once(old, new_dir, into) for _ in range(repeat)]
        out[name] = {k: round(statistics.median(r[k] for r in runs), 1) for k in runs[0]}
    return out


LIVE = re.compile(r"live after ([0-9.]+) ms, done after ([0-9.]+) s")


class _TimedRequests(list):
    """The fake server's list of WriteRequests, each arrival's ``time.perf_counter()`` beside
    (CLOCK_MONOTONIC: comparable with another process's start measured here)."""

    def __init__(self):
        super().__init__()
        self.times: list[float] = []

    def append(self, item) -> None:
        self.times.append(time.perf_counter())
        super().append(item)


#: what the update's process imports: subc's command line and control plane; the session's
#: third-party modules (grpc, pure-Python protobuf, p4runtime-shell's client)
IMPORTS = {
    "subc_imports_ms": "import subc.cli.dataplane_cmds, subc.dataplane.p4rt.control",
    "third_party_imports_ms": "import grpc; from p4.v1 import p4runtime_pb2; import p4runtime_sh.p4runtime",
}


def cli(w: Path, repeat: int) -> dict:
    """``subc update`` processes against the tests' P4Runtime server loaded with A (see the
    module docstring), with Python's bytecode cached as an installed subc has it (the runs may
    write ``__pycache__``: PYTHONDONTWRITEBYTECODE is unset for them): medians in ms, beside
    those of a bare interpreter and of its imports alone (each in a process of its own, minus the
    bare interpreter)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from p4rt_fake import FakeSwitch

    from subc.dataplane.p4rt.control import load

    env = dict(os.environ, SUBC_STATE_DIR=str(w / "cli-state"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-c", ";".join(IMPORTS.values())], env=env, check=True)  # caches written
    (w / "prog.json").write_text("{}")
    sw = FakeSwitch()
    out: dict = {}

    def process(*args: str) -> float:
        t = time.perf_counter()
        subprocess.run([sys.executable, *args], env=env, check=True)
        return _ms(time.perf_counter() - t)

    try:
        t = time.perf_counter()
        load(str(w / "a"), sw.addr, config=str(w / "prog.json"), record_dir=str(w / "cli-state" / "p4runtime"))
        out["fake_load_s"] = round(time.perf_counter() - t, 1)
        got: dict[str, list[float]] = {
            k: [] for k in ("python_ms", *IMPORTS, "first_write_ms", "live_ms", "process_ms")
        }
        for _ in range(repeat):
            bare = process("-c", "pass")
            got["python_ms"].append(bare)
            for k, code in IMPORTS.items():
                got[k].append(process("-c", code) - bare)
            for name in ("b", "a"):
                sw.requests = _TimedRequests()
                t = time.perf_counter()
                r = subprocess.run(
                    [*SUBC, "update", str(w / name), "--p4runtime", sw.addr], env=env, capture_output=True, text=True
                )
                got["process_ms"].append(_ms(time.perf_counter() - t))
                m = LIVE.search(r.stdout)
                assert r.returncode == 0 and m and "planned from the writer's record" in r.stdout, r.stdout + r.stderr
                got["live_ms"].append(float(m.group(1)))
                got["first_write_ms"].append(_ms(sw.requests.times[0] - t))
        assert sw.errors == [], sw.errors[:3]
        out.update({k: round(statistics.median(v), 1) for k, v in got.items()})
    finally:
        sw.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rules", type=int, default=100_000)
    ap.add_argument("--symbols", type=int, default=2000)
    ap.add_argument("--ports", type=int, default=32)
    ap.add_argument("--max-messages", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7, help="updates in each direction (medians reported)")
    ap.add_argument("--cli", action="store_true", help="also time subc update processes on the tests' server")
    ap.add_argument("--work", help="directory for the compiled outputs (reused when there)")
    args = ap.parse_args()
    out: dict = {"rules": args.rules, "max_messages": args.max_messages}
    with tempfile.TemporaryDirectory() as d:
        w = Path(args.work or d)
        w.mkdir(parents=True, exist_ok=True)
        made = [args.rules, args.symbols, args.ports, args.max_messages]
        if not (w / "made.json").exists() or json.loads((w / "made.json").read_text()) != made:
            out.update(compile_pair(w, *made))
            (w / "made.json").write_text(json.dumps(made))
        out["phases"] = phases(w, args.repeat)
        if args.cli:
            out["cli"] = cli(w, args.repeat)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
