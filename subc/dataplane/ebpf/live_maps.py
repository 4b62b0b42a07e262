"""Writing an incremental delivery diagram (:mod:`subc.ir.incremental`) into the eBPF maps.

The maps are those of the eBPF target (:mod:`subc.backends.ebpf.target`), used in generation 0
only: a node's state is its index in the arrays indexed by state and its tag in hash and trie
keys.  Nodes below level 0 are persistent, so a change writes the entries of its new nodes next
to the live ones; the root has ``root_slots`` versions (states 1..root_slots of stage 0) and a
change rewrites a free slot where it differs from what the slot held, then switches
``subc_root`` to it (one 4-byte write).  A packet reads ``subc_root`` once per datagram, so it is
classified by one root and the persistent nodes below it: never by a mix of two diagrams.

Per match kind (the forms of :mod:`subc.ir.lowering`, as the batch compiler's,
:mod:`subc.backends.ebpf.target`):

* range: ``stN_info[state] = (offset, count)`` and the runs' lower bounds and next states in a
  segment of ``stN_bnd`` (segments are allocated in power-of-two size classes, :class:`Segments`);
* exact: ``stN_ex[(state, value)] = next`` for the values whose next state is not the node's
  *miss* target, which ``stN_info[state]`` holds;
* lpm: ``stN_lpm[(state, prefix)] = next``, the fewest prefixes whose longest match gives every
  value its next state (:func:`~subc.ir.lowering.lpm_form`);
* leaves: ``subc_leaf[state]`` (the subscriber set, its count and, for one subscriber, its id),
  ``subc_leaf_set[state]`` and zeroed ``subc_leaf_cnt[state]``.

Freed nodes (after the grace period of the root slots that held them) have their hash and trie
entries deleted, their info and leaf entries zeroed and their segments returned before their
states are reused (:meth:`LiveMaps.clear`).  So the maps alone say which states are in use: a
restarted daemon keeps those (:meth:`LiveMaps.inherit`) until its own diagram is live.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ...backends.ebpf import map_names as MN
from ...ir import lowering
from ...ir.live_nodes import Node, exact_miss, is_dead
from ...backends.ebpf import layout as L
from ...backends.ebpf.maps_doc import StageDoc
from ...errors import SubcError
from .bpf import Map, present, single
from .install import subscriber_words


class Segments:
    """Contiguous segments of a bounds array of ``capacity`` entries, in power-of-two size
    classes (a free list per class, then a bump pointer).  :meth:`alloc` raises SubcError when
    the array is full."""

    def __init__(self, capacity: int, name: str):
        self.capacity, self.name = capacity, name
        self.top = 0
        self.free: dict[int, list[int]] = {}

    @staticmethod
    def size_class(n: int) -> int:
        return 1 << max(0, (n - 1).bit_length())

    def alloc(self, n: int) -> tuple[int, int]:
        """(offset, size class) of a segment of at least ``n`` entries."""
        size = self.size_class(n)
        lst = self.free.get(size)
        if lst:
            return lst.pop(), size
        if self.top + size > self.capacity:
            raise SubcError(
                f"bounds array {self.name} is full ({self.capacity} entries): restart the broker "
                "with a larger --capacity"
            )
        off = self.top
        self.top += size
        return off, size

    def release(self, off: int, size: int) -> None:
        self.free.setdefault(size, []).append(off)

    def reserve(self, off: int, size: int) -> None:
        """Keep segment [off, off + size) from :meth:`alloc` (it holds entries written by a
        previous allocator); give it back with :meth:`release`.  Raises SubcError beyond the array."""
        if off + size > self.capacity:
            raise SubcError(
                f"bounds array {self.name}: a live segment ends at {off + size}, beyond its "
                f"{self.capacity} entries (was the broker restarted with a smaller --capacity?)"
            )
        self.top = max(self.top, off + size)


@dataclass
class Inherited:
    """What a previous writer left live in pinned maps (:meth:`LiveMaps.inherit`): the root
    ``live_slot``, the ``states`` in use per level (1..n), their hash and trie ``keys`` per map
    and their bounds ``segments`` per level ((offset, size class))."""

    live_slot: int
    states: dict[int, set[int]] = field(default_factory=dict)
    keys: dict[str, list[bytes]] = field(default_factory=dict)
    segments: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


class LiveMaps:
    """Writes delivery nodes into the maps of a loaded eBPF program.

    ``maps``: the program's maps by name; ``stages``: per field, (match kind, width in bits,
    map names): ``maps.json``'s ``stages``; ``caps``: map capacities; ``root_slots``: the
    root versions (states 1..root_slots of stage 0)."""

    def __init__(self, maps: dict[str, Map], stages: Sequence[StageDoc], caps: dict[str, int], root_slots: int):
        self.maps, self.stages, self.caps, self.root_slots = maps, stages, caps, root_slots
        self.n = len(stages)
        self.segments = {
            lv: Segments(caps[st.maps[1]], st.maps[1]) for lv, st in enumerate(stages) if st.kind == "range"
        }
        self.seg_of: dict[tuple[int, int], tuple[int, int]] = {}  # (level, state) -> (offset, size class)
        self.slot_node: dict[int, Node | None] = {}  # what each root slot's entries encode
        self._ops: dict[str, list[list]] = {}  # map name -> runs of ['put', keys, values] / ['del', keys]
        # positional packers (the hot path writes thousands of entries per second)
        self._u32, self._bound, self._info = L.U32.packer(), L.BOUND.packer(), L.INFO.packer()
        self._leaf, self._subset = L.LEAF.packer(), L.SUBSET.packer()
        self._zero_counter = L.COUNTER.pack()

    # -- buffered writes ----------------------------------------------------------------------

    def _put(self, name: str, key: bytes, value: bytes) -> None:
        runs = self._ops.setdefault(name, [])
        if runs and runs[-1][0] == "put":
            runs[-1][1].append(key)
            runs[-1][2].append(value)
        else:
            runs.append(["put", [key], [value]])

    def _put_many(self, name: str, keys: list[bytes], values: list[bytes]) -> None:
        runs = self._ops.setdefault(name, [])
        if runs and runs[-1][0] == "put":
            runs[-1][1].extend(keys)
            runs[-1][2].extend(values)
        else:
            runs.append(["put", keys, values])

    def _del(self, name: str, key: bytes) -> None:
        runs = self._ops.setdefault(name, [])
        if runs and runs[-1][0] == "del":
            runs[-1][1].append(key)
        else:
            runs.append(["del", [key]])

    def flush(self) -> None:
        """Carry out the buffered writes and deletes: per map in order, each run of writes (or
        deletes) in one batch system call.  Writes to different maps may land in any order, which
        is safe because every buffered write is to a state no packet reaches until :meth:`switch`
        (new nodes, a root slot that is not live) or no longer reaches (freed nodes).  SubcError
        when a map is full (the rest is dropped; the caller reverts the change)."""
        ops, self._ops = self._ops, {}
        for name, runs in ops.items():
            m = self.maps[name]
            for run in runs:
                if run[0] == "put":
                    m.update_batch(run[1], run[2])
                else:
                    m.delete_batch(run[1])

    # -- nodes below the root -----------------------------------------------------------------

    def _write_range(self, lv: int, state: int, node: Node) -> None:
        info, bnd = self.stages[lv].maps
        key = (lv, state)
        old = self.seg_of.get(key)
        n = len(node.runs)
        if old is None or old[1] < n:
            if old is not None:
                self.segments[lv].release(*old)
            old = self.seg_of[key] = self.segments[lv].alloc(n)
        off, u32, bound = old[0], self._u32, self._bound
        self._put_many(bnd, [u32(i) for i in range(off, off + n)], [bound(lo, c.state, 0) for lo, _, c in node.runs])
        self._put(info, u32(state), self._info(off, n))

    def _exact_key(self, state: int, v: int) -> bytes:
        return L.EXACT_KEY.pack(state=state, value=v)

    def _lpm_key(self, state: int, v: int, plen: int, width: int) -> bytes:
        return L.LPM_KEY.pack(prefixlen=32 + plen, state=state, value=(v << (64 - width)) & ((1 << 64) - 1))

    def _lpm_entries(self, node: Node, width: int):
        for v, plen, c in lowering.lpm_form(node.runs, width, is_dead):
            yield (v, plen), c

    def write(self, node: Node, state: int | None = None) -> None:
        """Write every entry of (new) ``node`` under its state (or ``state``: a root slot)."""
        lv = node.level
        state = node.state if state is None else state
        if lv == self.n:
            ids = node.runs
            words = subscriber_words(ids)
            key = self._u32(state)
            self._put(MN.LEAF_CNT, key, self._zero_counter)
            self._put(MN.LEAF_SET, key, self._subset(*words, 0, 0))
            self._put(MN.LEAF, key, self._leaf(0, len(ids), ids[0] if len(ids) == 1 else 0, state, *words))
            return
        st = self.stages[lv]
        if st.kind == "range":
            self._write_range(lv, state, node)
        elif st.kind == "exact":
            info, ex = st.maps
            miss = exact_miss(node)
            for v, c in lowering.exact_values(node.runs, miss):
                self._put(ex, self._exact_key(state, v), L.U32.pack(v=c.state))
            self._put(info, L.U32.pack(v=state), L.INFO.pack(a=miss.state))
        else:
            (lpm,) = st.maps
            for (v, plen), c in self._lpm_entries(node, st.width):
                self._put(lpm, self._lpm_key(state, v, plen, st.width), L.U32.pack(v=c.state))

    def clear(self, node: Node, state: int | None = None) -> None:
        """Delete the hash and trie entries of freed ``node`` (under its state or ``state``) and
        return its bounds segment (arrays are overwritten when the state is reused)."""
        lv = node.level
        state = node.state if state is None else state
        if lv == self.n:  # zeroed, so that a restarted writer sees the state as free (inherit)
            self._put(MN.LEAF, L.U32.pack(v=state), L.LEAF.pack())
            return
        st = self.stages[lv]
        if st.kind == "range":
            self._put(st.maps[0], L.U32.pack(v=state), L.INFO.pack())  # before its segment is reused
            seg = self.seg_of.pop((lv, state), None)
            if seg is not None:
                self.segments[lv].release(*seg)
        elif st.kind == "exact":
            self._put(st.maps[0], L.U32.pack(v=state), L.INFO.pack())
            name = st.maps[1]
            for v, _ in lowering.exact_values(node.runs, exact_miss(node)):
                self._del(name, self._exact_key(state, v))
        else:
            name = st.maps[0]
            for (v, plen), _ in self._lpm_entries(node, st.width):
                self._del(name, self._lpm_key(state, v, plen, st.width))

    # -- a previous writer's entries (a restarted daemon) ---------------------------------------

    def inherit(self) -> Inherited:
        """Read what the maps hold (written by a previous writer whose diagram is lost) and keep
        it: the live root slot's entries and every state below the root that has entries stay
        until :meth:`release_inherited`; the entries of the other root slots (not live, so read
        by no packet) are deleted now, and their slots are rewritten whole when next used.
        The caller reserves the returned states in its diagram."""
        self.flush()
        live = L.U32.unpack(present(self.maps[MN.ROOT].lookup(L.U32.pack(v=0))))["v"]
        inh = Inherited(live)
        info_a, info_b = L.INFO.reader("a"), L.INFO.reader("b")
        for lv in range(self.n + 1):
            inh.states[lv] = set()
        for lv, st in enumerate(self.stages):
            kind = st.kind
            if kind in ("range", "exact"):
                info = self.maps[st.maps[0]]
                values: list[bytes | None]
                if lv:  # every state's entry, read in batches
                    values = info.array_values(self.caps[st.maps[0]])
                else:
                    values = [None] * (live + 1)
                    values[live] = single(info.lookup(L.U32.pack(v=live)))
                for s in range(1 if lv else live, len(values)):
                    raw = values[s]
                    if s == 0 or raw is None:
                        continue
                    a = info_a(raw)
                    if kind == "range":
                        b = info_b(raw)
                        if b:
                            seg = (a, Segments.size_class(b))
                            inh.segments.setdefault(lv, []).append(seg)
                            self.segments[lv].reserve(*seg)
                            inh.states[lv].add(s)
                    elif a:
                        inh.states[lv].add(s)
            if kind in ("exact", "lpm"):
                name = st.maps[1] if kind == "exact" else st.maps[0]
                m = self.maps[name]
                struct = L.EXACT_KEY if kind == "exact" else L.LPM_KEY
                kept = inh.keys.setdefault(name, [])
                for key in m.keys():
                    s = struct.unpack(key)["state"]
                    if lv == 0 and s != live:
                        m.delete(key)
                        continue
                    kept.append(key)
                    inh.states[lv].add(s)
        leaves = self.maps[MN.LEAF].array_values(self.caps[MN.LEAF])
        nsubs = L.LEAF.reader("nsubs")
        for s in range(1, len(leaves)):
            raw = leaves[s]
            if raw is not None and nsubs(raw):
                inh.states[self.n].add(s)
        inh.states[0].discard(0)
        return inh

    def release_inherited(self, inh: Inherited) -> None:
        """Delete the inherited entries (no packet reads them any more: the root was switched away
        from ``inh.live_slot`` and a grace period has passed) and free their bounds segments;
        the caller then unreserves the states in its diagram."""
        self.flush()
        for name, keys in inh.keys.items():
            self.maps[name].delete_batch(keys)
        for lv, segs in inh.segments.items():
            for off, size in segs:
                self.segments[lv].release(off, size)
        inh.keys.clear()
        inh.segments.clear()

    # -- the root -----------------------------------------------------------------------------

    def write_root(self, slot: int, root: Node, spans: list[tuple[int, int]] | None) -> None:
        """Make root slot ``slot`` encode ``root``.  ``spans``: the level-0 values whose children
        may differ from what the slot held (None: anywhere); only those entries are rewritten
        where the match kind allows it (exact fields with an unchanged miss target)."""
        old = self.slot_node.get(slot)
        kind = self.stages[0].kind
        miss = exact_miss(root) if kind == "exact" else None
        if old is not None and miss is not None and spans is not None and exact_miss(old) is miss:
            info, ex = self.stages[0].maps
            for lo, hi in spans:
                new = dict(lowering.exact_values(root.between(lo, hi), miss, lo, hi))
                for v, _ in lowering.exact_values(old.between(lo, hi), miss, lo, hi):
                    if v not in new:
                        self._del(ex, self._exact_key(slot, v))
                for v, c in new.items():
                    self._put(ex, self._exact_key(slot, v), L.U32.pack(v=c.state))
            self._put(info, L.U32.pack(v=slot), L.INFO.pack(a=miss.state))
        else:
            if old is not None:
                self.clear(old, slot)
            self.write(root, slot)
        self.slot_node[slot] = root

    def refresh_root(self, slot: int, root: Node, limit: int) -> None:
        """None: map writes take microseconds, and :meth:`write_root` rewrites only the spans a
        change touched; a stale slot is rewritten within the change."""
        return None

    def switch(self, slot: int) -> None:
        """Publish root slot ``slot`` (after the buffered writes): one write of ``subc_root``."""
        self.flush()
        self.maps[MN.ROOT].update(L.U32.pack(v=0), L.U32.pack(v=slot))
