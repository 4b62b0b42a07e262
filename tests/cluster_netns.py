"""Three brokers, their etcd, a publisher and the subscribers, in network namespaces made for a
test (addresses inside them only), removed afterwards:

    publisher <tag>pub --(10.20.K.0/24)-- broker K <tag>bK  (feed interface <tag>fK, XDP)
    broker K --(<tag>sK: 10.30.0.1K)-- bridge br0 in <tag>sub (10.30.0.2: every subscriber)
    broker K --(<tag>cK: 10.40.0.1K)-- bridge br1 in <tag>ctl (etcd members at 10.40.0.10M)

Every broker receives the same feed (the publisher sends each datagram to each broker: a
replicated feed) and reaches the same subscriber address, so any broker can deliver any stream.
Cutting a broker's link into ``<tag>ctl`` partitions it from etcd.  The subscribers' side of each
broker link has GRO on (so it receives XDP-redirected frames), the publisher's links send full UDP
checksums.  Broker 3 runs with ``ip netns exec`` (a mount namespace of its own, as in a container,
with the shared BPF file system), the others with ``nsenter --net``.
"""

from __future__ import annotations

import collections
import contextlib
import sqlite3
import subprocess
import threading
from pathlib import Path

from etcd_util import need_etcd
from netns_util import SUBC, need_root_and_netns, sh, shared_bpffs

N = 3
PORT = 7000
RR_PORT = 9100


class ClusterTopology:
    """The namespaces above for ``tag`` (at most 4 characters)."""

    def __init__(self, tag: str):
        self.tag = tag
        self.pub, self.sub, self.ctl = f"{tag}pub", f"{tag}sub", f"{tag}ctl"
        self.brokers = [f"{tag}b{k}" for k in range(1, N + 1)]
        try:
            self._build()
        except BaseException:
            self.remove()
            raise

    def feed_iface(self, k: int) -> str:
        return f"{self.tag}f{k}"

    def broker_ip(self, k: int) -> str:
        """Broker k's address on the subscribers' side (requests, re-requests, its copies' source)."""
        return f"10.30.0.1{k}"

    def _build(self) -> None:
        t = self.tag
        for ns in [self.pub, self.sub, self.ctl, *self.brokers]:
            sh("ip", "netns", "del", ns, check=False)
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for ns, br, addrs in ((self.sub, "br0", ["10.30.0.2/24"]),
                              (self.ctl, "br1", ["10.40.0.1/24"] + [f"10.40.0.10{m}/24" for m in range(1, N + 1)])):
            sh("ip", "-n", ns, "link", "add", br, "type", "bridge")
            for a in addrs:
                sh("ip", "-n", ns, "addr", "add", a, "dev", br)
            sh("ip", "-n", ns, "link", "set", br, "up")
        for k, b in enumerate(self.brokers, 1):
            # the feed
            sh("ip", "link", "add", f"{t}p{k}", "netns", self.pub, "type", "veth", "peer", "name", f"{t}f{k}",
               "netns", b)
            sh("ip", "-n", self.pub, "addr", "add", f"10.20.{k}.1/24", "dev", f"{t}p{k}")
            sh("ip", "-n", b, "addr", "add", f"10.20.{k}.2/24", "dev", f"{t}f{k}")
            sh("ip", "-n", self.pub, "link", "set", f"{t}p{k}", "up")
            sh("ip", "-n", b, "link", "set", f"{t}f{k}", "up")
            sh("ip", "netns", "exec", self.pub, "ethtool", "-K", f"{t}p{k}", "tx", "off")
            # the subscribers' side
            sh("ip", "link", "add", f"{t}s{k}", "netns", b, "type", "veth", "peer", "name", f"{t}q{k}",
               "netns", self.sub)
            sh("ip", "-n", b, "addr", "add", f"{self.broker_ip(k)}/24", "dev", f"{t}s{k}")
            sh("ip", "-n", b, "link", "set", f"{t}s{k}", "up")
            sh("ip", "-n", self.sub, "link", "set", f"{t}q{k}", "master", "br0")
            sh("ip", "-n", self.sub, "link", "set", f"{t}q{k}", "up")
            sh("ip", "netns", "exec", self.sub, "ethtool", "-K", f"{t}q{k}", "gro", "on")
            # the control network (etcd)
            sh("ip", "link", "add", f"{t}c{k}", "netns", b, "type", "veth", "peer", "name", f"{t}r{k}",
               "netns", self.ctl)
            sh("ip", "-n", b, "addr", "add", f"10.40.0.1{k}/24", "dev", f"{t}c{k}")
            sh("ip", "-n", b, "link", "set", f"{t}c{k}", "up")
            sh("ip", "-n", self.ctl, "link", "set", f"{t}r{k}", "master", "br1")
            sh("ip", "-n", self.ctl, "link", "set", f"{t}r{k}", "up")

    def in_ns(self, ns: str, *args: str) -> list[str]:
        if ns == self.brokers[-1]:
            return ["ip", "netns", "exec", ns, *args]
        return ["nsenter", f"--net=/run/netns/{ns}", *args]

    def partition(self, k: int, cut: bool) -> None:
        """Cut (or heal) broker k's link to etcd."""
        sh("ip", "-n", self.ctl, "link", "set", f"{self.tag}r{k}", "down" if cut else "up")

    def remove(self) -> None:
        for k, b in enumerate(self.brokers, 1):
            if Path(f"/run/netns/{b}").exists():
                sh(*self.in_ns(b, *SUBC, "unload", "--iface", self.feed_iface(k)), check=False)
        for ns in [self.pub, self.sub, self.ctl, *self.brokers]:
            sh("ip", "netns", "del", ns, check=False)


class ClusterBroker:
    """``subc serve --cluster`` as broker k of ``topo``, its state under ``tmp``."""

    def __init__(self, topo: ClusterTopology, k: int, tmp: Path, spec: Path, etcd: list[str], ttl: int = 2):
        self.topo, self.k, self.spec, self.etcd, self.ttl = topo, k, spec, etcd, ttl
        self.state = tmp / f"b{k}"
        self.p: subprocess.Popen | None = None
        self.log: collections.deque = collections.deque(maxlen=60)

    @property
    def name(self) -> str:
        return f"b{self.k}"

    def start(self) -> None:
        t = self.topo
        self.p = subprocess.Popen(t.in_ns(
            t.brokers[self.k - 1], *SUBC, "serve", "--spec", str(self.spec), "--iface", t.feed_iface(self.k),
            "--listen", f"0.0.0.0:{PORT}", "--state", str(self.state), "--capacity", "2000",
            "--journal", "--rerequest", f"0.0.0.0:{RR_PORT}", "--cluster", ",".join(self.etcd),
            "--node", self.name, "--cluster-ttl", str(self.ttl), "--cluster-reconcile", "5",
            "--cluster-lead-messages", "3", "--log-level", "info"), stderr=subprocess.PIPE, text=True)
        while True:
            line = self.p.stderr.readline()
            assert line, f"broker {self.k} exited: {self.p.wait()}: {''.join(self.log)}"
            self.log.append(line)
            if line.startswith("serving on"):
                break
        threading.Thread(target=lambda: self.log.extend(self.p.stderr), daemon=True).start()

    def kill(self, sig: str = "KILL") -> None:
        assert self.p is not None
        sh("kill", f"-{sig}", str(self.p.pid))
        if sig == "KILL":
            self.p.wait()

    def stop(self) -> None:
        if self.p is not None and self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()

    def stored(self) -> tuple[int, dict[int, tuple[str, str, int]]]:
        """(applied revision, id -> (condition, ip, port)) from the broker's store, read as any
        reader of its SQLite file would."""
        db = sqlite3.connect(f"file:{self.state / 'subscriptions.db'}?mode=ro", uri=True, timeout=10)
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'cluster_revision'").fetchone()
            subs = {i: (c, ip, port) for i, c, ip, port in db.execute("SELECT id, condition, ip, port FROM subscription")}
            return int(row[0]) if row else 0, subs
        finally:
            db.close()


@contextlib.contextmanager
def cluster_world(make):
    """``make()``'s world (root, network namespaces and etcd needed, else the test skips), with the
    BPF file system shared for broker 3 (``ip netns exec``); closed afterwards."""
    need_root_and_netns()
    need_etcd()
    with shared_bpffs():
        w = None
        try:
            w = make()
            yield w
        finally:
            if w is not None:
                w.close()
