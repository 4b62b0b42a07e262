"""The eBPF broker: load, update and unload a compiled rule set on an interface.

``load`` compiles ``subc_filter.bpf.c`` with bcc (capacities and fan-out as ``-D`` flags), fills
the maps from ``maps.json`` as generation 0, pins every map and program in the broker's home
(:mod:`.broker_home`: ``<bpffs>/subc/net<netns inode>/IF/``), attaches XDP to IF through a pinned
BPF link and the TC program to IF's clsact ingress hook (:mod:`.attach`), and checks every
delivery path through the pins.  The broker's own state (generation, capacities, endpoints,
program ids, the network namespace's cookie) is kept in ``<run dir>/net<netns inode>/IF/state.json``
so that ``update``, ``stats``, ``fanout`` and ``unload`` work from any later process of the same
network namespace, inside a container or ``ip netns exec`` as on the host (:mod:`.broker_state`:
the state and the pinned maps; :mod:`.broker_stats`: the counters, ``subc stats``).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...backends.ebpf import map_names as MN
from ...backends.ebpf import layout as L
from ...backends.ebpf.maps_doc import MapDoc, MapsDoc
from ...backends.ebpf.target import MAX_SEARCH_STEPS, steps_needed
from ...backends.ebpf.source import program_source, read_program
from ...errors import SubcError
from . import attach, install
from .bpf import Map, Program, compile_and_load, possible_cpus, present, require_root
from .bpf_objects import obj_get, prog_info
from .broker_home import broker_home, home_lock
from .broker_state import claim_home, close_maps, loaded_home, pinned_maps, write_state
from .fanout import (
    DEFAULT_RATIO,
    SetCache,
    fan_plan,
    install_fanout,
    install_missing_sets,
    installed_sets,
)
from .links import XDP_ATTACHED_DRV, check_links, xdp_attach_mode
from .subscribers import Subscribers, load_subscribers, resolve_endpoints

GRACE_S = 0.2  # wait after switching generations before deleting the old one


def read_maps_doc(out_dir: str | Path) -> tuple[MapsDoc, str]:
    """(maps.json document, C source: one translation unit, :func:`program_source`) of an
    ``subc compile --target ebpf`` output directory.  Raises SubcError for a directory that is not
    one (or one an older subc wrote, without the program's headers)."""
    out = Path(out_dir)
    try:
        text = (out / "maps.json").read_text()
    except OSError as e:
        raise SubcError(f"{out}: not an eBPF output directory of subc compile --target ebpf ({e})") from None
    try:
        doc = MapsDoc.from_json(json.loads(text))
    except ValueError as e:
        raise SubcError(f"{out}/maps.json: {e}") from None
    try:
        src = program_source(read_program(out), doc.program)
    except (OSError, ValueError, KeyError) as e:
        raise SubcError(f"{out}: not an eBPF output directory of subc compile --target ebpf ({e})") from None
    return doc, src


def _map_struct(m: MapDoc, max_endpoints: int) -> tuple[int, int]:
    value = L.sub_struct(max_endpoints).size if m.role == "subscribers" else m.value.size
    return m.key.size, value


def cflags(caps: dict[str, int], max_endpoints: int, journal_pages: int = 0) -> list[str]:
    """bcc compiler flags: map capacities, endpoints per subscriber and the CPUs (the XDP-to-TC
    ring and the copy builder's scratch have a region per CPU); with ``journal_pages`` (a power
    of 2), the journal feed and its ring buffer of that many 4 KiB pages (subc_journal.h)."""
    journal = ["-DSUBC_JOURNAL=1", f"-DSUBC_JOURNAL_PAGES={journal_pages}"] if journal_pages else []
    return (
        [f"-DSUBC_CAP_{n.upper()}={c}" for n, c in sorted(caps.items())]
        + [f"-DSUBC_MAX_ENDPOINTS={max_endpoints}", f"-DSUBC_NCPU={possible_cpus()}"]
        + journal
    )


def open_maps(doc: MapsDoc, fds: dict[str, int], max_endpoints: int) -> dict[str, Map]:
    """:class:`Map` handles for ``doc``'s maps from their file descriptors."""
    out = {}
    for m in doc.maps:
        k, v = _map_struct(m, max_endpoints)
        out[m.name] = Map(fds[m.name], k, v, percpu=m.percpu, name=m.name)
    return out


@dataclass
class LoadedFilter:
    """A compiled and loaded (not attached) filter with its maps, for tests and benchmarks."""

    program: Program
    doc: MapsDoc
    maps: dict[str, Map]
    caps: dict[str, int]
    max_endpoints: int
    subs: Subscribers | None
    gen: int = 0
    regions_used: dict[str, int] = field(default_factory=dict)  # slots of the live generation per region array
    journal_pages: int = 0  # the journal feed's ring buffer (4 KiB pages; 0: no journal feed)

    @classmethod
    def build(
        cls,
        doc: MapsDoc,
        src: str,
        subs: Subscribers | None = None,
        factor: float = 2.0,
        min_caps: dict[str, int] | None = None,
        max_endpoints: int | None = None,
        egress: bool = False,
        journal_pages: int = 0,
    ) -> "LoadedFilter":
        """Compile and load ``src`` sized for ``doc`` (with ``egress``, also the fan-out's devmap
        program; with ``journal_pages``, the journal feed: :func:`cflags`), then install ``doc``
        as generation 0."""
        caps = install.capacities(doc, factor, subs)
        for n, c in (min_caps or {}).items():
            caps[n] = max(caps.get(n, 0), c)
        eps = max_endpoints or max(doc.max_endpoints, install.needed_endpoints(subs))
        prog = compile_and_load(src, cflags(caps, eps, journal_pages), egress_fn="subc_egress" if egress else None)
        maps = open_maps(doc, {m.name: prog.map_fd(m.name) for m in doc.maps}, eps)
        lf = cls(prog, doc, maps, caps, eps, subs, journal_pages=journal_pages)
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

    def update(self, doc: MapsDoc, grace_s: float = 0.0) -> None:
        """Install ``doc`` as the next generation, switch to it, then delete the old one (SubcError
        when it does not fit: :func:`check_search_steps`, :func:`update_maps`)."""
        check_search_steps(self.doc, doc)
        update_maps(self.maps, doc, self.gen, self.caps, self.subs, self.regions_used, grace_s)
        self.gen ^= 1
        self.doc = doc


def check_search_steps(old_doc: MapsDoc, doc: MapsDoc, where: str = "") -> None:
    """Raise SubcError when a range stage of ``doc`` has states with more runs than the loaded
    program of ``old_doc`` searches (its ``search_steps``; 32 for programs without it)."""
    for new, old in zip(doc.stages, old_doc.stages):
        steps = old.search_steps if old.search_steps is not None else MAX_SEARCH_STEPS
        if new.kind == "range" and steps_needed(new.max_runs or 0) > steps:
            raise SubcError(
                f"{where}stage {new.field} has up to {new.max_runs} runs per state and the loaded program "
                f"searches at most {2**steps} ({steps} steps): load the rule set again (subc unload, subc load)"
            )


def update_maps(
    maps: dict[str, Map],
    doc: MapsDoc,
    gen: int,
    caps: dict[str, int],
    subs: Subscribers | None,
    regions_used: dict[str, int],
    grace_s: float,
) -> GenerationResult:
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


def ifindex_of(iface: str) -> int:
    """The index of ``iface`` in this network namespace (SubcError when there is none)."""
    return attach.ifindex_of(iface)


def load(
    out_dir: str,
    iface: str,
    subscribers: str | None = None,
    xdp_mode: str = "auto",
    capacity_factor: float = 2.0,
    fix_links: bool = True,
    fanout: bool = True,
    fan_ratio: int = DEFAULT_RATIO,
    journal_pages: int = 0,
) -> dict:
    """Load the compiled rule set in ``out_dir`` on ``iface`` (see the module docstring).

    With ``journal_pages`` (a power of 2; MoldUDP64 rule sets with a subscribers file), the
    data plane also passes every copy it sends to user space through a BPF ring buffer of that
    many 4 KiB pages, pinned with the maps (``subc_jnl``), for the journal feed
    (:mod:`subc.recovery.journal_feed`); the state's ``journal`` says so.

    The subscribers' interfaces are checked first (:func:`~.links.check_links`; with
    ``fix_links``, GRO is turned on at veth peers that would drop XDP-redirected copies); the
    findings are in the state's ``links``.  With ``fanout`` and XDP attached in driver mode, the
    copies are built by devmap egress programs (:mod:`.fanout`, ``fan_ratio`` its ALL-broadcast
    threshold), else in TC; the state's ``fanout`` says which.  After attaching, every delivery
    path is checked through the pins (:func:`~.attach.check_data_path`).  Returns the new state
    (as written to ``state.json``; ``cleared`` lists the stale brokers removed on the way).
    Raises SubcError when not root, when subc is already loaded on ``iface`` in this network
    namespace, when no BPF file system can outlive the command (:mod:`.broker_home`), for a
    missing subscriber interface, for a data path found incomplete, and for every failure on
    the way (the interface is left as it was).
    """
    require_root("subc load")
    doc, src = read_maps_doc(out_dir)
    subs = load_subscribers(subscribers) if subscribers else None
    if journal_pages:
        check_journal(doc, subs, journal_pages)
    elif subs is not None and subs.soup:
        raise SubcError(f"{subs.path}: SoupBinTCP subscribers (soup = ...) need --journal")
    home = broker_home(iface, mount=True)
    with home_lock(home):  # one load, update or unload of this home at a time
        cleared = claim_home(home)
        problems = []
        if subs is not None:
            problems = check_links([e.iface for e in subs.endpoints], iface, fix=fix_links)
            if any(p.severity == "error" for p in problems):
                raise SubcError(f"{subs.path}: " + "; ".join(p.message for p in problems if p.severity == "error"))
            resolve_endpoints(subs)
        ifindex = ifindex_of(iface)
        lf = LoadedFilter.build(
            doc, src, subs, capacity_factor, egress=subs is not None and fanout, journal_pages=journal_pages
        )
        install_journal_only(lf, subs)
        attach.pin_and_attach(lf.program, {**lf.maps, **journal_maps(lf)}, home, ifindex, xdp_mode)
        try:
            fan = {"enabled": False, "reason": "no subscribers file" if subs is None else "--no-fanout"}
            fan_indexes: list[int] = []
            if subs is not None and fanout:
                if xdp_attach_mode(iface) != XDP_ATTACHED_DRV:
                    fan["reason"] = "XDP is not attached in driver mode (devmap programs need it)"
                else:
                    assert lf.program.egress is not None  # loaded with egress= (subscribers and fanout)
                    fan = install_fanout(lf.maps, lf.program.egress.fd, subs, fan_ratio)
                    fan_indexes = sorted(fan_plan(subs)) if fan["enabled"] else []
            attach.check_data_path(lf.program, lf.maps, home, ifindex, fan_indexes)
            info = {"xdp": prog_info(lf.program.xdp.fd), "tc": prog_info(lf.program.tc.fd)}
            state = {
                "iface": iface,
                "ifindex": ifindex,
                "netns_inode": home.netns.inode,
                "netns_cookie": home.netns.cookie,
                "pins": str(home.pins),
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
                "maps": {
                    **{
                        m.name: {"key": m.key.size, "value": _map_struct(m, lf.max_endpoints)[1], "type": m.type}
                        for m in doc.maps
                    },
                    **journal_state_maps(journal_pages),
                },
                "journal": {"pages": journal_pages, "bytes": journal_pages * 4096} if journal_pages else None,
                "loaded_at": time.time(),
                "links": [p.as_dict() for p in problems],
                "fanout": fan,
            }
            write_state(home, state, doc)
        except BaseException:
            attach.remove(home)
            raise
        finally:
            lf.close()
        record_instructions(out_dir, info)
        return {**state, "cleared": cleared}


def check_journal(doc: MapsDoc, subs: Subscribers | None, pages: int) -> None:
    """Raise SubcError unless a journal feed of ``pages`` pages can serve ``doc`` and ``subs``:
    a MoldUDP64 rule set (a journal holds numbered messages), a subscribers file (``subc serve``
    passes an empty one: its endpoints come and go), a power of 2."""
    if pages & (pages - 1):
        raise SubcError(f"--journal-pages {pages}: the journal's ring buffer takes a power of 2 of pages")
    if not doc.moldudp64:
        raise SubcError("--journal: the spec is not MoldUDP64 (a journal holds sequence-numbered messages)")
    if subs is None:
        raise SubcError("--journal needs --subscribers (the journal is per subscriber)")


def install_journal_only(lf: LoadedFilter, subs: Subscribers | None) -> None:
    """Write the journal-only recipients (``subc_jnl_only``: subscribers with a SoupBinTCP login
    and no endpoint) of a filter loaded with the journal feed."""
    if not lf.journal_pages or subs is None:
        return
    mask = sum(1 << sid for sid in subs.journal_only)
    m = Map(lf.program.map_fd(MN.JNL_ONLY), 4, L.SUBSET.size, name=MN.JNL_ONLY)
    m.update(L.U32.pack(v=0), L.SUBSET.pack(subs=L.mask_words(mask, L.SUB_WORDS), local=0, pad=0))


def journal_state_maps(journal_pages: int) -> dict[str, dict]:
    """The journal feed's maps as ``state.json`` lists them (for :func:`~.broker_state.pinned_maps`;
    the ring buffer is opened by :mod:`.ringbuf`): none without the feed."""
    if not journal_pages:
        return {}
    return {
        MN.JNL_LOST: {"key": 4, "value": 8, "type": "percpu_array"},
        MN.JNL_ONLY: {"key": 4, "value": L.SUBSET.size, "type": "array"},
        MN.FENCE: {"key": 4, "value": 8, "type": "array"},
        MN.POS: {"key": 4, "value": L.POS_BYTES, "type": "percpu_array"},
        MN.SCHED: {"key": 4, "value": L.SCHED_BYTES, "type": "array"},
    }


def journal_maps(lf: LoadedFilter) -> dict[str, Map]:
    """The journal feed's maps of ``lf`` to pin (none without the feed): the ring buffer, the
    per-recipient count of messages sent but not journaled, the journal-only recipients, and a
    cluster's fence (deliver until), feed position and root switches scheduled at positions
    (``bpf/subc_cluster.h``)."""
    if not lf.journal_pages:
        return {}
    return {
        MN.JNL: Map(lf.program.map_fd(MN.JNL), 0, 0, name=MN.JNL),
        MN.JNL_LOST: Map(lf.program.map_fd(MN.JNL_LOST), 4, 8, percpu=True, name=MN.JNL_LOST),
        MN.JNL_ONLY: Map(lf.program.map_fd(MN.JNL_ONLY), 4, L.SUBSET.size, name=MN.JNL_ONLY),
        MN.FENCE: Map(lf.program.map_fd(MN.FENCE), 4, 8, name=MN.FENCE),
        MN.POS: Map(lf.program.map_fd(MN.POS), 4, L.POS_BYTES, percpu=True, name=MN.POS),
        MN.SCHED: Map(lf.program.map_fd(MN.SCHED), 4, L.SCHED_BYTES, name=MN.SCHED),
    }


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
    report["instructions"] = {
        **{k: {f: v[f] for f in ("xlated_insns", "jited_bytes", "verified_insns")} for k, v in info.items()},
        "kernel": os.uname().release,
        "measured_by": "subc load",
    }
    tmp = path.with_name(f".report.json.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    return True


def _leaf_labels(doc: MapsDoc) -> dict[str, str]:
    return {str(e.state): e.label for e in doc.leaves}


def unload(iface: str) -> None:
    """Detach XDP and TC from ``iface`` and remove the pins and state (whatever of it exists, a
    stale broker's included) of the broker of this network namespace; brokers of other
    namespaces are not touched."""
    require_root("subc unload")
    home = broker_home(iface)
    with home_lock(home):
        if not home.exists():
            raise SubcError(f"subc is not loaded on {iface} in this network namespace")
        attach.remove(home)


def update(out_dir: str, iface: str, grace_s: float = GRACE_S) -> GenerationResult:
    """Install the rule set of ``out_dir`` on a loaded ``iface`` under traffic (generation switch).

    The new program text must equal the loaded one's data path (same spec and field order);
    otherwise SubcError asks for a reload.
    """
    require_root("subc update")
    home, state = loaded_home(iface)
    doc, _ = read_maps_doc(out_dir)
    old_doc = MapsDoc.read(home.state_dir / "maps.json")
    new_fields = [s.field for s in doc.stages]
    old_fields = [s.field for s in old_doc.stages]
    if (
        [s.kind for s in doc.stages] != [s.kind for s in old_doc.stages]
        or new_fields != old_fields
        or (doc.ports != old_doc.ports)
    ):
        raise SubcError(
            f"{out_dir}: the new rule set tests fields {new_fields} and the loaded program "
            f"{old_fields}: the data path differs, so it cannot be swapped in place; "
            f"compile with --field-order {','.join(old_fields) or '...'} "
            "if the fields are the same, or unload and load"
        )
    check_search_steps(old_doc, doc, f"{out_dir}: ")
    subs = None
    if state["subscribers"]:
        subs = load_subscribers(state["subscribers"])
        resolve_endpoints(subs)
    maps = pinned_maps(home, state)
    try:
        res = update_maps(maps, doc, state["generation"], state["capacities"], subs, state["regions_used"], grace_s)
    finally:
        close_maps(maps)
    state["generation"] = res.gen
    state["out_dir"] = str(Path(out_dir).resolve())
    record_instructions(out_dir, state["programs"])  # the same programs now run the new rule set
    state["leaves"] = _leaf_labels(doc)
    write_state(home, state, doc)
    return res


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
    home, state = loaded_home(iface)
    if not state.get("fanout", {}).get("enabled"):
        raise SubcError(f"the XDP fan-out is off on {iface}: {state.get('fanout', {}).get('reason', 'unknown')}")
    lock = open(home.state_dir / "fanout.lock", "w")  # one writer of the set maps per broker
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise SubcError(f"another subc fanout runs on {iface}") from None
    maps = pinned_maps(home, state)
    try:
        egress_fd = obj_get(home.pins / "prog_egress")
    except SubcError:
        close_maps(maps)
        lock.close()
        raise
    try:
        cfg = L.FAN_CFG.unpack(present(maps[MN.FAN_CFG].lookup(L.U32.pack(v=0))))
        ifindexes = [
            L.ENDPOINT.unpack(present(maps[MN.EPS].lookup(L.U32.pack(v=e))))["ifindex"] for e in range(cfg["n_eps"])
        ]
        cache = SetCache(installed_sets(maps), idle_s=idle_s)  # read once: this loop is the only writer
        passes = total = evicted = 0
        while True:
            res = install_missing_sets(maps, egress_fd, ifindexes, cache)
            passes += 1
            total += res["installed"]
            evicted += res["evicted"]
            if once or (stop is not None and stop()) or not home.state_path.exists():
                return {**res, "passes": passes, "installed": total, "evicted": evicted}
            time.sleep(interval_s)
    finally:
        os.close(egress_fd)
        close_maps(maps)
        lock.close()
