"""Benchmark: ``subc serve --cluster`` (docs/cluster.md) at 1 and 3 brokers with 10,000 and
100,000 live subscriptions: SUBACK latency and SUBSCRIBE requests/s (beside the single daemon's,
``bench/serve_subscribe.py``, run the same way), the time a change takes to be applied by every
broker, and the fail-over time from ``kill -9`` of a subscriber's broker to the first message the
new owner delivers.

Namespaces made here, removed afterwards (addresses inside them only):

    cbctl: one etcd member (10.79.0.100, data on the temporary directory's file system)
    cbbK (broker K): cbcK 10.79.0.1K (to etcd), cbsK 10.78.0.1K (to the client's bridge), cbfK 10.77.K.2 (feed)
    cbcli: the client and the subscriber, bridge br0 10.78.0.2
    cbpub: the publisher, cbpK 10.77.K.1 (one link per broker: a replicated feed)

Per level: the client fills broker 1 up to the level (pipelined SUBSCRIBEs), then

* latency: ``--samples`` SUBSCRIBEs one at a time to broker 1 (SUBACK: committed in etcd and
  switched in broker 1's data plane), p50/p99, each followed by its UNSUBSCRIBE;
* applied everywhere: for ``--samples // 3`` of them, the time from the request until every
  broker's store holds the subscription (a broker commits its store in the change that applies it),
  p50/p99, and the same from the SUBACK;
* throughput: ``--burst`` SUBSCRIBEs with up to 64 in flight to broker 1, requests/s.

Fail-over (3 brokers, ``--cluster-ttl``): the publisher sends ``--feed-rate`` datagrams/s to every
broker; the subscriber's owner (the source of its copies) is killed with SIGKILL; the time until a
copy arrives from another broker, ``--failovers`` times (the killed broker restarts and takes its
endpoints back between runs: the time until it serves, and until it delivers again, holding the
subscriptions the measurements left).  Brokers have ``--capacity`` twice the largest level: a
restarted broker builds its diagram beside the one its kernel still runs.  Run as root: ``python3 bench/cluster_bench.py``.  Prints one JSON
object per measurement.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_subscribe  # noqa: E402 - the single daemon's client, reused

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "itch" / "spec.p4"
SUBC = [sys.executable, "-m", "subc.cli"]
CTL, CLI, PUB = "cbctl", "cbcli", "cbpub"
CLIENT = "10.78.0.2"
ETCD = "10.79.0.100:2379"
PORT, RR_PORT = 7000, 9100


def sh(*args: str, check: bool = True) -> None:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode:
        raise SystemExit(f"{' '.join(args)}: {r.stderr.strip()}")


def in_ns(ns: str, fn):
    """``fn()`` in a thread that entered namespace ``ns`` (sockets made there stay there)."""
    out: dict = {}

    def run() -> None:
        from pyroute2.netns import setns

        setns(ns, flags=0)
        out["v"] = fn()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out["v"]


def setup(n: int) -> None:
    teardown()
    for ns in (CTL, CLI, PUB, *(f"cbb{k}" for k in range(1, n + 1))):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    for ns, br, addr in ((CLI, "br0", f"{CLIENT}/24"), (CTL, "br1", "10.79.0.100/24")):
        sh("ip", "-n", ns, "link", "add", br, "type", "bridge")
        sh("ip", "-n", ns, "addr", "add", addr, "dev", br)
        sh("ip", "-n", ns, "link", "set", br, "up")
    for k in range(1, n + 1):
        b = f"cbb{k}"
        for side, peer_ns, peer, addr, br in (("cbs", CLI, "cbq", f"10.78.0.1{k}/24", "br0"),
                                              ("cbc", CTL, "cbr", f"10.79.0.1{k}/24", "br1")):
            sh("ip", "link", "add", f"{side}{k}", "netns", b, "type", "veth", "peer", "name", f"{peer}{k}",
               "netns", peer_ns)
            sh("ip", "-n", b, "addr", "add", addr, "dev", f"{side}{k}")
            sh("ip", "-n", b, "link", "set", f"{side}{k}", "up")
            sh("ip", "-n", peer_ns, "link", "set", f"{peer}{k}", "master", br)
            sh("ip", "-n", peer_ns, "link", "set", f"{peer}{k}", "up")
        sh("ip", "netns", "exec", CLI, "ethtool", "-K", f"cbq{k}", "gro", "on")
        sh("ip", "link", "add", f"cbp{k}", "netns", PUB, "type", "veth", "peer", "name", f"cbf{k}", "netns", b)
        sh("ip", "-n", PUB, "addr", "add", f"10.77.{k}.1/24", "dev", f"cbp{k}")
        sh("ip", "-n", b, "addr", "add", f"10.77.{k}.2/24", "dev", f"cbf{k}")
        sh("ip", "-n", PUB, "link", "set", f"cbp{k}", "up")
        sh("ip", "-n", b, "link", "set", f"cbf{k}", "up")
        sh("ip", "netns", "exec", PUB, "ethtool", "-K", f"cbp{k}", "tx", "off")


def teardown() -> None:
    for k in range(1, 4):
        if Path(f"/run/netns/cbb{k}").exists():
            sh("nsenter", f"--net=/run/netns/cbb{k}", *SUBC, "unload", "--iface", f"cbf{k}", check=False)
    for ns in (CTL, CLI, PUB, "cbb1", "cbb2", "cbb3"):
        sh("ip", "netns", "del", ns, check=False)


class Cluster:
    """etcd and ``n`` brokers under ``tmp``."""

    def __init__(self, n: int, tmp: Path, capacity: int, ttl: int):
        self.n, self.tmp, self.capacity, self.ttl = n, tmp, capacity, ttl
        self.live = 0  # subscriptions the benchmark left live (for the restart figures)
        self.etcd = subprocess.Popen(
            ["ip", "netns", "exec", CTL, "etcd", "--name", "e1", "--data-dir", str(tmp / "etcd"),
             "--listen-client-urls", f"http://{ETCD}", "--advertise-client-urls", f"http://{ETCD}",
             "--listen-peer-urls", "http://10.79.0.100:2380", "--initial-advertise-peer-urls",
             "http://10.79.0.100:2380", "--initial-cluster", "e1=http://10.79.0.100:2380",
             "--quota-backend-bytes", str(8 << 30), "--logger", "zap", "--log-outputs", str(tmp / "etcd.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.acl = tmp / "acl.toml"
        self.acl.write_text("[limits]\nsubscriptions_per_source = 10000000\nrequests_per_second = 10000000\n")
        self.procs: dict[int, subprocess.Popen] = {}
        for k in range(1, n + 1):
            self.start(k)

    def start(self, k: int) -> None:
        p = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/cbb{k}", *SUBC, "serve", "--spec", str(SPEC), "--iface", f"cbf{k}",
             "--listen", f"0.0.0.0:{PORT}", "--state", str(self.tmp / f"b{k}"), "--acl", str(self.acl),
             "--capacity", str(self.capacity), "--journal", "--rerequest", f"0.0.0.0:{RR_PORT}",
             "--cluster", ETCD, "--node", f"b{k}", "--cluster-ttl", str(self.ttl), "--log-level", "warning"],
            stderr=subprocess.PIPE, text=True)
        seen = []
        while not (line := p.stderr.readline()).startswith("serving on"):
            seen.append(line)
            if not line:
                raise SystemExit(f"broker {k} exited ({p.wait()}): {''.join(seen[-5:])}")
        threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
        self.procs[k] = p

    def has(self, k: int, sid: int) -> bool:
        db = sqlite3.connect(f"file:{self.tmp / f'b{k}' / 'subscriptions.db'}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute("SELECT 1 FROM subscription WHERE id = ?", (sid,)).fetchone() is not None
        except sqlite3.OperationalError:
            return False
        finally:
            db.close()

    def handed_over(self) -> None:
        """Wait until every broker is a member and acknowledged the member set."""
        from subc.cluster.etcd import Etcd
        from subc.cluster.status import cluster_status

        def ready() -> bool:
            e = Etcd([ETCD])
            try:
                st = cluster_status(e, "/subc/", with_etcd=False)
            finally:
                e.close()
            rows = [b for b in st["brokers"] if b["live"]]
            return len(rows) == len(self.procs) and all(b["acknowledged"] and b["fenced"] is False for b in rows)

        end = time.monotonic() + 120
        while not in_ns(CTL, ready):
            if time.monotonic() > end:
                raise SystemExit("the brokers did not hand over")
            time.sleep(0.2)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        self.etcd.terminate()
        self.etcd.wait(timeout=30)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(len(xs) * q))] * 1e3, 3)


def measure(c: Cluster, levels: list[int], samples: int, burst: int) -> None:
    serve_subscribe.CLIENT = CLIENT
    client = in_ns(CLI, lambda: serve_subscribe.Client(bind=CLIENT, server=("10.78.0.11", PORT), timeout=60))
    for level in levels:
        fill = level - len(client.live)
        t_fill = client.pipelined(fill) if fill > 0 else None
        print(f"{c.n} brokers, level {level}: filled", file=sys.stderr, flush=True)
        lat = client.latency(samples)
        everywhere, after_ack = [], []
        for _ in range(max(1, samples // 3)):
            line = client.line()
            t0 = time.perf_counter()
            r = client.ask(line)
            t_ack = time.perf_counter()
            sid = int(r.split()[1])
            left = set(c.procs)
            while left:
                left = {k for k in left if not c.has(k, sid)}
                if left:
                    time.sleep(0.002)
            t_all = time.perf_counter()
            everywhere.append(t_all - t0)
            after_ack.append(t_all - t_ack)
            assert client.ask(f"UNSUBSCRIBE {sid}") == f"UNSUBACK {sid}"
        rate = client.pipelined(burst)
        client.unsubscribe(burst)
        c.live = len(client.live)
        print(json.dumps({"brokers": c.n, "live_subscriptions": level,
                          "fill_requests_per_s": t_fill and round(t_fill),
                          "suback_p50_ms": pct(lat, 0.5), "suback_p99_ms": pct(lat, 0.99),
                          "applied_everywhere_p50_ms": pct(everywhere, 0.5),
                          "applied_everywhere_p99_ms": pct(everywhere, 0.99),
                          "applied_everywhere_after_suback_p50_ms": pct(after_ack, 0.5),
                          "applied_everywhere_after_suback_p99_ms": pct(after_ack, 0.99),
                          "subscribe_requests_per_s": round(rate)}), flush=True)


def add_order(ref: int) -> bytes:
    """An ITCH 5.0 Add Order ('A', 36 bytes) for AAPL."""
    return struct.pack(">cHH6sQcI8sI", b"A", 1, 0, b"\0" * 6, ref, b"B", 100, b"AAPL    ", 1_000_000)


def failover(c: Cluster, repeats: int, rate: float) -> None:
    sub = in_ns(CLI, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    sub.bind((CLIENT, 6001))
    sub.settimeout(1.0)
    serve_subscribe.CLIENT = CLIENT
    ctl = in_ns(CLI, lambda: serve_subscribe.Client(bind=CLIENT, server=("10.78.0.11", PORT), timeout=60))
    r = ctl.ask(f'SUBSCRIBE add_order.stock == "AAPL" TO {CLIENT}:6001')
    assert r.startswith("SUBACK"), r
    pub = in_ns(PUB, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    stop = threading.Event()

    def feed() -> None:
        seq, gap = 1, 1.0 / rate
        nxt = time.perf_counter()
        while not stop.is_set():
            m = add_order(seq)
            dgram = b"CLUSTERB01" + seq.to_bytes(8, "big") + (1).to_bytes(2, "big") + len(m).to_bytes(2, "big") + m
            for k in range(1, c.n + 1):
                pub.sendto(dgram, (f"10.77.{k}.2", 26400))
            seq += 1
            nxt += gap
            time.sleep(max(0.0, nxt - time.perf_counter()))

    threading.Thread(target=feed, daemon=True).start()
    try:
        for _ in range(repeats):
            src = None
            while src is None:
                try:
                    _, (src, _) = sub.recvfrom(2048)
                except socket.timeout:
                    pass
            victim = int(src.rsplit(".", 1)[1]) - 10
            c.procs[victim].send_signal(signal.SIGKILL)
            t_kill = time.perf_counter()
            c.procs[victim].wait()
            last_old = t_kill
            while True:
                try:
                    _, (s2, _) = sub.recvfrom(2048)
                except socket.timeout:
                    continue
                if s2 == src:
                    last_old = time.perf_counter()
                    continue
                t_new = time.perf_counter()
                break
            print(json.dumps({"failover_s": round(t_new - t_kill, 3), "old_owner_sent_until_s": round(last_old - t_kill, 3),
                              "ttl_s": c.ttl, "feed_datagrams_per_s": rate}), flush=True)
            t_start = time.perf_counter()
            c.start(victim)
            t_serving = time.perf_counter()
            c.handed_over()
            while True:  # drain until the restarted owner delivers again
                try:
                    _, (s3, _) = sub.recvfrom(2048)
                except socket.timeout:
                    continue
                if s3 == src:
                    break
            print(json.dumps({"restart_serving_s": round(t_serving - t_start, 3),
                              "restart_delivering_again_s": round(time.perf_counter() - t_start, 3),
                              "live_subscriptions": c.live}), flush=True)
    finally:
        stop.set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="10000,100000")
    ap.add_argument("--brokers", default="1,3")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--burst", type=int, default=3000)
    ap.add_argument("--cluster-ttl", type=int, default=2)
    ap.add_argument("--failovers", type=int, default=3)
    ap.add_argument("--feed-rate", type=float, default=2000.0)
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    for n in [int(x) for x in a.brokers.split(",")]:
        setup(n)
        tmp = Path(tempfile.mkdtemp())
        c = None
        try:
            # room for the diagram twice: a restarted broker restores beside the one its kernel runs
            c = Cluster(n, tmp, 2 * max(levels) + 10_000, a.cluster_ttl)
            c.handed_over()
            if levels:
                measure(c, levels, a.samples, a.burst)
            if n > 1 and a.failovers:
                failover(c, a.failovers, a.feed_rate)
        finally:
            if c is not None:
                c.close()
            teardown()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
