"""A loaded eBPF broker's counters (``subc stats``), read through its pinned maps.

Global counters, per subscriber (datagrams, messages, bytes, the next sequence number) and per
leaf of the live generation; in ``subc serve`` mode, the live subscriptions per endpoint from the
daemon's store; and the XDP fan-out's recipient-set device maps with the datagrams sent over each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...backends.ebpf import layout as L
from ...backends.ebpf import map_names as MN
from ...backends.ebpf.maps_doc import MapsDoc
from . import install
from .bpf import per_cpu, present
from .broker_state import close_maps, loaded_home, pinned_maps, read_journal_status
from .fanout import installed_sets, read_set_hits


def stats(iface: str) -> dict:
    """Counters of a loaded broker: global, per subscriber and per leaf of the live generation, and
    (``fan_sets``) the recipient-set device maps in place with the datagrams sent over each."""
    home, state = loaded_home(iface)
    maps = pinned_maps(home, state)
    try:
        glob = {}
        for i, name in enumerate(L.STATS):
            vals = per_cpu(maps[MN.STATS].lookup(L.U32.pack(v=i)))
            glob[name] = sum(int.from_bytes(v[:8], "little") for v in vals)
        subs: dict[str, dict[str, Any]] = {}
        sub_map, seq = maps[MN.SUB_CNT], maps[MN.SEQ]
        for sid in range(L.RECIPIENTS):
            counters = [L.SUB_COUNTER.unpack(v) for v in per_cpu(sub_map.lookup(L.U32.pack(v=sid)))]
            c = {k: sum(v[k] for v in counters) for k in ("datagrams", "messages", "bytes")}
            if c["datagrams"]:
                name = "local" if sid == L.LOCAL else state["subscriber_names"].get(str(sid))
                nxt = L.U64.unpack(present(seq.lookup(L.U32.pack(v=sid))))["v"]
                subs["local" if sid == L.LOCAL else str(sid)] = {**c, "next_seq": nxt, "name": name}
        journal_lost = {}
        if MN.JNL_LOST in maps:  # per subscriber: messages sent that the journal's ring could not take
            for sid in [int(k) for k in subs if k.isdigit()]:
                n = sum(int.from_bytes(v[:8], "little") for v in per_cpu(maps[MN.JNL_LOST].lookup(L.U32.pack(v=sid))))
                journal_lost[str(sid)] = n
        gen = state["generation"]
        doc = MapsDoc.read(home.state_dir / "maps.json")
        leaves = {
            str(st): {"action": state["leaves"].get(str(st), "?"), **c}
            for st, c in install.leaf_counters(maps, doc, gen, state["capacities"]).items()
        }
        fan_sets = None
        if MN.FAN_HITS in maps:  # the recipient-set device maps in place and the datagrams sent over them
            used = installed_sets(maps)
            hits = read_set_hits(maps, used)
            fan_sets = {
                "sets": len(used),
                "capacity": L.FAN_SETS,
                "datagrams": sum(hits.values()),
                "by_set": {f"{key:#x}": hits[i] for i, key in sorted(used.items())},
            }
    finally:
        close_maps(maps)
    out = {
        "iface": iface,
        "netns_inode": home.netns.inode,
        "pins": str(home.pins),
        "generation": gen,
        "programs": state["programs"],
        "stats": glob,
        "subscribers": subs,
        "leaves": dict(sorted(leaves.items(), key=lambda kv: int(kv[0]))),
    }
    if state.get("mode") == "serve":
        out["mode"] = "serve"
        if state.get("state_dir"):  # the live subscriptions, from the daemon's store
            from ...serve.store import Store

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
            for key, c in subs.items():
                c["name"] = names.get(int(key)) if key.isdigit() else c["name"]
                c["subscriptions"] = per_ep.get(c["name"] or "", 0)
            cluster = Path(state["state_dir"]) / "cluster.json"  # subc serve --cluster's figures
            if cluster.exists():
                try:
                    out["cluster"] = json.loads(cluster.read_text())
                except (OSError, ValueError):
                    out["cluster"] = None
    if fan_sets is not None:
        out["fan_sets"] = fan_sets
    if state.get("journal"):
        out["journal"] = journal_stats(home, state, journal_lost)
    return out


def journal_stats(home, state: dict, lost: dict[str, int]) -> dict:
    """The journal's figures: the ring buffer, the kernel's count of copies and, per subscriber,
    messages it could not journal, and the journal service's last status (None when no service
    has run: the ring fills, then every copy is counted lost)."""
    status = read_journal_status(home)
    return {"ring_bytes": state["journal"]["bytes"], "lost_messages": lost, "service": status}
