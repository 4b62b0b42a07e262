"""Checks of the interfaces the eBPF broker sends copies by, before ``subc load`` attaches it.

What would make copies disappear without an error anywhere (docs/ebpf.md, "Veth and checksums"):

* a **missing** interface (an error: nothing can be loaded);
* an interface that is **down**, or a veth whose **peer is down** (veth drops what it cannot
  deliver: ``veth_xmit``);
* an **MTU smaller than the feed interface's**: a copy is never longer than the datagram it comes
  from, so a full-size datagram of the feed fits every interface whose MTU is at least the feed's;
  below that the kernel drops the copies that do not fit (``is_skb_forwardable``, and XDP
  redirects check the MTU too), at the interface or at its veth peer;
* a **veth whose peer has neither an XDP program nor GRO on**: XDP-redirected frames
  (``bpf_redirect`` from XDP, the broker's path for a datagram with one recipient) reach a veth
  peer only through its NAPI, which runs only when the peer has an XDP program or GRO
  (``veth_xdp_xmit``: ``rcv_priv->napi`` is NULL otherwise and every frame is dropped, counted only
  as a TX drop of the sending veth).  Linux 5.13+ enables the peer's NAPI with GRO
  (``veth_set_features``).

The veth peer is found by its ifindex (``IFLA_LINK``) in the namespace ``IFLA_LINK_NETNSID``
names: the named namespaces (``/run/netns``) and those of running processes (``/proc/PID/ns/net``)
are asked for their id (``RTM_GETNSID``) until one matches.  Links are read with pyroute2
(rtnetlink) and features with its ethtool module (``ETHTOOL_GFEATURES``/``ETHTOOL_SFEATURES``,
the calls of ``ethtool -k/-K``), inside the peer's namespace (``setns(2)``).  With ``fix``, GRO
(``rx-gro``) is turned on at a peer that has neither, when its namespace was found.
"""

from __future__ import annotations

import ctypes as ct
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator

from ...errors import SubcError

CLONE_NEWNET = 0x40000000
IFF_UP = 0x1
#: ``IFLA_XDP_ATTACHED`` values other than 0 mean a program is attached (driver, generic, offload, several).
XDP_ATTACHED_NONE = 0


@dataclass
class LinkProblem:
    """One finding about a subscriber interface.

    ``iface``: the interface copies leave by; ``code``: ``missing`` (an error), ``down``,
    ``peer-down``, ``mtu``, ``peer-mtu``, ``veth-peer-drops-xdp`` (neither XDP nor GRO at the
    peer), ``peer-unreachable`` (the peer's namespace or device was not found, so it could not be
    checked); ``severity``: ``error`` or ``warning``; ``message``: what happens and what to do;
    ``fixed``: True when ``fix`` repaired it (then the message says what was done).
    """

    iface: str
    code: str
    severity: str
    message: str
    fixed: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Link:
    name: str
    index: int
    up: bool
    mtu: int
    kind: str | None
    peer_index: int | None
    peer_nsid: int | None
    xdp: bool


def _libc():
    return ct.CDLL(None, use_errno=True)


@contextmanager
def in_netns(path: str | Path | None) -> Iterator[None]:
    """Run the body in the network namespace of the file ``path`` (``/run/netns/X``,
    ``/proc/PID/ns/net``; None: stay), then come back.  setns(2) moves the calling thread only.
    Raises SubcError when the namespace cannot be entered."""
    if path is None:
        yield
        return
    libc = _libc()
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(str(path), os.O_RDONLY)
    except OSError as e:
        os.close(own)
        raise SubcError(f"cannot open the network namespace {path}: {e.strerror}") from None
    try:
        if libc.setns(target, CLONE_NEWNET):
            raise SubcError(f"cannot enter the network namespace {path}: {os.strerror(ct.get_errno())}")
        try:
            yield
        finally:
            if libc.setns(own, CLONE_NEWNET):
                raise SubcError(f"cannot return from the network namespace {path}: {os.strerror(ct.get_errno())}")
    finally:
        os.close(target)
        os.close(own)


def _read_link(ipr, name: str | None = None, index: int | None = None) -> _Link | None:
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        msgs = ipr.link("get", ifname=name) if name is not None else ipr.link("get", index=index)
    except NetlinkError:
        return None
    if not msgs:
        return None
    m = msgs[0]
    info = m.get_attr("IFLA_LINKINFO")
    xdp = m.get_attr("IFLA_XDP")
    attached = (xdp.get_attr("IFLA_XDP_ATTACHED") or XDP_ATTACHED_NONE) if xdp is not None else XDP_ATTACHED_NONE
    prog_id = xdp.get_attr("IFLA_XDP_PROG_ID") if xdp is not None else None
    return _Link(
        m.get_attr("IFLA_IFNAME"),
        m["index"],
        bool(m["flags"] & IFF_UP),
        m.get_attr("IFLA_MTU") or 0,
        info.get_attr("IFLA_INFO_KIND") if info is not None else None,
        m.get_attr("IFLA_LINK"),
        m.get_attr("IFLA_LINK_NETNSID"),
        bool(attached) or bool(prog_id),
    )


def _namespace_files() -> Iterator[str]:
    """Network namespace files: the named ones, then those of running processes (each namespace once)."""
    seen = set()
    cands = sorted(str(p) for p in Path("/run/netns").glob("*")) if Path("/run/netns").is_dir() else []
    cands += [f"/proc/{p}/ns/net" for p in sorted(os.listdir("/proc")) if p.isdigit()]
    for c in cands:
        try:
            st = os.stat(c)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            yield c


def find_netns(ipr, nsid: int) -> str | None:
    """The file of the network namespace that has id ``nsid`` in the namespace of ``ipr`` (an
    IPRoute), or None when no named namespace nor running process has it."""
    for path in _namespace_files():
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            got = ipr.get_netnsid(fd=fd)
        except Exception:  # noqa: BLE001 - a namespace that cannot be asked is not the one
            got = None
        finally:
            os.close(fd)
        if got and got.get("nsid") == nsid:
            return path
    return None


def _gro(name: str) -> bool | None:
    """Whether GRO (``rx-gro``) is on at ``name`` in the current namespace (None: unknown)."""
    from pyroute2.ethtool import Ethtool

    e = Ethtool()
    try:
        f = e.get_features(name).features.get("rx-gro")
        return None if f is None else bool(f.enable)
    finally:
        e.close()


def _set_gro(name: str) -> None:
    from pyroute2.ethtool import Ethtool

    e = Ethtool()
    try:
        feats = e.get_features(name)
        feats.features["rx-gro"].enable = True
        e.set_features(name, feats)
    finally:
        e.close()


def check_links(ifaces: Iterable[str], feed_iface: str | None = None, fix: bool = False) -> list[LinkProblem]:
    """Check the interfaces ``ifaces`` (names in the current network namespace) that copies leave
    by, against the feed interface ``feed_iface`` (its MTU; None: no MTU check), as the module
    docstring says; with ``fix``, turn GRO on at veth peers that have neither XDP nor GRO.

    Returns the problems found, in interface order (an empty list: nothing to report).  Needs
    CAP_NET_ADMIN to read other namespaces and to fix; raises SubcError only when netlink itself
    fails.
    """
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    problems: list[LinkProblem] = []
    try:
        with IPRoute() as ipr:
            feed = _read_link(ipr, feed_iface) if feed_iface else None
            feed_mtu = feed.mtu if feed else None
            for name in dict.fromkeys(ifaces):
                link = _read_link(ipr, name)
                if link is None:
                    problems.append(
                        LinkProblem(
                            name,
                            "missing",
                            "error",
                            f"no interface '{name}' in this network namespace: its copies cannot be sent",
                        )
                    )
                    continue
                if not link.up:
                    problems.append(
                        LinkProblem(
                            name,
                            "down",
                            "warning",
                            f"interface {name} is down: its copies are dropped until it is up (ip link set {name} up)",
                        )
                    )
                if feed_mtu and link.mtu < feed_mtu:
                    problems.append(
                        LinkProblem(
                            name,
                            "mtu",
                            "warning",
                            f"interface {name} has MTU {link.mtu}, smaller than {feed_iface}'s "
                            f"{feed_mtu}: copies longer than {link.mtu} bytes are dropped "
                            f"(ip link set {name} mtu {feed_mtu})",
                        )
                    )
                if link.kind == "veth":
                    problems += _check_veth_peer(ipr, link, feed_iface, feed_mtu, fix)
    except NetlinkError as e:
        raise SubcError(f"cannot read the interfaces with netlink: {e}") from None
    return problems


def _check_veth_peer(ipr, link: _Link, feed_iface: str | None, feed_mtu: int | None, fix: bool) -> list[LinkProblem]:
    name = link.name
    if link.peer_index is None:
        return [
            LinkProblem(
                name,
                "peer-unreachable",
                "warning",
                f"veth {name}: the kernel does not say which device is its peer, so it was not checked",
            )
        ]
    ns = None
    where = "this namespace"
    if link.peer_nsid is not None and link.peer_nsid >= 0:
        ns = find_netns(ipr, link.peer_nsid)
        if ns is None:
            return [
                LinkProblem(
                    name,
                    "peer-unreachable",
                    "warning",
                    f"veth {name}: its peer (ifindex {link.peer_index}) is in a network namespace "
                    f"(id {link.peer_nsid}) that no named namespace or process holds, so it was not "
                    "checked: make sure the peer has an XDP program or GRO on (ethtool -K PEER gro on)",
                )
            ]
        where = f"namespace {ns}"
    from pyroute2 import IPRoute

    out: list[LinkProblem] = []
    with in_netns(ns):
        with IPRoute() as pr:
            peer = _read_link(pr, index=link.peer_index)
        if peer is None:
            return [
                LinkProblem(
                    name,
                    "peer-unreachable",
                    "warning",
                    f"veth {name}: no peer device with ifindex {link.peer_index} in {where}",
                )
            ]
        label = f"its peer {peer.name} ({where})"
        if not peer.up:
            out.append(
                LinkProblem(
                    name,
                    "peer-down",
                    "warning",
                    f"veth {name}: {label} is down: every copy sent by {name} is dropped (ip link set {peer.name} up)",
                )
            )
        if feed_mtu and peer.mtu < feed_mtu:
            out.append(
                LinkProblem(
                    name,
                    "peer-mtu",
                    "warning",
                    f"veth {name}: {label} has MTU {peer.mtu}, smaller than {feed_iface}'s {feed_mtu}: "
                    f"copies longer than {peer.mtu} bytes are dropped",
                )
            )
        gro = _gro(peer.name)
        if not peer.xdp and gro is False:
            msg = (
                f"veth {name}: {label} has neither an XDP program nor GRO on, so it drops every frame "
                f"redirected from XDP (the broker's path for datagrams with one recipient)"
            )
            fixed = False
            if fix:
                try:
                    _set_gro(peer.name)
                    fixed = _gro(peer.name) is True
                except Exception as e:  # noqa: BLE001 - reported, not fatal
                    msg += f"; turning GRO on failed: {e}"
            if fixed:
                msg += f"; turned GRO on at {peer.name} (ethtool -K {peer.name} gro on)"
            elif not fix:
                msg += f": turn GRO on there (ethtool -K {peer.name} gro on), or load with --fix-links"
            out.append(LinkProblem(name, "veth-peer-drops-xdp", "warning", msg, fixed))
    return out


#: ``IFLA_XDP_ATTACHED`` values (include/uapi/linux/if_link.h).
XDP_ATTACHED_DRV, XDP_ATTACHED_SKB, XDP_ATTACHED_HW, XDP_ATTACHED_MULTI = 1, 2, 3, 4


def xdp_attach_mode(iface: str) -> int | str:
    """How XDP is attached to ``iface`` (in this network namespace): an ``XDP_ATTACHED_*`` value,
    0 when nothing is attached (a name pyroute2 decodes that is not known here: that name).
    Raises SubcError when the interface does not exist."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        msgs = ipr.link("get", ifname=iface)
        if not msgs:
            raise SubcError(f"no interface {iface}")
        xdp = msgs[0].get_attr("IFLA_XDP")
        value = xdp.get_attr("IFLA_XDP_ATTACHED") if xdp is not None else None
        # pyroute2 decodes the value by name (as iproute2 prints it)
        names = {
            "xdp": XDP_ATTACHED_DRV,
            "xdpgeneric": XDP_ATTACHED_SKB,
            "xdpoffload": XDP_ATTACHED_HW,
            "xdpmulti": XDP_ATTACHED_MULTI,
        }
        return names.get(value, value) if isinstance(value, str) else int(value or XDP_ATTACHED_NONE)
