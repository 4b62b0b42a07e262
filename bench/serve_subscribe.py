"""Benchmark: ``subc serve`` subscribe latency and throughput at 1K, 10K and 100K live subscriptions.

Two network namespaces made here (``sbbrk``: the daemon on veth ``sbb0``; ``sbcli``: the client),
removed afterwards.  At each level the client first fills the daemon up to the level (pipelined
requests), then measures:

* latency: 1,000 SUBSCRIBE requests one at a time (send, wait for the SUBACK: the data plane
  already switched to the new diagram and the store, SQLite in WAL mode under ``--state`` in a
  temporary directory, committed), p50 and p99, with an UNSUBSCRIBE after each so the level
  stays put;
* throughput: 5,000 SUBSCRIBE requests with up to 64 in flight, requests per second.

Subscriptions are ``add_order.stock == S and add_order.price > P`` over 2,000 symbols, delivered
to 256 endpoints (``TO`` the client's own address); the data path is the default field order of
the ITCH example spec.  Run as root: ``python3 bench/serve_subscribe.py [--levels 1000,10000,100000]``.
Prints one JSON object per level.
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
BRK, CLI = "sbbrk", "sbcli"
DAEMON, CLIENT = "10.77.0.1", "10.77.0.2"
PORT = 7000


def sh(*args: str, check: bool = True) -> None:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode:
        raise SystemExit(f"{' '.join(args)}: {r.stderr.strip()}")


def setup() -> None:
    teardown()
    for ns in (BRK, CLI):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "link", "add", "sbb0", "netns", BRK, "type", "veth", "peer", "name", "sbc0", "netns", CLI)
    sh("ip", "-n", BRK, "addr", "add", f"{DAEMON}/24", "dev", "sbb0")
    sh("ip", "-n", CLI, "addr", "add", f"{CLIENT}/24", "dev", "sbc0")
    sh("ip", "-n", BRK, "link", "set", "sbb0", "up")
    sh("ip", "-n", CLI, "link", "set", "sbc0", "up")


def teardown() -> None:
    sh("nsenter", f"--net=/run/netns/{BRK}", *SUBC, "unload", "--iface", "sbb0", check=False)
    for ns in (BRK, CLI):
        sh("ip", "netns", "del", ns, check=False)


class Client:
    """Requests over UDP from ``bind`` to the daemon at ``server`` (address, port); a reply may
    take ``timeout`` s (a lost datagram fails the run instead of hanging it).  Also used by
    bench/serve_p4runtime.py.

    The daemon's address proof (docs/serve.md): the client first gets a cookie (``RENEW 0`` sent
    without one, padded to 24 bytes, is answered ``COOKIE <hex>``) and appends it to every request;
    a ``COOKIE`` reply later (the cookie went stale: it lives 120 to 240 s) takes the place of the
    reply to a request, which is then sent again with the new cookie."""

    def __init__(self, bind: str = CLIENT, server: tuple[str, int] = (DAEMON, PORT), timeout: float = 30):
        self.server = server
        self.s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        self.s.bind((bind, 0))
        self.s.settimeout(timeout)
        self.rng = random.Random(1)
        self.syms = ["".join(self.rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(4)) for _ in range(2000)]
        self.live: list[int] = []
        self.cookie: str | None = None
        self.ask("RENEW 0")

    def line(self) -> str:
        sym = self.rng.choice(self.syms)
        return (
            f'SUBSCRIBE add_order.stock == "{sym}" and add_order.price > {self.rng.randint(1, 500)} '
            f"TO {CLIENT}:{10000 + self.rng.randrange(256)}"
        )

    def send(self, line: str) -> None:
        data = f"{line} COOKIE {self.cookie}" if self.cookie else line.ljust(24)
        self.s.sendto(data.encode(), self.server)

    def reply(self) -> str:
        """The next reply line; a new cookie is kept (and returned: the caller sends again)."""
        data, _ = self.s.recvfrom(65536)
        r = data.decode().strip()
        if r.startswith("COOKIE "):
            self.cookie = r.split()[1]
        return r

    def ask(self, line: str) -> str:
        """One request, sent again after a cookie reply; its reply."""
        for _ in range(3):
            self.send(line)
            r = self.reply()
            if not r.startswith("COOKIE "):
                return r
        raise SystemExit(f"{line}: the daemon keeps asking for a cookie")

    def pipelined(self, n: int, window: int = 64) -> float:
        """Send ``n`` SUBSCRIBEs with up to ``window`` in flight; returns requests per second."""
        t0 = time.perf_counter()
        sent = done = 0
        while done < n:
            while sent < n and sent - done < window:
                self.send(self.line())
                sent += 1
            r = self.reply()
            if r.startswith("COOKIE "):
                sent -= 1  # that request was not made: another one goes with the new cookie
                continue
            if not r.startswith("SUBACK "):
                raise SystemExit(f"unexpected reply: {r}")
            self.live.append(int(r.split()[1]))
            done += 1
        return n / (time.perf_counter() - t0)

    def latency(self, n: int = 1000) -> list[float]:
        out = []
        for _ in range(n):
            line = self.line()
            while True:
                t0 = time.perf_counter()
                self.send(line)
                r = self.reply()
                if not r.startswith("COOKIE "):
                    break
            out.append(time.perf_counter() - t0)
            sid = int(r.split()[1])
            assert self.ask(f"UNSUBSCRIBE {sid}") == f"UNSUBACK {sid}"
        return out

    def unsubscribe(self, n: int, window: int = 64) -> None:
        left = set(self.live[-n:])
        del self.live[-n:]
        while left:  # again for those whose request met a stale cookie
            ids, sent, done = sorted(left), 0, 0
            while done < len(ids):
                while sent < len(ids) and sent - done < window:
                    self.send(f"UNSUBSCRIBE {ids[sent]}")
                    sent += 1
                r = self.reply()
                done += 1
                if r.startswith("UNSUBACK "):
                    left.discard(int(r.split()[1]))
                elif not r.startswith("COOKIE "):
                    raise SystemExit(f"unexpected reply: {r}")


def client(
    levels: list[int],
    c: Client | None = None,
    samples: int = 1000,
    burst: int = 5000,
    counters=None,
    settle: float = 0.0,
    warm=None,
) -> None:
    """At each level: fill ``c`` up to it, ``samples`` latencies, a ``burst`` of pipelined
    SUBSCRIBEs (then removed); one JSON line per level on standard output.  ``counters``: a
    function giving the daemon's counters (name -> value), read around the burst: each one's
    increase and its rate over the burst are added to the line.  ``settle``: seconds without
    requests between the fill and the latencies (a daemon between bursts); ``warm``: a function
    called after it, which waits for the daemon to be ready in some sense and returns a dict
    added to the line."""
    c = c or Client()
    for level in levels:
        fill = level - len(c.live)
        t_fill = c.pipelined(fill) if fill > 0 else None
        time.sleep(settle)
        warmed = warm() if warm else {}
        print(f"level {level}: filled, measuring latency", file=sys.stderr, flush=True)
        lat = sorted(c.latency(samples))
        print(f"level {level}: measuring throughput", file=sys.stderr, flush=True)
        before = counters() if counters else {}
        rate = c.pipelined(burst)
        after = counters() if counters else {}
        c.unsubscribe(burst)
        out = {
            "live_subscriptions": level,
            "fill_requests_per_s": t_fill and round(t_fill),
            "suback_p50_ms": round(lat[len(lat) // 2] * 1e3, 3),
            "suback_p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 3),
            "subscribe_requests_per_s": round(rate),
            "burst": burst,
            **warmed,
        }
        for name, v in after.items():
            out[name] = int(v - before[name])
            out[f"{name}_per_s"] = round((v - before[name]) * rate / burst)
        print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="1000,10000,100000")
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    if a.client:
        client(levels)
        return
    setup()
    daemon = None
    tmp = Path(tempfile.mkdtemp())
    acl = tmp / "acl.toml"  # one client makes every request: lift the per-source limits
    acl.write_text("[limits]\nsubscriptions_per_source = 10000000\nrequests_per_second = 10000000\n")
    try:
        daemon = subprocess.Popen(
            [
                "nsenter",
                f"--net=/run/netns/{BRK}",
                *SUBC,
                "serve",
                "--spec",
                str(SPEC),
                "--acl",
                str(acl),
                "--state",
                str(tmp / "state"),
                "--iface",
                "sbb0",
                "--listen",
                f"{DAEMON}:{PORT}",
                "--capacity",
                str(max(levels) + 10_000),
                "--log-level",
                "warning",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        while not (line := daemon.stderr.readline()).startswith("serving on"):
            sys.stderr.write(line)
            if not line:
                raise SystemExit(f"subc serve exited ({daemon.wait()})")
        r = subprocess.run(
            ["nsenter", f"--net=/run/netns/{CLI}", sys.executable, __file__, "--client", "--levels", a.levels]
        )
        if r.returncode:
            raise SystemExit(r.returncode)
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=60)
        teardown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
