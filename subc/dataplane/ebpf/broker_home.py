"""Where a loaded eBPF broker lives: its pins, its state, keyed by network namespace and interface.

A broker is made of kernel objects (programs, maps, the XDP link) that must outlive the command
that loaded them and be found again by every later command of the broker (``update``, ``stats``,
``fanout``, ``unload``, a restarted ``serve``).  They are pinned on a BPF file system (bpffs) and
described by ``state.json`` in a run directory::

    <bpffs>/subc/net<netns inode>/<iface>/     pinned maps, programs and the XDP link
    <run dir>/net<netns inode>/<iface>/        state.json, maps.json, fanout.lock

The key is the network namespace's inode (``/proc/self/ns/net``) and the interface name, so two
brokers in two namespaces (two containers, each with an ``eth0``) never collide.  The state also
records the namespace's cookie (``SO_NETNS_COOKIE``, Linux 5.14: unique for the boot, never
reused), so an entry left by a namespace that is gone, whose inode a new namespace reuses, is
recognised as stale and cleared instead of blocking the new broker (:func:`stale_reason`).

Which bpffs.  Pins live as long as the bpffs instance holding them is mounted somewhere.  A process
started by ``ip netns exec``, like a process in a container, runs in a mount namespace of its own
with a fresh ``/sys`` where ``/sys/fs/bpf`` is not mounted; a bpffs that subc mounted there would
vanish with the command's mount namespace when it exits, and with the pins the kernel clears the
tail-call program arrays the data path jumps through (``prog_array_map_clear`` on the last user
reference, ``kernel/bpf/arraymap.c``): datagrams that take a tail call would be lost.  So
(:func:`bpffs_root`):

1. ``$SUBC_BPFFS``, when set, must be a bpffs mount point;
2. else ``/run/subc/bpffs`` when it is a bpffs (a mount the host shares with every ``ip netns
   exec`` command, which keeps the host's ``/run``), else ``/sys/fs/bpf`` when it is one;
3. else, when loading, subc mounts a bpffs on ``/sys/fs/bpf`` only if its mount namespace outlives
   it (another process that is not its child shares it: a container's, the host's); otherwise it
   refuses, naming the fix (docs/ebpf.md, "The broker in a container or a namespace").

The run directory is ``$SUBC_RUN_DIR``, else ``/run/subc`` (``ip netns exec`` keeps the host's
``/run``; a container has its own).
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ...errors import SubcError

SYS_BPFFS = Path("/sys/fs/bpf")
RUN_BPFFS = Path("/run/subc/bpffs")
DEFAULT_RUN_DIR = Path("/run/subc")
SO_NETNS_COOKIE = 71  # include/uapi/asm-generic/socket.h (Linux 5.14)

PRIVATE_MOUNT_NS = (
    "no BPF file system that outlives this command: neither {run} nor {sys} is a bpffs here, and this "
    "process's mount namespace is its own (as under `ip netns exec`, which gives every command a new one "
    "with a fresh /sys), so a bpffs mounted now would vanish when subc exits, and with its pins the "
    "tail-call program arrays the data path jumps through would be cleared. Mount one that the broker's "
    "commands share, once, outside the namespace: `mkdir -p {run} && mount -t bpf bpf {run}` on the host "
    "(every `ip netns exec` command sees the host's /run), or give a container a bpffs volume and set "
    "SUBC_BPFFS to its mount point; or run subc with `nsenter --net=...`, which keeps the host's mounts"
)


@dataclass(frozen=True)
class NetNs:
    """The calling process's network namespace: ``inode`` (of ``/proc/self/ns/net``, unique among
    live namespaces, reused after one is gone) and ``cookie`` (``SO_NETNS_COOKIE``: never reused
    during a boot; 0 when the kernel has none)."""

    inode: int
    cookie: int

    @property
    def key(self) -> str:
        return f"net{self.inode}"


def current_netns() -> NetNs:
    """:class:`NetNs` of the calling thread (a thread may have entered another namespace)."""
    inode = os.stat("/proc/thread-self/ns/net").st_ino
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            cookie = int.from_bytes(s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")
        except OSError:
            cookie = 0
    return NetNs(inode, cookie)


def _unescape(path: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as octal (\040 ...)
    return path.encode().decode("unicode_escape") if "\\" in path else path


def bpffs_mounts() -> list[Path]:
    """The mount points of BPF file systems in the calling process's mount namespace
    (``/proc/self/mountinfo``), in mount order."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "bpf":
                out.append(Path(_unescape(left.split(" ")[4])))
    return out


def is_bpffs(path: Path) -> bool:
    """Whether ``path`` is the mount point of a BPF file system here."""
    return Path(path) in bpffs_mounts()


def mount_ns_outlives_us() -> bool:
    """Whether another process that is not a descendant of this one shares this process's mount
    namespace (then a mount made now outlives this process: a container's namespace, the host's).
    Under ``ip netns exec`` the command is alone in a namespace made for it: False."""
    me = os.getpid()
    mine = os.readlink("/proc/self/ns/mnt")
    parents: dict[int, int] = {}
    shared: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            parents[pid] = int(stat[stat.rindex(")") + 2 :].split()[1])
            if os.readlink(f"/proc/{pid}/ns/mnt") == mine:
                shared.append(pid)
        except (OSError, ValueError, IndexError):
            continue  # gone, or not ours to read

    def descends_from_me(pid: int) -> bool:
        seen = set()
        while pid > 1 and pid not in seen:
            seen.add(pid)
            pid = parents.get(pid, 0)
            if pid == me:
                return True
        return False

    return any(not descends_from_me(pid) for pid in shared)


def bpffs_root(mount: bool) -> Path:
    """The BPF file system where brokers are pinned (module docstring, "Which bpffs").

    With ``mount`` (loading), mounts one on ``/sys/fs/bpf`` when none is found and the mount
    namespace outlives this process.  Raises SubcError when ``$SUBC_BPFFS`` is not a bpffs, when
    none is found and ``mount`` is false (nothing can be loaded then), when this process's mount
    namespace is its own (:data:`PRIVATE_MOUNT_NS`, with the fix), or when the mount fails.
    """
    env = os.environ.get("SUBC_BPFFS")
    if env:
        if not is_bpffs(Path(env)):
            raise SubcError(f"SUBC_BPFFS={env} is not the mount point of a BPF file system (mount -t bpf bpf {env})")
        return Path(env)
    for cand in (RUN_BPFFS, SYS_BPFFS):
        if is_bpffs(cand):
            return cand
    if not mount:
        raise SubcError(
            f"subc is not loaded where this process can reach it: no BPF file system is mounted on "
            f"{RUN_BPFFS} or {SYS_BPFFS} in this mount namespace (under `ip netns exec`, see docs/ebpf.md, "
            '"The broker in a container or a namespace")'
        )
    if not mount_ns_outlives_us():
        raise SubcError(PRIVATE_MOUNT_NS.format(run=RUN_BPFFS, sys=SYS_BPFFS))
    r = subprocess.run(["mount", "-t", "bpf", "bpf", str(SYS_BPFFS)], capture_output=True, text=True)
    if r.returncode:
        raise SubcError(
            f"cannot mount the BPF file system on {SYS_BPFFS}: {r.stderr.strip()} "
            "(a container needs CAP_SYS_ADMIN for that, or a bpffs volume named by SUBC_BPFFS)"
        )
    return SYS_BPFFS


def run_dir() -> Path:
    """The directory of the brokers' state: ``$SUBC_RUN_DIR``, else ``/run/subc``."""
    return Path(os.environ.get("SUBC_RUN_DIR") or DEFAULT_RUN_DIR)


@dataclass(frozen=True)
class BrokerHome:
    """The places of the broker on ``iface`` in network namespace ``netns``: ``pins`` (a
    directory on the bpffs ``bpffs``) and ``state_dir`` (``state.json``, ``maps.json``)."""

    iface: str
    netns: NetNs
    bpffs: Path
    run: Path

    @property
    def pins(self) -> Path:
        return self.bpffs / "subc" / self.netns.key / self.iface

    @property
    def state_dir(self) -> Path:
        return self.run / self.netns.key / self.iface

    @property
    def state_path(self) -> Path:
        return self.state_dir / "state.json"

    def exists(self) -> bool:
        """Whether anything of a broker is here (a state or pins)."""
        return self.state_path.exists() or self.pins.exists()


@contextmanager
def home_lock(home: BrokerHome) -> Iterator[None]:
    """Hold the exclusive lock of ``home`` (``flock`` on ``<run dir>/net<inode>/<iface>.lock``,
    waiting for a holder): loads and unloads of one broker never interleave, so a load
    never takes another's half-made pins for an interrupted load's."""
    d = home.run / home.netns.key
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"{home.iface}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def check_iface_name(iface: str) -> None:
    """Raise SubcError unless ``iface`` can be a Linux interface name (it becomes a path part)."""
    if not iface or len(iface) > 15 or "/" in iface or iface in (".", "..") or any(c.isspace() for c in iface):
        raise SubcError(f"'{iface}' is not an interface name")


def broker_home(iface: str, mount: bool = False) -> BrokerHome:
    """:class:`BrokerHome` of ``iface`` in the calling process's network namespace.  ``mount``:
    as :func:`bpffs_root` (True for the commands that load).  Raises SubcError as
    :func:`bpffs_root` and for a name that cannot be an interface's."""
    check_iface_name(iface)
    return BrokerHome(iface, current_netns(), bpffs_root(mount), run_dir())


def stale_reason(state: dict, home: BrokerHome, ifindex: int | None, link_ifindex: int | None) -> str | None:
    """Why the broker described by ``state`` (found at ``home``) can no longer be running, or None.

    ``ifindex``: the interface's index now (None when it does not exist); ``link_ifindex``: the
    device of its pinned XDP link (0 when the device is gone, None when there is no link pin).
    A state of another namespace whose inode this one reuses (cookies differ), an interface
    deleted or made anew since (index differs), or an XDP link whose device is gone is stale."""
    cookie = state.get("netns_cookie")
    if cookie and home.netns.cookie and cookie != home.netns.cookie:
        return (
            f"it was loaded in network namespace cookie {cookie}, which is gone "
            f"(namespace inode {home.netns.inode} is now another's)"
        )
    if ifindex is None:
        return f"interface {home.iface} no longer exists"
    if state.get("ifindex") is not None and state["ifindex"] != ifindex:
        return f"interface {home.iface} was made anew (index {state['ifindex']}, now {ifindex})"
    if link_ifindex == 0:
        return "its XDP link lost its device"
    return None
