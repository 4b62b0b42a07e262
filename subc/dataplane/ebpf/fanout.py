"""XDP fan-out: the device maps through which XDP broadcasts a datagram to its recipients' devices.

A datagram with recipient endpoints leaves XDP by one ``bpf_redirect_map(.., BPF_F_BROADCAST)``
over a ``BPF_MAP_TYPE_DEVMAP`` whose entries carry a devmap (egress) program, ``subc_egress``: the
kernel clones the frame once per entry (the last entry takes the frame itself) and runs the
program on each clone before transmitting it, and the program builds the copy (the recipient's
messages, its sequence number, its addresses: docs/ebpf.md "Delivery semantics").  The kernel runs
one program for all the frames a CPU queues to one device before a flush, so a clone cannot tell
its entry: the k-th clone of a datagram on an interface serves that interface's k-th recipient
(or endpoint).  Endpoints on one interface form a *group*.  The device maps are the inner maps
of ``subc_fan`` (an array of maps):

* ``FAN_LIST`` maps, per group and recipient count n (1..min(endpoints in the group, FAN_SLOTS)):
  n entries on the group's interface, at index ``group * FAN_SLOTS + n - 1``.  A datagram whose
  recipients are all in one group is cloned exactly once per recipient endpoint.
* the ``FAN_ALL`` map, when the broker has at most FAN_SLOTS endpoints: one entry per endpoint, on
  its interface, at index ``FAN_SLOTS * FAN_SLOTS``.  A datagram whose recipients span interfaces
  is cloned once per endpoint, the clones of non-recipients dropped in egress; XDP takes that way
  when the endpoints are at most ``ratio`` times the recipient endpoints, else TC builds the
  datagram's copies (bpf_clone_redirect).

Why the default ratio is 1 (the ALL map only when every endpoint is a recipient, so that egress
never drops a clone).  The kernel sends a device's queued frames in bulks of 16 without a flush
while a NAPI poll runs, and flushes at its end; but when the devmap program drops every frame of
a bulk, ``bq_xmit_all`` (``kernel/bpf/devmap.c``) skips ``ndo_xdp_xmit`` and with it the flush.
Frames of earlier bulks of that poll then wait on the device (a veth peer's ring, a NIC's transmit
ring before its doorbell) until the next flush with a frame in it: under load, a burst that ends
with non-recipient clones strands copies until more traffic or a heartbeat (measured: copies of
a benchmark run that reached their subscribers during the next run).  A ratio above 1 trades that
latency risk for throughput when recipients span interfaces.

* ``FAN_SET`` maps, made while the broker runs by :func:`install_missing_sets` (``subc fanout``),
  for the recipient sets that span interfaces: one entry per recipient endpoint, on its interface,
  at an index from ``SET_BASE`` on, found by the set (bit e for endpoint e) in ``subc_fan_sets``.
  A datagram whose set has no map yet is noted in ``subc_fan_miss`` and goes the ALL or TC way;
  once the map exists, its datagrams are cloned exactly once per recipient endpoint (never
  dropped in egress, so no flush is lost), as FAN_LIST does within one interface.  Making every
  set in advance would take a map per subset of the endpoints; a feed's datagrams use few.
  When all ``FAN_SETS`` indexes are taken, a set XDP has not used for ``idle_s`` (its count in
  ``subc_fan_hits`` unchanged) gives its index to a missed set (:class:`SetCache`).  Its key
  leaves ``subc_fan_sets`` first, then its ``subc_fan`` entry is deleted, which returns only
  after an RCU grace period (``maybe_wait_bpf_programs``, kernel/bpf/syscall.c): no XDP program
  that found the old set's index still runs when the index gets the new set's map.

``subc_fan_dev`` maps an interface to its group and ``subc_fan_geps`` lists each group's
endpoints.  Devmap programs need driver-mode XDP (the clones' XDP metadata, where the datagram's
ring slot is named, is not kept in generic mode): :func:`install_fanout` is called only then, and
``subc_fan_cfg.n_eps == 0`` (the default) keeps the fan-out off.
"""

from __future__ import annotations

import ctypes as ct
import os
import time
from dataclasses import dataclass, field

from ...backends.ebpf import map_names as MN
from ...backends.ebpf import layout as L
from ...errors import SubcError
from .bpf import Map, import_bcc, per_cpu, single
from .subscribers import Subscribers

BPF_MAP_TYPE_DEVMAP = 14
#: Index of the FAN_ALL map in ``subc_fan``.
ALL_INDEX = L.FAN_SLOTS * L.FAN_SLOTS
#: First index of the FAN_SET maps in ``subc_fan`` (``FAN_SETS`` of them).
SET_BASE = ALL_INDEX + 1
#: Default largest endpoints-per-recipient ratio for an ALL broadcast: 1, only when every endpoint
#: is a recipient (see the module docstring: a bulk of dropped clones loses the device's flush).
DEFAULT_RATIO = 1


def endpoint_groups(subs: Subscribers) -> list[int]:
    """The group of each endpoint (index order of ``subs.endpoints``): endpoints on one interface
    (ifindex) share a group, numbered by first appearance."""
    groups: dict[int, int] = {}
    return [groups.setdefault(ep.ifindex, len(groups)) for ep in subs.endpoints]


def group_members(subs: Subscribers) -> dict[int, list[int]]:
    """Group -> its endpoints' indexes, in index order (the groups of :func:`endpoint_groups`)."""
    members: dict[int, list[int]] = {}
    for e, g in enumerate(endpoint_groups(subs)):
        members.setdefault(g, []).append(e)
    return members


def _devmap_value(ifindex: int, prog_fd: int) -> bytes:
    # struct bpf_devmap_val (include/uapi/linux/bpf.h): __u32 ifindex; union { int fd; __u32 id; } bpf_prog
    return ifindex.to_bytes(4, "little") + prog_fd.to_bytes(4, "little", signed=True)


def _create_devmap(name: str, entries: int) -> int:
    lib = import_bcc().libbcc.lib
    fn = lib.bcc_create_map
    fn.argtypes = [ct.c_int, ct.c_char_p, ct.c_int, ct.c_int, ct.c_int, ct.c_int]
    fn.restype = ct.c_int
    # exactly as many entries as the map uses: a broadcast walks every entry of the map
    fd = fn(BPF_MAP_TYPE_DEVMAP, name.encode(), 4, 8, entries, 0)
    if fd < 0:
        raise SubcError(f"cannot create the device map {name}: {os.strerror(ct.get_errno())}")
    return fd


def _put_devmap(maps: dict[str, Map], index: int, ifindexes: list[int], egress_fd: int, name: str) -> None:
    """Create a device map whose entry i sends on ``ifindexes[i]`` through the devmap program
    ``egress_fd`` and put it at ``index`` of ``subc_fan``."""
    fd = _create_devmap(name, len(ifindexes))
    try:
        inner = Map(fd, 4, 8, name=name)
        for i, ifindex in enumerate(ifindexes):
            inner.update(L.U32.pack(v=i), _devmap_value(ifindex, egress_fd))
        maps[MN.FAN].update(L.U32.pack(v=index), L.U32.pack(v=fd))
    finally:
        os.close(fd)


def fan_plan(subs: Subscribers) -> dict[int, list[int]]:
    """The inner device maps: ``subc_fan`` index -> the ifindex of each entry, in entry order."""
    eps = subs.endpoints
    plan: dict[int, list[int]] = {}
    for g, members in group_members(subs).items():
        if g >= L.FAN_SLOTS:
            break
        ifindex = eps[members[0]].ifindex
        for n in range(1, min(len(members), L.FAN_SLOTS) + 1):
            plan[g * L.FAN_SLOTS + n - 1] = [ifindex] * n
    if len(eps) <= L.FAN_SLOTS:
        plan[ALL_INDEX] = [ep.ifindex for ep in eps]
    return plan


def install_fanout(maps: dict[str, Map], egress_fd: int, subs: Subscribers, ratio: int = DEFAULT_RATIO) -> dict:
    """Create the device maps of :func:`fan_plan` with the devmap program ``egress_fd`` on every
    entry, put them in ``subc_fan``, write the groups (``subc_fan_dev``, ``subc_fan_geps``) and
    switch the fan-out on (``subc_fan_cfg``).

    Returns a summary for the broker state.  Raises SubcError when a map cannot be created or
    written (for example a kernel without devmap programs).
    """
    eps = subs.endpoints
    if not eps:
        return {"enabled": False, "reason": "no endpoints"}
    if len(eps) > L.FAN_SLOTS:
        return {"enabled": False, "reason": f"more than {L.FAN_SLOTS} endpoints"}
    plan = fan_plan(subs)
    for index, entries in plan.items():
        _put_devmap(maps, index, entries, egress_fd, f"subc_fan{index}")
    for g, members in group_members(subs).items():
        maps[MN.FAN_DEV].update(L.U32.pack(v=eps[members[0]].ifindex), L.U32.pack(v=g))
        for k, e in enumerate(members):
            maps[MN.FAN_GEPS].update(L.U32.pack(v=g * L.FAN_SLOTS + k), L.U32.pack(v=e))
    all_index = ALL_INDEX if ALL_INDEX in plan else L.NO_FAN
    maps[MN.FAN_CFG].update(L.U32.pack(v=0), L.FAN_CFG.pack(n_eps=len(eps), all=all_index, ratio=ratio))
    return {
        "enabled": True,
        "device_maps": len(plan),
        "groups": len(set(endpoint_groups(subs))),
        "all_broadcast": all_index != L.NO_FAN,
        "ratio": ratio,
    }


def set_endpoints(key: int) -> list[int]:
    """The endpoint indexes of a recipient set (bit e of ``key`` for endpoint e), ascending."""
    return [e for e in range(L.FAN_SLOTS) if key >> e & 1]


def install_set(maps: dict[str, Map], egress_fd: int, ifindexes: list[int], key: int, index: int) -> None:
    """Make the FAN_SET device map of recipient set ``key`` (one entry per endpoint, on its
    interface ``ifindexes[e]``, with the devmap program ``egress_fd``), put it at ``index`` of
    ``subc_fan``, and only then publish it in ``subc_fan_sets`` (XDP uses it from the next
    datagram on).  Raises SubcError when a map cannot be created or written, or for an endpoint
    the broker does not have."""
    eps = set_endpoints(key)
    if not eps or eps[-1] >= len(ifindexes):
        raise SubcError(f"recipient set {key:#x}: endpoints {eps} beyond the broker's {len(ifindexes)}")
    _put_devmap(maps, index, [ifindexes[e] for e in eps], egress_fd, f"subc_set{index}")
    maps[MN.FAN_SETS].update(L.U64.pack(v=key), L.U32.pack(v=index))


def installed_sets(maps: dict[str, Map]) -> dict[int, int]:
    """The FAN_SET maps in place: ``subc_fan`` index -> recipient set (read from ``subc_fan_sets``)."""
    return {
        L.U32.unpack(single(maps[MN.FAN_SETS].lookup(k)) or bytes(4))["v"]: L.U64.unpack(k)["v"]
        for k in maps[MN.FAN_SETS].keys()
    }


@dataclass
class SetCache:
    """The FAN_SET maps' use, kept by their one writer (``subc fanout``): ``used`` (``subc_fan``
    index -> recipient set, :func:`installed_sets` at start), and, for eviction, each index's
    datagram count (``subc_fan_hits``) when last read, at ``read_at`` (monotonic s).  A set whose
    count did not change over at least ``idle_s`` s is idle: its index may go to a missed set."""

    used: dict[int, int]
    idle_s: float = 1.0
    hits: dict[int, int] = field(default_factory=dict)
    read_at: float | None = None


def read_set_hits(maps: dict[str, Map], indexes) -> dict[int, int]:
    """Datagrams XDP sent over each FAN_SET map at ``subc_fan`` index in ``indexes`` (summed over
    CPUs, from ``subc_fan_hits``)."""
    out = {}
    for index in indexes:
        v = per_cpu(maps[MN.FAN_HITS].lookup(L.U32.pack(v=index - SET_BASE)))
        out[index] = sum(L.U64.unpack(c)["v"] for c in v)  # a per-CPU map: one value per CPU
    return out


def idle_sets(then: dict[int, int], now: dict[int, int]) -> list[int]:
    """The indexes whose datagram count did not change from ``then`` to ``now`` (an index missing
    from ``then`` was installed since and is not idle), ascending."""
    return sorted(i for i, n in now.items() if i in then and then[i] == n)


def evict_sets(maps: dict[str, Map], cache: SetCache, want: int, now: float | None = None) -> list[int]:
    """Free up to ``want`` indexes of idle sets (:class:`SetCache`) and return them.  The first
    call only reads the counts (nothing is idle before ``idle_s`` has passed).  The keys leave
    ``subc_fan_sets`` first; then one ``subc_fan`` delete waits for an RCU grace period, after
    which no XDP program holds a freed index (module docstring)."""
    now = time.monotonic() if now is None else now
    if cache.read_at is not None and now - cache.read_at < cache.idle_s:
        return []
    counts = read_set_hits(maps, cache.used)
    victims = idle_sets(cache.hits, counts)[:want] if cache.read_at is not None else []
    cache.hits, cache.read_at = counts, now
    for index in victims:
        maps[MN.FAN_SETS].delete(L.U64.pack(v=cache.used.pop(index)))
    for index in victims:
        maps[MN.FAN].delete(L.U32.pack(v=index))  # the first waits for the grace period
    return victims


def install_missing_sets(maps: dict[str, Map], egress_fd: int, ifindexes: list[int], cache: SetCache) -> dict:
    """Make a FAN_SET map for every recipient set XDP noted in ``subc_fan_miss`` (most missed
    first) while free indexes remain, evicting idle sets (:func:`evict_sets`) when all indexes
    are taken, and clear the notes.  ``cache.used`` (index -> set: the maps in place,
    :func:`installed_sets` when the caller is the only writer) is updated in place.
    Returns ``{"installed", "evicted", "full", "sets"}``: maps made now, sets evicted now, sets
    left without a map because all ``FAN_SETS`` are in use (their datagrams keep going the ALL or
    TC way; every note is cleared, and XDP notes the sets it sees again), and sets with a map in
    all.  Raises SubcError as :func:`install_set`."""
    used = cache.used
    missed = []
    for k in maps[MN.FAN_MISS].keys():
        v = single(maps[MN.FAN_MISS].lookup(k))
        missed.append((L.U64.unpack(v)["v"] if v else 0, L.U64.unpack(k)["v"], k))
    if not missed:
        return {"installed": 0, "evicted": 0, "full": 0, "sets": len(used)}
    missed.sort(reverse=True)
    have = set(used.values())
    new = [key for _, key, _ in missed if key not in have]
    free = [i for i in range(SET_BASE, SET_BASE + L.FAN_SETS) if i not in used][: len(new)]
    evicted = evict_sets(maps, cache, len(new) - len(free)) if len(free) < len(new) else []
    placed = dict(zip(new, free + evicted))
    installed = 0
    for _, key, raw in missed:
        if key in placed:
            install_set(maps, egress_fd, ifindexes, key, placed[key])
            used[placed[key]] = key
            installed += 1
        # every note is cleared: XDP notes a set left without a map again if it still comes, so a
        # stale note never wins a later pass
        maps[MN.FAN_MISS].delete(raw)
    full = len(new) - installed
    return {"installed": installed, "evicted": len(evicted), "full": full, "sets": len(used)}


def grace_waiter(maps: dict[str, Map]):
    """A function that returns once every XDP, TC and devmap program run that started before the
    call has ended (an RCU grace period): it writes a one-entry device map into the last index of
    ``subc_fan``, and the kernel returns from a write to a map of maps only after
    ``synchronize_rcu()`` (``maybe_wait_bpf_programs`` in ``kernel/bpf/syscall.c``).  For brokers
    without the XDP fan-out (``subc serve``), whose ``subc_fan`` indexes are otherwise unused.
    Raises SubcError when the device map cannot be created."""
    fd = _create_devmap("subc_grace", 1)
    index = L.U32.pack(v=L.FAN_SLOTS * L.FAN_SLOTS + L.FAN_SETS)
    value = L.U32.pack(v=fd)
    outer = maps[MN.FAN]

    def wait() -> None:
        outer.update(index, value)

    return wait
