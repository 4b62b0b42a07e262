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
* throughput: 1,000 SUBSCRIBE requests with up to 64 in flight, requests per second.

Subscriptions are ``add_order.stock == S and add_order.price > P`` over 2,000 symbols, as in
bench/serve_subscribe.py.  ``python3 bench/serve_p4runtime.py [--levels 100,1000,10000]`` prints
one JSON object per level.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
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


class Client(serve_subscribe.Client):
    """bench/serve_subscribe.py's client from 127.0.0.1 in the namespace (this process runs there
    with --client); subscriptions without TO: the port map puts the source behind port 1."""

    def __init__(self):
        super().__init__("127.0.0.1", ("127.0.0.1", PORT), timeout=120)

    def line(self) -> str:
        return f'SUBSCRIBE add_order.stock == "{self.rng.choice(self.syms)}" and add_order.price > {self.rng.randint(1, 500)}'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="100,1000,10000")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    if a.client:
        serve_subscribe.client(levels, Client(), a.samples, a.burst)
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
        sh(*SUBC, "serve-program", "--spec", str(SPEC), "--ports", "1-3", "--capacity",
           str(max(levels) + a.burst + 1000), "-o", str(prog))
        sh("p4c-bm2-ss", "--std", "p4-16", str(prog / "subc.p4"), "-o", str(tmp / "prog.json"))
        (tmp / "ports.txt").write_text("127.0.0.0/8 1\n")
        (tmp / "acl.toml").write_text("[limits]\nsubscriptions_per_source = 10000000\nrequests_per_second = 10000000\n")
        ifaces = [x for p in range(4) for x in ("-i", f"{p}@s{p}")]
        sw = subprocess.Popen(["ip", "netns", "exec", NS, "simple_switch_grpc", "--no-p4", *ifaces, "--",
                               "--grpc-server-addr", GRPC], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        host, port = GRPC.rsplit(":", 1)
        probe = ("import socket, sys, time\nfor _ in range(600):\n    with socket.socket() as s:\n"
                 f"        if s.connect_ex(({host!r}, {port})) == 0: sys.exit(0)\n    time.sleep(0.1)\nsys.exit(1)")
        sh("ip", "netns", "exec", NS, sys.executable, "-c", probe)  # the switch's P4Runtime server is up
        daemon = subprocess.Popen(["ip", "netns", "exec", NS, *SUBC, "serve", "--spec", str(SPEC), "--p4runtime", GRPC,
                                   "--program", str(prog), "--config", str(tmp / "prog.json"), "--port-map",
                                   str(tmp / "ports.txt"), "--acl", str(tmp / "acl.toml"), "--state", str(tmp / "state"),
                                   "--listen", f"127.0.0.1:{PORT}", "--log-level", "warning"],
                                  stderr=subprocess.PIPE, text=True)
        while not (line := daemon.stderr.readline()).startswith("serving on"):
            sys.stderr.write(line)
            if not line:
                raise SystemExit(f"subc serve exited ({daemon.wait()})")
        r = subprocess.run(["ip", "netns", "exec", NS, sys.executable, __file__, "--client", "--levels", a.levels,
                            "--samples", str(a.samples), "--burst", str(a.burst)])
        if r.returncode:
            raise SystemExit(r.returncode)
    finally:
        for p in (daemon, sw):
            if p is not None:
                p.terminate()
                p.wait(timeout=60)
        sh("ip", "netns", "del", NS, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
