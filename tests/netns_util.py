"""A publisher, a broker and subscribers in network namespaces made for a test (veth pairs,
addresses in 10.10.0.0/16 inside those namespaces only), removed afterwards.

    publisher (pub: 10.10.0.1) --- (b0: 10.10.0.2) broker (bK: 10.10.K.1) --- (sK: 10.10.K.2) subscriber K

The publisher's veth sends complete UDP checksums (tx checksum offload off, as a NIC on a wire
would), and the subscribers' veths have GRO on, which lets a veth receive XDP-redirected frames.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SUBC = [sys.executable, "-m", "subc.cli"]


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode:
        raise AssertionError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


class Topology:
    """Namespaces ``<tag>pub``, ``<tag>brk``, ``<tag>s1``..; interface names stay under 15 bytes.

    ``b0``: the broker's feed interface name (default ``<tag>b0``; two topologies may share one,
    as two containers each have an ``eth0``).  ``container``: run the broker's commands with
    ``ip netns exec`` (a mount namespace of their own with a fresh /sys, as in a container)
    instead of ``nsenter --net`` (the host's mounts)."""

    def __init__(self, tag: str, n_subs: int = 3, b0: str | None = None, container: bool = False):
        need_root_and_netns()
        self.tag, self.n = tag, n_subs
        self.pub, self.brk = f"{tag}pub", f"{tag}brk"
        self.subs = [f"{tag}s{k}" for k in range(1, n_subs + 1)]
        self.b0 = b0 or f"{tag}b0"
        self.container = container
        self.macs: dict[int, str] = {}
        try:
            self._build()
        except BaseException:
            self.remove()
            raise

    def _build(self) -> None:
        t = self.tag
        for ns in [self.pub, self.brk, *self.subs]:
            sh("ip", "netns", "del", ns, check=False)
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", f"{t}p0", "netns", self.pub, "type", "veth", "peer", "name", self.b0, "netns", self.brk)
        sh("ip", "-n", self.pub, "addr", "add", "10.10.0.1/24", "dev", f"{t}p0")
        sh("ip", "-n", self.brk, "addr", "add", "10.10.0.2/24", "dev", self.b0)
        sh("ip", "-n", self.pub, "link", "set", f"{t}p0", "up")
        sh("ip", "-n", self.brk, "link", "set", self.b0, "up")
        sh("ip", "netns", "exec", self.pub, "ethtool", "-K", f"{t}p0", "tx", "off")
        for k, ns in enumerate(self.subs, 1):
            sh("ip", "link", "add", f"{t}b{k}", "netns", self.brk, "type", "veth", "peer", "name", f"{t}s{k}", "netns", ns)
            sh("ip", "-n", self.brk, "addr", "add", f"10.10.{k}.1/24", "dev", f"{t}b{k}")
            sh("ip", "-n", ns, "addr", "add", f"10.10.{k}.2/24", "dev", f"{t}s{k}")
            sh("ip", "-n", self.brk, "link", "set", f"{t}b{k}", "up")
            sh("ip", "-n", ns, "link", "set", f"{t}s{k}", "up")
            sh("ip", "netns", "exec", ns, "ethtool", "-K", f"{t}s{k}", "gro", "on")
            out = sh("ip", "-n", ns, "-j", "link", "show", f"{t}s{k}").stdout
            self.macs[k] = json.loads(out)[0]["address"]
        self.b0_mac = json.loads(sh("ip", "-n", self.brk, "-j", "link", "show", self.b0).stdout)[0]["address"]

    def subscribers_toml(self, endpoints: dict[int, list[tuple[int, int]]]) -> str:
        """A subscribers file: subscriber id -> [(subscriber namespace number, UDP port)]."""
        out = []
        for sid, eps in endpoints.items():
            items = ", ".join(
                f'{{ ip = "10.10.{k}.2", port = {port}, mac = "{self.macs[k]}", iface = "{self.tag}b{k}" }}'
                for k, port in eps
            )
            out.append(f"[[subscriber]]\nid = {sid}\nendpoints = [{items}]\n")
        return "\n".join(out)

    def in_ns(self, ns: str, *args: str) -> list[str]:
        """A command run in namespace ``ns``: network only (``nsenter --net``: the mount
        namespace, and so /sys/fs/bpf, stays the host's), except the broker's with
        ``container`` (``ip netns exec``: a mount namespace of its own, a fresh /sys)."""
        if self.container and ns == self.brk:
            return ["ip", "netns", "exec", ns, *args]
        return ["nsenter", f"--net=/run/netns/{ns}", *args]

    def subc(self, ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh(*self.in_ns(ns, *SUBC, *args), check=check)

    def popen_subc(self, ns: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.in_ns(ns, *SUBC, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def remove(self) -> None:
        if Path(f"/run/netns/{self.brk}").exists():  # pins and state are keyed by the broker's namespace
            sh(*self.in_ns(self.brk, *SUBC, "unload", "--iface", self.b0), check=False)
        for ns in [self.pub, self.brk, *self.subs]:
            sh("ip", "netns", "del", ns, check=False)


def call_in_netns(ns: str, fn):
    """``fn()`` called in a thread that entered network namespace ``ns`` (``/run/netns/ns``), as a
    process started there would call it (the mount namespace stays this process's); its result,
    or its exception raised here."""
    import threading

    out: dict = {}

    def run() -> None:
        from pyroute2.netns import setns

        try:
            setns(ns, flags=0)
            out["v"] = fn()
        except BaseException as e:  # noqa: BLE001 - raised again in the caller
            out["e"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "e" in out:
        raise out["e"]
    return out["v"]


def shared_bpffs():
    """Context: a BPF file system on ``/run/subc/bpffs`` (the host's ``/sys/fs/bpf`` bound there,
    mounted first when missing), which every ``ip netns exec`` command sees, as docs/ebpf.md says to
    make one for brokers in namespaces; removed afterwards when this made it."""
    import contextlib

    from subc.dataplane.ebpf.broker_home import RUN_BPFFS, SYS_BPFFS, is_bpffs

    @contextlib.contextmanager
    def ctx():
        made = not is_bpffs(RUN_BPFFS)
        if made:
            if not is_bpffs(SYS_BPFFS):
                sh("mount", "-t", "bpf", "bpf", str(SYS_BPFFS))
            RUN_BPFFS.mkdir(parents=True, exist_ok=True)
            sh("mount", "--bind", str(SYS_BPFFS), str(RUN_BPFFS))
        try:
            yield RUN_BPFFS
        finally:
            if made:
                sh("umount", str(RUN_BPFFS), check=False)

    return ctx()


def no_shared_bpffs():
    """Context: no BPF file system on ``/run/subc/bpffs`` (unmounted for the duration when one is
    there, and bound again afterwards)."""
    import contextlib

    from subc.dataplane.ebpf.broker_home import RUN_BPFFS, SYS_BPFFS, is_bpffs

    @contextlib.contextmanager
    def ctx():
        had = is_bpffs(RUN_BPFFS)
        if had:
            sh("umount", str(RUN_BPFFS))
        try:
            yield
        finally:
            if had and is_bpffs(SYS_BPFFS):
                sh("mount", "--bind", str(SYS_BPFFS), str(RUN_BPFFS))

    return ctx()


TOOLS = {"ip": "iproute2", "nsenter": "util-linux", "ethtool": "ethtool"}


def need_root_and_netns() -> None:
    """Skip, with the reason, unless the network-namespace tests can run: root, the tools in
    :data:`TOOLS` and what the eBPF broker needs (bcc, kernel headers)."""
    if os.geteuid() != 0:
        pytest.skip("network-namespace tests need root (CI runs them as root)")
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            pytest.skip(f"network-namespace tests need {tool} (apt-get install {package})")
    from ebpf_util import need_root

    need_root()
