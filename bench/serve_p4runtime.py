"""Benchmark: ``subc serve --p4runtime`` subscribe latency and throughput on BMv2 ``simple_switch_grpc``.

Needs ``simple_switch_grpc`` and ``p4c-bm2-ss`` on PATH and root.  A network namespace made here
(``sbp4rt``, removed afterwards) holds the switch (ports 0..3 on veths, P4Runtime server on the
namespace's loopback) and the daemon (``subc serve-program --ports 1-3 --capacity C``; the port
map puts 127.0.0.0/8 behind port 1); this process sends the requests from 127.0.0.1 there.
At each level of live subscriptions it first fills the daemon up to the level (64 requests in
flight), then measures:

* latency: 200 SUBSCRIBE requests one at a time (send, wait for the SUBACK: the switch's
  entries written and the root switched, each write acknowledged by the switch; the store
  committed), p50 and p99, with an UNSUBSCRIBE after each so the level stays put;
* with ``--warm``, before the latencies: the wait until every free root slot is refreshed
  (``warm_s``, ``warm_writes``: the daemon's metrics, no request sent meanwhile), so that the
  latencies are those of a daemon whose slots caught up with a burst;
* throughput: 1,000 SUBSCRIBE requests with up to 64 in flight, requests per second, and from the
  daemon's metrics the changes it made and the P4Runtime updates it wrote meanwhile (the deletions
  of its reclaimer included).

Then, the daemon stopped, a *bare writer* (p4runtime-shell's client, messages built the library's
usual way, nothing else) writes as many updates to the same switch, in as many WriteRequests, as
the daemon did in its largest burst: range entries of the price tables under unused states,
inserted then deleted; its updates per second, divided by the daemon's updates per request, is the
request rate BMv2 and the library allow for these requests (the issue's yardstick).

Subscriptions are ``add_order.stock == S and add_order.price > P`` over 2,000 symbols, as in
bench/serve_subscribe.py.  ``python3 bench/serve_p4runtime.py [--levels 100,1000,10000]`` prints
one JSON object per level.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import serve_subscribe  # bench/ is on sys.path: this script runs from there

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "itch" / "spec.p4"
SUBC = [sys.executable, "-m", "subc.cli"]
NS = "sbp4rt"
GRPC = "127.0.0.1:9559"
PORT = 7400


def sh(*args: str, check: bool = True) -> str:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode:
        raise SystemExit(f"{' '.join(args)}: {r.stdout}{r.stderr.strip()}")
    return r.stdout


METRICS = "127.0.0.1:9400"


def metrics() -> dict[str, float]:
    """The daemon's counters of changes, switch updates and WriteRequests (Prometheus text from
    --metrics), by short name."""
    import urllib.request

    names = {
        "subc_serve_changes_total": "changes",
        "subc_serve_switch_updates": "switch_updates",
        "subc_serve_switch_write_requests": "write_requests",
    }
    text = urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            out[names[name]] = float(value)
    return out


def warm_slots(timeout: float = 900.0) -> dict:
    """Wait until the daemon's free root slots are all refreshed (``subc_serve_root_slots{state=
    "stale"}`` 0, polled every 0.2 s; no request is sent meanwhile): seconds waited and entries the
    refresh wrote meanwhile (``warm_s``, ``warm_writes``; ``warm_timeout`` when still stale)."""
    import urllib.request

    def read() -> dict[str, float]:
        text = urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=10).read().decode()
        out = {}
        for line in text.splitlines():
            if not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    t = time.perf_counter()
    first = read()
    now = first
    while now['subc_serve_root_slots{state="stale"}'] > 0 and time.perf_counter() - t < timeout:
        time.sleep(0.2)
        now = read()
    out = {
        "warm_s": round(time.perf_counter() - t, 1),
        "warm_writes": int(now["subc_serve_root_refresh_writes"] - first["subc_serve_root_refresh_writes"]),
        "refresh_failures": int(now["subc_serve_root_refresh_failures"]),
    }
    if now['subc_serve_root_slots{state="stale"}'] > 0:
        out["warm_timeout"] = True
    return out


def bare_writer(prog: Path, updates: int, requests: int) -> dict:
    """``updates`` updates in ``requests`` WriteRequests (half INSERTs of range entries of the
    price tables under unused states, then their DELETEs) with p4runtime-shell's client alone:
    updates per second.  The switch must run ``prog``'s program."""
    from p4.v1 import p4runtime_pb2 as pr
    from p4runtime_sh.p4runtime import P4RuntimeClient

    client = P4RuntimeClient(0, GRPC, (0, 9))
    info = client.get_p4info()
    tables = [t for t in info.tables if t.preamble.name.endswith("add_order_price")]
    refs = {r.id for r in tables[0].action_refs}
    action = next(a for a in info.actions if a.preamble.id in refs and a.params)  # the delivery action
    inserts = []
    n = max(1, updates // 2)
    for k in range(n):
        t = tables[k % len(tables)]
        te = pr.TableEntry(table_id=t.preamble.id, priority=10)
        state, price = t.match_fields[0], t.match_fields[1]
        te.match.append(
            pr.FieldMatch(
                field_id=state.id,
                exact=pr.FieldMatch.Exact(value=(1000 + k // len(tables)).to_bytes((state.bitwidth + 7) // 8, "big")),
            )
        )
        te.match.append(
            pr.FieldMatch(
                field_id=price.id,
                range=pr.FieldMatch.Range(low=(k % 97).to_bytes(4, "big"), high=(1000 + k % 97).to_bytes(4, "big")),
            )
        )
        te.action.action.action_id = action.preamble.id
        for p in action.params:
            te.action.action.params.append(
                pr.Action.Param(param_id=p.id, value=(1).to_bytes((p.bitwidth + 7) // 8, "big"))
            )
        inserts.append(te)
    per = max(1, (2 * n) // max(1, requests))
    t0 = time.perf_counter()
    for kind in (pr.Update.INSERT, pr.Update.DELETE):
        for i in range(0, n, per):
            req = pr.WriteRequest(device_id=0)
            req.election_id.high, req.election_id.low = 0, 9
            for te in inserts[i : i + per]:
                req.updates.append(pr.Update(type=kind, entity=pr.Entity(table_entry=te)))
            client.write(req)
    dt = time.perf_counter() - t0
    client.tear_down()
    return {"bare_updates": 2 * n, "bare_requests": -(-2 * n // per), "bare_updates_per_s": round(2 * n / dt)}


class Client(serve_subscribe.Client):
    """bench/serve_subscribe.py's client from 127.0.0.1 in the namespace (this process runs there
    with --client); subscriptions without TO: the port map puts the source behind port 1."""

    def __init__(self):
        super().__init__("127.0.0.1", ("127.0.0.1", PORT), timeout=120)

    def line(self) -> str:
        sym, price = self.rng.choice(self.syms), self.rng.randint(1, 500)
        return f'SUBSCRIBE add_order.stock == "{sym}" and add_order.price > {price}'


def in_namespace(*args: str) -> subprocess.CompletedProcess:
    """This script with ``args``, run in the namespace (its standard output captured)."""
    return subprocess.run(
        ["ip", "netns", "exec", NS, sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="100,1000,10000")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bare", help=argparse.SUPPRESS)
    ap.add_argument("--grace", type=float, default=0.05, help="the daemon's --grace (s)")
    ap.add_argument("--root-slots", type=int, default=16, help="subc serve-program --root-slots")
    ap.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="seconds without requests between filling a level and measuring latency",
    )
    ap.add_argument(
        "--warm",
        action="store_true",
        help="after the fill (and --settle), wait until every free root slot is refreshed",
    )
    ap.add_argument("--daemon-log", help="the daemon's log (debug: every change's times) to this file")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    if a.client:
        serve_subscribe.client(
            levels, Client(), a.samples, a.burst, counters=metrics, settle=a.settle, warm=warm_slots if a.warm else None
        )
        return
    if a.bare:
        prog, updates, requests = a.bare.split(",")
        print(json.dumps(bare_writer(Path(prog), int(updates), int(requests))), flush=True)
        return
    for tool in ("simple_switch_grpc", "p4c-bm2-ss"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not on PATH")
    tmp = Path(tempfile.mkdtemp())
    sh("ip", "netns", "del", NS, check=False)
    sh("ip", "netns", "add", NS)
    sw = daemon = None
    try:
        sh("ip", "-n", NS, "link", "set", "lo", "up")
        for p in range(4):
            sh("ip", "-n", NS, "link", "add", f"s{p}", "type", "veth", "peer", "name", f"h{p}")
            for end in (f"s{p}", f"h{p}"):
                sh("ip", "-n", NS, "link", "set", end, "up")
        prog = tmp / "prog"
        sh(
            *SUBC,
            "serve-program",
            "--spec",
            str(SPEC),
            "--ports",
            "1-3",
            "--capacity",
            str(max(levels) + a.burst + 1000),
            "--root-slots",
            str(a.root_slots),
            "-o",
            str(prog),
        )
        sh("p4c-bm2-ss", "--std", "p4-16", str(prog / "subc.p4"), "-o", str(tmp / "prog.json"))
        (tmp / "ports.txt").write_text("127.0.0.0/8 1\n")
        (tmp / "acl.toml").write_text("[limits]\nsubscriptions_per_source = 10000000\nrequests_per_second = 10000000\n")
        ifaces = [x for p in range(4) for x in ("-i", f"{p}@s{p}")]
        sw = subprocess.Popen(
            ["ip", "netns", "exec", NS, "simple_switch_grpc", "--no-p4", *ifaces, "--", "--grpc-server-addr", GRPC],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        host, port = GRPC.rsplit(":", 1)
        probe = (
            "import socket, sys, time\nfor _ in range(600):\n    with socket.socket() as s:\n"
            f"        if s.connect_ex(({host!r}, {port})) == 0: sys.exit(0)\n    time.sleep(0.1)\nsys.exit(1)"
        )
        sh("ip", "netns", "exec", NS, sys.executable, "-c", probe)  # the switch's P4Runtime server is up
        daemon = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                NS,
                *SUBC,
                "serve",
                "--spec",
                str(SPEC),
                "--p4runtime",
                GRPC,
                "--program",
                str(prog),
                "--config",
                str(tmp / "prog.json"),
                "--port-map",
                str(tmp / "ports.txt"),
                "--acl",
                str(tmp / "acl.toml"),
                "--state",
                str(tmp / "state"),
                "--listen",
                f"127.0.0.1:{PORT}",
                "--metrics",
                METRICS,
                "--grace",
                str(a.grace),
                "--log-level",
                "debug" if a.daemon_log else "warning",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        while not (line := daemon.stderr.readline()).startswith("serving on") and "serving on" not in line:
            sys.stderr.write(line)
            if not line:
                raise SystemExit(f"subc serve exited ({daemon.wait()})")
        if a.daemon_log:  # drained into the file (a full pipe would stall the daemon)
            log = open(a.daemon_log, "w")  # noqa: SIM115 - closed when the daemon's stderr ends
            threading.Thread(target=lambda: (shutil.copyfileobj(daemon.stderr, log), log.close()), daemon=True).start()
        r = in_namespace(
            "--client",
            "--levels",
            a.levels,
            "--samples",
            str(a.samples),
            "--burst",
            str(a.burst),
            "--settle",
            str(a.settle),
            *(["--warm"] if a.warm else []),
        )
        sys.stdout.write(r.stdout)
        if r.returncode:
            raise SystemExit(r.returncode)
        daemon.terminate()
        daemon.wait(timeout=60)
        daemon = None
        worst = max(
            (json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")), key=lambda d: d["switch_updates"]
        )
        r = in_namespace("--bare", f"{prog},{worst['switch_updates']},{worst['write_requests']}")
        bare = json.loads(r.stdout)
        bare["requests_per_s_at_bare_rate"] = round(
            bare["bare_updates_per_s"] * worst["burst"] / worst["switch_updates"]
        )
        print(json.dumps({"bare_writer": bare, "daemon_level": worst["live_subscriptions"]}), flush=True)
    finally:
        for p in (daemon, sw):
            if p is not None:
                p.terminate()
                p.wait(timeout=60)
        sh("ip", "netns", "del", NS, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
