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
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


class Client:
    """Requests over UDP from 127.0.0.1 in the namespace (this process runs there with --client)."""

    def __init__(self):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.s.bind(("127.0.0.1", 0))
        self.s.settimeout(120)  # a lost datagram fails the run instead of hanging it
        self.rng = random.Random(1)
        self.syms = ["".join(self.rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(4)) for _ in range(2000)]
        self.live: list[int] = []

    def line(self) -> str:
        return f'SUBSCRIBE add_order.stock == "{self.rng.choice(self.syms)}" and add_order.price > {self.rng.randint(1, 500)}'

    def reply(self) -> str:
        return self.s.recv(65536).decode().strip()

    def pipelined(self, n: int, window: int = 64) -> float:
        t0 = time.perf_counter()
        sent = done = 0
        while done < n:
            while sent < n and sent - done < window:
                self.s.sendto(self.line().encode(), ("127.0.0.1", PORT))
                sent += 1
            r = self.reply()
            if not r.startswith("SUBACK "):
                raise SystemExit(f"unexpected reply: {r}")
            self.live.append(int(r.split()[1]))
            done += 1
        return n / (time.perf_counter() - t0)

    def latency(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.s.sendto(self.line().encode(), ("127.0.0.1", PORT))
            r = self.reply()
            out.append(time.perf_counter() - t0)
            sid = int(r.split()[1])
            self.s.sendto(f"UNSUBSCRIBE {sid}".encode(), ("127.0.0.1", PORT))
            assert self.reply() == f"UNSUBACK {sid}"
        return out

    def unsubscribe(self, n: int, window: int = 64) -> None:
        ids, sent, done = self.live[-n:], 0, 0
        del self.live[-n:]
        while done < len(ids):
            while sent < len(ids) and sent - done < window:
                self.s.sendto(f"UNSUBSCRIBE {ids[sent]}".encode(), ("127.0.0.1", PORT))
                sent += 1
            self.reply()
            done += 1


def client(levels: list[int], samples: int, burst: int) -> None:
    c = Client()
    for level in levels:
        fill = level - len(c.live)
        t_fill = c.pipelined(fill) if fill > 0 else None
        print(f"level {level}: filled, measuring latency", file=sys.stderr, flush=True)
        lat = sorted(c.latency(samples))
        print(f"level {level}: measuring throughput", file=sys.stderr, flush=True)
        rate = c.pipelined(burst)
        c.unsubscribe(burst)
        print(json.dumps({"live_subscriptions": level, "fill_requests_per_s": t_fill and round(t_fill),
                          "suback_p50_ms": round(lat[len(lat) // 2] * 1e3, 2),
                          "suback_p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 2),
                          "subscribe_requests_per_s": round(rate)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="100,1000,10000")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    if a.client:
        client(levels, a.samples, a.burst)
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
