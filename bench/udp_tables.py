"""Flatten a compiled eBPF rule set (``maps.json`` and the spec's parse plan) for ``udp_broker.c``.

The user-space baseline of ``bench/broker_throughput.py`` classifies with the same tables as the
eBPF program: the message parse states of :func:`subc.backends.ebpf.parse_plan.plan_parser`
and the per-field maps of ``maps.json`` (logical entries: states untagged, bounds from 0).  This
module writes them as whitespace-separated integers in the section order ``udp_broker.c`` reads
(version 2): ``mold`` (1 when the spec frames messages in MoldUDP64: every message of a datagram
is classified and each subscriber gets its own copy), ``insts``, ``valid``, ``first``,
``pstates``, ``root``, ``stages``, ``endpoints``, ``subscribers`` (id and endpoint indexes, in
id order), ``leaves`` (state, kind, subscriber indexes).  Leaf kinds: 0 drop, 1 pass to the local
stack (``nop``), 2 forward to subscribers.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from subc.backends.ebpf.parse_plan import ParsePlan

HERE = Path(__file__).resolve().parent
ACCEPT, REJECT = -1, -2
KINDS = {"range": 0, "exact": 1, "lpm": 2}


def build_udp_broker(out: Path) -> Path:
    """Compile ``udp_broker.c`` with ``cc -O2`` into ``out``; raises CalledProcessError."""
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(out), str(HERE / "udp_broker.c")], check=True)
    return out


def tables_text(doc: dict, plan: ParsePlan, port: int, endpoints: dict[int, list[tuple[str, int]]]) -> str:
    """The tables file of ``doc`` for messages to UDP ``port``.

    ``endpoints``: subscriber id -> [(IPv4 address, UDP port)], where a subscriber's copies go
    (every subscriber listed gets heartbeats, as in the eBPF broker).  Raises ValueError when a field or select is in a network header (the baseline sees only the
    UDP payload) or a rule forwards to a subscriber without endpoints.
    """
    net = {plan.eth, plan.ipv4, plan.udp}
    index = {inst: i for i, inst in enumerate(i for i in plan.header_bytes if i not in net)}
    names = {s.name: n for n, s in enumerate(plan.states)}

    def target(t: str) -> int:
        return ACCEPT if t == "accept" else REJECT if t == "reject" else names[t]

    first = dict(plan.ports).get(port)
    if first is None:
        raise ValueError(f"the spec parses no messages on UDP port {port}")
    out = ["subc-udp-tables 2", f"mold {int(plan.moldudp64)}", f"insts {len(index)}", " ".join(str(plan.header_bytes[i]) for i in index)]
    need = 0
    for f in doc["field_order"]:
        inst = f.split(".", 1)[0]
        if inst in net:
            raise ValueError(f"field {f} is in a network header; the socket baseline sees only the UDP payload")
        need |= 1 << index[inst]
    out += [f"valid 0 {need}", f"first {target(first)}", f"pstates {len(plan.states)}"]
    for s in plan.states:
        line = [len(s.extracts), *(index[i] for i in s.extracts)]
        if s.select is None:
            line += [-1, 0, 0, 0, 0]
        else:
            fl = s.select
            if fl.instance in net:
                raise ValueError(f"state {s.name} selects on a network header")
            line += [index[fl.instance], fl.byte_offset, fl.n_bytes, fl.shift, fl.width]
        line.append(len(s.cases))
        for v, t in s.cases:
            line += [1 if v is None else 0, 0 if v is None else v, target(t)]
        out.append(" ".join(map(str, line)))
    maps = {m["name"]: m for m in doc["maps"]}
    out += [f"root {doc['root_state']}", f"stages {len(doc['stages'])}"]
    for st in doc["stages"]:
        fl = plan.field(st["field"])
        out.append(" ".join(map(str, [KINDS[st["kind"]], index[fl.instance], fl.byte_offset, fl.n_bytes, fl.shift,
                                      fl.width])))
        if st["kind"] == "range":
            info, bnd = (maps[n]["entries"] for n in st["maps"])
            out.append(str(len(info)))
            out += [f"{e['state']} {e['offset']} {e['count']}" for e in info]
            out.append(str(len(bnd)))
            out += [f"{e['lo']} {e['next']}" for e in sorted(bnd, key=lambda e: e["index"])]
        elif st["kind"] == "exact":
            info, ex = (maps[n]["entries"] for n in st["maps"])
            out.append(str(len(info)))
            out += [f"{e['state']} {e['miss']}" for e in info]
            out.append(str(len(ex)))
            out += [f"{e['state']} {e['value']} {e['next']}" for e in ex]
        else:
            (lpm,) = (maps[n]["entries"] for n in st["maps"])
            by_state: dict[int, list[dict]] = {}
            for e in lpm:
                by_state.setdefault(e["state"], []).append(e)
            out.append(str(len(by_state)))
            flat, offset = [], 0
            for s, es in by_state.items():
                es.sort(key=lambda e: -e["prefix_len"])
                out.append(f"{s} {offset} {len(es)}")
                flat += es
                offset += len(es)
            out.append(str(len(flat)))
            out += [f"{e['value']} {e['prefix_len']} {e['next']}" for e in flat]
    sub_index: dict[int, int] = {}
    eps: list[tuple[str, int]] = []
    sub_lines = []
    for sid, lst in sorted(endpoints.items()):
        sub_index[sid] = len(sub_lines)
        sub_lines.append(" ".join(map(str, [sid, len(lst), *range(len(eps), len(eps) + len(lst))])))
        eps += lst
    out.append(f"endpoints {len(eps)}")
    out += [f"{ip} {p}" for ip, p in eps]
    out.append(f"subscribers {len(sub_lines)}")
    out += sub_lines
    leaves = maps["subc_leaf"]["entries"]
    out.append(f"leaves {len(leaves)}")
    for e in leaves:
        if e["action"] == "fwd":
            for s in e["subscribers"]:
                if s not in sub_index:
                    raise ValueError(f"rules forward to subscriber {s}, which has no endpoints")
            idx = [sub_index[s] for s in sorted(e["subscribers"])]
            out.append(" ".join(map(str, [e["state"], 2, len(idx), *idx])))
        else:
            out.append(f"{e['state']} {0 if e['action'] == 'drop' else 1} 0")
    return "\n".join(out) + "\n"


def payloads_file(payloads: list[bytes]) -> bytes:
    """``udp_broker``'s payload records: a 2-byte big-endian length, then the bytes."""
    return b"".join(len(p).to_bytes(2, "big") + p for p in payloads)
