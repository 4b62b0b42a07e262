"""The data path of ``subc serve``: loaded once, pinned, and adopted again by a restarted daemon.

The program is :func:`~subc.backends.ebpf.program.live_program` of the spec and field order,
loaded and attached like ``subc load`` does (maps and programs pinned in the broker's home,
:mod:`..broker_home`, ``state.json`` with ``"mode": "serve"``), so it keeps forwarding
while the daemon is down.  A daemon that finds it loaded with the same spec text, field order
and capacity opens the pinned maps instead (:func:`open_dataplane`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from ..backends.ebpf import map_names as MN
from ..backends.ebpf.maps_doc import ENTRY_ROLES, MapsDoc
from ..spec.model import Spec
from ..errors import SubcError
from ..dataplane.ebpf import attach
from ..dataplane.ebpf.bpf import Map
from ..dataplane.ebpf.bpf_objects import prog_info
from ..dataplane.ebpf.broker import LoadedFilter, check_journal, ifindex_of, journal_maps, journal_state_maps
from ..dataplane.ebpf.subscribers import Subscribers
from ..dataplane.ebpf.broker_state import claim_home, pinned_maps, read_state, write_state
from ..dataplane.ebpf.broker_home import BrokerHome, broker_home, home_lock

ROOT_SLOTS = 32  # versions of the root (stage 0 states 1..32): changes in flight before a grace period ends
#: Roles of the arrays indexed by state that a live diagram fills.
STATE_ROLES = ("state_info", "leaf", "leaf_sets", "leaf_counters")


def default_field_order(spec: Spec) -> list[str]:
    """Every query field of ``spec``: exact ones first, then lpm, then range (each in spec order)."""
    rank = {"exact": 0, "lpm": 1, "range": 2}
    return sorted(
        spec.query_fields,
        key=lambda n: (rank.get(spec.query_fields[n].match_kind, 3), list(spec.query_fields).index(n)),
    )


def serve_caps(doc: MapsDoc, capacity: int) -> dict[str, int]:
    """Map capacities for about ``capacity`` live subscriptions: states per stage and leaves
    4 x capacity (+1,024: retired versions wait for their grace period), bounds, exact and lpm
    entries 16 x capacity (+4,096; range segments are rounded up to powers of two)."""
    out = {}
    for m in doc.maps:
        if m.role in STATE_ROLES:
            out[m.name] = 4 * capacity + 1024
        elif m.role in ENTRY_ROLES:
            out[m.name] = 16 * capacity + 4096
    return out


@dataclass
class DataPlane:
    """The loaded data path: ``maps`` by name, ``doc`` (``maps.json``), ``caps``, whether it was
    ``adopted`` from a previous daemon, ``lf`` (the program, when this process loaded it) and
    ``home`` (where its pins and state live, :mod:`..broker_home`)."""

    iface: str
    maps: dict[str, Map]
    doc: MapsDoc
    caps: dict[str, int]
    adopted: bool
    lf: LoadedFilter | None = None
    home: BrokerHome | None = None

    def stage_caps(self) -> list[int]:
        """States per level 1..n of the live diagram (each array's state 0 is the dead state)."""
        return [self.caps[st.maps[0]] - 1 for st in self.doc.stages[1:]] + [self.caps[MN.LEAF] - 1]


def open_dataplane(
    spec: Spec,
    iface: str,
    order: list[str],
    capacity: int,
    state_dir: str | None,
    xdp_mode: str = "auto",
    journal_pages: int = 0,
) -> DataPlane:
    """Adopt the data path ``subc serve`` left on ``iface`` (same spec text, field order,
    capacity and journal feed), or load a new one (with ``journal_pages``, the journal feed:
    :func:`~subc.dataplane.ebpf.broker.cflags`; its maps are in :attr:`DataPlane.maps`).  Raises
    SubcError when ``iface`` runs something else (a rule set of ``subc load``, another spec or
    order: unload first) or the program cannot be loaded."""
    from ..backends.ebpf.program import live_program

    spec_hash = hashlib.sha256(spec.preprocessed.encode()).hexdigest()  # its includes and -D count
    home = broker_home(iface, mount=True)
    with home_lock(home):  # one load or unload of this home at a time
        state = None
        if home.state_path.exists():
            try:
                state = read_state(home)
            except SubcError:
                state = None  # stale (its namespace or interface is gone): claim_home clears it
        if state is not None:
            want = {
                "mode": "serve",
                "spec_sha256": spec_hash,
                "field_order": order,
                "capacity": capacity,
                "journal_pages": journal_pages,
            }
            have = {k: state.get(k, 0 if k == "journal_pages" else None) for k in want}
            if have != want:
                diff = ", ".join(f"{k} {have[k]!r} (now {want[k]!r})" for k in want if have[k] != want[k])
                raise SubcError(f"{iface} runs a data path loaded with {diff}: run subc unload --iface {iface} first")
            doc = MapsDoc.read(home.state_dir / "maps.json")
            return DataPlane(iface, pinned_maps(home, state), doc, state["capacities"], True, home=home)
        claim_home(home)
        doc, src, _ = live_program(spec, order)
        caps = serve_caps(doc, capacity)
        ifindex = ifindex_of(iface)
        if journal_pages:
            check_journal(doc, Subscribers(), journal_pages)
        lf = LoadedFilter.build(doc, src, None, min_caps=caps, max_endpoints=1, journal_pages=journal_pages)
        jmaps = journal_maps(lf)
        attach.pin_and_attach(lf.program, {**lf.maps, **jmaps}, home, ifindex, xdp_mode)
        try:
            attach.check_data_path(lf.program, lf.maps, home, ifindex, [])
            info = {"xdp": prog_info(lf.program.xdp.fd), "tc": prog_info(lf.program.tc.fd)}
            state = {
                "iface": iface,
                "ifindex": ifindex,
                "netns_inode": home.netns.inode,
                "netns_cookie": home.netns.cookie,
                "pins": str(home.pins),
                "mode": "serve",
                "spec": str(Path(spec.path).resolve()),
                "spec_sha256": spec_hash,
                "field_order": order,
                "capacity": capacity,
                "state_dir": state_dir and str(Path(state_dir).resolve()),
                "generation": 0,
                "capacities": lf.caps,
                "max_endpoints": 1,
                "regions_used": {},
                "xdp_mode": xdp_mode,
                "programs": info,
                "subscribers": None,
                "subscriber_names": {},
                "leaves": {},
                "maps": {
                    **{
                        m.name: {"key": m.key.size, "value": lf.maps[m.name].value_size, "type": m.type}
                        for m in doc.maps
                    },
                    **journal_state_maps(journal_pages),
                },
                "journal_pages": journal_pages,
                "journal": {"pages": journal_pages, "bytes": journal_pages * 4096} if journal_pages else None,
                "loaded_at": time.time(),
                "links": [],
                "fanout": {"enabled": False, "reason": "subc serve"},
            }
            write_state(home, state, doc)
        except BaseException:
            attach.remove(home)
            lf.close()
            raise
        maps = {**lf.maps, **{n: m for n, m in jmaps.items() if n != MN.JNL}}
        return DataPlane(iface, maps, doc, lf.caps, False, lf, home)
