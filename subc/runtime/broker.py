"""The eBPF broker: load, update, inspect and unload a compiled rule set on an interface.

``load`` compiles ``subc_filter.bpf.c`` with bcc (capacities and fan-out as ``-D`` flags), fills
the maps from ``maps.json`` as generation 0, pins every map and both programs under
``/sys/fs/bpf/subc/IF/``, then attaches XDP to IF (netlink, through bcc) and the TC program to
IF's clsact ingress hook (pyroute2).  The broker's own state (generation, capacities, endpoints,
program ids) is kept in ``/run/subc/IF/state.json`` so that ``update``, ``stats`` and ``unload``
work from any later process.  Interfaces are those of the calling process's network namespace.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..compiler.targets import ebpf_layout as L
from ..compiler.targets.ebpf import MAX_SEARCH_STEPS, steps_needed
from ..errors import SubcError
from . import install
from .fanout import DEFAULT_RATIO, SetCache, install_fanout, install_missing_sets, installed_sets, read_set_hits
from .links import XDP_ATTACHED_DRV, check_links, xdp_attach_mode
from .bpf import BPFFS, Map, Program, compile_and_load, obj_get, pin_fd, possible_cpus, prog_info, require_root
from .subscribers import Subscribers, load_subscribers, resolve_endpoints

RUN_DIR = Path("/run/subc")
GRACE_S = 0.2  # wait after switching generations before deleting the old one
XDP_FLAGS = {"auto": 0, "generic": 2, "native": 4}
XDP_FLAGS_UPDATE_IF_NOEXIST = 1


def read_maps_doc(out_dir: str | Path) -> tuple[dict, str]:
    """(maps.json document, C source) of an ``subc compile --target ebpf`` output directory."""
    out = Path(out_dir)
    try:
        doc = json.loads((out / "maps.json").read_text())
        src = (out / doc["program"]).read_text()
    except (OSError, ValueError, KeyError) as e:
        raise SubcError(f"{out}: not an eBPF output directory of subc compile --target ebpf ({e})") from None
    if doc.get("format") != "subc-ebpf-maps":
        raise SubcError(f"{out}/maps.json: not a subc eBPF maps document")
    return doc, src


def _map_struct(m: dict, max_endpoints: int) -> tuple[int, int]:
    key = m["key"]["size"]
    value = L.sub_struct(max_endpoints).size if m["role"] == "subscribers" else m["value"]["size"]
    return key, value


def cflags(caps: dict[str, int], max_endpoints: int) -> list[str]:
    """bcc compiler flags: map capacities, endpoints per subscriber and the CPUs (the XDP-to-TC
    ring and the copy builder's scratch have a region per CPU)."""
    return [f"-DSUBC_CAP_{n.upper()}={c}" for n, c in sorted(caps.items())] + [
        f"-DSUBC_MAX_ENDPOINTS={max_endpoints}", f"-DSUBC_NCPU={possible_cpus()}"]


def open_maps(doc: dict, fds: dict[str, int], max_endpoints: int) -> dict[str, Map]:
    """:class:`Map` handles for ``doc``'s maps from their file descriptors."""
    out = {}
    for m in doc["maps"]:
        k, v = _map_struct(m, max_endpoints)
        out[m["name"]] = Map(fds[m["name"]], k, v, percpu=m["type"].startswith("percpu"), name=m["name"])
    return out


@dataclass
class LoadedFilter:
    """A compiled and loaded (not attached) filter with its maps, for tests and benchmarks."""

    program: Program
    doc: dict
    maps: dict[str, Map]
    caps: dict[str, int]
    max_endpoints: int
    subs: Subscribers | None
    gen: int = 0
    regions_used: dict[str, int] = field(default_factory=dict)  # slots of the live generation per region array

    @classmethod
    def build(cls, doc: dict, src: str, subs: Subscribers | None = None, factor: float = 2.0,
              min_caps: dict[str, int] | None = None, max_endpoints: int | None = None,
              egress: bool = False) -> "LoadedFilter":
        """Compile and load ``src`` sized for ``doc`` (with ``egress``, also the fan-out's devmap
        program), then install ``doc`` as generation 0."""
        caps = install.capacities(doc, factor, subs)
        for n, c in (min_caps or {}).items():
            caps[n] = max(caps.get(n, 0), c)
        eps = max_endpoints or max(doc["max_endpoints"], install.needed_endpoints(subs))
        prog = compile_and_load(src, cflags(caps, eps), egress_fn="subc_egress" if egress else None)
        maps = open_maps(doc, {m["name"]: prog.map_fd(m["name"]) for m in doc["maps"]}, eps)
        lf = cls(prog, doc, maps, caps, eps, subs)
        install.install_subscribers(maps, subs, eps)
        plan = install.plan_generation(doc, 0, subs, caps)
        install.install_generation(plan, maps)
        install.switch_root(plan, maps)
        lf.regions_used.update(plan.regions)
        return lf

    def close(self) -> None:
        """Release the program's and maps' descriptors (a pinned or attached filter stays)."""
        self.program.close()

    def __enter__(self) -> "LoadedFilter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, doc: dict, grace_s: float = 0.0) -> None:
        """Install ``doc`` as the next generation, switch to it, then delete the old one (SubcError
        when it does not fit: :func:`check_search_steps`, :func:`update_maps`)."""
        check_search_steps(self.doc, doc)
        update_maps(self.maps, doc, self.gen, self.caps, self.subs, self.regions_used, grace_s)
        self.gen ^= 1
        self.doc = doc


def check_search_steps(old_doc: dict, doc: dict, where: str = "") -> None:
    """Raise SubcError when a range stage of ``doc`` has states with more runs than the loaded
    program of ``old_doc`` searches (its ``search_steps``; 32 for programs without it)."""
    for new, old in zip(doc["stages"], old_doc["stages"]):
        steps = old.get("search_steps", MAX_SEARCH_STEPS)
        if new["kind"] == "range" and steps_needed(new.get("max_runs", 0)) > steps:
            raise SubcError(
                f"{where}stage {new['field']} has up to {new['max_runs']} runs per state and the loaded program "
                f"searches at most {2 ** steps} ({steps} steps): load the rule set again (subc unload, subc load)")


def update_maps(maps: dict[str, Map], doc: dict, gen: int, caps: dict[str, int],
                subs: Subscribers | None, regions_used: dict[str, int], grace_s: float) -> GenerationResult:
    """Replace live generation ``gen`` by ``doc`` as generation ``gen ^ 1`` (atomic for packets).

    ``regions_used`` (slots of the live generation per array with generation regions:
    :attr:`GenerationPlan.regions`) is updated in place.
    Raises SubcError when the new rule set does not fit next to the live one.
    """
    new = gen ^ 1
    live = install.live_counts(gen, maps, regions_used)
    plan = install.plan_generation(doc, new, subs, caps)
    install.check_fits(plan, maps, caps, live)
    install.install_generation(plan, maps)
    install.switch_root(plan, maps)
    time.sleep(grace_s)
    deleted = install.retire_generation(gen, maps)
    regions_used.clear()
    regions_used.update(plan.regions)
    return GenerationResult(new, sum(len(v) for v in plan.writes.values()), deleted)


@dataclass
class GenerationResult:
    gen: int
    written: int
    deleted: int


# -- the broker on an interface --------------------------------------------------------------


def pin_dir(iface: str) -> Path:
    return BPFFS / "subc" / iface


def state_path(iface: str) -> Path:
    return RUN_DIR / iface / "state.json"


def ensure_bpffs() -> None:
    """Mount the BPF file system on /sys/fs/bpf when it is not mounted (SubcError if impossible)."""
    with open("/proc/mounts") as f:
        if any(line.split()[1] == str(BPFFS) and line.split()[2] == "bpf" for line in f if len(line.split()) > 2):
            return
    r = subprocess.run(["mount", "-t", "bpf", "bpf", str(BPFFS)], capture_output=True, text=True)
    if r.returncode:
        raise SubcError(f"cannot mount the BPF file system on {BPFFS}: {r.stderr.strip()}")


def ifindex_of(iface: str) -> int:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=iface)
    if not idx:
        raise SubcError(f"no interface '{iface}' in this network namespace")
    return idx[0]


def _attach_tc(ifindex: int, fd: int, name: str) -> None:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute() as ipr:
        try:
            ipr.tc("add", "clsact", ifindex)
        except NetlinkError as e:
            if e.code != 17:  # EEXIST: a clsact qdisc is already there
                raise SubcError(f"cannot add the clsact qdisc: {e}") from None
        try:
            ipr.tc("add-filter", "bpf", ifindex, ":1", fd=fd, name=name, parent="ffff:fff2", classid=1,
                   direct_action=True)
        except NetlinkError as e:
            raise SubcError(f"cannot attach the TC ingress program: {e}") from None


def _detach_tc(ifindex: int) -> None:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute() as ipr:
        try:
            ipr.tc("del", "clsact", ifindex)
        except NetlinkError:
            pass


def load(out_dir: str, iface: str, subscribers: str | None = None, xdp_mode: str = "auto",
         capacity_factor: float = 2.0, fix_links: bool = True, fanout: bool = True,
         fan_ratio: int = DEFAULT_RATIO) -> dict:
    """Load the compiled rule set in ``out_dir`` on ``iface`` (see the module docstring).

    The subscribers' interfaces are checked first (:func:`~.links.check_links`; with
    ``fix_links``, GRO is turned on at veth peers that would drop XDP-redirected copies); the
    findings are in the state's ``links``.  With ``fanout`` and XDP attached in driver mode, the
    copies are built by devmap egress programs (:mod:`.fanout`, ``fan_ratio`` its ALL-broadcast
    threshold), else in TC; the state's ``fanout`` says which.  Returns the new state (as written
    to ``state.json``).
    Raises SubcError when not root, when subc is already loaded on ``iface``, for a missing
    subscriber interface, and for every failure on the way (the interface is left as it was).
    """
    require_root("subc load")
    doc, src = read_maps_doc(out_dir)
    if state_path(iface).exists() or pin_dir(iface).exists():
        raise SubcError(f"subc is already loaded on {iface}: use subc update, or subc unload first")
    subs = load_subscribers(subscribers) if subscribers else None
    problems = []
    if subs is not None:
        problems = check_links([e.iface for e in subs.endpoints], iface, fix=fix_links)
        if any(p.severity == "error" for p in problems):
            raise SubcError(f"{subs.path}: " + "; ".join(p.message for p in problems if p.severity == "error"))
        resolve_endpoints(subs)
    ifindex = ifindex_of(iface)
    ensure_bpffs()
    lf = LoadedFilter.build(doc, src, subs, capacity_factor, egress=subs is not None and fanout)
    pins = pin_and_attach(lf, iface, ifindex, xdp_mode)
    try:
        fan = {"enabled": False, "reason": "no subscribers file" if subs is None else "--no-fanout"}
        if subs is not None and fanout:
            if xdp_attach_mode(iface) != XDP_ATTACHED_DRV:
                fan["reason"] = "XDP is not attached in driver mode (devmap programs need it)"
            else:
                fan = install_fanout(lf.maps, lf.program.egress.fd, subs, fan_ratio)
    except BaseException:
        detach(iface, ifindex)
        shutil.rmtree(pins, ignore_errors=True)
        raise
    info = {"xdp": prog_info(lf.program.xdp.fd), "tc": prog_info(lf.program.tc.fd)}
    record_instructions(out_dir, info)
    state = {
        "iface": iface,
        "ifindex": ifindex,
        "out_dir": str(Path(out_dir).resolve()),
        "generation": 0,
        "capacities": lf.caps,
        "max_endpoints": lf.max_endpoints,
        "regions_used": lf.regions_used,
        "xdp_mode": xdp_mode,
        "programs": info,
        "subscribers": subscribers and str(Path(subscribers).resolve()),
        "subscriber_names": {str(k): v for k, v in (subs.names if subs else {}).items()},
        "leaves": _leaf_labels(doc),
        "maps": {m["name"]: {"key": m["key"]["size"], "value": _map_struct(m, lf.max_endpoints)[1], "type": m["type"]}
                 for m in doc["maps"]},
        "loaded_at": time.time(),
        "links": [p.as_dict() for p in problems],
        "fanout": fan,
    }
    write_state(iface, state, doc)
    return state


def pin_and_attach(lf: LoadedFilter, iface: str, ifindex: int, xdp_mode: str = "auto") -> Path:
    """Pin ``lf``'s maps and programs under :func:`pin_dir` and attach its XDP and TC programs to
    ``iface``; returns the pin directory.  Raises SubcError (the pins removed, nothing attached)
    when the pins exist or a program cannot be attached."""
    from .bpf import import_bcc

    bcc = import_bcc()
    pins = pin_dir(iface)
    pins.mkdir(parents=True, exist_ok=False)
    try:
        for name, m in lf.maps.items():
            m.pin(pins / name)
        pin_fd(lf.program.xdp.fd, pins / "prog_xdp")
        pin_fd(lf.program.tc.fd, pins / "prog_tc")
        for i, fn in enumerate(lf.program.tails):
            pin_fd(fn.fd, pins / f"prog_tail{i}")
        if lf.program.egress is not None:
            pin_fd(lf.program.egress.fd, pins / "prog_egress")  # for subc fanout's device maps
        try:
            bcc.BPF.attach_xdp(iface, lf.program.xdp, XDP_FLAGS[xdp_mode] | XDP_FLAGS_UPDATE_IF_NOEXIST)
        except Exception as e:
            raise SubcError(f"cannot attach XDP to {iface}: {e} (another XDP program attached? xdp mode {xdp_mode})") from None
        try:
            _attach_tc(ifindex, lf.program.tc.fd, "subc_tc")
        except SubcError:
            bcc.BPF.remove_xdp(iface, 0)
            raise
    except BaseException:
        shutil.rmtree(pins, ignore_errors=True)
        raise
    return pins


def detach(iface: str, ifindex: int | None = None) -> None:
    """Detach subc's XDP and TC programs from ``iface`` (whatever is attached)."""
    from .bpf import import_bcc

    if ifindex is None:
        try:
            ifindex = ifindex_of(iface)
        except SubcError:
            return
    try:
        import_bcc().BPF.remove_xdp(iface, 0)
    except Exception:  # noqa: BLE001 - nothing attached
        pass
    _detach_tc(ifindex)


def record_instructions(out_dir: str | Path, info: dict) -> bool:
    """Write the loaded programs' instruction counts into ``out_dir/report.json``.

    ``info``: {'xdp': prog_info, 'tc': prog_info}.  The report is replaced atomically (a
    temporary file, then rename).  Returns False, changing nothing, when there is no report or
    it cannot be written (a read-only output directory).
    """
    path = Path(out_dir) / "report.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    report["instructions"] = {**{k: {f: v[f] for f in ("xlated_insns", "jited_bytes", "verified_insns")}
                                 for k, v in info.items()},
                              "kernel": os.uname().release, "measured_by": "subc load"}
    tmp = path.with_name(f".report.json.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    return True


def _leaf_labels(doc: dict) -> dict[str, str]:
    out = {}
    for e in install._maps_by_name(doc)["subc_leaf"]["entries"]:
        if e["action"] == "fwd":
            out[str(e["state"])] = "fwd(" + ", ".join(map(str, e["subscribers"])) + ")"
        else:
            out[str(e["state"])] = e["action"] + ("(default)" if e["state"] == 0 else "")
    return out


def write_state(iface: str, state: dict, doc: dict) -> None:
    """Write ``state.json`` and ``maps.json`` of a loaded broker (each replaced atomically)."""
    d = state_path(iface).parent
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, d / "state.json")
    (d / "maps.json.tmp").write_text(json.dumps(doc))
    os.replace(d / "maps.json.tmp", d / "maps.json")


def read_state(iface: str) -> dict:
    """The broker state of ``iface``; SubcError when subc is not loaded there."""
    try:
        return json.loads(state_path(iface).read_text())
    except OSError:
        raise SubcError(f"subc is not loaded on {iface} (no {state_path(iface)})") from None


def pinned_maps(state: dict) -> dict[str, Map]:
    """Handles on the pinned maps of a loaded broker, each owning its descriptor: release them
    with :func:`close_maps`.  SubcError when a pin is missing (none is left open then)."""
    pins = pin_dir(state["iface"])
    out: dict[str, Map] = {}
    try:
        for name, m in state["maps"].items():
            out[name] = Map(obj_get(pins / name), m["key"], m["value"], percpu=m["type"].startswith("percpu"),
                            name=name, owned=True)
    except SubcError:
        close_maps(out)
        raise
    return out


def close_maps(maps: dict[str, Map]) -> None:
    """Close the descriptors of the maps of :func:`pinned_maps`."""
    for m in maps.values():
        m.close()


def unload(iface: str) -> None:
    """Detach XDP and TC from ``iface`` and remove the pins and state (whatever of it exists)."""
    require_root("subc unload")
    found = state_path(iface).exists() or pin_dir(iface).exists()
    if not found:
        raise SubcError(f"subc is not loaded on {iface}")
    detach(iface)
    shutil.rmtree(pin_dir(iface), ignore_errors=True)
    shutil.rmtree(state_path(iface).parent, ignore_errors=True)


def update(out_dir: str, iface: str, grace_s: float = GRACE_S) -> GenerationResult:
    """Install the rule set of ``out_dir`` on a loaded ``iface`` under traffic (generation switch).

    The new program text must equal the loaded one's data path (same spec and field order);
    otherwise SubcError asks for a reload.
    """
    require_root("subc update")
    state = read_state(iface)
    doc, _ = read_maps_doc(out_dir)
    old_doc = json.loads((state_path(iface).parent / "maps.json").read_text())
    if [(s["field"], s["kind"]) for s in doc["stages"]] != [(s["field"], s["kind"]) for s in old_doc["stages"]] \
            or doc["ports"] != old_doc["ports"]:
        raise SubcError(
            f"{out_dir}: the new rule set tests fields {[s['field'] for s in doc['stages']]} and the loaded program "
            f"{[s['field'] for s in old_doc['stages']]}: the data path differs, so it cannot be swapped in place; "
            f"compile with --field-order {','.join(s['field'] for s in old_doc['stages']) or '...'} "
            "if the fields are the same, or unload and load"
        )
    check_search_steps(old_doc, doc, f"{out_dir}: ")
    subs = None
    if state["subscribers"]:
        subs = load_subscribers(state["subscribers"])
        resolve_endpoints(subs)
    maps = pinned_maps(state)
    try:
        res = update_maps(maps, doc, state["generation"], state["capacities"], subs, state["regions_used"], grace_s)
    finally:
        close_maps(maps)
    state["generation"] = res.gen
    state["out_dir"] = str(Path(out_dir).resolve())
    record_instructions(out_dir, state["programs"])  # the same programs now run the new rule set
    state["leaves"] = _leaf_labels(doc)
    write_state(iface, state, doc)
    return res


def stats(iface: str) -> dict:
    """Counters of a loaded broker: global, per subscriber and per leaf of the live generation, and
    (``fan_sets``) the recipient-set device maps in place with the datagrams sent over each."""
    state = read_state(iface)
    maps = pinned_maps(state)
    try:
        glob = {}
        for i, name in enumerate(L.STATS):
            vals = maps["subc_stats"].lookup(L.U32.pack(v=i)) or []
            glob[name] = sum(int.from_bytes(v[:8], "little") for v in vals)
        subs = {}
        sub_map, seq = maps["subc_sub_cnt"], maps["subc_seq"]
        for sid in range(L.RECIPIENTS):
            vals = [L.SUB_COUNTER.unpack(v) for v in sub_map.lookup(L.U32.pack(v=sid)) or []]
            c = {k: sum(v[k] for v in vals) for k in ("datagrams", "messages", "bytes")}
            if c["datagrams"]:
                name = "local" if sid == L.LOCAL else state["subscriber_names"].get(str(sid))
                nxt = L.U64.unpack(seq.lookup(L.U32.pack(v=sid)))["v"]
                subs["local" if sid == L.LOCAL else str(sid)] = {**c, "next_seq": nxt, "name": name}
        gen = state["generation"]
        doc = json.loads((state_path(iface).parent / "maps.json").read_text())
        leaves = {str(st): {"action": state["leaves"].get(str(st), "?"), **c}
                  for st, c in install.leaf_counters(maps, doc, gen, state["capacities"]).items()}
        fan_sets = None
        if "subc_fan_hits" in maps:  # the recipient-set device maps in place and the datagrams sent over them
            used = installed_sets(maps)
            hits = read_set_hits(maps, used)
            fan_sets = {"sets": len(used), "capacity": L.FAN_SETS, "datagrams": sum(hits.values()),
                        "by_set": {f"{key:#x}": hits[i] for i, key in sorted(used.items())}}
    finally:
        close_maps(maps)
    out = {"iface": iface, "generation": gen, "programs": state["programs"], "stats": glob,
           "subscribers": subs, "leaves": dict(sorted(leaves.items(), key=lambda kv: int(kv[0])))}
    if state.get("mode") == "serve":
        out["mode"] = "serve"
        if state.get("state_dir"):  # the live subscriptions, from the daemon's store
            from .serve.store import Store

            store = Store(state["state_dir"])
            try:
                names = {sid: f"{ip}:{port}" for (ip, port), sid in store.endpoints().items()}
                live = store.all()
            finally:
                store.close()
            out["subscriptions"] = len(live)
            per_ep: dict[str, int] = {}
            for s in live:
                per_ep[f"{s.ip}:{s.port}"] = per_ep.get(f"{s.ip}:{s.port}", 0) + 1
            for sid, c in subs.items():
                c["name"] = names.get(int(sid)) if sid.isdigit() else c["name"]
                c["subscriptions"] = per_ep.get(c["name"] or "", 0)
    if fan_sets is not None:
        out["fan_sets"] = fan_sets
    return out


def fanout_sets(iface: str, interval_s: float = 0.005, once: bool = False, stop=None, idle_s: float = 1.0) -> dict:
    """The fan-out's control loop (``subc fanout``): every ``interval_s`` s, make the exact
    recipient-set device maps (FAN_SET, :func:`~.fanout.install_missing_sets`) for the sets that
    XDP noted since, reusing the maps of sets idle for ``idle_s`` s once all are in use
    (:class:`~.fanout.SetCache`), until the broker is unloaded, ``stop()`` is true, or after one
    pass with ``once``.  Returns the last pass's summary with ``passes``, ``installed`` and
    ``evicted`` (in all).
    Raises SubcError when not root, when subc is not loaded on ``iface``, when its XDP fan-out
    is off (the state's ``fanout`` says why), or when another ``subc fanout`` runs on ``iface``
    (the set maps have one writer, which keeps the sets in use in memory)."""
    require_root("subc fanout")
    state = read_state(iface)
    if not state.get("fanout", {}).get("enabled"):
        raise SubcError(f"the XDP fan-out is off on {iface}: {state.get('fanout', {}).get('reason', 'unknown')}")
    lock = open(state_path(iface).parent / "fanout.lock", "w")  # one writer of the set maps per broker
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise SubcError(f"another subc fanout runs on {iface}") from None
    maps = pinned_maps(state)
    try:
        egress_fd = obj_get(pin_dir(iface) / "prog_egress")
    except SubcError:
        close_maps(maps)
        lock.close()
        raise
    try:
        cfg = L.FAN_CFG.unpack(maps["subc_fan_cfg"].lookup(L.U32.pack(v=0)))
        ifindexes = [L.ENDPOINT.unpack(maps["subc_eps"].lookup(L.U32.pack(v=e)))["ifindex"] for e in range(cfg["n_eps"])]
        cache = SetCache(installed_sets(maps), idle_s=idle_s)  # read once: this loop is the only writer
        passes = total = evicted = 0
        while True:
            res = install_missing_sets(maps, egress_fd, ifindexes, cache)
            passes += 1
            total += res["installed"]
            evicted += res["evicted"]
            if once or (stop is not None and stop()) or not state_path(iface).exists():
                return {**res, "passes": passes, "installed": total, "evicted": evicted}
            time.sleep(interval_s)
    finally:
        os.close(egress_fd)
        close_maps(maps)
        lock.close()
