"""``summary.json`` of ``subc analyze`` (:mod:`.analyze`): the job's counts, from the tasks' aggregates.

:func:`summarize` turns the counts per (decision, type, second) into the summary's messages,
deliveries, bytes (filtered against broadcast), problems and actions, with per port (messages,
bytes) and the messages per second; :func:`capture_summary` and :func:`copies_summary` sum the
capture counts and the datagram copies the tasks wrote as JSON files.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ..lang.ast import Rule
from .evaluate import Bundle
from .gather import LENGTH_MISMATCH_CODE, REJECTED_CODE

#: Bytes of framing a subscriber receives per message (the MoldUDP64 message-block length).
BLOCK_LENGTH_BYTES = 2


def subscribers_of(rules: list[Rule]) -> list[int]:
    """The ports the rules forward to (every ``fwd`` atom), sorted."""
    return sorted({a[1] for r in rules for a in r.atoms() if a[0] == "fwd"})


def copies_summary(tmp: Path) -> Counter:
    """Per port (as text), the datagrams it receives: the tasks' ``copies-<split>.json``
    (:func:`~.evaluate.datagram_copies`) summed (the files are removed)."""
    total: Counter = Counter()
    for d in sorted(tmp.glob("copies-*.json")):
        total.update(json.loads(d.read_text()))
        d.unlink()
    return total


def capture_summary(tmp: Path, bundle: Bundle) -> dict | None:
    """The capture counts the tasks wrote (``capture-<split>.json``), summed over the captures (the
    files are removed), with the feed ports of each capture; None without captures."""
    docs = sorted(tmp.glob("capture-*.json"))
    if not docs:
        return None
    total: dict = {}
    examples = []
    for d in docs:
        doc = json.loads(d.read_text())
        d.unlink()
        for k, v in doc.items():
            if isinstance(v, int):
                total[k] = total.get(k, 0) + v
        examples.extend(doc.get("examples", []))
    paths = {sp.file_index: sp.path for sp in bundle.splits}
    total["feed_ports"] = {paths[i]: p for i, p in sorted((bundle.capture_ports or {}).items())}
    total["examples"] = examples[:20]
    return total


def summarize(res, traces, bundle, agg, tables, no_match, disagreements, examples, n_keys):
    """(summary.json without timings and the stateful, capture and copies keys (see
    :func:`.analyze.analyze`), per port [messages, bytes], (seconds, messages in each)).

    ``agg``: pandas counts of ``messages``, ``bytes`` and ``zero_length`` per (``decision``,
    ``type``) (``second`` null), decisions below 0 for messages not decoded or not classified,
    and of ``messages`` per ``second`` (:data:`~.evaluate.AGGREGATE_SCHEMA`); ``tables``: the
    :class:`~.tables_np.PipelineEvaluator` whose decisions the codes index."""
    subscribers = subscribers_of(res.rules)
    timed = agg["second"].notna()
    per_sec = agg[timed].groupby("second")["messages"].sum().sort_index()
    agg = agg[~timed].rename(columns={"messages": "n"}).copy()
    agg["wire"] = agg["bytes"] + agg["n"] * BLOCK_LENGTH_BYTES
    messages = int(agg["n"].sum())
    wire_all = int(agg["wire"].sum())
    decoded = agg[agg["decision"] > REJECTED_CODE]
    decoded = decoded[decoded["decision"] != LENGTH_MISMATCH_CODE]
    by_type = decoded.groupby("type")["n"].sum()
    problems = {
        name: int(agg.loc[agg["decision"] == code, "n"].sum())
        for name, code in (("length_mismatch", LENGTH_MISMATCH_CODE), ("rejected", REJECTED_CODE))
    }
    evaluated = agg[agg["decision"] >= 0]
    per_dec = evaluated.groupby("decision")[["n", "wire"]].sum()
    per_port: dict[int, list[int]] = {p: [0, 0] for p in subscribers}
    deliveries = unicast = multicast = 0
    actions: dict[str, int] = {}
    filtered = 0
    for code, n, wire in zip(per_dec.index, per_dec["n"].tolist(), per_dec["wire"].tolist()):
        d = tables.decisions[int(code)]
        n, wire = int(n), int(wire)
        if d.ports:
            for p in d.ports:
                per_port.setdefault(p, [0, 0])
                per_port[p][0] += n
                per_port[p][1] += wire
            deliveries += n * len(d.ports)
            filtered += wire * len(d.ports)
            if len(d.ports) > 1:
                multicast += n
            else:
                unicast += n
        else:
            actions[str(d)] = actions.get(str(d), 0) + n
    ao_wire = int(evaluated["wire"].sum())
    broadcast = wire_all * len(subscribers)
    summary = {
        "files": traces,
        "messages": messages,
        "by_type": {(bundle.types.label(int(k)) if k >= 0 else "") or "?": int(v) for k, v in sorted(by_type.items())},
        "classified": int(evaluated["n"].sum()),
        "problems": {k: v for k, v in problems.items() if v},
        "zero_length_fallbacks": int(agg["zero_length"].sum()),
        "deliveries": deliveries,
        "unicast": unicast,
        "multicast": multicast,
        "no_rule_matched": no_match,
        "actions": dict(sorted(actions.items())),
        "subscribers": len(subscribers),
        "bytes": {
            "filtered": filtered,
            "broadcast": broadcast,
            "broadcast_classified": ao_wire * len(subscribers),
            "saving": round(1 - filtered / broadcast, 6) if broadcast else 0.0,
        },
        "disagreements": disagreements,
        "disagreement_examples": examples,
        "decisions": {str(i): str(d) for i, d in enumerate(tables.decisions)},
        "value_classes": n_keys,
        "rules": len(res.rules),
        "splits": len(bundle.splits),
    }
    return summary, per_port, ([int(s) for s in per_sec.index], [int(c) for c in per_sec.to_numpy()])
