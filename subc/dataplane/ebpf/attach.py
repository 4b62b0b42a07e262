"""Attaching a loaded filter to an interface, and checking that every delivery path is in place.

:func:`pin_and_attach` pins the maps and programs in the broker's home
(:mod:`.broker_home`), attaches the XDP program through a pinned BPF link (so that it stays
attached after the loader exits, nothing else replaces it, and a link whose device is gone tells
that the broker is dead) and the TC program to the interface's clsact ingress hook (pyroute2).
:func:`check_data_path` then verifies, as a later process would find them, every object the data
path relies on: a tail call to an empty program-array slot, a missing TC program or fan-out
device map would otherwise drop a class of datagrams silently (counted only as ``errors``).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ...backends.ebpf import map_names as MN
from ...backends.ebpf import layout as L
from ...errors import SubcError
from .bpf import TAIL_CALLS, Map, Program, pin_fd, single
from .bpf_objects import link_prog_id, link_xdp_ifindex, obj_get, obj_id, xdp_link_create
from .broker_home import BrokerHome

XDP_FLAGS = {"auto": 0, "generic": 2, "native": 4}
LINK_PIN = "link_xdp"
TC_INGRESS = 0xFFFFFFF2  # the clsact qdisc's ingress hook ("ffff:fff2")
TCA_BPF_ID = 11


def ifindex_of(iface: str) -> int:
    """The index of ``iface`` in this network namespace; SubcError when it does not exist."""
    idx = ifindex_or_none(iface)
    if idx is None:
        raise SubcError(f"no interface '{iface}' in this network namespace")
    return idx


def ifindex_or_none(iface: str) -> int | None:
    """The index of ``iface`` in this network namespace, or None."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=iface)
    return idx[0] if idx else None


def attach_tc(ifindex: int, fd: int, name: str) -> None:
    """Attach the SCHED_CLS program ``fd`` (direct action) to the clsact ingress hook of
    ``ifindex``, adding the qdisc when missing.  Raises SubcError with netlink's reason."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute() as ipr:
        try:
            ipr.tc("add", "clsact", ifindex)
        except NetlinkError as e:
            if e.code != 17:  # EEXIST: a clsact qdisc is already there
                raise SubcError(f"cannot add the clsact qdisc: {e}") from None
        try:
            ipr.tc(
                "add-filter", "bpf", ifindex, ":1", fd=fd, name=name, parent="ffff:fff2", classid=1, direct_action=True
            )
        except NetlinkError as e:
            raise SubcError(f"cannot attach the TC ingress program: {e}") from None


def detach_tc(ifindex: int) -> None:
    """Remove the clsact qdisc of ``ifindex`` with its filters (nothing when there is none)."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute() as ipr:
        try:
            ipr.tc("del", "clsact", ifindex)
        except NetlinkError:
            pass


def tc_ingress_prog_ids(ifindex: int) -> list[int]:
    """The ids of the BPF programs attached to the clsact ingress hook of ``ifindex``."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    out = []
    with IPRoute() as ipr:
        try:
            filters = ipr.get_filters(index=ifindex, parent=TC_INGRESS)
        except NetlinkError:
            return []
        for f in filters:
            opts = f.get_attr("TCA_OPTIONS")
            for name, nla in opts["attrs"] if opts is not None and f.get_attr("TCA_KIND") == "bpf" else []:
                # pyroute2 does not decode TCA_BPF_ID (11, a u32; include/uapi/linux/pkt_cls.h): read it raw
                if name == "TCA_BPF_ID" or (name == "UNKNOWN" and nla["header"]["type"] == TCA_BPF_ID):
                    raw = (
                        nla
                        if isinstance(nla, int)
                        else int.from_bytes(nla.data[nla.offset + 4 : nla.offset + 8], sys.byteorder)
                    )
                    out.append(raw)
    return out


def xdp_prog_id(iface: str) -> int:
    """The id of the XDP program attached to ``iface`` (netlink IFLA_XDP_PROG_ID), 0 when none."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        msgs = ipr.link("get", ifname=iface)
    xdp = msgs[0].get_attr("IFLA_XDP") if msgs else None
    return int(xdp.get_attr("IFLA_XDP_PROG_ID") or 0) if xdp is not None else 0


def _program_pins(program: Program) -> dict[str, int]:
    out = {"prog_xdp": program.xdp.fd, "prog_tc": program.tc.fd}
    for i, fn in enumerate(program.tails):
        out[f"prog_tail{i}"] = fn.fd
    if program.egress is not None:
        out["prog_egress"] = program.egress.fd  # for subc fanout's device maps
    return out


def pin_and_attach(
    program: Program, maps: dict[str, Map], home: BrokerHome, ifindex: int, xdp_mode: str = "auto"
) -> None:
    """Pin ``maps`` and ``program``'s programs in ``home.pins``, attach its XDP program to
    ``home.iface`` through a BPF link pinned there (:data:`LINK_PIN`) and its TC program to the
    clsact ingress hook.  Raises SubcError (the pins removed, nothing attached) when the pins
    exist, a pin or an attachment fails (another XDP program attached, a mode the device lacks)."""
    pins = home.pins
    pins.parent.mkdir(parents=True, exist_ok=True)
    try:
        pins.mkdir(exist_ok=False)
    except FileExistsError:
        raise SubcError(f"{pins} exists: another broker is loaded on {home.iface} here") from None
    link = -1
    try:
        for name, m in maps.items():
            m.pin(pins / name)
        for name, fd in _program_pins(program).items():
            pin_fd(fd, pins / name)
        try:
            link = xdp_link_create(program.xdp.fd, ifindex, XDP_FLAGS[xdp_mode])
        except SubcError as e:
            raise SubcError(f"cannot attach XDP to {home.iface} (xdp mode {xdp_mode}): {e}") from None
        pin_fd(link, pins / LINK_PIN)
        attach_tc(ifindex, program.tc.fd, "subc_tc")
    except BaseException:
        shutil.rmtree(pins, ignore_errors=True)  # the link's pin goes: closing it detaches XDP
        raise
    finally:
        if link >= 0:
            os.close(link)


def link_device(home: BrokerHome) -> int | None:
    """The interface index of the broker's pinned XDP link (0 once its device is gone), or None
    when there is no link pin (not loaded, or loaded by a subc that attached XDP by netlink)."""
    try:
        fd = obj_get(home.pins / LINK_PIN)
    except SubcError:
        return None
    try:
        return link_xdp_ifindex(fd)
    finally:
        os.close(fd)


def detach(home: BrokerHome) -> None:
    """Detach the broker's XDP program (its link's pin removed; by netlink when it has no link)
    and the clsact qdisc of ``home.iface``, whatever is attached; the other pins stay."""
    from .bpf import import_bcc

    had_link = (home.pins / LINK_PIN).exists()
    if had_link:
        os.unlink(home.pins / LINK_PIN)  # the last reference: the kernel detaches the program
    ifindex = ifindex_or_none(home.iface)
    if ifindex is None:
        return
    if not had_link:
        try:
            import_bcc().BPF.remove_xdp(home.iface, 0)
        except Exception:  # noqa: BLE001 - nothing attached
            pass
    detach_tc(ifindex)


def remove(home: BrokerHome) -> None:
    """Detach the broker and remove its pins and state directory (whatever of them exists)."""
    detach(home)
    shutil.rmtree(home.pins, ignore_errors=True)
    shutil.rmtree(home.state_dir, ignore_errors=True)


def clear_dead(bpffs: Path, run: Path) -> list[str]:
    """Remove the pins and state of every broker on ``bpffs`` whose XDP link lost its device
    (its interface, or its whole network namespace, is gone: nothing of it can run again).
    Returns ``netns key/iface`` of each one removed."""
    out: list[str] = []
    root = bpffs / "subc"
    if not root.is_dir():
        return out
    for ns_dir in sorted(root.glob("net*")):
        for pins in sorted(p for p in ns_dir.iterdir() if p.is_dir()):
            try:
                fd = obj_get(pins / LINK_PIN)
            except SubcError:
                continue  # no link: being loaded now, or loaded without one; left alone
            try:
                dead = link_xdp_ifindex(fd) == 0
            finally:
                os.close(fd)
            if dead:
                shutil.rmtree(pins, ignore_errors=True)
                shutil.rmtree(run / ns_dir.name / pins.name, ignore_errors=True)
                out.append(f"{ns_dir.name}/{pins.name}")
        try:
            ns_dir.rmdir()  # only when empty
        except OSError:
            pass
    return out


def check_data_path(
    program: Program, maps: dict[str, Map], home: BrokerHome, ifindex: int, fan_indexes: list[int]
) -> None:
    """Verify, through the pins as any later process finds them, every object the data path
    relies on: each map and program pinned in ``home.pins`` (the same objects as loaded), each
    tail-call slot of :data:`~.bpf.TAIL_CALLS` holding its program, the XDP link on ``ifindex``
    running the XDP program and the interface reporting it, the TC program on the clsact
    ingress hook, and (``fan_indexes``: the ``subc_fan`` indexes the fan-out installed) each
    fan-out device map with the fan-out switched on.  Raises SubcError naming every missing one."""
    missing = []
    loaded_ids = {name: obj_id(m.fd) for name, m in maps.items()}
    loaded_ids.update({name: obj_id(fd) for name, fd in _program_pins(program).items()})
    pinned: dict[str, Map] = {}
    try:
        for name, want in loaded_ids.items():
            try:
                fd = obj_get(home.pins / name)
            except SubcError:
                missing.append(f"pin {home.pins / name}")
                continue
            if obj_id(fd) != want:
                missing.append(f"pin {home.pins / name} (another object)")
            if name in maps:
                m = maps[name]
                pinned[name] = Map(fd, m.key_size, m.value_size, m.percpu, name, owned=True)
            else:
                os.close(fd)
        for (fn_name, _, array, index), fn in zip(TAIL_CALLS, program.tails):
            got = single(pinned[array].lookup(L.U32.pack(v=index))) if array in pinned else None
            if got is None or L.U32.unpack(got)["v"] != obj_id(fn.fd):
                missing.append(f"tail call {array}[{index}] -> {fn_name}")
        try:
            link = obj_get(home.pins / LINK_PIN)
        except SubcError:
            missing.append(f"XDP link pin {home.pins / LINK_PIN}")
        else:
            try:
                if link_xdp_ifindex(link) != ifindex or link_prog_id(link) != loaded_ids["prog_xdp"]:
                    missing.append(f"XDP link on {home.iface}")
            finally:
                os.close(link)
        if xdp_prog_id(home.iface) != loaded_ids["prog_xdp"]:
            missing.append(f"XDP program on {home.iface}")
        if loaded_ids["prog_tc"] not in tc_ingress_prog_ids(ifindex):
            missing.append(f"TC program on the clsact ingress hook of {home.iface}")
        if fan_indexes:
            for index in fan_indexes:
                if pinned[MN.FAN].lookup(L.U32.pack(v=index)) is None:
                    missing.append(f"fan-out device map subc_fan[{index}]")
            cfg = single(pinned[MN.FAN_CFG].lookup(L.U32.pack(v=0)))
            if cfg is None or not L.FAN_CFG.unpack(cfg)["n_eps"]:
                missing.append("fan-out configuration subc_fan_cfg")
    finally:
        for m in pinned.values():
            m.close()
    if missing:
        raise SubcError(
            f"the data path on {home.iface} is incomplete after attaching, so datagrams would be "
            f"lost: missing {', '.join(missing)}"
        )
