"""``subc cluster status``: the cluster as etcd holds it, read at one revision: its brokers (what
each applied, how far behind etcd it is, what it owns, whether it acknowledged the member set or
is fenced), the owner of every endpoint, and the etcd members."""

from __future__ import annotations

import time
from collections import Counter

from .etcd import Etcd
from .rendezvous import owner
from .replica import Replica
from ..serve.endpoints import stream_key


def cluster_status(etcd: Etcd, prefix: str, with_etcd: bool = True) -> dict:
    """The report (a JSON-able dict): ``revision`` read at, ``member_set`` id, ``brokers`` (one
    row each: node, addresses, applied revision and lag in revisions, status age in s, owned
    endpoints, acknowledged, fenced), ``owners`` (endpoint -> node), ``subscriptions`` count,
    ``etcd`` members (with ``with_etcd``).  Raises EtcdError."""
    rev, kvs = etcd.snapshot(prefix)
    rep = Replica(prefix)
    rep.reconcile(rev, kvs)
    ms = rep.member_set()
    members = list(rep.members)
    eps = sorted({r.ep for r in rep.subs.values() if not r.ip.startswith("soup:")})
    owners = {stream_key(ep): owner(stream_key(ep), members) for ep in eps}
    counted = Counter(owners.values())
    now = time.time()
    brokers = []
    for name in sorted(set(rep.members) | set(rep.status)):
        m = rep.members.get(name)
        st = rep.status.get(name)
        brokers.append(
            {
                "node": name,
                "live": m is not None,
                "listen": m[0].listen if m else "",
                "rerequest": m[0].rerequest if m else "",
                "soup": m[0].soup if m else "",
                "applied": st.applied if st else None,
                "lag": rev - st.applied if st else None,
                "status_age_s": round(now - st.time, 3) if st else None,
                "subscriptions": st.subscriptions if st else None,
                "delivers_to": st.owns if st else None,
                "should_own": counted.get(name, 0),
                "acknowledged": rep.acks.get(name) == ms,
                "fenced": st.fenced if st else None,
            }
        )
    out = {
        "revision": rev,
        "prefix": prefix,
        "member_set": ms,
        "subscriptions": len(rep.subs),
        "endpoints": len(eps),
        "brokers": brokers,
        "owners": owners,
        "unowned": sorted(k for k, v in owners.items() if v is None),
        "bad_keys": rep.bad_keys,
    }
    if with_etcd:
        out["etcd"] = etcd.members()
    return out


def format_status(doc: dict) -> str:
    """The report as text: a line per broker, then the etcd members."""
    lines = [
        f"cluster {doc['prefix']} at revision {doc['revision']}: {len(doc['brokers'])} brokers, "
        f"{doc['subscriptions']} subscriptions, {doc['endpoints']} UDP endpoints, member set {doc['member_set']}"
    ]
    lines.append(
        f"{'node':<16} {'live':<5} {'applied':>9} {'lag':>6} {'age_s':>6} {'subs':>7} {'delivers':>8} "
        f"{'owns':>5} {'acked':<6} {'fenced':<6} listen"
    )
    for b in doc["brokers"]:

        def f(v):
            return "-" if v is None else str(v)

        lines.append(
            f"{b['node']:<16} {str(b['live']).lower():<5} {f(b['applied']):>9} {f(b['lag']):>6} "
            f"{f(b['status_age_s']):>6} {f(b['subscriptions']):>7} {f(b['delivers_to']):>8} {b['should_own']:>5} "
            f"{str(b['acknowledged']).lower():<6} {f(b['fenced']).lower():<6} {b['listen']}"
        )
    if doc["unowned"]:
        lines.append(f"endpoints with no live owner: {', '.join(doc['unowned'])}")
    for m in doc.get("etcd", []):
        state = (
            m.get("error")
            or f"leader={str(m.get('is_leader')).lower()} term={m.get('raft_term')} revision={m.get('revision')}"
        )
        lines.append(f"etcd {m['name'] or m['id']} {','.join(m['client_urls'])}: {state}")
    return "\n".join(lines)
