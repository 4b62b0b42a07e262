"""Where a broker lives (``subc/dataplane/ebpf/broker_home.py``): keys, staleness, which BPF file system.

The end-to-end behaviour (brokers under ``ip netns exec``, two namespaces, a namespace deleted
under a broker) is in ``test_broker_container.py``; these check the rules on their own, most of
them without root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from subc.errors import SubcError
from subc.dataplane.ebpf.broker_home import (
    BrokerHome,
    NetNs,
    bpffs_root,
    check_iface_name,
    current_netns,
    mount_ns_outlives_us,
    stale_reason,
)

HOME = BrokerHome("feed0", NetNs(4026532300, 77), Path("/sys/fs/bpf"), Path("/run/subc"))


def test_paths_are_keyed_by_namespace_and_interface():
    assert HOME.pins == Path("/sys/fs/bpf/subc/net4026532300/feed0")
    assert HOME.state_path == Path("/run/subc/net4026532300/feed0/state.json")
    other = BrokerHome("feed0", NetNs(4026532301, 78), HOME.bpffs, HOME.run)
    assert other.pins != HOME.pins and other.state_dir != HOME.state_dir


def test_this_process_namespace_identity():
    ns = current_netns()
    assert ns.inode == os.stat("/proc/self/ns/net").st_ino
    assert ns.cookie > 0  # Linux 5.14 and later (this machine and CI run 6.x)
    assert current_netns() == ns


@pytest.mark.parametrize("state, ifindex, link, stale", [
    ({"netns_cookie": 77, "ifindex": 5}, 5, 5, None),
    ({"netns_cookie": 77, "ifindex": 5}, 5, None, None),  # loaded without a link: nothing says stale
    ({"netns_cookie": 76, "ifindex": 5}, 5, 5, "namespace cookie 76, which is gone"),
    ({"netns_cookie": 77, "ifindex": 5}, None, 0, "no longer exists"),
    ({"netns_cookie": 77, "ifindex": 5}, 6, 0, "made anew"),
    ({"netns_cookie": 77, "ifindex": 5}, 5, 0, "lost its device"),
    ({"ifindex": 5}, 5, 5, None),  # a state without a cookie (older subc): judged by the rest
])
def test_stale_reason(state, ifindex, link, stale):
    got = stale_reason(state, HOME, ifindex, link)
    assert (got is None) if stale is None else (got is not None and stale in got), got


@pytest.mark.parametrize("name", ["", "a/b", "..", ".", "x" * 16, "eth 0", "eth\n0"])
def test_names_that_cannot_be_interfaces_are_refused(name):
    with pytest.raises(SubcError):
        check_iface_name(name)


def test_subc_bpffs_must_be_a_bpffs(tmp_path, monkeypatch):
    monkeypatch.setenv("SUBC_BPFFS", str(tmp_path))
    with pytest.raises(SubcError, match="is not the mount point of a BPF file system"):
        bpffs_root(mount=False)


def test_reading_commands_never_mount():
    """Without a bpffs where subc looks (a mount namespace of its own where none is mounted), a
    command that only reads says that nothing is loaded where it can reach, and mounts nothing."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux)")
    code = ("from subc.dataplane.ebpf.broker_home import bpffs_mounts, bpffs_root\n"
            "from subc.errors import SubcError\n"
            "before = bpffs_mounts()\n"
            "try:\n    bpffs_root(mount=False)\nexcept SubcError as e:\n    print(e)\n"
            "print(bpffs_mounts() == before == [])\n")
    r = subprocess.run(["unshare", "-m", "sh", "-c", "umount /run/subc/bpffs 2>/dev/null; "
                        "umount /sys/fs/bpf 2>/dev/null; umount /sys/fs/bpf 2>/dev/null; "
                        f"exec {sys.executable} -c \"$0\"", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    said, same = r.stdout.strip().splitlines()
    assert "not loaded where this process can reach it" in said and same == "True", r.stdout


def test_this_mount_namespace_outlives_this_process():
    """The test runner shares its mount namespace with the process that started it."""
    assert mount_ns_outlives_us()


def test_a_private_mount_namespace_does_not():
    """``unshare -m`` (as ``ip netns exec`` does) gives the command a namespace of its own; the
    check is made in a child of that command, which it must not count."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux)")
    code = "from subc.dataplane.ebpf.broker_home import mount_ns_outlives_us as f; print(f())"
    r = subprocess.run(["unshare", "-m", sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
    # and shared again: a shell in that namespace that outlives its child
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"{sys.executable} -c '{code}'; true"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
