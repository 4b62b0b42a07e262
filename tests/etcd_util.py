"""etcd members that a test starts and removes (Debian's ``etcd-server``, installed by
tests/run.sh when root): one or three, on loopback addresses or inside a network namespace,
each with a data directory under the test's temporary directory."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def need_etcd() -> None:
    if not Path(ETCD).exists():
        pytest.skip("etcd is not installed (bash tests/run.sh installs Debian's etcd-server as root)")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class EtcdCluster:
    """``n`` etcd members listening on ``hosts[i]`` (client port ``client_port``, peer port
    ``peer_port``, or free loopback ports), run inside namespace ``netns`` when given
    (``ip netns exec``), data under ``tmp``.  :attr:`endpoints`: the client endpoints."""

    def __init__(self, tmp: Path, n: int = 1, hosts: list[str] | None = None, netns: str | None = None,
                 client_port: int | None = None, peer_port: int | None = None, tag: str = "t"):
        need_etcd()
        self.tmp, self.n, self.netns, self.tag = Path(tmp), n, netns, tag
        self.hosts = hosts or ["127.0.0.1"] * n
        self.client = [client_port or free_port() for _ in range(n)]
        self.peer = [peer_port or free_port() for _ in range(n)]
        self.names = [f"{tag}{i + 1}" for i in range(n)]
        self.procs: list[subprocess.Popen | None] = [None] * n
        self.endpoints = [f"{h}:{c}" for h, c in zip(self.hosts, self.client)]
        self.initial = ",".join(f"{nm}=http://{h}:{p}" for nm, h, p in zip(self.names, self.hosts, self.peer))
        for i in range(n):
            self.start(i, state="new")
        self.wait_healthy()

    def start(self, i: int, state: str = "existing") -> None:
        d = self.tmp / f"etcd-{self.names[i]}"
        d.mkdir(parents=True, exist_ok=True)
        h = self.hosts[i]
        cmd = [ETCD, "--name", self.names[i], "--data-dir", str(d),
               "--listen-client-urls", f"http://{h}:{self.client[i]}",
               "--advertise-client-urls", f"http://{h}:{self.client[i]}",
               "--listen-peer-urls", f"http://{h}:{self.peer[i]}",
               "--initial-advertise-peer-urls", f"http://{h}:{self.peer[i]}",
               "--initial-cluster", self.initial, "--initial-cluster-state", state,
               "--initial-cluster-token", f"subc-test-{self.tag}",
               "--heartbeat-interval", "50", "--election-timeout", "500", "--logger", "zap", "--log-outputs",
               str(d / "log")]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        self.procs[i] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def etcd(self, which: list[int] | None = None):
        from subc.cluster.etcd import Etcd

        return Etcd([self.endpoints[i] for i in (which if which is not None else range(self.n))])

    def _in_ns(self, fn):
        if self.netns is None:
            return fn()
        from netns_util import call_in_netns

        return call_in_netns(self.netns, fn)

    def wait_healthy(self, timeout: float = 60.0) -> None:
        from subc.cluster.etcd import EtcdError

        end = time.monotonic() + timeout

        def probe() -> bool:
            e = self.etcd([i for i in range(self.n) if self.procs[i] is not None])
            try:
                e.revision()
                return True
            except EtcdError:
                return False
            finally:
                e.close()

        while not self._in_ns(probe):
            for i, p in enumerate(self.procs):
                if p is not None and p.poll() is not None:
                    raise AssertionError(f"etcd {self.names[i]} exited {p.returncode}: see {self.tmp}")
            assert time.monotonic() < end, "etcd did not become healthy"
            time.sleep(0.1)

    def leader(self) -> int:
        """The index of the member that leads now."""

        def find() -> int:
            e = self.etcd([i for i in range(self.n) if self.procs[i] is not None])
            try:
                for m in e.members():
                    if m.get("is_leader"):
                        return self.names.index(m["name"])
            finally:
                e.close()
            raise AssertionError("no etcd leader")

        return self._in_ns(find)

    def kill(self, i: int) -> None:
        p = self.procs[i]
        if p is not None:
            p.send_signal(signal.SIGKILL)
            p.wait()
            self.procs[i] = None

    def close(self) -> None:
        for i in range(self.n):
            self.kill(i)
